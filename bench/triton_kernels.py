"""Triton kernels used only as benchmark peers for tkc's kernels (never part of tkc's compile path).

    matmul(a, b)                                  (M, K) @ (K, N) -> (M, N), bf16 in and out, fp32 accumulation
    scaled_mm(a, b, scale_a, scale_b)             as torch._scaled_mm: fp8 e4m3 in, bf16 out, fp32 accumulation
    attention(q, k, v, causal=False, scale=None)  FlashAttention-2 style forward, (B, H, N, D) bf16, D in {64, 128}
    layernorm(x, residual, weight, bias, eps)     (LayerNorm(x + residual) * weight + bias, x + residual), bf16
    rotary(x, cos, sin, interleaved=False)        rotary embedding of (B, H, N, D), any outer strides
    grouped_gemm(x, w, offsets, rows=None)        a GEMM a group of rows (torch._grouped_mm's offs), rows gathered

Every function takes and returns bf16 CUDA tensors and launches one Triton kernel (only a degenerate K = 0
matmul is a plain zero fill). The matmul and attention kernels are autotuned: the first call for a new key
(shape, and causal for attention) times every config once, so benchmarks must warm up before timing.

Written for Hopper (H100 / H200): on sm_90, Triton lowers `tl.dot` on bf16 blocks of these sizes to wgmma and
software-pipelines the loads over `num_stages` shared-memory buffers (cp.async for pointer loads, TMA for tensor
descriptors). Needs Triton 3.x with `triton.tools.tensor_descriptor` (written against 3.6).
`check_triton.py` beside this file checks the three against float32 torch references.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

__all__ = ["attention", "grouped_gemm", "layernorm", "matmul", "scaled_mm"]


# --------------------------------------------------------------------------------------------------------------------
# Matmul
# --------------------------------------------------------------------------------------------------------------------

_MATMUL_SHAPES = [  # (BLOCK_M, BLOCK_N, num_stages, num_warps); BLOCK_K is 64 throughout
    # 128x256 with 8 warps (two warpgroups, each issuing 64x256 wgmmas) is the usual winner on Hopper for large
    # problems; the 128x128 shapes win where 128x256 tiles would leave SMs idle (small or skinny products).
    (128, 256, 3, 8),
    (128, 256, 4, 8),
    (256, 128, 3, 8),
    (128, 128, 4, 4),
    (128, 128, 4, 8),
    (128, 128, 3, 8),
]


def _set_tma_blocks(nargs):
    # The descriptors' block shapes must match the config being launched; the autotuner calls this before
    # every launch (timing runs included), after which Triton specializes the kernel on the block shapes.
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["a_desc"].block_shape = [bm, bk]
    nargs["b_desc"].block_shape = [bk, bn]
    nargs["c_desc"].block_shape = [bm, bn]


def _matmul_configs(pre_hook=None) -> list[triton.Config]:
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=stages,
                          num_warps=warps, pre_hook=pre_hook)
            for bm, bn, stages, warps in _MATMUL_SHAPES]


@triton.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    # Grouped ("swizzled") launch order: consecutive programs walk down a column of GROUP_M row-tiles before
    # moving to the next column, so the A row-panels and B column-panels they share stay resident in L2.
    pids_per_group = GROUP_M * num_pid_n
    first_pid_m = (tile_id // pids_per_group) * GROUP_M
    group_rows = min(num_pid_m - first_pid_m, GROUP_M)  # the last group may be short
    pid_m = first_pid_m + (tile_id % pids_per_group) % group_rows
    pid_n = (tile_id % pids_per_group) // group_rows
    return pid_m, pid_n


@triton.autotune(configs=_matmul_configs(_set_tma_blocks), key=["M", "N", "K"])
@triton.jit
def _matmul_tma_kernel(a_desc, b_desc, c_desc, M, N, K,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # Tiles move through TMA (bulk tensor copies): the copy engine zero-fills reads past the tensor's edges and
    # clips writes, so partial tiles at the M, N and K edges need no masks here.
    pid_m, pid_n = _tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
        b = b_desc.load([ki * BLOCK_K, pid_n * BLOCK_N])
        acc = tl.dot(a, b, acc)
    c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(tl.bfloat16))


@triton.autotune(configs=_matmul_configs(), key=["M", "N", "K"])
@triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
@triton.jit
def _matmul_ptr_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    # Fallback for operands TMA cannot describe (see matmul): plain pointer loads, which Triton pipelines
    # through cp.async into shared memory.
    pid_m, pid_n = _tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

    # Rows of A and columns of B past the edge are wrapped back into range (modulo) instead of masked: they
    # only feed output elements that the masked store drops, and unmasked loads keep the pipeline simple. The
    # hints tell the compiler the wrapped offsets are still contiguous runs, so the loads stay vectorized.
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_m = tl.max_contiguous(tl.multiple_of(offs_m, BLOCK_M), BLOCK_M)
    offs_n = tl.max_contiguous(tl.multiple_of(offs_n, BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            # The K tail cannot be wrapped: out-of-range K terms must contribute exactly zero.
            k_left = K - ki * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    # Store with the unwrapped indices so that wrapped rows/columns are dropped.
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(tl.bfloat16), mask=(rows[:, None] < M) & (cols[None, :] < N))


def _tma_ok(t: torch.Tensor) -> bool:
    # What a 2-D TMA descriptor needs: unit inner stride, 16-byte aligned base and row pitch.
    return t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (M, K) @ b (K, N) -> (M, N) bf16, accumulated in fp32. Any M, N, K >= 1 and any strides.

    Row-major operands with K and N multiples of 8 (16-byte rows) take the TMA kernel; anything else (odd
    sizes, transposed views) takes the pointer kernel, a few percent slower on Hopper."""
    assert a.is_cuda and b.is_cuda, "matmul: CUDA tensors expected"
    assert a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16, "matmul: bf16 tensors expected"
    assert a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0], \
        f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not chain"
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=torch.bfloat16)
    if M == 0 or N == 0:
        return c
    if K == 0:
        return c.zero_()

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    if _tma_ok(a) and _tma_ok(b) and _tma_ok(c):
        # Host-side descriptors; the block shapes given here are placeholders that _set_tma_blocks replaces.
        descs = [TensorDescriptor.from_tensor(t, [16, 16]) for t in (a, b, c)]
        _matmul_tma_kernel[grid](*descs, M, N, K)
    else:
        _matmul_ptr_kernel[grid](
            a, b, c, M, N, K,
            a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        )
    return c


def _set_scaled_mm_blocks(nargs):
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["a_desc"].block_shape = [bm, bk]
    nargs["b_desc"].block_shape = [bn, bk]
    nargs["c_desc"].block_shape = [bm, bn]


@triton.autotune(configs=[triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 128, "GROUP_M": 8},
                                        num_stages=stages, num_warps=warps, pre_hook=_set_scaled_mm_blocks)
                          for bm, bn, stages, warps in _MATMUL_SHAPES], key=["M", "N", "K", "ROWWISE"])
@triton.jit
def _scaled_mm_kernel(a_desc, b_desc, c_desc, scale_a_ptr, scale_b_ptr, M, N, K, ROWWISE: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # fp8 tiles through TMA, both K-major (b is the N×K weight), fp8 wgmma accumulating in fp32, scaled at the end.
    pid_m, pid_n = _tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
        b = b_desc.load([pid_n * BLOCK_N, ki * BLOCK_K])
        acc = tl.dot(a, b.T, acc)
    if ROWWISE:
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = acc * tl.load(scale_a_ptr + rows, mask=rows < M, other=0.0)[:, None]
        acc = acc * tl.load(scale_b_ptr + cols, mask=cols < N, other=0.0)[None, :]
    else:
        acc = acc * (tl.load(scale_a_ptr) * tl.load(scale_b_ptr))
    c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(tl.bfloat16))


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor) -> torch.Tensor:
    """As torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=bf16): a (M, K) float8_e4m3fn row-major, b (K, N)
    column-major (an N×K weight's .t()), scales of one element each or (M, 1) and (1, N) float32; 16-byte rows."""
    M, K = a.shape
    N = b.shape[1]
    weight = b.t()
    assert a.dtype == weight.dtype == torch.float8_e4m3fn and _tma_ok(a) and _tma_ok(weight), "scaled_mm: operands"
    c = torch.empty((M, N), device=a.device, dtype=torch.bfloat16)
    descs = [TensorDescriptor.from_tensor(t, [16, 16]) for t in (a, weight, c)]
    rowwise = scale_a.numel() > 1

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    _scaled_mm_kernel[grid](*descs, scale_a, scale_b, M, N, K, ROWWISE=rowwise)
    return c


# --------------------------------------------------------------------------------------------------------------------
# Attention (forward)
# --------------------------------------------------------------------------------------------------------------------

_LOG2E = 1.4426950408889634


def _attention_configs() -> list[triton.Config]:
    configs = []
    for bn, stages, warps in [(64, 3, 4), (64, 4, 4), (64, 3, 8), (64, 4, 8), (128, 2, 8), (128, 3, 8)]:
        configs.append(triton.Config({"BLOCK_M": 128, "BLOCK_N": bn}, num_stages=stages, num_warps=warps))
    return configs


def _prune_attention_configs(configs, named_args, **kwargs):
    # With D=128, four warps would hold a 128x128 fp32 accumulator plus the scores in 128 threads' registers:
    # ptxas spills (checked for sm_90), so those configs are not worth timing.
    if kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM")) == 128:
        configs = [c for c in configs if c.num_warps >= 8]
    return configs


@triton.jit
def _attention_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, qk_scale, start_m,
                     lo, hi, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    """Folds the key/value blocks [lo, hi) (key positions) into the running (acc, l_i, m_i) of one query block.

    m_i is kept in the log2 domain already multiplied by scale·log2(e), so each score costs a single FMA
    (qk * qk_scale - m) before exp2. MASKED applies the causal mask; it is only set for the blocks that cross
    the diagonal, so the bulk of the loop carries no masking work.
    """
    k_ptrs += lo * stride_kn
    v_ptrs += lo * stride_vn
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = tl.load(k_ptrs)
        qk = tl.dot(q, tl.trans(k))
        if MASKED:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            causal = offs_m[:, None] >= offs_n[None, :]
            # -1e6 rather than -inf: every query row keeps its own diagonal key, so no row is fully masked,
            # and a finite value keeps exp2 of (masked - m) exactly 0 without inf - inf hazards.
            qk = qk * qk_scale + tl.where(causal, 0.0, -1.0e6)
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            qk -= m_new[:, None]
        else:
            # max(qk) * scale == max(qk * scale) because the scale is positive: one multiply per row, not per score.
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_new[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_new)  # rescales what was accumulated under the old running max
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = tl.load(v_ptrs)
        acc = tl.dot(p.to(tl.bfloat16), v, acc)
        m_i = m_new
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return acc, l_i, m_i


@triton.autotune(configs=_attention_configs(), key=["N_CTX", "HEAD_DIM", "CAUSAL"],
                 prune_configs_by={"early_config_prune": _prune_attention_configs})
@triton.jit
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N_CTX,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Grid: (query blocks, B*H). Query blocks vary fastest, so the programs running together share one head's
    # K and V in L2.
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    q_base = q_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    k_base = k_ptr + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    v_base = v_ptr + b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
    o_base = o_ptr + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_base + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd)
    k_ptrs = k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
    v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)

    if CAUSAL:
        # Keys strictly before this query block need no mask; keys inside the block's own diagonal span get
        # the mask; keys after it are skipped entirely. Needs BLOCK_M % BLOCK_N == 0 (true for every config).
        diag_lo = start_m * BLOCK_M
        acc, l_i, m_i = _attention_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, qk_scale,
                                         start_m, 0, diag_lo, BLOCK_M, BLOCK_N, False)
        acc, l_i, m_i = _attention_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, qk_scale,
                                         start_m, diag_lo, diag_lo + BLOCK_M, BLOCK_M, BLOCK_N, True)
    else:
        acc, l_i, m_i = _attention_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, qk_scale,
                                         start_m, 0, N_CTX, BLOCK_M, BLOCK_N, False)

    acc = acc / l_i[:, None]
    tl.store(o_base + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od, acc.to(tl.bfloat16))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: float | None = None) -> torch.Tensor:
    """softmax(q kᵀ · scale [+ causal mask]) v for (B, H, N, D) bf16 tensors; scale defaults to 1/sqrt(D).

    D must be 64 or 128 and N a multiple of 128 (the kernel has no sequence-edge masking)."""
    assert q.is_cuda and k.is_cuda and v.is_cuda, "attention: CUDA tensors expected"
    assert q.dtype == k.dtype == v.dtype == torch.bfloat16, "attention: bf16 tensors expected"
    assert q.dim() == 4 and q.shape == k.shape == v.shape, "attention: q, k, v must share one (B, H, N, D) shape"
    B, H, N, D = q.shape
    assert D in (64, 128), f"attention: head dim must be 64 or 128, got {D}"
    assert N % 128 == 0, f"attention: sequence length must be a multiple of 128, got {N}"
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    assert scale > 0, "attention: scale must be positive (the kernel takes row maxima before scaling)"
    o = torch.empty_like(q)

    def grid(meta):
        return (triton.cdiv(N, meta["BLOCK_M"]), B * H)

    _attention_kernel[grid](
        q, k, v, o, scale * _LOG2E,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        H, N,
        HEAD_DIM=D, CAUSAL=bool(causal),
    )
    return o


# --------------------------------------------------------------------------------------------------------------------
# LayerNorm with fused residual add
# --------------------------------------------------------------------------------------------------------------------

@triton.jit
def _layernorm_kernel(
    x_ptr, res_ptr, w_ptr, b_ptr, out_ptr, res_out_ptr,
    stride_x, stride_res, stride_out, stride_res_out,
    D, eps,
    BLOCK_D: tl.constexpr, RMS: tl.constexpr,
):
    # One program per row; the whole row lives in registers (BLOCK_D >= D), so x and residual are read once.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0).to(tl.float32)
    s = x + r
    tl.store(res_out_ptr + row * stride_res_out + cols, s.to(tl.bfloat16), mask=mask)
    # Statistics and normalization use the fp32 sum (as tkc's kernel does), not its bf16-rounded copy; the two
    # differ by bf16 rounding only. The row is in registers, so the variance is two-pass, free of cancellation.
    # RMS: RMSNorm, s / sqrt(mean(s²) + eps) · w (no mean, no bias).
    if RMS:
        diff = s
    else:
        diff = tl.where(mask, s - tl.sum(s, axis=0) / D, 0.0)
    var = tl.sum(diff * diff, axis=0) / D
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = diff * rstd * w
    if not RMS:
        y += tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, y.to(tl.bfloat16), mask=mask)


def layernorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              eps: float = 1e-5, rms: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(LayerNorm(x + residual) * weight + bias, x + residual) for (rows, D) bf16 x and residual and (D,) bf16
    weight and bias; statistics in fp32. D up to 16384. rms: RMSNorm (bias None: not read)."""
    if rms:
        bias = weight  # a stand-in the kernel does not read
    assert x.is_cuda and residual.is_cuda and weight.is_cuda and bias.is_cuda, "layernorm: CUDA tensors expected"
    assert x.dtype == residual.dtype == weight.dtype == bias.dtype == torch.bfloat16, \
        "layernorm: bf16 tensors expected"
    assert x.dim() == 2 and residual.shape == x.shape, "layernorm: x and residual must share one (rows, D) shape"
    rows, D = x.shape
    assert weight.shape == (D,) and bias.shape == (D,), f"layernorm: weight and bias must have shape ({D},)"
    assert 1 <= D <= 16384, f"layernorm: D must be in 1..16384, got {D}"
    assert x.stride(1) == 1 and residual.stride(1) == 1, "layernorm: rows must be contiguous"
    assert weight.stride(0) == 1 and bias.stride(0) == 1, "layernorm: weight and bias must be contiguous"
    out = torch.empty((rows, D), device=x.device, dtype=torch.bfloat16)
    res_out = torch.empty((rows, D), device=x.device, dtype=torch.bfloat16)
    if rows == 0:
        return out, res_out
    block_d = triton.next_power_of_2(D)
    # About 8-16 bf16 elements per thread per tensor for mid-size rows: enough bytes in flight per thread to
    # cover memory latency, few enough registers to keep several rows resident per SM.
    num_warps = min(max(block_d // 512, 1), 16)
    _layernorm_kernel[(rows,)](
        x, residual, weight, bias, out, res_out,
        x.stride(0), residual.stride(0), out.stride(0), res_out.stride(0),
        D, eps,
        BLOCK_D=block_d, RMS=rms, num_warps=num_warps,
    )
    return out, res_out


# --------------------------------------------------------------------------------------------------------------------
# Rotary position embedding (rotate-half)
# --------------------------------------------------------------------------------------------------------------------

@triton.autotune(configs=[triton.Config({"BLOCK_N": bn}, num_warps=w) for bn in (8, 16, 32, 64) for w in (2, 4, 8)],
                 key=["D", "HALF", "H", "POSITIONS"])
@triton.jit
def _rotary_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, pos_ptr, N, H,
                   sxb, sxh, sxn, sob, soh, son, scn,
                   D: tl.constexpr, HALF: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_REST: tl.constexpr,
                   INTERLEAVED: tl.constexpr, POSITIONS: tl.constexpr):
    # One program per BLOCK_N positions of one (batch, head): the two halves of the rotated columns (or, with
    # INTERLEAVED, the even and the odd ones), cos and sin in f32; the columns past 2·HALF copied. POSITIONS: row n
    # takes the tables' row pos[n] (one positions vector for every batch), else row n.
    pid_n, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, HALF)
    mask = rows[:, None] < N
    x_row = x_ptr + b.to(tl.int64) * sxb + h.to(tl.int64) * sxh + rows[:, None].to(tl.int64) * sxn
    o_row = out_ptr + b.to(tl.int64) * sob + h.to(tl.int64) * soh + rows[:, None].to(tl.int64) * son
    if INTERLEAVED:  # the columns of each pair's first and second element
        first = 2 * cols
        second = 2 * cols + 1
    else:
        first = cols
        second = HALF + cols
    x1 = tl.load(x_row + first[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + second[None, :], mask=mask, other=0.0).to(tl.float32)
    if POSITIONS:
        angle_rows = tl.load(pos_ptr + rows, mask=rows < N, other=0).to(tl.int64)
    else:
        angle_rows = rows
    c = tl.load(cos_ptr + angle_rows[:, None] * scn + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + angle_rows[:, None] * scn + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(o_row + first[None, :], (x1 * c - x2 * s).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(o_row + second[None, :], (x2 * c + x1 * s).to(out_ptr.dtype.element_ty), mask=mask)
    if BLOCK_REST > 0:
        rest = 2 * HALF + tl.arange(0, BLOCK_REST)
        rest_mask = mask & (rest[None, :] < D)
        tl.store(o_row + rest[None, :], tl.load(x_row + rest[None, :], mask=rest_mask), mask=rest_mask)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False,
           positions: torch.Tensor | None = None) -> torch.Tensor:
    """Rotary embedding of x (B, H, N, D) (last dimension contiguous) by cos / sin (N, R/2), the same row stride:
    rotate-half, or the pairs of adjacent columns with `interleaved`; row n by the tables' row positions[n] where
    positions (N,) is given; a new tensor of x's layout."""
    B, H, N, D = x.shape
    half = cos.shape[1]
    assert x.stride(3) == 1 and cos.stride(1) == 1 and sin.stride() == cos.stride(), "rotary: contiguous rows expected"
    assert half & (half - 1) == 0 and 2 * half <= D, "rotary: R/2 must be a power of two, R at most D"
    out = torch.empty_like(x)
    rest = D - 2 * half
    grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), B * H)  # noqa: E731
    _rotary_kernel[grid](x, cos, sin, out, cos if positions is None else positions, N, H, *x.stride()[:3],
                         *out.stride()[:3], cos.stride(0), D=D, HALF=half,
                         BLOCK_REST=triton.next_power_of_2(rest) if rest else 0, INTERLEAVED=bool(interleaved),
                         POSITIONS=positions is not None)
    return out


@triton.autotune(configs=[triton.Config({"BLOCK_M": 128, "BLOCK_N": bn, "BLOCK_K": 64}, num_stages=s, num_warps=w)
                          for bn, s, w in ((128, 3, 8), (128, 4, 4), (256, 3, 8), (64, 4, 4))],
                 key=["N", "K", "GATHER"])
@triton.jit
def _grouped_gemm_kernel(x_ptr, w_ptr, offs_ptr, rows_ptr, y_ptr, G, X_ROWS, N, K,
                         stride_xm, stride_wg, stride_wk, stride_wn, stride_ym,
                         GATHER: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (t, n): tile t of all groups' BLOCK_M-row tiles (found by walking the offsets), columns n·BLOCK_N on."""
    tile, pid_n = tl.program_id(0), tl.program_id(1)
    group, first, end, before = -1, 0, 0, 0
    start = 0
    for g in range(G):
        stop = tl.load(offs_ptr + g)
        tiles = tl.cdiv(tl.maximum(stop - start, 0), BLOCK_M)
        inside = (before <= tile) & (tile < before + tiles)
        group = tl.where(inside, g, group)
        first = tl.where(inside, start + (tile - before) * BLOCK_M, first)
        end = tl.where(inside, stop, end)
        before += tiles
        start = stop
    if group < 0:
        return
    offs_m = first + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    if GATHER:
        src = tl.load(rows_ptr + offs_m, mask=offs_m < end, other=-1).to(tl.int64)
    else:
        src = offs_m.to(tl.int64)
    row_ok = (offs_m < end) & (src >= 0) & (src < X_ROWS)
    a_ptrs = x_ptr + src[:, None] * stride_xm + offs_k[None, :]
    b_ptrs = w_ptr + group.to(tl.int64) * stride_wg + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = offs_k < K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * stride_wk
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(tl.bfloat16), mask=(offs_m < end)[:, None] & (offs_n[None, :] < N))


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, rows: torch.Tensor | None = None,
                 trans_b: bool = False) -> torch.Tensor:
    """As tkc.kernels.grouped_gemm: out[offsets[g-1]:offsets[g]] = x[...] · w[g] (w (G, K, N), or (G, N, K) with
    trans_b), rows of x gathered by `rows` where given."""
    groups = w.shape[0]
    n = w.shape[1] if trans_b else w.shape[2]
    k = x.shape[1]
    slots = rows.shape[0] if rows is not None else x.shape[0]
    y = torch.empty(slots, n, device=x.device, dtype=torch.bfloat16)
    sg, s1, s2 = w.stride()
    stride_wk, stride_wn = (s2, s1) if trans_b else (s1, s2)

    def grid(meta):
        return (triton.cdiv(slots, meta["BLOCK_M"]) + groups, triton.cdiv(n, meta["BLOCK_N"]))

    _grouped_gemm_kernel[grid](x, w, offsets, rows if rows is not None else offsets, y, groups, x.shape[0], n, k,
                               x.stride(0), sg, stride_wk, stride_wn, y.stride(0), GATHER=rows is not None)
    return y
