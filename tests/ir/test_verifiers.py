"""Textual tile IR that must be rejected, with the message a kernel author reads.

Each case is (op or type it targets, IR snippet, a substring of the message). Types are checked while parsing
(a parse error that points at the type); ops when the module is verified. `test_every_verifier_has_a_case` fails
when an op with its own verifier has no rejection case here.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
from xdsl.utils.exceptions import ParseError, VerifyException

from tkc.ir.ops import BINARY_FUNCTIONS, BROADCAST_BINARY_OPS, MMA_OPS, REDUCE_OPS, TILE_OPS

from .irtext import function, parse


class Bad(NamedTuple):
    target: str  # the op name (`tile.mma_AB`) or type (`!tile.rt`) whose verifier or parser rejects it
    body: str  # ops over irtext.ARGS
    message: str


def rejection(body: str) -> tuple[type[Exception], str]:
    """Parse and verify `body`; return the kind of error and its message."""
    with pytest.raises((ParseError, VerifyException)) as info:
        parse(function(body)).verify()
    return info.type, str(info.value)


def fill(type_: str, name: str = "%w") -> str:
    return f"{name} = tile.fill 0.0 : {type_}\n"


# --------------------------------------------------------------------------------------------------------------
# Types: rejected while parsing


BAD_TYPES = [
    Bad("!tile.rt", fill("!tile.rt<16x8xf32>"), "rt dimensions must be positive multiples of 16, got 16x8"),
    Bad("!tile.rt", fill("!tile.rt<0x16xf32>"), "rt dimensions must be positive multiples of 16, got 0x16"),
    Bad("!tile.rt", fill("!tile.rt<16x32xi32>"), "rt element type must be bf16, f16, f32, fp8e4m3 or fp8e5m2, got i32"),
    Bad("!tile.rt", fill("!tile.rt<16xf32>"), "rt expects 2 dimension(s), got 1"),
    Bad("!tile.rt", fill("!tile.rt<16x?xf32>"), "rt dimensions must be static"),
    Bad("!tile.rt", fill("!tile.rt<16x16xf32, align>"), "rt layout must be row, col or linear, got align"),
    Bad("!tile.rt", fill("!tile.rt<16x16xf32, linear>"), "a linear-layout rt has a multiple of 32 columns, got 16"),
    Bad("!tile.rt", fill("!tile.rt<16x16xf32, diagonal>"), "Expected `row`, `col`, `linear`, `align`, `ortho`, or `naive`"),
    Bad("!tile.rt", fill("!tile.rt<16x16xf32, row"), "'>' expected"),
    Bad("!tile.rv", fill("!tile.rv<24xf32>"), "rv dimensions must be positive multiples of 16, got 24"),
    Bad("!tile.rv", fill("!tile.rv<16x16xf32>"), "rv expects 1 dimension(s), got 2"),
    Bad("!tile.rv", fill("!tile.rv<16xf64>"), "rv element type must be bf16, f16, f32, fp8e4m3 or fp8e5m2, got f64"),
    Bad("!tile.rv", fill("!tile.rv<16xf32, row>"), "rv layout must be align, ortho or naive, got row"),
    Bad("!tile.rv", fill("!tile.rv<16xf32, diagonal>"), "Expected `row`, `col`, `linear`, `align`, `ortho`, or `naive`"),
    Bad("!tile.st", "%w = tile.empty : !tile.st<24x64xbf16>", "st dimensions must be positive multiples of 16, got 24x64"),
    Bad("!tile.st", "%w = tile.empty : !tile.st<64x64xi8>", "st element type must be bf16, f16, f32, fp8e4m3 or fp8e5m2, got i8"),
    Bad("!tile.st", "%w = tile.empty : !tile.st<64x?xbf16>", "st dimensions must be static"),
    Bad("!tile.st", "%w = tile.empty : !tile.st<64x64xbf16, swizzle 48>", "st swizzle must be one of (0, 32, 64, 128) bytes, got 48"),
    Bad("!tile.st", "%w = tile.empty : !tile.st<64x64xbf16, swizzle 256>", "st swizzle must be one of (0, 32, 64, 128) bytes, got 256"),
    Bad("!tile.st", "%w = tile.empty : !tile.st<64x64xbf16, swizle 32>", "Expected 'swizzle'"),
    Bad("!tile.st", "%w = tile.empty : !tile.st<64x64xbf16, row>", "Expected 'swizzle'"),
    Bad("!tile.st", "%w = tile.empty : !tile.st<64x64xbf16, swizzle -32>", "Expected integer literal"),
    Bad("!tile.sv", "%w = tile.empty : !tile.sv<8xf32>", "sv dimensions must be positive multiples of 16, got 8"),
    Bad("!tile.sv", "%w = tile.empty : !tile.sv<64xbf16, swizzle 32>", "'>' expected"),
    Bad("!tile.gl", "%n = tile.dim %x[0] : !tile.gl<f32>", "gl must have rank 1 or more"),
    Bad("!tile.gl", "%n = tile.dim %x[0] : !tile.gl<?x?xi16>",
        "gl element type must be bf16, f16, f32, fp8e4m3, fp8e5m2, i32 or i64, got i16"),
]


@pytest.mark.parametrize("case", BAD_TYPES, ids=lambda c: f"{c.target}:{c.message[:40]}")
def test_bad_type_is_a_parse_error(case: Bad) -> None:
    kind, message = rejection(case.body)
    assert kind is ParseError  # not a VerifyException escaping the parser without a position
    assert case.message in message


def test_type_error_points_at_the_type() -> None:
    kind, message = rejection(fill("!tile.rt<16x8xf32>"))
    caret_line = next(line for line in message.splitlines() if "^" in line)
    assert caret_line.strip() == "^" * len("<16x8xf32>")


# --------------------------------------------------------------------------------------------------------------
# Ops: rejected by their verifiers (or, where a custom parser can tell, while parsing)

MMA = "!tile.rt<{}x{}x{}>"


def _mma(fn: str, a: tuple, b: tuple, c: tuple) -> str:
    ta, tb, tc = MMA.format(*a), MMA.format(*b), MMA.format(*c)
    return f"{fill(ta, '%a')}{fill(tb, '%b')}{fill(tc, '%c')}%d = tile.{fn} %a, %b, %c : {ta}, {tb}, {tc}"


def _mma_cases() -> list[Bad]:
    cases = []
    for fn in MMA_OPS:
        ta, tb = fn.startswith("mma_At"), fn.endswith("Bt")
        a = (64, 16) if ta else (16, 64)  # M = 16, K = 64
        b_bad = (32, 48) if tb else (48, 32)  # K = 48, N = 32
        b = (32, 64) if tb else (64, 32)
        a_form, b_form = ("Aᵀ" if ta else "A"), ("Bᵀ" if tb else "B")
        cases += [
            Bad(f"tile.{fn}", _mma(fn, (*a, "bf16"), (*b_bad, "bf16"), (16, 32, "f32")),
                f"{fn}: K mismatch: A is rt[bf16, {a[0]}, {a[1]}], so K = 64, but B is rt[bf16, {b_bad[0]}, {b_bad[1]}], so K = 48"),
            Bad(f"tile.{fn}", _mma(fn, (*a, "bf16"), (*b, "bf16"), (16, 32, "bf16")),
                f"{fn}: the accumulator must be an f32 tile, got rt[bf16, 16, 32]"),
            Bad(f"tile.{fn}", _mma(fn, (*a, "bf16"), (*b, "bf16"), (32, 16, "f32")),
                f"{fn}: shape mismatch: {a_form}·{b_form} is 16x32 but the accumulator is rt[f32, 32, 16]; it must be rt[f32, 16, 32]"),
            Bad(f"tile.{fn}", _mma(fn, (*a, "bf16"), (*b, "f16"), (16, 32, "f32")),
                f"{fn}: dtype mismatch: A is rt[bf16, {a[0]}, {a[1]}] but B is rt[f16, {b[0]}, {b[1]}]"),
            Bad(f"tile.{fn}", _mma(fn, (*a, "f32"), (*b, "f32"), (16, 32, "f32")),
                f"{fn}: A and B must be bf16 or f16 tiles, got rt[f32, {a[0]}, {a[1]}] (convert with .to(bf16))"),
        ]
    return cases


def _elementwise_cases() -> list[Bad]:
    cases = []
    for fn in BINARY_FUNCTIONS:
        cases += [
            Bad(f"tile.{fn}", f"%x = tile.{fn} %rt, %rv : !tile.rt<16x32xf32>, !tile.rv<16xf32>",
                f"{fn}: operands differ: rt[f32, 16, 32] and rv[f32, 16]"),
            Bad(f"tile.{fn}", f"%x = tile.{fn} %rt, %rtb : !tile.rt<16x32xf32>, !tile.rt<16x32xbf16>",
                f"{fn}: operands differ: rt[f32, 16, 32] and rt[bf16, 16, 32]"),
            Bad(f"tile.{fn}", f"%x = tile.{fn} %rt, %rtr : !tile.rt<16x32xf32>, !tile.rt<16x32xf32, row>",
                f"{fn}: operands differ: rt[f32, 16, 32] and rt[f32, 16, 32] (row layout)"),
            Bad(f"tile.{fn}", f"%x = tile.{fn} %f, %f : f32, f32",
                f"{fn}: one operand must be a register tile or vector (use arith for scalars)"),
            Bad(f"tile.{fn}", f'%x = "tile.{fn}"(%rt, %f) : (!tile.rt<16x32xf32>, f32) -> !tile.rt<16x32xbf16>',
                f"{fn}: result must be rt[f32, 16, 32]"),
        ]
    for fn, axis in BROADCAST_BINARY_OPS:
        want, what, wrong = (16, "rows", 32) if axis == "row" else (32, "columns", 16)
        cases += [
            Bad(f"tile.{fn}_{axis}", f"{fill(f'!tile.rv<{wrong}xf32>')}%x = tile.{fn}_{axis} %rt, %w : !tile.rt<16x32xf32>, !tile.rv<{wrong}xf32>",
                f"{fn}_{axis}: rt[f32, 16, 32] has {want} {what} but the vector is rv[f32, {wrong}]"),
            Bad(f"tile.{fn}_{axis}", f"{fill(f'!tile.rv<{want}xbf16>')}%x = tile.{fn}_{axis} %rt, %w : !tile.rt<16x32xf32>, !tile.rv<{want}xbf16>",
                f"{fn}_{axis}: dtype mismatch: rt[f32, 16, 32] with rv[bf16, {want}]"),
        ]
    for axis in ("row", "col"):
        want, what, wrong = (16, "rows", 32) if axis == "row" else (32, "columns", 16)
        cases += [
            Bad(f"tile.broadcast_{axis}", f"{fill(f'!tile.rv<{wrong}xf32>')}%x = tile.broadcast_{axis} %w : !tile.rv<{wrong}xf32> -> !tile.rt<16x32xf32>",
                f"broadcast_{axis}: rt[f32, 16, 32] has {want} {what} but the vector is rv[f32, {wrong}]"),
            Bad(f"tile.broadcast_{axis}", f"{fill(f'!tile.rv<{want}xf16>')}%x = tile.broadcast_{axis} %w : !tile.rv<{want}xf16> -> !tile.rt<16x32xf32>",
                f"broadcast_{axis}: dtype mismatch: rt[f32, 16, 32] with rv[f16, {want}]"),
        ]
    for fn, axis in REDUCE_OPS:
        want, what, wrong = (16, "rows", 32) if axis == "row" else (32, "columns", 16)
        cases += [
            Bad(f"tile.{axis}_{fn}", f"%x = tile.{axis}_{fn} %rt : !tile.rt<16x32xf32> -> !tile.rv<{wrong}xf32>",
                f"{axis}_{fn}: rt[f32, 16, 32] has {want} {what} but the vector is rv[f32, {wrong}]"),
            Bad(f"tile.{axis}_{fn}", f"{fill(f'!tile.rv<{want}xbf16>')}%x = tile.{axis}_{fn} %rt, %w : !tile.rt<16x32xf32> -> !tile.rv<{want}xbf16>",
                f"{axis}_{fn}: dtype mismatch: rt[f32, 16, 32] with rv[bf16, {want}]"),
        ]
    return cases


OTHER_CASES = [
    Bad("tile.empty", "%w = tile.empty {tkc.buffers = 3 : i64} : !tile.st<64x64xbf16>",
        "empty's buffers (tkc.buffers) must be 1 or 2"),
    # grid and sizes
    Bad("tile.block_idx", "%x = tile.block_idx w", "expected x, y or z, got w"),
    Bad("tile.block_idx", '%x = "tile.block_idx"() <{dim = 3 : i64}> : () -> i32',
        "block_idx: dimension must be 0, 1 or 2 (x, y or z), got 3"),
    Bad("tile.num_blocks", '%x = "tile.num_blocks"() <{dim = -1 : i64}> : () -> i32',
        "num_blocks: dimension must be 0, 1 or 2 (x, y or z), got -1"),
    Bad("tile.wgmma_wait", '"tile.wgmma_wait"() <{pending = -1 : i64}> : () -> ()',
        "wgmma_wait needs a non-negative count"),
    Bad("tile.dim", "%n = tile.dim %g2[2] : !tile.gl<?x?xbf16>",
        "dim: index 2 is out of range for gl[bf16, 2], which has dimensions 0 to 1"),
    Bad("tile.dim", '%n = "tile.dim"(%g4) <{index = -1 : i64}> : (!tile.gl<?x?x?x?xf32>) -> i32',
        "dim: index -1 is out of range for gl[f32, 4], which has dimensions 0 to 3"),
    Bad("tile.dim", "%n = tile.dim %g2[-1] : !tile.gl<?x?xbf16>", "Expected integer literal"),
    # numbers
    Bad("tile.fill", "%x = tile.fill abc : !tile.rt<16x16xf32>", "expected a number, inf or nan"),
    Bad("tile.tril", "%x = tile.tril %rt, %i fill : !tile.rt<16x32xf32>", "expected a number, inf or nan"),
    Bad("tile.triu", "%x = tile.triu %rt, %f fill 0.0 : !tile.rt<16x32xf32>",
        "operand is used with type i32, but has been previously used or defined with type f32"),
    # conversions
    Bad("tile.convert", "%x = tile.convert %rt : !tile.rt<16x32xf32> -> !tile.rt<32x16xbf16>",
        "convert changes only the dtype, not the kind, shape or layout: rt[f32, 16, 32] cannot become rt[bf16, 32, 16]"),
    Bad("tile.convert", "%x = tile.convert %rt : !tile.rt<16x32xf32> -> !tile.rt<16x32xbf16, row>",
        "rt[f32, 16, 32] cannot become rt[bf16, 16, 32] (row layout)"),
    Bad("tile.convert", "%x = tile.convert %rv : !tile.rv<16xf32> -> !tile.rt<16x16xbf16>",
        "rv[f32, 16] cannot become rt[bf16, 16, 16]"),
    Bad("tile.convert", "%x = tile.convert %rt : !tile.rt<16x32xf32> -> !tile.rt<16x32xf8E4M3FN>",
        "registers do not hold fp8 (rt[f32, 16, 32] -> rt[fp8e4m3, 16, 32])"),
    Bad("tile.relayout", "%x = tile.relayout %rtr : !tile.rt<16x32xf32, row> -> !tile.rt<16x32xbf16, col>",
        "relayout changes only the layout, not the kind, shape or dtype: rt[f32, 16, 32] (row layout) cannot become "
        "rt[bf16, 16, 32] (col layout)"),
    Bad("tile.relayout", "%x = tile.relayout %rtr : !tile.rt<16x32xf32, row> -> !tile.rt<32x16xf32, col>",
        "rt[f32, 16, 32] (row layout) cannot become rt[f32, 32, 16] (col layout)"),
    Bad("tile.relayout", "%x = tile.relayout %rva : !tile.rv<16xf32, align> -> !tile.rv<32xf32, ortho>",
        "rv[f32, 16] (align layout) cannot become rv[f32, 32] (ortho layout)"),
    Bad("tile.transpose", "%x = tile.transpose %rt : !tile.rt<16x32xf32> -> !tile.rt<16x32xf32>",
        "transpose of rt[f32, 16, 32] is rt[f32, 32, 16], not rt[f32, 16, 32]"),
    Bad("tile.transpose", "%x = tile.transpose %rt : !tile.rt<16x32xf32> -> !tile.rt<32x16xbf16>",
        "transpose of rt[f32, 16, 32] is rt[f32, 32, 16], not rt[bf16, 32, 16]"),
    Bad("tile.rotate_pairs", "%x = tile.rotate_pairs %rtb : !tile.rt<16x32xbf16>",
        "rotate_pairs takes an f32 tile, got rt[bf16, 16, 32]"),
    Bad("tile.rotate_pairs", "%x = tile.rotate_pairs %rtr : !tile.rt<16x32xf32, row>\n"
        "%y = tile.relayout %x : !tile.rt<16x32xf32, row> -> !tile.rt<16x32xf32, col>\n"
        "%z = tile.rotate_pairs %y : !tile.rt<16x32xf32, col>",
        "rotate_pairs needs each pair of columns in one lane"),
    # loads
    Bad("tile.load", "%x = tile.load %g2[%i, %i] {tile.repeat_cols = 3 : i64} : !tile.gl<?x?xbf16> -> !tile.rt<16x96xf32>",
        "load: tile.repeat_cols = 3 must be 2"),
    Bad("tile.load", "%x = tile.load %g2[%i, %i] {tile.repeat_cols = 2 : i64} : !tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>",
        "load: only a global → f32 register tile load repeats columns"),
    Bad("tile.load", "%x = tile.load %st[%i, %i] {tile.index_in_rows} : !tile.st<64x64xbf16> -> !tile.rt<16x64xf32>",
        "load: a row index that counts rows (rows(r), tile.index_in_rows) needs a 2-D tile or a register vector in "
        "global memory"),
    Bad("tile.load", "%x = tile.load %g1[%i] {tile.index_in_rows} : !tile.gl<?xf16> -> !tile.sv<64xf16>",
        "load: a row index that counts rows (rows(r), tile.index_in_rows) needs a 2-D tile or a register vector in "
        "global memory"),
    Bad("tile.load", "%x = tile.load %g2[%i, %i] rows_at %gc : !tile.gl<?xi32> : !tile.gl<?x?xbf16> -> !tile.rt<16x32xf32>",
        "load: only a load between global memory and a register tile (or a load into a shared tile) whose row index "
        "counts rows (tile.index_in_rows) goes by rows_at's row numbers"),
    Bad("tile.store", "%s = tile.empty : !tile.st<64x64xbf16>\ntile.store %s, %g2[%i, %i] rows_at %gc : "
        "!tile.gl<?xi32> {tile.index_in_rows} : !tile.st<64x64xbf16> -> !tile.gl<?x?xbf16>",
        "not st[bf16, 64, 64] → gl[bf16, 2]"),
    Bad("tile.load", "%x = tile.load %g2[%i, %i] rows_at %gc : !tile.gl<?xi32> {tile.index_in_rows, tkc.multicast} : "
        "!tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>", "load: a multicast load copies one box of the tensor; rows_at's rows"),
    Bad("tile.load", "%x = tile.load %g2[%i, %i] rows_at %g1 : !tile.gl<?xf16> {tile.index_in_rows} : "
        "!tile.gl<?x?xbf16> -> !tile.rt<16x32xf32>", "load: the rows_at index must be a gl[i32, 1] or gl[i64, 1], got gl[f16, 1]"),
    Bad("tile.store", "tile.store %rv, %g2[%i, %i] rows_at %gc : !tile.gl<?xi32> {tile.index_in_rows} : "
        "!tile.rv<16xf32> -> !tile.gl<?x?xbf16>", "store: only a store between global memory and a register tile (or a "
        "load into a shared tile) whose row index counts rows (tile.index_in_rows) goes by rows_at's row numbers"),
    Bad("tile.atomic_add", "tile.atomic_add %rt, %g4[%i, %i, %i, %i] rows_at %g1 : !tile.gl<?xf16> {tile.index_in_rows} : "
        "!tile.rt<16x32xf32> -> !tile.gl<?x?x?x?xf32>", "atomic_add: the rows_at index must be a gl[i32, 1] or gl[i64, 1]"),
    Bad("tile.load", "%x = tile.load %g2[%i] : !tile.gl<?x?xbf16> -> !tile.rt<16x32xbf16>",
        "load from gl[bf16, 2] takes 2 indices, got 1"),
    Bad("tile.load", "%x = tile.load %g4[%i, %i, %i] : !tile.gl<?x?x?x?xf32> -> !tile.st<64x64xf32>",
        "load from gl[f32, 4] takes 4 indices, got 3"),
    Bad("tile.load", "%x = tile.load %st[%i] : !tile.st<64x64xbf16> -> !tile.rt<16x16xbf16>",
        "load from st[bf16, 64, 64] takes 2 indices, got 1"),
    Bad("tile.load", "%x = tile.load %sv[%i, %i] : !tile.sv<64xbf16> -> !tile.rv<16xbf16>",
        "load from sv[bf16, 64] takes 1 index, got 2"),
    Bad("tile.load", "%x = tile.load %g2[%i, %i] : !tile.gl<?x?xbf16> -> !tile.st<64x64xf32>",
        "load: a copy between global and shared memory cannot convert gl[bf16, 2] to st[f32, 64, 64]: "
        "keep the dtype and convert in registers"),
    Bad("tile.load", "%x = tile.load %g1[%i] : !tile.gl<?xf16> -> !tile.sv<64xbf16>",
        "load: a copy between global and shared memory cannot convert gl[f16, 1] to sv[bf16, 64]"),
    Bad("tile.load", "%x = tile.load %g1[%i] : !tile.gl<?xf16> -> !tile.rt<16x16xf16>",
        "load: rt[f16, 16, 16] needs a global tensor of rank 2 or more"),
    Bad("tile.load", "%x = tile.load %st[%i, %i] : !tile.st<64x64xbf16> -> !tile.rt<48x32xbf16>",
        "load: rt[bf16, 48, 32] does not tile st[bf16, 64, 64] evenly"),
    Bad("tile.load", "%x = tile.load %sts[%i, %i] : !tile.st<64x64xbf16, swizzle 128> -> !tile.rt<16x128xbf16>",
        "load: rt[bf16, 16, 128] does not tile st[bf16, 64, 64] (swizzle 128) evenly"),
    Bad("tile.load", "%x = tile.load %sv[%i] : !tile.sv<64xbf16> -> !tile.rv<48xbf16>",
        "load: rv[bf16, 48] does not tile sv[bf16, 64] evenly"),
    Bad("tile.load", "%x = tile.load %st[%i, %i] : !tile.st<64x64xbf16> -> !tile.st<16x16xbf16>",
        "load: a view of st[bf16, 64, 64] takes whole rows or whole columns of the same dtype: st[bf16, R, 64] or "
        "st[bf16, 64, C], got st[bf16, 16, 16]"),
    Bad("tile.load", "%x = tile.load %sv[%i] : !tile.sv<64xbf16> -> !tile.rt<16x16xbf16>",
        "load cannot move data from sv[bf16, 64] to rt[bf16, 16, 16]"),
    # stores
    Bad("tile.store", "tile.store %rt, %g2[%i, %i, %i] : !tile.rt<16x32xf32> -> !tile.gl<?x?xbf16>",
        "store into gl[bf16, 2] takes 2 indices, got 3"),
    Bad("tile.store", "tile.store %st, %g4[%i, %i, %i, %i] : !tile.st<64x64xbf16> -> !tile.gl<?x?x?x?xf32>",
        "store: a copy between global and shared memory cannot convert st[bf16, 64, 64] to gl[f32, 4]: "
        "keep the dtype and convert in registers"),
    Bad("tile.store", "tile.store %rt, %g1[%i] : !tile.rt<16x32xf32> -> !tile.gl<?xf16>",
        "store: rt[f32, 16, 32] needs a global tensor of rank 2 or more"),
    Bad("tile.read", "%e = tile.read %g1[%i] : !tile.gl<?xf16>",
        "read: one element of an int32 tensor (gl[i32, N]) is a run-time int, not one of gl[f16, 1]"),
    Bad("tile.read", "%e = tile.read %gc[%i, %i] : !tile.gl<?xi32>", "read from gl[i32, 1] takes 1 indices, got 2"),
    Bad("tile.arrive_last", "%l = tile.arrive_last %g1[%i], %i : !tile.gl<?xf16>",
        "arrive_last counts in an int32 tensor of rank 1 (gl[i32, 1]), got gl[f16, 1]"),
    Bad("tile.atomic_add", "tile.atomic_add %rtb, %g2[%i, %i] : !tile.rt<16x32xbf16> -> !tile.gl<?x?xbf16>",
        "atomic_add adds an f32 register tile into f32, got rt[bf16, 16, 32] into gl[bf16, 2]"),
    Bad("tile.atomic_add", "tile.atomic_add %rt, %g4[%i, %i] : !tile.rt<16x32xf32> -> !tile.gl<?x?x?x?xf32>",
        "atomic_add into gl[f32, 4] takes 4 indices, got 2"),
    # inserts (the DSL's store into a shared tile)
    Bad("tile.insert", "%x = tile.insert %rt, %st[%i] : !tile.rt<16x32xf32> -> !tile.st<64x64xbf16>",
        "store into st[bf16, 64, 64] takes 2 indices, got 1"),
    Bad("tile.insert", "%x = tile.insert %rv, %sv[%i, %i] : !tile.rv<16xf32> -> !tile.sv<64xbf16>",
        "store into sv[bf16, 64] takes 1 index, got 2"),
    Bad("tile.insert", "%x = tile.insert %rv, %st[%i, %i] : !tile.rv<16xf32> -> !tile.st<64x64xbf16>",
        "store cannot move data from rv[f32, 16] to st[bf16, 64, 64]"),
    Bad("tile.insert", "%x = tile.insert %rt, %sv[%i] : !tile.rt<16x32xf32> -> !tile.sv<64xbf16>",
        "store cannot move data from rt[f32, 16, 32] to sv[bf16, 64]"),
    Bad("tile.insert", f"{fill('!tile.rt<48x16xf32>')}%x = tile.insert %w, %st[%i, %i] : !tile.rt<48x16xf32> -> !tile.st<64x64xbf16>",
        "store: rt[f32, 48, 16] does not tile st[bf16, 64, 64] evenly"),
]

# Rejected by an op's declared operand and result kinds (xDSL's own messages) before its verifier runs.
CONSTRAINT_CASES = [
    Bad("tile.dim", "%n = tile.dim %rt[0] : !tile.rt<16x32xf32>", "should be of base attribute tile.gl"),
    Bad("tile.store", "tile.store %rt, %st[%i, %i] : !tile.rt<16x32xf32> -> !tile.st<64x64xbf16>",
        "should be of base attribute tile.gl"),
    Bad("tile.vec_sum", "%x = tile.vec_sum %rt : !tile.rt<16x32xf32>", "should be of base attribute tile.rv"),
    Bad("tile.exp2", '%x = "tile.exp2"(%rt) : (!tile.rt<16x32xf32>) -> !tile.rt<16x32xbf16>',
        "result 'result' at position 0 does not verify"),
    Bad("tile.empty", "%x = tile.empty : !tile.rt<16x16xf32>", "Unexpected attribute !tile.rt<16x16xf32>"),
]

def _wgmma(fn: str, a: str, b: str, c: str) -> str:
    return (f"%a = tile.empty : !tile.st<{a}>\n%b = tile.empty : !tile.st<{b}>\n{fill(f'!tile.rt<{c}>', '%c')}"
            f"%d = tile.{fn} %a, %b, %c : !tile.st<{a}>, !tile.st<{b}>, !tile.rt<{c}>")


WGMMA_CASES = [
    Bad("tile.wgmma_AB", _wgmma("wgmma_AB", "32x64xbf16", "64x64xbf16", "16x64xf32"),
        "wgmma_AB: A must be st[bf16, 64, K] (a warpgroup's 64 rows, K a multiple of 16), got st[bf16, 32, 64]"),
    Bad("tile.wgmma_AB", _wgmma("wgmma_AB", "64x64xbf16", "32x64xbf16", "16x64xf32"),
        "wgmma_AB: K mismatch: A is st[bf16, 64, 64] but B is st[bf16, 32, 64]"),
    Bad("tile.wgmma_ABt", _wgmma("wgmma_ABt", "64x64xbf16", "64x64xbf16", "64x64xf32"),
        "wgmma_ABt: each warp accumulates its 16 rows of the warpgroup's 64×64: the accumulator must be rt[f32, 16, 64]"),
    Bad("tile.wgmma_ABt", _wgmma("wgmma_ABt", "64x64xbf16", "64x64xf16", "16x64xf32"),
        "wgmma_ABt: A and B must be bf16 or f16 tiles of one dtype"),
    Bad("tile.wgmma_AB", _wgmma("wgmma_AB", "64x64xbf16", "64x64xbf16", "16x64xbf16"),
        "wgmma_AB: the accumulator must be an f32 tile, got rt[bf16, 16, 64]"),
    Bad("tile.wgmma_AtB", _wgmma("wgmma_AtB", "64x32xbf16", "64x64xbf16", "16x64xf32"),
        "wgmma_AtB: A must be st[bf16, K, 64] (K a multiple of 16; its 64 columns the warpgroup's rows), got "
        "st[bf16, 64, 32]"),
    Bad("tile.wgmma_AtBt", _wgmma("wgmma_AtBt", "32x64xbf16", "64x64xbf16", "16x64xf32"),
        "wgmma_AtBt: K mismatch: A is st[bf16, 32, 64] but B is st[bf16, 64, 64]"),
]

WGMMA_CASES.append(Bad("tile.load", "%s = tile.empty : !tile.st<128x64xbf16>\n"
                                    "%v = tile.load %s[%i, %i] : !tile.st<128x64xbf16> -> !tile.st<64x32xbf16>",
                       "load: a view of st[bf16, 128, 64] takes whole rows or whole columns of the same dtype: "
                       "st[bf16, R, 64] or st[bf16, 128, C], got st[bf16, 64, 32]"))

WGMMA_CASES.append(Bad("tile.load", "%a = tile.load %g2[%i, %i] {tkc.multicast} : !tile.gl<?x?xbf16> -> !tile.rt<16x64xbf16>",
                       "load: only a global → shared tile load may be multicast"))
WGMMA_CASES.append(Bad("tile.load", "%a = tile.load %g2[%i, %i] {tkc.multicast = [2 : i64, 0 : i64]} : "
                                    "!tile.gl<?x?xbf16> -> !tile.st<64x64xbf16>",
                       "tkc.multicast is a unit attribute or [size, stride], two positive integers"))
WGMMA_CASES.append(Bad("tile.tma_load", "%r = tile.ring_alloc : !tile.ring<3, !tile.st<64x64xbf16, swizzle 128>>\n"
                                        "%b = tile.stage_barriers : !tile.stage_barriers<3, 128>\n"
                                        "tile.tma_load %g2[%i, %i], %r, %b[%i] {tkc.multicast} : !tile.gl<?x?xbf16> -> "
                                        "!tile.ring<3, !tile.st<64x64xbf16, swizzle 128>>, !tile.stage_barriers<3, 128>",
                       "a multicast tma_load needs the stage barriers of a cluster"))

WGMMA_CASES.append(Bad("tile.cluster_load", "%s = tile.empty : !tile.st<32x64xf32>\n"
                                           "%a = tile.cluster_load %s[%i, %i] from %i : !tile.st<32x64xf32> -> "
                                           "!tile.rt<32x16xf32>",
                       "cluster load: the cluster's blocks read each other's shared tile only after a cluster_sync() "
                       "that follows their writes into it"))
WGMMA_CASES.append(Bad("tile.cluster_sync", "%p = arith.cmpi slt, %i, %i : i32\nscf.if %p {\ntile.cluster_sync\n"
                                           "scf.yield\n}",
                       "cluster_sync: every warp of the cluster must reach it, so it cannot be inside a run-time `if`"))
WGMMA_CASES.append(Bad("tile.cluster_load", "%s = tile.empty : !tile.st<32x64xf32>\ntile.cluster_sync\n"
                                           "%a = tile.cluster_load %s[%i, %i] from %i : !tile.st<32x64xf32> -> "
                                           "!tile.rt<32x48xf32>",
                       "cluster load: rt[f32, 32, 48] does not tile st[f32, 32, 64] evenly"))

OP_CASES = _mma_cases() + _elementwise_cases() + OTHER_CASES + WGMMA_CASES


@pytest.mark.parametrize("case", OP_CASES, ids=lambda c: f"{c.target}:{c.message[:40]}")
def test_bad_op_is_rejected(case: Bad) -> None:
    kind, message = rejection(case.body)
    if kind is VerifyException:  # tkc shows a verifier's first line: the whole message must be there
        message = message.splitlines()[0]
    assert case.message in message


@pytest.mark.parametrize("case", CONSTRAINT_CASES, ids=lambda c: f"{c.target}:{c.message[:40]}")
def test_op_of_the_wrong_kind_is_rejected(case: Bad) -> None:
    kind, message = rejection(case.body)
    assert case.message in message


def _has_own_verifier(op: type) -> bool:
    """Whether tkc gave this op a `verify_` (xDSL wraps it into a generated one that also checks constraints)."""
    generated = op.__dict__["verify_"]
    cells = [c.cell_contents for c in generated.__closure__ or ()]
    return any(callable(c) and getattr(c, "__module__", "").startswith("tkc.") for c in cells)


def test_every_verifier_has_a_case() -> None:
    verified = {op.name for op in TILE_OPS if _has_own_verifier(op)}
    assert {"tile.mma_AB", "tile.load", "tile.dim", "tile.sub_row"} <= verified  # the detection works
    covered = {case.target for case in OP_CASES}
    assert not verified - covered, f"ops with a verifier but no rejection case: {sorted(verified - covered)}"


def test_messages_name_the_op_in_dsl_terms() -> None:
    """Verifier messages start with the op's DSL name (`mma_AB: ...`, `load ...`), not an IR spelling."""
    for case in OP_CASES:
        kind, message = rejection(case.body)
        if kind is VerifyException:
            message = message.splitlines()[0]
            assert not message.startswith("tile."), message
            assert "!tile." not in message, message


def test_a_pass_that_moves_a_use_above_its_definition_is_caught() -> None:
    """The compiler's check between passes (xDSL's verifier does not check dominance): a pass that moved an op
    above the op defining its operand, or out of the loop defining it, is an error naming the op and the value."""
    from xdsl.dialects import scf

    from tkc.compiler import verify
    from tkc.errors import TkcError
    from tkc.kernels import layernorm_kernel

    module = layernorm_kernel.build(D=256, WARPS=2)
    verify(module, "the frontend")
    loop = next(op for op in module.walk() if isinstance(op, scf.ForOp))
    inner = next(op for op in loop.body.block.ops if op.operands and op.results)
    user = next(use.operation for use in inner.results[0].uses)
    user.detach()
    loop.parent_block().insert_op_before(user, loop)  # out of the loop that defines its operand
    with pytest.raises(TkcError, match=rf"after a broken pass: {user.name} uses .*, which is defined in a region"):
        verify(module, "a broken pass")

    module = layernorm_kernel.build(D=256, WARPS=2)
    block = next(op for op in module.walk() if isinstance(op, scf.ForOp)).body.block
    first, second = [op for op in block.ops if op.results][:2]
    if first.results[0] not in second.operands:
        second = next(use.operation for use in first.results[0].uses)
    second.detach()
    block.insert_op_before(second, first)  # above the op it reads
    with pytest.raises(TkcError, match=rf"{second.name} uses .*, which is defined after its use"):
        verify(module, "a broken pass")


def test_bad_ir_from_a_pass_is_caught_at_the_end_or_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """By default the IR is verified after the pipeline's last pass (xDSL's verifier after each was ~40 % of a
    compile); TKC_VERIFY_EACH=1 verifies after every pass and names the one that broke it."""
    from xdsl.dialects import scf
    from xdsl.passes import ModulePass

    from tkc.compiler import Dumps, PassTimer, parse_pipeline, run_passes
    from tkc.errors import TkcError
    from tkc.kernels import layernorm_kernel

    class MoveAUseOutOfItsLoop(ModulePass):
        name = "move-a-use-out-of-its-loop"

        def apply(self, ctx, module) -> None:  # type: ignore[no-untyped-def]
            loop = next(op for op in module.walk() if isinstance(op, scf.ForOp))
            inner = next(op for op in loop.body.block.ops if op.operands and op.results)
            user = next(use.operation for use in inner.results[0].uses)
            user.detach()
            loop.parent_block().insert_op_before(user, loop)

    def run(env: str | None, verify_each: bool | None = None) -> str:
        if env is None:
            monkeypatch.delenv("TKC_VERIFY_EACH", raising=False)
        else:
            monkeypatch.setenv("TKC_VERIFY_EACH", env)
        passes = [MoveAUseOutOfItsLoop(), *parse_pipeline("canonicalize")]
        with pytest.raises(TkcError) as caught:
            run_passes(layernorm_kernel.build(D=256, WARPS=2), passes, Dumps(), PassTimer(), verify_each)
        return str(caught.value)

    assert "after the pipeline (its last pass canonicalize; TKC_VERIFY_EACH=1" in run(None)
    assert "after the pipeline" in run("0")
    assert "after pass move-a-use-out-of-its-loop:" in run("1")
    assert "after pass move-a-use-out-of-its-loop:" in run(None, verify_each=True)
