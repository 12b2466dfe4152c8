"""Does a cache hint on layernorm_kernel's global loads and stores move it closer to the copy bandwidth? A measurement
to decide whether the DSL should grow cache hints, not a way to run kernels: the kernel's PTX as tkc emits it, with
the hints put into its ld.global / st.global lines by text substitution, loaded with the driver and launched with
the kernel's own parameters, beside layernorm() and a same-size copy (event-timed, 30 calls × 5 interleaved rounds,
and from a CUDA graph); GB/s as a fraction of a 1 GiB copy's. Each variant's output is checked first.
    python bench/probe_cache_hints.py [--rows 16384] [--dim 1024]"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import layernorm_setup, rel_err, report_copy_fractions  # noqa: E402

from tkc.compiler import compile_for_launch  # noqa: E402
from tkc.kernels import layernorm, layernorm_kernel  # noqa: E402
from tkc.runtime import driver, launch  # noqa: E402

# name: (what replaces "ld.global.", what replaces "st.global.")
VARIANTS = {
    "as emitted": ("ld.global.", "st.global."),
    "st.cs": ("ld.global.", "st.global.cs."),
    "ld.nc": ("ld.global.nc.", "st.global."),
    "ld.nc st.cs": ("ld.global.nc.", "st.global.cs."),
    "ld.L1::no_allocate st.cs": ("ld.global.L1::no_allocate.", "st.global.cs."),
    "ld.nc.L2::256B st.cs": ("ld.global.nc.L2::256B.", "st.global.cs."),
    "ld.lu st.cs": ("ld.global.lu.", "st.global.cs."),
    "ld.L1::evict_first st.L1::no_allocate": ("ld.global.L1::evict_first.", "st.global.L1::no_allocate."),
}


def variant_ptx(ptx: str, load: str, store: str) -> str:
    return ptx.replace("ld.global.", load).replace("st.global.", store)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--warps", type=int, default=2)
    parser.add_argument("--check-only", action="store_true", help="assemble each variant with ptxas (no GPU)")
    args = parser.parse_args()
    m, d = args.rows, args.dim
    constants = layernorm_kernel.resolve_constants({"D": d, "WARPS": args.warps})
    aligns = {p.name: 16 for p in layernorm_kernel.runtime_params if p.kind == "tensor"}
    compiled = compile_for_launch(layernorm_kernel, "sm_90a", constants, aligns)
    if args.check_only:
        from tkc.backend.ptxas import assemble
        for name, (load, store) in VARIANTS.items():
            assemble(variant_ptx(compiled.ptx, load, store), "sm_90a")
            print(f"{name}: assembles")
        return

    setup = layernorm_setup(m, d)
    x, r, w, b, o, ro, ref = setup.x, setup.r, setup.w, setup.b, setup.o, setup.ro, setup.ref
    params = launch.ParamBuffer(compiled.params)
    packed = params.pack(launch._param_values(layernorm_kernel, (x, r, w, b, o, ro, 1e-5)))
    impls = {"layernorm()": lambda: layernorm(x, r, w, b, out=o, residual_out=ro),
             "same-size copy": lambda: setup.dst.copy_(setup.src)}
    for name, (load, store) in VARIANTS.items():
        loaded = driver.load_ptx(variant_ptx(compiled.ptx, load, store), compiled.name, compiled.threads,
                                 compiled.shared_bytes)
        impls[name] = (lambda loaded=loaded: driver.launch(loaded, (m, 1, 1), torch.cuda.current_stream().cuda_stream,
                                                           params.address(packed)))  # the stream a graph captures
    for name, fn in impls.items():
        if name != "same-size copy":
            o.fill_(float("nan"))
            ro.fill_(float("nan"))
            fn()
            err = max(rel_err(o, ref), rel_err(ro, x.float() + r.float()))
            assert err < 1e-2, f"{name}: relative error {err}"
    report_copy_fractions(f"{m}x{d} W{args.warps}", impls, setup.nbytes, setup.copy_gbs)


if __name__ == "__main__":
    main()
