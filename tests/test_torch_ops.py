"""The kernels under torch.export and torch.compile (CPU: tracing only, with the ops' fake implementations): each
entry point call becomes one `torch.ops.tkc.*` node with the right output shapes, and nothing launches."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tkc.kernels import attention, gemm, layernorm  # noqa: E402

bf16 = torch.bfloat16


class Block(torch.nn.Module):
    """A pre-norm transformer block's shape of calls: layernorm, a projection (a linear layer's N×K weight),
    attention with its log-sum-exp, another projection."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.w_in = torch.nn.Parameter(torch.randn(3 * d, d, dtype=bf16))
        self.w_out = torch.nn.Parameter(torch.randn(d, d, dtype=bf16))
        self.gamma, self.beta = torch.nn.Parameter(torch.ones(d, dtype=bf16)), torch.nn.Parameter(torch.zeros(d, dtype=bf16))

    def forward(self, x: torch.Tensor, residual: torch.Tensor):
        b, n, d = x.shape
        y, residual = layernorm(x.view(-1, d), residual.view(-1, d), self.gamma, self.beta)
        qkv = gemm(y, self.w_in, trans_b=True).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        o, lse = attention(qkv[0].contiguous(), qkv[1].contiguous(), qkv[2].contiguous(), causal=True, return_lse=True)
        return gemm(o.transpose(1, 2).reshape(b * n, d), self.w_out, trans_b=True), residual, lse


def _inputs():
    return torch.randn(2, 128, 256, dtype=bf16), torch.randn(2, 128, 256, dtype=bf16)


def _tkc_ops(graph) -> list[str]:
    return [str(n.target).removesuffix(".default") for n in graph.nodes
            if n.op == "call_function" and str(n.target).startswith("tkc.")]


@pytest.mark.parametrize("strict", [True, False])
def test_export_holds_one_op_per_call(strict: bool) -> None:
    ep = torch.export.export(Block(256, 4), _inputs(), strict=strict)
    assert _tkc_ops(ep.graph) == ["tkc.layernorm", "tkc.gemm", "tkc.attention_lse", "tkc.gemm"]
    (output,) = ep.graph.find_nodes(op="output")
    assert [tuple(v.meta["val"].shape) for v in output.args[0]] == [(256, 256), (256, 256), (2, 4, 128)]


def _keeping(graphs: list):
    """A torch.compile backend that keeps the graph and runs nothing: the compiled function returns zeros of the
    graph's output shapes."""

    def backend(gm, example_inputs):
        graphs.append(gm.graph)
        (output,) = gm.graph.find_nodes(op="output")
        values = [node.meta["example_value"] for node in output.args[0]]
        return lambda *args: [torch.zeros(v.shape, dtype=v.dtype) for v in values]

    return backend


def test_compile_traces_without_launching() -> None:
    graphs = []

    inspect = _keeping(graphs)

    torch.compile(Block(256, 4), backend=inspect, fullgraph=True)(*_inputs())
    (graph,) = graphs
    assert _tkc_ops(graph) == ["tkc.layernorm", "tkc.gemm", "tkc.attention_lse", "tkc.gemm"]


def test_scaled_mm_is_one_op_under_compile() -> None:
    from tkc.kernels import scaled_mm

    graphs = []
    a, w = (torch.randn(64, 128).to(torch.float8_e4m3fn) for _ in range(2))
    out = torch.compile(lambda a, w, s: scaled_mm(a, w.t(), s, s), backend=_keeping(graphs), fullgraph=True)(
        a, w, torch.ones(()))
    (graph,) = graphs
    assert _tkc_ops(graph) == ["tkc.scaled_mm"] and out.shape == (64, 64) and out.dtype == bf16
    out = torch.compile(lambda a, w, s: scaled_mm(a, w.t(), s, s, out_dtype=torch.float32), backend=_keeping(graphs),
                        fullgraph=True)(a, w, torch.ones(()))
    assert out.dtype == torch.float32


def test_norms_without_a_residual_and_rms_under_compile(cpu_kernels) -> None:
    """layernorm() without a residual and rmsnorm() are one tkc.layernorm op each under compile (its second output a
    0-element stand-in: an op's output may not alias its input); the entry point returns x itself as the residual."""
    from tkc.kernels import rmsnorm

    graphs = []

    def running(gm, example_inputs):  # keeps the graph and runs it (the ops' eager calls: the references above)
        graphs.append(gm.graph)
        return gm.forward

    def fn(x, r, w, b):
        y, same = layernorm(x, None, w, b)
        z, s = rmsnorm(y, r, w)
        return y, z, s, same * 2

    x, r, b = (torch.randn(*shape, dtype=bf16) for shape in ((8, 64), (8, 64), (64,)))
    w = torch.rand(64, dtype=bf16)
    y, z, s, twice_x = torch.compile(fn, backend=running, fullgraph=True)(x, r, w, b)
    assert _tkc_ops(graphs[0]) == ["tkc.layernorm", "tkc.layernorm"]
    assert torch.equal(twice_x, x * 2)
    ref_y = torch.nn.functional.layer_norm(x.float(), (64,), w.float(), b.float(), 1e-5)
    ref_s = y.float() + r.float()
    ref_z = torch.nn.functional.rms_norm(ref_s, (64,), w.float(), 1e-6)
    assert torch.allclose(y.float(), ref_y, atol=5e-2) and torch.allclose(s.float(), ref_s, atol=5e-2)
    assert torch.allclose(z.float(), ref_z, atol=5e-2)


def test_grouped_gemm_is_one_op_under_compile() -> None:
    """grouped_gemm() is one tkc.grouped_gemm op under compile (rows sorted or gathered: the output has a row per
    index entry)."""
    from tkc.kernels import grouped_gemm

    graphs = []
    x, w = torch.randn(64, 32, dtype=bf16), torch.randn(4, 48, 32, dtype=bf16)
    offsets, rows = torch.tensor([10, 20, 40, 64], dtype=torch.int32), torch.arange(100, dtype=torch.int32) % 64
    compiled = torch.compile(lambda x, w, o, r: (grouped_gemm(x, w, o, trans_b=True), grouped_gemm(x, w, o, rows=r,
                                                 trans_b=True)), backend=_keeping(graphs), fullgraph=True)
    sorted_out, gathered_out = compiled(x, w, offsets, rows)
    (graph,) = graphs
    assert _tkc_ops(graph) == ["tkc.grouped_gemm", "tkc.grouped_gemm"]
    assert sorted_out.shape == (64, 48) and gathered_out.shape == (100, 48)


def test_attention_varlen_is_one_op_under_compile() -> None:
    """attention_varlen() is one tkc.attention_varlen op under compile, its outputs q's shape and the (H, total)
    log-sum-exps."""
    from tkc.kernels import attention_varlen

    graphs = []
    q, k = torch.randn(300, 8, 64, dtype=bf16), torch.randn(300, 2, 64, dtype=bf16)
    cu = torch.tensor([0, 100, 300], dtype=torch.int32)
    compiled = torch.compile(lambda q, k, cu: (attention_varlen(q, k, k, cu, causal=True),
                                               attention_varlen(q, k, k, cu, return_lse=True)),
                             backend=_keeping(graphs), fullgraph=True)
    out, (out2, lse) = compiled(q, k, cu)
    (graph,) = graphs
    assert _tkc_ops(graph) == ["tkc.attention_varlen"] * 2 and out.shape == out2.shape == q.shape
    assert lse.shape == (8, 300) and lse.dtype == torch.float32


@pytest.mark.parametrize("use_lse", [False, True])
def test_attention_varlen_backward_is_wired(monkeypatch, use_lse: bool) -> None:
    """On inputs requiring grad attention_varlen() is the op, whose backward hands attention_varlen_backward the
    saved q, k, v, out and lse, the offsets (cu_seqlens_k only where given), the options, grad_out (zeros where only
    lse was used) and grad_lse; the kernels replaced by stand-ins on the CPU."""
    from tkc.kernels import attention_varlen, torch_ops

    calls = []

    def forward(q, k, v, cu, cu_seqlens_k=None, causal=False, scale=None, target=None, return_lse=False):
        return q * 2, torch.zeros(q.shape[1], q.shape[0])

    def backward(q, k, v, out, grad_out, lse, cu, **options):
        calls.append((grad_out.clone(), options))
        return torch.ones_like(q), torch.ones_like(k) * 2, torch.ones_like(v) * 3

    monkeypatch.setattr(torch_ops, "_attention_varlen", forward)
    monkeypatch.setattr(torch_ops, "_attention_varlen_backward_kernels", backward)
    q = torch.randn(30, 4, 64, dtype=bf16, requires_grad=True)
    k = torch.randn(30, 2, 64, dtype=bf16, requires_grad=True)
    cu = torch.tensor([0, 10, 30], dtype=torch.int32)
    if use_lse:
        _, lse = attention_varlen(q, k, k, cu, causal=True, scale=0.5, return_lse=True)
        lse.sum().backward()
    else:
        attention_varlen(q, k, k, cu, causal=True, scale=0.5).float().sum().backward()
    (grad_out, options), = calls
    assert options["causal"] is True and options["scale"] == 0.5 and options["cu_seqlens_k"] is None
    assert (options["grad_lse"] is not None) == use_lse
    assert (grad_out == 0).all() if use_lse else (grad_out == 1).all()
    assert (q.grad == 1).all() and (k.grad == 5).all()  # k passed twice (as k and v): 2 + 3


@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("gather", [False, True])
def test_grouped_gemm_gradients(monkeypatch, trans_b: bool, gather: bool) -> None:
    """grouped_gemm's backward (the formulas around its kernels, the kernels replaced by float references on the
    CPU): dx and dw as autograd finds them through a loop of matmuls; dx zero in rows no group took; with gathered
    rows (x's rows taken twice or never) dx sums what each row gave."""
    from tkc.kernels import grouped_gemm, torch_ops

    def bounds(offsets):
        return list(zip([0, *offsets.tolist()[:-1]], offsets.tolist()))

    def source(x, rows):
        return x if rows is None else x[rows.long()]

    def product_ref(x, w, offsets, rows=None, trans_b=False, target=None, out=None):
        xs = source(x, rows)
        out = xs.new_zeros((xs.shape[0], w.shape[1] if trans_b else w.shape[2])) if out is None else out
        for g, (s, e) in enumerate(bounds(offsets)):
            out[s:e] = (xs[s:e].float() @ (w[g].float().t() if trans_b else w[g].float())).to(x.dtype)
        return out

    def dx_ref(dy, w, offsets, rows, x_rows, trans_b=False, target=None):
        sums = torch.zeros(x_rows, w.shape[2] if trans_b else w.shape[1])
        part = product_ref(dy, w, offsets, trans_b=not trans_b).float()
        e = offsets.tolist()[-1]
        sums.index_add_(0, rows[:e].long(), part[:e])
        return sums.to(dy.dtype)

    def wgrad_ref(x, dy, offsets, rows=None, trans_b=False, target=None):
        xs = source(x, rows)
        parts = [(dy[s:e].float().t() @ xs[s:e].float()) if trans_b else (xs[s:e].float().t() @ dy[s:e].float())
                 for s, e in bounds(offsets)]
        return torch.stack(parts).to(x.dtype)

    monkeypatch.setattr(torch_ops, "_grouped_gemm", product_ref)
    monkeypatch.setattr(torch_ops, "_grouped_gemm_dx", dx_ref)
    monkeypatch.setattr(torch_ops, "_grouped_gemm_wgrad", wgrad_ref)
    x = torch.randn(70, 32, dtype=torch.float64).to(bf16).requires_grad_()
    w = torch.randn(4, *((48, 32) if trans_b else (32, 48)), dtype=torch.float64).to(bf16).requires_grad_()
    offsets = torch.tensor([10, 10, 40, 64], dtype=torch.int32)
    rows = (torch.arange(80, dtype=torch.int32) * 7) % 70 if gather else None  # some rows twice, some never
    out_rows = 80 if gather else 70
    dout = torch.randn(out_rows, 48, dtype=bf16)
    grouped_gemm(x, w, offsets, rows=rows, trans_b=trans_b).backward(dout)
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = torch.cat([source(xr, rows)[s:e] @ (wr[g].t() if trans_b else wr[g]) for g, (s, e) in enumerate(bounds(offsets))])
    ref.backward(dout[:64].double())
    assert torch.allclose(x.grad.double(), xr.grad, rtol=2e-2, atol=2e-1)
    if not gather:
        assert torch.equal(x.grad[64:], torch.zeros_like(x.grad[64:]))
    assert torch.allclose(w.grad.double(), wr.grad, rtol=2e-2, atol=2e-1)


def test_an_out_tensor_under_compile_receives_the_result() -> None:
    graphs = []

    inspect = _keeping(graphs)

    def fn(a, b, c):
        return gemm(a, b, out=c)

    a, b, c = torch.randn(8, 16, dtype=bf16), torch.randn(16, 24, dtype=bf16), torch.empty(8, 24, dtype=bf16)
    torch.compile(fn, backend=inspect, fullgraph=True)(a, b, c)
    (graph,) = graphs
    targets = [str(n.target) for n in graph.nodes if n.op in ("call_function", "call_method")]
    assert _tkc_ops(graph) == ["tkc.gemm"] and targets[-1] == "copy_"


@pytest.fixture
def cpu_kernels(monkeypatch):
    """The ops' eager calls replaced by float references on the CPU (the formulas around them are under test)."""
    from tkc.kernels import torch_ops

    def gemm_ref(a, b, trans_b=False, target=None):
        return (a.float() @ (b.float().t() if trans_b else b.float())).to(a.dtype)

    def scores(q, k, causal, scale):
        s = q.float() @ k.float().transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
        return s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -torch.inf) if causal else s

    def attention_ref(q, k, v, causal=False, scale=None, target=None, return_lse=False):
        s = scores(q, k, causal, scale)
        o = (torch.softmax(s, -1) @ v.float()).to(q.dtype)
        return (o, torch.logsumexp(s, -1)) if return_lse else o

    def attention_backward_ref(q, k, v, out, grad_out, lse, causal=False, scale=None, grad_lse=None, target=None):
        """The backward kernels' formulas (P from the log-sum-exp, Δ = rowsum(dO ∘ O) - dL) in float32."""
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        p = torch.exp(scores(q, k, causal, scale) - lse[..., None])
        do = grad_out.float()
        delta = (do * out.float()).sum(-1) - (0 if grad_lse is None else grad_lse)
        ds = p * (do @ v.float().transpose(-1, -2) - delta[..., None])
        return ((ds @ k.float() * scale).to(q.dtype), (ds.transpose(-1, -2) @ q.float() * scale).to(q.dtype),
                (p.transpose(-1, -2) @ do).to(q.dtype))

    def layernorm_ref(x, residual, weight, bias, eps=1e-5, target=None):
        s = x.float() + (0 if residual is None else residual.float())
        y = torch.nn.functional.layer_norm(s, (s.shape[-1],), weight.float(), bias.float(), eps)
        return y.to(x.dtype), (x if residual is None else s.to(x.dtype))

    def rmsnorm_ref(x, residual, weight, eps=1e-6, target=None):
        s = x.float() + (0 if residual is None else residual.float())
        y = torch.nn.functional.rms_norm(s, (s.shape[-1],), weight.float(), eps)
        return y.to(x.dtype), (x if residual is None else s.to(x.dtype))

    def layernorm_backward_ref(s, grad_y, grad_s, weight, eps, rms=False, target=None):
        """layernorm_bwd_kernel's formulas in float32: ds = rstd·(g - mean(g) - x̂·mean(g·x̂)) (+ grad_s)."""
        s, dy, w = s.float(), grad_y.float(), weight.float()
        centered = s if rms else s - s.mean(-1, keepdim=True)
        rstd = torch.rsqrt((centered * centered).mean(-1, keepdim=True) + eps)
        x_hat, g = centered * rstd, dy * w
        ds = rstd * (g - (0 if rms else g.mean(-1, keepdim=True)) - x_hat * (g * x_hat).mean(-1, keepdim=True))
        ds = ds + (0 if grad_s is None else grad_s.float())
        return (ds.to(grad_y.dtype), (dy * x_hat).sum(0).to(weight.dtype),
                None if rms else dy.sum(0).to(weight.dtype))

    monkeypatch.setattr(torch_ops, "_gemm", gemm_ref)
    monkeypatch.setattr(torch_ops, "_layernorm_backward_kernels", layernorm_backward_ref)
    monkeypatch.setattr(torch_ops, "_attention", attention_ref)
    monkeypatch.setattr(torch_ops, "_attention_backward_kernels", attention_backward_ref)
    monkeypatch.setattr(torch_ops, "_layernorm", layernorm_ref)
    monkeypatch.setattr(torch_ops, "_rmsnorm", rmsnorm_ref)


@pytest.mark.parametrize("trans_b", [False, True])
def test_gemm_backward_is_two_gemms(cpu_kernels, trans_b: bool) -> None:
    a = torch.randn(48, 32, dtype=torch.float32).to(bf16).requires_grad_()
    b = torch.randn(*((40, 32) if trans_b else (32, 40))).to(bf16).requires_grad_()
    grad = torch.randn(48, 40).to(bf16)
    gemm(a, b, trans_b=trans_b).backward(grad)
    a_ref, b_ref = a.detach().float().requires_grad_(), b.detach().float().requires_grad_()
    (a_ref @ (b_ref.t() if trans_b else b_ref)).backward(grad.float())
    assert a.grad.shape == a.shape and b.grad.shape == b.shape
    assert torch.allclose(a.grad.float(), a_ref.grad, rtol=2e-2, atol=2e-1)
    assert torch.allclose(b.grad.float(), b_ref.grad, rtol=2e-2, atol=2e-1)


def test_no_grad_calls_stay_off_the_autograd_graph(cpu_kernels, monkeypatch) -> None:
    """Without inputs requiring grad (or under no_grad) the entry points launch directly (here: the launch path
    refuses CPU tensors, which shows it was reached)."""
    a = torch.randn(8, 8).to(bf16).requires_grad_()
    with torch.no_grad(), pytest.raises(ValueError, match="a is on cpu"):
        gemm(a, a)
    assert gemm(a, a).grad_fn is not None


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("use_lse", [False, True])
def test_attention_backward_formulas(cpu_kernels, causal: bool, use_lse: bool) -> None:
    """attention() on inputs requiring grad keeps the log-sum-exp; the op's backward (with a gradient through the
    log-sum-exp too, or none through the output) matches autograd on the float formula."""
    q, k, v = (torch.randn(2, 3, 64, 32).to(bf16).requires_grad_() for _ in range(3))
    grad = torch.randn(2, 3, 64, 32)
    if use_lse:
        o, lse = attention(q, k, v, causal=causal, return_lse=True)
        loss = (o.float() * grad).sum() + lse.sin().sum()
    else:
        loss = (attention(q, k, v, causal=causal).float() * grad).sum()
    loss.backward()
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    s = leaves[0] @ leaves[1].transpose(-1, -2) * 32**-0.5
    if causal:
        s = s.masked_fill(torch.ones(64, 64, dtype=torch.bool).triu(1), -torch.inf)
    ref_loss = ((torch.softmax(s, -1) @ leaves[2]) * grad).sum()
    (ref_loss + (torch.logsumexp(s, -1).sin().sum() if use_lse else 0)).backward()
    for got, ref in zip((q, k, v), leaves):
        assert torch.allclose(got.grad.float(), ref.grad, rtol=3e-2, atol=3e-2)


def test_the_attention_op_called_directly_has_a_backward(cpu_kernels) -> None:
    """torch.ops.tkc.attention (no log-sum-exp kept) under autograd: its backward runs the forward again for it."""
    from tkc.kernels import torch_ops  # noqa: F401  (registers torch.ops.tkc.*)

    q, k, v = (torch.randn(1, 2, 64, 32).to(bf16).requires_grad_() for _ in range(3))
    torch.ops.tkc.attention(q, k, v, True, None, None).float().sum().backward()
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    s = (leaves[0] @ leaves[1].transpose(-1, -2) * 32**-0.5).masked_fill(torch.ones(64, 64, dtype=torch.bool).triu(1),
                                                                         -torch.inf)
    (torch.softmax(s, -1) @ leaves[2]).sum().backward()
    for got, ref in zip((q, k, v), leaves):
        assert torch.allclose(got.grad.float(), ref.grad, rtol=3e-2, atol=3e-2)


def test_attention_lse_alone(cpu_kernels) -> None:
    """A loss on the log-sum-exp alone (no gradient for the output) runs."""
    q = torch.randn(1, 2, 64, 64).to(bf16).requires_grad_()
    attention(q, q, q, return_lse=True)[1].sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("use_new_residual", [False, True])
def test_norm_backward_formulas(cpu_kernels, rms: bool, residual: bool, use_new_residual: bool) -> None:
    """layernorm() / rmsnorm() on inputs requiring grad: the op's backward (x, the residual, weight and bias; with a
    loss on the new residual stream too, or none) matches autograd on torch's own norms in float32; 3-D inputs."""
    from tkc.kernels import rmsnorm

    x, r = (torch.randn(2, 5, 64).to(bf16).requires_grad_() for _ in range(2))
    w, b = torch.randn(64).to(bf16).requires_grad_(), torch.randn(64).to(bf16).requires_grad_()
    grad, grad_s = torch.randn(2, 5, 64), torch.randn(2, 5, 64)
    y, s = rmsnorm(x, r if residual else None, w) if rms else layernorm(x, r if residual else None, w, b)
    ((y.float() * grad).sum() + ((s.float() * grad_s).sum() if use_new_residual and residual else 0)).backward()
    leaves = [t.detach().float().requires_grad_() for t in (x, r, w, b)]
    s_ref = leaves[0] + leaves[1] if residual else leaves[0]
    y_ref = (torch.nn.functional.rms_norm(s_ref, (64,), leaves[2], 1e-6) if rms
             else torch.nn.functional.layer_norm(s_ref, (64,), leaves[2], leaves[3], 1e-5))
    ((y_ref * grad).sum() + ((s_ref * grad_s).sum() if use_new_residual and residual else 0)).backward()
    for got, ref in zip((x, r, w, b), leaves):
        if ref.grad is None:
            assert got.grad is None
        else:
            assert got.grad.shape == got.shape and torch.allclose(got.grad.float(), ref.grad, rtol=3e-2, atol=3e-2)
