"""W as the ternary kernels read it: packed words rearranged into planes.

Plane p holds in-features 64p .. 64p + 63 (one 64-deep chunk of the contraction) of every
column, 4 words a column, columns side by side; K and N are padded to 128 with zero codes
(a CTA tile is 128 wide either way), so no fetch needs a bound or a clamp. A chunk's
words of neighbouring columns are neighbouring 16-byte pieces, so a warp's W request reads
whole 32-byte sectors; in the packed order (``kernels/ternary.py``) a column's 16 bytes of
a chunk sit 4 Kp bytes from the next column's, half a sector each.

Within a column's 4 words an in-feature q of the chunk has a place (word, s, u): word
``w`` is what one thread loads, ``s`` is which of the 4 registers the decode makes of it
(``kernels.ptx_emit.decode_ternary``) and ``u`` the byte in that register. The code sits at
bit 4u + 16 (s & 1) + 2 (s >> 1) of the word, so one mask with 0x33333333 leaves the
codes of registers 0 and 1 as prmt selector nibbles and the same mask after a shift by 2
those of registers 2 and 3. Two orders:

- ``ROWS`` (dX): word w = in-features 16w .. 16w + 15 of the chunk, register s = 4
  consecutive of them: a decoded word is one 16-byte piece of a k-major B row;
- ``FRAGMENTS`` (forward): word t = the in-features lane t of an mma quad holds as B,
  16s + 4t + u, register s = its b0 / b1 of k step s // 2: a decoded word is the lane's
  four B fragment registers of one n8 tile, no shared memory between.

A code's two bits stay neighbours, so the code-3 test of the packed layout applies as it is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels.ternary import CODES_PER_WORD, code_problem, padded_k
from kernels.validate import module_of

CHUNK = 64  # in-features a plane holds of each column
WORDS = CHUNK // CODES_PER_WORD  # words a column has in a plane
ALIGN = 128  # K and N of the planes are padded to this


def _bit(register: int, byte: int) -> int:
    """Bit of the code the decode turns into byte ``byte`` of register ``register``."""
    return 4 * byte + 16 * (register & 1) + 2 * (register >> 1)


@dataclass(frozen=True)
class Planes:
    """One order of the planes: ``place[q]`` = (word, bit) of in-feature q of a chunk.
    Called as launch's ``prepare`` (packed -> planes); ``problem`` scans planes as
    ``kernels.ternary.code_problem`` scans the packed buffer; ``packed`` undoes it."""

    name: str
    place: tuple[tuple[int, int], ...]

    def __call__(self, packed: Any, want: tuple[int, int]) -> Any:
        """A packed (N, Kp/16) buffer (numpy or CuPy) in planes of shape ``want``
        (:func:`shape`), zero past K and N: one pass over the codes."""
        xp = module_of(packed)
        count, width = want
        N, words = packed.shape
        codes = xp.zeros((N, count * CHUNK), dtype=xp.uint32)
        codes[:, :words * CODES_PER_WORD] = _codes(packed)
        codes = codes.reshape(N, count, CHUNK)
        out = xp.zeros((count, width // WORDS, WORDS), dtype=xp.uint32)
        for word in range(WORDS):
            qs = [q for q, (w, _) in enumerate(self.place) if w == word]
            bits = xp.asarray([self.place[q][1] for q in qs], dtype=xp.uint32)
            out[:, :N, word] = (codes[:, :, qs] << bits).sum(axis=2, dtype=xp.uint32).T
        return out.reshape(want)

    def packed(self, planes: Any, K: int, N: int) -> Any:
        """The packed (N, Kp/16) buffer of ``planes`` (a copy)."""
        return self._by_column(planes)[:N, :padded_k(K) // CODES_PER_WORD].copy()

    def problem(self, planes: Any, K: int, N: int) -> str | None:
        """``code_problem`` for planes: codes 3, and non-zero codes past K or N."""
        return code_problem(self._by_column(planes), K, N)

    def _by_column(self, planes: Any) -> Any:
        """Every column of the planes (padding too) as a packed row of words."""
        xp = module_of(planes)
        count, width = planes.shape
        by_plane = planes.reshape(count, width // WORDS, WORDS)
        words = xp.asarray([w for w, _ in self.place])
        bits = xp.asarray([b for _, b in self.place], dtype=xp.uint32)
        codes = (by_plane[:, :, words] >> bits) & xp.uint32(3)  # (plane, column, q)
        codes = xp.ascontiguousarray(codes.transpose(1, 0, 2)).reshape(width // WORDS, -1, CODES_PER_WORD)
        return (codes << xp.asarray(2 * np.arange(CODES_PER_WORD), dtype=xp.uint32)).sum(axis=2, dtype=xp.uint32)


ROWS = Planes("rows", tuple((q // 16, _bit((q % 16) // 4, q % 4)) for q in range(CHUNK)))
FRAGMENTS = Planes("fragments", tuple(((q % 16) // 4, _bit(q // 16, q % 4)) for q in range(CHUNK)))


def shape(K: int, N: int) -> tuple[int, int]:
    """Shape of W in planes: a row of 4 words per column (N padded to 128) per 64
    in-features (K padded to 128)."""
    return (_round_up(K, ALIGN) // CHUNK, WORDS * _round_up(N, ALIGN))


def _codes(packed: Any) -> Any:
    """The 2-bit codes of a packed buffer, (N, Kp), column j's in row j."""
    xp = module_of(packed)
    shifts = xp.asarray(2 * np.arange(CODES_PER_WORD), dtype=xp.uint32)
    return ((packed[:, :, None] >> shifts) & xp.uint32(3)).reshape(packed.shape[0], -1)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
