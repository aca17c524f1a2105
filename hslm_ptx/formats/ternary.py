"""Packed ternary weights: the one layout every weight (and dW) uses.

Element (i, j) of the logical K x N weight matrix is code number ``j * Kp + i``
(Kp = K rounded up to 16), so each output column j owns Kp/16 whole u32 words and
a kernel can fetch 16 consecutive in-features of one column with one aligned load.
Code e sits in word e // 16 at bits 2*(e % 16) and 2*(e % 16) + 1, least
significant first. Codes: 0 -> 0, 1 -> +1, 2 -> -1. Code 3 is never written and is
refused on input (by :func:`unpack` and at every launch, hslm_ptx.runtime.launch), and so are
non-zero padding codes (in-features K..Kp-1), so a corrupted buffer cannot decode to a
silent zero. :func:`pack` and :func:`code_problem` work on numpy and CuPy arrays.

The kernels read W rearranged into planes (``hslm_ptx/formats/planes.py``), made from this layout.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from hslm_ptx.validate import module_of

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
    try:
        w = xp.asarray(w)
    except ValueError:  # a ragged list
        raise PackError("pack: w is a ragged list (rows of different lengths); pass a K x N matrix") from None
    if w.ndim != 2:
        raise PackError(f"pack: expected a 2-D K x N matrix, got shape {w.shape}")
    if 0 in w.shape:
        raise PackError(f"pack: w has shape {w.shape} (K x N); K and N must be >= 1")
    if w.dtype.kind not in "biuf":
        raise PackError(f"pack: w is {w.dtype}; expected numbers -1, 0 or +1 (e.g. hslm_ptx.reference.quant.ternarize's codes)")
    bad = ~((w == -1) | (w == 0) | (w == 1))
    if bad.any():
        i, j = (int(v) for v in xp.argwhere(bad)[0])
        raise PackError(f"pack: element ({i}, {j}) is {w[i, j].item()}; ternary weights are -1, 0 or +1")
    K, N = w.shape
    codes = xp.zeros((N, padded_k(K)), dtype=xp.uint32)
    codes[:, :K] = xp.where(w.T == 1, 1, xp.where(w.T == -1, 2, 0))
    return words_of(codes)


def padding_mask(K: int, word: int) -> int:
    """The bits of word ``word`` of a column that hold padding codes (in-features >= K)."""
    used = min(max(K - word * CODES_PER_WORD, 0), CODES_PER_WORD)
    return (0xFFFFFFFF << (2 * used)) & 0xFFFFFFFF


def code_problem(packed: Any, K: int, columns: int | None = None) -> str | None:
    """None when a packed buffer (a row of words per column) holds only codes 0-2 and zero
    padding, else the first bad code as one line (column, in-feature, word, bits, what to
    do). Padding is every code of in-feature >= K and, past ``columns`` (default: all
    rows are columns), whole rows.

    One vectorised pass over the words, no unpacking: a code is 3 exactly when both of
    its bits are set, ``w & (w >> 1) & 0x55555555``; padding is the words under
    :func:`padding_mask`. Only a bad buffer pays for locating the code.
    """
    if packed.size == 0:
        return None
    xp = module_of(packed)
    rows, words = packed.shape
    columns = rows if columns is None else columns
    threes = packed & (packed >> 1) & xp.uint32(LOW_BITS)
    first_padded = K // CODES_PER_WORD
    masks = np.array([padding_mask(K, w) for w in range(first_padded, words)], dtype=np.uint32)
    padding = xp.zeros_like(packed)
    padding[:, first_padded:] = packed[:, first_padded:] & xp.asarray(masks)
    padding[columns:] = packed[columns:]
    if not bool(threes.any() | padding.any()):
        return None
    if bool(threes.any()):
        bad, what = threes, "code 3"
        fix = "the packer never writes it: re-pack the weights (hslm_ptx.formats.ternary.pack)"
    else:
        bad, what = padding, "padding code"
        past = f"codes past K={K}" + (f" and columns past N={columns}" if columns < rows else "")
        fix = f"{past} must be 0: re-pack the weights (hslm_ptx.formats.ternary.pack)"
    j, word = (int(v) for v in xp.argwhere(bad)[0])
    e = word * CODES_PER_WORD + _lowest_code(int(bad[j, word]))
    bit = 2 * (e % CODES_PER_WORD)
    return (f"packed weights: {what} at column {j}, in-feature {e} (word {word}, bits "
            f"{bit}-{bit + 1}) is not allowed; {fix}")


def _lowest_code(bits: int) -> int:
    """Index of the lowest code with a bit set in one word."""
    return ((bits & -bits).bit_length() - 1) // 2


def codes_of(packed: Any) -> Any:
    """All 2-bit codes of rows of u32 words (numpy or CuPy), least significant first:
    (rows, 16 x words); for a packed buffer, column j's codes in row j."""
    xp = module_of(packed)
    return ((packed[:, :, None] >> xp.asarray(_SHIFTS)) & xp.uint32(3)).reshape(packed.shape[0], -1)


def words_of(codes: Any) -> Any:
    """Codes (..., 16 n) packed 16 to a u32 word, least significant first: (..., n)."""
    xp = module_of(codes)
    grouped = codes.reshape(*codes.shape[:-1], -1, CODES_PER_WORD)
    return (grouped << xp.asarray(_SHIFTS)).sum(axis=-1, dtype=xp.uint32)  # the codes' bits are disjoint: sum == or


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
