"""W as the ternary kernels read it: packed words rearranged into planes.

Plane p holds contraction indices 64p .. 64p + 63 (one 64-deep chunk) of every output
column, 4 words a column, columns side by side; K and N are padded to 128 with zero codes
(a CTA tile is 128 wide either way), so no fetch needs a bound or a clamp. A chunk's
words of neighbouring columns are neighbouring 16-byte pieces, so a warp's W request reads
whole 32-byte sectors; in the packed order (``hslm_ptx/formats/ternary.py``) a column's 16 bytes of
a chunk sit 4 Kp bytes from the next column's, half a sector each.

Within a column's 4 words the chunk's 64 codes sit where the forward kernel's decode
wants them (``hslm_ptx.emit.ptx.decode_ternary``): word t holds the 16 codes lane t of an
mma quad holds as B (k = 16s + 4t + u, u < 4, for register s: b0 / b1 of k step s // 2),
the code of register s, byte u at bit 4u + 16 (s & 1) + 2 (s >> 1), so one mask with
0x33333333 leaves the codes of registers 0 and 1 as prmt selector nibbles and the same
mask after a shift by 2 those of registers 2 and 3: a decoded word is the lane's four B
fragment registers of one n8 tile, with no shared memory between.

``FRAGMENTS`` is W itself (forward, Y = X W: contraction over in-features, a plane's
columns are W's columns). ``FRAGMENTS_T`` is W^T (dX = dY W^T: contraction over W's
columns, a plane's columns are in-features), so dX is the forward kernel on it.

A code's two bits stay neighbours, so the code-3 test of the packed layout applies as it is.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from hslm_ptx.formats.layout import Dims
from hslm_ptx.formats.ternary import CODES_PER_WORD, LOW_BITS, code_problem, codes_of, padded_k, words_of
from hslm_ptx.validate import module_of

CHUNK = 64  # contraction indices a plane holds of each column
WORDS = CHUNK // CODES_PER_WORD  # words a column has in a plane
ALIGN = 128  # the contraction and the columns of the planes are padded to this


def _bit(register: int, byte: int) -> int:
    """Bit of the code the decode turns into byte ``byte`` of register ``register``."""
    return 4 * byte + 16 * (register & 1) + 2 * (register >> 1)


@dataclass(frozen=True)
class Planes:
    """One order of the planes: ``place[q]`` = (word, bit) of contraction index q of a
    chunk; ``transposed``: the planes of W^T (dX, whose contraction is W's columns).
    Called by its layout, ``hslm_ptx.kernel.pitch.WPlanes`` (packed -> planes); ``problem`` scans planes as
    ``hslm_ptx.formats.ternary.code_problem`` scans the packed buffer, in W's own terms;
    ``packed`` undoes it."""

    name: str
    place: tuple[tuple[int, int], ...]
    transposed: bool = False

    def shape(self, dims: Dims) -> tuple[int, int]:
        """The planes' shape for ``dims`` (:func:`shape` of the kernel's contraction and
        output columns)."""
        return shape(dims.N, dims.K) if self.transposed else shape(dims.K, dims.N)

    def __call__(self, packed: Any, want: tuple[int, int]) -> Any:
        """A packed (N, Kp/16) buffer (numpy or CuPy) in planes of shape ``want``, zero
        past K and N: a gather of the codes into plane order and one pack."""
        xp = module_of(packed)
        count, width = want
        codes = codes_of(packed)  # (N, Kp): a row per column of W
        if self.transposed:
            codes = codes.T  # a row per in-feature: the kernel's columns
        rows, depth = codes.shape
        padded = xp.zeros((width // WORDS, count * CHUNK), dtype=xp.uint32)
        padded[:rows, :depth] = codes
        in_order = padded.reshape(-1, count, CHUNK)[:, :, xp.asarray(self._order())]  # (column, plane, 64)
        return words_of(in_order.transpose(1, 0, 2)).reshape(want)

    def packed(self, planes: Any, K: int, N: int) -> Any:
        """The packed (N, Kp/16) buffer of ``planes`` (a copy)."""
        return self._padded_packed(planes)[:N, :padded_k(K) // CODES_PER_WORD].copy()

    def problem(self, planes: Any, K: int, N: int) -> str | None:
        """``code_problem`` for planes: codes 3, and non-zero codes past K or N, named in
        W's own terms. One vectorised pass over the words (a code's two bits are
        neighbours here too, and the padding is a mask per plane and word plus the
        columns past the last); only a bad buffer pays for turning it back to locate."""
        xp = module_of(planes)
        depth, width = (N, K) if self.transposed else (K, N)
        count, columns = planes.shape[0], planes.shape[1] // WORDS
        by_column = planes.reshape(count, columns, WORDS)
        threes = by_column & (by_column >> 1) & xp.uint32(LOW_BITS)
        padding = by_column & ~xp.asarray(_real_bits(self.place, depth, count))[:, None, :]
        if not bool(threes.any() | padding.any() | by_column[:, width:].any()):
            return None
        return code_problem(self._padded_packed(planes), K, N)

    def _padded_packed(self, planes: Any) -> Any:
        """Every code of the planes (padding too) in W's packed layout."""
        xp = module_of(planes)
        count, width = planes.shape
        in_order = codes_of(planes).reshape(count, width // WORDS, CHUNK)  # (plane, column, 64) in plane order
        codes = xp.empty_like(in_order)
        codes[:, :, xp.asarray(self._order())] = in_order
        codes = codes.transpose(1, 0, 2).reshape(width // WORDS, count * CHUNK)  # kernel columns x contraction
        if self.transposed:
            codes = codes.T
        return words_of(xp.ascontiguousarray(codes))

    def _order(self) -> list[int]:
        """The contraction indices of a chunk in the order their codes sit in a column's 4
        words, least significant first: word by word, bit by bit."""
        return sorted(range(CHUNK), key=lambda q: self.place[q])


_FRAGMENT_PLACE = tuple(((q % 16) // 4, _bit(q // 16, q % 4)) for q in range(CHUNK))
FRAGMENTS = Planes("fragments", _FRAGMENT_PLACE)  # forward: Y = X W
FRAGMENTS_T = Planes("fragments_t", _FRAGMENT_PLACE, transposed=True)  # dX = dY W^T


def shape(contraction: int, columns: int) -> tuple[int, int]:
    """Shape of planes: a row of 4 words per column (``columns`` padded to 128) per 64 of
    the ``contraction`` (padded to 128)."""
    return (_round_up(contraction, ALIGN) // CHUNK, WORDS * _round_up(columns, ALIGN))


@functools.lru_cache(maxsize=64)
def _real_bits(place: tuple[tuple[int, int], ...], depth: int, count: int) -> np.ndarray:
    """(plane, word) -> the bits holding contraction indices below ``depth``."""
    bits = np.zeros((count, WORDS), dtype=np.uint32)
    for k in range(min(depth, count * CHUNK)):
        word, bit = place[k % CHUNK]
        bits[k // CHUNK, word] |= np.uint32(3 << bit)
    return bits


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
