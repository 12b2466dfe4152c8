"""Timing and reporting shared by the benchmarks.

Every implementation is timed through its public entry point with CUDA events: warm-up, then `launches` calls
queued back to back, each between two events, median taken (host overhead shows only where it exceeds the kernel); the whole round over all implementations is repeated `rounds` times,
interleaved, and the median of the rounds' medians is reported. Each implementation's output is checked against
a float32 reference in the same run.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import random
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def attention_sm90_variant(const: str, swaps: dict[str, str]) -> Any:
    """attention_sm90 rebuilt from its own source as `attention_probe`, with one more const parameter `const`
    (default 0) and each key of `swaps` (found exactly once) replaced by its value, loaded as a module of its own:
    a probe's copy of the kernel, timed beside it (bench/probe_store.py, bench/probe_softmax.py)."""
    import importlib.util
    import tempfile

    source = Path(importlib.util.find_spec("tkc.kernels.attention").origin).read_text()
    start, end = source.index('@tkc.kernel(warps="WARPS"'), source.index("# (ROWS, KEYS, Q_IN_SHARED) per head dim")
    kernel = source[start:end].replace("def attention_sm90(", "def attention_probe(")
    kernel = kernel.replace("Q_REGS: const = 0,", f"Q_REGS: const = 0, {const}: const = 0,", 1)
    for old, new in swaps.items():
        assert kernel.count(old) == 1, f"attention_sm90 changed: update the probe ({old.strip()})"
        kernel = kernel.replace(old, new)
    path = Path(tempfile.mkdtemp()) / "attention_probe.py"
    path.write_text("import math\nimport tkc\nfrom tkc.kernels.attention import kv_head\nfrom tkc.lang import *  # noqa: F403"
                    "\n\n\n" + kernel)
    spec = importlib.util.spec_from_file_location("attention_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.attention_probe


def probe_arguments(dims: list[int], seqlens: list[int], rounds: int, only: bool = False) -> Any:
    """A probe's command line: --dims, --causal, --seqlens, --rounds (with these defaults; causal 0 and 1), and where
    `only`, --only: a regular expression the names of the candidates to time must match."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--dims", type=int, nargs="+", default=dims)
    parser.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--seqlens", type=int, nargs="+", default=seqlens)
    parser.add_argument("--rounds", type=int, default=rounds)
    if only:
        parser.add_argument("--only", default="", help="time only the candidates whose names match (re.search)")
    return parser.parse_args()


def probe_inputs(args: Any) -> Any:
    """(d, causal, n, q, k, v) for each of a probe's shapes: B·N = 16384, H = 16, fresh random bf16 inputs."""
    torch.manual_seed(0)
    for d in args.dims:
        for causal in map(bool, args.causal):
            for n in args.seqlens:
                q, k, v = (torch.randn(16384 // n, 16, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                yield d, causal, n, q, k, v


def with_settings(module: Any, settings: dict[str, Any], fn: Callable[[], Any],
                  planned: tuple[Any, ...] = ()) -> Callable[[], Any]:
    """fn run under module.<name> = value for each of `settings` (e.g. tkc.kernels.gemm's FEW_ROWS_LAST_BLOCK), the
    launch plans (`_PLANS`) of `module` and of each of `planned` its own (plans are made under the settings in force)."""
    owners = (module, *planned)
    plans: list[dict] = [{} for _ in owners]

    def run() -> Any:
        saved = {name: getattr(module, name) for name in settings}, [owner._PLANS for owner in owners]
        for name, value in settings.items():
            setattr(module, name, value)
        for owner, own in zip(owners, plans):
            owner._PLANS = own
        try:
            return fn()
        finally:
            for name, value in saved[0].items():
                setattr(module, name, value)
            for owner, old in zip(owners, saved[1]):
                owner._PLANS = old
    return run


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return math.inf
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def time_ms(fn: Callable[[], Any], launches: int = 30, warmup: int = 5) -> float:
    """Median milliseconds of `launches` back-to-back calls, with a CUDA event recorded between consecutive calls
    (the time of a call is from the event before it to the event after it). The calls are queued without waiting in
    between (as a model's layers are), so a call's host-side work overlaps the previous call's kernel and only shows
    where it is longer than the kernel. One event per call rather than a pair: recording an event costs the host
    ~6 µs on the H200 machine (bench/host_breakdown.py), which a pair would add twice to every call."""
    # Warm up for at least `warmup` calls and 50 ms, so that every implementation is timed at the clocks of a
    # busy GPU (the one timed first after a pause would otherwise start at idle clocks).
    deadline = time.perf_counter() + 0.05
    calls = 0
    while calls < warmup or time.perf_counter() < deadline:
        fn()
        calls += 1
        if calls % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(launches + 1)]
    stream = torch.cuda.current_stream()  # passed to record(): it would otherwise make a Stream object each time
    events[0].record(stream)
    for event in events[1:]:
        fn()
        event.record(stream)
    torch.cuda.synchronize()
    return statistics.median(before.elapsed_time(after) for before, after in zip(events, events[1:]))


def graph_time_ms(fn: Callable[[], Any], launches: int = 30, replays: int = 5) -> float:
    """Milliseconds per call of `launches` calls captured in one CUDA graph, median over `replays` replays: the
    GPU's time for the call with no host work at all (what a model captured in a graph pays)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # allocations and compilation outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / launches)
    return statistics.median(times)


def copy_bandwidth(rounds: int, launches: int) -> float:
    """GB/s (read + write) of a 1 GiB device-to-device copy, timed as the implementations are (the layernorm
    benchmarks' yardstick); printed too."""
    big = torch.empty(1 << 30, device="cuda", dtype=torch.uint8)
    big2 = torch.empty_like(big)
    copy_gbs = 2 * big.numel() / compare({"copy": lambda: big2.copy_(big)}, rounds, launches)["copy"] / 1e6
    print(f"device-to-device copy: {copy_gbs:.0f} GB/s (read + write)")
    return copy_gbs


def layernorm_setup(m: int, d: int) -> Any:
    """What the layernorm probes time against at m×d: `copy_gbs` (a 1 GiB copy's GB/s), inputs x, r, w, b, outputs
    o, ro, a same-size copy's `src` and `dst`, the float32 reference `ref` and the bytes a call moves."""
    from types import SimpleNamespace

    big = torch.empty(2**29, device="cuda", dtype=torch.bfloat16)
    copy_gbs = 2 * big.numel() * 2 / time_ms(lambda: big.clone()) / 1e6  # big is freed when this returns
    x, r = (torch.randn(m, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w, b = (torch.randn(d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    src, dst = (torch.empty(4 * m * d, device="cuda", dtype=torch.uint8) for _ in range(2))
    ref = torch.nn.functional.layer_norm(x.float() + r.float(), (d,), w.float(), b.float(), 1e-5)
    return SimpleNamespace(copy_gbs=copy_gbs, x=x, r=r, w=w, b=b, o=torch.empty_like(x), ro=torch.empty_like(x),
                           src=src, dst=dst, ref=ref, nbytes=8 * x.numel())


def report_copy_fractions(title: str, impls: dict[str, Callable[[], Any]], nbytes: int, copy_gbs: float,
                          rounds: int = 5) -> None:
    """Time `impls` interleaved (30 calls × `rounds` rounds) and print each one's GB/s as a fraction of `copy_gbs`,
    event-timed and from a CUDA graph."""
    times = compare(impls, rounds=rounds)
    print(f"{title}: 1 GiB copy {copy_gbs:.0f} GB/s; fractions of it, event-timed / graph")
    for name, ms in times.items():
        graph = nbytes / graph_time_ms(impls[name]) / 1e6 / copy_gbs
        print(f"  {name:40s} {nbytes / ms / 1e6 / copy_gbs:5.3f}  {graph:5.3f}", flush=True)


def checked_time(run: Callable[[], Any], out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """Poison `out`, run once and compare it with `ref`, then time `run`: (median ms, relative error)."""
    out.fill_(float("nan"))
    run()
    err = rel_err(out, ref)
    return time_ms(run), err


def compare(impls: dict[str, Callable[[], Any]], rounds: int = 3, launches: int = 30) -> dict[str, float]:
    """Median over `rounds` interleaved rounds of each implementation's median time (ms); failing ones are NaN.
    Each round takes the implementations in a new order: the GPU's clocks depend on what ran just before (the
    same kernel timed twice in one fixed order differed by up to 8%), so no one gets the same place every round."""
    per_round: dict[str, list[float]] = {name: [] for name in impls}
    order = random.Random(0)
    for _ in range(rounds):
        for name in order.sample(list(impls), len(impls)):
            fn = impls[name]
            try:
                per_round[name].append(time_ms(fn, launches))
            except Exception as e:  # a peer that cannot run this case (e.g. a backend that refuses it)
                print(f"    {name}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                per_round[name].append(float("nan"))
    return {name: statistics.median(t) for name, t in per_round.items()}


def check_outputs(impls: dict[str, Callable[[], Any]], ref: torch.Tensor, tol: float = 1e-2, where: str = "") -> None:
    """Run each implementation once: its output must be finite and within `tol` (relative) of `ref` (probes check
    before they time)."""
    for name, fn in impls.items():
        out = fn()
        finished_or_exit(f"{where} {name}")
        err = rel_err(out, ref)
        assert err < tol, f"{where} {name}: relative error {err}"


def finished_or_exit(what: str, seconds: float = 60.0) -> None:
    """Wait for the work queued on the current stream, at most `seconds`; past that, say what hung and end the
    process (only that frees the GPU of a kernel that never returns), so that the device call's other steps run."""
    import os
    import time

    done = torch.cuda.Event()
    done.record()
    deadline = time.monotonic() + seconds
    while not done.query():
        if time.monotonic() > deadline:
            print(f"{what}: not finished after {seconds:.0f} s (a hang?): ending this probe", flush=True)
            os._exit(3)
        time.sleep(0.001)


def print_rates(title: str, times: dict[str, float], flops: float, peers: tuple[str, ...] = ("cuDNN", "flash")) -> None:
    """A probe's lines: each implementation's TFLOP/s from its median ms, and its ratio to each peer."""
    rates = {name: flops / (ms * 1e-3) / 1e12 for name, ms in times.items()}
    print(title, flush=True)
    for name, rate in rates.items():
        ratios = "  ".join(f"/{peer} {rate / rates[peer]:.3f}" for peer in peers)
        print(f"  {name:18s} {rate:6.0f} TFLOP/s  {ratios}", flush=True)


def environment() -> dict[str, str]:
    props = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except Exception:
        driver = "?"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "absent"
    return {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "gpu": f"{props.name} ({props.multi_processor_count} SMs)",
        "driver": driver,
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "triton": triton_version,
        "python": platform.python_version(),
    }


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    """A markdown table; `columns` are (key, header); floats get 3 significant digits."""
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return "—" if math.isnan(v) else (f"{v:.2f}" if abs(v) < 10 else f"{v:.0f}")
        return str(v)

    lines = ["| " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(fmt(row.get(k, "")) for k, _ in columns) + " |")
    return "\n".join(lines)


def record(name: str, env: dict[str, str], text: str, rows: list[dict[str, Any]]) -> None:
    """Append a section to bench/RESULTS.md and write the raw rows as JSON for plot.py. Where $OUT is set (a lent
    GPU machine whose tree is thrown away), write the section and the JSON there instead, for bench/collect.py."""
    section = (f"\n## {name} — {env['date']}\n\n{env['gpu']}, driver {env['driver']}, torch {env['torch']} "
               f"(CUDA {env['cuda']}), triton {env['triton']}, Python {env['python']}.\n\n{text}\n")
    payload = json.dumps({"name": name, "env": env, "rows": rows}, indent=1)
    out = os.environ.get("OUT")
    if out:
        Path(out, f"{name}.md").write_text(section)
        Path(out, f"{name}.json").write_text(payload)
    else:
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write(section)
        (ROOT / "bench" / "results").mkdir(exist_ok=True)
        (ROOT / "bench" / "results" / f"{name}.json").write_text(payload)


def add_attention_sizes(parser: Any) -> None:
    """The attention benchmarks' sizes: B·N = --tokens, H = --heads, N in --seqlens, D in --dims, --causal 0 / 1."""
    parser.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=None,
                        help="heads of K and V, dividing --heads (grouped-query attention; default: --heads)")


def heads_text(args: Any) -> str:
    """The heads of add_attention_sizes' arguments, for a benchmark's description: H (and H_kv where it differs)."""
    kv = f", H_kv = {args.kv_heads} (grouped-query attention)" if args.kv_heads not in (None, args.heads) else ""
    return f"H = {args.heads}{kv}"


def attention_cases(args: Any) -> Any:
    """The (D, causal, N, B, H) of add_attention_sizes' arguments, D outermost (K and V's heads: args.kv_heads or
    H)."""
    for d in args.dims:
        for causal in map(bool, args.causal):
            for n in args.seqlens:
                yield d, causal, n, max(1, args.tokens // n), args.heads


def add_timing_options(parser: Any) -> None:
    parser.add_argument("--launches", type=int, default=30, help="timed launches per implementation and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds over all implementations")


def triton_peer() -> Any:
    """bench/triton_kernels, or None (saying why) where Triton cannot run here."""
    try:
        import triton_kernels
    except Exception as e:  # noqa: BLE001
        print(f"triton peer unavailable: {e}")
        return None
    return triton_kernels

