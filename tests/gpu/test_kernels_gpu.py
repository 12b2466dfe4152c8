"""The kernels on a CUDA GPU, through PTX tkc generated and cuda-python loaded, against float32/float64 torch
references: fresh random inputs every check, outputs poisoned with NaN first, many shapes (non-square ones, and
B·H above the number of multiprocessors). Run with: pytest -m gpu tests/gpu (they skip without a GPU)."""

from __future__ import annotations

import importlib
import math
import re

import pytest

torch = pytest.importorskip("torch")

import tkc  # noqa: E402
from tkc.kernels import attention, gemm, layernorm  # noqa: E402
from tkc.lang import atomic_add, block_idx, cdiv, f32, gl, load, rt, warp_id  # noqa: E402

pytestmark = pytest.mark.gpu
TARGETS = ["sm_80", None]  # the sm_80 code path, and the best for this GPU


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return math.inf
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, device="cuda", dtype=torch.float32) * scale).to(torch.bfloat16)


def poisoned_like(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)


GEMM_SHAPES = [(128, 128, 128), (256, 512, 128), (1000, 1000, 1000), (4095, 4097, 1023), (4096, 4096, 16),
               (1, 1, 1), (17, 33, 65), (3000, 200, 700), (200, 3000, 70), (2048, 1024, 4096), (513, 257, 129),
               (64, 8192, 256)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("m, n, k", GEMM_SHAPES)
def test_gemm(m: int, n: int, k: int, target: str | None) -> None:
    a, b = randn(m, k), randn(k, n)
    out = poisoned_like((m, n))
    gemm(a, b, out=out, target=target)
    ref = a.float() @ b.float()
    assert rel_err(out, ref) < 1e-2


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("m, n, k", [(1000, 1000, 1000), (17, 33, 65), (16, 4096, 4096), (3000, 200, 700)])
def test_gemm_f16(m: int, n: int, k: int, trans_b: bool, target: str | None) -> None:
    """f16 operands: an f16 product from the same kernels (DT=f16), twice (the second call through the common
    call's plan, which must not take the bf16 one)."""
    for _ in range(2):
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(*((n, k) if trans_b else (k, n)), device="cuda", dtype=torch.float16)
        out = gemm(a, b, trans_b=trans_b, target=target)
        assert out.dtype == torch.float16
        assert rel_err(out, a.float() @ (b.float().t() if trans_b else b.float())) < 2e-3
    gemm(randn(m, k), randn(*((n, k) if trans_b else (k, n))), trans_b=trans_b, target=target)  # bf16 still


@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("m, n, k", [(16, 4096, 4096), (1, 8192, 8192), (32, 1000, 3000), (24, 520, 2048),
                                     (9, 136, 65536)])
def test_gemm_split_along_k(m: int, n: int, k: int, trans_b: bool) -> None:
    """A few rows and a long K: gemm() swaps the operands' roles (B read transposed without trans_b) and splits K
    into runs (f32 partial sums, then their sum), twice (the second call through the common call's plan), into a
    given out."""
    from tkc.kernels.gemm import launch_choice

    assert launch_choice(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count)[0] != "tiles"
    for _ in range(2):
        a, b = randn(m, k), (randn(n, k) if trans_b else randn(k, n))
        out = poisoned_like((m, n))
        gemm(a, b, trans_b=trans_b, out=out)
        ref = a.float() @ (b.float().t() if trans_b else b.float())
        assert rel_err(out, ref) < 1e-2


def test_gemm_few_rows_odd_layouts() -> None:
    """The few-rows path on rows of a wider a (row pitch above K), a column-major b (read as trans_b) and an out
    that is a slice of a wider tensor."""
    m, n, k = 16, 1000, 4096
    wide_a = randn(m, k + 64)
    a, bt = wide_a[:, :k], randn(n, k)
    wide_out = poisoned_like((m, n + 24))
    out = wide_out[:, :n]
    gemm(a, bt.t(), out=out)
    assert rel_err(out, a.float() @ bt.float().t()) < 1e-2
    assert wide_out[:, n:].isnan().all()  # nothing written past out's columns


@pytest.mark.parametrize("target", TARGETS)
def test_gemm_empty_k(target: str | None) -> None:
    """K = 0: a sum of nothing (the loop over K runs no steps; TMA maps of empty tensors are never used)."""
    out = poisoned_like((64, 80))
    gemm(randn(64, 0), randn(0, 80), out=out, target=target)
    assert (out == 0).all()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("m, n, k", [(512, 384, 256), (1000, 999, 1001), (4096, 4096, 4096), (1000, 1000, 1000)])
def test_gemm_trans_b_and_column_major_b(m: int, n: int, k: int, target: str | None) -> None:
    a, bt = randn(m, k), randn(n, k)
    ref = a.float() @ bt.float().t()
    assert rel_err(gemm(a, bt, trans_b=True, target=target), ref) < 1e-2
    assert rel_err(gemm(a, bt.t(), target=target), ref) < 1e-2  # a column-major b


ATTENTION_SHAPES = [(1, 1, 64, 64), (2, 3, 128, 64), (1, 16, 1024, 128), (4, 8, 512, 64), (2, 80, 256, 128),
                    (1, 2, 2048, 64), (1, 1, 4096, 128), (3, 5, 192, 128), (8, 40, 128, 64), (1, 4, 1024, 64)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b, h, n, d", ATTENTION_SHAPES)
def test_attention(b: int, h: int, n: int, d: int, causal: bool) -> None:
    q, k, v = (randn(b, h, n, d) for _ in range(3))
    out = poisoned_like((b, h, n, d))
    attention(q, k, v, causal=causal, out=out, target="sm_80")
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    assert rel_err(out, ref) < 1e-2


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("d, rows, keys, q_in_shared", [(64, 32, 64, 0), (64, 16, 32, 0), (128, 32, 32, 1),
                                                        (128, 16, 32, 1), (128, 16, 64, 1)])
def test_attention_configurations(d: int, rows: int, keys: int, q_in_shared: int, causal: int) -> None:
    from tkc.kernels import attention_fwd

    b, h, n = 2, 3, 512
    q, k, v = (randn(b, h, n, d) for _ in range(3))
    out = poisoned_like((b, h, n, d))
    attention_fwd[(n // (4 * rows), h, b)](q, k, v, out, d**-0.5, D=d, CAUSAL=causal, ROWS=rows, KEYS=keys,
                                           Q_IN_SHARED=q_in_shared, target="sm_80")
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=bool(causal))
    assert rel_err(out, ref) < 1e-2


def test_resident_blocks_is_what_the_occupancy_calculator_says() -> None:
    from tkc.kernels import gemm_kernel

    a = randn(256, 256)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blocks = gemm_kernel.resident_blocks(a, a, a, target="sm_80", BM=128, BN=128, BK=64, WARPS=4, WARPS_N=2, STAGES=3)
    assert blocks % sms == 0 and 1 <= blocks // sms <= 4  # 96 KB of shared memory and ~200 registers a thread


def test_attention_scale_and_unequal_lengths() -> None:
    q, k, v = randn(2, 4, 256, 64), randn(2, 4, 640, 64), randn(2, 4, 640, 64)
    out = attention(q, k, v, scale=0.05)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.05)
    assert rel_err(out, ref) < 1e-2


LAYERNORM_SHAPES = [(1, 16), (7, 48), (1000, 1024), (4096, 4096), (3, 5, 768), (10000, 256), (128, 8192),
                    (257, 2048), (64, 4096), (2, 12288), (3000, 3072)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", LAYERNORM_SHAPES)
def test_layernorm(shape: tuple[int, ...], target: str | None) -> None:
    d = shape[-1]
    x, r = randn(*shape), randn(*shape)
    w, b = randn(d), randn(d)
    out, out_resid = poisoned_like(shape), poisoned_like(shape)
    layernorm(x, r, w, b, eps=1e-5, out=out, residual_out=out_resid, target=target)
    s = x.float() + r.float()
    ref = torch.nn.functional.layer_norm(s, (d,), w.float(), b.float(), eps=1e-5)
    assert rel_err(out_resid, s) < 1e-2
    assert rel_err(out, ref) < 1e-2


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", LAYERNORM_SHAPES)
def test_rmsnorm_and_norms_without_residual(shape: tuple[int, ...], target: str | None) -> None:
    """rmsnorm() with and without the residual, and layernorm() without it, against float32 torch (F.rms_norm,
    F.layer_norm); without a residual the second output is x itself. Each call twice (the common call's plan)."""
    from tkc.kernels import rmsnorm

    d = shape[-1]
    x, r, w, b = randn(*shape), randn(*shape), randn(d), randn(d)
    s = x.float() + r.float()
    for _ in range(2):
        out, out_resid = poisoned_like(shape), poisoned_like(shape)
        rmsnorm(x, r, w, eps=1e-6, out=out, residual_out=out_resid, target=target)
        assert rel_err(out_resid, s) < 1e-2
        assert rel_err(out, torch.nn.functional.rms_norm(s, (d,), w.float(), eps=1e-6)) < 1e-2
        out = poisoned_like(shape)
        y, same = rmsnorm(x, None, w, out=out, target=target)
        assert same is x and y is out
        assert rel_err(out, torch.nn.functional.rms_norm(x.float(), (d,), w.float(), eps=1e-6)) < 1e-2
        out = poisoned_like(shape)
        y, same = layernorm(x, None, w, b, out=out, target=target)
        assert same is x and rel_err(out, torch.nn.functional.layer_norm(x.float(), (d,), w.float(), b.float())) < 1e-2


def rotary_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, offset: int = 0,
                     interleaved: bool = False, positions: torch.Tensor | None = None) -> torch.Tensor:
    """float64 rotate-half (Hugging Face's rotate_half / apply_rotary_pos_emb on the first R columns), or the
    interleaved pairs (2i, 2i + 1) of GPT-J; rows `offset` + n of cos and sin, or rows positions[n] (positions (N,),
    or (B, N) for x (B, H, N, D))."""
    n, half = x.shape[-2], cos.shape[-1]
    if positions is None:
        c, s = cos[offset:offset + n].double(), sin[offset:offset + n].double()
    else:
        where = positions.long()[:, None] if positions.dim() == 2 else positions.long()  # (B, 1, N): all heads
        c, s = cos[where].double(), sin[where].double()
    x = x.double()
    rest = x[..., 2 * half:]
    if interleaved:
        x1, x2 = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        turned = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
        return torch.cat((turned, rest), dim=-1)
    x1, x2 = x[..., :half], x[..., half:2 * half]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s, rest), dim=-1)


def rotary_tables(positions: int, rotated: int, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (positions, rotated/2) of LLaMA's frequencies, 10000^(-2i/R)."""
    inv_freq = 10000.0 ** (-torch.arange(0, rotated, 2, device="cuda", dtype=torch.float64) / rotated)
    angles = torch.arange(positions, device="cuda", dtype=torch.float64)[:, None] * inv_freq
    return angles.cos().to(dtype), angles.sin().to(dtype)


ROTARY_CASES = [  # (B, H, N, D), R, (B, N, H, D) seen transposed, cos dtype, offset
    ((1, 32, 4096, 128), 128, False, torch.float32, 0), ((4, 8, 1000, 64), 64, True, torch.float32, 0),
    ((2, 12, 513, 128), 64, False, torch.bfloat16, 7), ((1, 1, 1, 128), 128, True, torch.float32, 4095),
    ((3, 5, 77, 96), 32, False, torch.float32, 0), ((8, 40, 128, 128), 128, True, torch.float32, 100),
    ((2, 7, 300, 256), 256, False, torch.float32, 0), ((16, 16, 64, 64), 32, True, torch.bfloat16, 0),
    ((1, 64, 2048, 128), 128, False, torch.bfloat16, 2048), ((5, 3, 33, 160), 96, True, torch.float32, 1),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape, rotated, bshd, cos_dtype, offset", ROTARY_CASES)
def test_rotary(shape, rotated, bshd, cos_dtype, offset, target) -> None:
    """rotary() against float64 rotate-half: (B, H, N, D) and (B, N, H, D) seen transposed (its output in x's
    layout), partial rotary, float32 and bf16 cos / sin, position offsets; then in place (out=x), and the conjugate
    turn undoing it."""
    from tkc.kernels import rotary

    b, h, n, d = shape
    x = randn(b, n, h, d).transpose(1, 2) if bshd else randn(*shape)
    cos, sin = rotary_tables(offset + n + 3, rotated, cos_dtype)
    ref = rotary_reference(x, cos, sin, offset)
    out = poisoned_like(shape).transpose(1, 2).contiguous().transpose(1, 2) if bshd else poisoned_like(shape)
    assert rotary(x, cos, sin, offset=offset, out=out, target=target) is out
    assert rel_err(out, ref) < 1e-2
    fresh = rotary(x, cos, sin, offset=offset, target=target)
    assert fresh.stride() == x.stride() and rel_err(fresh, ref) < 1e-2
    back = rotary(out, cos, sin, offset=offset, conjugate=True, target=target)
    assert rel_err(back, x) < 1e-2
    y = x.clone()
    rotary(y, cos, sin, offset=offset, out=y, target=target)
    assert rel_err(y, ref) < 1e-2 and torch.equal(y[..., rotated:], x[..., rotated:])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape, rotated, bshd, cos_dtype, offset", ROTARY_CASES[::2])
def test_rotary_interleaved(shape, rotated, bshd, cos_dtype, offset, target) -> None:
    """interleaved=True (GPT-J's pairs of adjacent columns) against float64, out of place and in place, undone by
    the conjugate turn."""
    from tkc.kernels import rotary

    b, h, n, d = shape
    x = randn(b, n, h, d).transpose(1, 2) if bshd else randn(*shape)
    cos, sin = rotary_tables(offset + n + 3, rotated, cos_dtype)
    ref = rotary_reference(x, cos, sin, offset, interleaved=True)
    out = rotary(x, cos, sin, offset=offset, interleaved=True, target=target)
    assert rel_err(out, ref) < 1e-2
    back = rotary(out, cos, sin, offset=offset, interleaved=True, conjugate=True, target=target)
    assert rel_err(back, x) < 1e-2
    y = x.clone()
    rotary(y, cos, sin, offset=offset, interleaved=True, out=y, target=target)
    assert rel_err(y, ref) < 1e-2


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_rotary_positions(index_dtype, interleaved, target) -> None:
    """positions=: vLLM's tokens (T, H, D) seen as (H, T, D) with a position a token, from a table shorter than the
    tokens; Hugging Face's (B, N, H, D) with position_ids (B, N) (a view of wider rows); rotary_qk with them; the
    gradient with them (the conjugate turn at the same positions)."""
    from tkc.kernels import rotary, rotary_qk

    cos, sin = rotary_tables(3000, 128)
    tokens = randn(5000, 8, 128)
    positions = torch.randint(0, 3000, (5000,), device="cuda", dtype=index_dtype)
    x = tokens.transpose(0, 1)
    ref = rotary_reference(x, cos, sin, interleaved=interleaved, positions=positions)
    assert rel_err(rotary(x, cos, sin, positions=positions, interleaved=interleaved, target=target), ref) < 1e-2
    b, n, h = 3, 700, 12
    x4 = randn(b, n, h, 128).transpose(1, 2)
    ids = torch.randint(0, 3000, (b, n + 50), device="cuda", dtype=index_dtype)[:, 25:25 + n]
    ref4 = rotary_reference(x4, cos, sin, interleaved=interleaved, positions=ids)
    assert rel_err(rotary(x4, cos, sin, positions=ids, interleaved=interleaved, target=target), ref4) < 1e-2
    k4 = randn(b, n, 4, 128).transpose(1, 2)
    q_out, k_out = rotary_qk(x4, k4, cos, sin, positions=ids, interleaved=interleaved, target=target)
    assert rel_err(q_out, ref4) < 1e-2
    assert rel_err(k_out, rotary_reference(k4, cos, sin, interleaved=interleaved, positions=ids)) < 1e-2
    xg = x4.detach().requires_grad_()
    grad = randn(*x4.shape)
    rotary(xg, cos, sin, positions=ids, interleaved=interleaved, target=target).backward(grad)
    xr = x4.detach().double().requires_grad_()
    rotary_reference(xr, cos, sin, interleaved=interleaved, positions=ids).backward(grad.double())
    assert rel_err(xg.grad, xr.grad) < 1e-2


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("b, hq, hk, n, d, rotated, offset",
                         [(1, 32, 8, 1, 128, 128, 4095), (2, 12, 12, 513, 128, 64, 3), (4, 16, 2, 300, 64, 64, 0)])
def test_rotary_qk(b, hq, hk, n, d, rotated, offset, interleaved, target) -> None:
    """rotary_qk(q, k): q and k (fewer heads) of (B, N, H, D) layout turned in one launch, as rotary() turns each;
    then in place; and on inputs requiring grad (two rotary() calls, each with its gradient)."""
    from tkc.kernels import rotary_qk

    q, k = randn(b, n, hq, d).transpose(1, 2), randn(b, n, hk, d).transpose(1, 2)
    cos, sin = rotary_tables(offset + n, rotated)
    q_out, k_out = rotary_qk(q, k, cos, sin, offset=offset, interleaved=interleaved, target=target)
    assert rel_err(q_out, rotary_reference(q, cos, sin, offset, interleaved)) < 1e-2
    assert rel_err(k_out, rotary_reference(k, cos, sin, offset, interleaved)) < 1e-2
    q2, k2 = q.clone(), k.clone()
    assert rotary_qk(q2, k2, cos, sin, offset=offset, interleaved=interleaved, inplace=True, target=target) == (q2, k2)
    assert rel_err(q2, q_out) < 1e-3 and rel_err(k2, k_out) < 1e-3
    qg, kg = q.detach().requires_grad_(), k.detach().requires_grad_()
    a, c = rotary_qk(qg, kg, cos, sin, offset=offset, interleaved=interleaved, target=target)
    (a.float().sum() + c.float().sum()).backward()
    assert qg.grad is not None and kg.grad is not None


@pytest.mark.parametrize("target", TARGETS)
def test_rotary_f16_and_gradient(target) -> None:
    """f16 rows; and x requiring grad: rotary() is torch.ops.tkc.rotary, whose gradient (the conjugate turn) matches
    float64 autograd through the reference; under torch.compile one opaque op."""
    from tkc.kernels import rotary

    x = torch.randn(2, 6, 200, 128, device="cuda", dtype=torch.float16)
    cos, sin = rotary_tables(200, 128)
    assert rotary(x, cos, sin, target=target).dtype == torch.float16
    assert rel_err(rotary(x, cos, sin, target=target), rotary_reference(x, cos, sin)) < 1e-3
    x = randn(2, 6, 200, 128).requires_grad_()
    grad = randn(2, 6, 200, 128)
    for pairs in (False, True):
        (got,) = torch.autograd.grad((rotary(x, cos, sin, interleaved=pairs, target=target).float() * grad).sum(), x)
        x64 = x.detach().double().requires_grad_()
        (want,) = torch.autograd.grad((rotary_reference(x64, cos, sin, interleaved=pairs) * grad.double()).sum(), x64)
        assert rel_err(got, want) < 1e-2
    compiled = torch.compile(lambda t: rotary(t, cos, sin, target=target), fullgraph=True)
    assert rel_err(compiled(x.detach()), rotary_reference(x.detach(), cos, sin)) < 1e-2


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("shape", [(4096, 1024), (3, 100, 768), (2000, 4096), (1, 8192), (50000, 64), (7, 2048)])
def test_norm_backward(shape: tuple[int, ...], rms: bool, target: str | None) -> None:
    """layernorm() / rmsnorm() on inputs requiring grad, a loss on the output and on the new residual: the
    gradients of x, the residual, weight and bias (layernorm_bwd_kernel, then the column sums) against float32
    autograd through torch's own norms."""
    from tkc.kernels import rmsnorm

    d = shape[-1]
    x, r, w, b = (t.requires_grad_() for t in (randn(*shape), randn(*shape), randn(d), randn(d)))
    grad, grad_s = randn(*shape), randn(*shape)
    y, s = rmsnorm(x, r, w, target=target) if rms else layernorm(x, r, w, b, target=target)
    got = torch.autograd.grad((y.float() * grad).sum() + (s.float() * grad_s).sum(), (x, r, w) if rms else (x, r, w, b))
    leaves = [t.detach().float().requires_grad_() for t in (x, r, w, b)]
    s_ref = leaves[0] + leaves[1]
    y_ref = (torch.nn.functional.rms_norm(s_ref, (d,), leaves[2], 1e-6) if rms
             else torch.nn.functional.layer_norm(s_ref, (d,), leaves[2], leaves[3], 1e-5))
    refs = torch.autograd.grad((y_ref * grad.float()).sum() + (s_ref * grad_s.float()).sum(), leaves[:len(got)])
    for name, g, ref in zip(("x", "residual", "weight", "bias"), got, refs):
        assert g.shape == ref.shape and rel_err(g, ref) < 1e-2, f"d{name}"


@pytest.mark.parametrize("target", TARGETS)
def test_f16_attention_and_layernorm(target: str | None) -> None:
    """f16 tensors through attention (causal and not, with the log-sum-exp; the common call twice; its backward)
    and layernorm: f16 outputs and gradients against float32 references."""
    h16 = torch.float16
    for causal in (False, True):
        for d in (64, 128):
            q, k, v = (torch.randn(2, 3, 512, d, device="cuda", dtype=h16) for _ in range(3))
            ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
            for _ in range(2):
                out = attention(q, k, v, causal=causal, target=target)
                assert out.dtype == h16 and rel_err(out, ref) < 5e-3
            out, lse = attention(q, k, v, causal=causal, target=target, return_lse=True)
            assert rel_err(out, ref) < 5e-3
    x, r, w, b = (torch.randn(*s, device="cuda", dtype=h16) for s in ((1000, 1024), (1000, 1024), (1024,), (1024,)))
    for _ in range(2):
        y, s = layernorm(x, r, w, b, target=target)
        ref = torch.nn.functional.layer_norm(x.float() + r.float(), (1024,), w.float(), b.float(), eps=1e-5)
        assert y.dtype == h16 and rel_err(y, ref) < 5e-3 and rel_err(s, x.float() + r.float()) < 1e-3
    q, k, v = (torch.randn(2, 3, 320, 64, device="cuda", dtype=h16).requires_grad_() for _ in range(3))
    grad = torch.randn_like(q)
    got = torch.autograd.grad(attention(q, k, v, causal=True, target=target), (q, k, v), grad)
    want = attention_grads_ref(q, k, v, grad, causal=True)
    for g, w in zip(got, want):
        assert g.dtype == h16 and rel_err(g, w) < 5e-3


@pytest.mark.parametrize("dependent_launch", [False, True])
def test_back_to_back_kernels_read_what_the_one_before_wrote(dependent_launch: bool,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain of calls, each reading the outputs of the one before, queued without a pause, also with programmatic
    dependent launch (TKC_DEPENDENT_LAUNCH=1 on Hopper; the first layernorm right behind a GEMM that lets it start
    early): a kernel that read before its predecessor finished would read the NaN the outputs were poisoned with.
    Each step is checked against torch on that step's own inputs."""
    from tkc.runtime import driver

    monkeypatch.setattr(driver, "DEPENDENT_LAUNCH", dependent_launch)
    d = 1024
    w, b = randn(d), randn(d)
    h, proj = randn(4096, 2048), randn(2048, d)
    x, r = poisoned_like((4096, d)), randn(4096, d)
    gemm(h, proj, out=x)
    steps = [(x, r)]
    for _ in range(24):
        out, out_resid = poisoned_like((4096, d)), poisoned_like((4096, d))
        steps.append(layernorm(*steps[-1], w, b, out=out, residual_out=out_resid))
    q = randn(2, 16, 1024, 128)
    chain = [q]
    for _ in range(8):
        chain.append(attention(chain[-1], chain[-1], chain[-1], causal=True))
    torch.cuda.synchronize()
    assert rel_err(x, h.float() @ proj.float()) < 1e-2
    for (x, r), (out, out_resid) in zip(steps, steps[1:]):
        s = x.float() + r.float()
        assert rel_err(out_resid, s) < 1e-2
        assert rel_err(out, torch.nn.functional.layer_norm(s, (d,), w.float(), b.float(), eps=1e-5)) < 1e-2
    for q, out in zip(chain, chain[1:]):
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), q.float(), q.float(), is_causal=True)
        assert rel_err(out, ref) < 1e-2


def test_kernels_never_call_torch_compute(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a tkc kernel called torch's own implementation")

    a, b = randn(256, 256), randn(256, 256)
    q, k, v = (randn(1, 2, 128, 64) for _ in range(3))
    x, w = randn(8, 256), randn(256)
    refs = (a.float() @ b.float(),
            torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float()),
            torch.nn.functional.layer_norm(x.float() + x.float(), (256,), w.float(), w.float()))
    for name in ("matmul", "mm", "bmm", "addmm", "layer_norm"):
        monkeypatch.setattr(torch, name, refuse, raising=False)
    for name in ("scaled_dot_product_attention", "layer_norm", "linear"):
        monkeypatch.setattr(torch.nn.functional, name, refuse)
    monkeypatch.setattr(torch.Tensor, "__matmul__", refuse)
    assert rel_err(gemm(a, b), refs[0]) < 1e-2
    assert rel_err(attention(q, k, v), refs[1]) < 1e-2
    assert rel_err(layernorm(x, x, w, w)[0], refs[2]) < 1e-2


def test_compiled_calls_match_eager_ones() -> None:
    """Under torch.compile each entry point is one torch.ops.tkc op running the eager call: the same answers, and
    each op's fake (shapes, strides, dtypes) agrees with its real output (torch.library.opcheck)."""
    x, r, w, b = randn(256, 512), randn(256, 512), randn(512), randn(512)
    weight = randn(384, 512)
    q, k, v = (randn(2, 4, 256, 64) for _ in range(3))

    def block():
        y, s = layernorm(x, r, w, b)
        o, lse = attention(q, k, v, causal=True, return_lse=True)
        return y, s, gemm(y, weight, trans_b=True), o, lse, attention(q, k, v)

    eager = block()
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)()
    for e, c in zip(eager, compiled, strict=True):
        assert e.shape == c.shape and e.stride() == c.stride() and rel_err(c, e) < 1e-6
    from tkc.kernels import torch_ops  # noqa: F401  (registers torch.ops.tkc.*)

    for op, args in ((torch.ops.tkc.gemm, (x, weight, True, None)), (torch.ops.tkc.attention, (q, k, v, True, None, None)),
                     (torch.ops.tkc.attention_lse, (q, k, v, False, 0.1, None)),
                     (torch.ops.tkc.layernorm, (x, r, w, b, 1e-5, None))):
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("trans_b", [False, True])
def test_gemm_backward(trans_b: bool) -> None:
    """gemm() on inputs requiring grad goes through torch.ops.tkc.gemm, whose backward is two tkc GEMMs."""
    a = randn(300, 200).requires_grad_()
    b = (randn(100, 200) if trans_b else randn(200, 100)).requires_grad_()
    grad = randn(300, 100)
    gemm(a, b, trans_b=trans_b).backward(grad)
    bf = b.detach().float()
    assert rel_err(a.grad, grad.float() @ (bf if trans_b else bf.t())) < 1e-2
    ref_b = grad.float().t() @ a.detach().float() if trans_b else a.detach().float().t() @ grad.float()
    assert rel_err(b.grad, ref_b) < 1e-2


def _backward(nq: int = 64, nk: int | None = None, causal: bool = False, grad_shape: tuple[int, ...] | None = None,
              lse_dtype: torch.dtype = torch.float32):
    """attention_backward on small random operands, one of them wrong."""
    from tkc.kernels import attention_backward

    nk = nq if nk is None else nk
    q, k, v = randn(1, 1, nq, 64), randn(1, 1, nk, 64), randn(1, 1, nk, 64)
    grad = randn(*(grad_shape or q.shape))
    lse = torch.zeros(1, 1, nq, device="cuda", dtype=lse_dtype)
    return attention_backward(q, k, v, torch.zeros_like(q), grad, lse, causal=causal)


@pytest.mark.parametrize("call, error, words", [
    (lambda: gemm(torch.ones(4, 4, dtype=torch.bfloat16), randn(4, 4)), ValueError, ["a is on cpu"]),
    (lambda: gemm(randn(4, 4).float(), randn(4, 4)), ValueError, ["a must be torch.bfloat16"]),
    (lambda: gemm(randn(4, 4), randn(5, 4)), ValueError, ["b:", "4x4"]),
    (lambda: gemm(randn(4, 4, 4), randn(4, 4)), ValueError, ["a must have 2 dimensions"]),
    (lambda: gemm(randn(8, 8)[:, ::2], randn(4, 4)), ValueError, ["a: its last dimension must be contiguous"]),
    (lambda: attention(randn(1, 1, 100, 64), randn(1, 1, 100, 64), randn(1, 1, 100, 64), target="sm_80"), ValueError,
     ["multiples of 64"]),
    (lambda: attention(*(randn(1, 1, 64, 68)[..., :64] for _ in range(3)), target="sm_90a"), ValueError,
     ["q:", "multiples of 8 elements"]),
    (lambda: attention(randn(1, 1, 64, 64), randn(1, 1, 0, 64), randn(1, 1, 0, 64), target="sm_90a"), ValueError,
     ["at least one key"]),
    (lambda: attention(randn(1, 1, 64, 80), randn(1, 1, 64, 80), randn(1, 1, 64, 80)), ValueError,
     ["head dim must be 32, 64, 96, 128 or 256, got 80"]),
    (lambda: _backward(nq=64, nk=128, causal=True), ValueError, ["causal", "Nq = Nk"]),
    (lambda: _backward(grad_shape=(1, 1, 64, 128)), ValueError, ["grad_out: expected the shape of q"]),
    (lambda: _backward(lse_dtype=torch.bfloat16), ValueError, ["lse must be torch.float32"]),
    (lambda: layernorm(randn(4, 40), randn(4, 40), randn(40), randn(40)), ValueError, ["multiple of 16"]),
    (lambda: layernorm(randn(4, 64), randn(4, 64), randn(32), randn(64)), ValueError, ["weight", "(64,)", "(32,)"]),
    (lambda: layernorm(randn(4, 64), randn(4, 64).float(), randn(64), randn(64)), ValueError,
     ["residual must be torch.bfloat16"]),  # through layernorm()'s common path, refused by the launch's reader
    (lambda: layernorm(randn(4, 64), randn(4, 64), randn(64), randn(64), out=randn(4, 128)[:, ::2]), ValueError,
     ["last dimension must be contiguous"]),
])
def test_bad_arguments_are_clear_errors(call, error, words) -> None:
    with pytest.raises(error) as info:
        call()
    for word in words:
        assert word in str(info.value)


def test_launch_checks_arguments() -> None:
    from tkc.kernels import gemm_kernel

    a = randn(64, 64)
    with pytest.raises(TypeError, match="takes 3 arguments"):
        gemm_kernel[(1, 1)](a, a)
    with pytest.raises(ValueError, match="argument `B` must be torch.bfloat16"):
        gemm_kernel[(1, 1)](a, a.float(), a)
    with pytest.raises(ValueError, match="grid dimension y must be between 1 and 65535"):
        gemm_kernel[(1, 70000)](a, a, a)
    with pytest.raises(tkc.TkcError, match="no constant named"):
        gemm_kernel[(1, 1)](a, a, a, NOPE=1)


def attention_grads_ref(q, k, v, grad, causal: bool, scale: float | None = None, grad_lse=None):
    """dq, dk, dv of softmax(scale·q·kᵀ)·v in float64 (and through its log-sum-exp with grad_lse), by torch's
    autograd on the math formula; k and v of fewer heads than q are repeated for their query heads (grouped-query
    attention), so their gradients sum over them."""
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    keys, values = (t.repeat_interleave(q.shape[1] // k.shape[1], 1) for t in leaves[1:])
    s = leaves[0] @ keys.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), -math.inf)
    out = torch.softmax(s, -1) @ values
    outputs, grads = [out], [grad.double()]
    if grad_lse is not None:
        outputs.append(torch.logsumexp(s, -1))
        grads.append(grad_lse.double())
    return torch.autograd.grad(outputs, leaves, grads)


# (B, H, N, D): B·H above the SM count, non-square blocks of keys and queries
ATTENTION_BACKWARD_SHAPES = [(1, 1, 64, 64), (2, 3, 192, 64), (1, 2, 512, 128), (4, 4, 256, 128), (2, 80, 128, 64),
                             (1, 1, 1024, 64), (3, 2, 320, 128), (2, 2, 2048, 128), (1, 140, 64, 128),
                             (1, 4, 4096, 64)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b, h, n, d", ATTENTION_BACKWARD_SHAPES)
def test_attention_backward(b: int, h: int, n: int, d: int, causal: bool, target: str | None) -> None:
    """attention() on inputs requiring grad: its forward keeps the log-sum-exp, autograd's backward is tkc's
    (attention_bwd_delta, _dkdv, _dq); the gradients against float64."""
    q, k, v = (randn(b, h, n, d).requires_grad_() for _ in range(3))
    grad = randn(b, h, n, d)
    out = attention(q, k, v, causal=causal, target=target)
    grads = torch.autograd.grad(out, (q, k, v), grad)
    for name, got, ref in zip("qkv", grads, attention_grads_ref(q, k, v, grad, causal)):
        assert rel_err(got, ref) < 1e-2, f"d{name}"


@pytest.mark.parametrize("target", [*TARGETS, "sm_90a"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b, h, n, d", [(2, 3, 256, 32), (1, 4, 512, 96), (3, 2, 192, 96), (1, 140, 64, 32)])
def test_attention_head_dims_32_and_96(b: int, h: int, n: int, d: int, causal: bool, target: str | None) -> None:
    """D = 32 and 96 (D = 32 the sm_80 kernels on every GPU; D = 96 the wgmma kernels on Hopper): the forward, its
    log-sum-exp and autograd's backward against float64; target="sm_90a" at D = 32 is one clear error."""
    q, k, v = (randn(b, h, n, d).requires_grad_() for _ in range(3))
    grad = randn(b, h, n, d)
    if target == "sm_90a" and d == 32:
        with pytest.raises(ValueError, match="target sm_90a's kernels take head dims 64, 96, 128 and 256"):
            attention(q.detach(), k.detach(), v.detach(), causal=causal, target=target)
        return
    if target == "sm_90a" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a needs Hopper")
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    out, lse = attention(q.detach(), k.detach(), v.detach(), causal=causal, target=target, return_lse=True)
    assert rel_err(out, ref) < 1e-2
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device="cuda").triu(1), -math.inf)
    assert (lse.double() - torch.logsumexp(s, -1)).abs().max().item() < 1e-3
    grads = torch.autograd.grad(attention(q, k, v, causal=causal, target=target), (q, k, v), grad)
    for name, got, want in zip("qkv", grads, attention_grads_ref(q, k, v, grad, causal)):
        assert rel_err(got, want) < 1e-2, f"d{name}"


@pytest.mark.parametrize("target", [*TARGETS, "sm_90a"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b, h, kv_heads, n, d", [(2, 3, 3, 256, 256), (1, 4, 4, 512, 256), (3, 2, 2, 192, 256),
                                                  (1, 140, 140, 64, 256), (2, 8, 2, 320, 256)])
def test_attention_head_dim_256(b: int, h: int, kv_heads: int, n: int, d: int, causal: bool,
                                target: str | None) -> None:
    """D = 256 (the wgmma kernels on Hopper, the sm_80 ones with target="sm_80"): the output and its log-sum-exp
    against float64, grouped-query heads too, and autograd's backward (dK and dV in halves; on the sm_80 path dQ
    too) against float64."""
    hopper = torch.cuda.get_device_capability() == (9, 0)
    if target == "sm_90a" and not hopper:
        pytest.skip("sm_90a needs Hopper")
    q = randn(b, h, n, d)
    k, v = (randn(b, kv_heads, n, d) for _ in range(2))
    group = h // kv_heads
    kr, vr = (t.double().repeat_interleave(group, 1) for t in (k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), kr, vr, is_causal=causal)
    out = poisoned_like((b, h, n, d))
    got, lse = attention(q, k, v, causal=causal, target=target, out=out, return_lse=True)
    assert got is out and rel_err(out, ref) < 1e-2
    s = q.double() @ kr.transpose(-1, -2) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device="cuda").triu(1), -math.inf)
    assert (lse.double() - torch.logsumexp(s, -1)).abs().max().item() < 1e-3
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    grad = randn(b, h, n, d)
    grads = torch.autograd.grad(attention(q, k, v, causal=causal, target=target), (q, k, v), grad)
    for name, got, want in zip("qkv", grads, attention_grads_ref(q, k, v, grad, causal)):
        assert rel_err(got, want) < 1e-2, f"d{name}"


@pytest.mark.parametrize("causal", [False, True])
def test_attention_head_dim_256_as_on_a_card_of_99_kb(causal: bool, monkeypatch) -> None:
    """D = 256's sm_80 kernels as attention() runs them on a card of 99 KB of shared memory a block (sm_86 / sm_89:
    the forward and dK/dV in two stages, sm80_stages), here told the card has 99 KB: output, log-sum-exp and
    gradients against float64, with more steps than stages."""
    from tkc.kernels import _checks

    monkeypatch.setitem(_checks.SHARED_MEMORY_LIMITS, torch.cuda.current_device(), 101376)
    b, h, n, d = 2, 3, 320, 256
    q, k, v = (randn(b, h, n, d) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    out = poisoned_like((b, h, n, d))
    assert attention(q, k, v, causal=causal, target="sm_80", out=out) is out and rel_err(out, ref) < 1e-2
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    grad = randn(b, h, n, d)
    grads = torch.autograd.grad(attention(q, k, v, causal=causal, target="sm_80"), (q, k, v), grad)
    for name, got, want in zip("qkv", grads, attention_grads_ref(q, k, v, grad, causal)):
        assert rel_err(got, want) < 1e-2, f"d{name}"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_backward_unequal_lengths_scale_and_lse(causal: bool, target: str | None) -> None:
    """Nk ≠ Nq (not causal), a scale, and a gradient through the log-sum-exp too, on attention_backward itself;
    the forward's log-sum-exp (attention_fwd_lse on the sm_80 path) against float64."""
    from tkc.kernels import attention_backward

    nq, nk = (384, 384) if causal else (192, 640)
    q, k, v = randn(2, 3, nq, 64), randn(2, 3, nk, 64), randn(2, 3, nk, 64)
    grad, grad_lse = randn(2, 3, nq, 64), torch.randn(2, 3, nq, device="cuda")
    out, lse = attention(q, k, v, causal=causal, scale=0.1, return_lse=True, target=target)
    s = q.double() @ k.double().transpose(-1, -2) * 0.1
    if causal:
        s = s.masked_fill(torch.ones(nq, nk, dtype=torch.bool, device="cuda").triu(1), -math.inf)
    assert (lse.double() - torch.logsumexp(s, -1)).abs().max().item() < 1e-3
    dq, dk, dv = attention_backward(q, k, v, out, grad, lse, causal=causal, scale=0.1, grad_lse=grad_lse,
                                    target=target)
    for name, got, ref in zip("qkv", (dq, dk, dv), attention_grads_ref(q, k, v, grad, causal, 0.1, grad_lse)):
        assert rel_err(got, ref) < 1e-2, f"d{name}"


# (B, H, H_kv, N, D): groups of 2, 4 and 8 query heads a K/V head, one K/V head (multi-query), B·H above the SM count
GROUPED_SHAPES = [(2, 8, 4, 256, 64), (1, 32, 8, 1024, 128), (4, 16, 1, 512, 64), (3, 6, 3, 192, 128),
                  (2, 160, 20, 128, 64), (1, 8, 1, 2048, 128)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b, h, h_kv, n, d", GROUPED_SHAPES)
def test_grouped_query_attention(b: int, h: int, h_kv: int, n: int, d: int, causal: bool, target: str | None) -> None:
    """K and V of fewer heads than q (grouped-query attention): the forward against torch's SDPA with
    enable_gqa=True in float32, and the gradients (dk, dv summed over each K/V head's query heads) against float64."""
    q, k, v = randn(b, h, n, d), randn(b, h_kv, n, d), randn(b, h_kv, n, d)
    out = attention(q, k, v, causal=causal, out=poisoned_like((b, h, n, d)), target=target)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                                           enable_gqa=True)
    assert rel_err(out, ref) < 1e-2
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    grad = randn(b, h, n, d)
    grads = torch.autograd.grad(attention(q, k, v, causal=causal, target=target), (q, k, v), grad)
    for name, got, ref in zip("qkv", grads, attention_grads_ref(q, k, v, grad, causal)):
        assert got.shape == ref.shape and rel_err(got, ref) < 1e-2, f"d{name}"


# (B, H, H_kv, Nq, Nk, D): one query (decoding) with groups of 1, 4, 8 and 32 query heads a K/V head, a few queries
# (speculative decoding: 4 × 8 and 8 × 8 rows a K/V head), lengths no step divides, B·H_kv above the SM count;
# 8 parts a row tile at B = 1, Nk = 4096 and 16 at 16384 (clusters of 8 and 16 blocks where the GPU holds them all)
DECODE_SHAPES = [(1, 32, 8, 1, 4096, 128), (4, 32, 32, 1, 1000, 128), (1, 32, 1, 1, 8191, 64),
                 (2, 64, 8, 4, 3000, 128), (3, 16, 2, 8, 77, 64), (1, 8, 8, 1, 1, 128), (200, 8, 1, 1, 257, 64),
                 (1, 28, 4, 1, 32768, 128), (1, 32, 8, 1, 16384, 128)]


def check_decoding(b: int, h: int, h_kv: int, nq: int, nk: int, d: int, target: str | None) -> tuple:
    """attention() on fresh q (B, H, Nq, D), k and v (B, H_kv, Nk, D), out poisoned first: out and its log-sum-exp
    against float32; (q, k, v)."""
    q, k, v = randn(b, h, nq, d), randn(b, h_kv, nk, d), randn(b, h_kv, nk, d)
    out, lse = attention(q, k, v, out=poisoned_like((b, h, nq, d)), return_lse=True, scale=0.1, target=target)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.1,
                                                           enable_gqa=True)
    assert rel_err(out, ref) < 1e-2
    s = q.float() @ k.float().repeat_interleave(h // h_kv, 1).transpose(-1, -2) * 0.1
    assert (lse - torch.logsumexp(s, -1)).abs().max().item() < 1e-3
    return q, k, v


@pytest.mark.parametrize("one_launch", [True, False])
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("b, h, h_kv, nq, nk, d", DECODE_SHAPES)
def test_decode_attention(b: int, h: int, h_kv: int, nq: int, nk: int, d: int, target: str | None,
                          one_launch: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A few queries over many keys (attention_decode: the keys split into parts over the GPU, then the parts
    weighed by their log-sum-exps), on the Hopper path too (DECODE_ON_HOPPER on): out and its log-sum-exp against
    SDPA / logsumexp in float32. one_launch as shipped: on Hopper parts few enough for a cluster in one launch
    (attention_decode_cluster), on the sm_80 path the last part weighing (attention_decode_last,
    DECODE_LAST_BLOCK_SM80); off (DECODE_IN_CLUSTERS and DECODE_LAST_BLOCK_SM80 off): the two kernels everywhere."""
    attention_module = importlib.import_module("tkc.kernels.attention")  # (tkc.kernels.attention: the function)
    decode_module = importlib.import_module("tkc.kernels.attention_decode")
    monkeypatch.setattr(attention_module, "DECODE_ON_HOPPER", True)
    monkeypatch.setattr(attention_module, "_PLANS", {})  # no attention_sm90 plan made with the flag off
    monkeypatch.setattr(decode_module, "DECODE_IN_CLUSTERS", one_launch)
    monkeypatch.setattr(decode_module, "DECODE_LAST_BLOCK_SM80", "eager" if one_launch else False)
    monkeypatch.setattr(decode_module, "_PLANS", {})  # (plans made under the other setting)
    q, k, v = check_decoding(b, h, h_kv, nq, nk, d, target)
    default_scale = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    assert rel_err(attention(q, k, v, target=target), default_scale) < 1e-2  # the common call, 1/√D


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("b, h, h_kv, nq, nk, d", DECODE_SHAPES)
def test_decode_attention_last_block_weighs(b: int, h: int, h_kv: int, nq: int, nk: int, d: int, target: str | None,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """DECODE_LAST_BLOCK and DECODE_LAST_BLOCK_SM80 (clusters off): decoding in one launch, attention_decode_last,
    whose last part of each row tile to arrive at its counter weighs the parts; out and its log-sum-exp against
    float32, twice (the counters left at zero by the first launch)."""
    attention_module = importlib.import_module("tkc.kernels.attention")
    decode_module = importlib.import_module("tkc.kernels.attention_decode")
    checks_module = importlib.import_module("tkc.kernels._checks")
    monkeypatch.setattr(attention_module, "DECODE_ON_HOPPER", True)
    monkeypatch.setattr(attention_module, "_PLANS", {})
    monkeypatch.setattr(decode_module, "DECODE_LAST_BLOCK", True)
    monkeypatch.setattr(decode_module, "DECODE_LAST_BLOCK_SM80", True)
    monkeypatch.setattr(decode_module, "DECODE_IN_CLUSTERS", False)
    monkeypatch.setattr(decode_module, "_PLANS", {})
    for _ in range(2):
        check_decoding(b, h, h_kv, nq, nk, d, target)
    assert not any(counters.any().item() for counters in checks_module.ARRIVAL_COUNTERS.values())


@pytest.mark.parametrize("last_block", [False, "eager", True])
@pytest.mark.parametrize("b, nk", [(1, 16384), (4, 4096), (1, 4096)])
def test_decode_attention_in_a_cuda_graph(b: int, nk: int, last_block: bool | str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoding steps called eagerly and then captured in a CUDA graph and replayed on new inputs: on Hopper an eager
    call may take fewer, larger parts in clusters (one launch) where a wave's clusters are not all held, a captured
    one the wave's split (FEWER_PARTS); with DECODE_LAST_BLOCK one launch whose last part weighs (True: in the graph
    too, on counters of the graph's own); right against float32 every way, the graph on every replay."""
    attention_module = importlib.import_module("tkc.kernels.attention")
    decode_module = importlib.import_module("tkc.kernels.attention_decode")
    monkeypatch.setattr(attention_module, "DECODE_ON_HOPPER", True)
    monkeypatch.setattr(decode_module, "DECODE_LAST_BLOCK", last_block)
    monkeypatch.setattr(decode_module, "_PLANS", {})
    q, k, v = randn(b, 32, 1, 128), randn(b, 8, nk, 128), randn(b, 8, nk, 128)

    def ref() -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)

    for _ in range(2):  # the checked call, then the common call
        assert rel_err(attention(q, k, v), ref()) < 1e-2
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention(q, k, v)
    for _ in range(2):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, ref()) < 1e-2


@pytest.mark.parametrize("one_launch", [True, False])
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("lengths, h, h_kv, nq, n_max, d", [
    ([4096, 1, 0, 3000], 32, 8, 1, 4096, 128),  # a batch of no keys: zero rows, lse -inf
    ([700, 9000], 8, 1, 4, 8192, 64),  # past the cache (read as 8192), multi-query, four rows a head
    ([1, 130, 2048, 17, 500, 4000, 64, 333], 16, 2, 1, 4000, 128),
])
def test_attention_kvcache(lengths: list[int], h: int, h_kv: int, nq: int, n_max: int, d: int, target: str | None,
                           one_launch: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """attention_kvcache: each batch over its own first cache_seqlens[b] keys of a cache laid out (B, N_max, H_kv, D)
    (FlashAttention's) and read through a transposed view; out and lse against float32 SDPA per batch, outputs
    poisoned first; both decoding schemes (one launch: clusters on Hopper, the last part weighing on the sm_80 path;
    else the two kernels)."""
    decode_module = importlib.import_module("tkc.kernels.attention_decode")
    monkeypatch.setattr(decode_module, "DECODE_IN_CLUSTERS", one_launch)
    monkeypatch.setattr(decode_module, "DECODE_LAST_BLOCK_SM80", "eager" if one_launch else False)
    monkeypatch.setattr(decode_module, "_PLANS", {})
    b = len(lengths)
    q = randn(b, h, nq, d)
    k, v = (randn(b, n_max, h_kv, d).transpose(1, 2) for _ in range(2))
    for i, n in enumerate(lengths):  # the rows past each length never written (NaN): never used
        k[i, :, n:], v[i, :, n:] = float("nan"), float("nan")
    seqlens = torch.tensor(lengths, device="cuda", dtype=torch.int32)
    out = torch.full_like(q, float("nan"))
    out, lse = tkc.kernels.attention_kvcache(q, k, v, seqlens, target=target, out=out, return_lse=True)
    check_kvcache(q, k, v, lengths, out, lse)


def check_kvcache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int], out: torch.Tensor,
                  lse: torch.Tensor) -> None:
    """attention_kvcache's out and lse against float32 SDPA per batch over its first lengths[b] keys of k, v (B, H_kv,
    N_max, D): zero rows and lse -inf for a batch of none."""
    h, h_kv, n_max, d = q.shape[1], k.shape[1], k.shape[2], q.shape[3]
    for i, n in enumerate(lengths):
        n = min(n, n_max)
        if n == 0:
            assert (out[i] == 0).all() and torch.isneginf(lse[i]).all()
            continue
        kf, vf = k[i:i + 1, :, :n].float(), v[i:i + 1, :, :n].float()
        ref = torch.nn.functional.scaled_dot_product_attention(q[i:i + 1].float(), kf, vf, enable_gqa=True)
        scores = q[i:i + 1].float() @ kf.repeat_interleave(h // h_kv, 1).transpose(-1, -2) / math.sqrt(d)
        assert rel_err(out[i:i + 1], ref) < 1e-2
        assert (lse[i:i + 1] - scores.logsumexp(-1)).abs().max().item() < 1e-3


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("lengths, h, h_kv, page, d", [
    ([4096, 1, 0, 3000], 32, 8, 256, 128),
    ([700, 8192], 8, 1, 512, 64),
    ([1, 130, 2048, 17, 500, 4000, 64, 333], 16, 2, 256, 128),
])
def test_attention_kvcache_paged(lengths: list[int], h: int, h_kv: int, page: int, d: int,
                                 target: str | None) -> None:
    """attention_kvcache over a paged cache: a pool of pages (pages, page size, H_kv, D) as vLLM's and
    FlashAttention's (read through a transposed view), each batch's pages scattered over it by block_table, the rows
    no key fills NaN; out and lse against float32 SDPA over the batch's keys gathered, outputs poisoned first."""
    b, n_max = len(lengths), max(lengths)
    per_batch = -(-n_max // page)
    pool_pages = b * per_batch + 3
    pool = [torch.full((pool_pages, page, h_kv, d), float("nan"), device="cuda", dtype=torch.bfloat16)
            for _ in range(2)]
    table = torch.randperm(pool_pages, device="cuda")[:b * per_batch].view(b, per_batch).to(torch.int32)
    k, v = (torch.full((b, h_kv, per_batch * page, d), float("nan"), device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    for i, n in enumerate(lengths):  # batch i's keys, in its pages
        for x, pages in ((k, pool[0]), (v, pool[1])):
            x[i, :, :n] = torch.randn(h_kv, n, d, device="cuda", dtype=torch.bfloat16)
            pages[table[i].long()] = x[i].view(h_kv, per_batch, page, d).transpose(0, 1).transpose(1, 2)
    q = randn(b, h, 1, d)
    out = torch.full_like(q, float("nan"))
    out, lse = tkc.kernels.attention_kvcache(q, pool[0].transpose(1, 2), pool[1].transpose(1, 2),
                                             torch.tensor(lengths, device="cuda", dtype=torch.int32),
                                             block_table=table, target=target, out=out, return_lse=True)
    check_kvcache(q, k, v, lengths, out, lse)


@pytest.mark.parametrize("b, h, h_kv, nq, nk", [(1, 16, 8, 1, 4096), (2, 8, 2, 1, 1000), (1, 8, 8, 2, 77)])
def test_decode_attention_head_dim_256(b: int, h: int, h_kv: int, nq: int, nk: int,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """D = 256's decoding (Hopper only: 193 KB of shared memory), after a prefill at D = 256 in the same process:
    out and its log-sum-exp against float32, the checked call and then the common call."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("D = 256's decoding kernel needs Hopper")
    attention_module = importlib.import_module("tkc.kernels.attention")
    monkeypatch.setattr(attention_module, "DECODE_ON_HOPPER", True)
    k, v = randn(b, h_kv, nk, 256), randn(b, h_kv, nk, 256)
    attention(randn(b, h, 128, 256), k, v)  # a prefill: attention_sm90's plan
    for _ in range(2):
        q = randn(b, h, nq, 256)
        out, lse = attention(q, k, v, out=poisoned_like((b, h, nq, 256)), return_lse=True)
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
        assert rel_err(out, ref) < 1e-2
        s = q.float() @ k.float().repeat_interleave(h // h_kv, 1).transpose(-1, -2) / 16
        assert (lse - torch.logsumexp(s, -1)).abs().max().item() < 1e-3
        assert rel_err(attention(q, k, v), ref) < 1e-2  # the common call


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b, h, nq, nk, d", [(1, 2, 100, 100, 64), (2, 3, 1000, 1000, 128), (1, 1, 333, 333, 64),
                                             (2, 2, 200, 77, 128), (1, 3, 1, 1, 64), (2, 3, 1000, 1000, 96),
                                             (1, 2, 200, 77, 96)])
def test_attention_backward_ragged_lengths(b: int, h: int, nq: int, nk: int, d: int, causal: bool) -> None:
    """Lengths the backward's steps do not divide (RAGGED: the last step masks the columns past the end), through
    the Hopper path's forward (any length) and autograd."""
    if causal and nq != nk:
        pytest.skip("causal backward needs Nq = Nk")
    q = randn(b, h, nq, d).requires_grad_()
    k, v = (randn(b, h, nk, d).requires_grad_() for _ in range(2))
    grad = randn(b, h, nq, d)
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("any length needs the Hopper forward")
    grads = torch.autograd.grad(attention(q, k, v, causal=causal), (q, k, v), grad)
    refs = attention_grads_ref(q, k, v, grad, causal)
    for name, got, ref in zip("qkv", grads, refs):
        if nk == 1 and name != "v":  # one key: softmax is constant, dq = dk = 0 exactly; rounding noise vs dv's size
            assert (got.double() - ref.double()).norm() < 1e-3 * refs[2].double().norm(), f"d{name}"
        else:
            assert rel_err(got, ref) < 1e-2, f"d{name}"


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_rows_by_row_numbers(target: str) -> None:
    """rows_at on the GPU (tests/kernels/routed_rows.py): rows gathered by int64 numbers (some past X's end: zeros), added into rows named by int32
    numbers (many entries into one row; some numbers negative: dropped), 3000 entries over 47 blocks."""
    from kernels.routed_rows import routed_rows

    if target == "sm_90a" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a needs Hopper")
    entries = 3000
    x = randn(500, 128)
    src = torch.randint(0, 520, (entries,), device="cuda")
    dst = torch.randint(-3, 200, (entries,), device="cuda", dtype=torch.int32)
    y = torch.randn(200, 128, device="cuda")
    z = torch.full((entries, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    gathered = torch.where((src < 500)[:, None], x.double()[src.clamp(max=499)], 0.0)
    ref = y.double().index_add(0, dst[dst >= 0].long(), 2 * gathered[dst >= 0])
    routed_rows[(-(-entries // 64),)](x, src, dst, y, z, target=target)
    assert rel_err(y, ref) < 1e-5 and torch.equal(z.double(), gathered)


@tkc.kernel(warps=4, min_target="sm_80")
def tiles_summed(X: gl[f32, 2], Y: gl[f32, 2]):
    """Block i's warps add X's tiles 4i..4i+3 into Y's tile i % (Y's tiles)."""
    blk, _, _ = block_idx()
    atomic_add(Y, load(X, (blk * 4 + warp_id(), 0), rt[f32, 16, 128]), (blk % cdiv(Y.shape[0], 16), 0))


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("rows", [64, 40])
def test_atomic_add(target: str, rows: int) -> None:
    """600 blocks (2400 warps) adding into the same few tiles (red.global.add on sm_80, TMA reductions on sm_90a;
    rows past Y's end dropped): every addend lands."""
    if target == "sm_90a" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a needs Hopper")
    blocks, tiles = 600, -(-rows // 16)
    x = torch.randn(blocks * 64, 128, device="cuda")
    y = torch.randn(rows, 128, device="cuda")
    per_block = x.double().view(blocks, 4, 16, 128).sum(1)
    ref = y.double() + torch.stack([per_block[t::tiles].sum(0) for t in range(tiles)]).view(-1, 128)[:rows]
    tiles_summed[(blocks,)](x, y, target=target)
    assert rel_err(y, ref) < 1e-5


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("blocks", [1, 7, 2000])
def test_last_block_sum(target: str, blocks: int) -> None:
    """arrive_last on the GPU (tests/kernels/last_block_sum.py): blocks leave their parts, the last to arrive at the
    counter sums them in the same launch; the counter is back at 0 after each of three launches on new inputs
    (2000 blocks: many arriving at once, more than the GPU holds)."""
    if target == "sm_90a" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a needs Hopper")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kernels.last_block_sum import last_block_sum

    counter = torch.zeros(3, device="cuda", dtype=torch.int32)
    for _ in range(3):
        x = torch.randn(32 * blocks, 64, device="cuda")
        parts, out = torch.full_like(x, float("nan")), torch.full((32, 64), float("nan"), device="cuda")
        last_block_sum[(blocks,)](x, parts, out, counter, target=target)
        assert rel_err(out, x.double().view(blocks, 32, 64).sum(0)) < 1e-5
        assert not counter.any().item()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n, d, constants", [
    (1000, 256, {"WARPS": 8, "HALVES": 1, "QUERIES": 32, "STAGES": 3, "PRODUCER": 1}),
    (1000, 256, {"WARPS": 8, "HALVES": 1, "QUERIES": 48, "STAGES": 2, "PRODUCER": 2, "EXCHANGE_BUFFERS": 1}),
    (1000, 128, {"WARPS": 8, "QUERIES": 32, "STAGES": 3}), (1024, 64, {"WARPS": 4, "STAGES": 3, "BLOCKS": 2})])
def test_attention_backward_dkdv_deferred(n: int, d: int, constants: dict, causal: bool) -> None:
    """attention_bwd_dkdv_sm90 and attention_bwd_dq_sm90 with DEFER=1 (each step's dV and dK, or dQ, products run in
    the next step, under its exchange and softmax): the gradients against float64, two heads a K/V head
    (grouped-query), lengths the steps do not divide."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs Hopper")
    from tkc.kernels.attention_bwd import (CONFIG_SM90, attention_bwd_delta, attention_bwd_dkdv_sm90,
                                           attention_bwd_dq_sm90, dkdv_blocks)

    b, h = 2, 4
    q, grad = randn(b, h, n, d), randn(b, h, n, d)
    k, v = randn(b, h // 2, n, d), randn(b, h // 2, n, d)
    out, lse = attention(q, k, v, causal=causal, return_lse=True)
    delta = torch.full((b, h, n), math.nan, device="cuda")
    dk, dv = (torch.full_like(k, math.nan) for _ in range(2))
    cfg = {**constants, "DEFER": 1, "RAGGED": int(n % constants.get("QUERIES", 64) > 0)}
    attention_bwd_delta[(-(-n // 64), h, b)](out, grad, lse, delta, D=d)
    attention_bwd_dkdv_sm90[(dkdv_blocks(n, d, cfg), h // 2, b)](q, k, v, grad, lse, delta, dk, dv, d**-0.5, D=d,
                                                                 CAUSAL=int(causal), GROUP=2, **cfg)
    dq_ref, dk_ref, dv_ref = attention_grads_ref(q, k, v, grad, causal)  # (dK, dV summed over two query heads)
    assert rel_err(dk, dk_ref) < 1e-2 and rel_err(dv, dv_ref) < 1e-2
    # dQ with DEFER=1 too, as each head dim's dQ kernel runs (attention_backward's constants)
    dq_cfg = {**CONFIG_SM90[d][1], "DEFER": 1}
    dq_cfg["RAGGED"] = int(n % dq_cfg.get("KEYS", 64) > 0)
    dq = torch.full_like(q, math.nan)
    attention_bwd_dq_sm90[(-(-n // (16 * dq_cfg.get("WARPS", 8))), h, b)](q, k, v, grad, lse, delta, dq, d**-0.5, D=d,
                                                                        CAUSAL=int(causal), GROUP=2, **dq_cfg)
    assert rel_err(dq, dq_ref) < 1e-2


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b, h, n, d, warps, queries, defer", [
    (2, 3, 1024, 64, 4, 64, 0), (1, 4, 1000, 128, 8, 64, 0), (4, 8, 256, 128, 8, 64, 0), (2, 2, 1000, 64, 8, 128, 0),
    (2, 3, 1000, 64, 4, 64, 1), (1, 4, 1000, 128, 8, 64, 1), (1, 4, 1000, 128, 8, 64, 2)])
def test_attention_backward_fused(b: int, h: int, n: int, d: int, warps: int, queries: int, defer: int,
                                  causal: bool) -> None:
    """attention_bwd_sm90 (dK, dV and dQ by TMA reductions into an f32 sum; defer 1: DEFER_DQ, each step's dQ added
    in the next; defer 2: also DS_BUFFERS=2, dSᵀ in two buffers) and attention_bwd_dq_scale: the gradients against
    float64."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs Hopper")
    from tkc.kernels.attention_bwd import attention_bwd_delta, attention_bwd_dq_scale, attention_bwd_sm90

    q, k, v, grad = (randn(b, h, n, d) for _ in range(4))
    out, lse = attention(q, k, v, causal=causal, return_lse=True)
    delta = torch.full((b, h, n), math.nan, device="cuda")
    dq, dk, dv = (torch.full_like(q, math.nan) for _ in range(3))
    dq_sum = torch.zeros(b, h, n, d, device="cuda")
    ragged = int(n % queries > 0)
    attention_bwd_delta[(-(-n // 64), h, b)](out, grad, lse, delta, D=d)
    attention_bwd_sm90[(h, -(-n // (16 * warps)), b)](q, k, v, grad, lse, delta, dk, dv, dq_sum, d**-0.5, D=d,
                                                       CAUSAL=int(causal), WARPS=warps, QUERIES=queries,
                                                       RAGGED=ragged, DEFER_DQ=int(defer > 0), DS_BUFFERS=1 + (defer > 1))
    attention_bwd_dq_scale[(-(-n // 64), h, b)](dq_sum, dq, d**-0.5, D=d)
    for name, got, ref in zip("qkv", (dq, dk, dv), attention_grads_ref(q, k, v, grad, causal)):
        assert rel_err(got, ref) < 1e-2, f"d{name}"


def grouped_reference(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, rows: torch.Tensor | None,
                      trans_b: bool) -> torch.Tensor:
    """Group g's rows of the product, in float64 (NaN past the last offset: left as they were)."""
    xs = x.double() if rows is None else torch.where(((rows >= 0) & (rows < len(x)))[:, None],
                                                     x.double()[rows.long().clamp(0, len(x) - 1)], 0.0)
    out = torch.full((len(xs), w.shape[1] if trans_b else w.shape[2]), float("nan"), device="cuda",
                     dtype=torch.float64)
    start = 0
    for g, stop in enumerate(offsets.tolist()):
        weight = w[g].double().t() if trans_b else w[g].double()
        out[start:stop] = xs[start:stop] @ weight
        start = stop
    return out


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("gather", [False, True])
@pytest.mark.parametrize("groups, slots, n, k", [(8, 4096, 512, 1024), (3, 300, 200, 72), (64, 2000, 256, 128),
                                                 (1, 129, 128, 64), (16, 16384, 1024, 512)])
def test_grouped_gemm(groups: int, slots: int, n: int, k: int, gather: bool, trans_b: bool,
                      target: str | None) -> None:
    """Random group sizes (some empty), rows past the last offset untouched, gathered rows some outside x."""
    from tkc.kernels import grouped_gemm

    sizes = torch.distributions.Dirichlet(torch.ones(groups)).sample() * slots * 0.97
    offsets = sizes.cumsum(0).int().cuda()
    if groups > 2:
        offsets[1] = offsets[0]  # an empty group
    x = randn(slots + 7, k)
    w = randn(groups, *((n, k) if trans_b else (k, n)), scale=k ** -0.5)
    rows = torch.randint(-2, slots + 9, (slots,), device="cuda", dtype=torch.int32) if gather else None
    out = poisoned_like((slots, n)) if gather else poisoned_like((slots + 7, n))
    grouped_gemm(x, w, offsets, rows=rows, trans_b=trans_b, target=target, out=out)
    ref = grouped_reference(x, w, offsets, rows, trans_b)
    kept = torch.arange(len(ref), device="cuda") < offsets[-1]
    assert rel_err(out[kept], ref[kept]) < 1e-2
    assert out[~kept].isnan().all()


@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("groups, slots, n, k", [(8, 4096, 512, 1024), (3, 300, 200, 72), (64, 2000, 256, 128)])
def test_grouped_gemm_mixed_ring(groups: int, slots: int, n: int, k: int, trans_b: bool) -> None:
    """Gathered rows on the wgmma kernel with mixed_ring=1 (W by TMA, the gathered rows by cp.async counted on the
    same barriers; grouped_gemm itself does not take it yet): as test_grouped_gemm."""
    from tkc.kernels.grouped_gemm import CONFIG_SM90, grouped_gemm_sm90_kernel

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel needs sm_90")
    sizes = torch.distributions.Dirichlet(torch.ones(groups)).sample() * slots * 0.97
    offsets = sizes.cumsum(0).int().cuda()
    x = randn(slots + 7, k)
    w = randn(groups, *((n, k) if trans_b else (k, n)), scale=k ** -0.5)
    rows = torch.randint(-2, slots + 9, (slots,), device="cuda", dtype=torch.int32)
    out = poisoned_like((slots, n))
    spec = grouped_gemm_sm90_kernel.specialize(target="sm_90a", **{**CONFIG_SM90, "GATHER": 1, "MIXED": 1,
                                                                     "TRANS_B": int(trans_b)})
    tiles = (-(-slots // 128) + groups) * -(-n // CONFIG_SM90["BN"])
    spec.launch((tiles, 1, 1), (x, w, offsets, rows, out))
    ref = grouped_reference(x, w, offsets, rows, trans_b)
    kept = torch.arange(len(ref), device="cuda") < offsets[-1]
    assert rel_err(out[kept], ref[kept]) < 1e-2
    assert out[~kept].isnan().all()


@pytest.mark.parametrize("gather_a, gather_b", [(0, 0), (1, 0), (0, 1)])
def test_grouped_gemm_wgrad_mixed_ring(gather_a: int, gather_b: int) -> None:
    """The weights' gradient's wgmma kernel with MIXED=1 (one side whole by TMA, the other cut at each group's end by
    cp.async on the same ring; grouped_gemm_wgrad does not take it yet) against float64, groups of every size."""
    from tkc.kernels.grouped_gemm import CONFIG_WGRAD_SM90, grouped_gemm_wgrad_sm90_kernel

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel needs sm_90")
    groups, slots, m, n = 9, 3000, 384, 512
    sizes = torch.distributions.Dirichlet(torch.ones(groups)).sample() * slots
    offsets = sizes.cumsum(0).int().cuda()
    offsets[2] = offsets[1]  # an empty group
    a, b = randn(slots, m), randn(slots, n)
    rows = torch.randperm(slots, device="cuda", dtype=torch.int32)
    out = poisoned_like((groups, m, n))
    spec = grouped_gemm_wgrad_sm90_kernel.specialize(target="sm_90a", **{**CONFIG_WGRAD_SM90, "MIXED": 1,
                                                                          "GATHER_A": gather_a, "GATHER_B": gather_b})
    spec.launch((groups * -(-m // 128) * -(-n // CONFIG_WGRAD_SM90["BN"]), 1, 1), (a, b, offsets, rows, out))
    sa = a.double()[rows.long()] if gather_a else a.double()
    sb = b.double()[rows.long()] if gather_b else b.double()
    bounds = [0, *offsets.tolist()]
    ref = torch.stack([sa[s:e].t() @ sb[s:e] for s, e in zip(bounds, bounds[1:])])
    assert rel_err(out, ref) < 1e-2


def test_grouped_gemm_arguments() -> None:
    """Each bad argument is one KernelArgumentError naming it."""
    from tkc.errors import KernelArgumentError
    from tkc.kernels import grouped_gemm

    x, w = randn(64, 32), randn(4, 32, 48)
    offsets = torch.tensor([10, 20, 40, 64], device="cuda", dtype=torch.int32)
    cases = [((x, randn(4, 16, 48), offsets), {}, "w: x is"),
             ((x, w, offsets.long()), {}, "offsets must be torch.int32"),
             ((x, w, offsets[:3]), {}, "offsets: one end offset a group"),
             ((x, w, offsets), {"rows": torch.zeros(8, device="cuda")}, "rows: an int32 or int64 tensor"),
             ((x, w, offsets.cpu()), {}, "offsets is on cpu"),
             ((x, w, offsets), {"out": poisoned_like((64, 47))}, "out: expected shape (64, 48)")]
    for args, kwargs, message in cases:
        with pytest.raises(KernelArgumentError, match=re.escape(message)):
            grouped_gemm(*args, **kwargs)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("groups, slots, n, k", [(8, 4096, 512, 1024), (3, 300, 200, 72), (64, 2000, 256, 128)])
def test_grouped_gemm_gradients(groups: int, slots: int, n: int, k: int, trans_b: bool, target: str | None) -> None:
    """grouped_gemm under autograd (rows sorted): dx by grouped_gemm with w the other way round (zeros in rows no
    group took), dw by grouped_gemm_wgrad, against float64 autograd; and grouped_gemm_wgrad with gathered rows."""
    from tkc.kernels import grouped_gemm, grouped_gemm_wgrad

    sizes = torch.distributions.Dirichlet(torch.ones(groups)).sample() * slots * 0.97
    offsets = sizes.cumsum(0).int().cuda()
    x = randn(slots, k).requires_grad_()
    w = randn(groups, *((n, k) if trans_b else (k, n)), scale=k ** -0.5).requires_grad_()
    dout = randn(slots, n)
    grouped_gemm(x, w, offsets, trans_b=trans_b, target=target).backward(dout)
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    bounds = list(zip([0, *offsets.tolist()[:-1]], offsets.tolist()))
    ref = torch.cat([xr[s:e] @ (wr[g].t() if trans_b else wr[g]) for g, (s, e) in enumerate(bounds)])
    ref.backward(dout[:len(ref)].double())
    assert rel_err(x.grad[:len(ref)], xr.grad[:len(ref)]) < 1e-2 and (x.grad[len(ref):] == 0).all()
    assert rel_err(w.grad, wr.grad) < 1e-2
    rows = torch.randint(-2, slots + 3, (slots,), device="cuda", dtype=torch.int32)
    xs = torch.where(((rows >= 0) & (rows < slots))[:, None], x.detach().double()[rows.long().clamp(0, slots - 1)], 0.0)
    dw = grouped_gemm_wgrad(x.detach(), dout, offsets, rows=rows, trans_b=trans_b, target=target)
    dw_ref = torch.stack([(dout[s:e].double().t() @ xs[s:e]) if trans_b else (xs[s:e].t() @ dout[s:e].double())
                          for s, e in bounds])
    assert rel_err(dw, dw_ref) < 1e-2


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("trans_b", [False, True])
def test_grouped_gemm_gathered_gradients(trans_b: bool, target: str | None) -> None:
    """grouped_gemm with gathered rows under autograd: x's rows taken twice, never, or (entries outside x) not at all;
    dx sums what each row gave (grouped_gemm_dx: f32 atomic adds, then bf16), dw gathers x's rows as the product did."""
    from tkc.kernels import grouped_gemm

    groups, slots, x_rows, n, k = 6, 3000, 1800, 256, 192
    offsets = (torch.distributions.Dirichlet(torch.ones(groups)).sample() * slots * 0.97).cumsum(0).int().cuda()
    rows = torch.randint(-3, x_rows + 3, (slots,), device="cuda", dtype=torch.int32)
    x = randn(x_rows, k).requires_grad_()
    w = randn(groups, *((n, k) if trans_b else (k, n)), scale=k ** -0.5).requires_grad_()
    dout = randn(slots, n)
    grouped_gemm(x, w, offsets, rows=rows, trans_b=trans_b, target=target).backward(dout)
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    inside = (rows >= 0) & (rows < x_rows)
    xs = torch.where(inside[:, None], xr[rows.long().clamp(0, x_rows - 1)], 0.0)
    bounds = list(zip([0, *offsets.tolist()[:-1]], offsets.tolist()))
    ref = torch.cat([xs[s:e] @ (wr[g].t() if trans_b else wr[g]) for g, (s, e) in enumerate(bounds)])
    ref.backward(dout[:len(ref)].double())
    assert rel_err(x.grad, xr.grad) < 1e-2 and rel_err(w.grad, wr.grad) < 1e-2
