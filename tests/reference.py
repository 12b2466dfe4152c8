"""float64 numpy references and helpers shared by the tests."""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)


def random_bf16(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(BF16)


def poisoned(*shape: int, dtype=BF16) -> np.ndarray:
    """An output buffer full of NaN, so that an element the kernel forgets to write fails the check."""
    return np.full(shape, np.nan, dtype=dtype)


def f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; NaN anywhere in `out` makes it infinite."""
    out, ref = f64(out), f64(ref)
    if not np.isfinite(out).all():
        return float("inf")
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def gemm_ref(a: np.ndarray, b: np.ndarray, trans_b: bool = False) -> np.ndarray:
    a, b = f64(a), f64(b)
    return a @ (b.T if trans_b else b)


def query_heads(x, heads: int):
    """k or v (..., H_kv, N, D) as the `heads` query heads read them: each K/V head repeated H / H_kv times in a row
    (grouped-query attention)."""
    return np.repeat(x, heads // x.shape[-3], axis=-3)


def attention_ref(q, k, v, causal: bool = False, window: int | None = None, scale: float | None = None,
                  lse: bool = False):
    """softmax(scale·q·kᵀ, masked)·v in float64 (k and v of fewer heads than q: grouped-query attention); with `lse`,
    also each row's log-sum-exp (natural log)."""
    q, k, v = f64(q), query_heads(f64(k), q.shape[-3]), query_heads(f64(v), q.shape[-3])
    d = q.shape[-1]
    s = q @ np.swapaxes(k, -1, -2) * (1 / np.sqrt(d) if scale is None else scale)
    nq, nk = s.shape[-2:]
    i = np.arange(nq)[:, None]
    j = np.arange(nk)[None, :]
    visible = np.ones((nq, nk), dtype=bool)
    if causal:
        visible &= j <= i
    if window is not None:
        visible &= j > i - window
    s = np.where(visible, s, -np.inf)
    row_max = s.max(-1, keepdims=True)
    p = np.exp(s - row_max)
    out = (p / p.sum(-1, keepdims=True)) @ v
    if lse:
        return out, (row_max + np.log(p.sum(-1, keepdims=True)))[..., 0]
    return out


def kvcache_ref(q, k, v, lengths, scale: float):
    """attention_ref per batch over its first lengths[b] keys (at most k's; none: zero rows, lse -inf): float64
    (out, lse)."""
    out = np.zeros(q.shape, np.float64)
    lse = np.full(q.shape[:-1], -np.inf)
    for b, n in enumerate(lengths):
        n = min(int(n), k.shape[2])
        if n > 0:
            out[b], lse[b] = attention_ref(q[b], k[b, :, :n], v[b, :, :n], scale=scale, lse=True)
    return out, lse


def paged_cache(rng: np.random.Generator, cache: np.ndarray, table: np.ndarray, page: int, pool: int) -> np.ndarray:
    """cache (B, H_kv, N, D) cut into pages of `page` keys, batch b's i-th page at page table[b, i] of a pool of
    `pool` pages (pool, H_kv, page, D); the rows no key fills (past N, and the pages no batch names) NaN, as an
    unwritten cache's may be."""
    batch, kv_heads, n, d = cache.shape
    pages = np.full((pool, kv_heads, page, d), np.nan, dtype=cache.dtype)
    for b in range(batch):
        for i in range(table.shape[1]):
            chunk = cache[b, :, i * page:(i + 1) * page]
            pages[table[b, i], :, :chunk.shape[1]] = chunk
    return pages


def nan_past(cache: np.ndarray, lengths) -> np.ndarray:
    """A copy of cache (B, H_kv, N, D) with each batch's rows from lengths[b] on NaN (a cache never written there)."""
    cache = cache.copy()
    for b, n in enumerate(lengths):
        cache[b, :, max(int(n), 0):] = np.nan
    return cache


def layernorm_ref(x, residual, weight, bias, eps: float, rms: bool = False):
    """float64 (LayerNorm(x + residual)·weight + bias, x + residual); residual None: x alone; rms: RMSNorm (no mean,
    no bias)."""
    s = f64(x) + (0 if residual is None else f64(residual))
    if rms:
        return s / np.sqrt((s * s).mean(-1, keepdims=True) + eps) * f64(weight), s
    mean = s.mean(-1, keepdims=True)
    var = ((s - mean) ** 2).mean(-1, keepdims=True)
    return (s - mean) / np.sqrt(var + eps) * f64(weight) + f64(bias), s


def layernorm_backward_ref(s, grad_y, grad_s, weight, eps: float, rms: bool = False):
    """float64 (ds, dweight, dbias) of y = LayerNorm(s)·weight + bias (rms: RMSNorm(s)·weight) for rows s, by
    differentiating the formula: ds = rstd·(g - mean(g) - x̂·mean(g·x̂)) with g = dy·w (RMSNorm: without mean(g)),
    plus grad_s (the gradient of s where s is also an output)."""
    s, dy, w = f64(s), f64(grad_y), f64(weight)
    centered = s if rms else s - s.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt((centered * centered).mean(-1, keepdims=True) + eps)
    x_hat, g = centered * rstd, dy * w
    ds = rstd * (g - (0 if rms else g.mean(-1, keepdims=True)) - x_hat * (g * x_hat).mean(-1, keepdims=True))
    return ds + (0 if grad_s is None else f64(grad_s)), (dy * x_hat).sum(0), dy.sum(0)


def softmax_ref(x):
    x = f64(x)
    p = np.exp(x - x.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def attention_backward_ref(q, k, v, grad_out, causal: bool = False, scale: float | None = None, grad_lse=None):
    """float64 (out, lse, dq, dk, dv) of out = softmax(scale·q·kᵀ, masked)·v given the output's gradient (and the
    log-sum-exp's, grad_lse), by the formulas: dS = P ∘ (dO·Vᵀ - rowsum(dO ∘ O) + dL). With k and v of fewer heads
    than q (grouped-query attention), dk and dv sum over the query heads that read each."""
    kv_heads = k.shape[-3]
    q, k, v, do = f64(q), query_heads(f64(k), q.shape[-3]), query_heads(f64(v), q.shape[-3]), f64(grad_out)
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    out, lse = attention_ref(q, k, v, causal=causal, scale=scale, lse=True)
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        s = np.where(np.arange(s.shape[-1])[None, :] <= np.arange(s.shape[-2])[:, None], s, -np.inf)
    p = np.exp(s - lse[..., None])
    delta = (do * out).sum(-1) - (0 if grad_lse is None else f64(grad_lse))
    ds = p * (do @ np.swapaxes(v, -1, -2) - delta[..., None])
    dk, dv = np.swapaxes(ds, -1, -2) @ q * scale, np.swapaxes(p, -1, -2) @ do
    groups = (*dk.shape[:-3], kv_heads, -1, *dk.shape[-2:])  # a K/V head's query heads in a row
    return out, lse, ds @ k * scale, dk.reshape(groups).sum(-3), dv.reshape(groups).sum(-3)


def rotary_ref(x, cos, sin, offset: int = 0, conjugate: bool = False, interleaved: bool = False, positions=None):
    """float64 rotary embedding of x (..., N, D) by cos / sin (positions, R/2) from row `offset`, or rows
    `positions` ((N,) or (B, N) for x (B, H, N, D)): column i turned with i + R/2 (rotate-half), or 2i with 2i + 1
    (interleaved); the columns past R pass through; conjugate: sin negated."""
    x = f64(x)
    n, half = x.shape[-2], cos.shape[-1]
    if positions is None:
        c, s = f64(cos)[offset:offset + n], f64(sin)[offset:offset + n]
    else:
        where = np.asarray(positions, dtype=np.int64)
        where = where.reshape(-1, 1, n) if where.ndim == 2 else where  # (B, 1, N): each batch's rows, all heads
        c, s = f64(cos)[where], f64(sin)[where]
    s = s * (-1 if conjugate else 1)
    out = x.copy()
    first, second = (slice(0, 2 * half, 2), slice(1, 2 * half, 2)) if interleaved else (slice(0, half),
                                                                                     slice(half, 2 * half))
    x1, x2 = x[..., first], x[..., second]
    out[..., first], out[..., second] = x1 * c - x2 * s, x2 * c + x1 * s
    return out


def gathered_rows(table: np.ndarray, positions: np.ndarray, count: int) -> np.ndarray:
    """Rows positions[0 .. count) of table (rows_at's reading), zeros where the position or its value is out of
    range."""
    out = np.zeros((count, table.shape[1]), dtype=np.float64)
    for r in range(min(count, len(positions))):
        if 0 <= positions[r] < table.shape[0]:
            out[r] = table[positions[r]]
    return out


def row_numbers(rng: np.random.Generator, n: int, dtype: type, rows: int) -> np.ndarray:
    """n row numbers of a table of `rows` rows, mostly in range, some negative or past its end (and, for int64,
    one past 2**32, whose low word alone would be a valid row)."""
    p = rng.integers(-4, rows + 4, size=n)
    if dtype is np.int64 and n:
        p[rng.integers(0, n)] = (1 << 32) + 3
    return p.astype(dtype)


def varlen_attention_ref(q, k, v, ends, key_ends, causal: bool = False, scale: float | None = None):
    """Packed sequences (q (total, H, D), k and v (total_k, H_kv, D); sequence s rows ends[s - 1] .. ends[s], its keys
    key_ends[s - 1] .. key_ends[s]): each sequence's attention_ref alone, zeros past the last sequence's rows (and
    where a sequence has no keys); and the log-sum-exps (H, total), -inf there."""
    out, lse = np.zeros(q.shape), np.full((q.shape[1], q.shape[0]), -np.inf)
    for s in range(len(ends)):
        a, b = (ends[s - 1] if s else 0), ends[s]
        ka, kb = (key_ends[s - 1] if s else 0), key_ends[s]
        if b > a and kb > ka:
            o, lse[:, a:b] = attention_ref(np.swapaxes(q[a:b], 0, 1), np.swapaxes(k[ka:kb], 0, 1),
                                           np.swapaxes(v[ka:kb], 0, 1), causal, scale=scale, lse=True)
            out[a:b] = np.swapaxes(o, 0, 1)
    return out, lse


def varlen_attention_backward_ref(q, k, v, grad_out, ends, key_ends, causal: bool = False, scale: float | None = None):
    """Packed sequences as varlen_attention_ref: float64 (out, lse (H, total), dq, dk, dv), each sequence's
    attention_backward_ref alone (zeros where a sequence has no queries or no keys, and past the last ones)."""
    out, lse = np.zeros(q.shape), np.full((q.shape[1], q.shape[0]), -np.inf)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    heads_first = lambda t: np.swapaxes(t, 0, 1)  # noqa: E731
    for s in range(len(ends)):
        a, b = (ends[s - 1] if s else 0), ends[s]
        ka, kb = (key_ends[s - 1] if s else 0), key_ends[s]
        if b > a and kb > ka:
            o, l_, dq_s, dk_s, dv_s = attention_backward_ref(
                heads_first(q[a:b]), heads_first(k[ka:kb]), heads_first(v[ka:kb]), heads_first(grad_out[a:b]), causal,
                scale)
            out[a:b], lse[:, a:b], dq[a:b] = heads_first(o), l_, heads_first(dq_s)
            dk[ka:kb], dv[ka:kb] = heads_first(dk_s), heads_first(dv_s)
    return out, lse, dq, dk, dv
