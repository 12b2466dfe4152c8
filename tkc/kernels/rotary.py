"""Rotary position embedding (RoPE): the first R columns of each row of x turn by the angles of the row's position.
The rotate-half form (GPT-NeoX, LLaMA in Hugging Face) pairs column i with column i + R/2:

    out[:R/2]  = x₁·cos − x₂·sin            x₁ = x[:R/2], x₂ = x[R/2:R]
    out[R/2:R] = x₂·cos + x₁·sin
    out[R:]    = x[R:]                      (partial rotary: R < D)

the interleaved form (GPT-J; INTERLEAVED=1) pairs columns 2i and 2i + 1,
out[2i] = x[2i]·cosᵢ − x[2i+1]·sinᵢ and out[2i+1] = x[2i+1]·cosᵢ + x[2i]·sinᵢ: x·cos + rotate_pairs(x)·sin with cos
and sin spread over the pairs (`load(..., repeat=2)`).
cos and sin are (positions, R/2), row p for position p (cos θᵢ·p, sin θᵢ·p), in both. The gradient is the opposite
turn (sin negated), so the backward is the same kernel (CONJUGATE=1)."""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

import tkc
from tkc.kernels._checks import check_tensor, dtype_constant, fail, wants_grad
from tkc.lang import *  # noqa: F403

if TYPE_CHECKING:
    import torch


@tkc.kernel(warps="WARPS", min_target="sm_80")
def rotary_kernel(X: gl["DT", 4], Cos: gl["CT", 2], Sin: gl["CT", 2], Out: gl["DT", 4], offset: int,
                  D: const = 128, R: const = 128, HEADS: const = 2, WARPS: const = 4, DT: const = bf16,
                  CT: const = f32, COPY_REST: const = 1, CONJUGATE: const = 0, INTERLEAVED: const = 0):
    """X and Out (B, H, N, D), any strides but the last; Cos and Sin (≥ offset + N, R/2): position n of x is row
    offset + n of theirs. COPY_REST=0: columns R.. of Out are not written (Out is X: rotated in place).

    Grid: (cdiv(N, 16·WARPS), B, cdiv(H, HEADS)). Each warp takes 16 positions of HEADS heads of one batch as
    register tiles, which meet only elementwise ops and global memory (so they take the linear layout: 16-byte
    accesses): the positions' cos and sin are read once for every head, and every head's rows are read before the
    first is written (all in flight at once). Rows past N or heads past H read zeros and write nothing.
    """
    static_assert(R % 32 == 0 and 0 < R <= D, f"the rotated columns R ({R}) must be a multiple of 32 in 1..D ({D})")
    HALF = R // 2
    REST = math.gcd(R, D - R)                                    # the unrotated columns, in tiles of REST
    b, first_head = block_idx()[1], block_idx()[2] * HEADS
    tile = block_idx()[0] * WARPS + warp_id()                    # this warp's 16 positions
    ANGLES = R if INTERLEAVED else HALF                          # columns of cos and sin as the tiles use them
    cos = load(Cos, (rows(offset + 16 * tile), 0), rt[f32, 16, ANGLES], repeat=2 if INTERLEAVED else 1)
    sin = load(Sin, (rows(offset + 16 * tile), 0), rt[f32, 16, ANGLES], repeat=2 if INTERLEAVED else 1)
    if CONJUGATE:
        sin = 0.0 - sin
    PARTS = 1 if INTERLEAVED else 2                              # tiles a row's rotated columns are read in
    rows_in = ()
    for j in range(HEADS):
        for part in range(PARTS):
            rows_in = rows_in + (load(X, (b, first_head + j, tile, part), rt[DT, 16, R // PARTS]),)
    for j in range(HEADS):
        if INTERLEAVED:
            x = rows_in[j].to(f32)
            store(Out, x * cos + rotate_pairs(x) * sin, (b, first_head + j, tile, 0))
        else:
            x1, x2 = rows_in[2 * j].to(f32), rows_in[2 * j + 1].to(f32)
            store(Out, x1 * cos - x2 * sin, (b, first_head + j, tile, 0))
            store(Out, x2 * cos + x1 * sin, (b, first_head + j, tile, 1))
        if COPY_REST and R < D:
            for k in range(R // REST, D // REST):
                store(Out, load(X, (b, first_head + j, tile, k), rt[DT, 16, REST]), (b, first_head + j, tile, k))


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, offset: int = 0, interleaved: bool = False,
           conjugate: bool = False, out: torch.Tensor | None = None, target: str | None = None) -> torch.Tensor:
    """x turned by rotary position embedding: x (B, H, N, D) or (H, N, D), bf16 or f16, any strides but a
    contiguous last dimension (so a (B, N, H, D) tensor goes in as `x.transpose(1, 2)`, a view); cos and sin
    (positions, R/2) in float32, bf16 or f16, R ≤ D a multiple of 32 (R < D: the columns past R pass through);
    position n of x takes row `offset` + n (decoding: the cache's length). `interleaved=True`: GPT-J's pairs of
    adjacent columns (2i, 2i + 1) rather than the halves (i, i + R/2). `conjugate=True` turns the other way
    (sin negated: the inverse, and the gradient). `out=x` rotates in place. Autograd sees the call where x requires
    grad (cos and sin take none)."""
    import torch

    # The common call (4-D x, no out=, tables of a dtype the kernel reads) checks only what the launch cannot know,
    # the shapes and the offset, and leaves dtypes, devices and strides to the launch's argument reader: decoding
    # rotates a few rows a call, where the host's Python is the whole cost. Anything else, or anything the reader
    # refuses, takes the full checks below and their error.
    if (out is None and type(offset) is int and offset >= 0 and isinstance(x, torch.Tensor) and x.dim() == 4
            and x.numel() and not torch.compiler.is_compiling() and not wants_grad(torch, x)):
        try:
            d, n, rotated = x.shape[3], x.shape[2], 2 * cos.shape[-1]
            common = (cos.dim() == 2 and sin.shape == cos.shape and rotated % 32 == 0 and 0 < rotated <= d
                      and d % 16 == 0 and offset + n <= cos.shape[0] and str(cos.dtype) in _TABLE_TYPES
                      and not (cos.requires_grad or sin.requires_grad))
        except AttributeError:  # not tensors: the full checks say which
            common = False
        if common:
            out = torch.empty_like(x)
            grid = (-(-n // (16 * CONFIG["WARPS"])), x.shape[0], -(-x.shape[1] // heads_a_warp(d, rotated)))
            if _specialized(d, rotated, target, x.dtype, cos.dtype, True, conjugate, interleaved).launch(
                    grid, (x, cos, sin, out, offset), common_only=True):
                return out
            out = None
    if not isinstance(x, torch.Tensor) or x.dim() not in (3, 4):
        fail(f"x must be a tensor of shape (B, H, N, D) or (H, N, D), got "
             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    dtype = x.dtype if x.dtype is torch.float16 else torch.bfloat16
    check_tensor("x", x, dtype, x.dim())
    for name, t in (("cos", cos), ("sin", sin)):
        if isinstance(t, torch.Tensor) and str(t.dtype) not in _TABLE_TYPES:
            fail(f"{name} must be torch.float32, torch.bfloat16 or torch.float16, got {t.dtype}")
        check_tensor(name, t, t.dtype if isinstance(t, torch.Tensor) else dtype, 2)
        if t.get_device() != x.get_device():
            fail(f"{name} is on {t.device}, x on {x.device}: all tensors must be on the same device")
        if t.requires_grad and torch.is_grad_enabled():
            fail(f"{name} requires grad: rotary() gives no gradient for cos and sin")
    if sin.dtype is not cos.dtype or sin.shape != cos.shape:
        fail(f"sin must match cos: cos is {cos.dtype} {tuple(cos.shape)}, sin {sin.dtype} {tuple(sin.shape)}")
    d, n, rotated = x.shape[-1], x.shape[-2], 2 * cos.shape[1]
    if rotated % 32 or not 0 < rotated <= d:
        fail(f"cos: its {cos.shape[1]} columns make R = {rotated} rotated columns, which must be a multiple of 32 and "
             f"at most x's last dimension ({d})")
    if d % 16:
        fail(f"x: its last dimension must be a multiple of 16, got {d}")
    if isinstance(offset, bool) or not isinstance(offset, numbers.Integral) or offset < 0:
        fail(f"offset must be a non-negative int, got {offset!r}")
    offset = int(offset)
    if offset + n > cos.shape[0]:
        fail(f"cos and sin have {cos.shape[0]} positions; x's {n} from offset {offset} need {offset + n}")
    if out is not None:
        check_tensor("out", out, dtype, x.dim())
        if out.shape != x.shape:
            fail(f"out: expected shape {tuple(x.shape)}, got {tuple(out.shape)}")
    if torch.compiler.is_compiling() or wants_grad(torch, x):  # one op of the graph / of autograd
        from tkc.kernels import torch_ops

        result = torch_ops.rotary(x, cos, sin, offset, bool(interleaved), bool(conjugate), target)
        return result if out is None else out.copy_(result)
    if out is None:
        out = torch.empty_like(x)
    x4, out4 = (x, out) if x.dim() == 4 else (x.unsqueeze(0), out.unsqueeze(0))
    batch, heads = x4.shape[0], x4.shape[1]
    if x4.numel():
        in_place = out.data_ptr() == x.data_ptr() and out.stride() == x.stride()
        spec = _specialized(d, rotated, target, dtype, cos.dtype, not in_place, conjugate, interleaved)
        grid = (-(-n // (16 * CONFIG["WARPS"])), batch, -(-heads // heads_a_warp(d, rotated)))
        spec[grid](x4, cos, sin, out4, offset)
    return out


# Each warp 16 positions of two heads; of one where R < D (its unrotated columns are copied too). On an H100
# (bench/probe_rotary.py, RESULTS "rotary probe — 2026-12-07"), fractions of the copy bandwidth from a graph: at
# 4×32×4096×128 two heads 0.965, one 0.952, three 0.948, eight warps 0.961; with R = 64 one head 0.952, two 0.935;
# at 16×16×2048×64 0.92–0.93 in every configuration.
CONFIG = {"WARPS": 4}


def heads_a_warp(d: int, rotated: int) -> int:
    return 2 if rotated == d else 1


def _specialized(d: int, rotated: int, target: str | None, dtype: Any, cos_dtype: Any, copy_rest: bool,
                 conjugate: bool, interleaved: bool) -> Any:
    """rotary_kernel for these sizes, dtypes and options, made once."""
    key = (d, rotated, target, dtype, cos_dtype, copy_rest, bool(conjugate), bool(interleaved))
    spec = _SPECIALIZED.get(key)
    if spec is None:
        spec = _SPECIALIZED[key] = rotary_kernel.specialize(
            D=d, R=rotated, CT=_TABLE_TYPES[str(cos_dtype)], COPY_REST=int(copy_rest and rotated < d),
            CONJUGATE=int(conjugate), INTERLEAVED=int(interleaved), HEADS=heads_a_warp(d, rotated), target=target,
            **CONFIG, **dtype_constant(dtype))
    return spec


_SPECIALIZED: dict[tuple, Any] = {}
_TABLE_TYPES = {"torch.float32": f32, "torch.bfloat16": bf16, "torch.float16": f16}  # cos and sin: the kernel's CT
