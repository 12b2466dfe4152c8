"""attention_sm90 with its output store skippable at run time (NO_STORE=1: stored only when first_row < -10^9,
never): what the epilogue's store costs per tile. Probe only."""
import math
import tkc
from tkc.lang import *  # noqa: F403


@tkc.kernel(warps="WARPS", stages="STAGES", pingpong="PINGPONG", overlap="OVERLAP", defer="DEFER", producer="PRODUCER",
            min_target="sm_90a")
def attention_probe(Q: gl[bf16, 4], K: gl[bf16, 4], V: gl[bf16, 4], O: gl[bf16, 4], L: gl[f32, 3], scale: float,
                   D: const = 128, CAUSAL: const = 0, KEYS: const = 64, WARPS: const = 8, LSE: const = 0,
                   STAGES: const = 3, PINGPONG: const = 0, OVERLAP: const = 0, DEFER: const = 0, PRODUCER: const = 0,
                   Q_REGS: const = 0, NO_STORE: const = 0):
    """attention_fwd on Hopper's wgmma. Its tiles are the B·H·cdiv(Nq, 16·WARPS) query blocks, those of a head
    next to each other (so that the blocks running at once share a few heads' K and V, read from L2, not HBM;
    causal takes them longest first within groups of 8 heads). Grid: (G,), any G ≥ 1: block i takes tiles i, i + G,
    i + 2G, ... (G = the number of tiles: one each; G = the blocks the GPU holds at once: persistent). Any Nq, Nk ≥ 1. With LSE, L (B, H, Nq) gets each row's log-sum-exp,
    ln Σ_j exp(scale · q·k_j), for the backward pass.

    The block's queries wait in shared memory; each warpgroup takes its 64 rows of them (a view) and each warp
    keeps the softmax state of its 16 rows. Per block of KEYS keys: S = Q·Kᵀ by wgmma from shared memory, the
    online softmax in registers (as attention_fwd), and O += P·V by wgmma with P straight from registers. Keys
    past Nk (in the last block) are masked; queries past Nq are computed and not stored. Causal keeps key j for
    query i when j ≤ i (torch's convention, also for Nq ≠ Nk); its query blocks end at the last row, the first one
    reaching before row 0 (those rows see no key: their NaN stays in them, and they are not stored). The first step's
    block holds key 0, which every real query sees, so m is finite from then on (no -inf - -inf in the correction).

    With Q_REGS each warp keeps its 16 rows of queries in registers (Q·Kᵀ then reads only K from shared memory).
    A block with several tiles gets a ring for the queries on the tile loop: the next tile's load while this one
    runs (one stage with Q_REGS). Scheduling is the compiler's: DEFER=1 runs each P·V
    in the next step under the softmax (`defer-wgmma`), DEFER=2 also runs step 0 before the key loop without its
    zero P·V (`peel-deferred-step`), DEFER=3 also reads the next tile's queries and starts its first Q·Kᵀ under
    this tile's epilogue (`rotate-tile-loop`, with Q_REGS), DEFER=4 all of its step 0, the softmax under this tile's
    last P·V, PRODUCER=1 adds a warpgroup that issues the TMA loads,
    PINGPONG=1 has the two warpgroups take turns at the tensor cores, OVERLAP=1 issues the next Q·Kᵀ before the
    softmax.
    """
    static_assert(D in (64, 128), f"head dim D must be 64 or 128, got {D}")
    static_assert(KEYS in (64, 128), f"KEYS (keys per step) must be 64 or 128, got {KEYS}")
    static_assert(DEFER or not Q_REGS, "Q_REGS=1 needs DEFER=1: with P·V running on into the next step, ptxas gives "
                  "P the registers of Q that the next Q·Kᵀ reads (wrong results)")
    BLOCK_ROWS = 16 * WARPS
    scale_log2 = scale * LOG2E
    key_blocks = cdiv(K.shape[2], KEYS)
    q_blocks, heads = cdiv(Q.shape[2], BLOCK_ROWS), Q.shape[1]
    # The grid's blocks take the tiles (query blocks, those of a head next to each other) in turn; the next tile's
    # queries load while this one runs.
    for tile in range(block_idx()[0], q_blocks * heads * Q.shape[0], num_blocks()[0]):
        blk, head = tile % q_blocks, tile // q_blocks
        if CAUSAL:  # the longest rows first (not last), over groups of 8 heads whose K and V stay in L2 together
            first_head = head // 8 * 8
            group = min(8, heads * Q.shape[0] - first_head)
            rank = tile - first_head * q_blocks              # within the group: longest blocks of all its heads first
            blk, head = q_blocks - 1 - rank // group, first_head + rank % group
        h, b = head % heads, head // heads
        # Causal: the query blocks end at the last row, so that the one left partly empty is the first, the
        # shortest (not the last, the longest: 1/18 of the work at N = 4096 in blocks of 192), in whole warp tiles
        first_row = blk * BLOCK_ROWS - ((q_blocks * BLOCK_ROWS - Q.shape[2]) // 16 * 16 if CAUSAL else 0)
        q_block = load(Q, (b, h, rows(first_row), 0), st[bf16, BLOCK_ROWS, D])
        if Q_REGS:  # each warp's 16 rows in registers: Q·Kᵀ then reads only K from shared memory
            q = load(q_block, (warp_id(), 0), rt[bf16, 16, D])
        else:
            q = load(q_block, (warpgroup_id(), 0), st[bf16, 64, D])
        q_tile = first_row // 16 + warp_id()                 # this warp's 16 rows, in tiles of 16
        m, l, o = neg_infty(rv[f32, 16]), zeros(rv[f32, 16]), zeros(rt[f32, 16, D])
        n_blocks = min(cdiv(first_row + BLOCK_ROWS, KEYS), key_blocks) if CAUSAL else key_blocks
        first_masked = max(first_row, 0) // KEYS
        for j in range(n_blocks):
            k_s, v_s = load(K, (b, h, j, 0), st[bf16, KEYS, D]), load(V, (b, h, j, 0), st[bf16, KEYS, D])
            s = mma_ABt(q, k_s, zeros(rt[f32, 16, KEYS]))
            if j == key_blocks - 1:
                s = keep_cols(s, K.shape[2] - j * KEYS)  # keys past the end (TMA read them as zeros)
            if CAUSAL:
                if j >= first_masked:
                    s = tril(s, q_tile * 16 - j * KEYS, -math.inf)
            m_new = max(m, row_max(s))
            correction = exp2((m - m_new) * scale_log2)
            l, o, m = l * correction, mul_row(o, correction), m_new
            p = exp2(sub_row(s * scale_log2, m * scale_log2))
            l = l + row_sum(p)
            o = mma_AB(p.to(bf16), v_s, o)
        if NO_STORE:
            if first_row < -1000000000:
                store(O, div_row(o, l).to(bf16), (b, h, q_tile, 0))
        else:
            store(O, div_row(o, l).to(bf16), (b, h, q_tile, 0))
        if LSE:
            store(L, m * scale + log(l), (b, h, q_tile))  # the p were taken against m: Σ exp = exp(scale·m) · l


