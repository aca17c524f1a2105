"""The staged tile's operand sources: what the chunk loop (``hslm_ptx.tile.mainloop``)
calls to bring A and B into the mma's fragment registers.

- Staged operands sit in shared memory as rows of one chunk (64 bytes = four 16-byte
  pieces), piece p of row r stored at piece ``p ^ ((r >> 1) & 3)``: the 8 rows one
  ``ldmatrix`` phase reads (and the 8 pieces one 16-byte store phase writes) fall into 8
  different 16-byte bank groups, so neither conflicts. Rows 8 apart keep the same
  swizzle, so fragment tiles 8 or 16 rows apart are immediate offsets;
- fragments come from ``ldmatrix.x4`` (PTX ISA 9.7.14.5.15): for A (row-major [m][k])
  lane l addresses row (l & 7) + 8((l >> 3) & 1) at piece 2s + (l >> 4), which gives
  exactly the m16n8k32 A fragment of k step s; for B stored [n][k] lane l addresses
  row l & 7 at piece l >> 3, which gives the B fragments of one n8 tile for both k steps;
- A (activations, int8 rows with a 16-byte aligned pitch, ``hslm_ptx/kernel/pitch.py``) is
  copied global -> shared with 16-byte ``cp.async.cg`` into a ring of ``stages`` chunks,
  ``stages - 1`` chunks ahead of the one being multiplied (:class:`StagedRows`). Tails
  need no separate code: a copy's src-size is the bytes left in its row (0 past the last
  row or past K), the rest of the 16 bytes is zero-filled by the copy and never read;
- one ring (:class:`Ring`) holds both operands: a stage is A's ``tile.m`` rows of the
  chunk, then B's share of it, so one offset walks both and the epilogue has the whole
  ring to stage the sums in;
- B is either staged the same way (dW: dYq^T rows, after A's in the stage) or packed
  ternary W (:class:`FragmentTernary`, forward and dX): each lane needs one u32 per n8
  tile of a chunk from W's planes (``hslm_ptx/formats/planes.py``), decoded with ``prmt`` on
  0x00FF0100 into its B fragment registers; the words are copied through the ring
  (``stages - 1`` chunks ahead, once per CTA: the warps of one column of warps share
  them).

- A may instead be floats the CTA quantizes as it stages them (:class:`QuantizedRows`:
  x's or dY's rows, a scale a row; :class:`QuantizedColumns`: dY's columns, a scale a
  column over all R rows), a scales pass first, then each chunk's codes stored where the
  copies would have landed.

:class:`Source` is the interface the loop and the epilogue call on B.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterator

from hslm_ptx.reference import stepmath
from hslm_ptx.emit.ptx import TERNARY_PRMT_TABLE, Ptx, decode_ternary
from hslm_ptx.formats.floats import ELEMENT_BYTES
from hslm_ptx.emit.stepforms import (int8_code, load_f32, pack_bytes, partials_beta, plane_word, scale_of_absmax,
                                     ternary_threshold, threshold_code, warp_max)
from hslm_ptx.tile.geometry import CHUNK_K, PIECE, PIECES, SHARED_ALIGN, STAGE_BYTES, TILE_N, Tile

class Ring:
    """The CTA's copy ring: ``tile.stages`` stages, each A's ``tile.m`` rows of a chunk
    (64 bytes each) followed by ``share`` bytes that B keeps there (its rows, or W's
    words), at least ``STAGE_BYTES``: the 32-row forward and dX tiles keep the 8 KiB
    stages (a ring of 4 that wraps with an and) their loops were scheduled and counted on.
    ``share_at`` is where B's share starts in a stage, ``base`` the ring's address
    register, declared where an operand first asks for it (``share_base``: B's share of
    stage 0); the epilogue stages the sums in the whole ring."""

    def __init__(self, ptx: Ptx, tile: Tile, share: int):
        self.ptx = ptx
        self.share_at = tile.m * CHUNK_K
        self.stage_bytes = max(STAGE_BYTES, -(-self.copied(tile, share) // SHARED_ALIGN) * SHARED_ALIGN)
        self.bytes = tile.stages * self.stage_bytes
        self._base: str | None = None

    @staticmethod
    def copied(tile: Tile, share: int) -> int:
        """The bytes a CTA copies into a stage, A's rows and B's share (the cost model's L2
        bytes a chunk, ``KernelSpec.chunk_bytes``)."""
        return tile.m * CHUNK_K + share

    @property
    def base(self) -> str:
        if self._base is None:
            self._base = self.ptx.shared_array("ring", self.bytes, SHARED_ALIGN)
        return self._base

    def share_base(self) -> str:
        """The address of B's share of the ring's first stage."""
        return self.ptx.add(self.base, self.share_at)

    def step(self, offset: str, steps: int, into: str | None = None) -> str:
        """``offset`` + ``steps`` stages, wrapped in the ring (an and when its size is a
        power of 2)."""
        ptx = self.ptx
        moved = ptx.add(offset, steps * self.stage_bytes)
        if self.bytes & (self.bytes - 1) == 0:
            wrapped = ptx.band(moved, self.bytes - 1)
        else:
            wrapped = ptx.selp(ptx.sub(moved, self.bytes), moved, ptx.setp("ge", moved, self.bytes, "u32"))
        if into is not None:
            ptx.ins("mov.b32", into, wrapped)
        return wrapped


def swizzled(ptx: Ptx, row: str, piece: str) -> str:
    """Byte offset of 16-byte piece ``piece`` of chunk row ``row``."""
    flip = ptx.band(ptx.shr(row, 1), PIECES - 1)
    return ptx.mad(row, CHUNK_K, ptx.shl(ptx.binop("xor", piece, flip, "b32"), 4))


class Coords:
    """This thread's place in the CTA and the launch (b32 registers) for ``tile``;
    ``span`` is the kernel's parameter of k bytes per split (Plan.span)."""

    def __init__(self, ptx: Ptx, span: str, tile: Tile):
        self.tile = tile
        self.tid = ptx.special("%tid.x")
        self.lane = ptx.band(self.tid, 31)
        warp = ptx.shr(self.tid, 5)
        self.warp_m = ptx.band(warp, tile.warps_m - 1)
        self.warp_n = ptx.shr(warp, tile.warps_m.bit_length() - 1)
        self.m_base = ptx.mul(ptx.special("%ctaid.y"), tile.m)  # first D row of the CTA
        self.n_base = ptx.mul(ptx.special("%ctaid.x"), TILE_N)  # first D column of the CTA
        self.span = span
        self.k_first = ptx.mul(ptx.special("%ctaid.z"), span)  # first k of this CTA's split


class Source(ABC):
    """The B operand as the chunk loop (``mainloop.emit_staged``) and the epilogue
    (``epilogue.Epilogue``) call it; :class:`StagedRows` (also the A operand) and
    :class:`FragmentTernary` implement it.

    Per chunk the loop calls, after the barrier, ``b_fragments`` of the stage being
    multiplied (B only) and the mma, then ``issue`` on A and B into the stage ``stages -
    1`` ahead, with the chunk's first k byte (one register for the CTA, which the loop
    steps and tests); ``issue`` also fills the ring's first ``stages - 1`` stages before
    the loop. Where a source's copies past K need tail arithmetic (``exact_tail``) the
    loop runs the whole chunks apart. The epilogue places a lane's accumulators by
    ``col_first`` (the D column of this lane's c0, a b32 register) and ``col_offset``.

    The A operand is a :class:`StagedRows`: besides these hooks the loop reads its
    ``a_fragments`` and its ``ring`` (which the epilogue reuses to stage the sums)."""

    col_first: str
    exact_tail = False  # its copies of a chunk that reaches past K need tail arithmetic
    addressed_by_k = False  # a copy's source address is one multiply-add off the chunk's k

    @abstractmethod
    def issue(self, stage_offset: str | int, k: str, whole: bool = False) -> None:
        """Start copying the next chunk, whose first k byte is ``k`` (the same for the whole
        CTA), into the ring stage at ``stage_offset`` (``whole``: the chunk is known to end
        at or before K)."""

    @abstractmethod
    def b_fragments(self, stage_offset: str) -> list[list[list[str]]]:
        """The chunk's B fragments in the ring stage at ``stage_offset``: [k step][n tile]
        -> the tile's two B registers of the m16n8k32 mma."""

    @staticmethod
    @abstractmethod
    def col_offset(tile: int, e: int) -> int:
        """D column of fragment element (n tile ``tile``, c_e) past ``col_first``."""


def nk_fragments(ptx: Ptx, read_at: str, n_tiles: int) -> list[list[list[str]]]:
    """B fragments from a swizzled [n][k] tile: lane l reads row l & 7 of each of a warp's
    ``n_tiles`` n8 tiles at piece l >> 3 with one ``ldmatrix.x4``, the tile's B registers
    for both k steps. Returns [k step][n tile] -> two registers."""
    tiles = [ptx.ldmatrix_x4(read_at, ni * 8 * CHUNK_K) for ni in range(n_tiles)]
    return [[regs[2 * step:2 * step + 2] for regs in tiles] for step in range(2)]


def nk_read_offset(ptx: Ptx, at: Coords) -> str:
    return swizzled(ptx, ptx.mad(at.warp_n, at.tile.warp_cols, ptx.band(at.lane, 7)), ptx.shr(at.lane, 3))


def paired_columns(ptx: Ptx, at: Coords) -> str:
    """D column of this lane's c0 when n tiles 2p and 2p + 1 interleave in pairs of
    columns: lane (g, t) holds columns 16p + 4t .. 16p + 4t + 3 of its row, one
    st.shared.v4 when the output is staged (``Epilogue``)."""
    return ptx.add(ptx.mad(at.warp_n, at.tile.warp_cols, ptx.shl(ptx.band(at.lane, 3), 2)), at.n_base)


def paired_column_of_row(ptx: Ptx, row: str) -> str:
    """The D column (past n_base) that [n][k] B row ``row`` holds so that its fragments
    land as ``paired_columns`` says: row 8 tile + n of a warp's 32 is column
    16 (tile >> 1) + 4 (n >> 1) + 2 (tile & 1) + (n & 1), i.e. bits 3, 2, 1 of the row
    move to bits 1, 3, 2."""
    kept = ptx.band(row, ~0b1110 & 0xFFFFFFFF)
    return ptx.binop("or", ptx.binop("or", kept, ptx.shl(ptx.band(row, 0b0110), 1), "b32"),
                     ptx.band(ptx.shr(row, 2), 0b0010), "b32")


class StagedRows(Source):
    """int8 rows [m][k] (``pitch`` bytes apart) copied into the CTA's :class:`Ring`, as A
    (``b=False``: its rows start each stage) or as B stored [n][k] (``b=True``: its rows
    are B's share of each stage; B row r holds column ``paired_column_of_row(r)``).
    ``B_SHARE``: the bytes of a stage B's rows take, a chunk of TILE_N rows.

    Thread ``tid`` copies piece ``tid & 3`` of rows ``tid >> 2`` + P j, P = threads / 4
    (``tile.rows_per_pass``), for j < ``tile.copies(rows)``: the P rows of one j are
    64 P bytes of the stage, an immediate apart. Rows past the last
    are zero-filled. Along k, by default a piece is copied whole while it starts inside
    the row (k < K) and zero-filled after (ignore-src): bytes from K to the end of the
    row's last piece are the caller's padding, read as they are, so the other operand
    must be zero there (W's planes are: padded with code 0 to a multiple of 128). With
    ``exact_tail`` the copy's src-size stops at K and the padding is
    never read (a few more instructions per copy), in the chunks that reach past K
    only: a chunk that ends at or before K is copied as whole pieces, and
    ``emit_staged`` runs those chunks in a loop of their own.
    """

    B_SHARE = TILE_N * CHUNK_K

    def __init__(self, ptx: Ptx, at: Coords, ring: Ring, ptr: str, pitch: str, rows: str, k_limit: str,
                 b: bool = False, exact_tail: bool = False):
        self.ptx, self.b, self.exact_tail, self.ring = ptx, b, exact_tail, ring
        tile = at.tile
        self.m_tiles, self.n_tiles, self.step_rows = tile.m_tiles, tile.n_tiles, tile.rows_per_pass
        row, piece = ptx.shr(at.tid, 2), ptx.band(at.tid, PIECES - 1)
        base = ring.share_base() if b else ring.base  # where this operand's rows start
        self.copy_at = ptx.add(base, swizzled(ptx, row, piece))
        first = ptx.add(at.n_base, paired_column_of_row(ptx, row)) if b else ptx.add(at.m_base, row)
        tile_rows = TILE_N if b else tile.m
        rows_j = [ptx.add(first, self.step_rows * j) for j in range(tile.copies(tile_rows))]
        self.row, self.piece, self.rows_j = row, piece, rows_j
        # a CTA with more threads than the operand has 16-byte pieces (32 rows, 8 warps):
        # the threads past them copy nothing (their rows would land on other data)
        copying = tile.copying_threads(tile_rows)
        self.copier = ptx.setp("lt", at.tid, copying, "u32") if copying < tile.threads else None
        # each copy's row start stays put; the byte of k this thread's piece starts at
        # walks a chunk per issue and is also the test for pieces past K
        self.rows_at = [ptx.byte_offset(ptr, r, pitch) for r in rows_j]
        self.fill_from: list[str] = []  # the ring fill's sources (stage 0's), set by its first issue
        self.k_at = ptx.mad(piece, PIECE, at.k_first)
        self.k_limit = k_limit
        # exact tail: src-size = bytes left while the row exists; else ignore-src past it
        self.row_test = [ptx.setp("lt" if exact_tail else "ge", r, rows, "u32") for r in rows_j]
        if exact_tail:  # a whole chunk: ignore-src for a row past the last, no src-size
            self.row_past = [ptx.setp("ge", r, rows, "u32") for r in rows_j]
        if b:
            self.read_at = ptx.add(base, nk_read_offset(ptx, at))
            self.col_first = paired_columns(ptx, at)
        else:  # ldmatrix rows (l & 7) + 8 ((l >> 3) & 1) = l & 15 of each m16 tile, piece l >> 4
            read_row = ptx.mad(at.warp_m, tile.warp_m, ptx.band(at.lane, 15))
            self.read_at = ptx.add(base, swizzled(ptx, read_row, ptx.shr(at.lane, 4)))

    @staticmethod
    def col_offset(tile: int, e: int) -> int:
        """As B: D column of fragment element (tile, c_e) past ``col_first`` (4t), B's rows
        in ``paired_column_of_row`` order: 16 (tile >> 1) + 2 (tile & 1) + e."""
        return 16 * (tile >> 1) + 2 * (tile & 1) + e

    def issue(self, stage_offset: str | int, k: str, whole: bool = False) -> None:
        """Copy this thread's pieces of the chunk at ``k`` into the stage at
        ``stage_offset``. The thread walks its own piece's k (``k_at`` = k + 16 (tid & 3),
        stepped here): its address from ``k`` instead would take as many instructions, and
        ptxas 12.9 (sm_90) schedules the forward and dX loops 6-24 stall clocks a trip
        longer. The ring's fill reads stage s at an immediate offset from stage 0's
        address."""
        ptx = self.ptx
        dst = self.copy_at if stage_offset == 0 else ptx.add(self.copy_at, stage_offset)
        if self.exact_tail and whole:
            fills = self.row_past
        elif self.exact_tail:
            left = ptx.sub(self.k_limit, self.k_at)  # row bytes from this piece on
            size = ptx.binop("min", ptx.binop("max", left, 0, "s32"), PIECE, "s32")
            fills = [ptx.selp(size, 0, ok) for ok in self.row_test]
        else:
            past_k = ptx.setp("ge", self.k_at, self.k_limit, "u32")
            fills = [ptx.fresh("pred", "or.pred", past_k, out) for out in self.row_test]
        if isinstance(stage_offset, int):  # the ring's fill: stage s reads s chunks past the first
            if stage_offset == 0:
                self.fill_from = [ptx.byte_offset(row_at, self.k_at, 1) for row_at in self.rows_at]
            sources, src_offset = self.fill_from, stage_offset // self.ring.stage_bytes * CHUNK_K
        else:
            sources, src_offset = [ptx.byte_offset(row_at, self.k_at, 1) for row_at in self.rows_at], 0
        for j, fill in enumerate(fills):
            ptx.cp_async(dst, sources[j], fill, dst_offset=j * self.step_rows * CHUNK_K, src_offset=src_offset,
                         guard=self.copier)
        ptx.increment(self.k_at, CHUNK_K)

    def a_fragments(self, stage_offset: str):
        """Per k step (loaded when the loop asks for it): [m tile] -> the four A registers."""
        ptx = self.ptx
        low = ptx.add(self.read_at, stage_offset)
        high = ptx.binop("xor", low, 2 * PIECE, "b32")  # piece 2 + (l >> 4): bit 5 flips
        for base in (low, high):
            yield [ptx.ldmatrix_x4(base, mi * 16 * CHUNK_K) for mi in range(self.m_tiles)]

    def b_fragments(self, stage_offset: str) -> list[list[list[str]]]:
        return nk_fragments(self.ptx, self.ptx.add(self.read_at, stage_offset), self.n_tiles)


class FragmentTernary(Source):
    """B[k][n] = ternary W decoded straight into the mma's B fragments (forward: B = W, k =
    in-feature, n = out-feature; dX: B = W^T); only the packed words pass through shared
    memory, never the decoded codes.

    An m16n8k32 B fragment gives lane (g, t) column g of the n8 tile and k = 4t .. 4t + 3
    (b0) and 16 + 4t .. 16 + 4t + 3 (b1) of a k step (PTX ISA, mma.m16n8k32 fragments for
    .s8); over a chunk's two steps that is 16 codes of one column, exactly one word of W's
    ``FRAGMENTS`` planes (``hslm_ptx/formats/planes.py``), whose decode gives the four registers in
    order. So each lane needs one word per n tile a chunk, immediate offsets apart from
    one address: its words in plane 0 plus the chunk's k x (columns / 4), a plane being
    16 bytes a column per 64 bytes of k (one multiply-add a chunk, no pointer carried
    from trip to trip). Tile ni, row g of a warp holds column
    ``paired_column_of_row(8 ni + g)``, so the epilogue's stores from registers work as
    for a staged B, and a warp's request is 8 columns' 16 bytes in pairs: 4 whole
    sectors.

    The words come through the ring (:class:`Ring`, ``SHARE`` bytes a stage: a chunk's
    words of the CTA's TILE_N columns): each lane of the first row of warps copies its
    words with 4-byte ``cp.async.ca`` into its own 16 bytes of the stage, in the same
    commit groups as A, so they land ``stages - 1`` chunks ahead like A and W's L2 round
    trip is off the chunk's chain; after the barrier, one ``ld.shared.v4`` gives each
    lane of every warp row its column's words back. So each word crosses L2 once per CTA
    (on the 128 x 128 tile, loaded straight into each warp's registers, it crossed twice:
    2 KiB more a chunk beside A's 8). A chunk that starts at or past K ignores its
    source (zero-fill): one compare of the CTA's k, which the loop shares.

    Every warp decodes its own words (the two warp rows of an n quarter the same ones).
    A word's decode is 9 SASS instructions (a shift, two masks, two shifts, four prmt).
    Warps cannot share registers (a shuffle stays inside a warp), so sharing the decode
    means shared memory: 8 KiB of decoded B written and read a chunk; counted on the
    H200 (132 SMs, mma.sync at 70% of the int8 peak, one wavefront a clock), a chunk of
    the large tile is tensor-bound (366 clocks of multiply-adds, 320 shared wavefronts,
    212 clocks of issue), and the 128 wavefronts sharing adds would make shared memory
    the bound to save issue that is not."""

    SHARE = 16 * TILE_N  # bytes of a stage: a word per n tile of each column's lanes
    addressed_by_k = True

    def __init__(self, ptx: Ptx, at: Coords, ring: Ring, w_ptr: str, cols: str, k_limit: str):
        self.ptx = ptx
        tile = at.tile
        group, quad = ptx.shr(at.lane, 2), ptx.band(at.lane, 3)
        # a plane is 16 bytes a column, 64 bytes of k: so a plane's start is k x (columns / 4)
        self.per_k = ptx.shr(ptx.round_up(cols, TILE_N), 2)
        first = ptx.add(at.n_base, paired_column_of_row(ptx, ptx.mad(at.warp_n, tile.warp_cols, group)))
        self.words = ptx.byte_offset(w_ptr, ptx.mad(first, PIECES, quad), 4)  # this lane's words in plane 0
        # tile ni's column is 16 (ni >> 1) + 2 (ni & 1) past tile 0's (paired_column_of_row)
        self.n_tiles = tile.n_tiles
        self.offsets = [PIECE * (16 * (ni >> 1) + 2 * (ni & 1)) for ni in range(self.n_tiles)]
        # prmt takes its table from a register: a constant there is warp-uniform, and ptxas
        # keeps it in a uniform register and copies it into a new one for each prmt (12 a
        # chunk on the 128 x 128 tile). Adding tid >> 24 (0: a CTA has at most 1024
        # threads, PTX ISA 10, %tid) makes it a per-thread value, held in one register
        self.table = ptx.mov(TERNARY_PRMT_TABLE)
        ptx.increment(self.table, ptx.shr(at.tid, 24))
        self.col_first = paired_columns(ptx, at)
        # this lane's 16 bytes of a stage, by its place along N (with one warp row, its tid);
        # the first warp row copies, every row reads
        place = at.tid if tile.warps_m == 1 else ptx.mad(at.warp_n, 32, at.lane)
        self.slot = ptx.mad(place, 4 * self.n_tiles, ring.share_base())
        self.copier = None if tile.warps_m == 1 else ptx.setp("eq", at.warp_m, 0, "u32")
        self.k_limit = k_limit

    def issue(self, stage_offset: str | int, k: str, whole: bool = False) -> None:
        """Copy this lane's words of the chunk at ``k`` (plane k / 64) into its slot of the
        stage at ``stage_offset``: zero where the chunk starts at or past K."""
        ptx = self.ptx
        past = ptx.setp("ge", k, self.k_limit, "u32")
        src = ptx.byte_offset(self.words, k, self.per_k)
        dst, at = (self.slot, stage_offset) if isinstance(stage_offset, int) else (ptx.add(self.slot, stage_offset), 0)
        for ni, offset in enumerate(self.offsets):
            ptx.cp_async(dst, src, past, dst_offset=at + 4 * ni, size=4, src_offset=offset, guard=self.copier)

    def b_fragments(self, stage_offset: str) -> list[list[list[str]]]:
        """[k step][n tile] -> the tile's two B registers: this lane's words read back from
        the stage at ``stage_offset`` and decoded."""
        words = self.ptx.load_vector("shared", "u32", self.ptx.add(self.slot, stage_offset), self.n_tiles)
        decoded = [decode_ternary(self.ptx, word, self.table) for word in words]
        return [[regs[2 * step:2 * step + 2] for regs in decoded] for step in range(2)]

    col_offset = staticmethod(StagedRows.col_offset)



class QuantizedRows(StagedRows):
    """A = rows of floats (``dtype``, R x K contiguous: x itself) that the CTA quantizes to
    int8 as it stages them, so no launch before the product writes x's codes: each row's
    scale s = absmax / 127 and codes clip(rint(x / s), -127, 127), the arithmetic of
    ``hslm_qrows`` (``hslm_ptx.emit.stepforms.int8_code``, ``scale_of_absmax``), so the codes are
    its codes bit for bit.

    The threads copy as :class:`StagedRows` does (thread ``tid`` piece ``tid & 3`` of rows
    ``tid >> 2`` + P j), so they also find the scales: first a pass over the whole row (every
    split of the contraction needs the row's scale), each thread the max.NaN of its piece's
    16 elements of every chunk, then the row's four threads (four adjacent lanes) combine
    theirs with two butterflies. Each chunk's ``issue`` then loads its piece's 16 elements
    (+0 past K or past the last row: code 0, as the padding and the zero-fill of the codes
    layout), codes and packs them and stores the piece where the copy would have landed. The
    stores are plain: the loop's barrier that publishes a chunk orders them as it orders
    the copies' wait. The epilogue takes the row factors from the CTA's ``row_scale``
    array (``scales``: its shared address, tile row 0; ``Rescale.row_scales_shared``).

    The row is read twice (the scales pass, then the codes), the second time from L2 where
    it fits, and by every CTA along N: the bytes a quantization launch would have written
    and the product read back are not moved at all."""

    def __init__(self, ptx: Ptx, at: Coords, ring: Ring, ptr: str, dtype: str, rows: str, k_limit: str,
                 row_bytes: str | int | None = None):
        self.dtype, self.element = dtype, ELEMENT_BYTES[dtype]
        row_bytes = ptx.mul(k_limit, self.element) if row_bytes is None else row_bytes
        super().__init__(ptx, at, ring, ptr, row_bytes, rows, k_limit)
        tile = at.tile
        self.row_inside = [ptx.setp("lt", r, rows, "u32") for r in self.rows_j]
        if self.copier is not None:
            self.row_inside = [ptx.fresh("pred", "and.pred", self.copier, ok) for ok in self.row_inside]
        self.scales_at = ptx.shared_array("row_scale", 4 * tile.m)
        self.scale = self._row_scales(at)

    def _piece_addresses(self, j: int, k_at: str) -> Iterator[tuple[str, int]]:
        """(register, byte offset) of each of the 16 elements of this thread's piece of copy
        ``j`` at k = ``k_at`` .. + 15: one address, the elements an element apart."""
        first = self.ptx.byte_offset(self.rows_at[j], k_at, self.element)
        return [(first, e * self.element) for e in range(PIECE)]

    def _piece_values(self, j: int, k_at: str) -> list[str]:
        """The 16 elements of this thread's piece of copy ``j`` at k = ``k_at`` .. + 15, as f32
        (+0 past K, past the last row, or in a thread that copies nothing)."""
        ptx = self.ptx
        values = []
        for e, (address, offset) in enumerate(self._piece_addresses(j, k_at)):
            inside = ptx.fresh("pred", "and.pred", self.row_inside[j],
                               ptx.setp("lt", ptx.add(k_at, e), self.k_limit, "u32"))
            values.append(load_f32(ptx, self.dtype, address, guard=inside, offset=offset))
        return values

    def _row_scales(self, at: Coords) -> list[str]:
        """Each copy's row scale in its four threads; piece 0's thread keeps it in ``row_scale``."""
        ptx = self.ptx
        maxima = [ptx.fmov(0.0) for _ in self.rows_j]
        k_at = ptx.shl(self.piece, 4)  # the whole row, whatever the split
        trip, trips = ptx.mov(0), ptx.shr(ptx.add(self.k_limit, CHUNK_K - 1), CHUNK_K.bit_length() - 1)
        ptx.label("row_absmax")
        for j, absmax in enumerate(maxima):
            for value in self._piece_values(j, k_at):
                ptx.ins("max.NaN.f32", absmax, absmax, ptx.fabs(value))
        ptx.increment(k_at, CHUNK_K)
        ptx.increment(trip, 1)
        ptx.branch("row_absmax", guard=ptx.setp("lt", trip, trips, "u32"))
        scales = [scale_of_absmax(ptx, warp_max(ptx, absmax, PIECES), stepmath.QMAX) for absmax in maxima]
        keeper = ptx.setp("eq", self.piece, 0, "u32")
        if self.copier is not None:
            keeper = ptx.fresh("pred", "and.pred", keeper, self.copier)
        for j, scale in enumerate(scales):
            ptx.store("shared", "f32", ptx.add(self.scales_at, ptx.shl(ptx.add(self.row, self.step_rows * j), 2)),
                      scale, guard=keeper)
        return scales

    def issue(self, stage_offset: str | int, k: str, whole: bool = False) -> None:
        """Code this thread's pieces of the chunk at ``k`` into the stage at ``stage_offset``."""
        ptx = self.ptx
        dst = self.copy_at if stage_offset == 0 else ptx.add(self.copy_at, stage_offset)
        for j, scale in enumerate(self.scale):
            codes = [int8_code(ptx, value, scale) for value in self._piece_values(j, self.k_at)]
            words = [pack_bytes(ptx, codes[i:i + 4]) for i in range(0, PIECE, 4)]
            ptx.store("shared", "v4.b32", dst, words, j * self.step_rows * CHUNK_K, guard=self.copier)
        ptx.increment(self.k_at, CHUNK_K)


class QuantizedColumns(QuantizedRows):
    """A = the columns of a float matrix (``dtype``, ``k_limit`` x ``rows`` contiguous: dY,
    R x N, whose column j is A's row j and whose row r is A's k = r), quantized per column
    as the CTA stages it: the dW product from float dY, A = dYq^T. Each column's scale is
    over all R rows, so every CTA (and every split of R) takes it whole in the scales pass,
    as :class:`QuantizedRows` does a row's; the codes are ``hslm_qcols``' bit for bit
    (``hslm_ptx.reference.stepmath``: the same absmax, scale and rounding).

    Thread ``tid`` still stages piece ``tid & 3`` of A row (column) ``tid >> 2`` + P j: its 16
    elements are 16 rows of the matrix, ``rows`` elements apart, so each of its loads takes
    its own address, one 64-bit add from the last; the 8 A rows of a warp's load are 8
    adjacent columns of one matrix row (32 bytes of f32, 16 of f16 / bf16)."""

    def __init__(self, ptx: Ptx, at: Coords, ring: Ring, ptr: str, dtype: str, rows: str, k_limit: str):
        element = ELEMENT_BYTES[dtype]
        self.row_step = ptx.mul(rows, element)  # bytes from one matrix row to the next (u32)
        self.row_step_wide = ptx.widen(self.row_step)
        super().__init__(ptx, at, ring, ptr, dtype, rows, k_limit, row_bytes=element)

    def _piece_addresses(self, j: int, k_at: str) -> Iterator[tuple[str, int]]:
        """Each element's address as its load asks for it (one 64-bit add from the last), so
        no element's address is live before its load."""
        ptx = self.ptx
        address = ptx.byte_offset(self.rows_at[j], k_at, self.row_step)
        yield address, 0
        for _ in range(PIECE - 1):
            address = ptx.add(address, self.row_step_wide, "s64")
            yield address, 0


class CodedTernary(FragmentTernary):
    """B = ternary W coded from the latent float W (``dtype``, N x K contiguous:
    ``nn.Linear``'s weight) as the CTA stages it, so the forward of a new weight version
    needs no launch that writes W's planes before it: the words each lane would have copied
    from ``FRAGMENTS`` planes are made where they would have landed, bit for bit the words
    ``hslm_wprep`` writes.

    First beta = mean|W| from the partial sums of |W| (``hslm_wsum``'s output; every CTA
    adds the few hundred partials itself, ``stepforms.partials_beta``), kept in the CTA's
    shared ``beta_shared`` for the epilogue (``Rescale.beta_shared``). Then each chunk:
    the lane (g, t) that copies (the first row of warps) loads, for each of its n tiles'
    columns n, the 16 floats k = 16 s + 4 t + u (s, u < 4) of W's row n, codes each by two
    compares with beta / 2 (``stepforms.threshold_code``; no division), packs them in the
    planes' bit order (``stepforms.plane_word``) and stores the word in its slot of the
    stage. A warp's load instruction reads 8 rows' 32 consecutive bytes (f16 / bf16; 64 of
    f32): whole sectors. Elements past K or rows past N load as +0, code 0, as the planes'
    padding is. The stores are plain: the loop's barrier that publishes a chunk orders them
    as it orders the copies' wait (:class:`QuantizedRows` does the same).

    Every CTA along M codes the same columns again (its L2 reads of W's floats: R / tile.m
    passes of 2 or 4 bytes an element, where the planes took a quarter byte); the codes are
    never written by this operand (the prepared planes, for dX and a kept weight, are the
    ``hslm_wprep`` member's in the same grid)."""

    addressed_by_k = False

    def __init__(self, ptx: Ptx, at: Coords, ring: Ring, w_ptr: str, dtype: str, partials: str, cols: str,
                 k_limit: str):
        super().__init__(ptx, at, ring, w_ptr, cols, k_limit)
        tile = at.tile
        self.dtype, self.element, self.cols = dtype, ELEMENT_BYTES[dtype], cols
        scratch = ptx.shared_array("sum_scratch", 4 * 256)
        self.beta_at = ptx.shared_array("beta_shared", 16)
        beta = partials_beta(ptx, partials, ptx.mul(cols, k_limit), at.tid, tile.threads, scratch)
        ptx.store("shared", "f32", self.beta_at, beta, guard=ptx.setp("eq", at.tid, 0, "u32"))
        ptx.barrier()
        self.threshold = ternary_threshold(ptx, ptx.load_f32("shared", self.beta_at))
        group, self.quad = ptx.shr(at.lane, 2), ptx.band(at.lane, 3)
        self.first = ptx.add(at.n_base, paired_column_of_row(ptx, ptx.mad(at.warp_n, tile.warp_cols, group)))
        self.row_bytes = ptx.mul(k_limit, self.element)  # W's row n to row n + 1
        self.rows_at = ptx.byte_offset(w_ptr, self.first, self.row_bytes)  # row `first`, k = 0

    def issue(self, stage_offset: str | int, k: str, whole: bool = False) -> None:
        """Code this lane's words of the chunk at ``k`` into its slot of the stage at
        ``stage_offset``."""
        ptx = self.ptx
        k_lane = ptx.mad(self.quad, 4, k)  # k = 4 t: the lane's first element of the chunk
        left = ptx.sub(self.k_limit, k_lane)  # elements of the row from there (s32; <= 0 past K)
        at_k = ptx.byte_offset(self.rows_at, k_lane, self.element)
        words = []
        for ni in range(self.n_tiles):
            column = self.offsets[ni] // PIECE  # past `first`
            inside = ptx.setp("lt", ptx.add(self.first, column), self.cols, "u32")
            if self.copier is not None:
                inside = ptx.fresh("pred", "and.pred", inside, self.copier)
            row_left = ptx.selp(left, 0, inside)
            row_at = ptx.byte_offset(at_k, column, self.row_bytes)
            quads = []
            for s in range(4):
                codes = []
                for u in range(4):
                    e = 16 * s + u
                    value = load_f32(ptx, self.dtype, row_at, guard=ptx.setp("gt", row_left, e, "s32"),
                                     offset=e * self.element)
                    codes.append(threshold_code(ptx, value, self.threshold))
                quads.append(pack_bytes(ptx, codes))
            words.append(plane_word(ptx, quads))
        dst, at = (self.slot, stage_offset) if isinstance(stage_offset, int) else (ptx.add(self.slot, stage_offset), 0)
        ptx.store("shared", f"v{len(words)}.b32" if len(words) > 1 else "b32", dst,
                  words if len(words) > 1 else words[0], at, guard=self.copier)
