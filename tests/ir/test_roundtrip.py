"""Every tile type and every op of TILE_OPS prints in its custom syntax and parses back to the same module.

Print → parse → print must give the same text in the custom and in the generic format, and source locations
(FileLineColLoc) must survive when printed with debuginfo. The coverage test fails when an op is added to
TILE_OPS without a case here.
"""

from __future__ import annotations

import math
from io import StringIO

import pytest
from hypothesis import given
from hypothesis import strategies as st
from xdsl.dialects.builtin import FileLineColLoc, IntAttr, ModuleOp, StringAttr, bf16, f16, f32
from xdsl.ir import Attribute
from xdsl.parser import Parser
from xdsl.printer import Printer

from tkc.ir.ops import (
    BINARY_FUNCTIONS,
    BROADCAST_BINARY_OPS,
    MMA_OPS,
    WGMMA_OPS,
    REDUCE_OPS,
    TILE_OPS,
    UNARY_FUNCTIONS,
    VECTOR_REDUCE_OPS,
    FillOp,
)
from tkc.ir.types import DYNAMIC, GlobalType, RegTileType, RegVecType, SharedTileType, SharedVecType
from tkc.ir.dialect import Tile

from .irtext import CTX, function, merged, parse, show, tile_op_names


def assert_round_trip(text: str) -> ModuleOp:
    """Parse `text`; its custom and generic printouts must each parse back to a module that prints the same."""
    module = parse(text)
    module.verify()
    custom = show(module)
    again = parse(custom)
    again.verify()
    assert show(again) == custom
    assert again.is_structurally_equivalent(module)
    generic = show(module, generic=True)
    from_generic = parse(generic)
    from_generic.verify()
    assert show(from_generic, generic=True) == generic
    assert show(from_generic) == custom
    return module


# --------------------------------------------------------------------------------------------------------------
# Types


TYPE_TEXTS = [
    "!tile.rt<16x64xbf16>",
    "!tile.rt<16x64xf16, row>",
    "!tile.rt<64x16xf32, col>",
    "!tile.rv<16xf32>",
    "!tile.rv<16xf32, align>",
    "!tile.rv<64xbf16, ortho>",
    "!tile.rv<32xf16, naive>",
    "!tile.st<64x128xbf16>",
    "!tile.st<64x64xbf16, swizzle 0>",
    "!tile.st<64x64xbf16, swizzle 32>",
    "!tile.st<64x64xf16, swizzle 64>",
    "!tile.st<64x64xf32, swizzle 128>",
    "!tile.sv<64xf32>",
    "!tile.gl<?xf32>",
    "!tile.gl<?x?x?x?xbf16>",
    "!tile.gl<8x?xf16>",
    "!tile.gl<0x4x?xbf16>",
    "!tile.gl<?xi32>",
]


def show_attribute(t: Attribute) -> str:
    out = StringIO()
    Printer(stream=out).print_attribute(t)
    return out.getvalue()


def parse_type(text: str) -> Attribute:
    return Parser(CTX, text).parse_type()


def assert_type_round_trip(t: Attribute) -> None:
    text = show_attribute(t)
    assert text.startswith(f"!{t.name}<")
    assert parse_type(text) == t
    # in a module too: as a function argument and as the result of an op, in both formats
    assert_round_trip(f"func.func @f(%x: {text}) -> {text} {{\n  func.return %x : {text}\n}}\n")


@pytest.mark.parametrize("text", TYPE_TEXTS)
def test_type_text_round_trip(text: str) -> None:
    t = parse_type(text)
    assert show_attribute(t) == text
    assert_type_round_trip(t)


def test_unassigned_layout_and_swizzle_differ_from_assigned_ones() -> None:
    assert RegTileType(f32, 16, 16) != RegTileType(f32, 16, 16, "row")
    assert SharedTileType(bf16, 64, 64) != SharedTileType(bf16, 64, 64, 0)
    assert parse_type("!tile.st<64x64xbf16, swizzle 0>").swizzle == 0
    assert parse_type("!tile.st<64x64xbf16>").swizzle is None
    assert parse_type("!tile.rv<16xf32, ortho>").layout == "ortho"


ELEMENTS = st.sampled_from([bf16, f16, f32])
SIDES = st.integers(1, 16).map(lambda n: 16 * n)
TYPES = st.one_of(
    st.builds(RegTileType, ELEMENTS, SIDES, SIDES, st.sampled_from([None, "row", "col"])),
    st.builds(RegVecType, ELEMENTS, SIDES, st.sampled_from([None, "align", "ortho", "naive"])),
    st.builds(SharedTileType, ELEMENTS, SIDES, SIDES, st.sampled_from([None, 0, 32, 64, 128])),
    st.builds(SharedVecType, ELEMENTS, SIDES),
    st.builds(GlobalType, ELEMENTS, st.lists(st.one_of(st.just(DYNAMIC), st.integers(0, 1 << 20)), min_size=1, max_size=5)),
)


@given(TYPES)
def test_random_type_round_trip(t: Attribute) -> None:
    assert_type_round_trip(t)


# --------------------------------------------------------------------------------------------------------------
# Ops: one or more snippets per op (see irtext.ARGS for the values they use)


def _mma_case(fn: str, dtype: str = "bf16", m: int = 16, n: int = 32, k: int = 64) -> str:
    a = (k, m) if fn.startswith("mma_At") else (m, k)
    b = (n, k) if fn.endswith("Bt") else (k, n)
    ta, tb, tc = f"!tile.rt<{a[0]}x{a[1]}x{dtype}>", f"!tile.rt<{b[0]}x{b[1]}x{dtype}>", f"!tile.rt<{m}x{n}xf32>"
    return f"""
        %a = tile.fill 1.0 : {ta}
        %b = tile.fill 2.0 : {tb}
        %c = tile.fill 0.0 : {tc}
        %d = tile.{fn} %a, %b, %c : {ta}, {tb}, {tc}
    """


def _op_cases() -> dict[str, str]:
    cases = {
        "block_idx": "%x = tile.block_idx x\n%y = tile.block_idx y\n%z = tile.block_idx z {tkc.note = 1 : i64}",
        "num_blocks": "%x = tile.num_blocks x\n%y = tile.num_blocks y {tkc.note}\n%z = tile.num_blocks z",
        "warp_id": "%w = tile.warp_id\n%v = tile.warp_id {tkc.note = \"x\"}",
        "warpgroup_id": "%g = tile.warpgroup_id",
        "cluster_rank": "%r = tile.cluster_rank\n%s = tile.cluster_rank {tkc.note}",
        "dim": "%n = tile.dim %g4[3] : !tile.gl<?x?x?x?xf32>\n%m = tile.dim %gs[0] {tkc.note} : !tile.gl<8x?xbf16>",
        "fill-rt": "%t = tile.fill 1.5 : !tile.rt<16x32xf32>\n%u = tile.fill -inf : !tile.rt<16x32xbf16, col>",
        "fill-rv": "%t = tile.fill inf : !tile.rv<16xf32>\n%u = tile.fill nan {tkc.note} : !tile.rv<16xf32, align>",
        "fill-st": "%t = tile.fill -0.0 : !tile.st<64x64xbf16, swizzle 64>",
        "fill-sv": "%t = tile.fill 1.0e-05 : !tile.sv<64xf16>\n%u = tile.fill -2.5e+20 : !tile.sv<16xf32>",
        "empty": "%s = tile.empty : !tile.st<64x64xbf16>\n%t = tile.empty : !tile.st<16x16xf32, swizzle 0>\n"
                 "%v = tile.empty {tkc.note} : !tile.sv<64xbf16>",
        "convert": "%a = tile.convert %rt : !tile.rt<16x32xf32> -> !tile.rt<16x32xbf16>\n"
                   "%b = tile.convert %rva : !tile.rv<16xf32, align> -> !tile.rv<16xf16, align>",
        "relayout": "%a = tile.relayout %rtr : !tile.rt<16x32xf32, row> -> !tile.rt<16x32xf32, col>\n"
                    "%b = tile.relayout %rv : !tile.rv<16xf32> -> !tile.rv<16xf32, naive>",
        "transpose": "%a = tile.transpose %rtb : !tile.rt<16x32xbf16> -> !tile.rt<32x16xbf16>\n"
                     "%b = tile.transpose %rtr : !tile.rt<16x32xf32, row> -> !tile.rt<32x16xf32, col>",
        "keep_cols": "%a = tile.keep_cols %rt, %i fill -inf : !tile.rt<16x32xf32>",
        "keep_rows": "%a = tile.keep_rows %rt, %i fill 0.0 : !tile.rt<16x32xf32>",
        "rotate_pairs": "%a = tile.rotate_pairs %rt : !tile.rt<16x32xf32>\n"
                        "%b = tile.rotate_pairs %rtr {tkc.note} : !tile.rt<16x32xf32, row>",
        "load-gl-rt-repeat": ("%a = tile.load %g2[%i, %i] {tile.repeat_cols = 2 : i64} : !tile.gl<?x?xbf16> -> "
                              "!tile.rt<16x64xf32>"),
        "tril": "%a = tile.tril %rt, %i fill -inf : !tile.rt<16x32xf32>\n"
                "%b = tile.tril %rtr, %i fill 1.0e-30 {tkc.note} : !tile.rt<16x32xf32, row>",
        "triu": "%a = tile.triu %rt, %i fill 0.0 : !tile.rt<16x32xf32>\n%b = tile.triu %rtb, %i fill nan : !tile.rt<16x32xbf16>",
        "broadcast_row": "%a = tile.broadcast_row %rv : !tile.rv<16xf32> -> !tile.rt<16x64xf32>",
        "broadcast_col": "%a = tile.broadcast_col %rva : !tile.rv<16xf32, align> -> !tile.rt<32x16xf32, col>",
        "load-gl-rt": "%a = tile.load %g4[%i, %i, %i, %i] : !tile.gl<?x?x?x?xf32> -> !tile.rt<16x64xbf16>",
        "load-gl-st": "%a = tile.load %g2[%i, %i] : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16, swizzle 128>",
        "load-gl-st-multicast": "%a = tile.load %g2[%i, %i] {tkc.multicast} : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>",
        "load-gl-st-multicast-group": ("%a = tile.load %g2[%i, %i] {tkc.multicast = [2 : i64, 2 : i64]} : "
                                       "!tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>"),
        "load-gl-st-rows": "%a = tile.load %g2[%i, %i] {tile.index_in_rows} : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>",
        "load-gl-rv": "%a = tile.load %g2[%i, %i] : !tile.gl<?x?xbf16> -> !tile.rv<64xf32>",
        "load-gl-sv": "%a = tile.load %g1[%i] {tkc.note} : !tile.gl<?xf16> -> !tile.sv<64xf16>",
        "load-st-rt": "%a = tile.load %sts[%i, %i] : !tile.st<64x64xbf16, swizzle 128> -> !tile.rt<16x64xf32, row>",
        "load-sv-rv": "%a = tile.load %sv[%i] : !tile.sv<64xbf16> -> !tile.rv<16xbf16>",
        "store-rt": "tile.store %rt, %g4[%i, %i, %i, %i] : !tile.rt<16x32xf32> -> !tile.gl<?x?x?x?xf32>",
        "store-rt-rows": "tile.store %rt, %g4[%i, %i, %i, %i] {tile.index_in_rows} : !tile.rt<16x32xf32> -> !tile.gl<?x?x?x?xf32>",
        "store-st": "tile.store %st, %gs[%i, %i] : !tile.st<64x64xbf16> -> !tile.gl<8x?xbf16>",
        "store-rv": "tile.store %rva, %g2[%i, %i] {tkc.note} : !tile.rv<16xf32, align> -> !tile.gl<?x?xbf16>",
        "store-sv": "tile.store %sv, %g2[%i, %i] : !tile.sv<64xbf16> -> !tile.gl<?x?xbf16>",
        "atomic-add": "tile.atomic_add %rt, %g4[%i, %i, %i, %i] : !tile.rt<16x32xf32> -> !tile.gl<?x?x?x?xf32>",
        "insert-rt": "%a = tile.insert %rt, %st[%i, %i] : !tile.rt<16x32xf32> -> !tile.st<64x64xbf16>",
        "insert-rv": "%a = tile.insert %rv, %sv[%i] : !tile.rv<16xf32> -> !tile.sv<64xbf16>",
        "barrier": "tile.barrier\ntile.barrier {tkc.note}",
        "read": "%e = tile.read %gc[%i] : !tile.gl<?xi32>\n%e2 = tile.read %gc[%e] {tkc.note} : !tile.gl<?xi32>",
        "arrive_last": "%l = tile.arrive_last %gc[%i], %i : !tile.gl<?xi32>\n"
                       "%m = tile.arrive_last %gc[%i], %i {tkc.note} : !tile.gl<?xi32>",
        "cluster_sync": "tile.cluster_sync\ntile.cluster_sync {tkc.note}",
        "cluster_load": "%s = tile.empty : !tile.st<32x64xf32>\ntile.cluster_sync\n"
                        "%a = tile.cluster_load %s[%i, %i] from %i : !tile.st<32x64xf32> -> !tile.rt<32x16xf32>",
        "turn_wait": "tile.turn_wait\ntile.turn_wait {tkc.note}",
        "turn_pass": "tile.turn_pass\ntile.turn_pass {tkc.note}",
        "ring_alloc": "%r = tile.ring_alloc : !tile.ring<3, !tile.st<64x64xbf16>>\n"
                      "%q = tile.ring_alloc {tkc.note} : !tile.ring<2, !tile.sv<64xf16>>",
        "copy_async": "%r = tile.ring_alloc : !tile.ring<3, !tile.st<64x64xbf16, swizzle 128>>\n"
                      "tile.copy_async %g2[%i, %i], %r[%i] : !tile.gl<?x?xbf16> -> !tile.ring<3, !tile.st<64x64xbf16, swizzle 128>>",
        "commit_group": "tile.commit_group\ntile.commit_group {tkc.note}",
        "wait_group": "tile.wait_group 0\ntile.wait_group 2 {tkc.note}",
        "wgmma_wait": "tile.wgmma_wait 0\ntile.wgmma_wait 1 {tkc.note}",
        "ring_read": "%r = tile.ring_alloc : !tile.ring<3, !tile.st<64x64xbf16>>\n"
                     "%s = tile.ring_read %r[%i] : !tile.ring<3, !tile.st<64x64xbf16>> -> !tile.st<64x64xbf16>",
        "stage_barriers": "%b = tile.stage_barriers : !tile.stage_barriers<3, 128>\n"
                          "%c = tile.stage_barriers {tkc.note} : !tile.stage_barriers<2, 256>",
        "tma": "%r = tile.ring_alloc : !tile.ring<3, !tile.st<64x64xbf16, swizzle 128>>\n"
               "%b = tile.stage_barriers : !tile.stage_barriers<3, 128>\n"
               "tile.stage_acquire %b[%i] : !tile.stage_barriers<3, 128>\n"
               "tile.stage_expect %b[%i], 8192 : i64 : !tile.stage_barriers<3, 128>\n"
               "tile.tma_load %g2[%i, %i], %r, %b[%i] : !tile.gl<?x?xbf16> -> "
               "!tile.ring<3, !tile.st<64x64xbf16, swizzle 128>>, !tile.stage_barriers<3, 128>\n"
               "tile.stage_wait %b[%i] {tkc.note} : !tile.stage_barriers<3, 128>\n"
               "tile.stage_release %b[%i] : !tile.stage_barriers<3, 128>",
        "stage_copy": "%r = tile.ring_alloc : !tile.ring<3, !tile.st<64x64xbf16, swizzle 128>>\n"
                      "%b = tile.stage_barriers : !tile.stage_barriers<3, 128>\n"
                      "tile.stage_copy %g2[%i, %i] rows_at %gc : !tile.gl<?xi32> rows_end %i, %r, %b[%i] "
                      "{tile.index_in_rows} : !tile.gl<?x?xbf16> -> !tile.ring<3, !tile.st<64x64xbf16, swizzle 128>>, "
                      "!tile.stage_barriers<3, 128>\n"
                      "tile.stage_copy %g2[%i, %i], %r, %b[%i] : !tile.gl<?x?xbf16> -> "
                      "!tile.ring<3, !tile.st<64x64xbf16, swizzle 128>>, !tile.stage_barriers<3, 128>",
        "tma-cluster": "%r = tile.ring_alloc : !tile.ring<3, !tile.st<64x64xbf16, swizzle 128>>\n"
                       "%b = tile.stage_barriers : !tile.stage_barriers<3, 128, 2>\n"
                       "tile.tma_load %g2[%i, %i], %r, %b[%i] {tkc.multicast} : !tile.gl<?x?xbf16> -> "
                       "!tile.ring<3, !tile.st<64x64xbf16, swizzle 128>>, !tile.stage_barriers<3, 128, 2>",
    }
    for fn in UNARY_FUNCTIONS:
        cases[f"unary-{fn}"] = (
            f"%a = tile.{fn} %rt : !tile.rt<16x32xf32>\n%b = tile.{fn} %rtr : !tile.rt<16x32xf32, row>\n"
            f"%c = tile.{fn} %rv : !tile.rv<16xf32>\n%d = tile.{fn} %rva {{tkc.note}} : !tile.rv<16xf32, align>"
        )
    for fn in BINARY_FUNCTIONS:
        cases[f"binary-{fn}"] = (
            f"%a = tile.{fn} %rt, %rt : !tile.rt<16x32xf32>\n%b = tile.{fn} %rt, %f : !tile.rt<16x32xf32>, f32\n"
            f"%c = tile.{fn} %f, %rtr : f32, !tile.rt<16x32xf32, row>\n%d = tile.{fn} %rv, %rv {{tkc.note}} : !tile.rv<16xf32>\n"
            f"%e = tile.{fn} %rtb, %rtb : !tile.rt<16x32xbf16>"
        )
    for fn, axis in BROADCAST_BINARY_OPS:
        vec = "%rv : !tile.rv<16xf32>" if axis == "row" else "%rvc : !tile.rv<32xf32>"
        name, vtype = vec.split(" : ")
        cases[f"broadcast-{fn}_{axis}"] = f"%a = tile.{fn}_{axis} %rt, {name} : !tile.rt<16x32xf32>, {vtype}"
    for fn, axis in REDUCE_OPS:
        vec, vtype = ("%rv", "!tile.rv<16xf32>") if axis == "row" else ("%rvc", "!tile.rv<32xf32>")
        cases[f"reduce-{axis}_{fn}"] = (
            f"%a = tile.{axis}_{fn} %rt : !tile.rt<16x32xf32> -> {vtype}\n"
            f"%b = tile.{axis}_{fn} %rt, {vec} {{tkc.note}} : !tile.rt<16x32xf32> -> {vtype}"
        )
    for fn in VECTOR_REDUCE_OPS:
        cases[f"vec-{fn}"] = f"%a = tile.vec_{fn} %rv : !tile.rv<16xf32>\n%b = tile.vec_{fn} %rva : !tile.rv<16xf32, align>"
    cases["finish-row-sum"] = ("%a = tile.row_sum %rt {tkc.partial} : !tile.rt<16x32xf32> -> !tile.rv<16xf32>\n"
                               "%b = tile.finish_row_sum %a : !tile.rv<16xf32>")
    for fn in MMA_OPS:
        cases[f"{fn}-bf16"] = _mma_case(fn)
        cases[f"{fn}-f16"] = _mma_case(fn, "f16", 32, 16, 16)
    for fn in WGMMA_OPS:
        b = "!tile.st<128x64xbf16, swizzle 128>" if fn.endswith("Bt") else "!tile.st<64x128xbf16, swizzle 128>"
        cases[fn] = (f"%a = tile.empty : !tile.st<64x64xbf16, swizzle 128>\n%b = tile.empty : {b}\n"
                     f"%c = tile.fill 0.0 : !tile.rt<16x128xf32>\n"
                     f"%d = tile.{fn} %a, %b, %c : !tile.st<64x64xbf16, swizzle 128>, {b}, !tile.rt<16x128xf32>")
    return cases


OP_CASES = _op_cases()


@pytest.mark.parametrize("case", list(OP_CASES))
def test_op_round_trip(case: str) -> None:
    module = assert_round_trip(function(OP_CASES[case]))
    custom = show(module)
    assert '"tile.' not in custom, f"some op of {case} printed in the generic format:\n{custom}"


def test_every_tile_op_has_a_round_trip_case() -> None:
    exercised: set[str] = set()
    for text in OP_CASES.values():
        exercised |= tile_op_names(parse(function(text)))
    defined = {op.name for op in Tile.operations}
    assert not defined - exercised, f"ops without a round-trip case: {sorted(defined - exercised)}"
    assert exercised == defined


def test_whole_module_round_trip() -> None:
    """All cases as the functions of one module, with the module's and functions' attributes."""
    funcs = function(merged(list(OP_CASES.values())), "all") + function("%x = tile.warp_id", "other")
    assert_round_trip(f'builtin.module attributes {{tkc.target = "sm_90a"}} {{\n{funcs}}}\n')


FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-5, 1e20, 5e-324, 1.7976931348623157e308, 0.1, 1 / 3]),
)


@given(FLOATS)
def test_fill_value_round_trips_exactly(value: float) -> None:
    module = ModuleOp([FillOp(value, RegTileType(f32, 16, 16))])
    for generic in (False, True):
        text = show(module, generic=generic)
        back = parse(text).body.block.first_op
        assert isinstance(back, FillOp)
        if math.isnan(value):
            assert math.isnan(back.fill_value)
        else:
            assert back.fill_value == value and math.copysign(1, back.fill_value) == math.copysign(1, value)
        assert show(parse(text), generic=generic) == text


@given(
    fn=st.sampled_from(list(MMA_OPS)),
    dtype=st.sampled_from(["bf16", "f16"]),
    m=SIDES,
    n=SIDES,
    k=SIDES,
)
def test_random_mma_shapes_round_trip(fn: str, dtype: str, m: int, n: int, k: int) -> None:
    assert_round_trip(function(_mma_case(fn, dtype, m, n, k)))


# --------------------------------------------------------------------------------------------------------------
# Source locations


def _locate(module: ModuleOp) -> list[Attribute]:
    """Give every op and block argument a distinct FileLineColLoc; return them in walk order."""
    locs: list[Attribute] = []
    for n, op in enumerate(module.walk()):
        op.location = FileLineColLoc(StringAttr("kernels/k.py"), IntAttr(n + 1), IntAttr(n % 9 + 1))
        locs.append(op.location)
        for region in op.regions:
            for block in region.blocks:
                for a, arg in enumerate(block.args):
                    arg.location = FileLineColLoc(StringAttr("kernels/args.py"), IntAttr(n + 1), IntAttr(a + 1))
                    locs.append(arg.location)
    return locs


def _locations(module: ModuleOp) -> list[Attribute]:
    locs: list[Attribute] = []
    for op in module.walk():
        locs.append(op.location)
        for region in op.regions:
            for block in region.blocks:
                locs.extend(arg.location for arg in block.args)
    return locs


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_locations_survive_round_trip(generic: bool) -> None:
    module = parse(function(merged(list(OP_CASES.values()))))
    locs = _locate(module)
    text = show(module, generic=generic, debuginfo=True)
    assert text.count('loc("kernels/k.py":') == sum(1 for _ in module.walk())
    back = parse(text)
    back.verify()
    assert _locations(back) == locs
    assert show(back, generic=generic, debuginfo=True) == text


def test_frontend_locations_survive_round_trip() -> None:
    from tkc.kernels import attention_fwd

    module = attention_fwd.build(CAUSAL=1)
    text = show(module, debuginfo=True)
    locs = _locations(module)
    assert any(isinstance(loc, FileLineColLoc) and loc.filename.data.endswith("attention.py") for loc in locs)
    back = parse(text)
    back.verify()
    assert _locations(back) == locs
    assert show(back, debuginfo=True) == text
    assert show(parse(show(module, generic=True, debuginfo=True))) == show(module)
