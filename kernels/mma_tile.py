"""The CTA tile skeleton all three kernels share: D[m, n] = sum_k A[m, k] B[k, n].

Each kernel is this one loop with different operand sources:

- a CTA of 4 warps computes a 64 (M) x 32 (N) tile of D; warp w owns rows
  16w..16w+15 and four 16x8 ``mma.m16n8k32`` accumulators across the 32 columns;
- the contraction runs in chunks of 64 (two mma k-steps); per chunk each operand
  source supplies fragments in the PTX ISA layout (ptx-facts.md section 1): for lane
  l, g = l >> 2 and t = l & 3, A needs rows g and g+8 and B column g, each at four
  k slots per register;
- which chunk bytes fill those k slots is a :class:`KOrder`. The mma sums over k, so
  any permutation used by both A and B gives the same D; ``BLOCKED`` hands lane t the
  16 consecutive bytes 16t..16t+15, so one 16-byte shared load or five aligned global
  words cover a lane's whole chunk;
- tails are predicated, never padded: a fragment byte outside [0, M) x [0, K) or
  [0, K) x [0, N) is loaded as 0, an output outside [0, M) x [0, N) is not stored.
  The contraction loop bound is the same for every thread, so control flow is
  uniform across the launch (``bra.uni``) and only data movement is predicated.

Operand sources:
- :class:`GlobalFragments`: int8 straight from global memory: predicated byte loads
  in any chunk, aligned words funnelled with prmt in chunks well inside the rows;
- :class:`TernaryShared`: packed ternary W, each thread decodes one u32 (16 codes) per
  chunk with prmt and writes it with one 16-byte shared store; warps then read
  fragments from shared memory. ``k_major=False`` stores W as [n][k] (forward: one
  16-byte shared load per lane and n tile per chunk), ``k_major=True`` as [k][n] (dX,
  where the packed order runs along the output dimension: four byte loads per register).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from kernels.ptx_emit import (
    TERNARY_PRMT_TABLE, Operand, Ptx, decode_ternary, guarded_bytes, transpose_bytes,
)
from kernels.spec import BufferSpec, Launch
from kernels.ternary import CODES_PER_WORD

WARPS = 4
THREADS = 32 * WARPS
TILE_M = 16 * WARPS  # rows of D per CTA
TILE_N = 32  # columns of D per CTA: four n8 mma tiles
N_TILES = TILE_N // 8
CHUNK_K = 64  # contraction per loop trip: two k32 mma steps
K_STEPS = CHUNK_K // 32


class KOrder(NamedTuple):
    """Chunk offset of the 4 bytes in k slots 4t.. of ``step`` and ``half`` (+16) for lane t."""

    name: str
    lane: int  # offset of lane t's first byte: lane * t
    step: int
    half: int

    def offset(self, step: int, half: int) -> int:
        return self.step * step + self.half * half


NATURAL = KOrder("natural", lane=4, step=32, half=16)  # the PTX ISA's own k order
BLOCKED = KOrder("blocked", lane=16, step=8, half=4)  # lane t: chunk bytes 16t..16t+15


class NOrder(NamedTuple):
    """Which CTA column n tile ``tile``'s fragment column j (B's g, D's 2t+e) stands for:
    ``j * self.j + tile * self.tile``. Like k, n may be permuted as long as B's source
    and the store of D agree."""

    j: int
    tile: int


NATURAL_N = NOrder(j=1, tile=8)  # tile nt is columns 8nt..8nt+7
INTERLEAVED_N = NOrder(j=4, tile=1)  # lane g's four tiles are columns 4g..4g+3


def geometry(rows: int, cols: int) -> Launch:
    """Grid over a rows x cols output: x walks columns (TILE_N), y walks rows (TILE_M)."""
    return Launch(grid=(-(-cols // TILE_N), -(-rows // TILE_M), 1), block=(THREADS, 1, 1))


@dataclass
class Lane:
    """Per-thread coordinates every operand source needs (all b32 registers)."""

    tid: str
    g: str  # lane >> 2: fragment row (A), column (B)
    t: str  # lane & 3: fragment k group
    m_base: str  # first D row of this warp
    n_base: str  # first D column of this CTA


def entry(name: str, params: tuple[BufferSpec, ...], threads: int) -> tuple[Ptx, dict[str, str]]:
    """A kernel entry of ``threads`` per CTA with its parameters loaded (buffers as
    global pointers, sizes as u32)."""
    ptx = Ptx(name, [(p.name, "u64" if p.shape else "u32") for p in params], threads)
    return ptx, {p.name: ptx.param_ptr(p.name) if p.shape else ptx.param_u32(p.name) for p in params}


def begin(name: str, params: tuple[BufferSpec, ...]) -> tuple[Ptx, dict[str, str], Lane]:
    """A kernel's prologue: its parameters loaded and this thread's tile coordinates."""
    ptx, regs = entry(name, params, THREADS)
    return ptx, regs, lane_coords(ptx)


def lane_coords(ptx: Ptx) -> Lane:
    tid = ptx.special("%tid.x")
    lane = ptx.band(tid, 31)
    warp_rows = ptx.shl(ptx.shr(tid, 5), 4)  # 16 rows per warp
    m_base = ptx.mad(ptx.special("%ctaid.y"), TILE_M, warp_rows)
    n_base = ptx.mul(ptx.special("%ctaid.x"), TILE_N)
    return Lane(tid=tid, g=ptx.shr(lane, 2), t=ptx.band(lane, 3), m_base=m_base, n_base=n_base)


class GlobalFragments:
    """Fragments read from a global int8 matrix.

    Element (row, k) of the operand lives at ``ptr + row * row_stride + k * k_stride``;
    exactly one of the strides is 1 (contiguous k: forward and dX activations; contiguous
    rows: dW's transposed reads), so one side of every address is an immediate.
    ``rows`` are this lane's fragment rows relative to ``row_base + g`` (A: 0 and 8;
    B: 0, 8, 16, 24 for the four n tiles); ``span`` is how many rows the CTA covers.

    Two ways to fetch 4 k-consecutive bytes:
    - tail path (any chunk): four predicated byte loads, zero past the matrix, packed
      with prmt;
    - fast path (chunks with ``k0 < self.fast_end``), no predicates at all. Rows past
      ``row_limit`` compute garbage that is never stored, so they only must stay in
      the buffer. Contiguous k: such rows read the last row instead, and rows of odd
      length, not 4-byte aligned, are read as aligned 32-bit words (each shared by the
      groups that touch it) funnelled with one prmt per group selecting bytes o..o+3,
      o = the row's misalignment; the chunk and the word past it lie inside the row
      (``FAST_MARGIN``). Contiguous rows: rows past the limit run into the next k
      row, so the chunk stops early enough that the span's overhang stays inside.
    """

    n_order = NATURAL_N  # as B: n tile nt is rows 8nt.. of this operand

    def __init__(self, ptx: Ptx, lane: Lane, order: KOrder, ptr: str, row_base: str,
                 row_limit: str, row_stride: Operand, k_limit: str, k_stride: Operand,
                 rows: tuple[int, ...], span: int):
        assert 1 in (row_stride, k_stride), "one stride must be 1 for immediate offsets"
        self.ptx, self.order, self.rows, self.k_stride = ptx, order, rows, k_stride
        first_row = ptx.add(row_base, lane.g)
        k_first = ptx.mul(lane.t, order.lane)
        self.k_left = ptx.sub(k_limit, k_first)  # k_limit - k0 - first k, kept per chunk
        self.row_ok = {r: ptx.setp("lt", ptx.add(first_row, r), row_limit, "u32") for r in rows}
        if k_stride == 1:  # a walking pointer per row; k offsets are immediates
            last = ptx.sub(row_limit, 1, "u32")
            self.row_ptr, self.aligned, self.funnel = {}, {}, {}
            for r in rows:
                row = ptx.binop("min", ptx.add(first_row, r), last)
                self.row_ptr[r] = ptx.byte_offset(ptx.byte_offset(ptr, row, row_stride), k_first, 1)
                self.aligned[r] = ptx.binop("and", self.row_ptr[r], -4, "b64")
                misalign = ptx.band(ptx.fresh("b32", "cvt.u32.u64", self.row_ptr[r]), 3)
                self.funnel[r] = ptx.mad(misalign, 0x1111, 0x3210)  # prmt bytes o..o+3
            self.fast_end = ptx.sub(k_limit, CHUNK_K + FAST_MARGIN - 1)
        else:  # one walking pointer; rows are immediates, k addresses rebuilt per chunk
            self.origin = ptx.byte_offset(ptx.byte_offset(ptr, first_row, row_stride), k_first, k_stride)
            self.stride = ptx.wide_mul(k_stride, 1)
            self.chunk_step = ptx.wide_mul(k_stride, CHUNK_K)
            # rows up to span - 1 past the limit spill into ceil((span - 1) / k_stride) more k rows
            spill = ptx.binop("div", ptx.add(k_stride, span - 2), k_stride)
            self.fast_end = ptx.sub(ptx.sub(k_limit, CHUNK_K - 1), spill)

    def begin_chunk(self, fast: bool) -> None:
        ptx = self.ptx
        self.fast, self.words = fast, {}
        if self.k_stride != 1:  # the k addresses this lane touches, walked once per chunk
            ks = sorted({self.order.offset(s, h) + b for s in range(K_STEPS) for h in (0, 1) for b in range(4)})
            self.k_ptr = {0: self.origin}  # ks[0] == 0: every order starts at the lane's first k
            for prev, k in zip(ks, ks[1:]):
                step = self.stride if k == prev + 1 else ptx.wide_mul(self.k_stride, k - prev)
                self.k_ptr[k] = ptx.add(self.k_ptr[prev], step, "s64")
        if not fast:  # rows past the end see 0 k left: one compare per byte covers both bounds
            self.left = {r: ptx.selp(self.k_left, 0, self.row_ok[r]) for r in self.rows}

    def word(self, row: int, offset: int) -> str:
        """The aligned 32-bit word at ``offset`` past this row's aligned pointer (loaded once a chunk)."""
        if (row, offset) not in self.words:
            self.words[row, offset] = self.ptx.load("global", "b32", self.aligned[row], offset)
        return self.words[row, offset]

    def group(self, row: int, k: int) -> str:
        """Bytes (row, first k + k .. + 3) as one b32, zero outside the matrix."""
        ptx = self.ptx
        if self.fast and self.k_stride == 1:
            return ptx.prmt(self.word(row, k), self.word(row, k + 4), self.funnel[row])
        places = []
        for b in range(4):
            ok = None if self.fast else ptx.setp("gt", self.left[row], k + b)
            if self.k_stride == 1:
                places.append((self.row_ptr[row], k + b, ok))
            else:
                places.append((self.k_ptr[k + b], row, ok))
        return guarded_bytes(ptx, "global", places)

    def a_fragment(self, step: int) -> list[str]:
        low, high = (self.order.offset(step, h) for h in (0, 1))
        return [self.group(0, low), self.group(8, low), self.group(0, high), self.group(8, high)]

    def b_fragment(self, step: int, tile: int) -> list[str]:
        return [self.group(8 * tile, self.order.offset(step, h)) for h in (0, 1)]

    def end_chunk(self) -> None:
        ptx = self.ptx
        ptx.increment(self.k_left, -CHUNK_K, "s32")
        if self.k_stride == 1:
            for ptr in (*self.row_ptr.values(), *self.aligned.values()):
                ptx.increment(ptr, CHUNK_K, "s64")
        else:
            ptx.increment(self.origin, self.chunk_step, "s64")


# the funnel path reads up to the word after a lane's last group: 3 bytes of slack past
# the chunk plus a whole word (BLOCKED: first k + 12 + 7 = 16t + 19 <= 67 = CHUNK_K + 3)
FAST_MARGIN = 4


class TernaryShared:
    """B fragments from packed ternary W, decoded once per chunk into shared memory.

    The chunk's W tile is 128 u32 words, one per thread: thread ``tid`` decodes the word
    of packed column ``col_base + (tid >> col_shift)`` at word ``word_base + (tid & word_mask)``
    and stores its 16 int8 values with one 16-byte ``st.shared.v4``. Barriers before
    (the previous chunk's readers are done) and after (the tile is complete) the store.

    ``k_major=False`` (forward, contraction = in-features = packed order): tile [n 32][k 64],
    the packed column is D's column and the word advances along k. With the BLOCKED k
    order a lane's whole chunk for one n tile is the 16-byte word it reads with one
    ``ld.shared.v4``; 64-byte rows keep both the stores and those loads conflict-free
    (8 lanes of a phase cover 128 consecutive bytes).
    ``k_major=True`` (dX, contraction = out-features = packed columns): tile [k 64][n 32],
    the packed column advances along k and the word is D's column block. Lanes read
    it in the NATURAL k order with INTERLEAVED columns: lane g's four n tiles are the 4
    consecutive bytes 4g..4g+3 of a k row, so four 32-bit loads (k rows 4t..4t+3) and one
    4x4 byte transpose give one fragment register for each tile. Rows are padded by 16
    bytes so the four t-lanes' rows fall into two bank groups instead of one.
    """

    fast_end = None  # one decode serves every chunk: no say in which body runs

    def __init__(self, ptx: Ptx, lane: Lane, w_ptr: str, in_features: str,
                 col_limit: str, k_major: bool):
        self.ptx, self.k_major = ptx, k_major
        words_per_col = ptx.shr(ptx.add(in_features, CODES_PER_WORD - 1), 4)  # Kp / 16
        if k_major:
            self.order, self.n_order = NATURAL, INTERLEAVED_N
            tile_rows, row_bytes, col_shift, word_mask = CHUNK_K, TILE_N + 16, 1, 1
            col_first, word_first = 0, ptx.shr(lane.n_base, 4)
        else:
            self.order, self.n_order = BLOCKED, NATURAL_N
            tile_rows, row_bytes, col_shift, word_mask = TILE_N, CHUNK_K, 2, 3
            col_first, word_first = lane.n_base, 0
        self.row_bytes = row_bytes
        self.col = ptx.add(ptx.shr(lane.tid, col_shift), col_first)
        self.word = ptx.add(ptx.band(lane.tid, word_mask), word_first)
        self.col_limit, self.words_per_col = col_limit, words_per_col
        index = ptx.mad(self.col, words_per_col, self.word)
        self.w_ptr = ptx.byte_offset(w_ptr, index, 4)
        self.step = (ptx.wide_mul(words_per_col, 4 * CHUNK_K) if k_major
                     else ptx.wide_mul(CHUNK_K // CODES_PER_WORD, 4))
        tile = ptx.shared_array("w_tile", tile_rows * row_bytes)
        slot = ptx.shl(ptx.band(lane.tid, word_mask), 4)
        self.store_at = ptx.mad(ptx.shr(lane.tid, col_shift), row_bytes, ptx.add(tile, slot))
        if k_major:  # lane reads k rows 4t.. at columns 4g..4g+3
            self.read_at = ptx.mad(lane.t, 4 * row_bytes, ptx.add(tile, ptx.shl(lane.g, 2)))
        else:  # lane reads row g at k bytes 16t..16t+15
            self.read_at = ptx.mad(lane.g, row_bytes, ptx.add(tile, ptx.shl(lane.t, 4)))
        self.table = ptx.mov(TERNARY_PRMT_TABLE)

    def begin_chunk(self, fast: bool) -> None:
        ptx = self.ptx
        self.lane_words: dict[object, list[str]] = {}
        ok = ptx.and_pred(ptx.setp("lt", self.col, self.col_limit, "u32"),
                          ptx.setp("lt", self.word, self.words_per_col, "u32"))
        word = ptx.load("global", "u32", self.w_ptr, guard=ok, zero_fill=True)
        values = decode_ternary(ptx, word, self.table)
        ptx.barrier()
        ptx.store("shared", "v4.b32", self.store_at, values)
        ptx.barrier()

    def b_fragment(self, step: int, tile: int) -> list[str]:
        ptx, words = self.ptx, self.lane_words
        if not self.k_major:  # all four registers of this n tile in one 16-byte load
            if tile not in words:
                words[tile] = ptx.load_vector("shared", "b32", self.read_at, 8 * tile * self.row_bytes, 4)
            return [words[tile][2 * step + h] for h in (0, 1)]
        for h in (0, 1):  # k rows of (step, h) x columns 4g..4g+3 -> one register per tile
            if (step, h) not in words:
                k = self.order.offset(step, h)
                rows = [ptx.load("shared", "b32", self.read_at, (k + b) * self.row_bytes) for b in range(4)]
                words[step, h] = transpose_bytes(ptx, rows)
        return [words[step, h][tile] for h in (0, 1)]

    def end_chunk(self) -> None:
        ptx = self.ptx
        ptx.increment(self.w_ptr, self.step, "s64")
        ptx.increment(self.col if self.k_major else self.word, CHUNK_K if self.k_major else CHUNK_K // CODES_PER_WORD)


def emit_tile(ptx: Ptx, lane: Lane, a: GlobalFragments, b: GlobalFragments | TernaryShared,
              k_limit: str, out: str, rows: str, cols: str) -> None:
    """The chunk loop (fragments -> mma) and the predicated int32 store of D[rows x cols].

    Each trip picks, uniformly on k alone, the fast body while the chunk starts before
    every operand's ``fast_end`` and the predicated tail body after that.
    """
    acc = [[ptx.mov(0) for _ in range(4)] for _ in range(N_TILES)]
    k_done = ptx.mov(0)
    ends = [src.fast_end for src in (a, b) if src.fast_end is not None]
    fast_end = ends[0] if len(ends) == 1 else ptx.binop("min", *ends, "s32")

    def body(fast: bool) -> None:
        a.begin_chunk(fast)
        b.begin_chunk(fast)
        for step in range(K_STEPS):
            frag_a = a.a_fragment(step)
            for tile in range(N_TILES):
                ptx.mma_s8(acc[tile], frag_a, b.b_fragment(step, tile))

    ptx.label("chunk")
    ptx.branch("tail_chunk", guard="!" + ptx.setp("lt", k_done, fast_end))
    body(fast=True)
    ptx.branch("next_chunk")
    ptx.label("tail_chunk")
    body(fast=False)
    ptx.label("next_chunk")
    a.end_chunk()
    b.end_chunk()
    ptx.increment(k_done, CHUNK_K)
    ptx.branch("chunk", guard=ptx.setp("lt", k_done, k_limit, "u32"))

    ptx.comment("D fragment: c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1), columns in B's n order")
    n = b.n_order
    col = ptx.mad(lane.t, 2 * n.j, lane.n_base)
    cols_left = ptx.sub(cols, col)
    for half in (0, 1):
        row = ptx.add(ptx.add(lane.m_base, lane.g), 8 * half)
        left = ptx.selp(cols_left, 0, ptx.setp("lt", row, rows, "u32"))
        ptr = ptx.byte_offset(out, ptx.mad(row, cols, col), 4)
        for tile in range(N_TILES):
            for e in (0, 1):
                offset = n.j * e + n.tile * tile
                ok = ptx.setp("gt", left, offset)
                ptx.store("global", "s32", ptr, acc[tile][2 * half + e], 4 * offset, guard=ok)
