"""LayerNorm with a fused residual add: s = x + residual; out = (s - mean(s)) / sqrt(var(s) + eps) · w + b; and
RMSNorm, out = s / sqrt(mean(s²) + eps) · w. Either without the residual: s = x."""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any

import tkc
from tkc.kernels._checks import check_tensor, dtype_constant, fail, wants_grad
from tkc.lang import *  # noqa: F403

if TYPE_CHECKING:
    import torch

@tkc.func
def row_totals(values, scratch, warps):
    """The row sums of a tuple of f32 scalars `values`, each one warp's part of its row's sum, which all `warps`
    warps get, through one barrier: warp w writes 16 copies of value k into slot k·warps + w of `scratch`
    (sv[f32, 16·warps·len(values)]), then every warp adds each value's slots up, one element per lane at a time
    (wider reads would conflict on banks). A row in one warp: `values` themselves."""
    if warps == 1:
        return values
    n = 32 if warps % 2 == 0 else 16
    for k in range(len(values)):
        scratch = store(scratch, zeros(rv[f32, 16]) + values[k], (k * warps + warp_id(),))
    sums = ()
    for k in range(len(values)):
        first = k * 16 * warps // n
        partial = load(scratch, (first,), rv[f32, n])
        for i in range(first + 1, first + 16 * warps // n):
            partial = partial + load(scratch, (i,), rv[f32, n])
        sums = sums + (sum(partial) / 16,)
    return sums


@tkc.func
def row_total(x, scratch, warps):
    """A row's sum from its warps' sums `x` (row_totals of one value; `scratch` sv[f32, 16·warps])."""
    return row_totals((x,), scratch, warps)[0]


@tkc.kernel(warps="WARPS", blocks_per_sm="BLOCKS", min_target="sm_80")
def layernorm_kernel(X: gl["DT", 2], Residual: gl["DT", 2], Weight: gl["DT", 1], Bias: gl["DT", 1],
                     Out: gl["DT", 2], OutResidual: gl["DT", 2], eps: float, D: const = 1024, WARPS: const = 1,
                     BLOCKS: const = 0, DT: const = bf16, RESIDUAL: const = 1, RMS: const = 0):
    """Rows of length D. Writes the normalized rows to Out and x + residual to OutResidual. RESIDUAL=0: the rows
    are x's own (Residual and OutResidual are not touched). RMS=1: RMSNorm, s / sqrt(mean(s²) + eps) · w (Bias is
    not read).

    Grid: (blocks,): block b takes rows b, b + blocks, ... A row is spread over the block's WARPS warps, D / WARPS
    columns each, and stays in registers: x and the residual are read once, both outputs written once, and the
    mean and the variance (of the centered row, exactly) are block-wide sums through shared memory (a warp's own
    shuffles where WARPS = 1). A block a row is the fastest grid on the H200: a row a warp, or resident-sized grids
    reading the next row during this one's sums, were slower (RESULTS "layernorm probe — 2026-12-04"). BLOCKS asks
    ptxas to fit that many blocks on a multiprocessor (it caps the registers a thread; 0: ptxas's choice).
    """
    static_assert(D % (16 * WARPS) == 0, f"D ({D}) must be a multiple of 16 · WARPS ({16 * WARPS})")
    COLS = D // WARPS
    part = warp_id()                                             # this warp's columns, in units of COLS
    scratch = empty(sv[f32, 16 * WARPS])
    for row in range(block_idx()[0], X.shape[0], num_blocks()[0]):
        x = load(X, (row, part), rv[f32, COLS])
        s = x + load(Residual, (row, part), rv[f32, COLS]) if RESIDUAL else x
        if RESIDUAL:
            store(OutResidual, s, (row, part))
        centered = s if RMS else s - row_total(sum(s), scratch, WARPS) / D
        rstd = rsqrt(row_total(sum(centered * centered), scratch, WARPS) / D + eps)
        # weight and bias come from L1 each row (8 KB at D = 4096) rather than sitting in 2·COLS/32 registers for
        # the whole kernel: fewer registers, more warps, more of x in flight.
        if RMS:
            y = centered * rstd * load(Weight, (part,), rv[f32, COLS])
        else:
            w, b = load(Weight, (part,), rv[f32, COLS]), load(Bias, (part,), rv[f32, COLS])
            y = centered * rstd * w + b
        store(Out, y, (row, part))


def layernorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor,
              eps: float = 1e-5, target: str | None = None, out: torch.Tensor | None = None,
              residual_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(layer_norm(x + residual)·weight + bias, x + residual) for bf16 (or f16) CUDA tensors of one dtype of shape
    (..., D), with weight and bias of shape (D,). D must be a multiple of 16. Returns both (the second is the new
    residual stream of a pre-norm transformer). residual=None: layer_norm(x)·weight + bias, and x itself (no
    residual read or written)."""
    return _normalize(x, residual, weight, bias, eps, target, out, residual_out, rms=False)


def rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float = 1e-6,
            target: str | None = None, out: torch.Tensor | None = None,
            residual_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual)·weight, x + residual), with s = x + residual: s / sqrt(mean(s²) + eps) · weight (as
    torch's F.rms_norm), tensors and residual=None as layernorm's."""
    return _normalize(x, residual, weight, None, eps, target, out, residual_out, rms=True)


def _normalize(x: Any, residual: Any, weight: Any, bias: Any, eps: Any, target: str | None, out: Any,
               residual_out: Any, rms: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """layernorm() (rms False) and rmsnorm() (rms True, bias None)."""
    import torch

    if type(eps) is not float:
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
            fail(f"eps: must be a number, got {eps!r}")
        eps = float(eps)
    if residual is None and residual_out is not None:
        fail("residual_out: given without a residual (with residual=None the new residual is x itself)")
    if torch.compiler.is_compiling() or wants_grad(torch, x, residual, weight, bias):  # one op of the graph / of autograd
        from tkc.kernels import torch_ops

        y, s = torch_ops.layernorm(x, residual, weight, bias, eps, target, rms)
        if residual is None:
            return (y if out is None else out.copy_(y)), x
        return (y if out is None else out.copy_(y)), (s if residual_out is None else residual_out.copy_(s))

    # The common call (2-D tensors of matching shapes) checks only what the launch cannot know, the shapes, and
    # leaves dtypes, devices and strides to the launch's argument reader: at ~35 µs a kernel at 16384×1024, a
    # slow host's Python is what the GPU waits for. Anything else, or anything the reader refuses, takes the full
    # checks below and their error. Where there is no residual or bias, the launch passes x, weight and out in
    # their places (the kernel reads and writes none of them).
    if isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[0]:
        shape, d = x.shape, x.shape[1]
        try:
            common = (weight.shape == (d,) and (rms or bias.shape == (d,)) and d % 16 == 0
                      and (residual is None or residual.shape == shape) and (out is None or out.shape == shape)
                      and (residual_out is None or residual_out.shape == shape))
        except AttributeError:  # not tensors: the full checks say which
            common = False
        if common:
            out = torch.empty_like(x) if out is None else out
            if residual is not None and residual_out is None:
                residual_out = torch.empty_like(x)
            args = (x, x if residual is None else residual, weight, weight if rms else bias, out,
                    out if residual is None else residual_out, eps)
            if _specialized(d, target, x.dtype, residual is not None, rms).launch((shape[0], 1, 1), args,
                                                                                  common_only=True):
                return out, x if residual is None else residual_out
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        fail("x must be a tensor with at least one dimension")
    shape, rank = x.shape, x.dim()
    d = shape[-1]
    dtype = x.dtype if x.dtype is torch.float16 else torch.bfloat16
    check_tensor("x", x, dtype, rank)
    if residual is not None:
        check_tensor("residual", residual, dtype, rank)
        if residual.shape != shape:
            fail(f"residual: expected shape {tuple(shape)}, got {tuple(residual.shape)}")
    check_tensor("weight", weight, dtype, 1)
    if weight.shape[0] != d:
        fail(f"weight: expected shape ({d},), got {tuple(weight.shape)}")
    if not rms:
        check_tensor("bias", bias, dtype, 1)
        if bias.shape[0] != d:
            fail(f"bias: expected shape ({d},), got {tuple(bias.shape)}")
    if d % 16:
        fail(f"x: the normalized dimension must be a multiple of 16, got {d}")
    device = x.get_device()
    if any(t is not None and t.get_device() != device for t in (residual, weight, bias)):
        fail("all tensors must be on the same device")
    if out is None:
        out = torch.empty_like(x)
    else:
        check_tensor("out", out, dtype, rank)
    if residual is not None and residual_out is None:
        residual_out = torch.empty_like(x)
    elif residual is not None:
        check_tensor("residual_out", residual_out, dtype, rank)
    for name, t in (("out", out), ("residual_out", residual_out)):
        if t is not None and t.shape != shape:
            fail(f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}")
    tensors = (x, x if residual is None else residual, out, out if residual is None else residual_out)
    if rank != 2:
        tensors = tuple(_rows(name, t, d) for name, t in zip(("x", "residual", "out", "residual_out"), tensors))
    x2, r2, o2, ro2 = tensors
    rows = x2.shape[0]
    if rows:
        _specialized(d, target, dtype, residual is not None, rms)[(rows,)](x2, r2, weight, weight if rms else bias,
                                                                            o2, ro2, eps)
    return out, x if residual is None else residual_out


def _specialized(d: int, target: str | None, dtype: Any, residual: bool = True, rms: bool = False) -> Any:
    """layernorm_kernel for rows of `d` columns of torch `dtype` (bf16 or f16; and `target`), with or without the
    residual, LayerNorm or RMSNorm; made once."""
    key = (d, target, dtype, residual, rms)
    spec = _SPECIALIZED.get(key)
    if spec is None:
        variant = {**({} if residual else {"RESIDUAL": 0}), **({"RMS": 1} if rms else {})}
        spec = _SPECIALIZED[key] = layernorm_kernel.specialize(D=d, WARPS=_warps(d), target=target,
                                                               **dtype_constant(dtype), **variant)
    return spec


_SPECIALIZED: dict[tuple[int, str | None, Any, bool, bool], Any] = {}


def _warps(d: int) -> int:
    """Warps a row: a block per row (the GPU balances the rows over its multiprocessors), its warps splitting the
    row: about 1024 columns per warp, up to 8 warps (bench/sweep.py layernorm on the H200), but at least 2 from
    D = 1024 (16384×1024 on the H200, kernel alone: 0.909 vs 0.892 of the copy bandwidth with one warp) and 4 from
    D = 2048 (RESULTS "layernorm probe — 2026-12-04 08:05–08:06": 0.922 vs 0.907 at 16384×2048, 0.963 vs 0.955 at
    32768×2048; at D = 1024 four warps read 0.869 / 0.913 / 0.957 vs two's 0.867 / 0.920 / 0.964 at 16384 / 32768 /
    65536 rows)."""
    warps = _WARPS.get(d)
    if warps is None:
        warps = 2 if d >= 1024 and d % 64 == 0 else 1
        while warps < 8 and d % (32 * warps) == 0 and d // (2 * warps) >= (1024 if warps >= 4 else 512):
            warps *= 2
        _WARPS[d] = warps
    return warps


_WARPS: dict[int, int] = {}


def _rows(name: str, t: torch.Tensor, d: int) -> torch.Tensor:
    try:
        return t.view(-1, d)
    except RuntimeError:
        raise tkc.TkcError(f"{name}: its leading dimensions cannot be flattened without a copy (strides "
                           f"{tuple(t.stride())}); make it contiguous") from None
