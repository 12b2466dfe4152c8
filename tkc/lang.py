"""The kernel language: ThunderKittens' types and vocabulary, as Python names.

Inside an `@tkc.kernel` these names build tile IR; outside one, calling them is an error. Ops return new values
(`o = mma_AB(p, v, o)`), with ThunderKittens' names and argument order minus the destination. A store into a
shared tile updates the variable that holds it (`store(o_s, o)`), since shared tiles are values too.

Types: `gl[dtype, rank]` (a global tensor parameter), `st[dtype, rows, cols]`, `sv[dtype, n]` (shared),
`rt[dtype, rows, cols]`, `rv[dtype, n]` (registers, per warp). Rows, columns and lengths are multiples of 16.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from xdsl.dialects.builtin import bf16 as _bf16
from xdsl.dialects.builtin import f16 as _f16
from xdsl.dialects.builtin import f32 as _f32
from xdsl.dialects.builtin import Float8E4M3FNType, Float8E5M2Type
from xdsl.ir import Attribute, SSAValue
from xdsl.utils.exceptions import VerifyException

from tkc.errors import TkcError, user_loc
from tkc.ir.types import I32, I64, TILE_BASE, GlobalType, RegTileType, RegVecType, SharedTileType, SharedVecType

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)


@dataclass(frozen=True)
class DType:
    name: str
    ir: Attribute
    numpy_name: str  # the numpy dtype that holds it (ml_dtypes' bfloat16, float8_e4m3fn, float8_e5m2)
    torch_name: str  # torch's name for it

    @property
    def np(self) -> Any:
        if self.numpy_name.startswith(("bfloat", "float8")):
            import ml_dtypes  # imported on first use: it takes seconds and compiling never needs it

            return np.dtype(getattr(ml_dtypes, self.numpy_name))
        return np.dtype(self.numpy_name)

    def __repr__(self) -> str:
        return self.name


bf16 = DType("bf16", _bf16, "bfloat16", "bfloat16")
f16 = DType("f16", _f16, "float16", "float16")
f32 = DType("f32", _f32, "float32", "float32")
# fp8 (sm_90a): in global and shared memory, the operands of mma_ABt on shared tiles (K-major, K in steps of 32)
fp8e4m3 = DType("fp8e4m3", Float8E4M3FNType(), "float8_e4m3fn", "float8_e4m3fn")
fp8e5m2 = DType("fp8e5m2", Float8E5M2Type(), "float8_e5m2", "float8_e5m2")
DTYPES = {d.name: d for d in (bf16, f16, f32, fp8e4m3, fp8e5m2)}
# Integers, in global tensors only (no tile holds them): gl[i32, 1] the counters of arrive_last; gl[i32, 1] or
# gl[i64, 1] the row indices a load gathers by (rows_at)
i32 = DType("i32", I32, "int32", "int32")
i64 = DType("i64", I64, "int64", "int64")
INDEX_DTYPES = {d.name: d for d in (i32, i64)}


def dtype_of(ir_type: Attribute) -> DType:
    for d in DTYPES.values():
        if d.ir == ir_type:
            return d
    raise TkcError(f"{ir_type} is not a tile element type")


# --------------------------------------------------------------------------------------------------------------
# Type specs: rt[bf16, 16, 64] and friends


@dataclass(frozen=True)
class TileSpec:
    """A tile or vector type as the DSL spells it: `rt[bf16, 16, 64]`, `sv[f32, 128]`."""

    kind: str  # rt, st, rv, sv
    dtype: DType
    shape: tuple[int, ...]

    def __repr__(self) -> str:
        return f"{self.kind}[{self.dtype.name}, {', '.join(map(str, self.shape))}]"

    @property
    def ir(self) -> Attribute:
        try:
            return {"rt": RegTileType, "st": SharedTileType, "rv": RegVecType, "sv": SharedVecType}[self.kind](
                self.dtype.ir, *self.shape
            )
        except VerifyException as e:  # the error at the kernel's line (the frontend adds it), not xDSL's traceback
            raise TkcError(f"{self!r}: {e}") from None


class _SpecFactory:
    def __init__(self, kind: str, rank: int, what: str):
        self.kind, self.rank, self.what = kind, rank, what
        self.__doc__ = f"`{kind}[dtype, {', '.join(['rows', 'cols'][:rank] if rank == 2 else ['length'])}]`: {what}."

    def __repr__(self) -> str:
        return self.kind

    def __getitem__(self, args: Any) -> TileSpec:
        args = args if isinstance(args, tuple) else (args,)
        usage = f"{self.kind}[dtype, {'rows, cols' if self.rank == 2 else 'length'}]"
        if len(args) != 1 + self.rank:
            raise TkcError(
                f"a {self.what} type is written {usage}, e.g. {self.kind}[bf16, {', '.join(['16'] * self.rank)}]",
                user_loc(),
            )
        if not isinstance(args[0], DType):
            got = args[0].__name__ if isinstance(args[0], type) else repr(args[0])
            raise TkcError(f"{usage}: the dtype must be bf16, f16, f32, fp8e4m3 or fp8e5m2, got {got}", user_loc())
        if self.kind in ("rt", "rv") and args[0].name.startswith("fp8"):
            raise TkcError(f"{self.kind}[{args[0].name}, ...]: fp8 lives in global and shared memory only (the "
                           "operands of mma_ABt on shared tiles); registers hold bf16, f16 or f32", user_loc())
        dims = args[1:]
        for d in dims:
            if isinstance(d, SSAValue):
                name = f"`{d.name_hint}` " if d.name_hint else ""
                raise TkcError(
                    f"{usage}: sizes must be known at compile time, but {name}is a run-time value; "
                    "make it a `const` parameter (`N: const = 64`)"
                )
            if not isinstance(d, int | np.integer) or isinstance(d, bool):
                raise TkcError(f"{usage}: sizes must be compile-time integers, got {d!r}", user_loc())
        dims = tuple(int(d) for d in dims)
        spec = TileSpec(self.kind, args[0], dims)
        if any(d <= 0 or d % TILE_BASE for d in dims):
            fixed = TileSpec(self.kind, args[0], tuple(max(TILE_BASE, -(-d // TILE_BASE) * TILE_BASE) for d in dims))
            raise TkcError(
                f"{spec}: tile dimensions must be positive multiples of {TILE_BASE}; use {fixed} "
                "(loads past the end of a global tensor read zeros, stores past it are dropped)",
                user_loc(),
            )
        return spec


rt = _SpecFactory("rt", 2, "register tile (held by one warp)")
rv = _SpecFactory("rv", 1, "register vector (held by one warp)")
st = _SpecFactory("st", 2, "shared tile (owned by the block)")
sv = _SpecFactory("sv", 1, "shared vector (owned by the block)")


@dataclass(frozen=True)
class GlSpec:
    """`gl[dtype, rank]`: a global tensor parameter; its sizes and strides are known at run time. `gl["DT", 2]`
    takes its dtype from the kernel's const parameter DT (`DT: const = bf16`): one kernel for several dtypes, each
    value compiling its own, as any constant."""

    dtype: DType | str  # a dtype, or the name of the const parameter that gives it
    rank: int

    def __repr__(self) -> str:
        return f"gl[{self.dtype.name if isinstance(self.dtype, DType) else repr(self.dtype)}, {self.rank}]"

    def resolve(self, constants: dict[str, Any]) -> GlSpec:
        """This spec with its dtype constant's value (`constants`: the kernel's resolved constants)."""
        if isinstance(self.dtype, DType):
            return self
        value = constants[self.dtype]
        if not isinstance(value, DType):
            raise TkcError(f"constant `{self.dtype}` gives the dtype of gl[{self.dtype!r}, {self.rank}]: it must be "
                           f"one of {', '.join(DTYPES)}, got {value!r}")
        return GlSpec(value, self.rank)

    @property
    def ir(self) -> GlobalType:
        if not isinstance(self.dtype, DType):
            raise TkcError(f"internal: gl[{self.dtype!r}, {self.rank}] read before its constant was given")
        return GlobalType(self.dtype.ir, self.rank)


class _GlFactory:
    __doc__ = GlSpec.__doc__

    def __repr__(self) -> str:
        return "gl"

    def __getitem__(self, args: Any) -> GlSpec:
        if not (isinstance(args, tuple) and len(args) == 2 and isinstance(args[0], DType | str)
                and isinstance(args[1], int)):
            raise TkcError("a global tensor type is written gl[dtype, rank], e.g. gl[bf16, 4] (or gl[\"DT\", 4] with "
                           "the dtype from const parameter DT)", user_loc())
        if not 1 <= args[1] <= 8:
            raise TkcError(f"gl rank must be between 1 and 8, got {args[1]}", user_loc())
        return GlSpec(*args)


gl = _GlFactory()


class const:
    """Annotation of a compile-time constant parameter: `D: const = 64`. Each value compiles its own kernel."""


# --------------------------------------------------------------------------------------------------------------
# Ops: stubs that the frontend gives meaning to


class DslOp:
    """A name of the kernel language. Calling it outside an @tkc.kernel is an error."""

    def __init__(self, fn: Callable[..., Any]):
        self.name = fn.__name__
        self.signature_doc = fn.__doc__ or ""
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<tkc op {self.name}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TkcError(
            f"`{self.name}` can only be used inside an @tkc.kernel function (or an @tkc.func it calls)", user_loc()
        )


def _op(fn: Callable[..., Any]) -> DslOp:
    return DslOp(fn)


# Indices
@_op
def block_idx():
    """`x, y, z = block_idx()`: this block's index in the grid."""


@_op
def num_blocks():
    """`nx, ny, nz = num_blocks()`: the grid's size."""


@_op
def warp_id():
    """The index of this warp in its block (0 .. warps-1)."""


@_op
def warpgroup_id():
    """The index of this warpgroup (4 consecutive warps) in its block."""


@_op
def cluster_rank():
    """The index of this block in its cluster (`@tkc.kernel(cluster=N)`: N blocks consecutive in x, so
    `block_idx()[0] % N`); 0 without clusters."""


@_op
def cdiv(a, b):
    """Ceiling division of integers: `cdiv(n, 64)` blocks of 64 cover n."""


# Fills
@_op
def zeros(spec):
    """A tile or vector of zeros: `zeros(rt[f32, 16, 64])` (TK's `zero`)."""


@_op
def ones(spec):
    """A tile or vector of ones (TK's `one`)."""


@_op
def neg_infty(spec):
    """A tile or vector of -inf."""


@_op
def pos_infty(spec):
    """A tile or vector of +inf."""


@_op
def full(spec, value):
    """A tile or vector with every element equal to the compile-time number `value`."""


@_op
def empty(spec, buffers=1):
    """A shared tile or vector with undefined contents, to store into: `o_s = empty(st[bf16, 64, 64])`. In a loop,
    `buffers=2` gives it two buffers that the steps take in turn: a step writes one while the step before's may
    still be read (no write-after-read barrier between them)."""


zero, one = zeros, ones


# Elementwise unary (abs, max, min: use Python's builtins)
@_op
def exp(x):
    """Elementwise e**x."""


@_op
def exp2(x):
    """Elementwise 2**x (`ex2.approx` on the GPU): the softmax of attention uses it with the scale folded in."""


@_op
def log(x):
    """Elementwise natural logarithm."""


@_op
def log2(x):
    """Elementwise base-2 logarithm."""


@_op
def relu(x):
    """Elementwise max(x, 0)."""


@_op
def sqrt(x):
    """Elementwise square root (also on scalars)."""


@_op
def rsqrt(x):
    """Elementwise 1/sqrt(x) (also on scalars)."""


@_op
def tanh(x):
    """Elementwise hyperbolic tangent (also on scalars)."""


@_op
def copy(x):
    """The same tile (TK's `copy`); useful only to name a value."""


# Elementwise binary by name (the operators + - * / and max/min do the same)
@_op
def add(a, b):
    """a + b: tile ⊕ tile of one type, or a tile and a scalar."""


@_op
def sub(a, b):
    """a - b."""


@_op
def mul(a, b):
    """a * b."""


@_op
def div(a, b):
    """a / b."""


# Row and column broadcasts
@_op
def add_row(t, v):
    """Add v[i] to every element of row i of t (v has one element per row)."""


@_op
def sub_row(t, v):
    """Subtract v[i] from every element of row i of t."""


@_op
def mul_row(t, v):
    """Multiply row i of t by v[i]."""


@_op
def div_row(t, v):
    """Divide row i of t by v[i]."""


@_op
def add_col(t, v):
    """Add v[j] to every element of column j of t (v has one element per column)."""


@_op
def sub_col(t, v):
    """Subtract v[j] from column j of t."""


@_op
def mul_col(t, v):
    """Multiply column j of t by v[j]."""


@_op
def div_col(t, v):
    """Divide column j of t by v[j]."""


@_op
def broadcast_row(v, spec):
    """A tile of type `spec` whose row i holds v[i] everywhere."""


@_op
def broadcast_col(v, spec):
    """A tile of type `spec` whose column j holds v[j] everywhere."""


# Reductions
@_op
def row_max(t, acc=None):
    """The maximum of each row, as an rv with one element per row; combined with `acc` if given."""


@_op
def row_min(t, acc=None):
    """The minimum of each row (with `acc`)."""


@_op
def row_sum(t, acc=None):
    """The sum of each row, plus `acc` if given."""


@_op
def row_prod(t, acc=None):
    """The product of each row, times `acc` if given."""


@_op
def col_max(t, acc=None):
    """The maximum of each column, as an rv with one element per column (with `acc`)."""


@_op
def col_min(t, acc=None):
    """The minimum of each column (with `acc`)."""


@_op
def col_sum(t, acc=None):
    """The sum of each column, plus `acc` if given."""


@_op
def col_prod(t, acc=None):
    """The product of each column, times `acc` if given."""


# Layout and masking
@_op
def transpose(t):
    """The transposed register tile (`t.T` does the same)."""


@_op
def rotate_pairs(t):
    """Each pair of adjacent columns (2i, 2i+1) of an f32 register tile turned a quarter: (a, b) → (−b, a), the pair
    as a complex number times i. Interleaved rotary embedding: `x * cos + rotate_pairs(x) * sin`, with cos and sin
    loaded `repeat=2`."""


@_op
def tril(t, diagonal=0, fill=0.0):
    """Keep t[i, j] where j <= i + diagonal, set the rest to `fill`. `diagonal` may be a run-time integer."""


@_op
def triu(t, diagonal=0, fill=0.0):
    """Keep t[i, j] where j >= i + diagonal, set the rest to `fill`."""


@_op
def keep_cols(t, n, fill=-math.inf):
    """Keep the columns j < n of a register tile, set the rest to `fill` (default -inf): the keys of a block that lie
    past a sequence's end. `n` may be a run-time integer."""


@_op
def keep_rows(t, n, fill=0.0):
    """Keep the rows i < n of a register tile, set the rest to `fill` (default 0): the values of keys past a cache's
    length, which may hold anything (0·NaN is NaN: masking the scores alone does not keep them out of P·V). `n` may
    be a run-time integer."""


@_op
def make_causal(t, fill=-math.inf):
    """Keep the lower triangle (j <= i) of a tile on the diagonal, set the rest to `fill` (default -inf)."""


# Conversions
@_op
def convert(x, dtype):
    """The same tile in another element type (`x.to(dtype)` does the same)."""


# Matrix multiply
@_op
def mma_AB(a, b, c):
    """a·b + c on the tensor cores: a is M×K, b is K×N, c is an f32 M×N accumulator.

    With a and b shared tiles it is a warpgroup's `wgmma` (sm_90a): a is st[bf16, 64, K], b st[bf16, K, N], and
    each of the warpgroup's 4 warps passes its rt[f32, 16, N], rows 16w..16w+15 of the 64×N product."""


@_op
def mma_ABt(a, b, c):
    """a·bᵀ + c: a is M×K, b is N×K (also as a warpgroup's wgmma from shared tiles, as mma_AB)."""


@_op
def mma_AtB(a, b, c):
    """aᵀ·b + c: a is K×M, b is K×N."""


@_op
def mma_AtBt(a, b, c):
    """aᵀ·bᵀ + c: a is K×M, b is N×K."""


@_op
def mm_AB(a, b):
    """a·b into a fresh f32 accumulator."""


@_op
def mm_ABt(a, b):
    """a·bᵀ into a fresh f32 accumulator."""


@_op
def mm_AtB(a, b):
    """aᵀ·b into a fresh f32 accumulator."""


@_op
def mm_AtBt(a, b):
    """aᵀ·bᵀ into a fresh f32 accumulator."""


# Memory
@_op
def load(src, index=None, spec=None, multicast=False, rank=None, conflicts=1, repeat=1):
    """Load a tile or vector.

    `load(G, (b, h, i, j), rt[bf16, 16, 64])` or `st[...]`: from a global tensor; the last indices count in
    tiles (rows i·16 .. i·16+15 here), the leading ones in elements. Past the end of G it reads zeros.
    `multicast=True` (a shared tile, in a kernel with `cluster=N`): every block of the cluster loads this same
    tile, so a TMA ring copies it once for all of them (each block fetching 1/N of its rows into every block).
    `multicast=(size, stride)`: only the group of `size` blocks of ranks r0 + i·stride loads it alike (each
    fetching 1/size of its rows into the group's blocks); in a cluster of 4 taking 2×2 tiles (rank = 2·row +
    column), (2, 1) is a row of tiles, (2, 2) a column; size·stride divides N.
    `load(s)`: a whole shared tile into registers; `load(s, (i, j), rt[bf16, 16, 64])`: one sub-tile of it.
    `rank=r` (in a kernel with `cluster=N`): the register sub-tile from block r's copy of the shared tile s
    (distributed shared memory), after a `cluster_sync()` that follows the blocks' writes into s; store into s
    again only after another `cluster_sync()` (a peer may still be reading it). Without clusters, a block's own
    copy. `conflicts` (from a shared tile into registers): as `store`'s. `repeat=2` (from a global tensor into an
    f32 register tile): each column read fills 2 adjacent columns, `rt[f32, 16, 64]` reading 32 columns of G (the
    last index counts in 32s): a table of one value a pair, spread over its pairs.
    """


@_op
def rows(n, end=None):
    """An index that counts rows rather than tiles, in the row place of a global load or store of a 2-D tile:
    `load(Q, (b, h, rows(r), 0), st[bf16, 192, 64])` takes rows r .. r+191 (r may be negative or unaligned: rows
    outside the tensor read zeros and are not written). `rows(r, end)` (a register tile's load or store): rows from
    `end` on are out too, as if the tensor ended there (a group's last tile in a grouped GEMM). A register vector's
    only index may count rows too: `store(L, lse, (b, h, rows(r, end)))` writes its 16 values to rows r .. r+15 of
    L, none from `end` on (a packed sequence's per-row values)."""


@_op
def rows_at(index, first, end=None):
    """Rows named by an index tensor, in the row place of a register tile's global load, store or atomic_add, or of
    a load into a shared tile: `load(Cos, (rows_at(Positions, r), 0), rt[f32, 16, 64])` takes row Positions[r + i]
    of Cos into the tile's row i (Positions a gl[i32, 1] or gl[i64, 1]); `load(X, (rows_at(Tokens, r), k),
    st[bf16, 64, 64])` gathers rows of X into a shared tile (cp.async, pipelined in loops as any other; never TMA);
    `store(O, t, (rows_at(Slots, r), 0))` writes the tile's row i into row Slots[r + i] of O, `atomic_add` adds it
    there (rows named twice get both). Rows whose entry lies past the end of the index tensor (or, with
    `rows_at(I, r, end)` in a register tile's load or store, at or past I[end]), or whose row number lies outside the
    tensor's rows (negative too), read zeros and are not written. Two rows stored into one row: one of them lands
    (the interpreter reports it as a race)."""


@_op
def store(dst, src, index=None, conflicts=1):
    """Store `src` into `dst` at `index` (in tiles, as for `load`).

    Into a global tensor: written past the end of it is dropped. Into a shared tile or vector held by a variable:
    the variable now holds the updated tile (`store(o_s, o)`); `store` also returns it. `conflicts`: the shared
    memory bank conflicts the kernel's author expects of this store (a known n-way conflict, e.g. once a warp at
    the end of a kernel); the compiler warns only of worse.
    """


@_op
def atomic_add(dst, src, index):
    """Add the f32 register tile `src` into the f32 global tensor `dst` at `index` (in tiles, as for `store`),
    element by element and atomically: blocks may sum into the same elements, in any order. Past the end: dropped."""


@_op
def arrive_last(counter, index, arrivals):
    """Count this block's arrival at `counter[index]` (an int32 global tensor of rank 1, zeroed before the first
    launch) and say whether it arrived last of `arrivals` blocks: True in every warp of the last block, which also
    sets the count back to 0 for the next launch; False in the others. What the arriving blocks stored to global
    memory before it, the last block reads after it (release and acquire at the GPU's scope): one launch can finish
    work split over blocks (a split-K sum, decoding's parts) in its last block, instead of a second kernel. Every
    warp of the block reaches it together (a block barrier): not inside a run-time `if`."""


@_op
def barrier():
    """Every warp of the block waits here. Passes insert the barriers shared memory needs; this is for the rest."""


sync = barrier


@_op
def cluster_sync():
    """Every warp of every block of the cluster waits here: what the blocks stored into their shared tiles before
    it, `load(s, index, spec, rank=r)` reads after it. Not inside a run-time `if`. Without clusters: `barrier()`."""


@_op
def runtime_range(*bounds):
    """`for i in runtime_range(n)`: like `range`, but always a run-time loop (scf.for), even when the bounds are
    compile-time constants (`range` over constants is unrolled). Use it to keep code small or registers few."""


@_op
def static_assert(condition, message=""):
    """Fail compilation with `message` unless the compile-time `condition` holds (`assert` does the same)."""


__all__ = [
    "LOG2E",
    "LN2",
    "bf16",
    "f16",
    "f32",
    "fp8e4m3",
    "fp8e5m2",
    "i32",
    "i64",
    "gl",
    "rt",
    "rv",
    "st",
    "sv",
    "const",
    *[name for name, value in list(globals().items()) if isinstance(value, DslOp)],
]
