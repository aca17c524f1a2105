"""Packed ternary weights: the one layout every weight (and dW) uses.

Element (i, j) of the logical K x N weight matrix is code number ``j * Kp + i``
(Kp = K rounded up to 16), so each output column j owns Kp/16 whole u32 words and
a kernel can fetch 16 consecutive in-features of one column with one aligned load.
Code e sits in word e // 16 at bits 2*(e % 16) and 2*(e % 16) + 1, least
significant first. Codes: 0 -> 0, 1 -> +1, 2 -> -1. Code 3 is never written and is
refused on input (by :func:`unpack` and at every launch, kernels.launch), and so are
non-zero padding codes (in-features K..Kp-1), so a corrupted buffer cannot decode to a
silent zero. :func:`pack` and :func:`code_problem` work on numpy and CuPy arrays.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from kernels.validate import module_of

CODES_PER_WORD = 16
CODE_OF_VALUE = {0: 0, 1: 1, -1: 2}
VALUE_OF_CODE = np.array([0, 1, -1, 0], dtype=np.int8)  # code 3 is refused before lookup
_SHIFTS = (2 * np.arange(CODES_PER_WORD, dtype=np.uint32)).astype(np.uint32)
LOW_BITS = 0x55555555  # bit 0 of every code: code 3 is exactly "bit 0 and bit 1 set"


class PackError(ValueError):
    """A weight matrix or packed buffer that does not follow the ternary layout."""


def padded_k(K: int) -> int:
    """K rounded up to a whole number of 16-code words."""
    return -(-K // CODES_PER_WORD) * CODES_PER_WORD


def packed_shape(K: int, N: int) -> tuple[int, int]:
    """Shape of the packed buffer: one row of Kp/16 words per output column."""
    return (N, padded_k(K) // CODES_PER_WORD)


def pack(w: Any) -> Any:
    """Pack a K x N matrix of {-1, 0, +1} into uint32 words of shape (N, Kp/16).

    A numpy (or list) input gives a numpy buffer, a CuPy input a CuPy buffer.
    """
    xp = module_of(w) if hasattr(w, "dtype") else np
    w = xp.asarray(w)
    if w.ndim != 2:
        raise PackError(f"pack: expected a 2-D K x N matrix, got shape {w.shape}")
    bad = ~((w == -1) | (w == 0) | (w == 1))
    if bad.any():
        i, j = (int(v) for v in xp.argwhere(bad)[0])
        raise PackError(f"pack: element ({i}, {j}) is {w[i, j].item()}; ternary weights are -1, 0 or +1")
    K, N = w.shape
    codes = xp.zeros((N, padded_k(K)), dtype=xp.uint32)
    codes[:, :K] = xp.where(w.T == 1, 1, xp.where(w.T == -1, 2, 0))
    words = codes.reshape(N, -1, CODES_PER_WORD) << xp.asarray(_SHIFTS)
    return words.sum(axis=2, dtype=xp.uint32)  # the codes' bits are disjoint: sum == or


def padding_mask(K: int) -> int:
    """The bits of the last word of a column that hold padding codes (in-features >= K)."""
    used = K % CODES_PER_WORD
    return 0 if used == 0 else (0xFFFFFFFF << (2 * used)) & 0xFFFFFFFF


def code_problem(packed: Any, K: int) -> str | None:
    """None when a (N, Kp/16) uint32 buffer holds only codes 0-2 and zero padding, else
    the first bad code as one line (column, in-feature, word, bits, what to do).

    One vectorised pass over the words, no unpacking: a code is 3 exactly when both of
    its bits are set, ``w & (w >> 1) & 0x55555555``; padding is the last word of each
    column under :func:`padding_mask`. Only a bad buffer pays for locating the code.
    """
    if packed.size == 0:
        return None
    xp = module_of(packed)
    threes = packed & (packed >> 1) & xp.uint32(LOW_BITS)
    padding = packed[:, -1] & xp.uint32(padding_mask(K))
    if not bool(threes.any() | padding.any()):
        return None
    if bool(threes.any()):
        j, word = (int(v) for v in xp.argwhere(threes)[0])
        e = word * CODES_PER_WORD + _lowest_code(int(threes[j, word]))
        what, fix = "code 3", "the packer never writes it: re-pack the weights (kernels.ternary.pack)"
    else:
        j = int(xp.argwhere(padding)[0][0])
        word = packed.shape[1] - 1
        e = word * CODES_PER_WORD + _lowest_code(int(padding[j]))
        what, fix = "padding code", f"codes past K={K} must be 0: re-pack the weights (kernels.ternary.pack)"
    bit = 2 * (e % CODES_PER_WORD)
    return (f"packed weights: {what} at column {j}, in-feature {e} (word {word}, bits "
            f"{bit}-{bit + 1}) is not allowed; {fix}")


def _lowest_code(bits: int) -> int:
    """Index of the lowest code with a bit set in one word."""
    return ((bits & -bits).bit_length() - 1) // 2


def codes_of(packed: np.ndarray) -> np.ndarray:
    """All 2-bit codes of a packed buffer, shape (N, Kp), column j's codes in row j."""
    packed = np.asarray(packed, dtype=np.uint32)
    return ((packed[:, :, None] >> _SHIFTS) & 3).reshape(packed.shape[0], -1).astype(np.uint8)


def unpack(packed: np.ndarray, K: int) -> np.ndarray:
    """The K x N int8 matrix of a packed buffer; refuses code 3 and non-zero padding."""
    packed = np.asarray(packed)
    if packed.dtype != np.uint32 or packed.ndim != 2:
        raise PackError(f"unpack: expected a 2-D uint32 buffer, got {packed.dtype} {packed.shape}")
    N = packed.shape[0]
    if packed.shape != packed_shape(K, N):
        raise PackError(f"unpack: buffer shape {packed.shape} does not hold K={K}: expected {packed_shape(K, N)}")
    problem = code_problem(packed, K)
    if problem:
        raise PackError(problem)
    return VALUE_OF_CODE[codes_of(packed)[:, :K]].T.copy()
