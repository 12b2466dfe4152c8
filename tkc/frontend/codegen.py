"""Python AST → tile IR.

Walks the kernel's source and emits one `func.func` of tile IR. Expressions over compile-time values (constants,
type specs, Python numbers) are evaluated in Python; everything else becomes IR. `for` over a `range` with a
run-time bound becomes `scf.for` carrying every variable the body reassigns; `if` on a run-time condition becomes
`scf.if`. Loops and branches over compile-time values are unrolled / decided here.
"""

from __future__ import annotations

import ast
import builtins
import difflib
import inspect
import operator
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from xdsl.builder import Builder
from xdsl.dialects import arith, scf
from xdsl.dialects.builtin import FloatAttr, IntegerAttr, f32, i1, i32
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.rewriter import InsertPoint
from xdsl.utils.exceptions import VerifyException

from tkc import lang
from tkc.errors import SourceLoc, TkcError
from tkc.ir import ops as t
from tkc.ir.types import SharedTileType
from tkc.frontend.values import (
    BoundMethod,
    GlShape,
    describe,
    is_float,
    is_global,
    is_int,
    is_register,
    is_runtime,
)

if TYPE_CHECKING:
    from tkc.frontend.kernel import Helper, SourceFunction

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
_PY_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
    ast.MatMult: operator.matmul,
}
_PY_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_, ast.Invert: operator.invert}
_PY_CMPOPS: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_CMPI = {ast.Eq: "eq", ast.NotEq: "ne", ast.Lt: "slt", ast.LtE: "sle", ast.Gt: "sgt", ast.GtE: "sge"}
_CMPF = {ast.Eq: "oeq", ast.NotEq: "une", ast.Lt: "olt", ast.LtE: "ole", ast.Gt: "ogt", ast.GtE: "oge"}
_TILE_BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div"}
_OP_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
               ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^",
               ast.MatMult: "@"}
_UNARY_SYMBOLS = {ast.USub: "-", ast.UAdd: "+", ast.Not: "not ", ast.Invert: "~"}


class _Undefined:
    """A name that was bound only inside a loop body or one branch of an `if`."""

    def __init__(self, why: str):
        self.why = why


class Scope:
    """Variables of one function being inlined (the kernel, or an @tkc.func helper), and its globals."""

    def __init__(self, source: SourceFunction, variables: dict[str, Any]):
        self.source = source
        self.vars = variables

    def lookup(self, name: str) -> Any:
        if name in self.vars:
            value = self.vars[name]
            if isinstance(value, _Undefined):
                raise TkcError(f"`{name}` is not defined here: {value.why}")
            return value
        if name in self.source.closure:
            return self.source.closure[name]
        if name in self.source.globals:
            return self.source.globals[name]
        if hasattr(builtins, name):
            return getattr(builtins, name)
        if name in lang.__all__:  # the DSL's own word, not imported into the kernel's module
            raise TkcError(f"unknown name `{name}`: it is tkc.lang's; import it (`from tkc.lang import {name}`)")
        known = [*self.vars, *self.source.closure, *self.source.globals, *lang.__all__]
        close = difflib.get_close_matches(name, [k for k in known if not k.startswith("_")], n=1)
        hint = f"; did you mean `{close[0]}`?" if close else "; define it, pass it as a parameter, or import it"
        raise TkcError(f"unknown name `{name}`{hint}")


class _Return(Exception):
    """Unwinds an inlined helper at its `return`."""

    def __init__(self, value: Any):
        self.value = value


class CodeGen(ast.NodeVisitor):
    """Builds the body of one kernel. `builtins.py` supplies the meaning of each `tkc.lang` name."""

    def __init__(self, source: SourceFunction, target: str):
        from tkc.frontend.builtins import IMPLS, PY_BUILTIN_IMPLS

        self.impls = IMPLS
        self.py_builtin_impls = PY_BUILTIN_IMPLS
        self.target = target
        self.cluster = 1  # the kernel's blocks per cluster (`cluster=`): without clusters cluster_rank() is 0
        self.runtime_branches = 0  # run-time `if` branches being built around the current op
        self.cluster_syncs = 0  # cluster_sync() calls so far, in program order
        self.shared_written: dict[SSAValue, int] = {}  # a shared tile value → cluster_syncs when it was made
        self.shared_root: dict[SSAValue, SSAValue] = {}  # a stored-into shared tile → the value whose buffer it is
        self.cluster_reads: dict[SSAValue, tuple[int, SourceLoc | None]] = {}  # buffer → (cluster_syncs, where) at
        # the last load(..., rank=r) of it: a store into it needs a cluster_sync() after that (a peer may be reading)
        self.scope = Scope(source, {})
        self.builder: Builder | None = None
        self.node: ast.AST | None = None
        self.assign_sites: dict[str, ast.AST] = {}
        self.loop_depth = 0
        self.for_loops = 0  # run-time loops being built around the current op (through inlined helpers too)
        self.inline_depth = 0
        self.constants: dict[tuple[type, Any], SSAValue] = {}
        self.entry_builder: Builder

    def start(self, entry: Block) -> None:
        """Begin emitting at the end of the kernel's entry block (constants go before everything else)."""
        self.builder = Builder(InsertPoint.at_end(entry))
        self.entry_builder = Builder(InsertPoint.at_start(entry))

    # ----------------------------------------------------------------------------------------------------------
    # Emission helpers (used by builtins.py too)

    def loc(self, node: ast.AST | None = None) -> SourceLoc | None:
        node = node or self.node
        if node is None or not hasattr(node, "lineno"):
            return None
        src = self.scope.source
        return SourceLoc(src.filename, src.first_line + node.lineno - 1, node.col_offset + src.indent)

    def emit(self, op: Operation) -> Operation:
        assert self.builder is not None
        loc = self.loc()
        if loc is not None:
            op.location = loc.to_attr()
        self.builder.insert(op)
        try:
            op.verify()
        except VerifyException as e:
            raise TkcError(str(e)) from None
        if op.results and isinstance(op.results[0].type, SharedTileType):
            self.shared_written[op.results[0]] = self.cluster_syncs
            if isinstance(op, t.InsertOp):
                root = self.shared_root[op.results[0]] = self.shared_root.get(op.dest, op.dest)
                self.check_no_cluster_reader(root, "this store")
        return op

    def check_no_cluster_reader(self, buffer: SSAValue, what: str, at_read: bool = False) -> None:
        """A store into `buffer` (a shared tile) must follow a cluster_sync() that follows the cluster's last
        load(..., rank=r) of it: until then a peer may still be reading it. The error points at the store, or with
        `at_read` at that load."""
        read = self.cluster_reads.get(buffer)
        if read is not None and read[0] == self.cluster_syncs:
            where = f" at line {read[1].line}" if read[1] is not None else ""
            raise TkcError(f"{what} may overwrite a shared tile that the cluster's blocks still read (load(..., "
                           f"rank=r){where}): call cluster_sync() after those reads", loc=read[1] if at_read else None)

    def emit_value(self, op: Operation) -> SSAValue:
        return self.emit(op).results[0]

    def constant(self, value: Any) -> SSAValue:
        """A Python number as a run-time scalar: int → i32, float → f32, bool → i1. Constants are emitted once,
        at the top of the kernel, so that they dominate every use."""
        if isinstance(value, bool):
            attr: Any = IntegerAttr(int(value), i1)
        elif isinstance(value, int):
            if not INT32_MIN <= value <= INT32_MAX:
                raise TkcError(f"{value} does not fit in a 32-bit int")
            attr = IntegerAttr(value, i32)
        elif isinstance(value, float):
            attr = FloatAttr(value, f32)
        else:
            raise TkcError(f"{describe(value)} cannot be used as a run-time value")
        key = (type(value), repr(value))  # repr: -0.0 is not 0.0, and nan is nan
        if key not in self.constants:
            op = arith.ConstantOp(attr)
            self.entry_builder.insert(op)
            self.constants[key] = op.result
        return self.constants[key]

    def as_i32(self, value: Any, what: str) -> SSAValue:
        if is_int(value):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return self.constant(value)
        raise TkcError(f"{what} must be an integer, got {describe(value)}")

    def as_f32(self, value: Any, what: str) -> SSAValue:
        if is_float(value):
            return value
        if is_int(value):
            return self.emit_value(arith.SIToFPOp(value, f32))
        if isinstance(value, int | float) and not isinstance(value, bool):
            return self.constant(float(value))
        raise TkcError(f"{what} must be a number, got {describe(value)}")

    def as_runtime(self, value: Any) -> SSAValue:
        return value if is_runtime(value) else self.constant(value)

    @contextmanager
    def at_end_of(self, block: Block) -> Iterator[None]:
        saved = self.builder
        self.builder = Builder(InsertPoint.at_end(block))
        try:
            yield
        finally:
            self.builder = saved

    # ----------------------------------------------------------------------------------------------------------
    # Visiting

    def visit(self, node: ast.AST) -> Any:
        saved, self.node = self.node, node
        try:
            return super().visit(node)
        except TkcError as e:
            if e.loc is None:
                e.loc = self.loc(node)
            raise
        finally:
            self.node = saved

    def generic_visit(self, node: ast.AST) -> Any:
        what = type(node).__name__
        hints = {
            "While": "use `for i in range(n)`",
            "ListComp": "unroll with a `for` loop over a compile-time range",
            "Lambda": "define an @tkc.func helper",
            "Starred": None,
            "With": None,
            "Try": None,
            "Raise": "use `assert` for compile-time checks",
            "Import": "import at the top of the file",
            "ImportFrom": "import at the top of the file",
            "FunctionDef": "define helpers at module level with @tkc.func",
            "Break": None,
            "Continue": None,
            "Delete": None,
            "Global": None,
            "Nonlocal": None,
        }
        hint = hints.get(what)
        raise TkcError(f"{_describe_node(node)} is not supported in a kernel" + (f"; {hint}" if hint else ""))

    def visit_body(self, stmts: list[ast.stmt]) -> None:
        for stmt in stmts:
            self.visit(stmt)

    # Statements ------------------------------------------------------------------------------------------------

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # a docstring
        self.visit(node.value)

    def visit_Pass(self, node: ast.Pass) -> None:
        return None

    def visit_Assign(self, node: ast.Assign) -> None:
        value = self.visit(node.value)
        for target in node.targets:
            self.bind(target, value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is None:
            raise TkcError("a declaration without a value is not supported in a kernel")
        self.bind(node.target, self.visit(node.value))

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if not isinstance(node.target, ast.Name):
            raise TkcError("only plain variables can be updated with an augmented assignment")
        current = self.scope.lookup(node.target.id)
        self.bind(node.target, self.binary(node.op, current, self.visit(node.value)))

    def bind(self, target: ast.expr, value: Any) -> None:
        if isinstance(target, ast.Name):
            self.scope.vars[target.id] = value
            self.assign_sites[target.id] = target
            if isinstance(value, SSAValue) and value.name_hint is None:
                value.name_hint = target.id  # the IR reads with the kernel's (and its @tkc.func's) own names
        elif isinstance(target, ast.Tuple | ast.List):
            if any(isinstance(e, ast.Starred) for e in target.elts):
                raise TkcError("`*` unpacking in an assignment is not supported in a kernel; name every value")
            if not isinstance(value, tuple | list):
                raise TkcError(f"cannot unpack {describe(value)} into {len(target.elts)} names")
            if len(value) != len(target.elts):
                raise TkcError(f"cannot unpack {len(value)} values into {len(target.elts)} names")
            for name, v in zip(target.elts, value):
                self.bind(name, v)
        elif isinstance(target, ast.Subscript):
            raise TkcError("tiles are values and cannot be assigned into; use `store(dst, src, index)`")
        else:
            raise TkcError(f"cannot assign to {_describe_node(target)}")

    def visit_Assert(self, node: ast.Assert) -> None:
        test = self.visit(node.test)
        if is_runtime(test):
            raise TkcError("`assert` needs a compile-time condition; this one depends on run-time values")
        if not test:
            message = self.visit(node.msg) if node.msg is not None else "assertion failed"
            raise TkcError(str(message))

    def visit_Return(self, node: ast.Return) -> None:
        if self.inline_depth == 0 and node.value is not None:
            raise TkcError("a kernel returns nothing; write its results with `store`")
        if self.loop_depth:  # unwinding from here would drop the loop or branch being built
            raise TkcError(
                "`return` inside a run-time loop or branch is not supported; "
                + ("in an `if`, put the code that follows it under `else:`" if self.inline_depth == 0 else
                   "assign the result to a variable in each branch and return it after the `if`")
            )
        raise _Return(self.visit(node.value) if node.value is not None else None)

    def visit_If(self, node: ast.If) -> None:
        test = self.visit(node.test)
        if not is_runtime(test):
            self.visit_body(node.body if test else node.orelse)
            return
        cond = self.as_condition(test)
        names = sorted(_assigned_names(node.body, self) | _assigned_names(node.orelse, self))
        before = dict(self.scope.vars)

        def run_branch(stmts: list[ast.stmt]) -> dict[str, Any]:
            self.scope.vars = dict(before)
            self.loop_depth += 1
            self.runtime_branches += 1
            try:
                self.visit_body(stmts)
            finally:
                self.loop_depth -= 1
                self.runtime_branches -= 1
            return self.scope.vars

        then_block, else_block = Block(), Block()
        with self.at_end_of(then_block):
            then_vars = run_branch(node.body)
        with self.at_end_of(else_block):
            else_vars = run_branch(node.orelse)

        merged: dict[str, Any] = dict(before)
        results: list[str] = []
        for name in names:
            tv, ev = then_vars.get(name, _MISSING), else_vars.get(name, _MISSING)
            if tv is _MISSING or ev is _MISSING or isinstance(tv, _Undefined) or isinstance(ev, _Undefined):
                merged[name] = _Undefined(f"it is assigned in only one branch of the `if` at line {self.loc(node).line}")
                continue
            if not is_runtime(tv) and not is_runtime(ev) and _same_constant(tv, ev):
                merged[name] = tv
                continue
            results.append(name)
        then_vals, else_vals = [], []
        for name in results:
            tv, ev = then_vars[name], else_vars[name]
            site = self.loc(self.assign_sites.get(name, node))
            with self.at_end_of(then_block):
                tv = _at(site, self.promote, tv, name)
            with self.at_end_of(else_block):
                ev = _at(site, self.promote, ev, name)
            if tv.type != ev.type:
                raise TkcError(
                    f"`{name}` has a different type in each branch of the `if`: {describe(tv)} and {describe(ev)}; "
                    "a variable assigned under a run-time condition must keep one type",
                    loc=site,
                )
            then_vals.append(tv)
            else_vals.append(ev)
        with self.at_end_of(then_block):
            self.emit(scf.YieldOp(*then_vals))
        with self.at_end_of(else_block):
            self.emit(scf.YieldOp(*else_vals))
        self.scope.vars = merged
        op = self.emit(scf.IfOp(cond, [v.type for v in then_vals], Region(then_block), Region(else_block)))
        for name, result in zip(results, op.results):
            merged[name] = result

    def visit_For(self, node: ast.For) -> None:
        if node.orelse:
            raise TkcError("`for ... else` is not supported in a kernel")
        iterable = node.iter
        kind = self._range_kind(iterable.func) if isinstance(iterable, ast.Call) else None
        if kind is not None:
            assert isinstance(iterable, ast.Call)
            if iterable.keywords:
                raise TkcError(f"{kind}() takes no keyword arguments")
            bounds = [self.visit(a) for a in iterable.args]
            if not 1 <= len(bounds) <= 3:
                raise TkcError(f"{kind} expected 1 to 3 arguments, got {len(bounds)}")
            if kind == "runtime_range" or any(is_runtime(b) for b in bounds):
                self.runtime_for(node, bounds)
                return
            for b in bounds:
                if not isinstance(b, int) or isinstance(b, bool):
                    raise TkcError(f"range bounds must be integers, got {describe(b)}")
            items: Any = range(*bounds)
        else:
            items = self.visit(iterable)
            if is_runtime(items) or not isinstance(items, tuple | list | range):
                raise TkcError(f"a kernel can loop over `range(...)` or a compile-time tuple, not {describe(items)}")
        for item in items:  # compile-time: unrolled
            self.bind(node.target, item)
            self.visit_body(node.body)

    def _range_kind(self, func_node: ast.expr) -> str | None:
        """"range" (unrolled when its bounds are constants), "runtime_range" (always a loop), or None."""
        try:
            fn = self.visit(func_node)
        except TkcError:
            return None
        if fn is range:
            return "range"
        if fn is lang.runtime_range:
            return "runtime_range"
        return None

    def runtime_for(self, node: ast.For, bounds: list[Any]) -> None:
        if len(bounds) == 1:
            bounds = [0, bounds[0], 1]
        elif len(bounds) == 2:
            bounds = [bounds[0], bounds[1], 1]
        step = bounds[2]
        if not is_runtime(step) and (not isinstance(step, int) or step <= 0):
            raise TkcError("a run-time loop needs a positive step (a run-time step must be positive too)")
        if not isinstance(node.target, ast.Name):
            raise TkcError("a run-time loop variable must be a single name")
        lb, ub, stp = (self.as_i32(b, "a range bound") for b in bounds)

        before = dict(self.scope.vars)
        assigned = _assigned_names(node.body, self) - {node.target.id}
        carried = [n for n in sorted(assigned) if n in before and not isinstance(before[n], _Undefined)]
        runtime_carried, fixed = [], {}
        for name in carried:
            value = before[name]
            if is_runtime(value) or _is_number(value):
                runtime_carried.append(name)
            else:
                fixed[name] = value
        inits = [self.promote(before[n], n) for n in runtime_carried]

        body = Block(arg_types=[i32, *(v.type for v in inits)])
        for arg, name in zip(body.args, [node.target.id, *runtime_carried]):
            arg.name_hint = name
        self.scope.vars = dict(before)
        self.scope.vars[node.target.id] = body.args[0]
        for name, arg in zip(runtime_carried, body.args[1:]):
            self.scope.vars[name] = arg
        self.loop_depth += 1
        self.for_loops += 1
        with self.at_end_of(body):
            try:
                self.visit_body(node.body)
            finally:
                self.loop_depth -= 1
                self.for_loops -= 1
            for arg in body.args[1:]:  # the next step stores into a carried shared tile again
                self.check_no_cluster_reader(arg, "the loop's next step", at_read=True)
            yielded = []
            for name, init in zip(runtime_carried, inits):
                value = self.scope.vars[name]
                if isinstance(value, _Undefined):
                    raise TkcError(f"`{name}` is not defined at the end of the loop body: {value.why}")
                value = self.promote(value, name)
                if value.type != init.type:
                    raise TkcError(
                        f"`{name}` changes type in the loop: {describe(init)} before it, {describe(value)} after "
                        "one iteration; a loop-carried variable must keep its type",
                        loc=self.loc(self.assign_sites.get(name, node)),
                    )
                yielded.append(value)
            # A variable assigned only on a branch not taken (`if CONST:`) comes back unchanged: not carried.
            kept = [i for i, value in enumerate(yielded) if value is not body.args[1 + i]]
            for i in reversed(range(len(yielded))):
                if i not in kept:
                    body.args[1 + i].replace_all_uses_with(inits[i])
                    body.erase_arg(body.args[1 + i])
            runtime_carried, inits, yielded = ([xs[i] for i in kept] for xs in (runtime_carried, inits, yielded))
            self.emit(scf.YieldOp(*yielded))
        for name, value in fixed.items():
            if not _same_constant(self.scope.vars.get(name), value):
                raise TkcError(f"`{name}` holds a compile-time value that a run-time loop changes",
                               loc=self.loc(self.assign_sites.get(name, node)))
        body_vars = self.scope.vars
        self.scope.vars = dict(before)
        line = self.loc(node).line
        for name in assigned | {node.target.id}:
            if name not in before and name in body_vars:
                self.scope.vars[name] = _Undefined(f"it is assigned only inside the loop at line {line}")
        op = self.emit(scf.ForOp(lb, ub, stp, inits, body))
        for name, result in zip(runtime_carried, op.results):
            self.scope.vars[name] = result
            result.name_hint = name  # the loop's results read as the variables they become

    def promote(self, value: Any, name: str) -> SSAValue:
        if is_runtime(value):
            return value
        if _is_number(value):
            return self.constant(value)
        raise TkcError(
            f"`{name}` holds {describe(value)}, which cannot change at run time: only numbers, scalars and tiles "
            "can be reassigned under a run-time condition or in a run-time loop"
        )

    def as_condition(self, value: Any) -> SSAValue:
        if value.type == i1:
            return value
        if value.type == i32:
            return self.emit_value(arith.CmpiOp(value, self.constant(0), "ne"))
        if is_float(value):
            raise TkcError("a run-time float cannot be a condition; compare it, e.g. `x != 0.0`")
        raise TkcError(f"a condition must be a run-time bool or int (or a compile-time value), got {describe(value)}")

    # Expressions -----------------------------------------------------------------------------------------------

    def visit_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def visit_Name(self, node: ast.Name) -> Any:
        return self.scope.lookup(node.id)

    def visit_Tuple(self, node: ast.Tuple) -> tuple[Any, ...]:
        return tuple(self.visit(e) for e in node.elts)

    def visit_List(self, node: ast.List) -> list[Any]:
        return [self.visit(e) for e in node.elts]

    def visit_JoinedStr(self, node: ast.JoinedStr) -> str:
        parts = []
        for v in node.values:
            value = self.visit(v.value) if isinstance(v, ast.FormattedValue) else self.visit(v)
            if isinstance(v, ast.Constant):
                parts.append(value)
            else:  # a run-time value reads as its type: `n is a run-time int`
                parts.append(describe(value) if is_runtime(value) else format(value))
        return "".join(map(str, parts))

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        value = self.visit(node.value)
        if is_runtime(value):
            from tkc.frontend.builtins import attribute_of

            return attribute_of(self, value, node.attr)
        try:
            return getattr(value, node.attr)
        except AttributeError:
            raise TkcError(f"{describe(value)} has no attribute `{node.attr}`") from None

    def visit_Subscript(self, node: ast.Subscript) -> Any:
        value = self.visit(node.value)
        index = self.visit(node.slice)
        if isinstance(value, GlShape):
            if not isinstance(index, int) or not -value.rank <= index < value.rank:
                dim = index if isinstance(index, int) else describe(index)
                raise TkcError(f"{value.tensor.type.spec()}.shape has no dimension {dim}; index it with 0 to {value.rank - 1}")
            from tkc.ir.ops import DimOp

            return self.emit_value(DimOp(value.tensor, index % value.rank))
        if is_global(value):
            return self.read_element(value, index)
        if is_runtime(value):
            raise TkcError(
                f"{describe(value)} cannot be indexed; load a sub-tile with `load(s, (i, j), rt[...])`"
            )
        if is_runtime(index):
            raise TkcError("a compile-time sequence cannot be indexed with a run-time value")
        try:
            return value[index]
        except TkcError:
            raise
        except Exception as e:
            raise TkcError(f"cannot index {describe(value)} with {describe(index)}: {e}") from None

    def read_element(self, tensor: SSAValue, index: Any) -> SSAValue:
        """`G[i]` of an int32 global tensor: that element as a run-time int (0 past the tensor's end)."""
        from tkc.ir.ops import ReadOp
        from tkc.ir.types import I32

        gtype = tensor.type
        if gtype.element_type != I32:  # type: ignore[attr-defined]
            raise TkcError(f"{describe(tensor)}[...]: only an int32 tensor's elements read as run-time ints (an "
                           f"expert's number, a group's offset); tiles of {describe(tensor)} load with `load(...)`")
        entries = list(index) if isinstance(index, tuple | list) else [index]
        if len(entries) != gtype.rank or any(isinstance(i, slice) for i in entries):  # type: ignore[attr-defined]
            raise TkcError(f"{describe(tensor)}[...] reads one element: give {gtype.rank} indices, got "  # type: ignore[attr-defined]
                           f"{describe(index)}")
        return self.emit_value(ReadOp(tensor, [self.as_i32(i, "an element's index") for i in entries]))

    def visit_Slice(self, node: ast.Slice) -> slice:
        parts = [self.visit(p) if p is not None else None for p in (node.lower, node.upper, node.step)]
        if any(is_runtime(p) for p in parts):
            raise TkcError("slices must have compile-time bounds")
        return slice(*parts)

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        return self.binary(node.op, self.visit(node.left), self.visit(node.right))

    def binary(self, op: ast.operator, lhs: Any, rhs: Any) -> Any:
        if not is_runtime(lhs) and not is_runtime(rhs):
            if isinstance(lhs, GlShape) or isinstance(rhs, GlShape):
                raise TkcError("index `.shape` with a dimension first, e.g. `K.shape[2]`")
            try:
                return _PY_BINOPS[type(op)](lhs, rhs)
            except Exception as e:
                raise TkcError(f"{describe(lhs)} {_OP_SYMBOLS[type(op)]} {describe(rhs)}: {e}") from None
        from tkc.frontend.builtins import scalar_binary, tile_binary

        if is_register(lhs) or is_register(rhs):
            fn = _TILE_BINOPS.get(type(op))
            if fn is None:
                if isinstance(op, ast.MatMult):
                    raise TkcError("`@` is not defined on tiles; multiply with mm_AB(a, b) or mma_AB(a, b, c)")
                raise TkcError(f"`{_OP_SYMBOLS[type(op)]}` is not defined on tiles; use + - * / or the named ops")
            return tile_binary(self, fn, lhs, rhs)
        return scalar_binary(self, type(op), lhs, rhs)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        value = self.visit(node.operand)
        if not is_runtime(value):
            try:
                return _PY_UNARY[type(node.op)](value)
            except Exception as e:
                raise TkcError(f"{_UNARY_SYMBOLS[type(node.op)]}{describe(value)}: {e}") from None
        from tkc.frontend.builtins import unary_operator

        return unary_operator(self, type(node.op), value)

    def visit_BoolOp(self, node: ast.BoolOp) -> Any:
        is_and = isinstance(node.op, ast.And)
        result: Any = None
        for i, expr in enumerate(node.values):
            value = self.visit(expr)
            if i == 0:
                result = value
            elif not is_runtime(result):
                # Python semantics while everything is compile-time: short-circuit
                if (is_and and not result) or (not is_and and result):
                    return result
                result = value
            else:
                a, b = self.as_condition(result), self.as_condition(self.as_runtime(value))
                result = self.emit_value(arith.AndIOp(a, b) if is_and else arith.OrIOp(a, b))
            if not is_runtime(result) and ((is_and and not result) or (not is_and and result)):
                return result
        return result

    def visit_Compare(self, node: ast.Compare) -> Any:
        result: Any = True
        lhs = self.visit(node.left)
        for op, right in zip(node.ops, node.comparators):
            rhs = self.visit(right)
            if not is_runtime(lhs) and not is_runtime(rhs):
                try:
                    value: Any = _PY_CMPOPS[type(op)](lhs, rhs)
                except Exception as e:
                    raise TkcError(f"cannot compare {describe(lhs)} and {describe(rhs)}: {e}") from None
            else:
                from tkc.frontend.builtins import compare

                value = compare(self, type(op), lhs, rhs)
            if result is True:
                result = value
            elif not is_runtime(result) and not is_runtime(value):
                result = result and value
            else:
                result = self.emit_value(arith.AndIOp(self.as_runtime(result), self.as_runtime(value)))
            lhs = rhs
        return result

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        test = self.visit(node.test)
        if not is_runtime(test):
            return self.visit(node.body if test else node.orelse)
        a, b = self.visit(node.body), self.visit(node.orelse)
        if is_register(a) or is_register(b):
            raise TkcError("`x if cond else y` with a run-time condition works on scalars only")
        if isinstance(a, float) or isinstance(b, float) or is_float(a) or is_float(b):
            a, b = self.as_f32(a, "a branch"), self.as_f32(b, "a branch")
        else:
            a, b = self.as_runtime(a), self.as_runtime(b)
        if a.type != b.type:
            raise TkcError(f"the two branches differ: {describe(a)} and {describe(b)}")
        return self.emit_value(arith.SelectOp(self.as_condition(test), a, b))

    def visit_Call(self, node: ast.Call) -> Any:
        fn = self.visit(node.func)
        args = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                value = self.visit(a.value)
                if is_runtime(value) or not isinstance(value, tuple | list):
                    raise TkcError("only compile-time tuples can be unpacked into arguments")
                args.extend(value)
            else:
                args.append(self.visit(a))
        kwargs = {}
        for k in node.keywords:
            if k.arg is None:
                raise TkcError("`**kwargs` is not supported in a kernel")
            kwargs[k.arg] = self.visit(k.value)
        result = self.call(fn, args, kwargs, node)
        if fn is lang.store and result is not None and node.args and isinstance(node.args[0], ast.Name):
            self.bind(node.args[0], result)  # a store into a shared tile updates the variable holding it
        return result

    def call(self, fn: Any, args: list[Any], kwargs: dict[str, Any], node: ast.AST) -> Any:
        from tkc.frontend.kernel import Helper, Kernel

        if isinstance(fn, lang.DslOp):
            impl = self.impls.get(fn)
            if impl is None:
                raise TkcError(f"`{fn.name}` is not implemented yet")
            return _call_impl(self, f"{fn.name}{inspect.signature(fn.__wrapped__)}", impl, args, kwargs)
        if isinstance(fn, BoundMethod):
            return _call_impl(self, f".{fn.name}()", fn.impl, [fn.receiver, *args], kwargs)
        if isinstance(fn, Helper):
            return self.inline(fn, args, kwargs, node)
        if isinstance(fn, Kernel):
            raise TkcError(f"a kernel cannot call the kernel `{fn.name}`; make the shared part an @tkc.func")
        if fn is range:
            raise TkcError("`range` can be used only as the iterable of a `for` loop")
        runtime = any(is_runtime(a) or isinstance(a, GlShape) for a in [*args, *kwargs.values()])
        py_impl = self.py_builtin_impls.get(fn) if _hashable(fn) else None
        if py_impl is not None and runtime:
            return _call_impl(self, f"{fn.__name__}()", py_impl, args, kwargs)
        if not callable(fn):
            raise TkcError(f"{describe(fn)} is not callable")
        if runtime:
            name = getattr(fn, "__name__", repr(fn))
            raise TkcError(
                f"`{name}` is not a tkc op and cannot take run-time values; decorate it with @tkc.func to call it "
                "from a kernel"
            )
        try:
            return fn(*args, **kwargs)  # a compile-time computation, e.g. math.sqrt(D) or rt[bf16, 16, D]
        except TkcError:
            raise
        except Exception as e:
            name = getattr(fn, "__name__", repr(fn))
            raise TkcError(f"`{name}(...)` failed at compile time: {type(e).__name__}: {e}") from None

    def inline(self, helper: Helper, args: list[Any], kwargs: dict[str, Any], node: ast.AST) -> Any:
        try:
            bound = helper.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TkcError(f"{helper.name}{helper.signature}: {e}") from None
        bound.apply_defaults()
        if self.inline_depth > 32:
            raise TkcError(f"@tkc.func `{helper.name}` recurses too deeply")
        saved_scope, saved_sites, saved_depth = self.scope, self.assign_sites, self.loop_depth
        self.scope = Scope(helper.source, dict(bound.arguments))
        self.assign_sites, self.loop_depth = {}, 0
        self.inline_depth += 1
        try:
            self.visit_body(helper.source.tree.body)
            return None
        except _Return as r:
            return r.value
        finally:
            self.scope, self.assign_sites, self.loop_depth = saved_scope, saved_sites, saved_depth
            self.inline_depth -= 1

    def build_body(self, stmts: list[ast.stmt]) -> None:
        try:
            self.visit_body(stmts)
        except _Return:
            pass


_MISSING = object()


def _at(loc: SourceLoc | None, fn: Callable[..., Any], *args: Any) -> Any:
    """Call fn; a TkcError it raises without a location gets `loc`."""
    try:
        return fn(*args)
    except TkcError as e:
        if e.loc is None:
            e.loc = loc
        raise


def _call_impl(cg: CodeGen, usage: str, impl: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Call a builtin's implementation; `usage` (`mma_AB(a, b, c)`) heads the message if the arguments do not fit."""
    try:
        inspect.signature(impl).bind(cg, *args, **kwargs)
    except TypeError as e:
        raise TkcError(f"{usage}: {e}") from None
    return impl(cg, *args, **kwargs)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float)  # bool included


def _same_constant(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def _hashable(value: Any) -> bool:
    try:
        hash(value)
        return True
    except TypeError:
        return False


def _describe_node(node: ast.AST) -> str:
    names = {
        "While": "a `while` loop",
        "ListComp": "a list comprehension",
        "DictComp": "a dict comprehension",
        "SetComp": "a set comprehension",
        "GeneratorExp": "a generator expression",
        "Lambda": "a lambda",
        "With": "a `with` block",
        "Try": "a `try` block",
        "Raise": "`raise`",
        "Import": "`import`",
        "ImportFrom": "`import`",
        "FunctionDef": "a nested function",
        "ClassDef": "a class definition",
        "Break": "`break`",
        "Continue": "`continue`",
        "Delete": "`del`",
        "Global": "`global`",
        "Nonlocal": "`nonlocal`",
        "Await": "`await`",
        "Yield": "`yield`",
        "Dict": "a dict",
        "Set": "a set",
        "Starred": "`*` unpacking",
        "NamedExpr": "`:=`",
        "Attribute": "an attribute (values in a kernel have no settable attributes)",
    }
    return names.get(type(node).__name__, f"`{type(node).__name__}`")


def _assigned_names(stmts: list[ast.stmt], cg: CodeGen) -> set[str]:
    """Names a block of statements may rebind: assignment targets, loop variables, and the shared tile passed to
    `store` (which the store updates)."""
    names: set[str] = set()

    def targets(target: ast.AST) -> None:
        if isinstance(target, ast.Name):
            names.add(target.id)
        elif isinstance(target, ast.Tuple | ast.List):
            for element in target.elts:
                targets(element)

    for stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    targets(target)
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets(node.target)
            elif isinstance(node, ast.For):
                targets(node.target)
            elif isinstance(node, ast.NamedExpr):
                targets(node.target)
            elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name):
                # a store into a global tensor changes memory, not the variable: not carried
                if _resolves_to(cg, node.func, lang.store) and not is_global(cg.scope.vars.get(node.args[0].id)):
                    names.add(node.args[0].id)
    return names


def _resolves_to(cg: CodeGen, func_node: ast.expr, target: Any) -> bool:
    if isinstance(func_node, ast.Name):
        name = func_node.id
        if name in cg.scope.vars:
            return False
        try:
            return cg.scope.lookup(name) is target
        except TkcError:
            return False
    if isinstance(func_node, ast.Attribute):
        return func_node.attr == getattr(target, "name", None)
    return False

