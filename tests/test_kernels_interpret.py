"""The shipped kernels, run by the tile interpreter, against float64 numpy references on random inputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import (attention_backward_ref, attention_ref, gemm_ref, layernorm_ref, poisoned, random_bf16, rel_err,
                       rotary_ref)

from tkc.kernels import attention_fwd, attention_sm90, gemm_kernel, layernorm_kernel, rotary_kernel
from tkc.lang import i64
from tkc.kernels.attention import sm90_blocks, sm90_config, sm90_constants
from tkc.kernels.attention_bwd import (CONFIG, CONFIG_SM90, attention_bwd_delta, attention_bwd_dkdv, attention_bwd_dkdv_sm90,
                                      attention_bwd_dq, attention_bwd_dq_sm90, attention_bwd_sum_parts)

TOL = 1e-2


@given(
    m=st.integers(1, 300),
    n=st.integers(1, 300),
    k=st.integers(1, 150),
    trans_b=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_gemm_any_shape(m: int, n: int, k: int, trans_b: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = random_bf16(rng, m, k)
    b = random_bf16(rng, *((n, k) if trans_b else (k, n)))
    c = poisoned(m, n)
    gemm_kernel.interpret(a, b, c, grid=(-(-n // 128) * -(-m // 128),), TRANS_B=int(trans_b))
    assert rel_err(c, gemm_ref(a, b, trans_b)) < TOL


@pytest.mark.parametrize("block", [(64, 64, 16), (128, 64, 32), (64, 128, 64)])
def test_gemm_tile_shapes(block: tuple[int, int, int]) -> None:
    bm, bn, bk = block
    rng = np.random.default_rng(0)
    a, b, c = random_bf16(rng, 200, 100), random_bf16(rng, 100, 150), poisoned(200, 150)
    gemm_kernel.interpret(a, b, c, grid=(-(-150 // bn) * -(-200 // bm),), BM=bm, BN=bn, BK=bk)
    assert rel_err(c, gemm_ref(a, b)) < TOL


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [0, 1])
@given(batch=st.integers(1, 2), heads=st.integers(1, 3), blocks=st.integers(1, 4), seed=st.integers(0, 2**32 - 1))
def test_attention(d: int, causal: int, batch: int, heads: int, blocks: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 64 * blocks
    q, k, v = (random_bf16(rng, batch, heads, n, d) for _ in range(3))
    o = poisoned(batch, heads, n, d)
    scale = float(rng.uniform(0.05, 0.3))
    attention_fwd.interpret(q, k, v, o, scale, grid=(blocks, heads, batch), D=d, CAUSAL=causal)
    assert rel_err(o, attention_ref(q, k, v, causal=bool(causal), scale=scale)) < TOL


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@given(batch=st.integers(1, 2), kv_heads=st.integers(1, 2), group=st.integers(2, 4), blocks=st.integers(1, 2),
       seed=st.integers(0, 2**32 - 1))
@settings(max_examples=4)
def test_grouped_query_attention(d: int, causal: int, target: str, batch: int, kv_heads: int, group: int, blocks: int,
                                 seed: int) -> None:
    """K and V of fewer heads than Q (GROUP query heads in a row read one): attention_fwd, and attention_sm90 with
    attention()'s configuration for the length, against float64."""
    rng = np.random.default_rng(seed)
    heads, n = kv_heads * group, 64 * blocks
    q, o = random_bf16(rng, batch, heads, n, d), poisoned(batch, heads, n, d)
    k, v = (random_bf16(rng, batch, kv_heads, n, d) for _ in range(2))
    scale = float(rng.uniform(0.05, 0.3))
    if target == "sm_80":
        attention_fwd.interpret(q, k, v, o, scale, grid=(blocks, heads, batch), D=d, CAUSAL=causal, GROUP=group)
    else:
        cfg = sm90_config(d, n, n, bool(causal))
        grid = (sm90_blocks(batch, heads, n, cfg["WARPS"], cfg.get("TILES", 1)),)
        attention_sm90.interpret(q, k, v, o, np.zeros((1, 1, 1), np.float32), scale, grid=grid, D=d, CAUSAL=causal,
                                 GROUP=group, **sm90_constants(cfg), target="sm_90a")
    assert rel_err(o, attention_ref(q, k, v, causal=bool(causal), scale=scale)) < TOL


def decoding_problem(seed: int, d: int, batch: int, kv_heads: int, group: int, nq: int, nk: int, parts: int):
    """q (B, H, Nq, D), k and v (B, H_kv, Nk, D) in bf16, a scale, and the split of the keys the decoding kernels
    take with CONFIG[d]: (keys a warp and step, stages, parts, steps a part) for at most `parts` parts, none empty."""
    from tkc.kernels.attention_decode import CONFIG

    rng = np.random.default_rng(seed)
    q = random_bf16(rng, batch, kv_heads * group, nq, d)
    k, v = (random_bf16(rng, batch, kv_heads, nk, d) for _ in range(2))
    keys, stages, _ = CONFIG[d]
    steps = -(-nk // (4 * keys))
    per_part = -(-steps // parts)
    return q, k, v, float(rng.uniform(0.05, 0.3)), (keys, stages, -(-steps // per_part), per_part)


def cache_scheme(seed: int, k: np.ndarray, v: np.ndarray, scheme: str, step: int):
    """The decoding kernels' K, V, Lengths, Pages and constants for a cache `scheme`: "all" (all of k's keys;
    Lengths and Pages unread), "ragged" (a length a batch from 0 to past Nk, read as Nk; the rows past it NaN:
    LENGTHS=1), "paged" (lengths up to Nk, K and V cut into pages of one or two key steps of `step` keys scattered
    over a pool by a page table, the rows no key fills NaN: PAGED=1 too). Also the reference (out, lse) maker for
    q, scale."""
    from reference import kvcache_ref, nan_past, paged_cache

    unread_pages = np.zeros((1, 1), np.int32)
    if scheme == "all":
        return k, v, np.zeros(1, np.int32), unread_pages, {}, lambda q, scale: attention_ref(q, k, v, scale=scale,
                                                                                            lse=True)
    rng = np.random.default_rng(seed + 1)
    batch, nk = k.shape[0], k.shape[2]
    lengths = rng.integers(0, nk + (9 if scheme == "ragged" else 1), batch).astype(np.int32)
    reference = lambda q, scale: kvcache_ref(q, k, v, lengths, scale)  # noqa: E731
    k, v = nan_past(k, lengths), nan_past(v, lengths)
    if scheme == "ragged":
        return k, v, lengths, unread_pages, {"LENGTHS": 1}, reference
    page = step * int(rng.integers(1, 3))
    per_batch = -(-nk // page)
    pool = batch * per_batch + 2
    table = rng.permutation(pool)[:batch * per_batch].reshape(batch, per_batch).astype(np.int32)
    return (paged_cache(rng, k, table, page, pool), paged_cache(rng, v, table, page, pool), lengths, table,
            {"LENGTHS": 1, "PAGED": 1}, reference)


SCHEMES = st.sampled_from(["all", "ragged", "paged"])


def close_lse(got, want) -> bool:
    """Log-sum-exps within 1e-4 where finite, -inf where the reference's are (batches without keys)."""
    finite = np.isfinite(want)
    return (np.isneginf(got) == ~finite).all() and np.abs(got[finite] - want[finite]).max(initial=0) < 1e-4


@pytest.mark.parametrize("d", [64, 128])
@given(batch=st.integers(1, 2), kv_heads=st.integers(1, 2), group=st.sampled_from([1, 2, 4, 8]),
       nq=st.sampled_from([1, 1, 2, 3]), nk=st.integers(1, 700), parts=st.integers(1, 6), scheme=SCHEMES,
       seed=st.integers(0, 2**32 - 1))
@settings(max_examples=12)
def test_decode_attention(d: int, batch: int, kv_heads: int, group: int, nq: int, nk: int, parts: int,
                          scheme: str, seed: int) -> None:
    """A few queries (the GROUP query heads' Nq rows of a K/V head packed into one tile) over any number of keys,
    split into parts (the last one short, steps past Nk masked), then the parts weighed by their log-sum-exps:
    attention_decode and attention_decode_combine against float64, out and log-sum-exp; `scheme` ragged: each batch
    over its own count of keys (LENGTHS; parts past it empty, a batch of none zero rows), paged: and its cache in
    pages (PAGED)."""
    from tkc.kernels.attention_decode import attention_decode, attention_decode_combine

    q, k, v, scale, (keys, stages, parts, per_part) = decoding_problem(seed, d, batch, kv_heads, group, nq, nk, parts)
    k, v, lengths, pages, constants, reference = cache_scheme(seed, k, v, scheme, 4 * keys)
    heads, rows = kv_heads * group, group * nq
    o_parts = poisoned(parts * batch, kv_heads, rows, d, dtype=np.float32)
    l_parts = poisoned(parts * batch, kv_heads, rows, dtype=np.float32)
    attention_decode.interpret(q.reshape(batch, kv_heads, rows, d), k, v, lengths, pages, o_parts, l_parts, scale,
                               per_part,
                               grid=(parts * -(-rows // 16), kv_heads, batch), D=d, KEYS=keys, STAGES=stages,
                               **constants)
    flat = batch * heads * nq
    out, lse = poisoned(flat, d), poisoned(flat, dtype=np.float32)
    attention_decode_combine.interpret(o_parts.reshape(parts, flat, d), l_parts.reshape(parts, flat), out, lse,
                                       grid=(-(-flat // 16), d // 32), LSE=1)
    ref, ref_lse = reference(q, scale)
    assert rel_err(out.reshape(q.shape), ref) < TOL and close_lse(lse.reshape(ref_lse.shape), ref_lse)


@pytest.mark.parametrize("d", [64, 128])
@given(batch=st.integers(1, 2), kv_heads=st.integers(1, 2), group=st.sampled_from([1, 2, 4, 8]),
       nq=st.sampled_from([1, 1, 2, 5]), nk=st.integers(1, 700), parts=st.integers(1, 20), lse=st.sampled_from([0, 1]),
       scheme=SCHEMES, seed=st.integers(0, 2**32 - 1))
@settings(max_examples=10)
def test_decode_attention_last_block_weighs(d: int, batch: int, kv_heads: int, group: int, nq: int, nk: int,
                                            parts: int, lse: int, scheme: str, seed: int) -> None:
    """attention_decode_last: each block leaves its part, and the last of a row tile's parts to arrive at its counter
    weighs them all, in one launch: out and log-sum-exp against float64 (several row tiles, the last one short);
    two launches on the same counters (each leaves them at 0)."""
    from tkc.kernels.attention_decode import attention_decode_last

    q, k, v, scale, (keys, stages, parts, per_part) = decoding_problem(seed, d, batch, kv_heads, group, nq, nk, parts)
    k, v, lengths, pages, constants, reference = cache_scheme(seed, k, v, scheme, 4 * keys)
    rows = group * nq
    tiles = -(-rows // 16)
    counter = np.zeros(batch * kv_heads * tiles, np.int32)
    ref, ref_lse = reference(q, scale)
    for _ in range(2):
        o_parts = poisoned(parts * batch, kv_heads, rows, d, dtype=np.float32)
        l_parts = poisoned(parts * batch, kv_heads, rows, dtype=np.float32)
        out, l_out = poisoned(batch, kv_heads, rows, d), poisoned(batch, kv_heads, rows, dtype=np.float32)
        attention_decode_last.interpret(q.reshape(batch, kv_heads, rows, d), k, v, lengths, pages, o_parts, l_parts,
                                        out, l_out, counter, scale, per_part, grid=(parts * tiles, kv_heads, batch), D=d,
                                        KEYS=keys, STAGES=stages, LSE=lse, **constants)
        assert rel_err(out.reshape(q.shape), ref) < TOL and not counter.any()
        if lse:
            assert close_lse(l_out.reshape(ref_lse.shape), ref_lse)


@pytest.mark.parametrize("d", [64, 128])
@given(batch=st.integers(1, 2), kv_heads=st.integers(1, 2), group=st.sampled_from([1, 2, 4, 8]),
       nq=st.sampled_from([1, 1, 2, 5]), nk=st.integers(1, 700), parts=st.integers(1, 16), lse=st.sampled_from([0, 1]),
       scheme=SCHEMES, seed=st.integers(0, 2**32 - 1))
@settings(max_examples=10)
def test_decode_attention_in_clusters(d: int, batch: int, kv_heads: int, group: int, nq: int, nk: int, parts: int,
                                      lse: int, scheme: str, seed: int) -> None:
    """attention_decode_cluster: a row tile's parts of the keys are the blocks of a cluster (1 to 16), which weigh
    each other's results out of their shared memory: out and log-sum-exp against float64 (up to 80 rows a K/V
    head: several row tiles, the last one short)."""
    from tkc.kernels.attention_decode import attention_decode_cluster

    q, k, v, scale, (keys, stages, parts, per_part) = decoding_problem(seed, d, batch, kv_heads, group, nq, nk, parts)
    k, v, lengths, pages, constants, reference = cache_scheme(seed, k, v, scheme, 4 * keys)
    rows = group * nq
    out, l_out = poisoned(batch, kv_heads, rows, d), poisoned(batch, kv_heads, rows, dtype=np.float32)
    attention_decode_cluster.interpret(q.reshape(batch, kv_heads, rows, d), k, v, lengths, pages, out, l_out, scale,
                                       per_part, grid=(parts * -(-rows // 16), kv_heads, batch), D=d, KEYS=keys,
                                       STAGES=stages, CLUSTER=parts, LSE=lse, target="sm_90a", **constants)
    ref, ref_lse = reference(q, scale)
    assert rel_err(out.reshape(q.shape), ref) < TOL
    if lse:
        assert close_lse(l_out.reshape(ref_lse.shape), ref_lse)


@given(rows=st.integers(1, 70), d=st.sampled_from([16, 64, 256, 1024]), eps=st.sampled_from([1e-5, 1e-3]),
       residual=st.sampled_from([1, 1, 0]), rms=st.sampled_from([0, 0, 1]), seed=st.integers(0, 2**32 - 1))
def test_layernorm(rows: int, d: int, eps: float, residual: int, rms: int, seed: int) -> None:
    """LayerNorm, or RMSNorm (RMS=1: Bias not read), of x + residual, or of x alone (RESIDUAL=0: Residual not read,
    OutResidual not written)."""
    rng = np.random.default_rng(seed)
    x, r = random_bf16(rng, rows, d), random_bf16(rng, rows, d)
    w, b = random_bf16(rng, d), random_bf16(rng, d)
    out, out_resid = poisoned(rows, d), poisoned(rows, d)
    warps = max(1, min(4, d // 16))
    args = (x, r if residual else poisoned(rows, d), w, poisoned(d) if rms else b, out, out_resid, eps)
    layernorm_kernel.interpret(*args, grid=(-(-rows // 8),), D=d, WARPS=warps, RESIDUAL=residual, RMS=rms)
    ref, resid = layernorm_ref(x, r if residual else None, w, b, eps, rms=bool(rms))
    assert rel_err(out, ref) < TOL
    if residual:
        assert rel_err(out_resid, resid) < TOL
    else:
        assert np.isnan(out_resid.astype(np.float32)).all()


@given(batch=st.integers(1, 2), heads=st.integers(1, 5), n=st.integers(1, 40),
       dims=st.sampled_from([(128, 128), (128, 64), (64, 64), (96, 32), (256, 128)]), offset=st.integers(0, 9),
       conjugate=st.booleans(), layout=st.sampled_from([(4, 4), (1, 1), (2, 2), (3, 2)]),
       bshd=st.booleans(), interleaved=st.booleans(), positions=st.sampled_from([None, "shared", "batched"]),
       seed=st.integers(0, 2**32 - 1))
@settings(max_examples=30)
def test_rotary(batch: int, heads: int, n: int, dims: tuple[int, int], offset: int, conjugate: bool,
                layout: tuple[int, int], bshd: bool, interleaved: bool, positions: str | None, seed: int) -> None:
    """Rotary embedding of (B, H, N, D) rows, or of a (B, N, H, D) tensor seen transposed (strided rows), partial
    rotary (R < D) included, rotate-half or interleaved, on grids whose last blocks run past the rows and heads;
    positions from the offset, or gathered by a positions tensor (one row for all batches, or one a batch)."""
    rng = np.random.default_rng(seed)
    d, r = dims
    heads_a_warp, warps = layout
    x = random_bf16(rng, batch, n, heads, d).transpose(0, 2, 1, 3) if bshd else random_bf16(rng, batch, heads, n, d)
    angles = rng.uniform(0, 2 * np.pi, (offset + n + 2, r // 2))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    out = poisoned(batch, heads, n, d)
    grid = (-(-n // (16 * warps)), batch, -(-heads // heads_a_warp))
    where = rng.integers(0, offset + n + 2, size=(batch if positions == "batched" else 1, n)).astype(np.int64)
    index, stride = (where.reshape(-1), n if positions == "batched" else 0) if positions else (np.zeros(1, np.int32), 0)
    by_index = {"POSITIONS": 1, "PT": i64} if positions else {}
    rotary_kernel.interpret(x, cos, sin, out, x, out, index, 0 if positions else offset, stride, grid=grid, D=d, R=r,
                            HEADS=heads_a_warp, WARPS=warps, CONJUGATE=int(conjugate), INTERLEAVED=int(interleaved),
                            **by_index)
    ref = rotary_ref(x, cos, sin, offset, conjugate, interleaved, positions=where if positions else None)
    assert rel_err(out, ref) < TOL


@given(rows=st.integers(1, 40), d=st.sampled_from([16, 64, 256, 1024]), rms=st.sampled_from([0, 1]),
       ds_in=st.sampled_from([0, 1]), blocks=st.integers(1, 6),
       layout=st.sampled_from([(0, 0), (1, 1), (2, 1), (4, 1), (2, 2), (4, 4)]), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=16)
def test_layernorm_backward(rows: int, d: int, rms: int, ds_in: int, blocks: int, layout: tuple[int, int],
                            seed: int) -> None:
    """LayerNorm's / RMSNorm's backward: ds (plus the new residual's gradient with DS_IN) from blocks that take
    every blocks-th row, or every blocks-th group of WARPS rows a row a warp (the next one's loads ahead), a row
    over the block's warps (SPLIT = WARPS) or over one (SPLIT = 1, the warps' partial sums added in shared
    memory), as backward_layout picks (layout (0, 0), or one D does not allow) or not, and their partial sums of
    dy·x̂ and dy added up by column_sums_kernel: dweight, dbias."""
    from reference import layernorm_backward_ref

    from tkc.kernels.layernorm_bwd import backward_layout, column_sums_kernel, layernorm_bwd_kernel
    from tkc.lang import bf16

    rng = np.random.default_rng(seed)
    s, dy, grad_s = (random_bf16(rng, rows, d) for _ in range(3))
    w = random_bf16(rng, d)
    width = d if rms else 2 * d  # dy·x̂'s partial sums, then dy's
    ds, parts = poisoned(rows, d), poisoned(blocks, width, dtype=np.float32)
    allowed = layout[0] and layout[1] in (1, layout[0]) and d % (16 * layout[0]) == 0
    warps, split = layout if allowed else backward_layout(d)
    layernorm_bwd_kernel.interpret(s, dy, grad_s if ds_in else poisoned(rows, d), w, ds, parts, 1e-5,
                                   grid=(blocks,), D=d, WARPS=warps, SPLIT=split, RMS=rms, DS_IN=ds_in)
    ref = layernorm_backward_ref(s, dy, grad_s if ds_in else None, w, 1e-5, rms=bool(rms))
    assert rel_err(ds, ref[0]) < TOL
    totals = poisoned(width)
    column_sums_kernel.interpret(parts, totals, grid=(-(-width // 32),), DT=bf16)
    assert rel_err(totals[:d], ref[1]) < TOL and (rms or rel_err(totals[d:], ref[2]) < TOL)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("config", [0, 1, 2])
@given(batch=st.integers(1, 2), kv_heads=st.integers(1, 2), group=st.sampled_from([1, 1, 2, 3, 4]),
       split_choice=st.integers(0, 2), blocks=st.integers(1, 4), short=st.sampled_from([0, 0, 1, 37]),
       seed=st.integers(0, 2**32 - 1))
@settings(max_examples=8)  # 12 cases of three kernels each
def test_attention_backward(d: int, causal: int, config: int, batch: int, kv_heads: int, group: int,
                            split_choice: int, blocks: int, short: int, seed: int) -> None:
    """attention_bwd_delta / _dkdv / _dq with attention_backward's constants (config 0), the other sizes of their
    steps and places of K and V (config 1), and the wgmma kernels with theirs (config 2, four warps a block), a
    gradient through the log-sum-exp too, lengths that the steps divide or not (RAGGED), K and V of as many heads
    as Q or `group` times fewer (grouped-query attention: dK and dV sum over the query heads, in one block or in
    SPLIT parts whose partial sums attention_bwd_sum_parts adds), against float64."""
    rng = np.random.default_rng(seed)
    n, heads = 64 * blocks - short, kv_heads * group
    q, do = (random_bf16(rng, batch, heads, n, d) for _ in range(2))
    k, v = (random_bf16(rng, batch, kv_heads, n, d) for _ in range(2))
    dl = rng.standard_normal((batch, heads, n)).astype(np.float32)
    scale = float(rng.uniform(0.05, 0.3))
    out, lse, dq_ref, dk_ref, dv_ref = attention_backward_ref(q, k, v, do, bool(causal), scale, dl)
    dkdv, dq_cfg = CONFIG[d] if config == 0 else ({"QUERIES": 96 - CONFIG[d][0]["QUERIES"], "KV_IN_SHARED": d == 64},
                                                  {"KEYS": 96 - CONFIG[d][1]["KEYS"]})
    dkdv_kernel, dq_kernel, target = attention_bwd_dkdv, attention_bwd_dq, "sm_80"
    if config == 2:
        dkdv_kernel, dq_kernel, target = attention_bwd_dkdv_sm90, attention_bwd_dq_sm90, "sm_90a"
        dkdv, dq_cfg = ({**cfg, "WARPS": 4} for cfg in CONFIG_SM90[d])
    delta = poisoned(batch, heads, n, dtype=np.float32)
    grid = (blocks, heads, batch)
    split = [1, min(p for p in range(2, group + 1) if group % p == 0) if group > 1 else 1, group][split_choice]
    dkdv = {**dkdv, "RAGGED": int(n % dkdv.get("QUERIES", 64) > 0), "GROUP": group, "SPLIT": split}
    dq_cfg = {**dq_cfg, "RAGGED": int(n % dq_cfg.get("KEYS", 64) > 0), "GROUP": group}
    attention_bwd_delta.interpret(out.astype(q.dtype), do, dl, delta, grid=grid, D=d, WITH_DL=1)
    dq, (dk, dv) = poisoned(batch, heads, n, d), (poisoned(split * batch, kv_heads, n, d) for _ in range(2))
    L = lse.astype(np.float32)
    dkdv_kernel.interpret(q, k, v, do, L, delta, dk, dv, scale, grid=(blocks, kv_heads * split, batch), D=d,
                          CAUSAL=causal, **dkdv, target=target)
    if split > 1:
        rows = batch * kv_heads * n
        parts, (dk, dv) = (dk, dv), (poisoned(batch, kv_heads, n, d) for _ in range(2))
        for part, total in zip(parts, (dk, dv)):
            attention_bwd_sum_parts.interpret(part.reshape(split, rows, d), total.reshape(rows, d),
                                              grid=(-(-rows // 64),), D=d)
    dq_kernel.interpret(q, k, v, do, L, delta, dq, scale, grid=grid, D=d, CAUSAL=causal, **dq_cfg, target=target)
    assert rel_err(dq, dq_ref) < TOL and rel_err(dk, dk_ref) < TOL and rel_err(dv, dv_ref) < TOL


def test_grouped_query_attention_catches_the_wrong_head(monkeypatch) -> None:
    """The oracle can fail: with kv_head mutated to give query head h the K/V head h (clamped), grouped-query
    attention no longer matches float64."""
    import importlib

    import tkc

    attention_module = importlib.import_module("tkc.kernels.attention")

    @tkc.func
    def wrong_head(h, group):
        return min(h, 1)

    monkeypatch.setattr(attention_module, "kv_head", wrong_head)
    rng = np.random.default_rng(1)
    q, o = random_bf16(rng, 1, 4, 64, 64), poisoned(1, 4, 64, 64)
    k, v = (random_bf16(rng, 1, 2, 64, 64) for _ in range(2))
    attention_fwd.interpret(q, k, v, o, 0.125, grid=(1, 4, 1), D=64, GROUP=2)
    assert not rel_err(o, attention_ref(q, k, v, scale=0.125)) < TOL


@given(lengths=st.lists(st.integers(0, 200), min_size=1, max_size=5), heads=st.sampled_from([(2, 2), (4, 2), (2, 1)]),
       d=st.sampled_from([32, 64, 96, 128, 256]), causal=st.booleans(), sm90=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
@settings(max_examples=8)
# (blocks past the last sequence run no key step: the interpreter's -inf - -inf on lanes it leaves inactive)
@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
def test_attention_varlen_any_lengths(lengths, heads, d, causal, sm90, seed) -> None:  # type: ignore[no-untyped-def]
    """attention_varlen's kernels (Hopper's or the sm_80 one, with attention_varlen's constants) over packed sequences
    of any lengths (0 too) against float64 attention per sequence; its log-sum-exps too."""
    from reference import varlen_attention_ref

    from tkc.kernels.attention import CONFIG as FORWARD_CONFIG
    from tkc.kernels.attention_varlen import attention_varlen_fwd, attention_varlen_sm90

    rng = np.random.default_rng(seed)
    (h, h_kv), ends = heads, np.cumsum(lengths).astype(np.int32)
    total = max(int(ends[-1]), 1)
    q, k, v = (random_bf16(rng, total, n, d) for n in (h, h_kv, h_kv))
    out, lse = poisoned(total, h, d), np.full((1, h, total), np.nan, np.float32)
    packed = lambda t: t[None].transpose(0, 2, 1, 3)  # noqa: E731
    constants = {"D": d, "CAUSAL": int(causal), "LSE": 1, **({"GROUP": h // h_kv} if h != h_kv else {})}
    if sm90 and d in (64, 96, 128):  # (D = 32 and 256: attention_varlen_fwd on every GPU)
        kernel, grid = attention_varlen_sm90, ((-(-total // 128) + len(lengths)) * h,)
    else:
        rows, keys, q_in_shared = FORWARD_CONFIG[d]
        constants.update(ROWS=rows, KEYS=keys, Q_IN_SHARED=q_in_shared)
        kernel, grid = attention_varlen_fwd, (-(-total // (4 * rows)) + len(lengths), h)
    kernel.interpret(packed(q), packed(k), packed(v), packed(out), lse, ends, ends, 0.125, grid=grid, **constants)
    ref, ref_lse = varlen_attention_ref(q, k, v, ends, ends, causal, 0.125)
    rows_in = int(ends[-1])
    assert rel_err(out[:rows_in], ref[:rows_in]) < TOL
    assert rel_err(lse[0, :, :rows_in], ref_lse[:, :rows_in]) < 1e-4


@given(lengths=st.lists(st.integers(0, 150), min_size=1, max_size=4), heads=st.sampled_from([(2, 2), (4, 2)]),
       d=st.sampled_from([32, 64, 128]), causal=st.booleans(), sm90=st.booleans(), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=6)
@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
def test_attention_varlen_backward_any_lengths(lengths, heads, d, causal, sm90, seed) -> None:  # type: ignore[no-untyped-def]
    """attention_varlen_backward's kernels (Δ, dK/dV, dQ with its constants; Hopper's or the mma.sync ones) over
    packed sequences of any lengths against float64 gradients per sequence."""
    from reference import varlen_attention_backward_ref

    from tkc.kernels.attention_varlen import backward_kernels

    rng = np.random.default_rng(seed)
    (h, h_kv), ends = heads, np.cumsum(lengths).astype(np.int32)
    total, rows_in = max(int(ends[-1]), 1), int(ends[-1])
    q, do = random_bf16(rng, total, h, d), random_bf16(rng, total, h, d)
    k, v = random_bf16(rng, total, h_kv, d), random_bf16(rng, total, h_kv, d)
    out, lse, dq_ref, dk_ref, dv_ref = varlen_attention_backward_ref(q, k, v, do, ends, ends, causal, 0.125)
    packed = lambda t: t[None].transpose(0, 2, 1, 3)  # noqa: E731
    lse, delta = lse.astype(np.float32)[None], np.zeros((1, h, total), np.float32)
    attention_bwd_delta.interpret(packed(out.astype(q.dtype)), packed(do), lse, delta, grid=(-(-total // 64), h, 1), D=d)
    (dkdv_kernel, dkdv, key_rows), (dq_kernel, dq_cfg, query_rows) = backward_kernels(d, sm90, causal)
    constants = {"D": d, "CAUSAL": int(causal), **({"GROUP": h // h_kv} if h != h_kv else {})}
    dq, dk, dv = poisoned(total, h, d), poisoned(total, h_kv, d), poisoned(total, h_kv, d)
    common = (packed(q), packed(k), packed(v), packed(do), lse, delta)
    dkdv_kernel.interpret(*common, packed(dk), packed(dv), ends, ends, 0.125,
                          grid=(-(-total // key_rows) + len(lengths), h_kv, 1), **dkdv, **constants)
    dq_kernel.interpret(*common, packed(dq), ends, ends, 0.125, grid=(-(-total // query_rows) + len(lengths), h, 1),
                        **dq_cfg, **constants)
    for got, ref in ((dq, dq_ref), (dk, dk_ref), (dv, dv_ref)):
        assert rel_err(got[:rows_in], ref[:rows_in]) < 2e-2
