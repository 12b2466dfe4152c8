"""Bring a GPU machine's benchmark output home: each `<name>.md` section under the given folder (what
bench/gemm.py, attention.py, attention_backward.py, layernorm.py, scaled_mm.py, attention_varlen.py,
attention_kvcache.py and probe_varlen.py write to $OUT) is appended to bench/RESULTS.md, each `<name>.json`
copied to bench/results/ (unless it has fewer rows than the one there: a focused run keeps the sweep of record
plotted), and the plots redrawn.

    python bench/collect.py /path/to/OUT
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("gemm", "attention", "attention-backward", "layernorm", "scaled_mm", "attention-varlen",
         "attention-varlen-backward", "attention-kvcache", "probe-varlen", "probe-varlen-backward")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    found = [name for name in NAMES if (args.folder / f"{name}.md").exists()]
    if not found:
        raise SystemExit(f"{args.folder}: no {', '.join(f'{n}.md' for n in NAMES)} here")
    with open(ROOT / "bench" / "RESULTS.md", "a") as f:
        for name in found:
            f.write((args.folder / f"{name}.md").read_text())
    for name in found:
        new, old = args.folder / f"{name}.json", results / f"{name}.json"
        if not new.exists():
            continue
        if old.exists() and _rows(new) < _rows(old):  # a focused run (some sizes): the full sweep stays plotted
            print(f"{name}.json kept: this run has {_rows(new)} rows, the sweep of record {_rows(old)}")
            continue
        shutil.copyfile(new, old)
    print(f"appended {', '.join(found)} to bench/RESULTS.md")
    try:
        from plot import main as plot
    except ImportError as e:  # matplotlib is a benchmark tool, not a dependency of tkc
        print(f"plots not redrawn ({e}); pip install matplotlib, then python bench/plot.py")
        return
    plot()


def _rows(path: Path) -> int:
    return len(json.loads(path.read_text()).get("rows", []))


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
