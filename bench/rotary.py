"""Rotary position embedding (rotate-half): tkc.kernels.rotary vs torch (Hugging Face's apply_rotary_pos_emb
formula, x·cos + rotate_half(x)·sin, eager and under torch.compile) and a Triton kernel, in GB/s against the
device-to-device copy bandwidth measured in the same run. Bytes: x read and the output written (4 bytes per
element of x in bf16; cos and sin, one row per position shared by every head, counted too).

    python bench/rotary.py [--shapes 4x32x4096x128:128 ...] [--bshd] [--interleaved] [--positions]

A shape is B×H×N×D:R (R rotated columns, R < D: partial rotary). --bshd: x is a (B, N, H, D) tensor passed as its
(B, H, N, D) view (`x.transpose(1, 2)`), the layout q and k have straight out of a projection. --positions: each
row's angles from a positions tensor (N,) of random rows of a table of N (int64; torch gathers cos / sin by it first,
as Hugging Face's position_ids do).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_timing_options, compare, copy_bandwidth, environment, graph_time_ms, record, rel_err, table, triton_peer  # noqa: E402

import tkc.kernels  # noqa: E402


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def torch_rotary(x: torch.Tensor, cos_full: torch.Tensor, sin_full: torch.Tensor) -> torch.Tensor:
    """Hugging Face's form: cos / sin (N, R) in x's dtype (each half's angles twice), the first R columns turned."""
    r = cos_full.shape[-1]
    if r == x.shape[-1]:
        return x * cos_full + rotate_half(x) * sin_full
    turned = x[..., :r] * cos_full + rotate_half(x[..., :r]) * sin_full
    return torch.cat((turned, x[..., r:]), dim=-1)


def torch_rotary_interleaved(x: torch.Tensor, cos_full: torch.Tensor, sin_full: torch.Tensor) -> torch.Tensor:
    """GPT-J's form in Hugging Face: cos / sin (N, R) with each angle twice in a row (repeat_interleave), the pairs
    of adjacent columns turned: x·cos + rotate_every_two(x)·sin."""
    r = cos_full.shape[-1]
    pairs = x[..., :r]
    every_two = torch.stack((-pairs[..., 1::2], pairs[..., ::2]), dim=-1).flatten(-2)
    turned = pairs * cos_full + every_two * sin_full
    return turned if r == x.shape[-1] else torch.cat((turned, x[..., r:]), dim=-1)


def tables(n: int, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 10000.0 ** (-torch.arange(0, r, 2, device="cuda", dtype=torch.float64) / r)
    angles = torch.arange(n, device="cuda", dtype=torch.float64)[:, None] * inv_freq
    return angles.cos().float(), angles.sin().float()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", nargs="+", default=["4x32x4096x128:128", "1x32x16384x128:128", "16x16x2048x64:64",
                                                        "4x32x4096x128:64", "8x40x2048x128:128", "64x32x1x128:128"])
    parser.add_argument("--bshd", action="store_true", help="x given as the (B, H, N, D) view of a (B, N, H, D) tensor")
    parser.add_argument("--interleaved", action="store_true",
                        help="GPT-J's pairs of adjacent columns (torch: its eager formula)")
    parser.add_argument("--positions", action="store_true", help="angles by a positions tensor (N,) of random rows")
    add_timing_options(parser)
    args = parser.parse_args()
    triton_kernels = triton_peer()
    env = environment()
    copy_gbs = copy_bandwidth(args.rounds, args.launches)
    rows = []
    for shape in args.shapes:
        dims, r = shape.split(":")
        b, h, n, d = map(int, dims.split("x"))
        r = int(r)
        x = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2) if args.bshd else \
            torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
        cos, sin = tables(n, r)
        positions = torch.randint(0, n, (n,), device="cuda") if args.positions else None
        if args.interleaved:
            spread = lambda t: t.repeat_interleave(2, dim=-1)  # noqa: E731
            formula = torch_rotary_interleaved
        else:
            spread = lambda t: torch.cat((t, t), dim=-1)  # noqa: E731
            formula = torch_rotary
        cos_full, sin_full = (spread(t).to(torch.bfloat16) for t in (cos, sin))
        gathered = formula if positions is None else \
            (lambda x, c, s, f=formula: f(x, c[positions], s[positions]))  # the tables' rows by the positions first
        ref = gathered(x.double(), spread(cos).double(), spread(sin).double())
        nbytes = 4 * x.numel() + 2 * 4 * n * (r // 2)
        src = torch.empty(nbytes // 2, device="cuda", dtype=torch.uint8)  # a copy moving as many bytes
        dst = torch.empty_like(src)
        compiled = torch.compile(gathered, dynamic=False)  # specialized to each shape (else dynamic from the 2nd)
        pairs = args.interleaved
        impls = {"same-size copy": lambda: dst.copy_(src),
                 "tkc sm_80": lambda: tkc.kernels.rotary(x, cos, sin, positions=positions, interleaved=pairs,
                                                         target="sm_80"),
                 "tkc": lambda: tkc.kernels.rotary(x, cos, sin, positions=positions, interleaved=pairs),
                 "torch": lambda: gathered(x, cos_full, sin_full),
                 "torch.compile": lambda: compiled(x, cos_full, sin_full)}
        if triton_kernels is not None:
            impls["triton"] = lambda: triton_kernels.rotary(x, cos, sin, interleaved=pairs, positions=positions)
        errors = {}
        for name, fn in list(impls.items()):
            if name == "same-size copy":
                continue
            try:
                errors[name] = rel_err(fn(), ref)
            except Exception as e:  # noqa: BLE001
                print(f"  {name} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                del impls[name]
        times = compare(impls, args.rounds, args.launches)
        row = {"shape": f"{b}×{h}×{n}×{d}" + (f", R={r}" if r < d else ""), "MB": nbytes / 1e6,
               "same-size copy / copy": nbytes / times["same-size copy"] / 1e6 / copy_gbs}
        for name in ("tkc", "triton"):  # the kernels alone: calls replayed from a CUDA graph, no host work
            if name not in impls:
                row[f"{name} graph / copy"] = float("nan")
                continue
            try:
                row[f"{name} graph / copy"] = nbytes / graph_time_ms(impls[name], args.launches) / 1e6 / copy_gbs
            except Exception as e:  # noqa: BLE001
                print(f"  {name} in a CUDA graph failed: {type(e).__name__}: {e}")
                row[f"{name} graph / copy"] = float("nan")
        for name in ("tkc sm_80", "tkc", "torch", "torch.compile", "triton"):
            row[f"{name} GB/s"] = nbytes / times[name] / 1e6 if name in times else float("nan")
            row[f"{name} / copy"] = row[f"{name} GB/s"] / copy_gbs
            row[f"{name} err"] = errors.get(name, float("nan"))
        row["tkc µs"] = times["tkc"] * 1e3
        for peer in ("torch", "torch.compile", "triton"):
            row[f"tkc / {peer}"] = row["tkc GB/s"] / row[f"{peer} GB/s"]
        row["tkc / same-size copy"] = row["tkc / copy"] / row["same-size copy / copy"]
        rows.append(row)
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    cols = [("shape", "B×H×N×D"), ("MB", "MB a call"), ("tkc µs", "tkc µs")]
    cols += [(f"{n} GB/s", f"{n} GB/s") for n in ("tkc sm_80", "tkc", "torch", "torch.compile", "triton")]
    cols += [("tkc / copy", "tkc / copy"), ("same-size copy / copy", "same-size copy / copy"),
             ("tkc / same-size copy", "tkc / same-size copy")]
    cols += [(f"tkc / {p}", f"tkc / {p}") for p in ("torch", "torch.compile", "triton")]
    cols += [(f"{n} graph / copy", f"{n} graph / copy") for n in ("tkc", "triton")]
    cols += [("tkc err", "tkc rel err"), ("triton err", "triton rel err")]
    text = table(rows, cols)
    print(text)
    layout = "x a (B, N, H, D) tensor seen as (B, H, N, D)" if args.bshd else "x (B, H, N, D) contiguous"
    layout += ", interleaved pairs (GPT-J)" if args.interleaved else ""
    layout += ", angles by a positions tensor (N,) of random rows" if args.positions else ""
    record("rotary", env, f"GB/s (x read and written, cos and sin read), {layout}, bf16, cos / sin float32 (torch: "
           f"bf16 (N, R), as Hugging Face's); median of {args.launches} back-to-back launches × {args.rounds} interleaved "
           "rounds; copy = a 1 GiB device-to-device copy in the same run; same-size copy = a copy moving as many bytes, "
           "timed the same way; graph = the same calls replayed from a CUDA graph (the kernel alone, no host work).\n\n"
           + text, rows)


if __name__ == "__main__":
    main()
