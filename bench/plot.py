"""One PNG per benchmark from the newest figures in bench/results/*.json (written by bench/gemm.py, attention.py,
attention_backward.py, layernorm.py, scaled_mm.py and rotary.py, or brought home by bench/collect.py): tkc and its peers side by side.

    python bench/plot.py        # needs matplotlib
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

# name: (x label, key of a row's case, the figures' unit, the implementations' keys)
PLOTS = {
    "gemm": ("M × N × K", "size", "TFLOP/s", ["tkc", "tkc sm_80", "cuBLAS", "triton"]),
    "attention": ("N (B·N = 16384, H = 16)", "N", "TFLOP/s", ["tkc", "tkc sm_80", "flash", "cuDNN", "mem-efficient", "triton"]),
    "layernorm": ("rows × D", "shape", "GB/s", ["tkc", "tkc sm_80", "torch", "triton", "copy"]),
    "attention-backward": ("N (B·N = 16384, H = 16)", "N", "TFLOP/s", ["tkc", "flash", "cuDNN", "mem-efficient"]),
    "scaled_mm": ("M × N × K", "size", "TFLOP/s", ["tkc", "cuBLASLt", "triton", "bf16 cuBLAS"]),
    "rotary": ("B × H × N × D", "shape", "GB/s", ["tkc", "tkc sm_80", "torch", "torch.compile", "triton"]),
}


def value(row: dict, impl: str, unit: str) -> float:
    for key in (f"{impl} {unit}", impl):
        if key in row and isinstance(row[key], int | float):
            return float(row[key])
    return float("nan")


def panels(name: str, rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """Attention (forward and backward) gets one panel per (D, causal), scaled_mm one per kind of scales; the
    others one panel."""
    if name == "scaled_mm":
        return [(f"{kind} scales", [r for r in rows if r["scales"] == kind]) for kind in ("tensor", "rowwise")]
    if not name.startswith("attention"):
        return [("", rows)]
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["D"], row["causal"]), []).append(row)
    return [(f"D={d}{', causal' if c else ''}", g) for (d, c), g in sorted(groups.items())]


def draw(name: str, payload: dict) -> Path:
    xlabel, case_key, unit, impls = PLOTS[name]
    groups = panels(name, payload["rows"])
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups) + 1, 3.6), squeeze=False, sharey=True)
    for ax, (title, rows) in zip(axes[0], groups):
        cases = [str(r[case_key]) for r in rows]
        width = 0.8 / len(impls)
        for i, impl in enumerate(impls):
            ys = [value(r, impl, unit) for r in rows]
            if all(y != y for y in ys):  # absent from this run
                continue
            ax.bar([x + (i - (len(impls) - 1) / 2) * width for x in range(len(cases))], ys, width, label=impl)
        ax.set_xticks(range(len(cases)), cases, rotation=30 if len(cases) > 4 else 0)
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel(unit)
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    env = payload["env"]
    fig.suptitle(f"{name}: {env['gpu']}\ndriver {env['driver']}, torch {env['torch']}, triton {env['triton']} "
                 f"({env['date']})", fontsize=9)  # two lines: a one-panel figure is narrow
    fig.tight_layout()
    path = ROOT / "bench" / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    for name in PLOTS:
        source = RESULTS / f"{name}.json"
        if source.exists():
            print(f"wrote {draw(name, json.loads(source.read_text())).relative_to(ROOT)}")


if __name__ == "__main__":
    main()
