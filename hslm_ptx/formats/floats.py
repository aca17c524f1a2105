"""IEEE conversions between f32 and the 16-bit float types, as the GPU performs them.

numpy has float16 but no bfloat16, so a bf16 array is carried as its bit patterns in
uint16 (what a CuPy or torch bf16 buffer holds, byte for byte). Every conversion here
rounds to nearest, ties to even (PTX ISA 9.7.9.21 ``cvt``: ``.rn``), which is what the
layer step's kernels emit (``cvt.rn.bf16.f32``, ``cvt.rn.f16.f32``); widening to f32
is exact. These helpers are the one definition that the emulator's ``cvt`` forms and the
step's numpy references (hslm_ptx.reference.stepmath) share, so the two cannot drift apart.

NaN: a conversion of a NaN gives a NaN (payloads are not promised, so comparisons of
results treat every NaN as equal: :func:`same_values`).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

BF16_QUIET_NAN = np.uint16(0x7FFF)  # what cvt.rn.bf16.f32 gives for a NaN (canonical NaN)


class FloatType(NamedTuple):
    """One float type of the layer step: its numpy/torch name, its short name (the PTX
    type, and the suffix of every kernel name built on it), its bytes an element."""

    dtype: str
    short: str
    element_bytes: int


# The float axis of the product, declared here once: every family over float types, the
# step's kernel lookups and the torch op iterate this table, in this order.
FLOAT_TYPES = (FloatType("float32", "f32", 4), FloatType("float16", "f16", 2), FloatType("bfloat16", "bf16", 2))
FLOAT_DTYPES = tuple(t.dtype for t in FLOAT_TYPES)  # the float types a layer step reads and writes
SHORT_NAMES = {t.dtype: t.short for t in FLOAT_TYPES}  # "bfloat16" -> "bf16"
ELEMENT_BYTES = {t.dtype: t.element_bytes for t in FLOAT_TYPES}


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) -> float32, exact: the bf16 bits are the f32's top half."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), rounded to nearest even; NaN -> 0x7FFF.

    Adding 0x7FFF plus the lowest kept bit to the f32 bits and truncating is round to
    nearest even on the 16 dropped bits (an overflow past the largest finite value
    carries into the exponent and gives inf, as IEEE rounding does)."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(np.asarray(x, dtype=np.float32)), BF16_QUIET_NAN, rounded).astype(np.uint16)


def f16_to_f32(x: np.ndarray) -> np.ndarray:
    """float16 -> float32, exact."""
    return np.asarray(x, dtype=np.float16).astype(np.float32)


def f32_to_f16(x: np.ndarray) -> np.ndarray:
    """float32 -> float16, rounded to nearest even (numpy's conversion is IEEE's)."""
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def to_f32(x: np.ndarray, dtype: str) -> np.ndarray:
    """The f32 values of a buffer holding ``dtype`` ("float32", "float16", "bfloat16")."""
    if dtype == "bfloat16":
        return bf16_to_f32(x)
    if dtype == "float16":
        return f16_to_f32(x)
    if dtype == "float32":
        return np.asarray(x, dtype=np.float32)
    raise ValueError(f"to_f32: dtype {dtype!r} is not one of {', '.join(FLOAT_DTYPES)}")


def from_f32(x: np.ndarray, dtype: str) -> np.ndarray:
    """f32 values rounded (nearest even) into a buffer of ``dtype`` (bf16 as uint16 bits)."""
    if dtype == "bfloat16":
        return f32_to_bf16(x)
    if dtype == "float16":
        return f32_to_f16(x)
    if dtype == "float32":
        return np.asarray(x, dtype=np.float32)
    raise ValueError(f"from_f32: dtype {dtype!r} is not one of {', '.join(FLOAT_DTYPES)}")


def storage_dtype(dtype: str) -> np.dtype:
    """The numpy dtype a buffer of ``dtype`` is held in (bf16: its uint16 bits)."""
    return np.dtype(np.uint16) if dtype == "bfloat16" else np.dtype(dtype)


def same_values(a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    """Elementwise: the same bits, or both NaN (any payload). The exact comparison a verify
    cell makes of a float output."""
    a, b = np.asarray(a), np.asarray(b)
    both_nan = np.isnan(to_f32(a, dtype)) & np.isnan(to_f32(b, dtype))
    return (a.view(np.uint8).reshape(*a.shape, -1) == b.view(np.uint8).reshape(*b.shape, -1)).all(axis=-1) | both_nan
