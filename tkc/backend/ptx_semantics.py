"""PTX instruction semantics on numpy arrays of raw bits, one row per lane: the ALU opcodes (`execute`), the
conversions, and the fragment layouts of mma.m16n8k16, ldmatrix and movmatrix, written from the PTX ISA
independently of the lowering (the fragments here are the ISA's, not fragments.py's). The simulator
(simulator.py) runs kernels with them."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tkc.errors import TkcError

LANES = 32


class SimulationError(TkcError):
    pass


# --------------------------------------------------------------------------------------------------------------
# Bits ↔ values


def f32(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def bits32(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).view(np.uint32)


def s32(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.int32).astype(np.int64)


def u32(values: np.ndarray) -> np.ndarray:
    return (np.asarray(values, dtype=np.int64) & 0xFFFFFFFF).astype(np.uint32)


def s64(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint64).view(np.int64)


def u64(values: np.ndarray) -> np.ndarray:
    return np.asarray(values).astype(np.int64).view(np.uint64)


def bf16_bits(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)


def f16_bits(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)


def from_bf16(bits: np.ndarray) -> np.ndarray:
    return ((np.asarray(bits, dtype=np.uint32) & 0xFFFF) << 16).view(np.float32)


def from_f16(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint32) & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32)


_FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
OPERAND_BYTES = {"bf16": 2, "f16": 2, "e4m3": 1, "e5m2": 1}  # an element of a wgmma operand in shared memory


def decode_operand(raw: np.ndarray, dtype: str) -> np.ndarray:
    """f32 values of little-endian bf16 / f16 / e4m3 / e5m2 elements given as a flat uint8 array."""
    if dtype in _FP8:
        return raw.view(_FP8[dtype]).astype(np.float32)
    bits = raw.view(np.uint16).astype(np.uint32)
    return from_bf16(bits) if dtype == "bf16" else from_f16(bits)


def parse_immediate(text: str) -> int | float:
    if text.startswith("0f"):
        return float(np.uint32(int(text[2:], 16)).view(np.float32))
    return int(text, 0)


# --------------------------------------------------------------------------------------------------------------
# Instruction semantics


_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
        "neu": lambda a, b: ~np.equal(a, b) | np.isnan(a) | np.isnan(b)}


def _int(bits: np.ndarray, kind: str) -> np.ndarray:
    return s32(bits) if kind in ("s32", "b32") else np.asarray(bits, dtype=np.uint32).astype(np.int64)


def execute(opcode: str, operands: list[np.ndarray]) -> np.ndarray:
    """One instruction over arrays of operand bits (any shape); returns the destination bits."""
    parts = opcode.split(".")
    name, mods, kind = parts[0], parts[1:-1], parts[-1]
    o = operands
    if name == "mov":
        return o[0]
    if name in ("mul", "mad") and "wide" in mods and kind in ("s32", "u32"):
        x = [_int(v, kind) for v in o]
        r = x[0] * x[1] + (s64(np.asarray(o[2], dtype=np.uint64)) if name == "mad" else 0)
        return u64(r)
    if name in ("add", "sub", "mul", "div", "rem", "min", "max", "mad", "neg", "abs") and kind in ("s32", "u32"):
        x = [_int(v, kind) for v in o]
        with np.errstate(all="ignore"):
            if name == "add":
                r = x[0] + x[1]
            elif name == "sub":
                r = x[0] - x[1]
            elif name == "mul" and "hi" in mods:
                wide = x[0].astype(np.uint64) * x[1].astype(np.uint64)  # exact below 2^64
                r = (wide >> np.uint64(32)).astype(np.int64) if kind == "u32" else (x[0] * x[1]) >> 32
            elif name == "mul":
                r = x[0] * x[1]
            elif name == "mad":
                r = x[0] * x[1] + x[2]
            elif name in ("div", "rem"):
                if (x[1] == 0).any():
                    raise SimulationError(f"{opcode}: division by zero")
                q = np.trunc(x[0] / x[1]).astype(np.int64) if kind == "s32" else x[0] // x[1]
                r = q if name == "div" else x[0] - q * x[1]
            elif name == "min":
                r = np.minimum(x[0], x[1])
            elif name == "max":
                r = np.maximum(x[0], x[1])
            elif name == "neg":
                r = -x[0]
            else:
                r = np.abs(x[0])
        return u32(r)
    if kind in ("s64", "u64") and name in ("add", "sub", "mul", "mad"):
        x = [s64(np.asarray(v, dtype=np.uint64)) for v in o]
        r = {"add": lambda: x[0] + x[1], "sub": lambda: x[0] - x[1], "mul": lambda: x[0] * x[1],
             "mad": lambda: x[0] * x[1] + x[2]}[name]()
        return u64(r)
    if name in ("and", "or", "xor", "not"):
        if kind == "pred":
            a_ = np.asarray(o[0], dtype=bool)
            return {"and": lambda: a_ & np.asarray(o[1], dtype=bool), "or": lambda: a_ | np.asarray(o[1], dtype=bool),
                    "xor": lambda: a_ ^ np.asarray(o[1], dtype=bool), "not": lambda: ~a_}[name]()
        dtype = np.uint64 if kind == "b64" else np.uint32
        x = [np.asarray(v).astype(np.int64).astype(dtype) for v in o]
        return {"and": lambda: x[0] & x[1], "or": lambda: x[0] | x[1], "xor": lambda: x[0] ^ x[1], "not": lambda: ~x[0]}[name]()
    if name == "popc":
        v = np.asarray(o[0]).astype(np.int64).astype(np.uint32)
        return u32(np.unpackbits(v.view(np.uint8).reshape(*v.shape, 4), axis=-1).sum(axis=-1))
    if name in ("shl", "shr"):
        amount = np.asarray(o[1]).astype(np.int64)
        if kind == "b64":
            v = np.asarray(o[0], dtype=np.uint64)
            return (v << amount.astype(np.uint64)) if name == "shl" else (v >> amount.astype(np.uint64))
        if name == "shl":
            return u32(np.asarray(o[0]).astype(np.int64) << amount)
        if kind == "s32":
            return u32(s32(o[0]) >> amount)
        return u32(np.asarray(o[0], dtype=np.uint32).astype(np.int64) >> amount)
    if name == "setp":
        cmp, t_ = mods[0], kind
        if t_ == "f32":
            return _CMP[cmp](f32(o[0]), f32(o[1]))
        return _CMP[cmp](_int(o[0], t_), _int(o[1], t_))
    if name == "selp":
        return np.where(np.asarray(o[2], dtype=bool), o[0], o[1])
    if name == "cvta":
        return o[0]
    if name == "cvt":
        return _convert(opcode, mods, kind, o)
    if kind == "f32" and name in ("add", "sub") and "rm" in mods:  # rounded toward -inf (exact in f64 first)
        wide = f32(o[0]).astype(np.float64) + (1 if name == "add" else -1) * f32(o[1]).astype(np.float64)
        near = wide.astype(np.float32)
        return bits32(np.where(near > wide, np.nextafter(near, np.float32(-np.inf)), near))
    if kind == "f32" or name in ("ex2", "lg2", "rsqrt", "tanh", "rcp"):
        x = [f32(v) for v in o]
        with np.errstate(all="ignore"):
            r = {
                "add": lambda: x[0] + x[1], "sub": lambda: x[0] - x[1], "mul": lambda: x[0] * x[1],
                "div": lambda: x[0] / x[1], "max": lambda: _fmax(x[0], x[1]), "min": lambda: _fmin(x[0], x[1]),
                "neg": lambda: -x[0], "abs": lambda: np.abs(x[0]), "fma": lambda: x[0] * x[1] + x[2],
                "ex2": lambda: np.exp2(x[0]), "lg2": lambda: np.log2(x[0]), "sqrt": lambda: np.sqrt(x[0]),
                "rsqrt": lambda: 1 / np.sqrt(x[0]), "tanh": lambda: np.tanh(x[0]), "rcp": lambda: 1 / x[0],
            }[name]()
        return bits32(r)
    if name == "prmt":
        return _prmt(o[0], o[1], o[2])
    raise SimulationError(f"the simulator does not know `{opcode}`")


def _fmax(a_: np.ndarray, b_: np.ndarray) -> np.ndarray:
    """PTX max.f32 returns the non-NaN operand."""
    return np.fmax(a_, b_)


def _fmin(a_: np.ndarray, b_: np.ndarray) -> np.ndarray:
    return np.fmin(a_, b_)


def _prmt(a_: np.ndarray, b_: np.ndarray, selector: np.ndarray) -> np.ndarray:
    a_, b_ = np.asarray(a_, dtype=np.uint32), np.asarray(b_, dtype=np.uint32)
    pool = np.stack([(a_ >> (8 * i)) & 0xFF for i in range(4)] + [(b_ >> (8 * i)) & 0xFF for i in range(4)])
    sel = np.asarray(selector, dtype=np.int64)
    out = np.zeros(np.broadcast_shapes(a_.shape, b_.shape), dtype=np.uint32)
    for i in range(4):
        idx = np.broadcast_to((sel >> (4 * i)) & 0x7, out.shape)
        byte = np.take_along_axis(pool, idx[None], axis=0)[0]
        out |= byte.astype(np.uint32) << (8 * i)
    return out


def _convert(opcode: str, mods: list[str], kind: str, o: list[np.ndarray]) -> np.ndarray:
    # opcode: cvt[.rnd].DST.SRC ; kind = SRC, mods[-1] = DST
    dst, src = mods[-1], kind
    if dst == "s64" and src == "s32":
        return u64(s32(o[0]))
    if dst == "u64" and src == "u32":
        return np.asarray(o[0], dtype=np.uint32).astype(np.uint64)
    if dst == "f32" and src == "s32":
        return bits32(s32(o[0]).astype(np.float32))
    if dst == "s32" and src == "f32":
        return u32(np.trunc(f32(o[0])).astype(np.int64))
    if dst == "f32" and src == "f16":
        return bits32(from_f16(o[0]))
    if dst == "f32" and src == "bf16":
        return bits32(from_bf16(o[0]))
    if dst in ("bf16x2", "f16x2") and src == "f32":
        conv = bf16_bits if dst == "bf16x2" else f16_bits
        return (conv(f32(o[0])) << 16) | conv(f32(o[1]))
    if dst in ("bf16", "f16") and src == "f32":
        return (bf16_bits if dst == "bf16" else f16_bits)(f32(o[0]))
    if {dst, src} == {"u32", "u16"}:  # widening or truncating: the low 16 bits either way
        return np.asarray(o[0], dtype=np.uint32) & 0xFFFF
    if dst in ("e4m3x2", "e5m2x2") and src == "f32" and "satfinite" in mods:  # a in the upper byte, b in the lower
        fp8 = _FP8[dst[:4]]
        limit = np.float32(ml_dtypes.finfo(fp8).max)

        def byte(v: np.ndarray) -> np.ndarray:
            x = f32(v)
            x = np.where(np.isnan(x), x, np.clip(x, -limit, limit))
            return x.astype(fp8).view(np.uint8).astype(np.uint32)

        return (byte(o[0]) << 8) | byte(o[1])
    if dst == "f16x2" and src in ("e4m3x2", "e5m2x2"):  # the upper byte to the upper half
        raw = np.asarray(o[0], dtype=np.uint32)
        halves = [f16_bits(((raw >> shift) & 0xFF).astype(np.uint8).view(_FP8[src[:4]]).astype(np.float32))
                  for shift in (0, 8)]
        return (halves[1] << 16) | halves[0]
    raise SimulationError(f"the simulator does not know `{opcode}`")


# --------------------------------------------------------------------------------------------------------------
# mma.m16n8k16 and ldmatrix, per the PTX ISA (#warp-level-matrix-fragment-mma-16816-float, #ldmatrix)

_G = np.arange(LANES) // 4
_Q = np.arange(LANES) % 4


def unpack16(words: np.ndarray, dtype: str) -> np.ndarray:
    """[..., n] 32-bit words → [..., 2n] values (low half first)."""
    conv = from_bf16 if dtype == "bf16" else from_f16
    values = np.empty((*words.shape[:-1], 2 * words.shape[-1]), dtype=np.float32)
    values[..., 0::2], values[..., 1::2] = conv(words & 0xFFFF), conv(words >> 16)
    return values


# where each lane's fragment values sit in A (16×16), B (16×8) and C / D (16×8): [lane, value] row and column
_A_ROWS = np.stack([_G + 8 * ((i // 2) % 2) for i in range(8)], axis=1)
_A_COLS = np.stack([2 * _Q + (i % 2) + 8 * (i // 4) for i in range(8)], axis=1)
_B_ROWS = np.stack([2 * _Q + (i % 2) + 8 * (i // 2) for i in range(4)], axis=1)
_B_COLS = np.stack([_G] * 4, axis=1)
_C_ROWS = np.stack([_G + 8 * (i // 2) for i in range(4)], axis=1)
_C_COLS = np.stack([2 * _Q + (i % 2) for i in range(4)], axis=1)


def mma_m16n8k16(a_words: np.ndarray, b_words: np.ndarray, c_bits: np.ndarray, dtype: str) -> np.ndarray:
    """a [32, 4], b [32, 2], c [32, 4] (f32 bits) → d [32, 4] (f32 bits)."""
    A = np.zeros((16, 16), dtype=np.float32)
    B = np.zeros((16, 8), dtype=np.float32)
    C = np.zeros((16, 8), dtype=np.float32)
    A[_A_ROWS, _A_COLS] = unpack16(a_words, dtype)  # a0..a7 of each lane
    B[_B_ROWS, _B_COLS] = unpack16(b_words, dtype)  # b0..b3
    C[_C_ROWS, _C_COLS] = f32(c_bits)
    D = A @ B + C
    return bits32(D[_C_ROWS, _C_COLS])


def ldmatrix_x4(rows: np.ndarray, trans: bool) -> np.ndarray:
    """rows [32, 16] bytes: the 8×8 16-bit matrix rows supplied by lanes (matrix m ← lanes 8m..8m+7) →
    registers [32, 4]."""
    halves = rows.view(np.uint16).astype(np.uint32)  # [32 (= 4 matrices × 8 rows), 8 cols]
    out = np.zeros((LANES, 4), dtype=np.uint32)
    for m in range(4):
        M = halves[8 * m:8 * m + 8]  # [row, col]
        if trans:
            lo, hi = M[2 * _Q, _G], M[2 * _Q + 1, _G]
        else:
            lo, hi = M[_G, 2 * _Q], M[_G, 2 * _Q + 1]
        out[:, m] = lo | (hi << 16)
    return out


def movmatrix_trans(words: np.ndarray) -> np.ndarray:
    """One 8×8 16-bit matrix in fragment form (lane l: row l/4, cols 2(l%4)..+1) → its transpose, same form."""
    M = np.zeros((8, 8), dtype=np.uint32)
    M[_G, 2 * _Q] = words & 0xFFFF
    M[_G, 2 * _Q + 1] = words >> 16
    T = M.T
    return T[_G, 2 * _Q] | (T[_G, 2 * _Q + 1] << 16)
