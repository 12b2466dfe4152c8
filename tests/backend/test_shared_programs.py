"""Random programs over shared vectors: the lowered code (simulated per thread, shared memory as bytes) gives the
tile interpreter's answer.

The interpreter treats a shared tile as a value and a store into it as a new value; the GPU updates one buffer in
place, and the passes decide which values share a buffer. Programs made of several alike buffers (empty, zeros,
loaded from the same place), written and read in random orders, straight or in a loop, are where those two views
could part (CSE once merged alike allocations into one buffer)."""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import random_bf16
from test_simulate import run_both

@dataclass(frozen=True)
class Form:
    """How a program's buffers look: their makers, a write (c·X into all of it, each warp its half) and a read (a
    warp's half to the next rows of Out; the tile form reads the other warp's half, so a missing barrier shows)."""

    params: str
    makers: dict[str, str]
    write: str  # {b}: the buffer, {c}: the scale
    read: str  # {b}, {at}: which read this is
    x: Callable[[np.random.Generator], np.ndarray]
    out_rows_per_read: int
    out_cols: int


VECTOR = Form(
    "X: gl[f32, 1], Out: gl[f32, 2]",
    {"empty": "empty(sv[f32, 32])", "zeros": "zeros(sv[f32, 32])", "load": "load(X, (0,), sv[f32, 32])"},
    "{b} = store({b}, load(X, (warp_id(),), rv[f32, 16]) * {c}, (warp_id(),))",
    "store(Out, load({b}, (0,), rv[f32, 32]), ({at}, 0))",
    lambda rng: rng.standard_normal(32).astype(np.float32), 1, 32)
TILE = Form(
    "X: gl[bf16, 2], Out: gl[f32, 2]",
    {"empty": "empty(st[bf16, 32, 64])", "zeros": "zeros(st[bf16, 32, 64])", "load": "load(X, (0, 0), st[bf16, 32, 64])"},
    "{b} = store({b}, load(X, (warp_id(), 0), rt[f32, 16, 64]) * {c}, (warp_id(), 0))",
    "store(Out, load({b}, (1 - warp_id(), 0), rt[f32, 16, 64]), (({at}) * 2 + warp_id(), 0))",
    lambda rng: random_bf16(rng, 32, 64), 32, 64)
KINDS = ["empty", "load", "zeros"]
_counter = itertools.count()


@st.composite
def programs(draw: st.DrawFn) -> tuple[list[str], list[tuple], int]:
    kind = st.sampled_from(KINDS)
    alike = st.tuples(kind, st.integers(2, 3)).map(lambda kn: [kn[0]] * kn[1])  # the buffers most at risk
    kinds = draw(st.one_of(alike, st.lists(kind, min_size=2, max_size=3)))
    steps = draw(st.lists(st.tuples(st.sampled_from(["write", "read"]), st.integers(0, len(kinds) - 1),
                                    st.integers(1, 4)), min_size=1, max_size=8))
    return kinds, steps, draw(st.integers(0, 3))


def kernel_source(name: str, form: Form, kinds: list[str], steps: list[tuple], loop: int) -> str:
    """A kernel of two warps: buffer i made by kinds[i]; ("write", i, c) writes c·X into buffer i, ("read", i, _)
    copies buffer i out. An empty buffer is written before it is read. With loop > 0 the steps run `loop` times in
    a loop (the buffers carried from one iteration to the next)."""
    lines = ["import tkc", "from tkc.lang import *", "", "", '@tkc.kernel(warps=2, min_target="sm_80")',
             f"def {name}({form.params}):"]
    lines += [f"    b{i} = {form.makers[kind]}" for i, kind in enumerate(kinds)]
    reads = sum(what == "read" for what, _, _ in steps)
    pad = "    "
    if loop:
        lines.append(f"    for it in range({loop}):")
        pad = "        "
    written = {i for i, kind in enumerate(kinds) if kind != "empty"}
    row = 0
    for what, i, scale in steps:
        if what == "write" or i not in written:
            lines.append(pad + form.write.format(b=f"b{i}", c=float(scale)))
            written.add(i)
        if what == "read":
            lines.append(pad + form.read.format(b=f"b{i}", at=f"it * {reads} + {row}" if loop else f"{row}"))
            row += 1
    return "\n".join(lines) + "\n"


def load_kernel(tmp_path, source: str, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def check(tmp_path_factory, form: Form, program, seed: int) -> None:
    kinds, steps, loop = program
    name = f"shared_program_{next(_counter)}"
    kernel = load_kernel(tmp_path_factory.mktemp("programs"), kernel_source(name, form, kinds, steps, loop), name)
    rng = np.random.default_rng(seed)
    reads = max(1, sum(what == "read" for what, _, _ in steps) * max(loop, 1))
    out = np.full((reads * form.out_rows_per_read, form.out_cols), np.nan, np.float32)
    interp, sim = run_both(kernel, [form.x(rng), out], (1,), order="shuffled")
    np.testing.assert_array_equal(sim[1], interp[1])


@given(program=programs(), seed=st.integers(0, 2**31))
@settings(max_examples=60, deadline=None)
def test_shared_vector_programs(tmp_path_factory, program, seed: int) -> None:
    check(tmp_path_factory, VECTOR, program, seed)


@given(program=programs(), seed=st.integers(0, 2**31))
@settings(max_examples=30, deadline=None)
def test_shared_tile_programs(tmp_path_factory, program, seed: int) -> None:
    """The same over bf16 shared tiles written from and read into register tiles (swizzled, ldmatrix)."""
    check(tmp_path_factory, TILE, program, seed)


def test_merged_buffers_are_caught(tmp_path_factory, monkeypatch) -> None:
    """The oracle can fail: with shared fills pure again (so CSE merges two alike into one buffer), a two-buffer
    program's simulation disagrees with the interpreter."""
    from tkc.ir import ops

    program = (["zeros", "zeros"], [("write", 0, 1), ("write", 1, 2), ("read", 0, 1), ("read", 1, 1)], 0)
    check(tmp_path_factory, TILE, program, 0)  # right as it is
    monkeypatch.setattr(ops._AllocatesWhenShared, "get_effects", classmethod(lambda cls, op: frozenset()))
    with pytest.raises(AssertionError):
        check(tmp_path_factory, TILE, program, 0)
