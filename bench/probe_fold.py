"""Row sums folded into P·V: what attention_sm90 would gain if the tensor cores added each row's sum as 16 more
columns of P·V (P·[V | 1], N = D + 16) instead of the softmax's adds and shuffles. A copy of the kernel with
FOLD=1 reads V' = [V | ones] (B, H, N, D + 16) and stores the unnormalized O' = [P·V | P·1] (the host divides,
to check it): timing only, with 25% more V and O bytes than a fold in the compiler would move. Beside it
attention() and the intact copy, cuDNN and flash; TMA-loaded V tiles of D + 16 columns take the 32-byte swizzle.
    python bench/probe_fold.py [--seqlens 1024] [--causal 0 1] [--rounds 7]"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import attention_sm90_variant, compare, print_rates, probe_arguments, probe_inputs, rel_err  # noqa: E402

from attention import BACKENDS, sdpa  # noqa: E402

P12, P8 = "\n" + " " * 12, "\n" + " " * 8  # line starts in the key loop's body, in the tile loop's
SWAPS = {
    "load(V, (b, h, j, 0), st[bf16, KEYS, D])": "load(V, (b, h, j, 0), st[bf16, KEYS, D + 16 * FOLD])",
    "zeros(rv[f32, 16]), zeros(rt[f32, 16, D])": "zeros(rv[f32, 16]), zeros(rt[f32, 16, D + 16 * FOLD])",
    f"{P12}    l = l + row_sum(p)\n": f"{P12}    if not FOLD:{P12}        l = l + row_sum(p)\n",
    f"{P8}store(O, div_row(o, l).to(bf16), (b, h, q_tile, 0))":
        f"{P8}if FOLD:{P8}    store(O, o.to(bf16), (b, h, q_tile, 0)){P8}else:"
        f"{P8}    store(O, div_row(o, l).to(bf16), (b, h, q_tile, 0))",
}
attention_fold = attention_sm90_variant("FOLD", SWAPS)


def launch(q, k, v, out, causal: bool, cfg: dict, fold: int) -> torch.Tensor:
    from tkc.kernels.attention import launch_sm90

    lse = torch.empty((1, 1, 1), dtype=torch.float32, device=q.device)
    launch_sm90(q, k, v, out, lse, q.shape[3] ** -0.5, cfg, causal=causal, kernel=attention_fold, FOLD=fold)
    return out


if __name__ == "__main__":
    from tkc.kernels import attention
    from tkc.kernels.attention import sm90_config

    args = probe_arguments([64], [1024], 7)
    for d, causal, n, q, k, v in probe_inputs(args):
        batch, heads = q.shape[:2]
        v1 = torch.cat([v, torch.ones_like(v[..., :16])], -1).contiguous()
        out, out1 = torch.empty_like(q), torch.empty(batch, heads, n, d + 16, device="cuda", dtype=torch.bfloat16)
        cfg = sm90_config(d, n, n, causal)
        ref = sdpa(BACKENDS["cuDNN"], q, k, v, causal).float()
        out1.fill_(float("nan"))
        launch(q, k, v1, out1, causal, cfg, 1)
        folded = out1[..., :d].float() / out1[..., d:d + 1].float()
        err = rel_err(folded, ref)
        fns = {"attention()": lambda: attention(q, k, v, causal=causal),
               "intact copy": lambda: launch(q, k, v, out, causal, cfg, 0),
               "fold P·[V|1]": lambda: launch(q, k, v1, out1, causal, cfg, 1),
               "cuDNN": lambda: sdpa(BACKENDS["cuDNN"], q, k, v, causal),
               "flash": lambda: sdpa(BACKENDS["flash"], q, k, v, causal)}
        print(f"fold output vs cuDNN (host-normalized): {err:.2e}", flush=True)
        print_rates(f"D={d} causal={int(causal)} N={n} {cfg}", compare(fns, rounds=args.rounds),
                    4 * batch * heads * n * n * d / (2 if causal else 1))
