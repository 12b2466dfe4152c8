"""Kernels users import: each module holds a tile kernel and its entry point for torch tensors.

    tkc.kernels.gemm(a, b, trans_b=False)                  # bf16 GEMM, f32 accumulation
    tkc.kernels.grouped_gemm(x, w, offsets, rows=None)     # a GEMM a group of rows (experts), rows gathered or not
    tkc.kernels.grouped_gemm_wgrad(x, dy, offsets)         # its weights' gradient (autograd calls it)
    tkc.kernels.grouped_gemm_dx(dy, w, offsets, rows, T)   # x's, rows gathered: added back into x's rows
    tkc.kernels.attention(q, k, v, causal=False)           # FlashAttention-2-style forward
    tkc.kernels.attention_backward(q, k, v, o, do, lse)    # its gradients (autograd calls it)
    tkc.kernels.attention_varlen(q, k, v, cu_seqlens)      # packed sequences of different lengths
    tkc.kernels.attention_kvcache(q, kc, vc, seqlens)      # decoding over caches filled to different lengths
    tkc.kernels.attention_varlen_backward(...)             # its gradients (autograd calls it)
    tkc.kernels.layernorm(x, residual, weight, bias)       # LayerNorm with a fused residual add (or None)
    tkc.kernels.rmsnorm(x, residual, weight)               # RMSNorm, the same
    tkc.kernels.layernorm_backward(s, dy, ds, weight, eps)  # their gradients (autograd calls it)
    tkc.kernels.scaled_mm(a, b, scale_a, scale_b)          # fp8 (e4m3) GEMM with scales, as torch._scaled_mm
    tkc.kernels.rotary(x, cos, sin, offset=0)              # rotary position embedding (rotate-half), any strides
    tkc.kernels.rotary_qk(q, k, cos, sin)                  # q and k turned alike in one launch

Under torch.compile / torch.export, and on inputs that require grad, each call is a `torch.ops.tkc.*` custom op
(tkc/kernels/torch_ops.py): one opaque node of the graph; gemm, attention, the norms and rotary have a backward
(grouped_gemm's: grouped_gemm_wgrad its weights' gradient, grouped_gemm_dx x's where rows were gathered);
attention_varlen's: attention_varlen_backward.
"""

from tkc.kernels.attention import attention, attention_fwd, attention_fwd_lse, attention_kvcache, attention_sm90
from tkc.kernels.attention_varlen import (attention_varlen, attention_varlen_backward, attention_varlen_fwd,
                                         attention_varlen_sm90)
from tkc.kernels.attention_bwd import (attention_backward, attention_bwd_delta, attention_bwd_dkdv,
                                      attention_bwd_dq)
from tkc.kernels.gemm import gemm, gemm_kernel, gemm_sm90_kernel, gemm_split_k_kernel, sum_splits_kernel
from tkc.kernels.grouped_gemm import (grouped_gemm, grouped_gemm_dx, grouped_gemm_kernel, grouped_gemm_sm90_kernel,
                                      grouped_gemm_wgrad, grouped_gemm_wgrad_kernel, grouped_gemm_wgrad_sm90_kernel)
from tkc.kernels.layernorm import layernorm, layernorm_kernel, rmsnorm
from tkc.kernels.layernorm_bwd import layernorm_backward, layernorm_bwd_kernel
from tkc.kernels.rotary import rotary, rotary_kernel, rotary_qk
from tkc.kernels.scaled_mm import scaled_mm, scaled_mm_kernel

__all__ = ["attention", "attention_backward", "attention_bwd_delta", "attention_bwd_dkdv", "attention_bwd_dq",
           "attention_fwd", "attention_fwd_lse", "attention_kvcache", "attention_sm90", "attention_varlen", "attention_varlen_backward", "attention_varlen_fwd", "attention_varlen_sm90", "gemm", "gemm_kernel", "gemm_sm90_kernel", "gemm_split_k_kernel",
           "grouped_gemm", "grouped_gemm_dx", "grouped_gemm_kernel", "grouped_gemm_sm90_kernel", "grouped_gemm_wgrad",
           "grouped_gemm_wgrad_kernel", "grouped_gemm_wgrad_sm90_kernel", "layernorm", "layernorm_backward", "layernorm_bwd_kernel", "layernorm_kernel", "rmsnorm", "rotary", "rotary_kernel", "rotary_qk", "scaled_mm", "scaled_mm_kernel", "sum_splits_kernel"]
