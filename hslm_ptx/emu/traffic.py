"""Memory traffic of one launch, per PTX line, as the memory system would see it.

Each warp-level execution of a global or shared access (with at least one active
lane) is one *request*; the counts follow NVIDIA's documented model:

- Global (CUDA C++ Best Practices Guide, "Coalesced Access to Global Memory"; CUDA C++
  Programming Guide, "Compute Capabilities: Global Memory"): a request moves the
  distinct 32-byte *sectors* its active lanes touch; ``lines`` counts the distinct
  128-byte cache lines (L1 granularity). Every access here is aligned to its size
  (at most 16 bytes), so it lies in one sector.
- Shared (CUDA C++ Programming Guide, "Compute Capabilities: Shared Memory"): 32 banks
  of 4-byte words, word w in bank w % 32. Accesses of 4 bytes or less are served for
  the whole warp at once, 8-byte accesses per half-warp, 16-byte per quarter-warp
  (each such phase asks for at most 32 words). A phase costs as many *wavefronts* as
  the largest number of distinct words any one bank must deliver; lanes reading the
  same word share it (broadcast). The conflict-free minimum (``ideal_wavefronts``)
  is one per phase with an active lane.

The global addresses are the emulator's fake ones (each buffer's window is 4 GiB-aligned
and the buffer starts at its offset in a 256-byte aligned allocation, ``memory.py``),
so sector and line boundaries fall where a real allocation's do.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from hslm_ptx.emu.memory import take

FIELDS = ("requests", "bytes_used", "sectors", "lines", "wavefronts", "ideal_wavefronts")


class AccessStats(NamedTuple):
    """The traffic of one PTX line that accessed global or shared memory in a launch."""

    line: int              # PTX source line
    opcode: str            # "ld.global", "st.shared", ... (param accesses are not recorded)
    space: str             # "global" or "shared"
    in_loop: bool          # the line lies inside a loop body (backward branch target .. branch)
    requests: int          # warp-level executions with at least one active lane
    bytes_used: int        # bytes the active lanes asked for, summed over requests
    sectors: int           # global: distinct 32-byte sectors per request, summed (0 for shared)
    lines: int             # global: distinct 128-byte lines per request, summed (0 for shared)
    wavefronts: int        # shared: bank wavefronts per request, summed (0 for global)
    ideal_wavefronts: int  # shared: the conflict-free minimum for those requests


NONE = np.uint64(2 ** 64 - 1)      # an empty slot: no active lane asked for anything


def _distinct(rows: np.ndarray, partial: bool) -> int:
    """Distinct values per row (rows sorted, NONE last), summed over rows."""
    change = rows[:, 1:] != rows[:, :-1]
    if not partial:
        return rows.shape[0] + int(np.count_nonzero(change))
    valid = rows != NONE
    return int(np.count_nonzero(valid[:, 0]) + np.count_nonzero(change & valid[:, 1:]))


def global_counts(rows: np.ndarray, partial: bool) -> tuple[int, int]:
    """(sectors, lines) for rows of per-lane byte addresses, one row per warp
    (``partial``: some slots are NONE)."""
    sectors = rows >> np.uint64(5)
    if partial:
        sectors[rows == NONE] = NONE
    sectors.sort(axis=1)
    lines = sectors >> np.uint64(2)
    if partial:
        lines[sectors == NONE] = NONE
    return _distinct(sectors, partial), _distinct(lines, partial)


def shared_counts(rows: np.ndarray) -> tuple[int, int]:
    """(wavefronts, ideal) for rows of 32 requested word indices, one row per phase:
    per row, the most distinct words in one bank (1 when no two share a bank); and
    the rows with any request."""
    words = np.sort(rows, axis=1)
    unique = words != NONE
    unique[:, 1:] &= words[:, 1:] != words[:, :-1]
    asked = unique[:, 0]                                    # NONE sorts last
    bit = np.where(unique, np.uint64(1) << (words & np.uint64(31)), np.uint64(0))
    clash = bit.sum(1) != np.bitwise_or.reduce(bit, axis=1)  # two words in one bank
    waves = int(np.count_nonzero(asked & ~clash))
    if clash.any():
        words, unique = words[clash], unique[clash]
        bank = (words & np.uint64(31)).astype(np.int64) + np.arange(0, words.size, 32)[:, None]
        waves += int(np.bincount(bank[unique], minlength=words.size).reshape(-1, 32).max(1).sum())
    return waves, int(np.count_nonzero(asked))


class Traffic:
    """Accumulates the counts of every access of one launch, per PTX line.

    ``warps``/``lanes``: each thread's warp id and lane. An access's addresses are laid
    out in a grid of one row of 32 lanes per warp (empty slots ``NONE``), so every
    count is a row-wise sort and a few passes, never a Python loop.
    """

    def __init__(self, warps: np.ndarray, lanes: np.ndarray):
        self.by_line: dict[int, tuple[str, str, np.ndarray]] = {}
        self.seen: dict[tuple, tuple] = {}     # (line, addr[0] % 128, n) -> last pattern
        self.bind(warps, lanes)

    def bind(self, warps: np.ndarray, lanes: np.ndarray) -> None:
        """Count the accesses of the threads ``warps``/``lanes`` describe from now on (the
        next CTA group of the launch); the counts so far are kept."""
        self.warps, self.lanes = warps, lanes
        self.nwarps = int(warps[-1]) + 1
        self.dense = warps.size == 32 * self.nwarps        # no partial warps: reshape only
        self.slots = warps.astype(np.int64) * 32 + lanes

    def _grid(self, threads: np.ndarray, values: np.ndarray, partial: bool) -> np.ndarray:
        """``values`` ([threads, k]) at lane slots: rows of 32 (k rows per warp)."""
        k = values.shape[1]
        if not partial:
            return values.reshape(-1, 32)
        grid = np.full((self.nwarps * 32, k), NONE)
        grid[self.slots[threads]] = values
        return grid.reshape(-1, 32)

    @staticmethod
    def _rows(grid: np.ndarray, partial: bool) -> tuple[np.ndarray, bool]:
        """The rows of ``grid`` with an active lane (a row of empty slots counts nothing),
        and whether any of them still has an empty slot."""
        if not partial:
            return grid, False
        asked = grid != NONE
        rows = np.flatnonzero(asked.any(1))
        grid = take(grid, rows)
        return grid, not bool(asked[rows].all())

    def record(self, line: int, opcode: str, space: str, addr: np.ndarray,
               threads: np.ndarray, size: int) -> None:
        """One execution of ``line`` by ``threads`` (increasing) at ``addr``, ``size``
        bytes each."""
        if threads.size == 0:
            return
        full = threads.size == self.warps.size
        # Counts only change with the pattern: the same threads at the same addresses
        # shifted by a multiple of 128 bytes (a loop's next trip) give the same counts.
        key = (line, int(addr[0]) & 127, threads.size)
        pattern = addr - addr[0]
        seen = self.seen.get(key)
        if seen is not None and np.array_equal(seen[0], pattern) and \
                (full or np.array_equal(seen[1], threads)):
            counts = seen[2]
        else:
            counts = self._count(space, addr, threads, size, full)
            self.seen[key] = (pattern, threads, counts)
        total = self.by_line.setdefault(line, (opcode, space, np.zeros(len(FIELDS), np.int64)))[2]
        total += counts

    def _count(self, space: str, addr: np.ndarray, threads: np.ndarray, size: int,
               full: bool) -> np.ndarray:
        counts = np.zeros(len(FIELDS), np.int64)
        if full:
            counts[0] = self.nwarps
        else:
            warps = self.warps[threads]
            counts[0] = 1 + np.count_nonzero(warps[1:] != warps[:-1])
        counts[1] = threads.size * size
        partial = not (full and self.dense)
        if space == "global":               # an aligned access of <= 16 bytes: one sector
            grid, partial = self._rows(self._grid(threads, addr[:, None], partial), partial)
            counts[2:4] = global_counts(grid, partial)
        else:          # k words per lane: 1 (<= 4 bytes), 2 (half-warp phases), 4 (quarter)
            k = max(1, size // 4)
            words = (addr >> np.uint64(2))[:, None] + np.arange(k, dtype=np.uint64)
            grid, partial = self._rows(self._grid(threads, words, partial), partial)
            counts[4:6] = shared_counts(grid)
        return counts

    def stats(self, in_loop: set[int]) -> tuple[AccessStats, ...]:
        return tuple(AccessStats(line, opcode, space, line in in_loop, *map(int, counts))
                     for line, (opcode, space, counts) in sorted(self.by_line.items()))


def loop_lines(lines: list[int], branches: list[tuple[int, int]]) -> set[int]:
    """Lines inside a loop body: from a backward branch's target to the branch.

    ``lines``: the line of each PC; ``branches``: (branch PC, target PC) pairs."""
    inside: set[int] = set()
    for pc, target in branches:
        if target <= pc:
            inside.update(lines[target:pc + 1])
    return inside
