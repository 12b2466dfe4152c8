"""Each kernel once, at shapes whose loops run more iterations than the pipeline has stages, for
compute-sanitizer (memcheck, racecheck, synccheck):

    compute-sanitizer --tool racecheck --error-exitcode 1 python3 tests/gpu/sanitize.py
"""

from __future__ import annotations

import importlib

import torch

from tkc.kernels import attention, attention_kvcache, gemm, layernorm, rmsnorm
from tkc.kernels.attention import LONG_KEYS, launch_sm90, sm90_config


def norms_backward() -> None:
    """layernorm_backward in both layouts, each warp or block over 2-3 rows (the next row's loads ahead): 2500 rows
    of 1024 a row a warp (8 warps a block over rows of their own, their partial sums added in shared memory), 600
    rows of 4096 over 4 warps each (the row sums exchanged through shared memory); LayerNorm and RMSNorm, sm_90a
    and sm_80 builds."""
    from tkc.kernels.layernorm_bwd import layernorm_backward

    bf = torch.bfloat16
    for rows, d in ((2500, 1024), (600, 4096)):
        x = torch.randn(rows, d, device="cuda", dtype=bf)
        w = torch.randn(d, device="cuda", dtype=bf)
        layernorm_backward(x, x, x, w, 1e-5)
        layernorm_backward(x, x, None, w, 1e-6, rms=True, target="sm_80")


def few_rows_in_clusters() -> None:
    """The one-launch few-rows kernels (FEW_ROWS_IN_CLUSTERS, whatever its default): blocks of a cluster reading
    each other's shared memory; 36 steps of K in 4 runs (a cluster of 4) and 3 runs, against 5 stages."""
    import importlib

    from tkc.kernels import scaled_mm

    gemm_module, scaled_mm_module = (importlib.import_module(f"tkc.kernels.{name}") for name in ("gemm", "scaled_mm"))
    saved = (gemm_module.FEW_ROWS_IN_CLUSTERS, gemm_module.FEW_ROWS_LAST_BLOCK, gemm_module._PLANS,
             scaled_mm_module._PLANS)
    gemm_module.FEW_ROWS_IN_CLUSTERS, gemm_module.FEW_ROWS_LAST_BLOCK, gemm_module._PLANS, scaled_mm_module._PLANS = (
        True, False, {}, {})
    bf = torch.bfloat16
    try:
        gemm(torch.randn(16, 4608, device="cuda", dtype=bf), torch.randn(4608, 2000, device="cuda", dtype=bf))
        gemm(torch.randn(24, 4608, device="cuda", dtype=bf), torch.randn(5000, 4608, device="cuda", dtype=bf),
             trans_b=True)
        x8, w8 = (torch.randn(*s, device="cuda").to(torch.float8_e4m3fn) for s in ((16, 4608), (2000, 4608)))
        scaled_mm(x8, w8.t(), torch.rand(16, 1, device="cuda"), torch.rand(1, 2000, device="cuda"))
    finally:
        (gemm_module.FEW_ROWS_IN_CLUSTERS, gemm_module.FEW_ROWS_LAST_BLOCK, gemm_module._PLANS,
         scaled_mm_module._PLANS) = saved


def grouped_query_attention() -> None:
    """Four query heads a K/V head, forward and backward, both paths: dK and dV's one loop runs over 4 heads × 8
    query steps against 3 stages."""
    for target in ("sm_80", None):
        for causal in (False, True):
            q = torch.randn(1, 8, 512, 64, device="cuda", dtype=torch.bfloat16).requires_grad_()
            k, v = (torch.randn(1, 2, 512, 64, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(2))
            out = attention(q, k, v, causal=causal, target=target)
            torch.autograd.grad(out, (q, k, v), torch.randn_like(out))


def decode_attention() -> None:
    """A query a head, 4 heads a K/V head, 3000 keys split into parts of several key steps against 3 stages (the
    sm_80 build, its last part weighing and then the two kernels, and this GPU's: on Hopper a K/V head's 6 parts a
    cluster, reading each other's shared memory, then the two kernels), the last step past the keys' end; then 16
    parts a K/V head (clusters of 16 on Hopper); attention_kvcache over lengths and over pages."""
    attention_module = importlib.import_module("tkc.kernels.attention")  # (tkc.kernels.attention: the function)
    decode_module = importlib.import_module("tkc.kernels.attention_decode")
    attention_module.DECODE_ON_HOPPER = True
    q = torch.randn(2, 8, 1, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 3000, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for target, in_clusters, last_block in (("sm_80", False, "eager"), ("sm_80", False, False), (None, True, "eager"),
                                            (None, False, "eager")):
        decode_module.DECODE_IN_CLUSTERS, decode_module.DECODE_LAST_BLOCK_SM80 = in_clusters, last_block
        decode_module._PLANS = {}
        attention(q, k, v, target=target, return_lse=True)
        attention(q[..., :64].contiguous(), k[..., :64].contiguous(), v[..., :64].contiguous(), target=target)
        # attention_kvcache: a batch of no keys, one past the cache's 3000 (read as 3000); and in pages of 256 keys
        # (12 a batch, the pool's 30 in another order), a table naming pages past the pool's end too (reads zeros)
        lengths = torch.tensor([0, 3050], device="cuda", dtype=torch.int32)
        attention_kvcache(q, k, v, lengths, target=target, return_lse=True)
        pool = torch.randn(30, 2, 256, 128, device="cuda", dtype=torch.bfloat16)
        table = torch.randperm(30, device="cuda")[:24].view(2, 12).to(torch.int32)
        table[1, -1] = 40
        attention_kvcache(q, pool, pool, lengths, block_table=table, target=target, return_lse=True)
    # B = 1 over 16384 keys: 16 parts a row tile, on Hopper clusters of 16 blocks where the GPU holds them all
    decode_module.DECODE_IN_CLUSTERS, decode_module._PLANS = True, {}
    k, v = (torch.randn(1, 8, 16384, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    attention(torch.randn(1, 8, 1, 128, device="cuda", dtype=torch.bfloat16), k, v, return_lse=True)
    attention_kvcache(torch.randn(1, 8, 1, 128, device="cuda", dtype=torch.bfloat16), k, v,
                      torch.tensor([5000], device="cuda", dtype=torch.int32))
    attention_module.DECODE_ON_HOPPER, decode_module.DECODE_IN_CLUSTERS, decode_module._PLANS = False, True, {}


def last_block() -> None:
    """arrive_last: tests/kernels/last_block_sum.py over 300 blocks (sm_80 and this GPU's build), and decoding in one
    launch whose last part of each row tile weighs the parts (DECODE_LAST_BLOCK and DECODE_LAST_BLOCK_SM80, clusters
    off), both paths, and on Hopper gemm() and scaled_mm() of 16 rows whose last run of K of each block column sums
    the runs (FEW_ROWS_LAST_BLOCK)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kernels.last_block_sum import last_block_sum

    counter = torch.zeros(1, device="cuda", dtype=torch.int32)
    for target in ("sm_80", None):
        x = torch.randn(32 * 300, 64, device="cuda")
        last_block_sum[(300,)](x, torch.empty_like(x), torch.empty(32, 64, device="cuda"), counter, target=target)
    attention_module = importlib.import_module("tkc.kernels.attention")
    decode_module = importlib.import_module("tkc.kernels.attention_decode")
    attention_module.DECODE_ON_HOPPER = True
    decode_module.DECODE_LAST_BLOCK, decode_module.DECODE_IN_CLUSTERS, decode_module._PLANS = True, False, {}
    decode_module.DECODE_LAST_BLOCK_SM80 = True
    q = torch.randn(2, 8, 1, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 3000, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for target in ("sm_80", None):
        attention(q, k, v, target=target, return_lse=True)
    attention_module.DECODE_ON_HOPPER = False
    decode_module.DECODE_LAST_BLOCK, decode_module.DECODE_IN_CLUSTERS, decode_module._PLANS = False, True, {}
    decode_module.DECODE_LAST_BLOCK_SM80 = "eager"
    if torch.cuda.get_device_capability() == (9, 0):  # gemm()'s few rows, the last run of a block column summing
        from tkc.kernels import scaled_mm

        gemm_module = importlib.import_module("tkc.kernels.gemm")
        saved = gemm_module.FEW_ROWS_LAST_BLOCK
        gemm_module.FEW_ROWS_LAST_BLOCK, gemm_module._PLANS = True, {}
        a = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
        for trans_b in (False, True):
            gemm(a, torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16), trans_b=trans_b)
        x8, w8 = (torch.randn(*s, device="cuda").to(torch.float8_e4m3fn) for s in ((16, 4608), (2000, 4608)))
        scaled_mm(x8, w8.t(), torch.rand(16, 1, device="cuda"), torch.rand(1, 2000, device="cuda"))
        gemm_module.FEW_ROWS_LAST_BLOCK, gemm_module._PLANS = saved, {}


def head_dim_96() -> None:
    """D = 96 (three 64-byte swizzled panels a row): attention() and its backward, causal and not, 1024 keys in
    8 steps of 128 against 2 stages (the wgmma kernels on Hopper), 16 query steps of dK/dV against 3."""
    for causal in (False, True):
        q, k, v = (torch.randn(1, 4, 1024, 96, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
        out = attention(q, k, v, causal=causal)
        torch.autograd.grad(out, (q, k, v), torch.randn_like(out))


def head_dim_256() -> None:
    """D = 256 (four 128-byte swizzled panels a row): attention() causal and not, 1000 keys in 13 steps of 80 / 16
    of 64 against 2 stages, K and V in rings apart, on Hopper's persistent grid (each block several tiles) and two
    query blocks a block, and its backward (dK and dV in halves, one warpgroup Sᵀ and the other dPᵀ: 16 query steps
    of 64 against 2 stages, a lean producer warpgroup; dQ 16 key steps of 64 against 2, a producer, K and V in rings
    apart); then the sm_80 forward and backward (16-query / 16-key steps against their stages, dK, dV and dQ in halves), and those as on a card of 99 KB (the forward and dK/dV in two
    stages)."""
    from tkc.kernels import _checks

    for causal in (False, True):
        for n, target, small_card in ((1000, None, 0), (960, "sm_80", 0), (960, "sm_80", 1)):
            if small_card:
                _checks.SHARED_MEMORY_LIMITS[torch.cuda.current_device()] = 101376
            q, k, v = (torch.randn(2, 4, n, 256, device="cuda", dtype=torch.bfloat16).requires_grad_()
                       for _ in range(3))
            out = attention(q, k, v, causal=causal, target=target)
            torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
            _checks.SHARED_MEMORY_LIMITS.clear()


def deferred_dkdv() -> None:
    """attention_bwd_dkdv_sm90 with DEFER=1 (dV and dK products run into the next step): D = 256 in halves (32-query
    steps against 3 stages; 48-query ones against 2, the last ragged), D = 128 (32-query steps against 3) and D = 64
    (64-query steps against 3), 1000 queries, causal and not; each with attention_bwd_dq_sm90 at DEFER=1 and
    attention_backward's other constants (16 key steps of 64 against 2-3 stages)."""
    from tkc.kernels.attention_bwd import CONFIG_SM90, attention_bwd_dkdv_sm90, attention_bwd_dq_sm90, dkdv_blocks

    n = 1000
    for d, constants in ((256, {"WARPS": 8, "HALVES": 1, "QUERIES": 32, "STAGES": 3, "PRODUCER": 1}),
                         (256, {"WARPS": 8, "HALVES": 1, "QUERIES": 48, "STAGES": 2, "PRODUCER": 2,
                                "EXCHANGE_BUFFERS": 1}),
                         (128, {"WARPS": 8, "QUERIES": 32, "STAGES": 3}), (64, {"WARPS": 4, "STAGES": 3, "BLOCKS": 2})):
        cfg = {**constants, "DEFER": 1, "RAGGED": int(n % constants.get("QUERIES", 64) > 0)}
        q, k, v, grad = (torch.randn(1, 2, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        lse, delta = torch.randn(1, 2, n, device="cuda"), torch.randn(1, 2, n, device="cuda")
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        dq_cfg = {**CONFIG_SM90[d][1], "DEFER": 1}
        dq_cfg["RAGGED"] = int(n % dq_cfg.get("KEYS", 64) > 0)
        dq = torch.empty_like(q)
        for causal in (0, 1):
            attention_bwd_dkdv_sm90[(dkdv_blocks(n, d, cfg), 2, 1)](q, k, v, grad, lse, delta, dk, dv, d**-0.5, D=d,
                                                                    CAUSAL=causal, **cfg)
            attention_bwd_dq_sm90[(-(-n // (16 * dq_cfg.get("WARPS", 8))), 2, 1)](q, k, v, grad, lse, delta, dq,
                                                                                 d**-0.5, D=d, CAUSAL=causal, **dq_cfg)


def rotary_embedding() -> None:
    """rotary(): ragged positions and heads (the last blocks run past both), a (B, N, H, D) view, partial rotary
    copying the rest, in place, positions gathered by a positions tensor, both builds."""
    from tkc.kernels import rotary

    x = torch.randn(2, 37, 5, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    cos, sin = torch.rand(50, 32, device="cuda"), torch.rand(50, 32, device="cuda")
    rotary(x, cos, sin, offset=9)
    rotary(x, cos, sin, offset=13, target="sm_80")
    rotary(x, cos, sin, out=x)
    rotary(x, cos, sin, offset=5, interleaved=True)  # the pairs: rotate_pairs and the tables' repeated columns
    rotary(x, cos, sin, interleaved=True, target="sm_80")
    from tkc.kernels import rotary_qk  # q and k (fewer heads) in one launch: the blocks past q's heads take k's

    rotary_qk(x, x[:, :3], cos, sin, offset=2)
    # positions (some outside the tables, read as zeros; int64 ones past 2**32 too): (N,) and (B, N) of wider rows
    positions = torch.randint(-5, 60, (37,), device="cuda")
    positions[0] = (1 << 32) + 1
    rotary(x, cos, sin, positions=positions)
    rotary(x, cos, sin, positions=torch.randint(0, 50, (2, 40), device="cuda", dtype=torch.int32)[:, :37],
           interleaved=True, target="sm_80")


def rows_by_row_numbers() -> None:
    """rows_at: rows gathered, added and stored by row numbers (int64 ones past the tensor, int32 negative ones;
    the last warp's entries past the index tensors' end), both builds."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kernels.routed_rows import routed_rows

    x = torch.randn(500, 128, device="cuda", dtype=torch.bfloat16)
    src = torch.randint(0, 520, (300,), device="cuda")
    dst = torch.randint(-3, 200, (300,), device="cuda", dtype=torch.int32)
    y, z = torch.zeros(200, 128, device="cuda"), torch.empty(300, 128, device="cuda", dtype=torch.bfloat16)
    for target in ("sm_80", None):
        routed_rows[(5,)](x, src, dst, y, z, target=target)


def grouped_products() -> None:
    """grouped_gemm: 5 groups (one empty, one of a single row, the last tile of each cut short), rows past the last
    offset untouched, 12 steps of K against the stages; rows gathered (some outside x) or not, both builds."""
    from tkc.kernels.grouped_gemm import grouped_gemm, grouped_gemm_dx, grouped_gemm_wgrad

    x = torch.randn(700, 768, device="cuda", dtype=torch.bfloat16)
    offsets = torch.tensor([130, 130, 131, 400, 650], device="cuda", dtype=torch.int32)
    rows = torch.randint(-2, 705, (690,), device="cuda", dtype=torch.int32)
    for trans_b in (False, True):
        w = torch.randn(5, *((200, 768) if trans_b else (768, 200)), device="cuda", dtype=torch.bfloat16)
        for target in ("sm_80", None):
            grouped_gemm(x, w, offsets, trans_b=trans_b, target=target)
            grouped_gemm(x, w, offsets, rows=rows, trans_b=trans_b, target=target)
            dy = torch.randn(690, 200, device="cuda", dtype=torch.bfloat16)  # the weights' gradient: up to 9 slices of a group
            grouped_gemm_wgrad(x[:690], dy, offsets, trans_b=trans_b, target=target)
            grouped_gemm_wgrad(x, dy, offsets, rows=rows, trans_b=trans_b, target=target)
            grouped_gemm_dx(dy, w, offsets, rows, 700, trans_b=trans_b, target=target)  # scattered into x's rows
        if torch.cuda.get_device_capability() == (9, 0):  # gathered rows on W's TMA ring (mixed_ring=1)
            from tkc.kernels.grouped_gemm import CONFIG_SM90, grouped_gemm_sm90_kernel

            spec = grouped_gemm_sm90_kernel.specialize(target="sm_90a", **{**CONFIG_SM90, "GATHER": 1, "MIXED": 1,
                                                                             "TRANS_B": int(trans_b)})
            spec.launch(((-(-690 // 128) + 5) * 1, 1, 1), (x, w, offsets, rows, torch.empty(690, 200, device="cuda",
                                                                                             dtype=torch.bfloat16)))
            from tkc.kernels.grouped_gemm import CONFIG_WGRAD_SM90, grouped_gemm_wgrad_sm90_kernel

            for gathered in ({}, {"GATHER_A": 1}, {"GATHER_B": 1}):  # the weights' gradient, one side by TMA
                spec = grouped_gemm_wgrad_sm90_kernel.specialize(target="sm_90a", **{**CONFIG_WGRAD_SM90, "MIXED": 1,
                                                                                      **gathered})
                out = torch.empty(5, 768, 200, device="cuda", dtype=torch.bfloat16)
                spec.launch((5 * 6 * 1, 1, 1), (x[:690], dy, offsets, rows, out))


def packed_sequences() -> None:
    """attention_varlen: 5 sequences (one empty, one of a single row, one of 700 rows: 6 key steps of 128 or 11 of
    64 against 3 stages), rows past the last untouched, causal or not, grouped-query heads, keys of other lengths;
    both builds; and its backward through out and lse."""
    from tkc.kernels.attention_varlen import attention_varlen

    cu = torch.tensor([0, 300, 300, 301, 1001, 1040], device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0, 10, 10, 510, 1210, 1300], device="cuda", dtype=torch.int32)
    for d in (64, 128):
        q = torch.randn(1100, 8, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1300, 2, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        for causal in (False, True):
            for target in ("sm_80", *(["sm_90a"] if torch.cuda.get_device_capability() == (9, 0) else [])):
                attention_varlen(q[:1040], k[:1040], v[:1040], cu, causal=causal, target=target)
                attention_varlen(q, k, v, cu, cu_seqlens_k=cu_k, causal=causal, target=target, return_lse=True)
                # the backward: 700 queries of a sequence against its 700 keys (11+ steps against 3 stages)
                qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                out, lse = attention_varlen(qg, kg, vg, cu, cu_seqlens_k=cu_k, causal=causal, return_lse=True,
                                            target=target)
                torch.autograd.grad((out, lse), (qg, kg, vg), (torch.randn_like(out), torch.randn_like(lse)))


def main() -> None:
    torch.manual_seed(0)
    bf = torch.bfloat16
    a, b = torch.randn(256, 512, device="cuda", dtype=bf), torch.randn(512, 192, device="cuda", dtype=bf)
    gemm(a, b, target="sm_80")  # 16 steps of K against 3 stages; 2×2 blocks
    gemm(torch.randn(130, 70, device="cuda", dtype=bf), torch.randn(70, 66, device="cuda", dtype=bf), target="sm_80")
    if torch.cuda.get_device_capability() == (9, 0):  # the wgmma kernel: 8 steps of K against 3 stages
        gemm(torch.randn(128, 512, device="cuda", dtype=bf), torch.randn(512, 512, device="cuda", dtype=bf))
        gemm(torch.randn(128, 512, device="cuda", dtype=bf), torch.randn(256, 512, device="cuda", dtype=bf), trans_b=True)
        gemm(torch.randn(130, 70, device="cuda", dtype=bf), torch.randn(70, 66, device="cuda", dtype=bf))  # cp.async ring
        # a few rows, a long K: the operands' roles swapped (B read transposed without trans_b), K split into 4
        # runs of 9 steps against 5 stages (rotated), then their sum
        x = torch.randn(16, 4608, device="cuda", dtype=bf)
        gemm(x, torch.randn(4608, 2000, device="cuda", dtype=bf))
        gemm(x, torch.randn(2000, 4608, device="cuda", dtype=bf), trans_b=True)
        few_rows_in_clusters()  # the same in one launch: each block column's 4 runs a cluster summing in DSMEM
        from tkc.kernels import gemm_sm90_kernel  # 2 blocks walking 8 tiles each: the ring runs on across tiles

        from tkc.kernels import scaled_mm  # fp8: 6 steps of K against 3 stages, per-tensor and rowwise scales

        a8, w8 = (torch.randn(*s, device="cuda").to(torch.float8_e4m3fn) for s in ((300, 768), (520, 768)))
        scaled_mm(a8, w8.t(), torch.ones((), device="cuda"), torch.ones((), device="cuda"))
        scaled_mm(a8, w8.t(), torch.rand(300, 1, device="cuda"), torch.rand(1, 520, device="cuda"))
        scaled_mm(a8[:, 4:740], w8[:, 4:740].t(), torch.rand(300, 1, device="cuda"), torch.rand(1, 520, device="cuda"))
        x8, v8 = (torch.randn(*s, device="cuda").to(torch.float8_e4m3fn) for s in ((16, 4608), (2000, 4608)))
        scaled_mm(x8, v8.t(), torch.rand(16, 1, device="cuda"), torch.rand(1, 2000, device="cuda"))  # few rows: 4 runs
        a, b, c = (torch.randn(*s, device="cuda", dtype=bf) for s in ((512, 512), (512, 1024), (512, 1024)))
        for producer, tma_store in ((0, 0), (1, 0), (0, 1), (1, 1)):
            gemm_sm90_kernel[(2,)](a, b, c, BN=256, BK=64, WARPS=8, STAGES=3, PRODUCER=producer, TMA_STORE=tma_store,
                                   target="sm_90a")
            # one cluster of two blocks walking 4 stacks of 2 tiles, B multicast (each block copies half into both)
            gemm_sm90_kernel[(2,)](a, b, c, BN=256, BK=64, WARPS=8, STAGES=3, PRODUCER=producer, TMA_STORE=tma_store,
                                   CLUSTER=2, target="sm_90a")
            # one cluster of 2×2 tiles walking 4 stacks: A multicast to each row of tiles, B to each column
            gemm_sm90_kernel[(4,)](a, b, c, BN=256, BK=64, WARPS=8, STAGES=3, PRODUCER=producer, TMA_STORE=tma_store,
                                   CLUSTER=4, CLUSTER_N=2, target="sm_90a")
    for causal in (False, True):
        for d in (64, 128):
            q, k, v = (torch.randn(1, 2, 512, d, device="cuda", dtype=bf) for _ in range(3))
            attention(q, k, v, causal=causal, target="sm_80")  # 8 key blocks
            if torch.cuda.get_device_capability() == (9, 0):  # attention_sm90: 9 key blocks of 64 or 5 of 128
                q, k, v = (torch.randn(2, 2, n, d, device="cuda", dtype=bf) for n in (600, 550, 550))
                attention(q, k, v, causal=causal, return_lse=True)
                long = sm90_config(d, 600, LONG_KEYS, causal)
                tiled = {**sm90_config(d, 600, 1, causal), "TILES": 2, **({"Q_REGS": 1} if d == 128 else {})}
                pingpong = {"KEYS": 128, "WARPS": 8, "DEFER": 1, "PRODUCER": 1, "Q_REGS": 1, "PINGPONG": 1}
                rotated = {"KEYS": 128, "WARPS": 8, "DEFER": 3, "PRODUCER": 1, "Q_REGS": 1, "TILES": 2}
                overlapped = {"KEYS": 64, "WARPS": 8, "DEFER": 1, "OVERLAP": 1, "PRODUCER": 1, "Q_REGS": 1, "TILES": 2}
                for cfg in (long, tiled, {**long, "PERSISTENT": 1, "DEFER": 2}, rotated, {**rotated, "DEFER": 4},
                            overlapped, *([pingpong] if d == 128 else [])):
                    out, lse = torch.empty_like(q), torch.empty(2, 2, 600, device="cuda")
                    launch_sm90(q, k, v, out, lse, d**-0.5, cfg, causal=causal, return_lse=True)
    for causal in (False, True):  # the backward: 8 query / key steps against 3 stages, a gradient through the lse
        for d in (64, 128):
            q, k, v = (torch.randn(1, 2, 512, d, device="cuda", dtype=bf).requires_grad_() for _ in range(3))
            out, lse = attention(q, k, v, causal=causal, return_lse=True)
            torch.autograd.grad((out, lse), (q, k, v), (torch.randn_like(out), torch.randn_like(lse)))
            if torch.cuda.get_device_capability() == (9, 0):  # the fused kernel: dQ by TMA reductions, 9 steps
                from tkc.kernels.attention_bwd import attention_bwd_sm90

                q, k, v, do = (torch.randn(1, 2, 550, d, device="cuda", dtype=bf) for _ in range(4))
                lse, delta = torch.randn(1, 2, 550, device="cuda"), torch.randn(1, 2, 550, device="cuda")
                dk, dv, dq_sum = torch.empty_like(k), torch.empty_like(v), torch.zeros(1, 2, 550, d, device="cuda")
                warps = 8 if d == 128 else 4
                for deferred in (0, 1):  # and with each step's dQ added in the next, dS in two buffers
                    attention_bwd_sm90[(2, -(-550 // (16 * warps)), 1)](
                        q, k, v, do, lse, delta, dk, dv, dq_sum, 0.1, D=d, CAUSAL=int(causal), WARPS=warps, STAGES=3,
                        RAGGED=1, DEFER_DQ=deferred, DS_BUFFERS=1 + deferred)
    grouped_query_attention()
    decode_attention()
    last_block()
    x = torch.randn(300, 1024, device="cuda", dtype=bf)
    w = torch.randn(1024, device="cuda", dtype=bf)
    layernorm(x, x, w, w, target="sm_80")
    layernorm(x, None, w, w)  # without the residual, and RMSNorm with and without it
    rmsnorm(x, x, w, target="sm_80")
    rmsnorm(x, None, w)
    norms_backward()
    rotary_embedding()
    rows_by_row_numbers()
    grouped_products()
    packed_sequences()
    torch.cuda.synchronize()
    print("sanitize: all kernels ran")


if __name__ == "__main__":
    main()
