"""tkc.kernels.attention_varlen on a Hopper GPU against torch's SDPA in float32 run on each sequence alone: fresh
random inputs, outputs poisoned first, lengths of every kind (0, 1, not multiples of 16, longer than a block, more
sequences than multiprocessors), grouped-query heads, keys of other lengths; the Hopper kernel and the sm_80 one.
Run with: pytest -m gpu tests/gpu."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from tkc.kernels.attention_varlen import attention_varlen, attention_varlen_backward  # noqa: E402

pytestmark = pytest.mark.gpu


def hopper() -> None:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("attention_varlen_sm90 runs on sm_90")


TARGETS = ["sm_80", None]  # the sm_80 kernel (mma.sync, cp.async), and the best for this GPU


def offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


def packed_inputs(lengths, key_lengths, heads, kv_heads, d):  # type: ignore[no-untyped-def]
    """cu_seqlens, cu_seqlens_k (cu_seqlens where key_lengths is None), and fresh random bf16 q, k, v packed."""
    cu = offsets(lengths)
    cu_k = offsets(key_lengths) if key_lengths else cu
    q = torch.randn(sum(lengths), heads, d, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(int(cu_k[-1]), kv_heads, d, device="cuda").to(torch.bfloat16) for _ in range(2))
    return cu, cu_k, q, k, v


def reference(q, k, v, cu, cu_k, causal, scale):  # type: ignore[no-untyped-def]
    """Each sequence's attention alone, in float32 (torch's convention for causal with other lengths)."""
    out = torch.zeros_like(q, dtype=torch.float32)
    group = q.shape[1] // k.shape[1]
    for s in range(cu.shape[0] - 1):
        a, b, ka, kb = (int(x) for x in (cu[s], cu[s + 1], cu_k[s], cu_k[s + 1]))
        if b == a:
            continue
        qs = q[a:b].float().transpose(0, 1)
        ks = k[ka:kb].float().transpose(0, 1).repeat_interleave(group, 0)
        vs = v[ka:kb].float().transpose(0, 1).repeat_interleave(group, 0)
        if kb == ka:  # no keys: softmax over nothing (NaN); not a case the tests build
            continue
        mask = torch.ones(b - a, kb - ka, dtype=torch.bool, device="cuda").tril() if causal else None
        out[a:b] = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask,
                                                                    scale=scale).transpose(0, 1)
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return math.inf
    return ((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


CASES = [  # (query lengths, key lengths or None, heads, K/V heads, head dim)
    ([1000, 24, 513, 2048, 1], None, 8, 8, 128),
    ([128, 128, 128, 128], None, 16, 16, 64),
    ([37, 0, 300, 129, 0, 5], None, 4, 1, 128),  # empty sequences, multi-query
    ([4096], None, 8, 2, 96),
    ([17] * 300, None, 4, 4, 64),  # more sequences than multiprocessors, each in one block
    ([200, 64, 700], [300, 1, 700], 8, 4, 128),  # keys of other lengths (a cache), grouped-query
    ([300, 17], None, 4, 2, 32),  # D = 32 and 256: the sm_80 kernel on every GPU
    ([200, 513], [100, 513], 4, 4, 256),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lengths, key_lengths, heads, kv_heads, d", CASES)
def test_attention_varlen(lengths, key_lengths, heads, kv_heads, d, causal, target) -> None:  # type: ignore[no-untyped-def]
    if target is None and d in (64, 96, 128):
        hopper()
    cu, cu_k, q, k, v = packed_inputs(lengths, key_lengths, heads, kv_heads, d)
    out = torch.full_like(q, float("nan"))
    scale = 0.7 / math.sqrt(d)
    attention_varlen(q, k, v, cu, cu_seqlens_k=cu_k if key_lengths else None, causal=causal, scale=scale, out=out,
                     target=target)
    ref = reference(q, k, v, cu, cu_k, causal, scale)
    assert rel_err(out, ref) < 1e-2


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_varlen_lse(causal, target) -> None:  # type: ignore[no-untyped-def]
    """return_lse: each row's log-sum-exp (H, total) float32, -inf where a sequence has no keys; rows past the last
    sequence not written."""
    if target is None:
        hopper()
    lengths, key_lengths = [300, 5, 0, 129], [300, 0, 7, 700]
    cu, cu_k = offsets(lengths), offsets(key_lengths)
    q = torch.randn(sum(lengths) + 9, 8, 128, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(sum(key_lengths), 2, 128, device="cuda").to(torch.bfloat16) for _ in range(2))
    out, lse = attention_varlen(q, k, v, cu, cu_seqlens_k=cu_k, causal=causal, return_lse=True, target=target)
    assert lse.shape == (8, q.shape[0]) and lse.dtype == torch.float32
    scale = 1 / math.sqrt(128)
    ks = k.float().repeat_interleave(4, 1)
    for s, (a, b, ka, kb) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), cu_k[:-1].tolist(), cu_k[1:].tolist())):
        if b == a:
            continue
        if kb == ka:
            assert torch.isneginf(lse[:, a:b]).all() and (out[a:b] == 0).all(), s
            continue
        scores = torch.einsum("qhd,khd->hqk", q[a:b].float(), ks[ka:kb]) * scale
        if causal:
            scores = scores.masked_fill(~torch.ones(b - a, kb - ka, dtype=torch.bool, device="cuda").tril(), -math.inf)
        assert rel_err(lse[:, a:b], scores.logsumexp(-1)) < 1e-4, s
    assert rel_err(out[:sum(lengths)], reference(q, k, v, cu, cu_k, causal, scale)[:sum(lengths)]) < 1e-2


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lengths, key_lengths, heads, kv_heads, d", [
    ([1000, 24, 513, 1], None, 8, 8, 128),
    ([37, 0, 300, 129], None, 4, 2, 64),  # an empty sequence, grouped-query heads
    ([200, 64], [300, 64], 8, 4, 96),  # keys of other lengths
    ([129, 64], None, 4, 1, 32),
])
def test_attention_varlen_gradients(lengths, key_lengths, heads, kv_heads, d, causal, target) -> None:  # type: ignore[no-untyped-def]
    """Autograd through attention_varlen (out and lse both used) against autograd through the float32 reference."""
    if target is None:
        hopper()
    cu, cu_k, q, k, v = (t.requires_grad_() if t.is_floating_point() else t
                         for t in packed_inputs(lengths, key_lengths, heads, kv_heads, d))
    total = q.shape[0]
    grad_out = torch.randn_like(q)
    out, lse = attention_varlen(q, k, v, cu, cu_seqlens_k=cu_k if key_lengths else None, causal=causal,
                                return_lse=True, target=target)
    (out.float() * grad_out.float()).sum().add(lse.sum() * 0.1).backward()
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = reference(qf, kf, vf, cu, cu_k, causal, 1 / math.sqrt(d))
    ref_lse = torch.zeros(heads, total, device="cuda")
    for a, b, ka, kb in zip(cu[:-1].tolist(), cu[1:].tolist(), cu_k[:-1].tolist(), cu_k[1:].tolist()):
        if b > a and kb > ka:
            scores = torch.einsum("qhd,khd->hqk", qf[a:b], kf[ka:kb].repeat_interleave(heads // kv_heads, 1))
            scores = scores / math.sqrt(d)
            if causal:
                scores = scores.masked_fill(~torch.ones(b - a, kb - ka, dtype=torch.bool, device="cuda").tril(),
                                            -math.inf)
            ref_lse[:, a:b] = scores.logsumexp(-1)
    (ref * grad_out.float()).sum().add(ref_lse.sum() * 0.1).backward()
    for got, want in ((q.grad, qf.grad), (k.grad, kf.grad), (v.grad, vf.grad)):
        assert rel_err(got, want) < 2e-2


@pytest.mark.parametrize("target", TARGETS)
def test_attention_varlen_gradients_past_the_last_sequence_are_zeros(target) -> None:  # type: ignore[no-untyped-def]
    """attention_varlen_backward: rows of dq past cu_seqlens[-1] and of dk, dv past cu_seqlens_k[-1] are zeros (the
    allocator's blocks poisoned with NaN first), the rest as the reference's."""
    if target is None:
        hopper()
    q, do = (torch.randn(333, 4, 128, device="cuda").to(torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(290, 2, 128, device="cuda").to(torch.bfloat16) for _ in range(2))
    cu, cu_k = offsets([100, 150]), offsets([120, 100])
    out, lse = attention_varlen(q, k, v, cu, cu_seqlens_k=cu_k, return_lse=True, target=target)
    for t in (q, k, v):  # freed NaN blocks of each size for the gradients' empty_like to take
        torch.full_like(t, float("nan"))
    dq, dk, dv = attention_varlen_backward(q, k, v, out, do, lse, cu, cu_seqlens_k=cu_k, target=target)
    assert (dq[250:] == 0).all() and (dk[220:] == 0).all() and (dv[220:] == 0).all()
    qf, kf, vf = (t[:n].detach().float().requires_grad_() for t, n in ((q, 250), (k, 220), (v, 220)))
    ref = reference(qf, kf, vf, cu, cu_k, False, 1 / math.sqrt(128))
    ref.backward(do[:250].float())
    for got, want in ((dq[:250], qf.grad), (dk[:220], kf.grad), (dv[:220], vf.grad)):
        assert rel_err(got, want) < 2e-2


def test_attention_varlen_rows_past_the_last_sequence_are_left() -> None:
    """Rows of q past cu_seqlens[-1] are not written; a fresh call's output is the same (no state between calls)."""
    hopper()
    q, k, v = (torch.randn(300, 4, 64, device="cuda").to(torch.bfloat16) for _ in range(3))
    cu = offsets([100, 150])
    out = torch.full_like(q, float("nan"))
    attention_varlen(q, k, v, cu, out=out)
    assert torch.isnan(out[250:].float()).all() and torch.isfinite(out[:250].float()).all()
    assert rel_err(out[:250], reference(q, k, v, cu, cu, False, 1 / 8)[:250]) < 1e-2
    assert torch.equal(attention_varlen(q, k, v, cu)[:250], out[:250])


@pytest.mark.parametrize("target", TARGETS)
def test_attention_varlen_f16_and_strided_heads(target) -> None:  # type: ignore[no-untyped-def]
    """f16, and q, k, v as slices of one packed (total, 3, H, D) projection (strided rows)."""
    if target is None:
        hopper()
    qkv = torch.randn(777, 3, 8, 128, device="cuda", dtype=torch.float16)
    q, k, v = qkv.unbind(1)
    cu = offsets([500, 277])
    out = attention_varlen(q, k, v, cu, causal=True, target=target)
    assert out.dtype == torch.float16
    assert rel_err(out, reference(q, k, v, cu, cu, True, 1 / math.sqrt(128))) < 1e-2


@pytest.mark.parametrize("causal", [False, True])
def test_attention_varlen_of_equal_lengths_is_attention(causal) -> None:  # type: ignore[no-untyped-def]
    """Sequences of one length packed: the same rows as attention() on the (B, H, N, D) batch (within bf16's rounding
    of two kernels' sums)."""
    from tkc.kernels import attention

    q, k, v = (torch.randn(4, 1024, 8, 128, device="cuda").to(torch.bfloat16) for _ in range(3))
    cu = offsets([1024] * 4)
    packed = attention_varlen(q.reshape(-1, 8, 128), k.reshape(-1, 8, 128), v.reshape(-1, 8, 128), cu, causal=causal)
    dense = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal).transpose(1, 2)
    assert rel_err(packed.view(4, 1024, 8, 128), dense) < 5e-3
