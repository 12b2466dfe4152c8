"""Every kernel (shipped and in tests/kernels) compiles for sm_80 and sm_90a, and ptxas accepts the PTX with no
spills and no stack: sm_80 PTX for -arch=sm_80 and -arch=sm_90 (the H200 JIT-compiles it), sm_90a PTX for
-arch=sm_90a."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest

import re

from tkc.backend.ptxas import assemble, disassemble, find_nvdisasm, find_ptxas
from tkc.compiler import compile_kernels
from tkc.diagnostics import TkcWarning
from tkc.frontend.kernel import Kernel
from tkc.lang import bf16, fp8e4m3

ROOT = Path(__file__).resolve().parents[2]
KERNEL_FILES = sorted((ROOT / "tkc" / "kernels").glob("[!_]*.py")) + sorted((ROOT / "tests" / "kernels").glob("[!_]*.py"))

# Constant values worth assembling separately (the rest use their defaults).
VARIANTS = {
    "attention_fwd": [{"D": 64, "CAUSAL": 0}, {"D": 64, "CAUSAL": 1}, {"D": 128, "CAUSAL": 0}, {"D": 128, "CAUSAL": 1},
                      # D = 32 / 96 in attention()'s CONFIG, and its FALLBACK
                      {"D": 32, "CAUSAL": 1, "ROWS": 32, "KEYS": 64}, {"D": 96, "CAUSAL": 0, "ROWS": 32, "KEYS": 64,
                                                                        "Q_IN_SHARED": 1},
                      {"D": 96, "CAUSAL": 1, "ROWS": 16, "KEYS": 64},
                      {"D": 64, "CAUSAL": 1, "ROWS": 32}, {"D": 64, "CAUSAL": 0, "ROWS": 32},
                      {"D": 128, "CAUSAL": 1, "ROWS": 32, "KEYS": 32, "Q_IN_SHARED": 1},
                      {"D": 128, "CAUSAL": 0, "ROWS": 16, "KEYS": 32, "Q_IN_SHARED": 1},
                      {"D": 64, "CAUSAL": 1, "ROWS": 32, "GROUP": 8}],
    "layernorm_kernel": [{"D": 768, "WARPS": 1}, {"D": 4096, "WARPS": 8}, {"D": 8192, "WARPS": 16},
                         {"D": 1024, "WARPS": 2, "RMS": 1}, {"D": 4096, "WARPS": 4, "RESIDUAL": 0, "RMS": 1},
                         {"D": 2048, "WARPS": 4, "RESIDUAL": 0}],
    # layernorm_backward's layouts (backward_layout)
    "layernorm_bwd_kernel": [{"D": 768, "WARPS": 8}, {"D": 1024, "WARPS": 8, "DS_IN": 1},
                             {"D": 1024, "WARPS": 8, "RMS": 1, "DS_IN": 1}, {"D": 2048, "WARPS": 2, "SPLIT": 2},
                             {"D": 4096, "WARPS": 4, "SPLIT": 4, "RMS": 1, "DS_IN": 1},
                             {"D": 8192, "WARPS": 16, "SPLIT": 16, "DS_IN": 1}],
    "column_sums_kernel": [{}, {"DT": bf16}],
    "attention_varlen_sm90": [{"LATE_PV": 0}, {"D": 128, "CAUSAL": 1, "GROUP": 4, "LATE_PV": 0}, {"D": 64, "CAUSAL": 1},
                              {"D": 96, "LATE_PV": 0}],
    "attention_varlen_fwd": [{"D": 64, "ROWS": 32, "KEYS": 64}, {"D": 64, "ROWS": 32, "KEYS": 64, "CAUSAL": 1},
                             {"D": 128, "ROWS": 32, "KEYS": 32, "Q_IN_SHARED": 1, "CAUSAL": 1, "GROUP": 4},
                             {"D": 96, "ROWS": 32, "KEYS": 64, "Q_IN_SHARED": 1},  # attention()'s CONFIG
                             {"D": 32, "ROWS": 32, "KEYS": 64, "CAUSAL": 1, "LSE": 1},
                             {"D": 256, "ROWS": 16, "KEYS": 32, "Q_IN_SHARED": 1, "CAUSAL": 1, "LSE": 1, "GROUP": 4}],
    # attention_varlen_backward's BACKWARD_STEPS, K and V in shared memory
    "attention_varlen_bwd_dkdv": [{"D": 64, "KV_IN_SHARED": 1}, {"D": 32, "KV_IN_SHARED": 1, "CAUSAL": 1, "GROUP": 4}, {"D": 64, "KV_IN_SHARED": 1, "CAUSAL": 1, "GROUP": 4},
                                  {"D": 128, "QUERIES": 16, "KV_IN_SHARED": 1, "CAUSAL": 1},
                                  {"D": 128, "QUERIES": 16, "KV_IN_SHARED": 1, "GROUP": 4},
                                  {"D": 96, "QUERIES": 16, "KV_IN_SHARED": 1, "CAUSAL": 1, "GROUP": 2}],
    "attention_varlen_bwd_dq": [{"D": 64, "KEYS": 32}, {"D": 32, "KEYS": 32, "CAUSAL": 1, "GROUP": 4}, {"D": 64, "KEYS": 32, "CAUSAL": 1, "GROUP": 4},
                                {"D": 128, "KEYS": 32, "CAUSAL": 1}, {"D": 128, "KEYS": 32, "GROUP": 4},
                                {"D": 96, "KEYS": 32, "CAUSAL": 1}],
    # on Hopper, BACKWARD_SM90's
    "attention_varlen_bwd_dkdv_sm90": [{"D": 64, "WARPS": 4, "STAGES": 3},
                                       {"D": 64, "WARPS": 4, "STAGES": 3, "CAUSAL": 1, "GROUP": 4},
                                       {"D": 128, "STAGES": 3}, {"D": 128, "STAGES": 3, "CAUSAL": 1, "GROUP": 4},
                                       {"D": 96, "STAGES": 3, "CAUSAL": 1}],
    "attention_varlen_bwd_dq_sm90": [{"D": 64, "STAGES": 3}, {"D": 64, "STAGES": 3, "WARPS": 4, "CAUSAL": 1, "GROUP": 4},
                                     {"D": 128, "STAGES": 3, "PRODUCER": 1},
                                     {"D": 128, "STAGES": 3, "PRODUCER": 1, "CAUSAL": 1, "GROUP": 4},
                                     {"D": 96, "STAGES": 3, "PRODUCER": 1, "CAUSAL": 1}],
    "gemm_kernel": [{"TRANS_B": 0}, {"TRANS_B": 1}],
    "gemm_sm90_kernel": [{"TRANS_B": 0}, {"TRANS_B": 1, "BN": 128, "BK": 64}, {"WARPS": 8, "BK": 64},
                         {"TRANS_B": 1, "WARPS": 8, "BK": 64, "STAGES": 3, "CLUSTER": 4, "CLUSTER_N": 2, "PRODUCER": 1}],
    "scaled_mm_kernel": [{"ROWWISE": 0}, {"ROWWISE": 1}, {"ROWWISE": 1, "CLUSTER": 4, "CLUSTER_N": 2, "PRODUCER": 1}],
    "sum_scaled_splits_kernel": [{"ROWWISE": 0}, {"ROWWISE": 1}],
    # scaled_mm()'s few-rows path: fp8 operands (k32 wgmmas with N = 16 / 32)
    "gemm_few_rows_kernel": [{}, {"DT": fp8e4m3, "TRANS_B": 1, "ROWS": 16, "BK": 128, "WARPS": 8, "STAGES": 5},
                             {"DT": fp8e4m3, "TRANS_B": 1, "ROWS": 32, "BK": 128, "WARPS": 8, "STAGES": 5}],
    "attention_sm90": [{"D": 128}, {"D": 128, "CAUSAL": 1}, {"D": 64, "WARPS": 4}, {"D": 128, "KEYS": 128},
                       {"D": 128, "CAUSAL": 1, "GROUP": 4},
                       # attention()'s D = 96 (three 64-byte swizzled panels a row), not causal and causal
                       {"D": 96, "KEYS": 128, "DEFER": 3, "PRODUCER": 1, "Q_REGS": 1, "LATE_SUMS": 1},
                       {"D": 96, "CAUSAL": 1, "KEYS": 128, "DEFER": 2, "PRODUCER": 1, "Q_REGS": 1, "LATE_SUMS": 1},
                       # attention()'s D = 256 (64-key steps, two stages), causal with query heads a K/V head
                       {"D": 256, "CAUSAL": 1, "KEYS": 64, "STAGES": 2, "DEFER": 2, "PRODUCER": 1, "LATE_SUMS": 1,
                        "LSE": 1, "GROUP": 4},
                       # 80-key steps with a lean producer: causal from LONG_KEYS keys on, and not causal
                       {"D": 256, "CAUSAL": 1, "KEYS": 80, "STAGES": 2, "DEFER": 2, "PRODUCER": 2, "LATE_SUMS": 1,
                        "LSE": 1, "GROUP": 4},
                       {"D": 256, "KEYS": 80, "STAGES": 2, "DEFER": 1, "PRODUCER": 2, "LATE_SUMS": 1, "LSE": 1,
                        "GROUP": 4},
                       # half of Q in registers, three stages of 64 keys beside the other half (a candidate)
                       {"D": 256, "KEYS": 64, "STAGES": 3, "DEFER": 1, "PRODUCER": 2, "LATE_SUMS": 1, "Q_REGS": 2},
                       # K and V rings with barriers of their own (a candidate)
                       {"D": 256, "KEYS": 80, "STAGES": 2, "DEFER": 2, "PRODUCER": 2, "LATE_SUMS": 1, "SPLIT_RING": 1}],
    "attention_fwd_lse": [{"D": 64, "CAUSAL": 1}, {"D": 128, "CAUSAL": 0, "ROWS": 32, "KEYS": 32, "Q_IN_SHARED": 1},
                          {"D": 256, "CAUSAL": 1, "ROWS": 16, "KEYS": 32, "Q_IN_SHARED": 1},
                          {"D": 256, "CAUSAL": 0, "ROWS": 16, "KEYS": 32, "Q_IN_SHARED": 1, "STAGES": 2}],  # 99 KB cards
    "attention_bwd_delta": [{"D": 64}, {"D": 128, "WITH_DL": 1}, {"D": 256}],
    # attention_backward's constants (tkc/kernels/attention_bwd.py CONFIG), causal and not
    "attention_bwd_dkdv": [{"D": 64, "CAUSAL": 0, "QUERIES": 64}, {"D": 64, "CAUSAL": 1, "QUERIES": 64},
                           {"D": 128, "CAUSAL": 0, "QUERIES": 32, "KV_IN_SHARED": 1},
                           {"D": 128, "CAUSAL": 1, "QUERIES": 32, "KV_IN_SHARED": 1, "RAGGED": 1},
                           # grouped-query attention (K and V in shared memory at D=64 too)
                           {"D": 64, "CAUSAL": 1, "QUERIES": 64, "KV_IN_SHARED": 1, "GROUP": 4},
                           {"D": 128, "CAUSAL": 0, "QUERIES": 32, "KV_IN_SHARED": 1, "RAGGED": 1, "GROUP": 2},
                           {"D": 64, "CAUSAL": 0, "QUERIES": 64, "KV_IN_SHARED": 1, "GROUP": 8, "SPLIT": 2},
                           {"D": 32, "CAUSAL": 1, "QUERIES": 64}, {"D": 96, "CAUSAL": 0, "QUERIES": 32, "KV_IN_SHARED": 1},
                           # D = 256: dK and dV in halves of 128 columns
                           {"D": 256, "CAUSAL": 1, "QUERIES": 16, "KV_IN_SHARED": 1, "COLS": 128, "RAGGED": 1,
                            "GROUP": 4}, {"D": 256, "CAUSAL": 0, "QUERIES": 16, "KV_IN_SHARED": 1, "COLS": 128},
                           {"D": 256, "CAUSAL": 1, "QUERIES": 16, "KV_IN_SHARED": 1, "COLS": 128, "STAGES": 2}],
    "attention_bwd_sum_parts": [{"D": 64}, {"D": 128}, {"D": 256}],
    # attention()'s decoding path (tkc/kernels/attention_decode.py CONFIG)
    "attention_decode": [{"D": 64, "KEYS": 64, "STAGES": 2}, {"D": 128, "KEYS": 32, "STAGES": 2},
                         {"D": 64, "KEYS": 32, "STAGES": 2}, {"D": 128, "KEYS": 16, "STAGES": 2},
                         {"D": 256, "KEYS": 16, "STAGES": 2},  # Hopper only (193 KB of shared memory)
                         # attention_kvcache's: each batch's own count of keys
                         {"D": 128, "KEYS": 32, "STAGES": 2, "LENGTHS": 1}, {"D": 64, "KEYS": 32, "STAGES": 2,
                                                                             "LENGTHS": 1},
                         # and in pages (block_table)
                         {"D": 128, "KEYS": 16, "STAGES": 2, "LENGTHS": 1, "PAGED": 1},
                         {"D": 64, "KEYS": 64, "STAGES": 2, "LENGTHS": 1, "PAGED": 1}],
    "attention_decode_combine": [{"LSE": 1}, {}],
    "attention_decode_last": [{}, {"D": 128, "KEYS": 16, "STAGES": 2, "LSE": 1, "LENGTHS": 1},
                              {"D": 64, "KEYS": 32, "STAGES": 2, "LENGTHS": 1, "PAGED": 1}],
    # Hopper's one-launch decoding (CONFIG's steps, a row tile's parts a cluster)
    "attention_decode_cluster": [{"D": 64, "KEYS": 64, "STAGES": 2, "CLUSTER": 8, "LSE": 1},
                                 {"D": 128, "KEYS": 32, "STAGES": 2, "CLUSTER": 4},
                                 {"D": 128, "KEYS": 32, "STAGES": 2, "CLUSTER": 16, "LSE": 1},
                                 {"D": 128, "KEYS": 32, "STAGES": 2, "CLUSTER": 8, "LENGTHS": 1, "PAGED": 1},
                                 {"D": 256, "KEYS": 16, "STAGES": 2, "CLUSTER": 4, "LENGTHS": 1, "PAGED": 1},
                                 {"D": 256, "KEYS": 16, "STAGES": 2, "CLUSTER": 3, "LSE": 1},
                                 {"D": 256, "KEYS": 16, "STAGES": 2, "CLUSTER": 1, "LSE": 1},
                                 {"D": 128, "KEYS": 32, "STAGES": 2, "CLUSTER": 8, "LSE": 1, "LENGTHS": 1}],
    "attention_bwd_dq": [{"D": 32, "CAUSAL": 0, "KEYS": 64}, {"D": 96, "CAUSAL": 1, "KEYS": 32},
                         {"D": 64, "CAUSAL": 0, "KEYS": 64}, {"D": 64, "CAUSAL": 1, "KEYS": 64},
                         {"D": 128, "CAUSAL": 0, "KEYS": 32}, {"D": 128, "CAUSAL": 1, "KEYS": 32},
                         {"D": 64, "CAUSAL": 1, "KEYS": 64, "GROUP": 4},
                         # D = 256: dQ in halves of 128 columns
                         {"D": 256, "CAUSAL": 1, "KEYS": 16, "COLS": 128, "RAGGED": 1, "GROUP": 4},
                         {"D": 256, "CAUSAL": 0, "KEYS": 16, "COLS": 128}],
    # attention_backward's Hopper constants (CONFIG_SM90)
    "attention_bwd_dkdv_sm90": [{"D": 64, "CAUSAL": 0, "WARPS": 4}, {"D": 64, "CAUSAL": 1, "WARPS": 4},
                                {"D": 64, "CAUSAL": 1, "WARPS": 4, "STAGES": 3, "BLOCKS": 3, "RAGGED": 1},
                                {"D": 64, "CAUSAL": 1, "WARPS": 4, "STAGES": 3, "BLOCKS": 3, "GROUP": 4},
                                {"D": 128, "CAUSAL": 0, "STAGES": 3}, {"D": 128, "CAUSAL": 1, "STAGES": 3, "RAGGED": 1},
                                {"D": 64, "CAUSAL": 1, "WARPS": 4, "STAGES": 3, "GROUP": 4},
                                {"D": 128, "CAUSAL": 0, "STAGES": 3, "RAGGED": 1, "GROUP": 8},
                                {"D": 128, "CAUSAL": 1, "STAGES": 3, "GROUP": 8, "SPLIT": 4},
                                {"D": 96, "CAUSAL": 1, "STAGES": 3, "RAGGED": 1},
                                # dV and dK in the next step (DEFER=1): 32-query steps at D = 128, two blocks at 64
                                {"D": 128, "CAUSAL": 1, "STAGES": 3, "QUERIES": 32, "DEFER": 1, "RAGGED": 1},
                                {"D": 64, "CAUSAL": 0, "WARPS": 4, "STAGES": 3, "BLOCKS": 2, "DEFER": 1},
                                {"D": 128, "CAUSAL": 0, "WARPS": 4, "STAGES": 3, "QUERIES": 32, "DEFER": 1},
                                # D = 256: dK and dV in halves (a warpgroup each: HALVES; a block each: COLS), with
                                # query heads a K/V head in two parts
                                {"D": 256, "CAUSAL": 0, "HALVES": 1, "STAGES": 3, "QUERIES": 32, "PRODUCER": 1},
                                {"D": 256, "CAUSAL": 0, "HALVES": 2, "STAGES": 2, "QUERIES": 64, "PRODUCER": 2,
                                 "EXCHANGE_BUFFERS": 1},
                                {"D": 256, "CAUSAL": 1, "HALVES": 2, "STAGES": 2, "QUERIES": 64, "PRODUCER": 2,
                                 "EXCHANGE_BUFFERS": 1, "RAGGED": 1, "GROUP": 4, "SPLIT": 2},
                                {"D": 256, "CAUSAL": 1, "HALVES": 1, "STAGES": 3, "QUERIES": 32, "PRODUCER": 1,
                                 "RAGGED": 1, "GROUP": 4, "SPLIT": 2},
                                {"D": 256, "CAUSAL": 1, "HALVES": 1, "STAGES": 3, "QUERIES": 32, "PRODUCER": 1,
                                 "DEFER": 1, "RAGGED": 1, "GROUP": 4, "SPLIT": 2},  # dV, dK in the next step
                                {"D": 256, "CAUSAL": 1, "WARPS": 4, "STAGES": 3, "QUERIES": 32, "COLS": 128,
                                 "RAGGED": 1, "GROUP": 4, "SPLIT": 2}],
    "attention_bwd_dq_sm90": [{"D": 64, "CAUSAL": 0, "STAGES": 3}, {"D": 64, "CAUSAL": 1, "STAGES": 3, "RAGGED": 1},
                              {"D": 128, "CAUSAL": 1, "STAGES": 3, "DEFER": 1},  # dQ's product in the next step
                              {"D": 256, "CAUSAL": 0, "WARPS": 4, "KEYS": 64, "STAGES": 2, "DEFER": 1},
                              {"D": 128, "CAUSAL": 0, "STAGES": 3}, {"D": 128, "CAUSAL": 1, "STAGES": 3},
                              {"D": 128, "CAUSAL": 1, "STAGES": 3, "GROUP": 4}, {"D": 96, "CAUSAL": 0, "STAGES": 3},
                              {"D": 256, "CAUSAL": 1, "WARPS": 8, "KEYS": 32, "STAGES": 2, "RAGGED": 1, "GROUP": 4}],
    # the fused kernel (not attention_backward's path yet): D=128's panels (dS in two buffers); D=64 with its dQ
    # deferred a step
    "attention_bwd_sm90": [{"D": 128, "CAUSAL": 0, "STAGES": 3}, {"D": 128, "CAUSAL": 1, "STAGES": 3, "DS_BUFFERS": 2},
                           {"D": 64, "CAUSAL": 1, "WARPS": 4, "STAGES": 3, "DEFER_DQ": 1, "DS_BUFFERS": 2,
                            "RAGGED": 1}],
}

SM80_BUILDS_ONLY = {"attention_bwd_delta", "attention_bwd_dkdv", "attention_bwd_dq", "attention_bwd_sum_parts",
                    "attention_varlen_bwd_dkdv", "attention_varlen_bwd_dq"}
SM90A_ONLY = {("attention_decode", 256)}  # (kernel, D) that only Hopper's shared memory holds

pytestmark = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed (pip install nvidia-cuda-nvcc==13.0.88)")


def _kernels() -> list[Kernel]:
    kernels = []
    for path in KERNEL_FILES:
        spec = importlib.util.spec_from_file_location(f"kernels_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        kernels.extend(v for v in vars(module).values() if isinstance(v, Kernel) and v.source.filename == str(path))
    return kernels


CASES = [(k, c) for k in _kernels() for c in VARIANTS.get(k.name, [{}])]
FIRST_CASE = {k.name: c for k, c in reversed(CASES)}  # each kernel's first constants: compiled verifying every pass


# The shipped builds that spill: D = 256's dK/dV kernel by product (consumers at 240 registers) with causal
# masks, a ragged last step and two parts of a K/V head's query heads: one register stored and reloaded each step
# (4 bytes; every other combination of causal, ragged and grouping builds without spills).
_ALLOWED_SPILL = {("attention_bwd_dkdv_sm90", tuple(sorted({
    "D": 256, "CAUSAL": 1, "HALVES": 2, "STAGES": 2, "QUERIES": 64, "PRODUCER": 2, "EXCHANGE_BUFFERS": 1, "RAGGED": 1,
    "GROUP": 4, "SPLIT": 2}.items()))): 4,
    # and attention_varlen_bwd_dkdv_sm90 at D = 128, causal, grouped-query (255 registers; 32-query steps fit in 215)
    ("attention_varlen_bwd_dkdv_sm90", (("CAUSAL", 1), ("D", 128), ("GROUP", 4), ("STAGES", 3))): 8}


@pytest.mark.parametrize("target, archs", [("sm_80", ["sm_80", "sm_90"]), ("sm_90a", ["sm_90a"])])
@pytest.mark.parametrize("kernel, constants", CASES, ids=[f"{k.name}-{'-'.join(f'{n}{v}' for n, v in c.items())}" for k, c in CASES])
def test_ptxas_accepts_without_spills(kernel: Kernel, constants: dict, target: str, archs: list[str]) -> None:
    if kernel.min_target.name != "sm_80" and target == "sm_80":
        pytest.skip(f"{kernel.name} needs {kernel.min_target.name}")
    if (kernel.name, constants.get("D")) in SM90A_ONLY and target == "sm_80":
        pytest.skip(f"{kernel.name} at D = {constants['D']} runs on Hopper only")
    if kernel.name in SM80_BUILDS_ONLY and target == "sm_90a":
        pytest.skip(f"attention_backward builds {kernel.name} for sm_80 on every GPU")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TkcWarning)
        ptx = compile_kernels([kernel], target, constants, verify_each=FIRST_CASE[kernel.name] is constants)
    if Path(kernel.source.filename).parent == ROOT / "tkc" / "kernels":  # a shipped kernel warns its users of nothing
        assert not [str(w.message) for w in caught if issubclass(w.category, TkcWarning)]
    assert ".version 8.1" in ptx and f".target {target}" in ptx
    allowed = _ALLOWED_SPILL.get((kernel.name, tuple(sorted(constants.items()))), 0)
    for arch in archs:
        report = assemble(ptx, arch)[kernel.name]
        assert report.spill_stores <= allowed and report.spill_loads <= allowed, report.log
        assert report.stack_bytes <= 2 * allowed, report.log
        assert not report.notes, report.log  # C7508 / C7511 / C7515: ptxas serialized wgmma


def test_gemm_uses_tensor_core_instructions() -> None:
    from tkc.kernels import gemm_kernel

    ptx = compile_kernels([gemm_kernel], "sm_80")
    for instruction in ("mma.sync.aligned.m16n8k16", "ldmatrix.sync.aligned", "cp.async.cg.shared.global"):
        assert instruction in ptx


def test_attention_uses_ex2() -> None:
    from tkc.kernels import attention_fwd

    assert "ex2.approx" in compile_kernels([attention_fwd], "sm_80", {"D": 128, "CAUSAL": 1})


@pytest.mark.skipif(find_nvdisasm() is None, reason="nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
@pytest.mark.parametrize("name, constants", [("gemm_kernel", {"TRANS_B": 0, "BK": 64}), ("gemm_kernel", {"TRANS_B": 1}),
                                             ("attention_fwd", {"D": 128}), ("attention_fwd", {"D": 64, "ROWS": 32})])
def test_mma_operands_arrive_where_the_tensor_cores_read_them(name: str, constants: dict) -> None:
    """ldmatrix puts each mma operand in the consecutive registers HMMA reads: the machine code has (almost) no
    register moves among its HMMAs. With the matrices in the wrong order ptxas adds two moves per HMMA."""
    from tkc import kernels

    sass = disassemble(compile_kernels([getattr(kernels, name)], "sm_80", constants), "sm_90")
    instructions = [line for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]+\*/", line)]
    hmma = [i for i, line in enumerate(instructions) if "HMMA" in line]
    among = instructions[hmma[0]:hmma[-1] + 1]
    moves = sum(1 for line in among if re.search(r"\b(IMAD\.MOV\.U32|MOV)\b", line))
    # a few moves merge the branches of attention's conditional rescale; a wrong order costs two per HMMA
    assert len(hmma) >= 64 and moves <= len(hmma) // 8, f"{moves} register moves among {len(hmma)} HMMAs"


def _longest_chain(ptx: str, opcode: str) -> int:
    """The longest run of `opcode` instructions each reading the one before (register dependencies only)."""
    depth: dict[str, int] = {}
    longest = 0
    for m in re.finditer(rf"{re.escape(opcode)}\s+(%\w+),\s*(%\w+),\s*(%\w+);", ptx):
        dst, a, b = m.groups()
        depth[dst] = 1 + max(depth.get(a, 0), depth.get(b, 0))
        longest = max(longest, depth[dst])
    return longest


def test_row_reductions_are_trees() -> None:
    """row_max / row_sum over a warp's 16×128 tile (32 values per row per thread) reduce as trees of pairs: 5 levels
    in the thread and 2 across the quad, not a chain of 31 dependent ops (attention's softmax stalled on it)."""
    from kernels.row_softmax import row_softmax

    ptx = compile_kernels([row_softmax], "sm_80", {"N": 128})
    assert _longest_chain(ptx, "max.f32") <= 5 + 2
    assert _longest_chain(ptx, "add.f32") <= 5 + 2
