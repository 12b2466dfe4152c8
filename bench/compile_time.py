"""Compile time of each shipped kernel: `import tkc` timed apart, then the compile call (frontend → PTX) in a fresh
process, cold (first compile in the process): the sm_80 kernels and the sm_90a ones attention(), gemm() and the
backward launch on Hopper, with their constants. On a GPU also the cache hit of issue 4's 50 ms bound. Appends a
table to bench/RESULTS.md.

    python bench/compile_time.py            # prints the table and appends it to bench/RESULTS.md
    python bench/compile_time.py --no-write
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASES = [
    ("attention_fwd", "tkc.kernels.attention", {"D": 128, "CAUSAL": 1}, "sm_80"),
    ("attention_fwd", "tkc.kernels.attention", {"D": 64, "CAUSAL": 0}, "sm_80"),
    ("gemm_kernel", "tkc.kernels.gemm", {}, "sm_80"),
    ("layernorm_kernel", "tkc.kernels.layernorm", {"D": 1024}, "sm_80"),
]


def hopper_cases() -> list[tuple[str, str, dict, str]]:
    """The sm_90a kernels attention() and gemm() launch on Hopper, with the constants they launch them with."""
    from tkc.kernels.attention import sm90_config, sm90_constants
    from tkc.kernels.attention_bwd import CONFIG_SM90 as BWD_CONFIG
    from tkc.kernels.gemm import sm90_config as gemm_config

    return [("attention_sm90", "tkc.kernels.attention", {"D": 128, **sm90_constants(sm90_config(128, 4096, 4096))},
             "sm_90a"),
            ("attention_sm90", "tkc.kernels.attention",
             {"D": 128, "CAUSAL": 1, **sm90_constants(sm90_config(128, 4096, 4096, causal=True))}, "sm_90a"),
            ("gemm_sm90_kernel", "tkc.kernels.gemm", gemm_config(False, True), "sm_90a"),
            ("attention_bwd_dkdv_sm90", "tkc.kernels.attention_bwd", {"D": 128, **BWD_CONFIG[128][0]}, "sm_90a")]

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import tkc
t1 = time.perf_counter()
import importlib
module = importlib.import_module(sys.argv[1])
kernel = getattr(module, sys.argv[2])
t2 = time.perf_counter()
from tkc.compiler import compile_kernels
ptx = compile_kernels([kernel], sys.argv[4], json.loads(sys.argv[3]))
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "kernel_module": t2 - t1, "compile": t3 - t2, "ptx_lines": ptx.count(chr(10))}))
"""


def measure(name: str, module: str, constants: dict, target: str, repeats: int) -> dict:
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", CHILD, module, name, json.dumps(constants), target],
                             capture_output=True, text=True, cwd=ROOT, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    best = min(runs, key=lambda r: r["compile"])
    return {"kernel": name, "constants": constants, "target": target,
            "import_s": min(r["import"] for r in runs), "compile_s": best["compile"], "ptx_lines": best["ptx_lines"]}


CACHE_HIT = r"""
import json, sys, time, os
import torch
import tkc
from tkc.kernels import attention_fwd
from tkc.runtime.launch import prepare
q = torch.randn(1, 16, 4096, 128, device="cuda", dtype=torch.bfloat16)
o = torch.empty_like(q)
torch.cuda.synchronize()
t0 = time.perf_counter()
prepare(attention_fwd, [q, q, q, o, 0.088], {"D": 128, "CAUSAL": 1, "ROWS": 16})
t1 = time.perf_counter()
print(json.dumps({"seconds": t1 - t0}))
"""


CACHE_HIT_PUBLIC = r"""
import json, time
import torch
import tkc
from tkc.kernels import attention
q = torch.randn(1, 16, 4096, 128, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
t0 = time.perf_counter()
attention(q, q, q, causal=True)
t1 = time.perf_counter()
print(json.dumps({"seconds": t1 - t0}))
"""


def cache_hit_seconds(repeats: int, child: str = CACHE_HIT) -> list[float] | None:
    """Time, in a fresh process with a warm disk cache, from the call (after imports) to a launchable attention
    kernel (`child`: prepare() for attention_fwd; CACHE_HIT_PUBLIC: attention()'s first call, its kernel for this
    GPU found in the cache, loaded and launched). None without a GPU."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
    except ImportError:
        return None
    times = []
    for i in range(repeats + 1):  # the first run fills the cache
        out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, cwd=ROOT, check=True)
        if i:
            times.append(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per kernel (the best is kept)")
    parser.add_argument("--no-write", action="store_true", help="do not append to bench/RESULTS.md")
    args = parser.parse_args()
    rows = [measure(*case, repeats=args.repeats) for case in CASES + hopper_cases()]
    header = "| kernel | constants | target | import tkc (s) | compile (s) | PTX lines |\n|---|---|---|---|---|---|\n"
    table = header + "".join(
        f"| {r['kernel']} | {', '.join(f'{k}={v}' for k, v in r['constants'].items()) or '-'} | {r['target']} | "
        f"{r['import_s']:.2f} | {r['compile_s']:.2f} | {r['ptx_lines']} |\n" for r in rows)
    hits = cache_hit_seconds(args.repeats)
    if hits is not None:
        table += (f"\nCache hit, attention D=128 causal: {1000 * min(hits):.1f} ms from the call to a launchable "
                  f"function in a fresh process (best of {len(hits)}; all: {', '.join(f'{1000 * h:.1f}' for h in hits)} ms).\n")
        public = cache_hit_seconds(args.repeats, CACHE_HIT_PUBLIC)
        table += (f"attention(q, k, v, causal=True)'s first call in a fresh process (1×16×4096×128, its kernel for "
                  f"this GPU from the cache, loaded and launched): {1000 * min(public):.1f} ms (all: "
                  f"{', '.join(f'{1000 * h:.1f}' for h in public)} ms).\n")
    print(table)
    if not args.no_write:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
        machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write(f"\n## Compile time — {stamp} ({machine})\n\nCold compile call in a fresh process, after `import tkc` "
                    f"(best of {args.repeats} processes); the import is timed apart.\n\n{table}")


if __name__ == "__main__":
    main()
