"""Packed ternary weights: the one layout every weight (and dW) uses.

Element (i, j) of the logical K x N weight matrix is code number ``j * Kp + i``
(Kp = K rounded up to 16), so each output column j owns Kp/16 whole u32 words and
a kernel can fetch 16 consecutive in-features of one column with one aligned load.
Code e sits in word e // 16 at bits 2*(e % 16) and 2*(e % 16) + 1, least
significant first. Codes: 0 -> 0, 1 -> +1, 2 -> -1. Code 3 is never written and is
refused on input, so a corrupted buffer cannot decode to a silent zero.
"""
from __future__ import annotations

import numpy as np

CODES_PER_WORD = 16
CODE_OF_VALUE = {0: 0, 1: 1, -1: 2}
VALUE_OF_CODE = np.array([0, 1, -1, 0], dtype=np.int8)  # code 3 is refused before lookup
_SHIFTS = (2 * np.arange(CODES_PER_WORD, dtype=np.uint32)).astype(np.uint32)


class PackError(ValueError):
    """A weight matrix or packed buffer that does not follow the ternary layout."""


def padded_k(K: int) -> int:
    """K rounded up to a whole number of 16-code words."""
    return -(-K // CODES_PER_WORD) * CODES_PER_WORD


def packed_shape(K: int, N: int) -> tuple[int, int]:
    """Shape of the packed buffer: one row of Kp/16 words per output column."""
    return (N, padded_k(K) // CODES_PER_WORD)


def pack(w: np.ndarray) -> np.ndarray:
    """Pack a K x N matrix of {-1, 0, +1} into uint32 words of shape (N, Kp/16)."""
    w = np.asarray(w)
    if w.ndim != 2:
        raise PackError(f"pack: expected a 2-D K x N matrix, got shape {w.shape}")
    bad = ~np.isin(w, (-1, 0, 1))
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise PackError(f"pack: element ({i}, {j}) is {w[i, j].item()}; ternary weights are -1, 0 or +1")
    K, N = w.shape
    codes = np.zeros((N, padded_k(K)), dtype=np.uint32)
    codes[:, :K] = np.where(w.T == 1, 1, np.where(w.T == -1, 2, 0))
    words = codes.reshape(N, -1, CODES_PER_WORD) << _SHIFTS
    return np.bitwise_or.reduce(words, axis=2).astype(np.uint32)


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
    codes = codes_of(packed)
    if (codes == 3).any():
        j, e = np.argwhere(codes == 3)[0]
        raise PackError(
            f"packed weights: code 3 at column {j}, in-feature {e} (word {e // 16}, bits "
            f"{2 * (e % 16)}-{2 * (e % 16) + 1}); the packer never writes it: re-pack the weights"
        )
    if codes[:, K:].any():
        j, e = np.argwhere(codes[:, K:])[0]
        raise PackError(f"packed weights: padding code at column {j}, in-feature {K + e} is not 0")
    return VALUE_OF_CODE[codes[:, :K]].T.copy()
