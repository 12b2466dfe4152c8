"""Grouped GEMM, a mixture of experts' core: the rows of x come in groups, group g (rows offsets[g - 1] ..
offsets[g], torch._grouped_mm's `offs`) multiplied by its own weight w[g]. With `rows`, the rows of x are gathered
first (row s of the product is x[rows[s]] · w[g]): the tokens routed to the experts need no permuted copy.

A block takes one BM-row tile of one group: it finds which by walking the groups' offsets (its tile number among
all groups' tiles), runs its K loop only if its tile lies in a group, and cuts its stores short at the group's end
(`rows(r, end)`), so a tile that runs past its group never writes the next group's rows.

Gradients: x's by the same kernels (w the other way round; with gathered rows each product row added back into x's
row, SCATTER), w's by grouped_gemm_wgrad_kernel (C[g] = A_gᵀ·B_g: K is the group's rows)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import tkc
from tkc.kernels._checks import cdiv as ceil_div  # `cdiv` is the DSL's, for kernels
from tkc.kernels._checks import check_tensor, dtype_constant, fail, wants_grad, wgmma_path
from tkc.kernels.gemm import grouped_tile
from tkc.lang import *  # noqa: F403

if TYPE_CHECKING:
    import torch


@tkc.func
def group_tile(Offsets, groups, tile, BM, LOADS=4):
    """Tile `tile` of the groups' tiles (each group's rows in tiles of BM, the groups one after another): (its group,
    its first row, its group's end), or (-1, 0, 0) past the last group's tiles. The offsets are read LOADS at a time
    (their loads overlap; past the tensor's end they read 0: no tiles)."""
    group, first, end, tiles_before, start = -1, 0, 0, 0, 0
    for g in range(0, groups, LOADS):
        stops = ()
        for u in range(LOADS):  # (issued together: their loads overlap)
            stops = stops + (Offsets[g + u],)
        for u in range(LOADS):
            tiles = cdiv(max(stops[u] - start, 0), BM)
            if tiles_before <= tile and tile < tiles_before + tiles:
                group, first, end = g + u, start + (tile - tiles_before) * BM, stops[u]
            tiles_before = tiles_before + tiles
            start = stops[u]
    return group, first, end


@tkc.func
def put_rows(Y, Rows, acc, first, end, col, SCATTER, DT):
    """The product's rows first .. end - 1 (a tile's, cut at its group's end) into Y's same rows, or with SCATTER
    added into Y's rows Rows[first ..] (f32: a gathered product's gradient, rows named twice summed)."""
    if SCATTER:
        atomic_add(Y, acc, (rows_at(Rows, first, end), col))
    else:
        store(Y, acc.to(DT), (rows(first, end), col))


@tkc.kernel(warps="WARPS", stages="STAGES", min_target="sm_80")
def grouped_gemm_kernel(X: gl["DT", 2], W: gl["DT", 3], Offsets: gl[i32, 1], Rows: gl["RT", 1], Y: gl["YT", 2],
                        GATHER: const = 0, SCATTER: const = 0, TRANS_B: const = 0, BM: const = 128, BN: const = 128,
                        BK: const = 64, WARPS: const = 4, WARPS_N: const = 2, STAGES: const = 2, DT: const = bf16,
                        RT: const = i32, YT: const = bf16):
    """Y's rows Offsets[g - 1] .. Offsets[g] = X's same rows (with GATHER, rows Rows[...]) · W[g] (K×N; with TRANS_B
    W[g] is N×K); with SCATTER the product's rows are added into Y's rows Rows[...] instead (Y f32). Grid:
    (cdiv(N, BN), cdiv(rows, BM) + groups): a block BN columns of a tile of a group (blocks past the last group's
    tiles do nothing; a tile's column blocks run one after another, so its rows of X come from memory once). Each
    step of K stages a BM×BK slice of X (gathered rows: cp.async) and a slice of W[g] in shared memory; the warps form
    a (WARPS / WARPS_N) × WARPS_N grid over the tile, as gemm_kernel."""
    WARPS_M = WARPS // WARPS_N
    WM, WN = BM // WARPS_M, BN // WARPS_N
    group, first, end = group_tile(Offsets, W.shape[0], block_idx()[1], BM)
    bn = block_idx()[0]
    wm, wn = warp_id() // WARPS_N, warp_id() % WARPS_N
    acc = zeros(rt[f32, WM, WN])
    for k in range(cdiv(X.shape[1], BK) * min(group + 1, 1)):  # no steps past the last group's tiles
        if GATHER:
            x_s = load(X, (rows_at(Rows, first), k), st[DT, BM, BK])
        else:
            x_s = load(X, (rows(first), k), st[DT, BM, BK])
        a = load(x_s, (wm, 0), rt[DT, WM, BK])
        if TRANS_B:
            acc = mma_ABt(a, load(load(W, (group, bn, k), st[DT, BN, BK]), (wn, 0), rt[DT, WN, BK]), acc)
        else:
            acc = mma_AB(a, load(load(W, (group, k, bn), st[DT, BK, BN]), (0, wn), rt[DT, BK, WN]), acc)
    put_rows(Y, Rows, acc, first + wm * WM, end, bn * WARPS_N + wn, SCATTER, YT)


@tkc.kernel(warps="WARPS", stages="STAGES", producer="PRODUCER", mixed_ring="MIXED", min_target="sm_90a")
def grouped_gemm_sm90_kernel(X: gl["DT", 2], W: gl["DT", 3], Offsets: gl[i32, 1], Rows: gl["RT", 1],
                             Y: gl["YT", 2], GATHER: const = 0, SCATTER: const = 0, TRANS_B: const = 0,
                             BN: const = 256, BK: const = 64, WARPS: const = 8, STAGES: const = 4, PRODUCER: const = 0,
                             LOADS: const = 4, GROUP_N: const = 1024, MIXED: const = 0, DT: const = bf16,
                             RT: const = i32, YT: const = bf16):
    """As grouped_gemm_kernel on Hopper's wgmma: a block of WARPS / 4 warpgroups takes a (16·WARPS)-row tile of a
    group, each warpgroup its 64 rows times all BN columns of W[g] (a TMA ring where X's rows are not gathered and the
    rows are 16-byte aligned, else cp.async; with MIXED=1 gathered rows by cp.async on W's TMA ring: not yet run on
    a GPU), each warp storing its 16 rows. Grid: up to the tiles' number
    ((cdiv(rows, 16·WARPS) + groups) · cdiv(N, BN)), taken in runs of GROUP_N column blocks: a run's blocks read a
    tile's rows of X from L2, and the run over the next tiles below reads the same columns of W[g] (gemm's
    grouped_tile, its roles swapped); fewer blocks than tiles: a persistent grid, the ring running on across them."""
    BM = 16 * WARPS
    tiles_n = cdiv(Y.shape[1], BN)
    slots = Rows.shape[0] if GATHER else X.shape[0]
    for tile in range(block_idx()[0], (cdiv(slots, BM) + W.shape[0]) * tiles_n, num_blocks()[0]):
        bn, tile_m = grouped_tile(tile, tiles_n, cdiv(slots, BM) + W.shape[0], GROUP_N)
        group, first, end = group_tile(Offsets, W.shape[0], tile_m, BM, LOADS)
        acc = zeros(rt[f32, 16, BN])
        for k in range(cdiv(X.shape[1], BK) * min(group + 1, 1)):  # no steps past the last group's tiles
            if GATHER:
                x_s = load(X, (rows_at(Rows, first), k), st[DT, BM, BK])
            else:
                x_s = load(X, (rows(first), k), st[DT, BM, BK])
            a = load(x_s, (warpgroup_id(), 0), st[DT, 64, BK])  # this warpgroup's rows
            if TRANS_B:
                acc = mma_ABt(a, load(W, (group, bn, k), st[DT, BN, BK]), acc)
            else:
                acc = mma_AB(a, load(W, (group, k, bn), st[DT, BK, BN]), acc)
        put_rows(Y, Rows, acc, first + 16 * warp_id(), end, bn, SCATTER, YT)


@tkc.kernel(warps=4, min_target="sm_80")
def cast_rows_kernel(S: gl[f32, 2], D: gl["DT", 2], DT: const = bf16):
    """D = S in D's dtype (a scattered gradient's f32 sums): block (i, j) its 64 rows × 64 columns, a warp 16 rows."""
    tile = (4 * block_idx()[0] + warp_id(), block_idx()[1])
    store(D, load(S, tile, rt[f32, 16, 64]), tile)


@tkc.func
def group_rows_slice(T, Rows, first, end, col, GATHER, BR, COLS, DT, CUT=1):
    """BR rows of T from `first` (with GATHER rows Rows[first ..]), rows before `end` only (the others zeros), × COLS
    columns from column tile `col`, into a shared tile (cut at an end: cp.async, not TMA). CUT=0 (rows not gathered):
    the whole slice, the next group's rows too (a TMA load: the other operand's zeros cancel them)."""
    if GATHER:
        return load(T, (rows_at(Rows, first, end), col), st[DT, BR, COLS])
    if CUT:
        return load(T, (rows(first, end), col), st[DT, BR, COLS])
    return load(T, (rows(first), col), st[DT, BR, COLS])


@tkc.kernel(warps="WARPS", stages="STAGES", min_target="sm_80")
def grouped_gemm_wgrad_kernel(A: gl["DT", 2], B: gl["DT", 2], Offsets: gl[i32, 1], Rows: gl["RT", 1],
                              C: gl["DT", 3], GATHER_A: const = 0, GATHER_B: const = 0, BM: const = 128,
                              BN: const = 128, BR: const = 32, WARPS: const = 4, WARPS_N: const = 2,
                              STAGES: const = 3, DT: const = bf16, RT: const = i32):
    """C[g] (M×N) = A's rows of group g, transposed, times B's (A is S×M, B is S×N; with GATHER_A / GATHER_B that
    operand's rows are Rows[...]): grouped_gemm's weight gradient, K the group's rows. Grid: (G, cdiv(M, BM) ·
    cdiv(N, BN)); each step of BR rows stages both slices in shared memory (a cp.async ring), cut at the group's end.
    (Whole slices in a TMA ring and the last rows after the loop was slower on an H100: the tail's synchronous copy
    and drained ring cost more than TMA saved; RESULTS "grouped_gemm's backward ... — 2026-12-07 15:58".)"""
    WARPS_M = WARPS // WARPS_N
    WM, WN = BM // WARPS_M, BN // WARPS_N
    g, tile = block_idx()[0], block_idx()[1]
    bm, bn = tile // cdiv(C.shape[2], BN), tile % cdiv(C.shape[2], BN)
    wm, wn = warp_id() // WARPS_N, warp_id() % WARPS_N
    start, end = Offsets[g - 1], Offsets[g]
    acc = zeros(rt[f32, WM, WN])
    for i in range(cdiv(max(end - start, 0), BR)):  # slices of the group's rows, cut at its end (zeros past it)
        a_s = group_rows_slice(A, Rows, start + i * BR, end, bm, GATHER_A, BR, BM, DT)
        b_s = group_rows_slice(B, Rows, start + i * BR, end, bn, GATHER_B, BR, BN, DT)
        acc = mma_AtB(load(a_s, (0, wm), rt[DT, BR, WM]), load(b_s, (0, wn), rt[DT, BR, WN]), acc)
    store(C, acc.to(DT), (g, bm * WARPS_M + wm, bn * WARPS_N + wn))


@tkc.kernel(warps="WARPS", stages="STAGES", mixed_ring="MIXED", min_target="sm_90a")
def grouped_gemm_wgrad_sm90_kernel(A: gl["DT", 2], B: gl["DT", 2], Offsets: gl[i32, 1], Rows: gl["RT", 1],
                                   C: gl["DT", 3], GATHER_A: const = 0, GATHER_B: const = 0, BN: const = 128,
                                   BR: const = 64, WARPS: const = 8, STAGES: const = 3, MIXED: const = 0,
                                   DT: const = bf16, RT: const = i32):
    """As grouped_gemm_wgrad_kernel on Hopper's wgmma: a block of WARPS / 4 warpgroups takes (16·WARPS) × BN of
    C[g], each warpgroup 64 of its rows (64 columns of A's slice, read transposed by the wgmma). Grid: up to the
    tiles' number (G · cdiv(M, 16·WARPS) · cdiv(N, BN), a group's tiles one after another); fewer blocks: a
    persistent grid, whose ring runs on across a block's tiles (a group's few steps of rows each). MIXED=1 (not yet
    run on a GPU): one operand's slices whole, by TMA (B's, or A's where B's rows are gathered), the other's cut at
    the group's end by cp.async on the same ring: the zeros past the end cancel the next group's rows (unless those
    hold infinities or NaNs, which would then reach this group's sums too)."""
    BM = 16 * WARPS
    tiles_m, tiles_n = cdiv(C.shape[1], BM), cdiv(C.shape[2], BN)
    for t in range(block_idx()[0], C.shape[0] * tiles_m * tiles_n, num_blocks()[0]):
        g, tile = t // (tiles_m * tiles_n), t % (tiles_m * tiles_n)
        bm, bn = tile // tiles_n, tile % tiles_n
        start, end = Offsets[g - 1], Offsets[g]
        acc = zeros(rt[f32, 16, BN])
        for i in range(cdiv(max(end - start, 0), BR)):  # slices of the group's rows, cut at its end (zeros past it)
            a_s = group_rows_slice(A, Rows, start + i * BR, end, bm, GATHER_A, BR, BM, DT, 1 - MIXED * GATHER_B)
            b_s = group_rows_slice(B, Rows, start + i * BR, end, bn, GATHER_B, BR, BN, DT, 1 - MIXED * (1 - GATHER_B))
            acc = mma_AtB(load(a_s, (0, warpgroup_id()), st[DT, BR, 64]), b_s, acc)
        store(C, acc.to(DT), (g, bm * WARPS + warp_id(), bn))


CONFIG = {"BM": 128, "BN": 128, "BK": 64, "WARPS": 4, "WARPS_N": 2, "STAGES": 2}  # gemm()'s sm_80 tiles
# 128×256 tiles, a 4-stage ring (bench/probe_grouped.py on an H100, RESULTS "grouped GEMM probe — 2026-12-07": BN=128
# 0.53–0.71× torch._grouped_mm, BN=256 0.77–0.97×, 0.65–0.75× gathered); a block a tile, in runs of 12 column
# blocks, offsets read 16 at a time (RESULTS "grouped_gemm's tile order — 2026-12-07": a tile's column blocks one
# after another 0.94–1.11× torch._grouped_mm on the H200, a column of tiles at a time 0.79–0.94× on an H100; a
# persistent grid, a producer warpgroup, 4 or 8 column blocks a run: within ±3 %)
CONFIG_SM90 = {"BN": 256, "BK": 64, "WARPS": 8, "STAGES": 4, "LOADS": 16, "GROUP_N": 12}


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, *, rows: torch.Tensor | None = None,
                 trans_b: bool = False, target: str | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """out[offsets[g - 1]:offsets[g]] = x[offsets[g - 1]:offsets[g]] · w[g] for each group g (offsets[-1] read as 0),
    as torch._grouped_mm(x, w, offs=offsets): x (S×K) bf16 (or f16), w (G×K×N), or (G×N×K) with trans_b (a linear
    layer's weights), offsets (G,) int32, non-decreasing, the last at most S; rows past the last offset are left
    as they are. With `rows` ((S,) int32 or int64): row s of the product is x[rows[s]] · w[g] (x then any number of
    rows; entries outside x give zero rows), so tokens routed to experts are multiplied without a permuted copy.
    On Hopper (or target="sm_90a") the wgmma kernel, elsewhere (or target="sm_80") the mma.sync kernel."""
    import torch

    if torch.compiler.is_compiling() or wants_grad(torch, x, w):  # one op of the graph / of autograd
        from tkc.kernels import torch_ops

        y = torch_ops.grouped_gemm(x, w, offsets, rows, bool(trans_b), target)
        return y if out is None else out.copy_(y)

    dtype = torch.float16 if getattr(x, "dtype", None) is torch.float16 else torch.bfloat16  # else: its error
    check_tensor("x", x, dtype, 2)
    check_tensor("w", w, dtype, 3)
    check_tensor("offsets", offsets, torch.int32, 1)
    groups = w.shape[0]
    n, k = (w.shape[1], w.shape[2]) if trans_b else (w.shape[2], w.shape[1])
    if x.shape[1] != k:
        fail(f"w: x is {tuple(x.shape)}, so w must be (G, {'N, ' if trans_b else ''}{k}{'' if trans_b else ', N'})"
             f"{' (trans_b=True)' if trans_b else ''}, got {tuple(w.shape)}")
    if offsets.shape[0] != groups:
        fail(f"offsets: one end offset a group: w has {groups} groups, offsets {offsets.shape[0]} entries")
    slots = x.shape[0]
    if rows is not None:
        _check_rows(rows)
        slots = rows.shape[0]
    for name, tensor in (("w", w), ("offsets", offsets), ("rows", rows), ("out", out)):
        if tensor is not None and tensor.device != x.device:
            fail(f"{name} is on {tensor.device} but x is on {x.device}")
    if out is None:
        out = x.new_empty((slots, n))
    else:
        check_tensor("out", out, dtype, 2)
        if tuple(out.shape) != (slots, n):
            fail(f"out: expected shape ({slots}, {n}), got {tuple(out.shape)}")
    if slots == 0 or n == 0 or groups == 0:
        return out
    index = rows if rows is not None else offsets  # (not read without GATHER)
    _launch_product(x, w, offsets, index, out, slots, {"GATHER": int(rows is not None), "TRANS_B": int(trans_b),
                                                       **({"YT": f16} if dtype is torch.float16 else {})}, target)
    return out


def _launch_product(x: Any, w: Any, offsets: Any, index: Any, out: Any, slots: int, constants: dict[str, Any],
                    target: str | None) -> None:
    """grouped_gemm_kernel or its wgmma kernel over `slots` rows of products into `out` (checked arguments)."""
    spec, bm, bn, hopper = _specialized(grouped_gemm_sm90_kernel, CONFIG_SM90, grouped_gemm_kernel, CONFIG, x, index,
                                        constants, target)
    tiles_m, tiles_n = ceil_div(slots, bm) + w.shape[0], ceil_div(out.shape[1], bn)
    spec.launch((tiles_m * tiles_n, 1, 1) if hopper else (tiles_n, tiles_m, 1), (x, w, offsets, index, out))


def _specialized(hopper: Any, hopper_config: dict[str, int], sm80: Any, sm80_config: dict[str, int], x: Any,
                 index: Any, constants: dict[str, Any], target: str | None) -> tuple[Any, int, int, bool]:
    """The Hopper kernel (by default on an sm_90 GPU, or with target="sm_90a") or the sm_80 one, specialized to x's
    dtype and the index tensor's, its tile's rows and columns, and whether it is the Hopper one."""
    import torch

    constants = {**constants, "RT": i64 if index.dtype == torch.int64 else i32, **dtype_constant(x.dtype)}
    if wgmma_path(x.get_device(), target):
        return (hopper.specialize(target="sm_90a", **constants, **hopper_config), 16 * hopper_config["WARPS"],
                hopper_config["BN"], True)
    return sm80.specialize(target=target, **constants, **sm80_config), sm80_config["BM"], sm80_config["BN"], False


def _check_rows(rows: Any) -> None:
    """`rows`: a CUDA tensor (N,) of int32 or int64 row numbers."""
    import torch

    if not isinstance(rows, torch.Tensor) or rows.dtype not in (torch.int32, torch.int64):
        fail(f"rows: an int32 or int64 tensor of x's row numbers, got "
             f"{rows.dtype if isinstance(rows, torch.Tensor) else type(rows).__name__}")
    check_tensor("rows", rows, rows.dtype, 1)


def grouped_gemm_dx(dy: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, rows: torch.Tensor, x_rows: int, *,
                    trans_b: bool = False, target: str | None = None) -> torch.Tensor:
    """The gradient of grouped_gemm's x where its rows were gathered: dx[rows[s]] += dy[s] · w[g]ᵀ (· w[g] with
    trans_b) for each product row s of group g — a grouped product whose rows are added into x's (atomic adds in f32,
    rows gathered twice summed), then cast to dy's dtype. dx has x_rows rows (x's); entries of rows outside it add
    nothing."""
    import torch

    dtype = torch.float16 if getattr(dy, "dtype", None) is torch.float16 else torch.bfloat16  # else: its error
    check_tensor("dy", dy, dtype, 2)
    check_tensor("w", w, dtype, 3)
    check_tensor("offsets", offsets, torch.int32, 1)
    _check_rows(rows)
    k = w.shape[2] if trans_b else w.shape[1]
    if dy.shape[0] != rows.shape[0] or dy.shape[1] != (w.shape[1] if trans_b else w.shape[2]):
        fail(f"dy: expected ({rows.shape[0]}, {w.shape[1] if trans_b else w.shape[2]}), got {tuple(dy.shape)}")
    sums = torch.zeros((x_rows, k), device=dy.device, dtype=torch.float32)
    dx = dy.new_empty((x_rows, k))
    if x_rows == 0 or k == 0:
        return dx
    if dy.shape[0] and w.shape[0]:
        _launch_product(dy, w, offsets, rows, sums, dy.shape[0],
                        {"GATHER": 0, "SCATTER": 1, "TRANS_B": int(not trans_b), "YT": f32}, target)
    cast_rows_kernel.specialize(target=target, **dtype_constant(dtype)).launch(
        (ceil_div(x_rows, 64), ceil_div(k, 64), 1), (sums, dx))
    return dx


CONFIG_WGRAD = {"BM": 128, "BN": 128, "BR": 32, "WARPS": 4, "WARPS_N": 2, "STAGES": 3}
# (H200, RESULTS "grouped_gemm's tile order — 2026-12-07": BN=256 0.81–0.89× torch._grouped_mm, BN=128
# 0.72–0.89×; a persistent grid within ±2 %, 4 stages slower)
CONFIG_WGRAD_SM90 = {"BN": 256, "BR": 64, "WARPS": 8, "STAGES": 3}


def grouped_gemm_wgrad(x: torch.Tensor, dy: torch.Tensor, offsets: torch.Tensor, *, rows: torch.Tensor | None = None,
                       trans_b: bool = False, target: str | None = None) -> torch.Tensor:
    """The gradient of grouped_gemm's w: dw[g] = x_gᵀ · dy_g (G×K×N), or its transpose dy_gᵀ · x_g with trans_b
    (G×N×K), x_g the rows of group g (with `rows`, x's rows rows[...]): a GEMM whose K is each group's rows."""
    import torch

    dtype = torch.float16 if getattr(x, "dtype", None) is torch.float16 else torch.bfloat16  # else: its error
    check_tensor("x", x, dtype, 2)
    check_tensor("dy", dy, dtype, 2)
    check_tensor("offsets", offsets, torch.int32, 1)
    if rows is not None:
        _check_rows(rows)
    slots = dy.shape[0]
    if rows is None and x.shape[0] != slots or rows is not None and rows.shape[0] != slots:
        fail(f"dy: one row a row of the product: {slots} rows, but {'rows has' if rows is not None else 'x has'} "
             f"{(rows if rows is not None else x).shape[0]}")
    groups, k, n = offsets.shape[0], x.shape[1], dy.shape[1]
    out = x.new_empty((groups, n, k) if trans_b else (groups, k, n))
    if groups == 0 or k == 0 or n == 0:
        return out
    index = rows if rows is not None else offsets  # (not read without a gather)
    a, b = (dy, x) if trans_b else (x, dy)
    gathered = {"GATHER_A": int(rows is not None and not trans_b), "GATHER_B": int(rows is not None and trans_b)}
    spec, bm, bn, hopper = _specialized(grouped_gemm_wgrad_sm90_kernel, CONFIG_WGRAD_SM90, grouped_gemm_wgrad_kernel,
                                        CONFIG_WGRAD, x, index, gathered, target)
    tiles = ceil_div(out.shape[1], bm) * ceil_div(out.shape[2], bn)
    spec.launch((groups * tiles, 1, 1) if hopper else (groups, tiles, 1), (a, b, offsets, index, out))
    return out
