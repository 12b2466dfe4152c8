"""`ptx` dialect → PTX text. Every line comes from an op's opcode and register tables; registers are named per
class (%p, %h, %r, %rd) in order of definition, one contiguous range per bundle.

Line info: each op keeps the source location of the tile op it was lowered from (backend/lowering.py), and where
that location changes a `.loc FILE LINE COLUMN` line goes before the op's instructions (`.file` lines name the
kernel's Python files at the top). ptxas and the driver's JIT carry it into the machine code's line table (the
instructions themselves are the same), so Nsight Compute's source view, compute-sanitizer's reports and
`nvdisasm -g` name the kernel's own lines. A path PTX cannot spell (non-ASCII, `"` or `\\`) gets no line info."""

from __future__ import annotations

import linecache
import os
import re
from io import StringIO

from xdsl.dialects.builtin import FileLineColLoc, ModuleOp
from xdsl.ir import Operation, SSAValue

from tkc.backend import ptx

PTX_VERSION = "8.1"  # red.global.add.v2.f32 (sm_90) needs 8.1; the H200 driver (CUDA 13.0) reads up to 9.0
PREFIX = {"pred": "%p", "b16": "%h", "b32": "%r", "b64": "%rd"}
SHARED_SYMBOL = "smem"


class RegisterNames:
    def __init__(self) -> None:
        self.next = {cls: 0 for cls in PREFIX}
        self.base: dict[SSAValue, int] = {}

    def define(self, value: SSAValue) -> None:
        cls = value.type.reg_class  # type: ignore[attr-defined]
        self.base[value] = self.next[cls]
        self.next[cls] += value.type.n  # type: ignore[attr-defined]

    def __call__(self, value: SSAValue, index: int) -> str:
        cls = value.type.reg_class  # type: ignore[attr-defined]
        return f"{PREFIX[cls]}{self.base[value] + int(index)}"

    def declarations(self) -> list[str]:
        return [f".reg .{cls} {PREFIX[cls]}<{n}>;" for cls, n in self.next.items() if n]


def _address(names: RegisterNames, value: SSAValue, index: int, offset: int) -> str:
    reg = names(value, index)
    return f"[{reg}+{offset}]" if offset > 0 else (f"[{reg}{offset}]" if offset < 0 else f"[{reg}]")


def _vector(regs: list[str]) -> str:
    return regs[0] if len(regs) == 1 else "{" + ", ".join(regs) + "}"


def _guard(names: RegisterNames, guard: SSAValue | None, index: int | None, negate: bool = False) -> str:
    if guard is None or index is None:
        return ""
    return f"@{'!' if negate else ''}{names(guard, index)} "


def emit_kernel(kernel: ptx.KernelOp, out: StringIO, files: dict[str, int] | None = None) -> None:
    """One kernel's PTX; with `files` (path → `.file` index) a `.loc` line wherever the source location changes."""
    names = RegisterNames()
    body = kernel.body.block
    for op in body.ops:
        for result in op.results:
            names.define(result)
    lines: list[str] = []
    last_loc = None
    for op in body.ops:
        op_lines = _emit_op(op, names)
        loc = _line_of(op, files) if files and op_lines else None
        if loc is not None and loc != last_loc:
            lines.append(".loc {} {} {}".format(*loc))
            last_loc = loc
        lines.extend(op_lines)
    params = ",\n".join(f"    .param .align 64 .b8 {n}[128]" if t == "tensormap" else f"    .param .{t} {n}"
                         for n, t in kernel.param_list)
    smem = kernel.attributes.get("tkc.smem_bytes")
    if smem is not None:  # what the launch asks for: the size of `smem[]`, which the PTX cannot say
        out.write(f"// {kernel.sym_name.data}: {smem.value.data} bytes of dynamic shared memory\n")
    out.write(f".visible .entry {kernel.sym_name.data}(\n{params}\n)\n")
    out.write(f".maxntid {kernel.threads.data}, 1, 1\n")
    if kernel.min_blocks is not None:
        out.write(f".minnctapersm {kernel.min_blocks.data}\n")
    if kernel.cluster is not None:
        out.write(f".reqnctapercluster {kernel.cluster.data}, 1, 1\n")
    out.write("{\n")
    for decl in names.declarations():
        out.write(f"    {decl}\n")
    for line in lines:
        out.write(line if line.endswith(":") else f"    {line}")
        out.write("\n")
    out.write("}\n")


def _emit_op(op, names: RegisterNames) -> list[str]:  # noqa: C901 - one case per op kind
    if isinstance(op, ptx.RegsOp):
        return []
    if isinstance(op, ptx.ParamOp):
        return [f"ld.param.{op.ptx_type.data} {names(op.result, 0)}, [{op.param.data}];"]
    if isinstance(op, ptx.SpecialOp):
        return [f"mov.u32 {names(op.result, 0)}, {op.register.data};"]
    if isinstance(op, ptx.InstrOp):
        lines = []
        target = op.target
        table, operand_of_slot = op.slot_table, op.operand_of_slot
        imms = [s.data for s in op.immediates.data]
        guards = op.guard_indices
        negate = op.guard_negate is not None and op.guard_negate.value.data
        for i, d in enumerate(op.dest_indices):
            parts = [names(target, d)]
            for s, k in enumerate(operand_of_slot):
                parts.append(imms[table[i, s]] if k == -1 else names(op.args[int(k)], table[i, s]))
            guard = _guard(names, op.guard, guards[i] if guards is not None else None, negate)
            lines.append(f"{guard}{op.opcode.data} {', '.join(parts)};")
        return lines
    if isinstance(op, ptx.LoadOp):
        vec = op.vec.data
        suffix = f".v{vec}" if vec > 1 else ""
        guards = op.table("guard_index", 0) if op.guard_index is not None else None
        lines = []
        for i, (a, off, d) in enumerate(zip(op.table("addr_index", 0), op.table("offset", 0), op.table("dest", 0))):
            dst = [names(op.result, d + v) for v in range(vec)]
            if guards is not None:
                lines.extend(f"mov.b32 {r}, 0;" for r in dst)
            guard = _guard(names, op.guard, guards[i] if guards is not None else None)
            lines.append(f"{guard}ld.{op.space.data}{suffix}.{op.ptx_type.data} {_vector(dst)}, {_address(names, op.addr, a, off)};")
        return lines
    if isinstance(op, ptx.StoreOp):
        vec = op.vec.data
        suffix = f".v{vec}" if vec > 1 else ""
        guards = op.table("guard_index", 0) if op.guard_index is not None else None
        lines = []
        for i, (a, off, s) in enumerate(zip(op.table("addr_index", 0), op.table("offset", 0), op.table("source", 0))):
            src = [names(op.value, s + v) for v in range(vec)]
            guard = _guard(names, op.guard, guards[i] if guards is not None else None)
            instr = f"red.{op.space.data}.{op.reduce.data}" if op.reduce is not None else f"st.{op.space.data}"
            lines.append(f"{guard}{instr}{suffix}.{op.ptx_type.data} {_address(names, op.addr, a, off)}, {_vector(src)};")
        return lines
    if isinstance(op, ptx.CpAsyncOp):
        sizes = op.table("size_index", 0) if op.size_index is not None else None
        guards = op.table("guard_index", 0) if op.guard_index is not None else None
        nbytes = op.nbytes.data
        cache = "cg" if nbytes == 16 else "ca"
        lines = []
        rows = zip(op.table("dst_index", 0), op.table("dst_offset", 0), op.table("src_index", 0), op.table("src_offset", 0))
        for i, (di, do, si, so) in enumerate(rows):
            size = f", {names(op.src_size, sizes[i])}" if sizes is not None else ""
            guard = _guard(names, op.guard, guards[i] if guards is not None else None)
            lines.append(f"{guard}cp.async.{cache}.shared.global {_address(names, op.dst, di, do)}, "
                         f"{_address(names, op.src, si, so)}, {nbytes}{size};")
        return lines
    if isinstance(op, ptx.CpAsyncCommitOp):
        return ["cp.async.commit_group;"]
    if isinstance(op, ptx.CpAsyncWaitOp):
        return [f"cp.async.wait_group {op.pending.data};"]
    if isinstance(op, ptx.LdmatrixOp):
        num = op.num.data
        trans = ".trans" if op.trans.value.data else ""
        dest = op.table("dest", num)
        lines = []
        for i, (a, off) in enumerate(zip(op.table("addr_index", 0), op.table("offset", 0))):
            dst = _vector([names(op.result, d) for d in dest[i]])
            lines.append(f"ldmatrix.sync.aligned.m8n8.x{num}{trans}.shared.b16 {dst}, {_address(names, op.addr, a, off)};")
        return lines
    if isinstance(op, ptx.MmaOp):
        lines = []
        written = set()
        for row in op.instructions:
            d, a, b, c = row[0:4], row[4:8], row[8:10], row[10:14]
            # an accumulator register already written by this op is read back from the result
            c_regs = [names(op.result, x) if int(x) in written else names(op.c, x) for x in c]
            written.update(int(x) for x in d)
            lines.append(
                f"mma.sync.aligned.{op.shape.data} {_vector([names(op.result, x) for x in d])}, "
                f"{_vector([names(op.a, x) for x in a])}, {_vector([names(op.b, x) for x in b])}, "
                f"{_vector(c_regs)};"
            )
        for x in range(op.result.type.n):
            if x not in written:
                lines.append(f"mov.b32 {names(op.result, x)}, {names(op.c, x)};")
        return lines
    if isinstance(op, ptx.BarSyncOp):
        which = names(op.barrier_reg, 0) if op.barrier_reg is not None else op.barrier.data
        return [f"bar.{'arrive' if op.arrives else 'sync'} {which}{f', {op.threads.data}' if op.threads is not None else ''};"]
    if isinstance(op, ptx.LabelOp):
        return [f"{op.label.data}:"]
    if isinstance(op, ptx.BraOp):
        guard = _guard(names, op.guard, 0, op.negate.value.data) if op.guard is not None else ""
        return [f"{guard}bra.uni {op.target.data};"]
    if isinstance(op, ptx.RetOp):
        return ["ret;"]
    if isinstance(op, ptx.ParamAddrOp):
        reg = names(op.result, 0)
        return [f"mov.b64 {reg}, {op.param.data};", f"cvta.param.u64 {reg}, {reg};"]
    if isinstance(op, ptx.WgmmaOp):
        n = op.n.data
        acc = _vector([names(op.acc, x) for x in op.table("acc_index", 0)])
        a_regs = [names(op.a, x) for x in op.table("a_index", 0)]
        a = _vector(a_regs)
        trans = f", {op.trans_b.data}" if op.a_in_registers else f", {op.trans_a.data}, {op.trans_b.data}"
        if op.k == 32:  # fp8: K-major only, so no transpose immediates
            trans = ""
        shape = f"m64n{n}k{op.k}.f32.{op.a_type.data}.{op.b_type.data}"
        return [f"wgmma.mma_async.sync.aligned.{shape} {acc}, {a}, {names(op.b, op.b_index.data)}, "
                f"{op.scale_d.data}, 1, 1{trans};"]
    if isinstance(op, ptx.WgmmaSyncOp):
        kind = op.kind.data
        if kind == "wait":
            return [f"wgmma.wait_group.sync.aligned {op.pending.data};"]  # type: ignore[union-attr]
        return [f"wgmma.{'fence' if kind == 'fence' else 'commit_group'}.sync.aligned;"]
    if isinstance(op, ptx.FenceOp):
        return [f"fence.{op.kind.data};"]
    if isinstance(op, ptx.AtomOp):
        result = names(op.result, 0)
        return [f"mov.b32 {result}, 0;", f"{_guard(names, op.guard, 0)}atom.acq_rel.gpu.global.add.u32 {result}, "
                f"{_address(names, op.addr, 0, 0)}, {names(op.value, 0)};"]
    if isinstance(op, ptx.BarRedOp):
        return [f"bar.red.or.pred {names(op.result, 0)}, 0, {names(op.value, 0)};"]
    if isinstance(op, ptx.MbarrierOp):
        bar = _address(names, op.addr, op.addr_index.data, op.offset.data)
        guard = _guard(names, op.guard, 0)
        kind = op.kind.data
        if kind == "init":
            return [f"{guard}mbarrier.init.shared::cta.b64 {bar}, {op.count.data};"]  # type: ignore[union-attr]
        if kind == "arrive":
            return [f"{guard}mbarrier.arrive.shared::cta.b64 _, {bar};"]
        if kind == "cp_async_arrive":
            return [f"{guard}cp.async.mbarrier.arrive.noinc.shared::cta.b64 {bar};"]
        if kind == "arrive_cluster":
            return [f"{guard}mbarrier.arrive.shared::cluster.b64 _, {bar};"]
        if kind == "arrive_expect_tx":
            return [f"{guard}mbarrier.arrive.expect_tx.shared::cta.b64 _, {bar}, {op.count.data};"]  # type: ignore[union-attr]
        parity = names(op.parity, op.parity_index.data)  # type: ignore[arg-type, union-attr]
        return [f"{guard}mbarrier.try_wait.parity.shared::cta.b64 {names(op.result, 0)}, {bar}, {parity};"]
    if isinstance(op, ptx.TmaLoadOp):
        coords = [names(op.coords, x) for x in op.table("coord_index", 0)]
        dst = _address(names, op.dst, op.dst_index.data, op.dst_offset.data)
        bar = _address(names, op.bar, op.bar_index.data, op.bar_offset.data)
        multicast = ".multicast::cluster" if op.mask is not None else ""
        mask = f", {names(op.mask, 0)}" if op.mask is not None else ""
        return [f"{_guard(names, op.guard, 0)}cp.async.bulk.tensor.{len(coords)}d.shared::cluster.global.mbarrier::complete_tx::bytes{multicast} {dst}, "
                f"[{names(op.tmap, 0)}, {{{', '.join(coords)}}}], {bar}{mask};"]
    if isinstance(op, ptx.TmaStoreOp):
        coords = [names(op.coords, x) for x in op.table("coord_index", 0)]
        src = _address(names, op.src, op.src_index.data, op.src_offset.data)
        kind = (f"cp.reduce.async.bulk.tensor.{len(coords)}d.global.shared::cta.{op.reduce.data}.tile"
                if op.reduce is not None else f"cp.async.bulk.tensor.{len(coords)}d.global.shared::cta")
        return [f"{_guard(names, op.guard, 0)}{kind}.bulk_group [{names(op.tmap, 0)}, {{{', '.join(coords)}}}], {src};"]
    if isinstance(op, ptx.BulkGroupOp):
        if op.kind.data == "commit":
            return ["cp.async.bulk.commit_group;"]
        return [f"cp.async.bulk.wait_group{'.read' if op.kind.data == 'wait_read' else ''} {op.pending.data};"]  # type: ignore[union-attr]
    if isinstance(op, ptx.WarpSyncOp):
        return ["bar.warp.sync -1;"]
    if isinstance(op, ptx.SetmaxnregOp):
        return [f"setmaxnreg.{'inc' if op.increase.value.data else 'dec'}.sync.aligned.u32 {op.count.data};"]
    if isinstance(op, ptx.GridDependencyOp):
        return [f"griddepcontrol.{op.kind.data};"]
    if isinstance(op, ptx.ClusterBarrierOp):
        return [{"arrive": "barrier.cluster.arrive.release.aligned;", "wait": "barrier.cluster.wait.acquire.aligned;",
                 "arrive_relaxed": "barrier.cluster.arrive.relaxed.aligned;"}[op.kind.data]]
    if isinstance(op, ptx.ElectOp):
        return [f"elect.sync _|{names(op.result, 0)}, 0xffffffff;"]
    raise NotImplementedError(f"no PTX for {op.name}")


def emit_ptx(module: ModuleOp, target: str, line_info: bool = True) -> str:
    """PTX text for every `ptx.kernel` of a module (with `.file` / `.loc` lines unless `line_info` is off)."""
    out = StringIO()
    out.write(f"//\n// Generated by tkc for {target}\n//\n\n")
    out.write(f".version {PTX_VERSION}\n.target {target}\n.address_size 64\n\n")
    kernels = [op for op in module.walk() if isinstance(op, ptx.KernelOp)]
    files = _source_files(kernels) if line_info else {}
    for path, index in files.items():
        out.write(f'.file {index} "{path}"\n')
    if files:
        out.write("\n")
    if any(_uses_shared(k) for k in kernels):
        out.write(f".extern .shared .align 1024 .b8 {SHARED_SYMBOL}[];\n\n")
    for kernel in kernels:
        emit_kernel(kernel, out, files)
        out.write("\n")
    return out.getvalue()


def _uses_shared(kernel: ptx.KernelOp) -> bool:
    return any(isinstance(op, ptx.SpecialOp) and op.register.data == SHARED_SYMBOL for op in kernel.body.block.ops)


def _spellable(path: str) -> bool:
    """Can a PTX string hold this path? (printable ASCII without quotes or backslashes: ptxas has no escapes)"""
    return path.isascii() and path.isprintable() and '"' not in path and "\\" not in path


def _source_files(kernels: list[ptx.KernelOp]) -> dict[str, int]:
    """The source files the kernels' ops come from, numbered from 1 in order of first use."""
    files: dict[str, int] = {}
    for kernel in kernels:
        for op in kernel.body.block.ops:
            loc = op.location
            if isinstance(loc, FileLineColLoc) and loc.filename.data not in files and _spellable(loc.filename.data):
                files[loc.filename.data] = len(files) + 1
    return files


def _line_of(op: Operation, files: dict[str, int]) -> tuple[int, int, int] | None:
    loc = op.location
    if not isinstance(loc, FileLineColLoc) or loc.filename.data not in files:
        return None
    return files[loc.filename.data], loc.line.data, loc.column.data


def python_line(path: str, number: int, short: bool = False) -> str:
    """`path:N: <the line's text>` (`short`: the file's name only), as errors and the SASS listing quote it."""
    name = os.path.basename(path) if short else path
    return f"{name}:{number}: {linecache.getline(path, number).strip()}".rstrip()


def source_of_line(ptx_text: str, lineno: int) -> str | None:
    """The Python line a line of PTX came from, `path:N: <its text>`, by the `.loc` before it (None if none)."""
    lines = ptx_text.splitlines()
    files = dict(re.findall(r'^\.file (\d+) "([^"]*)"$', ptx_text, re.M))
    for text in reversed(lines[:max(lineno, 0)]):
        loc = re.match(r"\s*\.loc (\d+) (\d+) \d+$", text)
        if loc and loc.group(1) in files:
            return python_line(files[loc.group(1)], int(loc.group(2)))
        if text.startswith(".visible .entry"):
            return None
    return None

