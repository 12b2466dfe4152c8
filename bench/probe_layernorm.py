"""layernorm_kernel at 16384×1024 (the shape short of 0.9× copy bandwidth through layernorm()) beside variants that
shorten a block's life (its last blocks are the kernel's tail): weight and bias read with x rather than after the
sums (WB=1: one L1/L2 round trip less after the sums, 2·COLS/32 more registers), and the mean and the mean square
exchanged at once (ONE_PASS=1: each warp's sum and squares about its own mean, combined pairwise; two barriers
a row rather than four).
Each beside layernorm() and a same-size copy, event-timed (30 calls × 5 interleaved rounds) and from a CUDA graph
(the kernel alone); GB/s as a fraction of a 1 GiB copy's. Earlier variants (register caps, a row a warp, resident
grids reading ahead): RESULTS "layernorm probe — 2026-12-04 02:02–02:20".
Beside them copy_rows: the kernel's reads and writes without its arithmetic (two read and two write streams, and
a plain copy of as many bytes on twice the rows), what any kernel with layernorm's traffic and grid can reach.
    python bench/probe_layernorm.py [--rows 16384] [--dim 1024] [--all] [--kernel-warps 2 4]"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import layernorm_setup, rel_err, report_copy_fractions  # noqa: E402

import tkc  # noqa: E402
from tkc.kernels import layernorm  # noqa: E402
from tkc.kernels.layernorm import row_total  # noqa: E402
from tkc.lang import *  # noqa: E402, F403


@tkc.func
def row_mean_var(s, sum_slots, square_slots, warps, cols, d):
    """The mean and variance of a row over `warps` warps of `cols` values `s` each, with one exchange through
    shared memory: each warp's sum and the sum of squares about its own mean (Chan et al.'s pairwise combination:
    M2 = Σ M2ᵢ + Σ colsᵢ·(meanᵢ − mean)², no E[s²] − mean² cancellation). Lane j reads warp j // 16's values."""
    local = sum(s)
    dev = s - local / cols
    m2 = sum(dev * dev)
    if warps == 1:
        return local / d, m2 / d
    sums = store(sum_slots, zeros(rv[f32, 16]) + local, (warp_id(),))
    squares = store(square_slots, zeros(rv[f32, 16]) + m2, (warp_id(),))
    chunks = 16 * warps // 32
    total = load(sums, (0,), rv[f32, 32])
    for i in range(1, chunks):
        total = total + load(sums, (i,), rv[f32, 32])
    mean = sum(total) / 16 / d
    spread = load(sums, (0,), rv[f32, 32]) / cols - mean
    var = spread * spread * cols + load(squares, (0,), rv[f32, 32])
    for i in range(1, chunks):
        spread = load(sums, (i,), rv[f32, 32]) / cols - mean
        var = var + spread * spread * cols + load(squares, (i,), rv[f32, 32])
    return mean, sum(var) / 16 / d


@tkc.kernel(warps="WARPS", min_target="sm_80")
def layernorm_probe(X: gl[bf16, 2], Residual: gl[bf16, 2], Weight: gl[bf16, 1], Bias: gl[bf16, 1],
                    Out: gl[bf16, 2], OutResidual: gl[bf16, 2], eps: float, D: const = 1024, WARPS: const = 2,
                    WB: const = 0, ONE_PASS: const = 0):
    COLS = D // WARPS
    part = warp_id()
    scratch = empty(sv[f32, 16 * WARPS])
    square_slots = empty(sv[f32, 16 * WARPS])
    for row in range(block_idx()[0], X.shape[0], num_blocks()[0]):
        if WB == 1:
            w, b = load(Weight, (part,), rv[f32, COLS]), load(Bias, (part,), rv[f32, COLS])
        s = load(X, (row, part), rv[f32, COLS]) + load(Residual, (row, part), rv[f32, COLS])
        store(OutResidual, s, (row, part))
        if ONE_PASS == 1:
            mean, var = row_mean_var(s, scratch, square_slots, WARPS, COLS, D)
            centered = s - mean
        else:
            centered = s - row_total(sum(s), scratch, WARPS) / D
            var = row_total(sum(centered * centered), scratch, WARPS) / D
        rstd = rsqrt(var + eps)
        if WB == 0:
            w, b = load(Weight, (part,), rv[f32, COLS]), load(Bias, (part,), rv[f32, COLS])
        store(Out, centered * rstd * w + b, (row, part))


@tkc.kernel(warps="WARPS", min_target="sm_80")
def copy_rows(X: gl[bf16, 2], Residual: gl[bf16, 2], Out: gl[bf16, 2], OutResidual: gl[bf16, 2], D: const = 1024,
              WARPS: const = 2, STREAMS: const = 2, ROWS: const = 1):
    """layernorm_kernel's reads and writes without its arithmetic: X → Out and Residual → OutResidual (STREAMS=2,
    its two read and two write streams) or X → Out alone (STREAMS=1, a plain copy, on twice the rows); ROWS rows a
    block (1 or 2), every read in flight before the first write."""
    part = warp_id()
    row = block_idx()[0] * ROWS
    x = load(X, (row, part), rv[bf16, D // WARPS])
    if STREAMS == 2:
        r = load(Residual, (row, part), rv[bf16, D // WARPS])
    if ROWS == 2:
        x1 = load(X, (row + 1, part), rv[bf16, D // WARPS])
        if STREAMS == 2:
            r1 = load(Residual, (row + 1, part), rv[bf16, D // WARPS])
    store(Out, x, (row, part))
    if STREAMS == 2:
        store(OutResidual, r, (row, part))
    if ROWS == 2:
        store(Out, x1, (row + 1, part))
        if STREAMS == 2:
            store(OutResidual, r1, (row + 1, part))


@tkc.func
def rows_total(partial, scratch, warps):
    """Each of 16 rows' sums over the block's warps, from each warp's partial sums (one per row)."""
    slots = store(scratch, partial, (warp_id(),))
    total = load(slots, (0,), rv[f32, 16])
    for i in range(1, warps):
        total = total + load(slots, (i,), rv[f32, 16])
    return total


@tkc.kernel(warps="WARPS", stages="STAGES", tma_store="TMA_STORE", min_target="sm_80")
def staged_layernorm(X: gl[bf16, 2], Residual: gl[bf16, 2], Weight: gl[bf16, 1], Bias: gl[bf16, 1],
                     Out: gl[bf16, 2], OutResidual: gl[bf16, 2], eps: float, D: const = 1024, WARPS: const = 8,
                     STAGES: const = 2, TMA_STORE: const = 1):
    """Blocks of 16 rows staged in shared memory by an asynchronous ring (TMA on sm_90a, cp.async on sm_80) on a
    persistent grid, each warp a 16 × D/WARPS register tile of them; row sums over the warps through shared
    memory. The rows' next blocks load while this one is normalized."""
    W = D // WARPS
    sums, squares = empty(sv[f32, 16 * WARPS]), empty(sv[f32, 16 * WARPS])
    w, b = load(Weight, (warp_id(),), rv[f32, W]), load(Bias, (warp_id(),), rv[f32, W])
    for t in range(block_idx()[0], cdiv(X.shape[0], 16), num_blocks()[0]):
        xs, rs = load(X, (t, 0), st[bf16, 16, D]), load(Residual, (t, 0), st[bf16, 16, D])
        s = load(xs, (0, warp_id()), rt[bf16, 16, W]).to(f32) + load(rs, (0, warp_id()), rt[bf16, 16, W]).to(f32)
        store(OutResidual, s.to(bf16), (t, warp_id()))
        c = sub_row(s, rows_total(row_sum(s), sums, WARPS) / D)
        rstd = rsqrt(rows_total(row_sum(c * c), squares, WARPS) / D + eps)
        store(Out, add_col(mul_col(mul_row(c, rstd), w), b).to(bf16), (t, warp_id()))


STAGED = {"sm_90a": [{"WARPS": 8, "STAGES": 2, "TMA_STORE": 1}, {"WARPS": 8, "STAGES": 3, "TMA_STORE": 0},
                     {"WARPS": 16, "STAGES": 2, "TMA_STORE": 1}, {"WARPS": 16, "STAGES": 3, "TMA_STORE": 0}],
          "sm_80": [{"WARPS": 8, "STAGES": 2}, {"WARPS": 16, "STAGES": 2}]}


def compare_staged(m: int, d: int) -> None:
    """staged_layernorm (each STAGED configuration, persistent) beside layernorm() and a same-size copy."""
    setup = layernorm_setup(m, d)
    x, r, w, b, o, ro = setup.x, setup.r, setup.w, setup.b, setup.o, setup.ro
    args = (x, r, w, b, o, ro, 1e-5)
    impls = {"layernorm()": lambda: layernorm(x, r, w, b, out=o, residual_out=ro),
             "same-size copy": lambda: setup.dst.copy_(setup.src)}
    for target, configs in STAGED.items():
        for cfg in configs:
            spec = staged_layernorm.specialize(target=target, D=d, **cfg)
            grid = spec.resident_blocks(*args)
            name = f"staged {target} " + " ".join(f"{k}={v}" for k, v in cfg.items()) + f" grid={grid}"
            impls[name] = (lambda spec=spec, grid=grid: spec[(grid,)](*args))
    for name, fn in impls.items():
        if name != "same-size copy":
            o.fill_(float("nan"))
            ro.fill_(float("nan"))
            fn()
            assert rel_err(o, setup.ref) < 1e-2, f"{name}: relative error {rel_err(o, setup.ref)}"
            assert torch.equal(ro, (x.float() + r.float()).to(torch.bfloat16)), f"{name}: residual_out"
    report_copy_fractions(f"{m}x{d}", impls, setup.nbytes, setup.copy_gbs)


def compare_kernel_warps(m: int, d: int, warps: list[int]) -> None:
    """layernorm_kernel as shipped, a block a row, at each of `warps` warps a row."""
    from tkc.kernels import layernorm_kernel

    setup = layernorm_setup(m, d)
    x, r, w, b, o, ro = setup.x, setup.r, setup.w, setup.b, setup.o, setup.ro
    impls = {"layernorm()": lambda: layernorm(x, r, w, b, out=o, residual_out=ro),
             "same-size copy": lambda: setup.dst.copy_(setup.src)}
    for n in warps:
        impls[f"layernorm_kernel W{n}"] = (lambda n=n: layernorm_kernel[(m,)](x, r, w, b, o, ro, 1e-5, D=d, WARPS=n))
    for name, fn in impls.items():
        if name != "same-size copy":
            o.fill_(float("nan"))
            fn()
            assert rel_err(o, setup.ref) < 1e-2, f"{name}: relative error {rel_err(o, setup.ref)}"
    report_copy_fractions(f"{m}x{d}", impls, setup.nbytes, setup.copy_gbs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--all", action="store_true", help="every WB / ONE_PASS / warps variant (else W2 alone)")
    parser.add_argument("--check-only", action="store_true", help="compile each variant and print ptxas's report")
    parser.add_argument("--kernel-warps", type=int, nargs="*",
                        help="only layernorm_kernel itself with these WARPS (beside layernorm() and the copy)")
    parser.add_argument("--staged", action="store_true", help="staged_layernorm (rows staged in shared memory by "
                        "TMA / cp.async rings) beside layernorm() and the copy")
    args = parser.parse_args()
    m, d = args.rows, args.dim
    if args.staged:
        compare_staged(m, d)
        return
    if args.kernel_warps:
        compare_kernel_warps(m, d, args.kernel_warps)
        return
    variants = {f"W{warps} WB={wb} ONE_PASS={one}": {"D": d, "WARPS": warps, "WB": wb, "ONE_PASS": one}
                for warps in (2, 4) for wb in (0, 1) for one in (0, 1) if args.all or (warps, wb, one) == (2, 0, 0)}
    if args.check_only:
        from tkc.backend.ptxas import assemble
        from tkc.compiler import compile_for_launch
        aligns = {p.name: 16 for p in layernorm_probe.runtime_params if p.kind == "tensor"}
        for name, constants in variants.items():
            ptx = compile_for_launch(layernorm_probe, "sm_90a", layernorm_probe.resolve_constants(constants), aligns).ptx
            report = next(iter(assemble(ptx, "sm_90a").values()))
            print(f"{name}: {report.registers} registers, {report.spill_stores} spill stores")
        return
    setup = layernorm_setup(m, d)
    x, r, w, b, o, ro, ref = setup.x, setup.r, setup.w, setup.b, setup.o, setup.ro, setup.ref
    impls = {"layernorm()": lambda: layernorm(x, r, w, b, out=o, residual_out=ro),
             "same-size copy": lambda: setup.dst.copy_(setup.src)}
    for name, constants in variants.items():
        impls[name] = (lambda constants=constants: layernorm_probe[(m,)](x, r, w, b, o, ro, 1e-5, **constants))
    xx, oo = torch.cat([x, r]), torch.empty(2 * m, d, device="cuda", dtype=torch.bfloat16)
    copies = {}
    for warps, rows in ((1, 1), (2, 1), (4, 1), (2, 2), (4, 2)):
        copies[f"copy_rows 2+2 W{warps} ROWS={rows}"] = (lambda warps=warps, rows=rows: copy_rows[(m // rows,)](
            x, r, o, ro, D=d, WARPS=warps, STREAMS=2, ROWS=rows))
    for warps, rows in ((2, 1), (2, 2)):
        copies[f"copy_rows 1+1 W{warps} ROWS={rows}"] = (lambda warps=warps, rows=rows: copy_rows[(2 * m // rows,)](
            xx, xx, oo, oo, D=d, WARPS=warps, STREAMS=1, ROWS=rows))
    for name, fn in copies.items():
        o.fill_(float("nan"))
        ro.fill_(float("nan"))
        oo.fill_(float("nan"))
        fn()
        assert torch.equal(oo, xx) if "1+1" in name else (torch.equal(o, x) and torch.equal(ro, r)), name
    impls |= copies
    for name, fn in impls.items():
        if name.startswith("copy_rows"):
            continue
        if name != "same-size copy":
            o.fill_(float("nan"))
            fn()
            assert rel_err(o, ref) < 1e-2, f"{name}: relative error {rel_err(o, ref)}"
    report_copy_fractions(f"{m}x{d}", impls, setup.nbytes, setup.copy_gbs)


if __name__ == "__main__":
    main()
