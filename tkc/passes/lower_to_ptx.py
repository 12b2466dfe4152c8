"""lower-to-ptx: tile IR (layouts, swizzles and shared offsets assigned) → the `ptx` dialect, one kernel per func.

Per-thread code: every warp runs the function; a register tile becomes the bundle of 32-bit registers its
fragment layout gives each lane (backend/fragments.py), a shared tile the address of its buffer, a global tensor
its pointer, sizes and byte strides (kernel parameters `X_ptr, X_d0.., X_s0..`). `scf.for` / `scf.if` become
labels and uniform branches, their carried values registers written at the back edge. The lowering's context and
dispatch are backend/lowering.py; the handlers: scalars in backend/lower_scalars.py, control flow and barriers in
lower_control.py, register-tile compute in lower_compute.py, loads and stores in lower_memory.py, whole-tile
copies and cp.async rings in lower_copies.py, TMA in lower_tma.py.

    %e = tile.exp2 %s : !tile.rt<16x64xf32, row>
becomes
    %e = ptx.op "ex2.approx.ftz.f32" (%s) ... : !ptx.regs<b32, 32>      // 32 instructions
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr
from xdsl.passes import ModulePass

from tkc.passes import register
from tkc.passes.allocate_shared import TOTAL_ATTR
from tkc.targets import get_target


def lower_module(module: ModuleOp) -> None:
    """Replace every kernel's tile IR with its `ptx.kernel`."""
    from tkc.backend.lowering import KernelLowering  # here: backend/lowering.py imports tkc.passes, which loads this pass
    import tkc.backend.lower_compute  # noqa: F401  (registers handlers)
    import tkc.backend.lower_copies  # noqa: F401
    import tkc.backend.lower_memory  # noqa: F401
    import tkc.backend.lower_tma  # noqa: F401

    target_attr = module.attributes.get("tkc.target")
    target = get_target(target_attr.data if isinstance(target_attr, StringAttr) else "sm_90a").name
    kernels = []
    for fn in list(module.ops):
        if isinstance(fn, func.FuncOp):
            kernel = KernelLowering(fn, target).run()
            kernel.attributes["tkc.smem_bytes"] = IntegerAttr(fn.attributes[TOTAL_ATTR].value.data  # type: ignore[attr-defined]
                                                              if TOTAL_ATTR in fn.attributes else 0, 64)
            kernels.append((fn, kernel))
    for fn, kernel in kernels:
        module.body.block.insert_op_before(kernel, fn)
        fn.detach()
        fn.erase()


@register("lower-to-ptx", "lower tile IR (layouts, swizzles and shared offsets assigned) to the ptx dialect")
class LowerToPtx(ModulePass):
    name = "lower-to-ptx"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        lower_module(op)
