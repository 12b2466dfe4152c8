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


@tkc.func
def turn_rows(X, Out, b, first_head, tile, cos, sin, heads, rotated, d, dt, interleaved, copy_rest):
    """Rows 16·tile .. of `heads` heads from first_head of batch b of X, turned by the tiles cos and sin, into Out
    (and the columns past `rotated` copied where copy_rest). Every head's rows are read before the first is
    written: all in flight at once."""
    parts = 1 if interleaved else 2                              # tiles a row's rotated columns are read in
    rest = math.gcd(rotated, d - rotated)                        # the unrotated columns, in tiles of rest
    rows_in = ()
    for j in range(heads):
        for part in range(parts):
            rows_in = rows_in + (load(X, (b, first_head + j, tile, part), rt[dt, 16, rotated // parts]),)
    for j in range(heads):
        if interleaved:
            x = rows_in[j].to(f32)
            store(Out, x * cos + rotate_pairs(x) * sin, (b, first_head + j, tile, 0))
        else:
            x1, x2 = rows_in[2 * j].to(f32), rows_in[2 * j + 1].to(f32)
            store(Out, x1 * cos - x2 * sin, (b, first_head + j, tile, 0))
            store(Out, x2 * cos + x1 * sin, (b, first_head + j, tile, 1))
        if copy_rest and rotated < d:
            for k in range(rotated // rest, d // rest):
                store(Out, load(X, (b, first_head + j, tile, k), rt[dt, 16, rest]), (b, first_head + j, tile, k))


@tkc.kernel(warps="WARPS", min_target="sm_80")
def rotary_kernel(X: gl["DT", 4], Cos: gl["CT", 2], Sin: gl["CT", 2], Out: gl["DT", 4], Y: gl["DT", 4],
                  OutY: gl["DT", 4], Positions: gl["PT", 1], offset: int, positions_stride: int, D: const = 128,
                  R: const = 128, HEADS: const = 2, WARPS: const = 4, DT: const = bf16, CT: const = f32,
                  COPY_REST: const = 1, CONJUGATE: const = 0, INTERLEAVED: const = 0, PAIR: const = 0,
                  POSITIONS: const = 0, PT: const = i32):
    """X and Out (B, H, N, D), any strides but the last; Cos and Sin (≥ offset + N, R/2): position n of x is row
    offset + n of theirs, or with POSITIONS=1 row Positions[b·positions_stride + n] (an index of PT, i32 or i64;
    else Positions is not read). COPY_REST=0: columns R.. of Out are not written (Out is X: rotated in place).
    PAIR=1: Y (B, H_y, N, D) turned into OutY by the same launch (q and k), the blocks past X's heads taking Y's
    (else Y and OutY are not touched).

    Grid: (cdiv(N, 16·WARPS), B, cdiv(H, HEADS) [+ cdiv(H_y, HEADS)]). Each warp takes 16 positions of HEADS heads of
    one batch as register tiles, which meet only elementwise ops and global memory (so they take the linear layout:
    16-byte accesses): the positions' cos and sin are read once for every head. Rows past N or heads past H read
    zeros and write nothing.
    """
    static_assert(R % 32 == 0 and 0 < R <= D, f"the rotated columns R ({R}) must be a multiple of 32 in 1..D ({D})")
    b, group = block_idx()[1], block_idx()[2]
    tile = block_idx()[0] * WARPS + warp_id()                    # this warp's 16 positions
    ANGLES = R if INTERLEAVED else R // 2                        # columns of cos and sin as the tiles use them
    if POSITIONS:
        angles = rows_at(Positions, b * positions_stride + 16 * tile)
    else:
        angles = rows(offset + 16 * tile)
    cos = load(Cos, (angles, 0), rt[f32, 16, ANGLES], repeat=2 if INTERLEAVED else 1)
    sin = load(Sin, (angles, 0), rt[f32, 16, ANGLES], repeat=2 if INTERLEAVED else 1)
    if CONJUGATE:
        sin = 0.0 - sin
    x_groups = cdiv(X.shape[1], HEADS)
    if not PAIR or group < x_groups:
        turn_rows(X, Out, b, group * HEADS, tile, cos, sin, HEADS, R, D, DT, INTERLEAVED, COPY_REST)
    else:
        turn_rows(Y, OutY, b, (group - x_groups) * HEADS, tile, cos, sin, HEADS, R, D, DT, INTERLEAVED, COPY_REST)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, offset: int = 0,
           positions: torch.Tensor | None = None, interleaved: bool = False, conjugate: bool = False,
           out: torch.Tensor | None = None, target: str | None = None) -> torch.Tensor:
    """x turned by rotary position embedding: x (B, H, N, D) or (H, N, D), bf16 or f16, any strides but a
    contiguous last dimension (so a (B, N, H, D) tensor goes in as `x.transpose(1, 2)`, a view); cos and sin
    (positions, R/2) in float32, bf16 or f16, R ≤ D a multiple of 32 (R < D: the columns past R pass through);
    position n of x takes row `offset` + n (decoding: the cache's length), or row positions[n] (`positions`: an
    int32 or int64 tensor (N,), or (B, N) a row for each batch, as Hugging Face's position_ids; a position outside
    the tables turns its row by zeros). `interleaved=True`: GPT-J's pairs of adjacent columns (2i, 2i + 1) rather
    than the halves (i, i + R/2). `conjugate=True` turns the other way (sin negated: the inverse, and the
    gradient). `out=x` rotates in place. Autograd sees the call where x requires grad (cos and sin take none)."""
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
                      and d % 16 == 0 and str(cos.dtype) in _TABLE_TYPES
                      and not (cos.requires_grad or sin.requires_grad)
                      and (offset + n <= cos.shape[0] if positions is None else
                           offset == 0 and positions.dim() == 1 and positions.shape[0] == n
                           and str(positions.dtype) in _INDEX_TYPES))
        except AttributeError:  # not tensors: the full checks say which
            common = False
        if common:
            out = torch.empty_like(x)
            grid = (-(-n // (16 * CONFIG["WARPS"])), x.shape[0], -(-x.shape[1] // heads_a_warp(d, rotated)))
            spec = _specialized(d, rotated, target, x.dtype, cos.dtype, True, conjugate, interleaved,
                                positions=positions)
            where = _no_positions(torch, x) if positions is None else positions
            if spec.launch(grid, (x, cos, sin, out, x, out, where, offset, 0), common_only=True):
                return out
            out = None
    d, n, rotated, dtype, offset = _checked(torch, "x", x, cos, sin, offset, positions)
    where, positions_stride = _positions_arg(torch, "x", x, positions, offset)
    if out is not None:
        check_tensor("out", out, dtype, x.dim())
        if out.shape != x.shape:
            fail(f"out: expected shape {tuple(x.shape)}, got {tuple(out.shape)}")
    if torch.compiler.is_compiling() or wants_grad(torch, x):  # one op of the graph / of autograd
        from tkc.kernels import torch_ops

        result = torch_ops.rotary(x, cos, sin, offset, bool(interleaved), bool(conjugate), target, positions)
        return result if out is None else out.copy_(result)
    if out is None:
        out = torch.empty_like(x)
    x4, out4 = (x, out) if x.dim() == 4 else (x.unsqueeze(0), out.unsqueeze(0))
    if x4.numel():
        in_place = out.data_ptr() == x.data_ptr() and out.stride() == x.stride()
        spec = _specialized(d, rotated, target, dtype, cos.dtype, not in_place, conjugate, interleaved,
                            positions=positions)
        grid = (-(-n // (16 * CONFIG["WARPS"])), x4.shape[0], -(-x4.shape[1] // heads_a_warp(d, rotated)))
        spec[grid](x4, cos, sin, out4, x4, out4, where, offset, positions_stride)
    return out


def rotary_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, offset: int = 0,
              positions: torch.Tensor | None = None, interleaved: bool = False, conjugate: bool = False,
              inplace: bool = False, target: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, k) turned by the same angles in one launch, as rotary() turns each: q (B, H, N, D) and k (B, H_k, N, D)
    (H_k may differ: grouped-query attention; or both 3-D), of one dtype, any strides but the last. `inplace=True`
    turns q and k themselves and returns them. Where autograd or torch.compile sees the call, it is two rotary()
    calls."""
    import torch

    d, n, rotated, dtype, offset = _checked(torch, "q", q, cos, sin, offset, positions)
    where, positions_stride = _positions_arg(torch, "q", q, positions, offset)
    check_tensor("k", k, dtype, q.dim())
    if k.shape[:-3] != q.shape[:-3] or k.shape[-2:] != q.shape[-2:]:
        fail(f"k: expected q's batch, positions and head dim, {tuple(q.shape[:-3])} × H_k × {tuple(q.shape[-2:])}, "
             f"got {tuple(k.shape)}")
    if k.get_device() != q.get_device():
        fail(f"k is on {k.device}, q on {q.device}: all tensors must be on the same device")
    if torch.compiler.is_compiling() or wants_grad(torch, q, k):
        options = {"offset": offset, "positions": positions, "interleaved": interleaved, "conjugate": conjugate,
                   "target": target}
        return (rotary(q, cos, sin, out=q if inplace else None, **options),
                rotary(k, cos, sin, out=k if inplace else None, **options))
    q_out, k_out = (q, k) if inplace else (torch.empty_like(q), torch.empty_like(k))
    q4, k4, qo4, ko4 = (t if t.dim() == 4 else t.unsqueeze(0) for t in (q, k, q_out, k_out))
    if n and q4.shape[0] and q4.shape[1] + k4.shape[1]:
        heads = heads_a_warp(d, rotated)
        spec = _specialized(d, rotated, target, dtype, cos.dtype, not inplace, conjugate, interleaved, pair=True,
                            positions=positions)
        grid = (-(-n // (16 * CONFIG["WARPS"])), q4.shape[0], -(-q4.shape[1] // heads) + -(-k4.shape[1] // heads))
        spec[grid](q4, cos, sin, qo4, k4, ko4, where, offset, positions_stride)
    return q_out, k_out


def _checked(torch: Any, name: str, x: Any, cos: Any, sin: Any, offset: Any,
             positions: Any = None) -> tuple[int, int, int, Any, int]:
    """The full checks of rotary()'s x (named `name`), tables and offset: (D, N, R, x's dtype, offset). With
    positions, x's rows need not fit the tables from the offset (the positions say which rows they take)."""
    if not isinstance(x, torch.Tensor) or x.dim() not in (3, 4):
        fail(f"{name} must be a tensor of shape (B, H, N, D) or (H, N, D), got "
             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    dtype = x.dtype if x.dtype is torch.float16 else torch.bfloat16
    check_tensor(name, x, dtype, x.dim())
    for table, t in (("cos", cos), ("sin", sin)):
        if isinstance(t, torch.Tensor) and str(t.dtype) not in _TABLE_TYPES:
            fail(f"{table} must be torch.float32, torch.bfloat16 or torch.float16, got {t.dtype}")
        check_tensor(table, t, t.dtype if isinstance(t, torch.Tensor) else dtype, 2)
        if t.get_device() != x.get_device():
            fail(f"{table} is on {t.device}, {name} on {x.device}: all tensors must be on the same device")
        if t.requires_grad and torch.is_grad_enabled():
            fail(f"{table} requires grad: rotary() gives no gradient for cos and sin")
    if sin.dtype is not cos.dtype or sin.shape != cos.shape:
        fail(f"sin must match cos: cos is {cos.dtype} {tuple(cos.shape)}, sin {sin.dtype} {tuple(sin.shape)}")
    d, n, rotated = x.shape[-1], x.shape[-2], 2 * cos.shape[1]
    if rotated % 32 or not 0 < rotated <= d:
        fail(f"cos: its {cos.shape[1]} columns make R = {rotated} rotated columns, which must be a multiple of 32 and "
             f"at most {name}'s last dimension ({d})")
    if d % 16:
        fail(f"{name}: its last dimension must be a multiple of 16, got {d}")
    if isinstance(offset, bool) or not isinstance(offset, numbers.Integral) or offset < 0:
        fail(f"offset must be a non-negative int, got {offset!r}")
    if positions is None and int(offset) + n > cos.shape[0]:
        fail(f"cos and sin have {cos.shape[0]} positions; {name}'s {n} from offset {offset} need {int(offset) + n}")
    return d, n, rotated, dtype, int(offset)


def _positions_arg(torch: Any, name: str, x: Any, positions: Any, offset: int) -> tuple[Any, int]:
    """The kernel's Positions tensor (1-D) and the stride between batches' rows of it (0: one row for all); without
    positions, a one-element tensor the kernel does not read."""
    if positions is None:
        return _no_positions(torch, x), 0
    batches, n = (x.shape[0] if x.dim() == 4 else 1), x.shape[-2]
    if not isinstance(positions, torch.Tensor) or str(positions.dtype) not in _INDEX_TYPES:
        fail(f"positions must be a torch.int32 or torch.int64 tensor, got "
             f"{positions.dtype if isinstance(positions, torch.Tensor) else type(positions).__name__}")
    check_tensor("positions", positions, positions.dtype, positions.dim())
    if positions.get_device() != x.get_device():
        fail(f"positions is on {positions.device}, {name} on {x.device}: all tensors must be on the same device")
    if positions.shape not in ((n,), (batches, n)) or (positions.dim() == 2 and x.dim() == 3):
        fail(f"positions: expected shape ({n},) or ({batches}, {n}) (a position for each of {name}'s {n} rows), got "
             f"{tuple(positions.shape)}")
    if offset:
        fail(f"offset ({offset}) and positions go apart: add the offset to the positions")
    if positions.dim() == 1:
        return positions, 0
    if n > 1 and positions.stride(1) != 1:
        fail(f"positions: its last dimension must be contiguous (stride 1), got strides {tuple(positions.stride())}")
    stride = positions.stride(0) if batches > 1 else 0
    return positions.as_strided(((batches - 1) * stride + n,), (1,)), stride


def _no_positions(torch: Any, x: Any) -> Any:
    """A one-element int32 tensor on x's device for the Positions of a launch without positions (not read)."""
    device = x.get_device()
    tensor = _NO_POSITIONS.get(device)
    if tensor is None:
        tensor = _NO_POSITIONS[device] = x.new_zeros(1, dtype=torch.int32)
    return tensor


_NO_POSITIONS: dict[int, Any] = {}
_INDEX_TYPES = {"torch.int32": i32, "torch.int64": i64}  # positions: the kernel's PT


# Each warp 16 positions of two heads; of one where R < D (its unrotated columns are copied too). On an H100
# (bench/probe_rotary.py, RESULTS "rotary probe — 2026-12-07"), fractions of the copy bandwidth from a graph: at
# 4×32×4096×128 two heads 0.965, one 0.952, three 0.948, eight warps 0.961; with R = 64 one head 0.952, two 0.935;
# at 16×16×2048×64 0.92–0.93 in every configuration.
CONFIG = {"WARPS": 4}


def heads_a_warp(d: int, rotated: int) -> int:
    return 2 if rotated == d else 1


def _specialized(d: int, rotated: int, target: str | None, dtype: Any, cos_dtype: Any, copy_rest: bool,
                 conjugate: bool, interleaved: bool, pair: bool = False, positions: Any = None) -> Any:
    """rotary_kernel for these sizes, dtypes and options (pair: q and k in one launch; positions: the positions
    tensor, None without one), made once."""
    positions_dtype = None if positions is None else positions.dtype
    key = (d, rotated, target, dtype, cos_dtype, copy_rest, bool(conjugate), bool(interleaved), pair, positions_dtype)
    spec = _SPECIALIZED.get(key)
    if spec is None:
        by_positions = {} if positions is None else {"POSITIONS": 1, "PT": _INDEX_TYPES[str(positions_dtype)]}
        spec = _SPECIALIZED[key] = rotary_kernel.specialize(
            D=d, R=rotated, CT=_TABLE_TYPES[str(cos_dtype)], COPY_REST=int(copy_rest and rotated < d),
            CONJUGATE=int(conjugate), INTERLEAVED=int(interleaved), PAIR=int(pair), HEADS=heads_a_warp(d, rotated),
            target=target, **CONFIG, **dtype_constant(dtype), **by_positions)
    return spec


_SPECIALIZED: dict[tuple, Any] = {}
_TABLE_TYPES = {"torch.float32": f32, "torch.bfloat16": bf16, "torch.float16": f16}  # cos and sin: the kernel's CT
