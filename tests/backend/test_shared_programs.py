"""Random programs over shared vectors: the lowered code (simulated per thread, shared memory as bytes) gives the
tile interpreter's answer.

The interpreter treats a shared tile as a value and a store into it as a new value; the GPU updates one buffer in
place, and the passes decide which values share a buffer. Programs made of several alike buffers (empty, zeros,
loaded from the same place), written and read in random orders, straight or in a loop, are where those two views
could part (CSE once merged alike allocations into one buffer)."""

from __future__ import annotations

import importlib.util
import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_simulate import run_both

MAKERS = {"empty": "empty(sv[f32, 32])", "zeros": "zeros(sv[f32, 32])", "load": "load(X, (0,), sv[f32, 32])"}
_counter = itertools.count()


@st.composite
def programs(draw: st.DrawFn) -> tuple[list[str], list[tuple]]:
    kind = st.sampled_from(sorted(MAKERS))
    alike = st.tuples(kind, st.integers(2, 3)).map(lambda kn: [kn[0]] * kn[1])  # the buffers most at risk
    kinds = draw(st.one_of(alike, st.lists(kind, min_size=2, max_size=3)))
    steps = draw(st.lists(st.tuples(st.sampled_from(["write", "read"]), st.integers(0, len(kinds) - 1),
                                    st.integers(1, 4)), min_size=1, max_size=8))
    return kinds, steps, draw(st.integers(0, 3))


def kernel_source(name: str, kinds: list[str], steps: list[tuple], loop: int) -> str:
    """A kernel of two warps: buffer i made by kinds[i]; ("write", i, c) stores c·X into all of buffer i (each warp
    its half), ("read", i, _) copies buffer i to the next row of Out. An empty buffer is written before it is read.
    With loop > 0 the steps run `loop` times in a loop (the buffers carried from one iteration to the next)."""
    lines = ["import tkc", "from tkc.lang import *", "", "", '@tkc.kernel(warps=2, min_target="sm_80")',
             f"def {name}(X: gl[f32, 1], Out: gl[f32, 2]):"]
    lines += [f"    b{i} = {MAKERS[kind]}" for i, kind in enumerate(kinds)]
    reads = sum(what == "read" for what, _, _ in steps)
    pad = "    "
    if loop:
        lines.append(f"    for it in range({loop}):")
        pad = "        "
    written = {i for i, kind in enumerate(kinds) if kind != "empty"}
    row = 0
    for what, i, scale in steps:
        if what == "write" or i not in written:
            lines.append(f"{pad}b{i} = store(b{i}, load(X, (warp_id(),), rv[f32, 16]) * {float(scale)}, (warp_id(),))")
            written.add(i)
        if what == "read":
            at = f"it * {reads} + {row}" if loop else f"{row}"
            lines.append(f"{pad}store(Out, load(b{i}, (0,), rv[f32, 32]), ({at}, 0))")
            row += 1
    return "\n".join(lines) + "\n"


def load_kernel(tmp_path, source: str, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


@given(program=programs(), seed=st.integers(0, 2**31))
@settings(max_examples=60, deadline=None)
def test_shared_programs_lower_to_what_they_mean(tmp_path_factory, program, seed: int) -> None:
    kinds, steps, loop = program
    name = f"shared_program_{next(_counter)}"
    kernel = load_kernel(tmp_path_factory.mktemp("programs"), kernel_source(name, kinds, steps, loop), name)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(32).astype(np.float32)
    rows = max(1, sum(what == "read" for what, _, _ in steps) * max(loop, 1))
    interp, sim = run_both(kernel, [x, np.full((rows, 32), np.nan, np.float32)], (1,), order="shuffled")
    np.testing.assert_array_equal(sim[1], interp[1])
