"""The staged tile's output, after the chunk loop (:class:`Epilogue`): with one split each
lane stores four consecutive columns of a row straight from its accumulators (B's column
order makes them consecutive), 16 bytes with one st.global.v4; with split-K the ring is
reused to stage the sums so that each red.global request is 32 consecutive words. A
rescaled output (:class:`Rescale`: the caller's float type, rescaled from the int32 sums)
is staged the same way and written a row of 32 consecutive elements a request; split, it
reduces in int32 first (:func:`emit_split_rescale`).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from hslm_ptx.emit.ptx import Ptx
from hslm_ptx.formats.floats import SHORT_NAMES
from hslm_ptx.formats.layout import Plain
from hslm_ptx.kernel.spec import BufferSpec, Dims, ScalarSpec
from hslm_ptx.tile.geometry import TILE_N
from hslm_ptx.tile.operands import Coords, Source

def runs(b: Source, n_tiles: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """A lane's D fragment elements (n tile, e) of one row grouped into runs of
    consecutive columns, each run aligned to its length (one st.shared.v2/.v4):
    [(first column past ``b.col_first``, [(n tile, e), ...])]."""
    groups: list[list[tuple[int, tuple[int, int]]]] = []
    for col, element in sorted((b.col_offset(ni, e), (ni, e)) for ni in range(n_tiles) for e in (0, 1)):
        if groups and groups[-1][-1][0] == col - 1:
            groups[-1].append((col, element))
        else:
            groups.append([(col, element)])
    length = len(groups[0])
    assert length in (2, 4) and all(len(g) == length and g[0][0] % length == 0 for g in groups)
    return [(g[0][0], [element for _, element in g]) for g in groups]


def staging_row_words(run: int) -> int:
    """Words between rows of the staged output: TILE_N plus the words one row's lanes
    write in one bank phase (4 lanes x ``run``), so the rows of a phase (4 rows of v2,
    2 rows of v4) start in different banks and fill all 32 once."""
    return TILE_N + 4 * run


class Epilogue:
    """The CTA's tile.m x 128 int32 result; the output's rows are ``out_pitch`` words
    apart, a multiple of 32 (``hslm_ptx.kernel.pitch.output_pitch``), so every row starts on a
    128-byte line.

    One split (``store_fragments``): B's rows are ordered so that a lane's accumulators
    of n tiles 2p and 2p + 1 are four consecutive columns of one row
    (``paired_column_of_row``), so each lane stores them from its registers with one
    ``st.global.v4``: a warp's request is 8 rows x 64 contiguous bytes, two whole sectors
    a row, 8 lines, and nothing passes through shared memory (staging would spend a
    shared write and a read per 128 bytes to save 4 of those lines, and two barriers).

    Split-K (``emit`` with ``added_row``): ``red`` has no s32 vector form (PTX ISA red),
    so a word per lane; straight from the fragments a request would be 8 rows x 16 bytes
    (8 lines for 128 bytes). The sums are staged instead: in ``m_tiles`` passes of 16
    ``warps_m`` rows (m tile ``mi`` of every warp row) each warp writes its fragments
    with vector st.shared (one per run of consecutive columns), a barrier, then warp w
    of W reads back rows w + W j a word per lane on consecutive columns: one 128-byte
    line a request. Rows are padded (``staging_row_words``): the fragment writes are
    free of bank conflicts, and row reads are conflict-free anyway."""

    COLUMN_GROUPS = TILE_N // 32

    def __init__(self, ptx: Ptx, at: Coords, acc: list[list[list[str]]], buffer: str, b: Source,
                 out: str, rows: str, cols: str, out_pitch: str, buffer_bytes: int):
        self.ptx, self.at, self.acc, self.b = ptx, at, acc, b
        self.out, self.rows, self.cols, self.out_pitch = out, rows, cols, out_pitch
        self.tile = tile = at.tile
        self.runs = runs(b, tile.n_tiles)
        self.row_bytes = 4 * staging_row_words(len(self.runs[0][1]))
        pass_rows = 16 * tile.warps_m
        self.read_rows = tile.rows_read_back  # rows each warp reads back per pass
        assert pass_rows * self.row_bytes <= buffer_bytes and pass_rows % tile.warps == 0
        self.buffer = buffer

    def store_fragments(self) -> None:
        """One split: lane (g, t) stores rows g and g + 8 of each of its m tiles, one
        st.global.v4 per run of four columns, none for a row past the last or a run that
        starts past the last column (a run that starts inside ends inside the pitch)."""
        ptx, tile, b = self.ptx, self.tile, self.b
        at = self.at
        first_row = ptx.add(at.m_base, ptx.mad(at.warp_m, tile.warp_m, ptx.shr(at.lane, 2)))
        rows_left = ptx.sub(self.rows, first_row)
        ptr = ptx.byte_offset(self.out, ptx.mad(first_row, self.out_pitch, b.col_first), 4)
        eight_rows = ptx.wide_mul(self.out_pitch, 8 * 4)
        run_ok = [ptx.setp("lt", ptx.add(b.col_first, first), self.cols, "u32") for first, _ in self.runs]
        for j in range(2 * tile.m_tiles):  # rows 8 j on: m tile j >> 1, half j & 1
            mi, half = divmod(j, 2)
            if j:
                ptx.increment(ptr, eight_rows, "s64")
            row_ok = ptx.setp("gt", rows_left, 8 * j, "s32")
            for (first, run), ok in zip(self.runs, run_ok):
                values = [self.acc[mi][ni][2 * half + e] for ni, e in run]
                ptx.store("global", f"v{len(values)}.b32", ptr, values, 4 * first,
                          guard=ptx.fresh("pred", "and.pred", row_ok, ok))

    def staging(self) -> None:
        """Where this lane writes its fragments of a pass and reads rows back (split-K)."""
        ptx, at = self.ptx, self.at
        g = ptx.shr(at.lane, 2)
        fragment_row = ptx.mad(at.warp_m, 16, g)  # row of c0 within the pass
        tile_col = ptx.sub(self.b.col_first, at.n_base)
        self.write_at = ptx.add(self.buffer, ptx.shl(ptx.mad(fragment_row, self.row_bytes // 4, tile_col), 2))
        warp = ptx.shr(at.tid, 5)
        self.first_row = ptx.add(at.m_base, warp)
        # a word per lane, lane l on column l of each 32-column group
        self.read_at = ptx.add(self.buffer, ptx.mad(warp, self.row_bytes, ptx.shl(at.lane, 2)))
        self.col = ptx.add(at.n_base, at.lane)
        self.cols_left = ptx.sub(self.cols, self.col)

    def tile_row(self, j: int) -> int:
        """Row of the CTA tile (less the pass's 16 mi) that read row ``warp + W j`` is
        (pass row p = 16 warp_m + r: warp row p >> 4, row r of its m tile)."""
        read_row = self.tile.warps * j
        return (read_row // 16) * self.tile.warp_m + read_row % 16

    def added_row(self, row: str, j: int) -> None:
        """A row writer (for :meth:`emit`) adding the row into the output a word per lane
        with red.global.add.s32, none past the last column."""
        ptx = self.ptx
        ptr = ptx.byte_offset(self.out, ptx.mad(row, self.out_pitch, self.col), 4)
        for c in range(self.COLUMN_GROUPS):
            value = ptx.load("shared", "b32", self.read_at, self.tile.warps * j * self.row_bytes + 128 * c)
            ptx.red_add(ptr, value, 128 * c, guard=ptx.setp("gt", self.cols_left, 32 * c))

    def each_row(self, write_row, path: str, prepare: Callable[[], None] | None = None) -> None:
        """The rows :meth:`emit` gives ``write_row``, in the same order and to the same warps,
        with nothing staged: for a writer that reads the sums from global memory."""
        self.staging()
        if prepare is not None:
            prepare()
        for mi in range(self.tile.m_tiles):
            self.pass_rows(mi, write_row, path)

    def pass_rows(self, mi: int, write_row, path: str) -> None:
        """Give ``write_row(row, j)`` each row this warp reads back in pass ``mi``, skipping
        (a branch the whole warp takes) a row past the last."""
        ptx = self.ptx
        for j in range(self.read_rows):
            skip = f"{path}_written_{mi}_{j}"
            step = 16 * mi + self.tile_row(j)
            row = ptx.add(self.first_row, step) if step else self.first_row
            ptx.branch(skip, guard=ptx.setp("ge", row, self.rows, "u32"))
            write_row(row, j)
            ptx.label(skip)

    def emit(self, write_row, path: str, prepare: Callable[[], None] | None = None) -> None:
        """All passes, each read-back row given to ``write_row(row, j)`` (its D row and
        its index among this warp's rows of the pass); ``path`` names this copy's labels.
        A warp skips reading back and storing a row past the last (the row is the same
        for all its lanes). ``prepare`` runs once, after the read-back places are known
        and before the first pass (a writer's per-column values)."""
        ptx = self.ptx
        self.staging()
        if prepare is not None:
            prepare()
        for mi in range(self.tile.m_tiles):
            if mi:
                ptx.barrier()  # the previous pass is read back
            for half in (0, 1):
                for first, run in self.runs:
                    values = [self.acc[mi][ni][2 * half + e] for ni, e in run]
                    ptx.store("shared", f"v{len(values)}.b32", self.write_at, values,
                              8 * half * self.row_bytes + 4 * first)
            ptx.barrier()  # the pass is written
            self.pass_rows(mi, write_row, path)


# -0.0 is the bias where there is none: x + -0.0 is x for every x, +0 and -0 included
NEGATIVE_ZERO_HALF = 0x8000  # -0.0 in f16 and in bf16 alike (the sign bit alone)


def smaller_first(ptx: Ptx, a: str, b: str) -> tuple[str, str]:
    """(lo, hi) of two f32 factors, :func:`hslm_ptx.reference.stepmath.smaller_first`: ``setp.lt.f32``
    (false on NaN) and two ``selp.f32`` (PTX ISA 9.7.3.x setp, 9.7.8.x selp)."""
    less = ptx.setp_f32("lt", a, b)
    return ptx.selp_f32(a, b, less), ptx.selp_f32(b, a, less)


class Rescale(NamedTuple):
    """A fused epilogue: the tile's int32 sums written as floats of ``dtype`` ("float32",
    "float16", "bfloat16"), each element (f32(acc) * lo) * hi of the row factor and a second factor
    (+ bias), every operation rounded to nearest even and none fused
    (``hslm_ptx.reference.stepmath.rescale_rows`` / ``rescale_cols`` are the same arithmetic in
    numpy; the smaller of the two factors multiplies first, so no intermediate overflows
    where the result does not). The second factor is ``beta`` (one f32, read on the device: forward and dX)
    or ``col_scales`` (an f32 per D column: dW). ``bias`` (``dtype`` per D column) is
    added where the u32 ``has_bias`` is not 0.

    A split's partial sums must not be rounded one by one, so without ``partials`` a
    rescaled launch never splits: one CTA per tile walks the whole contraction
    (:func:`split_k` with ``split=False``). With ``partials`` and ``tickets`` it splits as
    the int32 kernels do and reduces in int32 (:func:`emit_split_rescale`): the rescale
    happens once, on the whole sum, so the result does not depend on the split. The
    kernel module's docstring gives the tile rule's figures for each choice."""

    dtype: str
    buffers: tuple[BufferSpec, ...]  # the float inputs, in parameter order
    row_scales: str  # f32 per D row: the activations' row scales, or dW's dY column scales
    beta: str | None = None
    col_scales: str | None = None
    bias: str | None = None
    has_bias: str | None = None
    # split-K: int32 partial sums (rows x output_pitch(width), zero between launches) and an
    # arrival count per output tile (zero between launches), both among ``buffers``
    partials: str | None = None
    tickets: str | None = None
    # the row factors are the CTA's own, in shared memory: ``row_scales`` names the shared
    # address of its first row's (hslm_ptx.tile.operands.QuantizedRows), not a buffer
    row_scales_shared: bool = False
    # beta is the CTA's own, in shared memory: ``beta`` names its shared address
    # (hslm_ptx.tile.operands.CodedTernary), not a buffer
    beta_shared: bool = False

    @property
    def splits(self) -> bool:
        return self.partials is not None

    @property
    def element_bytes(self) -> int:
        return 4 if self.dtype == "float32" else 2

    @property
    def scalars(self) -> tuple[ScalarSpec, ...]:
        """The u32 switch of the bias; a verify cell always adds one (``value``)."""
        return (ScalarSpec(self.has_bias, lambda d: 1),) if self.has_bias else ()


def rescaled_output(name: str, rescale: Rescale, rows: Callable[[Dims], int],
                    width: Callable[[Dims], int]) -> BufferSpec:
    """The float output of a :class:`Rescale`: rows x width of its dtype, contiguous (the
    caller's tensor as it is: no pitch, the stores are one element each)."""
    return BufferSpec(name, rescale.dtype, Plain(lambda d: (rows(d), width(d))))


class RescaledRows:
    """The row writer of :meth:`Epilogue.emit` for a :class:`Rescale`: warp w holds read-back
    row ``row`` a word per lane, lane l on column n_base + l + 32 c of each of the
    COLUMN_GROUPS groups c; it rescales each word and stores it at its place in the
    contiguous output (``out_pitch`` = D's columns). A row's factor is one load all lanes
    share; the per-column values (dW's column scales, the bias, -0.0 where there is none,
    so the add changes nothing) and beta are loaded once, before the first pass. Every
    store is one element, so any width and any row start are aligned. An element's index
    is a u32 (row x width + column): outputs of up to 2^32 elements."""

    def __init__(self, out: Epilogue, rescale: Rescale, p: dict[str, str], from_partials: bool = False):
        self.out, self.rescale, self.p = out, rescale, p
        self.bytes = rescale.element_bytes
        # the words come from the int32 partial sums in global memory (zeroed as read)
        # instead of the ring (Epilogue.each_row)
        self.from_partials = from_partials

    def prepare(self) -> None:
        """Column predicates, beta, and this lane's column scales and bias (-0.0 past the
        last column or without a bias)."""
        out, rescale, p = self.out, self.rescale, self.p
        ptx = out.ptx
        self.in_cols = [ptx.setp("gt", out.cols_left, 32 * c) for c in range(out.COLUMN_GROUPS)]
        space = "shared" if rescale.beta_shared else "global"
        self.second = [ptx.load_f32(space, p[rescale.beta])] * out.COLUMN_GROUPS if rescale.beta else []
        if rescale.col_scales:
            at = ptx.byte_offset(p[rescale.col_scales], out.col, 4)
            self.second = [ptx.load("global", "f32", at, 128 * c, guard=ok, into=ptx.fmov(0.0))
                           for c, ok in enumerate(self.in_cols)]
        self.bias = []
        if rescale.bias:
            on = ptx.setp("ne", p[rescale.has_bias], 0, "u32")
            at = ptx.byte_offset(p[rescale.bias], out.col, self.bytes)
            for c, ok in enumerate(self.in_cols):
                guard = ptx.fresh("pred", "and.pred", on, ok)
                if self.bytes == 4:
                    self.bias.append(ptx.load("global", "f32", at, 128 * c, guard=guard, into=ptx.fmov(-0.0)))
                else:
                    half = ptx.fresh("b16", "mov.b16", NEGATIVE_ZERO_HALF)
                    ptx.load("global", "b16", at, 64 * c, guard=guard, into=half)
                    self.bias.append(ptx.cvt("f32", SHORT_NAMES[rescale.dtype], half))

    def write_row(self, row: str, j: int) -> None:
        """Rescale and store read-back row ``j`` of this warp (D row ``row``)."""
        out, rescale = self.out, self.rescale
        ptx = out.ptx
        if rescale.row_scales_shared:
            factor = ptx.load_f32("shared", ptx.add(self.p[rescale.row_scales], ptx.shl(ptx.sub(row, out.at.m_base), 2)))
        else:
            factor = ptx.load_f32("global", ptx.byte_offset(self.p[rescale.row_scales], row, 4))
        ptr = ptx.byte_offset(out.out, ptx.mad(row, out.out_pitch, out.col), self.bytes)
        # the smaller factor first (stepmath.rescaled): once a row with beta, a column each for dW
        pairs = ([smaller_first(ptx, factor, self.second[0])] * out.COLUMN_GROUPS if rescale.beta
                 else [smaller_first(ptx, factor, second) for second in self.second])
        if self.from_partials:
            sums = ptx.byte_offset(self.p[rescale.partials], ptx.mad(row, self.p["ldo"], out.col), 4)
            zero = ptx.mov(0)
        for c in range(out.COLUMN_GROUPS):
            if self.from_partials:  # read at L2 (.cg): the other splits added there; left 0 for the next launch
                word = ptx.load("global.cg", "b32", sums, 128 * c, guard=self.in_cols[c], zero_fill=True)
                ptx.store("global", "b32", sums, zero, 128 * c, guard=self.in_cols[c])
            else:
                word = ptx.load("shared", "b32", out.read_at, out.tile.warps * j * out.row_bytes + 128 * c)
            lo, hi = pairs[c]
            value = ptx.fmul(ptx.fmul(ptx.cvt("f32", "s32", word, rnd="rn"), lo), hi)
            if self.bias:
                value = ptx.fadd(value, self.bias[c])
            if self.bytes == 4:
                ptx.store("global", "f32", ptr, value, 128 * c, guard=self.in_cols[c])
            else:
                ptx.store("global", "b16", ptr, ptx.cvt(SHORT_NAMES[rescale.dtype], "f32", value, rnd="rn"), 64 * c,
                          guard=self.in_cols[c])


def emit_split_rescale(ptx: Ptx, at: Coords, out: Epilogue, partial: Epilogue, rescale: Rescale,
                       p: dict[str, str]) -> None:
    """One split of a split rescaled launch: add this CTA's int32 sums into the partials
    (staged, red.global.add.s32, as the int32 split-K does: exact in any order), then take
    the tile's arrival ticket; the CTA that arrives last reads the whole sums back, rescales
    them once (:class:`RescaledRows` over :meth:`Epilogue.each_row`) and leaves the
    partials and the ticket at 0 for the next launch, so no launch clears them.

    Ordering (PTX ISA 8, the memory consistency model): every thread fences
    (``fence.acq_rel.gpu``) after its reds and before the barrier that precedes thread 0's
    ticket, so a CTA that sees the count reach ``splits`` - 1 sees every other split's
    sums once it has fenced too; it reads them at L2 (``ld.global.cg``). The verdict is
    passed to the CTA through the ring's first word (no warp reads the ring any more)."""
    partial.emit(partial.added_row, "add")
    ptx.fence()  # this thread's sums are out before the ticket
    ptx.barrier()  # every thread's sums are out, and nobody reads the ring any more
    first = ptx.setp("eq", at.tid, 0, "u32")
    tile = ptx.mad(ptx.special("%ctaid.y"), ptx.special("%nctaid.x"), ptx.special("%ctaid.x"))
    ticket = ptx.byte_offset(p[rescale.tickets], tile, 4)
    arrived = ptx.mov(0)
    ptx.take_ticket(ticket, into=arrived, guard=first)
    last = ptx.setp("eq", arrived, ptx.sub(ptx.special("%nctaid.z"), 1, "u32"), "u32")
    ptx.store("shared", "b32", out.buffer, ptx.selp(1, 0, last), guard=first)
    ptx.store("global", "b32", ticket, ptx.mov(0), guard=ptx.fresh("pred", "and.pred", first, last))
    ptx.barrier()  # the verdict is in the ring
    ptx.branch("rescale_done", guard=ptx.setp("eq", ptx.load("shared", "b32", out.buffer), 0, "u32"))
    ptx.fence()  # the other splits' sums are seen
    writer = RescaledRows(out, rescale, p, from_partials=True)
    out.each_row(writer.write_row, "last", prepare=writer.prepare)
