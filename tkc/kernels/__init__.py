"""Kernels users import. Each module holds kernels written in tkc's language; the launch wrappers that take torch
tensors (`tkc.kernels.gemm(a, b)` and friends) come with the GPU runtime."""

from tkc.kernels.attention import attention_fwd
from tkc.kernels.gemm import gemm_kernel
from tkc.kernels.layernorm import layernorm_kernel

__all__ = ["attention_fwd", "gemm_kernel", "layernorm_kernel"]
