"""Every mistake in a kernel is one TkcError that points at the kernel's file and line and says what to fix.

The kernels are in bad_kernels.py and bad_declarations.py; the line each error must point at ends with `# ERROR`.
A case is built for a target with constants; `at` names the text the column must point at (its first occurrence
on the line).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from xdsl.utils.exceptions import VerifyException

import tkc
from tkc.errors import TkcError

from . import bad_declarations as decl
from . import bad_kernels as bad


@dataclass
class Case:
    fn: Callable[[], Any]
    says: list[str]  # substrings of the message
    at: str | None = None  # the column points at this text of the marked line
    target: str = "sm_90a"
    constants: dict[str, Any] = field(default_factory=dict)
    where: Callable[..., Any] | None = None  # the function holding the marked line, if not `fn`

    @property
    def id(self) -> str:
        return self.fn.__name__ + ("" if self.target == "sm_90a" else f"-{self.target}")


def marked_line(fn: Callable[..., Any]) -> tuple[int, str]:
    """The line number and text of the line of `fn` that ends with `# ERROR`."""
    lines, first = inspect.getsourcelines(fn)
    marked = [(first + i, line.rstrip("\n")) for i, line in enumerate(lines) if line.rstrip().endswith("# ERROR")]
    assert len(marked) == 1, f"{fn.__name__} must mark exactly one line with # ERROR"
    return marked[0]


def error_of(case: Case) -> TkcError:
    with pytest.raises(TkcError) as info:
        result = case.fn()
        if isinstance(result, tkc.Kernel):
            result.build(case.target, **case.constants)
    return info.value


def check(case: Case) -> TkcError:
    error = error_of(case)
    where = inspect.unwrap(case.where or case.fn)  # a @tkc.func wraps its function
    line, text = marked_line(where)
    assert error.loc is not None, f"no location: {error.message}"
    assert os.path.realpath(error.loc.file) == os.path.realpath(inspect.getsourcefile(where))
    assert error.loc.line == line, f"points at line {error.loc.line} instead of {line}: {error.message}"
    if case.at is not None:
        assert error.loc.col == text.index(case.at), f"points at column {error.loc.col + 1}: {error.message}"
    for words in case.says:
        assert words in error.message
    # One readable error: `file:line:col: error: message`, the line, a caret under the column
    rendered = str(error).splitlines()
    assert rendered[0] == f"{error.loc.file}:{line}:{error.loc.col + 1}: error: {error.message.splitlines()[0]}"
    assert text.strip() in rendered[1]
    assert rendered[2] == "    " + " " * error.loc.col + "^"
    # ... that does not chain an xDSL exception (what --traceback would show)
    cause = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    assert not isinstance(cause, VerifyException)
    return error


def cases(*items: Case) -> Any:
    return pytest.mark.parametrize("case", items, ids=[c.id for c in items])


# --------------------------------------------------------------------------------------------------------------


@cases(
    Case(bad.mma_k_mismatch, ["mma_AB", "mismatch", "rt[bf16, 16, 32]", "rt[bf16, 64, 16]"], at="mma_AB("),
    Case(bad.mma_accumulator_shape, ["mma_ABt", "accumulator", "rt[f32, 16, 64]", "16x32"], at="mma_ABt("),
    Case(bad.mm_k_mismatch, ["_AtB", "mismatch"], at="mm_AtB("),
    Case(bad.elementwise_shape, ["mul", "shape mismatch", "rt[f32, 16, 32]", "rt[f32, 32, 32]"], at="a * b"),
    Case(bad.row_vector_length, ["sub_row", "16 rows", "rv[f32, 32]"], at="sub_row("),
    Case(bad.tile_minus_vector, ["rv[f32, 16]", "sub_row", "sub_col"], at="a - row_max"),
)
def test_shape_mismatch(case: Case) -> None:
    check(case)


@cases(
    Case(bad.mma_ab_dtypes, ["mma_AB", "dtype mismatch", "rt[bf16, 16, 32]", "rt[f16, 32, 16]"], at="mma_AB("),
    Case(bad.mma_f32_inputs, ["mma_ABt", "bf16 or f16", ".to(bf16)"], at="mma_ABt("),
    Case(bad.fp8_mma_ab, ["mma_AB", "K-major", "mma_ABt", "st[fp8e4m3, 64, 64]"], at="mma_AB("),
    Case(bad.fp8_register_tile, ["rt[fp8e4m3", "global and shared memory only"], at="rt["),
    Case(bad.multicast_into_registers, ["multicast=True", "rt[bf16, 16, 64]", "registers"], at="load("),
    Case(bad.multicast_not_a_constant, ["multicast must be True, False or (size, stride) when the kernel is compiled"],
         at="load("),
    Case(bad.multicast_group_outside_the_cluster, ["multicast=(3, 1)", "cluster of 4", "size·stride divide the cluster"],
         at="load("),
    Case(bad.cluster_load_before_sync, ["rank=r", "cluster_sync()"], at="load(s"),
    Case(bad.cluster_load_rank_outside, ["rank must be a block of the cluster (0 to 1), got 2"], at="load(s"),
    Case(bad.cluster_load_of_global, ["rank=r", "shared tile", "gl[f32, 2]"], at="load(A"),
    Case(bad.cluster_sync_in_branch, ["cluster_sync", "run-time `if`"], at="cluster_sync("),
    Case(bad.arrive_last_in_branch, ["arrive_last", "every warp of the block", "run-time `if`"], at="arrive_last("),
    Case(bad.arrive_last_on_floats, ["arrive_last", "gl[i32, 1]", "gl[f32, 1]"], at="arrive_last("),
    Case(bad.load_from_counters, ["load from gl[i32, 2]", "arrive_last's counters"], at="load(C"),
    Case(bad.cluster_store_while_peers_read, ["this store may overwrite a shared tile", "line", "cluster_sync()"],
         at="store(s"),
    Case(bad.cluster_loop_without_second_sync, ["the loop's next step may overwrite", "cluster_sync()"], at="load(s"),
    Case(bad.fp8_convert_in_registers, ["registers do not hold fp8", "store an f32"], at="load("),
    Case(bad.fp8_k_step, ["mma_ABt", "steps of 32", "st[fp8e4m3, 64, 48]"], at="mma_ABt("),
    Case(bad.elementwise_dtypes, ["add", "dtype mismatch", "rt[bf16, 16, 32]", "rt[f32, 16, 32]", ".to("], at="a + b"),
    Case(bad.shared_copy_converts, ["gl[bf16, 2]", "st[f32, 64, 64]", "convert in registers"], at="load("),
)
def test_dtype_mismatch(case: Case) -> None:
    check(case)


@cases(
    Case(bad.tile_not_multiple_of_16, ["rt[bf16, 16, 24]", "multiples of 16", "rt[bf16, 16, 32]"], at="rt[bf16, 16"),
    Case(bad.vector_size_from_constant, ["rv[f32, 20]", "multiples of 16", "rv[f32, 32]"], at="rv[f32, N]"),
    Case(bad.spec_outside_kernel, ["st[bf16, 64, 100]", "multiples of 16", "st[bf16, 64, 112]"], at="st["),
)
def test_tile_not_multiple_of_16(case: Case) -> None:
    check(case)


def test_tile_size_from_a_constant_override_points_at_the_shipped_kernel() -> None:
    import importlib

    gemm = importlib.import_module("tkc.kernels.gemm")

    with pytest.raises(TkcError) as info:
        gemm.gemm_kernel.build("sm_80", BK=24)
    error = info.value
    lines = open(gemm.__file__).read().splitlines()
    assert os.path.realpath(error.loc.file) == os.path.realpath(gemm.__file__)
    assert "st[DT, BM, BK]" in lines[error.loc.line - 1]
    assert "st[bf16, 128, 24]" in error.message and "multiples of 16" in error.message


@cases(
    Case(bad.shared_192kb, ["sm_80", "163 KB", "192 KB", "st[bf16, 128, 256]"], at="load(", target="sm_80"),
    Case(bad.shared_256kb, ["sm_90a", "227 KB", "256 KB", "st[bf16, 128, 256]"], at="empty(", target="sm_90a"),
)
def test_shared_memory_over_budget(case: Case) -> None:
    check(case)


@cases(
    Case(bad.three_buffers, ["buffers must be 1 or 2", "3"], at="empty("),
    Case(bad.double_buffer_outside_a_loop, ["buffers=2", "in a loop"], at="empty("),
)
def test_double_buffered_tile_errors(case: Case) -> None:
    check(case)


def test_shared_memory_budget_depends_on_the_target() -> None:
    bad.shared_192kb().build("sm_90a")  # 192 KB fit in sm_90a's 227 KB


def test_views_take_no_shared_memory_of_their_own() -> None:
    bad.views_of_128kb().build("sm_80")  # views of its rows and columns move no data: 128 KB in all


@cases(
    Case(bad.unknown_name, ["unknown name `exp3`", "did you mean `exp"], at="exp3"),
    Case(bad.unknown_name_no_match, ["unknown name `qqqqqq`"], at="qqqqqq"),
    Case(bad.unknown_tile_method, ["rt[f32, 16, 16] has no attribute `sum`"], at="a.sum"),
    Case(bad.unknown_module_attribute, ["module `tkc` has no attribute `exp3`"], at="tkc.exp3"),
    Case(bad.operator_not_on_tiles, ["`//` is not defined on tiles"], at="a // 2"),
    Case(bad.matmul_operator, ["`@` is not defined on tiles", "mm_AB(a, b)"], at="a @ a"),
    Case(bad.python_function_on_runtime_value, ["`sqrt` is not a tkc op", "@tkc.func"], at="math.sqrt"),
    Case(bad.error_inside_helper, ["unknown name `exp3`"], at="exp3", where=bad.bad_helper),
)
def test_unknown_name_or_op(case: Case) -> None:
    check(case)


@cases(
    Case(bad.loop_tile_changes_dtype, ["`acc` changes type in the loop", "rt[f32, 16, 16]", "rt[bf16, 16, 16]"],
         at="acc"),
    Case(bad.loop_int_becomes_float, ["`total` changes type", "run-time int", "run-time float"], at="total"),
    Case(bad.loop_changes_compile_time_value, ["`spec`", "compile-time value", "run-time loop"], at="spec"),
    Case(bad.branch_types_differ, ["`y` has a different type in each branch", "rt[bf16, 16, 16]", "rt[f32, 16, 16]"],
         at="y"),
    Case(bad.branch_changes_tuple, ["`t` holds (3, 4)", "cannot change at run time"], at="t ="),
    Case(bad.assigned_in_one_branch, ["`y` is not defined here", "only one branch"], at="y + 1"),
    Case(bad.assigned_only_in_loop, ["`t` is not defined here", "only inside the loop"], at="t  #"),
)
def test_value_changes_type_across_loop_or_branch(case: Case) -> None:
    check(case)


@cases(
    Case(bad.while_loop, ["`while` loop is not supported", "for i in range(n)"], at="while"),
    Case(bad.lambda_, ["lambda is not supported", "@tkc.func"], at="lambda"),
    Case(bad.break_, ["`break` is not supported"], at="break"),
    Case(bad.continue_, ["`continue` is not supported"], at="continue"),
    Case(bad.list_comprehension, ["list comprehension is not supported", "`for` loop"], at="["),
    Case(bad.with_block, ["`with` block is not supported"], at="with"),
    Case(bad.try_block, ["`try` block is not supported"], at="try"),
    Case(bad.nested_def, ["nested function is not supported", "@tkc.func"], at="def"),
    Case(bad.walrus, ["`:=` is not supported"], at="y :="),
    Case(bad.for_else, ["`for ... else` is not supported"], at="for"),
    Case(bad.raise_, ["`raise` is not supported", "assert"], at="raise"),
    Case(bad.import_in_kernel, ["`import` is not supported", "top of the file"], at="import"),
    Case(bad.dict_literal, ["dict is not supported"], at="{"),
    Case(bad.starred_assignment, ["`*` unpacking", "not supported"], at="x, *rest"),
    Case(bad.assign_into_tile, ["cannot be assigned into", "store("], at="a[0]"),
    Case(bad.assign_attribute, ["cannot assign to an attribute"], at="a.dtype"),
    Case(bad.kernel_returns_value, ["returns nothing", "store"], at="return"),
    Case(bad.kernel_returns_in_runtime_branch, ["`return` inside a run-time loop or branch", "`else:`"], at="return"),
    Case(bad.kernel_returns_in_runtime_loop, ["`return` inside a run-time loop or branch"], at="return"),
    Case(bad.return_in_runtime_branch, ["`return` inside a run-time", "not supported"], at="return",
         where=bad.helper_returns_in_branch),
    Case(bad.recursion, ["recurses too deeply"], at="recursive_helper(", where=bad.recursive_helper),
    Case(bad.async_kernel, ["plain `def`", "async def"], at="async"),
    Case(bad.kernel_calls_kernel, ["cannot call the kernel `inner`", "@tkc.func"], at="inner("),
)
def test_unsupported_python(case: Case) -> None:
    check(case)


@cases(
    Case(bad.too_many_arguments, ["exp(x)", "too many positional arguments"], at="exp("),
    Case(bad.missing_accumulator, ["mma_AB(a, b, c)", "missing a required argument: 'c'"], at="mma_AB("),
    Case(bad.unknown_keyword, ["zeros(spec)", "unexpected keyword argument 'fill'"], at="zeros("),
    Case(bad.helper_missing_argument, ["plus_one(x)", "missing a required argument: 'x'"], at="plus_one("),
    Case(bad.range_four_arguments, ["range expected 1 to 3 arguments, got 4"], at="for"),
    Case(bad.load_index_count, ["gl[bf16, 2] takes 2 indices, got 3"], at="load("),
    Case(bad.load_without_type, ["needs the type to load", "rt["], at="load("),
    Case(bad.unpack_count, ["cannot unpack 3 values into 2 names"], at="x, y"),
)
def test_wrong_argument_count(case: Case) -> None:
    check(case)


@cases(
    Case(bad.store_swapped_global, ["store(dst, src, index)", "destination comes first"], at="store("),
    Case(bad.store_swapped_shared, ["store(dst, src, index)", "destination comes first"], at="store("),
    Case(bad.store_shared_into_shared, ["must be in registers", "load("], at="store("),
    Case(bad.store_conflicts_into_global, ["`conflicts` is about shared memory banks", "shared tile"], at="store("),
    Case(bad.load_conflicts_from_global, ["load's `conflicts` is about shared memory banks"], at="load("),
    Case(bad.store_conflicts_zero, ["`conflicts` must be a compile-time whole number ≥ 1", "0"], at="store("),
)
def test_store_misuse(case: Case) -> None:
    """store() with its arguments swapped, a shared tile as the source; store's or load's `conflicts` where it means
    nothing."""
    check(case)


@cases(
    Case(bad.runtime_tile_size, ["known at compile time", "`n` is a run-time value", "const"], at="rt[f32, 16, n]"),
    Case(bad.runtime_fill_value, ["full's value must be a compile-time number", "run-time float"], at="full("),
    Case(bad.runtime_assert, ["`assert` needs a compile-time condition"], at="assert"),
    Case(bad.runtime_static_assert, ["static_assert needs a compile-time condition"], at="static_assert("),
    Case(bad.runtime_loop_step, ["positive step"], at="for"),
    Case(bad.runtime_index_into_tuple, ["cannot be indexed with a run-time value"], at="t[n]"),
)
def test_runtime_value_where_compile_time_needed(case: Case) -> None:
    check(case)


@cases(
    Case(decl.annotation_not_a_type, ["parameter `B`", "list is not gl[dtype, rank], int, float or const"], at="B:"),
    Case(decl.annotation_missing, ["parameter `B` needs an annotation", "gl[dtype, rank]"], at="B)"),
    Case(decl.annotation_register_tile, ["parameter `A`", "rt[bf16, 16, 16] is not gl[dtype, rank]"], at="A:"),
    Case(decl.annotation_gl_without_rank, ["gl[dtype, rank]", "gl[bf16, 4]"], at="gl[bf16]"),
    Case(decl.annotation_gl_rank_too_big, ["gl rank must be between 1 and 8, got 9"], at="gl[bf16, 9]"),
    Case(decl.annotation_bool, ["parameter `flag`", "bool is not gl[dtype, rank]"], at="flag"),
    Case(decl.annotation_unevaluable_string, ["parameter `B`", "cannot evaluate its annotation", "bfloat"], at="B:"),
    Case(decl.dtype_from_unknown_constant, ["parameter `A`", "from a const parameter `DX`", "does not have"], at="A:"),
    Case(decl.dtype_constant_not_a_dtype, ["constant `DT`", "must be one of bf16, f16", "got 16"], at="A:"),
    Case(decl.default_on_runtime_parameter, ["parameter `n`", "only `const` parameters take defaults"], at="n:"),
    Case(decl.star_args, ["parameter `rest`", "*args"]),
)
def test_bad_parameter_annotations(case: Case) -> None:
    check(case)


def test_constant_without_default() -> None:
    error = check(Case(decl.constant_without_default, ["constant `D` has no default", "D: const = ", "-D D="], at="D:"))
    assert "kernel `k`" in error.message
    decl.constant_without_default().build("sm_80", D=64)  # a value when compiling is enough


@cases(
    Case(decl.unknown_constant, ["constant named X", "they declare D"], at="def", constants={"X": 1}),
    Case(decl.unknown_constant_none_declared, ["constant named X", "declare none"], at="def", constants={"X": 1}),
)
def test_unknown_constant(case: Case) -> None:
    check(case)


@cases(
    Case(decl.needs_sm90a, ["needs sm_90a", "cannot compile for sm_80", "--target sm_90a"], at='min_target="sm_90a"',
         target="sm_80"),
    Case(decl.unknown_min_target, ["min_target", "sm_80, sm_90a", "'sm_75'"], at='min_target="sm_75"'),
    Case(decl.bad_warps, ["warps", "1 to 32", "got 0"], at="warps=0"),
    Case(decl.bad_stagger, ["stagger", "0 to 8", "got 9"], at="stagger=9"),
    Case(decl.bad_late_sums, ["late_sums", "0 to 1", "got 2"], at="late_sums=2"),
    Case(decl.bad_cluster, ["cluster", "1 to 16", "got 17"], at="cluster=17"),
    Case(decl.bad_mixed_ring, ["mixed_ring", "0 to 1", "got 2"], at="mixed_ring=2"),
    Case(decl.cluster_on_sm80, ["clusters of blocks (cluster=2) need sm_90a, not sm_80"], at="cluster=2",
         target="sm_80"),
    Case(decl.unknown_decorator_argument, ["warps=", "min_target=", "not wraps="], at="tkc.kernel("),
)
def test_target_and_decorator(case: Case) -> None:
    check(case)


def test_sm90a_kernel_builds_for_sm90a() -> None:
    module = decl.needs_sm90a().build("sm_90a")
    assert module.attributes["tkc.target"].data == "sm_90a"


@cases(
    Case(decl.op_outside_kernel, ["`exp` can only be used inside an @tkc.kernel"], at="exp("),
    Case(decl.kernel_called_directly, ["k.interpret(", "grid"], at="k(None)"),
    Case(decl.helper_called_directly, ["@tkc.func `identity` can only be called from a kernel"], at="identity("),
)
def test_language_outside_a_kernel(case: Case) -> None:
    check(case)


@cases(
    Case(bad.shared_tile_in_mma, ["must be in registers", "load"], at="mma_AB("),
    Case(bad.compare_tiles, ["tiles cannot be compared"], at="a > 0"),
    Case(bad.float_condition, ["float cannot be a condition", "x != 0.0"], at="1 if x"),
    Case(bad.shape_dimension_out_of_range, ["gl[f32, 2].shape has no dimension 2", "0 to 1"], at="A.shape[2]"),
    Case(bad.failed_static_assert, ["D must be 64 or 128, got 96"], at="static_assert("),
    Case(bad.constant_does_not_fit_int32, ["1099511627776 does not fit in a 32-bit int"], at="n + 2**40"),
    Case(bad.compile_time_division_by_zero, ["64 (a compile-time int) // 0", "division"], at="64 // D"),
    Case(bad.cdiv_by_zero, ["cdiv(64, 0): division by zero"], at="cdiv("),
    Case(bad.runtime_cdiv_by_zero, ["cdiv(..., 0): division by zero"], at="cdiv("),
    Case(bad.comparing_a_language_function, ["cannot compare <tkc op warp_id> and 0"], at="warp_id >"),
    Case(bad.negating_a_language_function, ["-<tkc op warp_id>"], at="-warp_id"),
    Case(bad.rows_index_in_the_column_place, ["rows(...) goes in the row place of a global tensor's index (index 0)"]),
    Case(bad.shared_version_read_after_store, ["sv[f32, 32]", "already overwritten", "in place"], at="load(a"),
    Case(bad.atomic_add_of_bf16, ["atomic_add adds an f32 tile into an f32 tensor", "rt[bf16, 16, 16]"]),
    Case(bad.atomic_add_into_shared, ["atomic_add(dst, src, index) adds into a global tensor", "st[f32, 16, 16]"]),
    Case(bad.rotate_pairs_of_bf16, ["rotate_pairs takes an f32 tile", "rt[bf16, 16, 32]", ".to(f32)"]),
    Case(bad.repeat_into_bf16, ["repeat=2", "reads a global tensor into an f32 register tile"]),
    Case(bad.repeat_of_three, ["load's repeat must be 2 (or 1), got 3"]),
    Case(bad.repeat_leaving_too_few_columns, ["rt[f32, 16, 16] reads 16/2 columns", "multiple of 32 columns"]),
    Case(bad.rows_at_in_a_store_from_shared, ["store into gl[bf16, 2]: rows_at(...) picks the rows of a register "
                                              "tile's load, store or atomic_add, or of a load into a shared tile"]),
    Case(bad.rows_at_into_a_multicast_load, ["load from gl[bf16, 2]: rows_at(...) picks the rows", "(not multicast)"]),
    Case(bad.rows_at_by_floats, ["rows_at's index must be a global tensor gl[i32, 1] or gl[i64, 1]", "gl[f32, 1]"]),
    Case(bad.rows_at_in_the_column_place, ["rows_at(...) picks the rows", "in the row place of its index (index 0)"]),
    Case(bad.tile_of_row_numbers, ["integer tensors hold arrive_last's counters and rows_at's row numbers"]),
    Case(bad.vector_of_ints, ["rv[i32, 16]: rv element type must be bf16, f16, f32"], at="zeros"),
)
def test_other_misuse(case: Case) -> None:
    check(case)


def test_multicast_share_of_whole_swizzle_patterns() -> None:
    """insert-tma-pipeline's error for a multicast tile that does not split into 8-row shares, at the load."""
    from tkc.compiler import lower_kernel

    with pytest.raises(TkcError) as info:
        lower_kernel(bad.multicast_slice_of_partial_swizzle_rows(), "sm_90a", {})
    line, _ = marked_line(bad.multicast_slice_of_partial_swizzle_rows)
    assert info.value.loc is not None and info.value.loc.line == line
    assert "st[bf16, 16, 64] shared by 4 blocks of a cluster: each block copies 16/4 rows" in info.value.message


def test_rotate_pairs_of_a_tile_the_col_layout_takes() -> None:
    """assign-layouts' error, at the rotate_pairs, for a tile whose group the mma B operands put in the col layout."""
    from tkc.compiler import lower_kernel

    with pytest.raises(TkcError) as info:
        lower_kernel(bad.rotate_pairs_of_an_mma_b_operand(), "sm_80", {})
    line, _ = marked_line(bad.rotate_pairs_of_an_mma_b_operand)
    assert info.value.loc is not None and info.value.loc.line == line
    assert "rotate_pairs needs its tile in the row layout" in info.value.message and "B operand" in info.value.message


def test_every_case_is_tested() -> None:
    """A case added to bad_kernels.py or bad_declarations.py without an entry here would never run."""
    tested = set()
    for obj in globals().values():
        for mark in getattr(obj, "pytestmark", []):
            if mark.name == "parametrize":
                tested |= {c.fn for c in mark.args[1] if hasattr(c, "fn")}  # (not the mutations' chunks)
    source = inspect.getsource(inspect.getmodule(test_every_case_is_tested))
    untested = []
    for module, prefix in ((bad, "bad"), (decl, "decl")):
        for name, fn in vars(module).items():
            if inspect.isfunction(fn) and fn.__module__ == module.__name__ and fn not in tested:
                if f"{prefix}.{name}(" not in source:
                    untested.append(f"{prefix}.{name}")
    assert not untested, f"cases without a test: {untested}"



@pytest.mark.parametrize("chunk", range(4))  # 80 mutations in four tests, which pytest-xdist spreads over its workers
def test_mutated_kernel_sources_never_fail_inside(chunk, tmp_path, capsys) -> None:
    """Kernel sources (tests/kernels, layernorm, gemm) with a number, a name or two lines of a kernel body changed,
    compiled by `tkc compile`: each compiles or gets one readable error, never an internal error (this found
    cdiv by zero and comparing a language function, each an exception from inside the frontend)."""
    import random
    import re
    from pathlib import Path

    from tkc.cli import main

    root = Path(__file__).resolve().parents[2]
    sources = [p.read_text() for p in sorted((root / "tests" / "kernels").glob("[!_]*.py"))]
    sources += [(root / "tkc" / "kernels" / name).read_text() for name in ("layernorm.py", "gemm.py")]
    names = ["load", "store", "mma_AB", "exp2", "row_max", "row_sum", "sub_row", "zeros", "empty", "rt", "st", "rv",
             "sv", "f32", "bf16", "warp_id", "block_idx", "cdiv", "sum"]
    for n in range(20 * chunk, 20 * chunk + 20):
        rng = random.Random(n)  # mutation n is the same whichever test runs it
        path = tmp_path / f"mutated_{n}.py"  # a file of its own: the source of a kernel is read back by its name
        lines = rng.choice(sources).splitlines()
        body = [i for i, line in enumerate(lines) if line.startswith("    ") and line.strip()
                and not line.strip().startswith(('"""', "#"))]
        for _ in range(rng.randint(1, 2)):
            i = rng.choice(body)
            edit = rng.randrange(3)
            words = list(re.finditer(r"\b\d+\b" if edit == 0 else r"\b[A-Za-z_]\w*\b", lines[i]))
            if edit == 2:
                j = rng.choice(body)
                lines[i], lines[j] = lines[j], lines[i]
            elif words:
                m = rng.choice(words)
                new = rng.choice(["0", "1", "3", "17", "-1", "4096"] if edit == 0 else names)
                lines[i] = lines[i][:m.start()] + new + lines[i][m.end():]
        path.write_text("\n".join(lines))
        main(["compile", str(path), "--target", rng.choice(["sm_80", "sm_90a"])])
        err = capsys.readouterr().err
        assert "internal error" not in err and "Traceback" not in err, "\n".join(lines) + "\n" + err


def test_a_dsl_word_not_imported_is_named_as_such(tmp_path, monkeypatch) -> None:
    """A kernel using a tkc.lang word its module did not import: the error says where the word is (not "did you
    mean" the same word)."""
    import importlib

    (tmp_path / "forgot_import.py").write_text(
        "import tkc\nfrom tkc.lang import f32, gl, rt, store\n\n\n@tkc.kernel\n"
        "def k(C: gl[f32, 2]):\n    store(C, zeros(rt[f32, 16, 16]), (0, 0))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from tkc.compiler import compile_kernels

    kernel = importlib.import_module("forgot_import").k
    with pytest.raises(TkcError, match=r"unknown name `zeros`: it is tkc.lang's; import it \(`from tkc.lang import zeros`\)"):
        compile_kernels([kernel], "sm_80", {})


def test_shared_memory_budget_counts_the_alignment_pad() -> None:
    """Buffers that fill the budget exactly are refused when compiled (allocate-shared), at the buffer that tips
    it: a launch asks for 1 KB more to align them, which the driver would refuse only at load time."""
    from tkc.compiler import compile_kernels

    kernel = bad.shared_163kb_unaligned()
    kernel.build("sm_80")  # the frontend's count of the buffers alone: 163 KB, within sm_80's budget
    with pytest.raises(TkcError) as info:
        compile_kernels([kernel], "sm_80")
    line, _ = marked_line(inspect.unwrap(bad.shared_163kb_unaligned))
    assert info.value.loc is not None and info.value.loc.line == line
    assert all(words in info.value.message for words in ("164 KB", "1 KB of it aligns", "163 KB"))
