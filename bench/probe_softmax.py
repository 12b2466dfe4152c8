"""What each part of the softmax costs attention_sm90: the kernel as attention() launches it beside copies of it
with one part replaced by something almost free (timing only: those outputs are wrong). 0 = intact, 1 = no row
sum (l + 1), 2 = no row max (the running maximum stays 0: the inputs keep exp2 finite), 3 = no exp2 (P = the
scaled scores), 4 = no rescale of O. B·N = 16384, H = 16, not causal; TFLOP/s, median of 30 launches × 5 rounds.
    python bench/probe_softmax.py"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import attention_sm90_variant, compare  # noqa: E402

PARTS = {0: "intact", 1: "no row sum", 2: "no row max", 3: "no exp2", 4: "no O rescale"}
PAD, PAD2 = "\n" + " " * 12, "\n" + " " * 16  # line starts in the key loop's body (the row sum: in an else)
SWAPS = {
    f"{PAD}m_new = max(m, row_max(s))\n":
        f"{PAD}if PART == 2:{PAD}    m_new = max(m, zeros(rv[f32, 16])){PAD}else:{PAD}    m_new = max(m, row_max(s))\n",
    f"{PAD}p = exp2(sub_row(s * scale_log2, m * scale_log2))\n":
        f"{PAD}if PART == 3:{PAD}    p = sub_row(s * scale_log2, m * scale_log2){PAD}else:"
        f"{PAD}    p = exp2(sub_row(s * scale_log2, m * scale_log2))\n",
    f"{PAD2}l = l + row_sum(p)\n": f"{PAD2}if PART == 1:{PAD2}    l = l + 1.0{PAD2}else:{PAD2}    l = l + row_sum(p)\n",
    f"{PAD}else:{PAD}    o = mul_row(o, correction)\n": f"{PAD}elif PART != 4:{PAD}    o = mul_row(o, correction)\n",
}
attention_probe = attention_sm90_variant("PART", SWAPS)  # a const PART: the part left out

if __name__ == "__main__":
    from tkc.kernels.attention import launch_sm90, sm90_config

    torch.manual_seed(0)
    for d, n in [(64, 1024), (64, 4096), (128, 1024)]:
        batch, heads = 16384 // n, 16
        q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out = torch.empty_like(q)
        lse = torch.empty((1, 1, 1), dtype=torch.float32, device="cuda")
        cfg = sm90_config(d, n, n)
        fns = {name: (lambda part=part: launch_sm90(q, k, v, out, lse, d ** -0.5, cfg, kernel=attention_probe,
                                                    PART=part))
               for part, name in PARTS.items()}
        times = compare(fns, 5, 30)
        flops = 4 * batch * heads * n * n * d
        print(f"D={d} N={n} {cfg}", flush=True)
        for name, ms in times.items():
            print(f"  {name:14s} {flops / (ms * 1e-3) / 1e12:6.0f} TFLOP/s  {times['intact'] / ms:5.3f}x", flush=True)
