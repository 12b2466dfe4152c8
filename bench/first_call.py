"""Where a fresh process's first call of a public kernel spends its time, with tkc's compile cache warm: the call
timed whole, then (in another fresh process) under cProfile, its costliest functions by cumulative time; and
whether the driver's compute cache (which keeps the machine code the JIT makes of tkc's PTX) is on.

    python bench/first_call.py [--kernel attention|attention_sm80|gemm|layernorm] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CALLS = {
    "attention": ("q = torch.randn(1, 16, 4096, 128, device='cuda', dtype=torch.bfloat16)",
                  "tkc.kernels.attention(q, q, q, causal=True)"),
    "attention_sm80": ("q = torch.randn(1, 16, 4096, 128, device='cuda', dtype=torch.bfloat16)",
                       "tkc.kernels.attention(q, q, q, causal=True, target='sm_80')"),
    "gemm": ("a = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16)", "tkc.kernels.gemm(a, a)"),
    "layernorm": ("x = torch.randn(4096, 1024, device='cuda', dtype=torch.bfloat16); w = x[0].clone()",
                  "tkc.kernels.layernorm(x, x, w, w)"),
}

CHILD = """
import time, sys, cProfile, pstats, io
import torch, tkc, tkc.kernels
{setup}
torch.cuda.synchronize()
if {profile}:
    profiler = cProfile.Profile()
    profiler.enable()
t0 = time.perf_counter()
{call}
t1 = time.perf_counter()
torch.cuda.synchronize()
t2 = time.perf_counter()
if {profile}:
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(28)
    print(out.getvalue())
print(f"first call {{1000 * (t1 - t0):.1f}} ms (to the launch's return), {{1000 * (t2 - t0):.1f}} ms with the kernel")
"""


def run(kernel: str, profile: bool) -> str:
    setup, call = CALLS[kernel]
    code = CHILD.format(setup=setup, call=call, profile=profile)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", choices=sorted(CALLS), default="attention")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for name in ("CUDA_CACHE_DISABLE", "CUDA_CACHE_PATH", "CUDA_CACHE_MAXSIZE", "TKC_CACHE_DIR", "HOME"):
        print(f"{name}={os.environ.get(name)}")
    compute_cache = Path(os.environ.get("CUDA_CACHE_PATH") or Path.home() / ".nv" / "ComputeCache")
    size = sum(f.stat().st_size for f in compute_cache.rglob("*") if f.is_file()) if compute_cache.exists() else None
    print(f"driver compute cache {compute_cache}: {'absent' if size is None else f'{size / 1e6:.1f} MB'}")
    for _ in range(args.runs):  # the first fills tkc's cache (and the driver's) where they are cold
        print(run(args.kernel, profile=False).strip().splitlines()[-1])
    print(run(args.kernel, profile=True))


if __name__ == "__main__":
    main()
