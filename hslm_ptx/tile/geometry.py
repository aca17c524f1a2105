"""The staged CTA tile's shape: a CTA of ``warps_m`` x ``warps_n`` warps computes a
(16 warps_m m_tiles) x 128 tile of D (:class:`Tile`; the large one: 8 warps, 128 x 128,
each warp a 64 x 32 block of four m16 x four n8 ``mma.m16n8k32`` accumulators, so a
fragment load serves 4 mma); the contraction runs in chunks of 64 bytes of k. Every
other part of the tile (the rule, the operands, the loop, the epilogue) is sized from
these constants and the :class:`Tile`, the launch grid (:func:`geometry`) and the entry
(:func:`begin`, :func:`entry_name`).
"""
from __future__ import annotations

from typing import NamedTuple

from hslm_ptx.emit.ptx import Ptx
from hslm_ptx.kernel.spec import Launch, Param

TILE_N = 128  # every configuration is TILE_N columns wide
CHUNK_K = 64  # bytes of k per chunk: two k32 mma steps
PIECE = 16  # bytes per cp.async and per ldmatrix row
PIECES = CHUNK_K // PIECE
STAGE_BYTES = TILE_N * CHUNK_K  # the least stride of a ring stage (hslm_ptx.tile.operands.Ring)
SHARED_ALIGN = 128  # swizzled addresses flip bit 5 with xor: the base keeps bits 0-6 clear


class Tile(NamedTuple):
    """One CTA configuration: ``warps_m`` x ``warps_n`` warps, each ``m_tiles`` m16 tiles
    by ``n_tiles`` n8 tiles, so the CTA computes (16 warps_m m_tiles) x TILE_N of D, with
    a copy ring of ``stages`` chunks. A small M wastes fewer rows of a short batch (R =
    27) and gives the grid more CTAs; a large M reuses each decoded B chunk and each B
    fragment across more rows. More warps along N split a short tile's chunk among more
    warps (each its own columns, its own W words to decode), so that two warps share a
    scheduler and issue in each other's stalls."""

    warps_m: int
    m_tiles: int
    stages: int = 4  # chunks in the ring; a power of two wraps with an and
    # CTAs an SM must hold at once, stated to ptxas as .minnctapersm (PTX ISA 11.4): 2 CTAs
    # of 256 threads cap it at the build's 128 registers a thread (65536 per SM); 1 leaves
    # the allocation to ptxas
    min_ctas: int = 1
    warps_n: int = 4  # warps along N, each TILE_N / warps_n columns: 4 (32) or 8 (16)

    @property
    def warp_cols(self) -> int:
        """Columns of D a warp holds."""
        return TILE_N // self.warps_n

    @property
    def n_tiles(self) -> int:
        """n8 tiles a warp holds."""
        return self.warp_cols // 8

    @property
    def warps(self) -> int:
        return self.warps_m * self.warps_n

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def warp_m(self) -> int:
        return 16 * self.m_tiles

    @property
    def m(self) -> int:
        return self.warps_m * self.warp_m

    @property
    def rows_per_pass(self) -> int:
        """Rows one pass of all threads' 16-byte pieces covers."""
        return self.threads // PIECES

    def copies(self, rows: int) -> int:
        """16-byte copies per thread per chunk for an operand of ``rows`` tile rows (at least
        one: where the CTA has more threads than the operand has pieces, the threads past
        them copy nothing, ``copying_threads``)."""
        return max(1, rows * PIECES // self.threads)

    @property
    def rows_read_back(self) -> int:
        """Rows of a staged pass of the output (m tile ``mi`` of every warp row: 16 warps_m)
        that each warp reads back (``hslm_ptx.tile.epilogue.Epilogue``)."""
        return 16 * self.warps_m // self.warps

    def copying_threads(self, rows: int) -> int:
        """Threads that copy an operand of ``rows`` tile rows: all, or one per 16-byte piece."""
        return min(self.threads, rows * PIECES)

    @property
    def label(self) -> str:
        return f"{self.m}x{TILE_N}" + ("" if self.warps_n == 4 else f"n{self.warp_cols}")


LARGE = Tile(warps_m=2, m_tiles=4, min_ctas=2)  # 128 x 128, 8 warps of 64 x 32: 64 accumulators a thread
SMALL = Tile(warps_m=1, m_tiles=2)  # 32 x 128, 4 warps of 32 x 32
NARROW = Tile(warps_m=1, m_tiles=2, warps_n=8)  # 32 x 128, 8 warps of 32 x 16: 2 warps a scheduler
MID = Tile(warps_m=2, m_tiles=2)  # 64 x 128, 8 warps of 32 x 32
# 16 x 128, 8 warps of 16 x 16 (dW): half NARROW's output a CTA, so where the contraction is
# one chunk (R = 27) and the output is large, twice the CTAs each write half the epilogue
SHORT = Tile(warps_m=1, m_tiles=1, warps_n=8)
# 256 x 128, 16 warps of 64 x 32 (dW): a third fewer L2 bytes a multiply-add than 128 x 128
# where both operands are int8 rows; 512 threads cap it at 128 registers; two stages of
# 256 + 128 rows fill the 48 KiB
TALL = Tile(warps_m=4, m_tiles=4, stages=2)


class Plan(NamedTuple):
    """How a launch covers the contraction: ``splits`` CTAs along grid z, each over
    ``span`` bytes of k (a whole number of chunks; the last split may get fewer)."""

    splits: int
    span: int


def output_tiles(rows: int, cols: int, tile: Tile) -> tuple[int, int]:
    """CTA tiles across a rows x cols output: (along columns, along rows), grid x and y."""
    return -(-cols // TILE_N), -(-rows // tile.m)


def geometry(rows: int, cols: int, plan: Plan, tile: Tile) -> Launch:
    """Grid over a rows x cols output: x walks columns (TILE_N), y walks rows (tile.m),
    z the contraction's splits."""
    return Launch(grid=(*output_tiles(rows, cols, tile), plan.splits), block=(tile.threads, 1, 1))



def entry_name(family: str, tile: Tile) -> str:
    """The PTX entry of ``family`` on ``tile``: the family's name for the large tile, a
    suffix with the tile's M otherwise (hslm_fwd_s8_m32), and with a warp's columns where
    they are not 32 (hslm_fwd_s8_m32n16)."""
    if tile.m == LARGE.m:
        return family
    return f"{family}_m{tile.m}" + ("" if tile.warps_n == 4 else f"n{tile.warp_cols}")



def begin(name: str, params: tuple[Param, ...], tile: Tile) -> tuple[Ptx, dict[str, str]]:
    """A kernel entry of ``tile.threads`` per CTA with its parameters loaded (buffers as global
    pointers, sizes and pitches as u32)."""
    ptx = Ptx(name, [(p.name, "u32" if p.is_scalar else "u64") for p in params], tile.threads,
              min_ctas=tile.min_ctas)
    return ptx, {p.name: ptx.param_u32(p.name) if p.is_scalar else ptx.param_ptr(p.name) for p in params}

