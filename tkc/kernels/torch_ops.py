"""tkc's kernels as torch custom ops (`torch.ops.tkc.*`), so that they survive torch.compile and torch.export, and
autograd knows them.

Under compilation, and where an input requires grad, the entry points (tkc.kernels.gemm, attention, layernorm)
call these ops instead of launching: the traced graph holds one opaque op per call, its output shapes from the fake
implementations below, and the op runs the entry point eagerly. gemm has a backward (tkc GEMMs), attention_lse
and attention too (tkc's attention backward kernels; attention() on inputs requiring grad goes through
attention_lse, which keeps the log-sum-exp the backward needs), layernorm too (layernorm_bwd_kernel, RMSNorm
included: dx = dresidual, dweight, dbias). Imported on first use (importing tkc.kernels does not import torch).

    torch.ops.tkc.gemm(a, b, trans_b, target)                          -> c
    torch.ops.tkc.attention(q, k, v, causal, scale, target)            -> o
    torch.ops.tkc.attention_lse(q, k, v, causal, scale, target)        -> (o, lse)
    torch.ops.tkc.attention_varlen(q, k, v, cu_seqlens, cu_seqlens_k, causal, scale, target) -> (o, lse) (its
        gradients: attention_varlen_backward's kernels, through lse too)
    torch.ops.tkc.layernorm(x, residual, weight, bias, eps, target, rms) -> (y, x + residual)
        (rms: RMSNorm, bias None; residual None: a 0-element tensor in place of the second, which would be x)
    torch.ops.tkc.scaled_mm(a, b, scale_a, scale_b, bias, out_dtype, target) -> c (fp8: no backward)
    torch.ops.tkc.rotary(x, cos, sin, offset, interleaved, conjugate, target, positions) -> x turned (its gradient:
        turned back)
    torch.ops.tkc.grouped_gemm(x, w, offsets, rows, trans_b, target) -> out (its gradients: dx by grouped_gemm with
        w the other way round, or grouped_gemm_dx where rows were gathered; dw by grouped_gemm_wgrad)
"""

from __future__ import annotations

import torch

from tkc.kernels.attention import attention as _attention
from tkc.kernels.attention_bwd import attention_backward as _attention_backward_kernels
from tkc.kernels.attention_varlen import attention_varlen as _attention_varlen
from tkc.kernels.attention_varlen import attention_varlen_backward as _attention_varlen_backward_kernels
from tkc.kernels.gemm import gemm as _gemm
from tkc.kernels.grouped_gemm import grouped_gemm as _grouped_gemm
from tkc.kernels.grouped_gemm import grouped_gemm_dx as _grouped_gemm_dx
from tkc.kernels.grouped_gemm import grouped_gemm_wgrad as _grouped_gemm_wgrad
from tkc.kernels.layernorm import layernorm as _layernorm
from tkc.kernels.layernorm import rmsnorm as _rmsnorm
from tkc.kernels.layernorm_bwd import layernorm_backward as _layernorm_backward_kernels
from tkc.kernels.rotary import rotary as _rotary
from tkc.kernels.scaled_mm import scaled_mm as _scaled_mm


@torch.library.custom_op("tkc::gemm", mutates_args=())
def gemm(a: torch.Tensor, b: torch.Tensor, trans_b: bool = False, target: str | None = None) -> torch.Tensor:
    return _gemm(a, b, trans_b=trans_b, target=target)


@gemm.register_fake
def _(a: torch.Tensor, b: torch.Tensor, trans_b: bool = False, target: str | None = None) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[0] if trans_b else b.shape[1]))


def _gemm_setup(ctx, inputs, output) -> None:
    a, b, trans_b, target = inputs
    ctx.save_for_backward(a, b)
    ctx.trans_b, ctx.target = trans_b, target


def _gemm_backward(ctx, grad: torch.Tensor):
    """C = A·B: dA = dC·Bᵀ, dB = Aᵀ·dC; C = A·Bᵀ: dA = dC·B, dB = dCᵀ·A — each a tkc GEMM (the transposed
    left operands copied row-major: gemm() reads a row-major `a`)."""
    a, b = ctx.saved_tensors
    grad = grad.contiguous()
    da = db = None
    if ctx.needs_input_grad[0]:
        da = gemm(grad, b, not ctx.trans_b, ctx.target)
    if ctx.needs_input_grad[1]:
        db = gemm(grad.t().contiguous(), a, False, ctx.target) if ctx.trans_b else gemm(a.t().contiguous(), grad,
                                                                                          False, ctx.target)
    return da, db, None, None


gemm.register_autograd(_gemm_backward, setup_context=_gemm_setup)


@torch.library.custom_op("tkc::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None,
              target: str | None = None) -> torch.Tensor:
    return _attention(q, k, v, causal=causal, scale=scale, target=target)


@attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None,
      target: str | None = None) -> torch.Tensor:
    return torch.empty_like(q)  # the entry point's output takes q's layout


@torch.library.custom_op("tkc::attention_lse", mutates_args=())
def attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                  scale: float | None = None, target: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return _attention(q, k, v, causal=causal, scale=scale, target=target, return_lse=True)


@attention_lse.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None,
      target: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


def _attention_setup(ctx, inputs, output) -> None:
    """attention_lse's and attention's: q, k, v and the output(s) saved, the options kept."""
    ctx.save_for_backward(*inputs[:3], *(output if isinstance(output, tuple) else (output,)))
    ctx.causal, ctx.scale, ctx.target = inputs[3:]
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None (no zeros to read)


def _kernel_grads(out: torch.Tensor, grad_out: torch.Tensor | None,
                  grad_lse: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """An attention op's incoming gradients as its backward kernels read them: the last dimension contiguous
    (lse.sum()'s gradient is one value expanded, strides 0), grad_out zeros where only the log-sum-exps were used."""
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    elif grad_out.stride(-1) != 1:
        grad_out = grad_out.contiguous()
    if grad_lse is not None and grad_lse.stride(-1) != 1:
        grad_lse = grad_lse.contiguous()
    return grad_out, grad_lse


def _attention_gradients(ctx, q, k, v, out, lse, grad_out, grad_lse):
    """dq, dk, dv by tkc's backward kernels (tkc/kernels/attention_bwd.py), the gradients as _kernel_grads makes
    them."""
    grad_out, grad_lse = _kernel_grads(out, grad_out, grad_lse)
    return _attention_backward_kernels(q, k, v, out, grad_out, lse, causal=ctx.causal, scale=ctx.scale,
                                       grad_lse=grad_lse, target=ctx.target)


def _attention_lse_backward(ctx, grad_out: torch.Tensor | None, grad_lse: torch.Tensor | None):
    return *_attention_gradients(ctx, *ctx.saved_tensors, grad_out, grad_lse), None, None, None


def _attention_backward(ctx, grad_out: torch.Tensor):
    """tkc.attention called as an op (the entry point takes attention_lse under autograd): the log-sum-exp it did
    not keep comes from one more forward."""
    q, k, v, out = ctx.saved_tensors
    _, lse = _attention(q, k, v, causal=ctx.causal, scale=ctx.scale, target=ctx.target, return_lse=True)
    return *_attention_gradients(ctx, q, k, v, out, lse, grad_out, None), None, None, None


attention_lse.register_autograd(_attention_lse_backward, setup_context=_attention_setup)
attention.register_autograd(_attention_backward, setup_context=_attention_setup)


@torch.library.custom_op("tkc::attention_varlen", mutates_args=())
def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     cu_seqlens_k: torch.Tensor | None = None, causal: bool = False, scale: float | None = None,
                     target: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return _attention_varlen(q, k, v, cu_seqlens, cu_seqlens_k=cu_seqlens_k, causal=causal, scale=scale,
                             target=target, return_lse=True)


@attention_varlen.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
      cu_seqlens_k: torch.Tensor | None = None, causal: bool = False, scale: float | None = None,
      target: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def _attention_varlen_setup(ctx, inputs, output) -> None:
    """attention_varlen's: q, k, v, the offsets and both outputs saved, the options kept."""
    q, k, v, cu_seqlens, cu_seqlens_k, ctx.causal, ctx.scale, ctx.target = inputs
    ctx.keys_apart = cu_seqlens_k is not None
    ctx.save_for_backward(q, k, v, cu_seqlens, cu_seqlens if cu_seqlens_k is None else cu_seqlens_k, *output)
    ctx.set_materialize_grads(False)


def _attention_varlen_backward(ctx, grad_out: torch.Tensor | None, grad_lse: torch.Tensor | None):
    """dq, dk, dv by attention_varlen_backward's kernels, the gradients as _kernel_grads makes them."""
    q, k, v, cu_seqlens, cu_seqlens_k, out, lse = ctx.saved_tensors
    grad_out, grad_lse = _kernel_grads(out, grad_out, grad_lse)
    grads = _attention_varlen_backward_kernels(q, k, v, out, grad_out, lse, cu_seqlens,
                                               cu_seqlens_k=cu_seqlens_k if ctx.keys_apart else None,
                                               causal=ctx.causal, scale=ctx.scale, grad_lse=grad_lse,
                                               target=None if ctx.target == "sm_90a" else ctx.target)
    return *grads, None, None, None, None, None


attention_varlen.register_autograd(_attention_varlen_backward, setup_context=_attention_varlen_setup)


@torch.library.custom_op("tkc::layernorm", mutates_args=())
def layernorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None,
              eps: float = 1e-5, target: str | None = None, rms: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    if rms:
        y, s = _rmsnorm(x, residual, weight, eps=eps, target=target)
    else:
        y, s = _layernorm(x, residual, weight, bias, eps=eps, target=target)
    return y, (x.new_empty(0) if residual is None else s)  # an op's outputs may not alias its inputs


@layernorm.register_fake
def _(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None,
      eps: float = 1e-5, target: str | None = None, rms: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), (x.new_empty(0) if residual is None else torch.empty_like(x))


def _layernorm_setup(ctx, inputs, output) -> None:
    """The normalized input s (the new residual, or x itself without a residual) and the weight saved."""
    x, residual, weight, bias, eps, target, rms = inputs
    ctx.save_for_backward(x if residual is None else output[1], weight)
    ctx.eps, ctx.target, ctx.rms, ctx.residual = eps, target, rms, residual is not None
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None (no zeros to read)


def _layernorm_backward(ctx, grad_y: torch.Tensor | None, grad_s: torch.Tensor | None):
    """dx (= dresidual), dweight, dbias by layernorm_bwd_kernel and two column sums (tkc/kernels/layernorm_bwd.py),
    on rows: (..., D) made (rows, D)."""
    s, weight = ctx.saved_tensors
    d = s.shape[-1]
    rows = s.contiguous().view(-1, d)
    grad_y = torch.zeros_like(rows) if grad_y is None else grad_y.contiguous().view(-1, d)
    grad_s = grad_s.contiguous().view(-1, d) if grad_s is not None and ctx.residual else None
    ds, dw, db = _layernorm_backward_kernels(rows, grad_y, grad_s, weight, ctx.eps, ctx.rms, ctx.target)
    ds = ds.view(s.shape)
    return ds, (ds if ctx.residual else None), dw, db, None, None, None


layernorm.register_autograd(_layernorm_backward, setup_context=_layernorm_setup)


@torch.library.custom_op("tkc::scaled_mm", mutates_args=())
def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
              bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
              target: str | None = None) -> torch.Tensor:
    return _scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype, target=target)


@scaled_mm.register_fake
def _(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
      bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
      target: str | None = None) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype or torch.bfloat16)


@torch.library.custom_op("tkc::rotary", mutates_args=())
def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, offset: int = 0, interleaved: bool = False,
           conjugate: bool = False, target: str | None = None,
           positions: torch.Tensor | None = None) -> torch.Tensor:
    return _rotary(x, cos, sin, offset=offset, positions=positions, interleaved=interleaved, conjugate=conjugate,
                   target=target)


@rotary.register_fake
def _(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, offset: int = 0, interleaved: bool = False,
      conjugate: bool = False, target: str | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
    return torch.empty_like(x)


def _rotary_setup(ctx, inputs, output) -> None:
    x, cos, sin, offset, interleaved, conjugate, target, positions = inputs
    ctx.save_for_backward(cos, sin, positions)
    ctx.offset, ctx.interleaved, ctx.conjugate, ctx.target = offset, interleaved, conjugate, target


def _rotary_backward(ctx, grad: torch.Tensor):
    """A rotation's gradient is the opposite rotation: the same kernel with sin negated (the rest passes through)."""
    cos, sin, positions = ctx.saved_tensors
    return (rotary(grad, cos, sin, ctx.offset, ctx.interleaved, not ctx.conjugate, ctx.target, positions),
            None, None, None, None, None, None, None)


rotary.register_autograd(_rotary_backward, setup_context=_rotary_setup)


@torch.library.custom_op("tkc::grouped_gemm", mutates_args=())
def grouped_gemm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, rows: torch.Tensor | None = None,
                 trans_b: bool = False, target: str | None = None) -> torch.Tensor:
    return _grouped_gemm(x, w, offsets, rows=rows, trans_b=trans_b, target=target)


@grouped_gemm.register_fake
def _(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, rows: torch.Tensor | None = None,
      trans_b: bool = False, target: str | None = None) -> torch.Tensor:
    return x.new_empty((x.shape[0] if rows is None else rows.shape[0], w.shape[1] if trans_b else w.shape[2]))


def _grouped_gemm_setup(ctx, inputs, output) -> None:
    x, w, offsets, rows, trans_b, target = inputs
    ctx.save_for_backward(x, w, offsets, rows)
    ctx.trans_b, ctx.target = trans_b, target


def _grouped_gemm_backward(ctx, grad: torch.Tensor):
    """out_g = x_g · w[g] (or · w[g]ᵀ): dx_g = dout_g · w[g]ᵀ (or · w[g]), grouped_gemm with w the other way round,
    zeros past the last offset (rows no group took), or with gathered rows those products added into x's rows
    (grouped_gemm_dx); dw[g] = x_gᵀ · dout_g (or its transpose), grouped_gemm_wgrad (gathering x's rows alike)."""
    x, w, offsets, rows = ctx.saved_tensors
    grad = grad.contiguous()
    dx = dw = None
    if ctx.needs_input_grad[0]:
        if rows is None:
            dx = _grouped_gemm(grad, w, offsets, trans_b=not ctx.trans_b, target=ctx.target, out=torch.zeros_like(x))
        else:
            dx = _grouped_gemm_dx(grad, w, offsets, rows, x.shape[0], trans_b=ctx.trans_b, target=ctx.target)
    if ctx.needs_input_grad[1]:
        dw = _grouped_gemm_wgrad(x, grad, offsets, rows=rows, trans_b=ctx.trans_b, target=ctx.target)
    return dx, dw, None, None, None, None


grouped_gemm.register_autograd(_grouped_gemm_backward, setup_context=_grouped_gemm_setup)
