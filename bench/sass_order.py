"""The order ptxas gave a kernel's key instructions, run-length encoded: wgmmas (HGMMA), exp2 (MUFU.EX2), turn
barriers (BAR.SYNC on a register: TURN, BAR.ARV: PASS), CTA barriers, mbarrier waits. It shows, on the CPU, what
the GPU will run, e.g. whether the softmax stayed outside a ping-pong turn.

    python bench/sass_order.py attention_sm90 -D D=128 -D KEYS=128 -D PINGPONG=1
"""

from __future__ import annotations

import argparse
import itertools
import re
import subprocess
import tempfile
from pathlib import Path

from tkc.backend import ptxas
from tkc.compiler import compile_for_launch

KINDS = [("HGMMA", "HGMMA"), ("MUFU.EX2", "EX2"), ("BAR.ARV", "PASS"), ("SYNCS.PHASECHK", "WAIT"),
         ("BAR.SYNC", "BAR"), ("WARPGROUP.DEPBAR", "DEPBAR")]


def key_instructions(sass: str) -> list[str]:
    seq = []
    for line in sass.splitlines():
        m = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9._]+)\s*([^;]*)", line)
        if not m:
            continue
        op, args = m.groups()
        for prefix, name in KINDS:
            if op.startswith(prefix):
                if name == "BAR" and re.match(r"R\d+", args.split(",")[0].strip()):
                    name = "TURN"  # a barrier number from a register: a ping-pong turn
                seq.append(name)
                break
    return seq


def run_length(seq: list[str]) -> str:
    runs = ((name, len(list(group))) for name, group in itertools.groupby(seq))
    return " ".join(name if n == 1 else f"{name}×{n}" for name, n in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kernel", help="a kernel of tkc.kernels, e.g. attention_sm90")
    parser.add_argument("-D", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    import tkc.kernels

    kernel = getattr(tkc.kernels, args.kernel)
    constants = {k: int(v) for k, v in (kv.split("=", 1) for kv in args.D)}
    aligns = {p.name: 16 for p in kernel.runtime_params if p.kind == "tensor"}
    compiled = compile_for_launch(kernel, "sm_90a", constants, aligns)
    tool = ptxas.find_ptxas()
    if tool is None:
        raise SystemExit("ptxas not found (pip install nvidia-cuda-nvcc)")
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        src.write_text(compiled.ptx)
        subprocess.run([tool, "-arch=sm_90a", str(src), "-o", str(cubin)], check=True)
        nvdisasm = Path(tool).with_name("nvdisasm")
        sass = subprocess.run([str(nvdisasm), str(cubin)], capture_output=True, text=True, check=True).stdout
    print(run_length(key_instructions(sass)))


if __name__ == "__main__":
    main()
