"""Passes over tile IR, one per file, registered here by name for `--pipeline` and `tkc opt -p`.

Generic cleanups come from xDSL (`canonicalize`, `cse`, `dce`, `licm`); tkc's own passes (layout and swizzle
assignment, pipelining, lowering) register themselves below as they land.
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.passes import ModulePass


def _xdsl_pass(name: str) -> Callable[[], type[ModulePass]]:
    def load() -> type[ModulePass]:
        from xdsl.transforms import get_all_passes

        return get_all_passes()[name]()

    return load


PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "canonicalize": _xdsl_pass("canonicalize"),
    "cse": _xdsl_pass("cse"),
    "dce": _xdsl_pass("dce"),
    "licm": _xdsl_pass("licm"),
}

DESCRIPTIONS: dict[str, str] = {
    "canonicalize": "fold constants and simplify (xDSL)",
    "cse": "eliminate common subexpressions (xDSL)",
    "dce": "remove dead ops (xDSL)",
    "licm": "hoist loop-invariant ops out of loops (xDSL)",
}


def register(name: str, description: str) -> Callable[[type[ModulePass]], type[ModulePass]]:
    """Class decorator: make a tkc pass available under `name`."""

    def add(cls: type[ModulePass]) -> type[ModulePass]:
        PASSES[name] = lambda: cls
        DESCRIPTIONS[name] = description
        return cls

    return add


def _load_tkc_passes() -> None:
    """Import the pass modules so that they register themselves (after `register` exists)."""
    from tkc.passes import (  # noqa: F401
        allocate_shared,
        assign_layouts,
        assign_swizzles,
        defer_wgmma,
        insert_async_pipeline,
        insert_barriers,
        insert_tma_pipeline,
        insert_tma_stores,
        lower_to_ptx,
        overlap_wgmma,
        peel_deferred_step,
        pingpong_warpgroups,
        rotate_tile_loop,
        specialize_warps,
        stagger_warpgroups,
        sum_rows_after_loop,
        unroll_overlapped_loop,
        verify_tma_pipeline,
    )


_load_tkc_passes()
