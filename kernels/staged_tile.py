"""The staged CTA tile: D[m, n] = sum_k A[m, k] B[k, n], activations through shared memory.

Layout of the work:

- a CTA of ``warps_m`` x 4 warps computes a (16 warps_m m_tiles) x 128 tile of D
  (:class:`Tile`; the large one: 8 warps, 128 x 128, each warp a 64 x 32 block of four
  m16 x four n8 ``mma.m16n8k32`` accumulators, so a fragment load serves 4 mma);
- the contraction runs in chunks of 64 bytes of k. Staged operands sit in shared memory as
  rows of one chunk (64 bytes = four 16-byte pieces), piece p of row r stored at piece
  ``p ^ ((r >> 1) & 3)``: the 8 rows one ``ldmatrix`` phase reads (and the 8 pieces one
  16-byte store phase writes) fall into 8 different 16-byte bank groups, so neither
  conflicts. Rows 8 apart keep the same swizzle, so fragment tiles 8 or 16 rows apart
  are immediate offsets;
- fragments come from ``ldmatrix.x4`` (PTX ISA 9.7.14.5.15): for A (row-major [m][k])
  lane l addresses row (l & 7) + 8((l >> 3) & 1) at piece 2s + (l >> 4), which gives
  exactly the m16n8k32 A fragment of k step s; for B stored [n][k] lane l addresses
  row l & 7 at piece l >> 3, which gives the B fragments of one n8 tile for both k steps;
- A (activations, int8 rows with a 16-byte aligned pitch, ``kernels/pitch.py``) is
  copied global -> shared with 16-byte ``cp.async.cg`` into a ring of ``stages`` chunks,
  ``stages - 1`` chunks ahead of the one being multiplied. Tails need no separate code:
  a copy's src-size is the bytes left in its row (0 past the last row or past K), the
  rest of the 16 bytes is zero-filled by the copy and never read;
- B is either staged the same way (dW: dYq^T rows) or packed ternary W
  (:class:`FragmentTernary`, forward and dX): each lane loads one u32 per n8 tile a
  chunk ahead from W's planes (``kernels/planes.py``) and decodes it with ``prmt`` on
  0x00FF0100 straight into its B fragment registers, never through shared memory;
- one ``bar.sync`` per chunk: after this thread's copies of the chunk have landed
  (``cp.async.wait_group stages - 2``), it publishes them to the CTA and tells every
  thread that the stage read in the previous chunk is free, so the next copies may go
  there.

The loop is uniform: every thread runs ceil(K / 64) chunks, only the copy sizes differ.
After it the output (``Epilogue``): with one split each lane stores four consecutive
columns of a row straight from its accumulators (B's column order makes them consecutive),
16 bytes with one st.global.v4; with split-K the A ring is reused to stage the sums so
that each red.global request is 32 consecutive words. A rescaled output (``Rescale``: the
caller's float type, rescaled from the int32 sums) is staged the same way and written a
row of 32 consecutive elements a request; split, it reduces in int32 first.
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

from kernels import cost
from kernels.pitch import (output_pitch, pitch as row_pitch_of, pitch_param, pitched_output, pitched_rows,
                           planes_param)
from kernels.planes import Planes
from kernels.ptx_emit import TERNARY_PRMT_TABLE, Ptx, decode_ternary
from kernels.spec import BufferSpec, Dims, KernelSpec, Launch

WARPS_N = 4  # warps along N; every configuration is TILE_N = 128 columns wide
WARP_N = 32
TILE_N = WARPS_N * WARP_N
N_TILES = WARP_N // 8
CHUNK_K = 64  # bytes of k per chunk: two k32 mma steps
PIECE = 16  # bytes per cp.async and per ldmatrix row
PIECES = CHUNK_K // PIECE
STAGE_BYTES = TILE_N * CHUNK_K  # stride of a ring stage: room for the widest operand (TILE_N rows)
SHARED_ALIGN = 128  # swizzled addresses flip bit 5 with xor: the base keeps bits 0-6 clear
MIN_SPLIT_CHUNKS = 2  # a split runs at least this many chunks (its copy-ahead prologue amortised)
# The tile rule's rates, from the cost model's device facts (kernels/devices.json) for the
# GPU it scores for (kernels.cost.RULE_DEVICE: H200 SXM, 132 SMs, 1.83 GHz tensor clock)
RATES = cost.rule_rates(cost.device(cost.RULE_DEVICE))
TARGET_CTAS = RATES.target_ctas  # split-K fills at most one CTA per SM
MACS_PER_SM_CLOCK = RATES.macs_per_sm_clock  # int8 dense peak x the fraction mma.sync reaches, per SM clock
L2_BYTES_PER_CLOCK = RATES.l2_bytes_per_clock
SCHEDULERS = RATES.schedulers  # warp schedulers per SM, one instruction a clock each


class Tile(NamedTuple):
    """One CTA configuration: ``warps_m`` x WARPS_N warps, each ``m_tiles`` m16 tiles by
    N_TILES n8 tiles, so the CTA computes (16 warps_m m_tiles) x TILE_N of D, with a copy
    ring of ``stages`` chunks. Only M varies: a small M wastes fewer rows of a short
    batch (R = 27) and gives the grid more CTAs; a large M reuses each decoded B chunk
    and each B fragment across more rows."""

    warps_m: int
    m_tiles: int
    stages: int = 4  # chunks in the ring; a power of two wraps with an and
    # CTAs an SM must hold at once, stated to ptxas as .minnctapersm (PTX ISA 11.4): 2 CTAs
    # of 256 threads cap it at the build's 128 registers a thread (65536 per SM); 1 leaves
    # the allocation to ptxas
    min_ctas: int = 1

    @property
    def warps(self) -> int:
        return self.warps_m * WARPS_N

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
        """16-byte copies per thread per chunk for an operand of ``rows`` tile rows."""
        return rows * PIECES // self.threads

    @property
    def label(self) -> str:
        return f"{self.m}x{TILE_N}"


LARGE = Tile(warps_m=2, m_tiles=4, min_ctas=2)  # 128 x 128, 8 warps of 64 x 32: 64 accumulators a thread
SMALL = Tile(warps_m=1, m_tiles=2)  # 32 x 128, 4 warps of 32 x 32


class Plan(NamedTuple):
    """How a launch covers the contraction: ``splits`` CTAs along grid z, each over
    ``span`` bytes of k (a whole number of chunks; the last split may get fewer)."""

    splits: int
    span: int


def output_tiles(rows: int, cols: int, tile: Tile) -> tuple[int, int]:
    """CTA tiles across a rows x cols output: (along columns, along rows), grid x and y."""
    return -(-cols // TILE_N), -(-rows // tile.m)


def split_k(rows: int, cols: int, contraction: int, tile: Tile, split: bool = True) -> Plan:
    """The one split-K rule: split the contraction into as many parts as keep the
    launch within TARGET_CTAS CTAs (one per SM), keeping at least MIN_SPLIT_CHUNKS
    chunks per split. A split beyond one CTA per SM shortens no SM's chunk loop (two
    CTAs on one SM share its issue and L1) but adds a red.global epilogue, so it stops
    there. Splits add their partial sums into a zeroed output with red.global.add.s32
    (exact: int32 addition wraps, so any order gives the same, in-range, total).
    ``split=False``: one CTA walks the whole contraction (the rescaled outputs, which
    must see a tile's whole int32 sum before they round it: :class:`Rescale`)."""
    tiles = math.prod(output_tiles(rows, cols, tile))
    chunks = -(-contraction // CHUNK_K)
    if not split:
        return Plan(splits=1, span=chunks * CHUNK_K)
    wanted = min(TARGET_CTAS // tiles, chunks // MIN_SPLIT_CHUNKS)
    per_split = -(-chunks // max(1, wanted))
    return Plan(splits=-(-chunks // per_split), span=per_split * CHUNK_K)


def rule_cost(rows: int, cols: int, contraction: int, tile: Tile, b_bits: int,
              loop_instructions: int, operand_lines: int = 0, b_shared: bool = True,
              rescaled_bytes: int = 0, rescaled_split: bool = False, plan: Plan | None = None) -> tuple[int, int]:
    """The one tile rule's score of ``tile`` on a rows x cols output over ``contraction``
    (lower is better; ``kernels.registry.choose`` takes the lowest): clocks of the
    largest of four costs, then, on a tie, the bytes moved.

    - tensor: padded multiply-adds on the busiest SM (the launch after split-K, CTAs
      spread over TARGET_CTAS SMs) at MACS_PER_SM_CLOCK;
    - issue: the busiest SM's warps x ``loop_instructions`` (SASS per warp per chunk of
      this tile's loop, from ``doit sass``) x chunks / SCHEDULERS;
    - L1: the busiest SM's 128-byte shared-memory and output wavefronts
      (:func:`l1_wavefronts`, B's only when ``b_shared``) and its operands' global lines
      (``operand_lines`` a chunk,
      the kernel's :func:`segment_lines` count), one a clock;
    - L2: bytes every CTA moves, its operands in (B at ``b_bits`` per element: 2 for
      packed W) and its int32 tile out (each split writes or adds a whole tile), at
      L2_BYTES_PER_CLOCK.

    A short batch (R = 27) wastes most of a 128-row tile, so the small tile wins there; a
    large problem fills every SM with either, and the small tile's extra issue and
    bytes per multiply-add lose.

    ``rescaled_bytes`` (4 or 2): the output is the rescaled float tile of that many bytes
    an element (:class:`Rescale`): no split unless ``rescaled_split``, and the tile's L1
    and L2 costs are the float rows' (:func:`rescaled_wavefronts`); split, every CTA adds
    its int32 tile as the int32 split-K does, and one CTA a tile reads the sums back,
    clears them and writes the floats (counted on every CTA: the busiest SM has one).
    ``plan``: score this plan instead of :func:`split_k`'s (:func:`rescaled_plan`)."""
    plan = plan or split_k(rows, cols, contraction, tile, split=rescaled_split or not rescaled_bytes)
    ctas = math.prod(output_tiles(rows, cols, tile)) * plan.splits
    per_sm = -(-ctas // TARGET_CTAS)
    tensor = per_sm * tile.m * TILE_N * plan.span // MACS_PER_SM_CLOCK
    issue = per_sm * tile.warps * loop_instructions * (plan.span // CHUNK_K) // SCHEDULERS
    chunks = plan.span // CHUNK_K
    shared = per_sm * (l1_wavefronts(tile, chunks, plan.splits, b_shared, rescaled_bytes) + chunks * operand_lines)
    moved = ctas * ((tile.m + TILE_N * b_bits // 8) * plan.span + (rescaled_bytes or 4) * tile.m * TILE_N)
    if rescaled_bytes and plan.splits > 1:  # the int32 adds, then the last CTA's read, clear and float write
        moved += ctas * 4 * tile.m * TILE_N + (ctas // plan.splits) * 8 * tile.m * TILE_N
    return max(tensor, issue, shared, moved // L2_BYTES_PER_CLOCK), moved


def l1_wavefronts(tile: Tile, chunks: int, splits: int, b_shared: bool = True, rescaled_bytes: int = 0) -> int:
    """128-byte L1 wavefronts one CTA of ``tile`` spends in shared memory and on its
    output (the layout is free of bank conflicts, so bytes / 128): per chunk, both
    operands stored once and read by ldmatrix once per warp that needs them (A by each
    of the WARPS_N warp columns, B by each of the ``warps_m`` warp rows; B not at all
    without ``b_shared``: forward decodes W into registers); then the int32
    tile: with one split stored from the accumulators, 8 rows x 64 bytes a request (a
    wavefront per 128-byte line, so bytes / 64); with several written to shared, read
    back and added to global (three passes of bytes / 128); a rescaled float tile
    (``rescaled_bytes`` an element): :func:`rescaled_wavefronts`."""
    b_rows = TILE_N if b_shared else 0
    stored = (tile.m + b_rows) * CHUNK_K
    read = tile.m * CHUNK_K * WARPS_N + b_rows * CHUNK_K * tile.warps_m
    out = output_wavefronts(4 * tile.m * TILE_N, splits)
    if rescaled_bytes:
        out = rescaled_wavefronts(tile) + (out if splits > 1 else 0)
    return int(chunks * (stored + read) // 128 + out)


def rescaled_wavefronts(tile: Tile) -> int:
    """L1 wavefronts of a rescaled tile (``Epilogue`` with :class:`RescaledRows`): the int32
    sums written to shared and read back (two passes of 4 bytes an element / 128), then
    one store request per 32 consecutive elements of a row, at most 2 lines each (a row
    of the contiguous output starts anywhere in a line), for f32 and 16-bit alike."""
    elements = tile.m * TILE_N
    return 2 * 4 * elements // 128 + 2 * elements // 32


def output_wavefronts(output_bytes: float, splits: int) -> float:
    """L1 wavefronts of writing ``output_bytes`` of int32 results (``Epilogue``): from the
    accumulators, 64 contiguous bytes a row of a request (one wavefront per 128-byte line,
    so bytes / 64) with one split; staged and added with several (written to shared, read
    back, added to global: three passes of bytes / 128)."""
    return output_bytes * (1 / 64 if splits == 1 else 3 / 128)


def segment_lines(count: int, nbytes: int, stride: int) -> int:
    """128-byte lines that ``count`` segments of ``nbytes`` (at most 128), ``stride``
    bytes apart, touch (first order, the first line-aligned): one each when they lie a
    line or more apart, else the span they fill. A chunk's operand rows are such
    segments: 64 bytes of k a row, or W's 16 bytes of a column in a plane."""
    if stride >= 128:
        return count
    return -(-count * max(stride, nbytes) // 128)


def fragment_w_lines(tile: Tile) -> int:
    """Global lines a chunk's W loads touch when every warp decodes its own B fragments
    (:class:`FragmentTernary`): one request per n tile a warp, each 8 columns' 16 bytes in
    pairs over 256 bytes (2 lines)."""
    return tile.warps * N_TILES * segment_lines(8, PIECE, 2 * PIECE)


def ternary_specs(family: str, tiles: tuple[Tile, ...], out: str, rows: str, row_pitch: str,
                  contraction: str, cols: str, order: Planes, loop_family: str | None = None,
                  rescale: "Rescale | None" = None, **fields: Any) -> tuple[KernelSpec, ...]:
    """Each tile's KernelSpec of a product of int8 rows with ternary W (forward and dX):
    D = ``out`` (R x ``cols``), A = ``rows`` (R x ``contraction``, ``row_pitch`` bytes a
    row) staged, B = W in planes of ``order`` decoded into fragments
    (:class:`FragmentTernary`). The tile rule counts A's ``tile.m`` rows of 64 bytes a
    chunk and every warp's W loads, and no B in shared memory. ``rescale``: D is written
    rescaled (:class:`Rescale`), contiguous. ``fields``: make_inputs, reference,
    gemm_form."""
    def operands(ptx: Ptx, at: Coords, p: dict[str, str]) -> tuple[StagedRows, Source]:
        return (StagedRows(ptx, at, p[rows], p[row_pitch], rows=p["R"], k_limit=p[contraction]),
                FragmentTernary(ptx, at, p["w"], cols=p[cols]))

    def operand_lines(d: Dims, tile: Tile) -> int:
        return segment_lines(tile.m, CHUNK_K, row_pitch_of(getattr(d, contraction))) + fragment_w_lines(tile)

    def width(name: str) -> Callable[[Dims], int]:
        return lambda d: getattr(d, name)

    output = (pitched_output(out, width("R"), width(cols)) if rescale is None
              else rescaled_output(out, rescale, width("R"), width(cols)))
    return tuple(staged_spec(
        family, tile, gemm=("R", cols, contraction),
        buffers=(output, pitched_rows(rows, width("R"), width(contraction)), planes_param("w", order)),
        pitch=pitch_param(row_pitch, width(contraction)), operands=operands, b_bits=2,
        loop_family=loop_family, operand_lines=operand_lines, b_shared=False, rescale=rescale, **fields,
    ) for tile in tiles)


def entry_name(family: str, tile: Tile) -> str:
    """The PTX entry of ``family`` on ``tile``: the family's name for the large tile, a
    suffix with the tile's M otherwise (hslm_fwd_s8_m32)."""
    return family if tile.m == LARGE.m else f"{family}_m{tile.m}"


def staged_spec(family: str, tile: Tile, gemm: tuple[str, str, str], buffers: tuple[BufferSpec, ...],
                pitch: BufferSpec, operands: Callable[[Ptx, Coords, dict[str, str]], tuple["StagedRows", "Source"]],
                b_bits: int, operand_lines: Callable[[Dims, Tile], int], loop_family: str | None = None,
                b_shared: bool = True, rescale: "Rescale | None" = None, **fields: Any) -> KernelSpec:
    """``family`` on ``tile`` as a KernelSpec: what every staged kernel shares, so a kernel
    module says only what differs.

    ``gemm`` names the Dims fields that are D's rows, D's columns and the contraction
    ("R", "N", "K" for forward); ``buffers`` are the output and the inputs, followed by the
    u32 sizes R, K, N, ``pitch`` and the split's ``kspan``; ``operands(ptx, at, p)`` builds
    the A and B sources from the loaded parameters ``p``; the output's row pitch ``ldo``
    (``kernels.pitch.output_pitch`` words) follows ``pitch``; ``b_bits``, the loop's
    instructions per chunk (counted from ptxas's SASS into ledger/loop_counts.json, read
    by ``kernels.cost.loop_counts``: this tile's entry of ``loop_family``, the int32
    family whose main loop the kernel shares, its own by default), ``operand_lines(dims,
    tile)`` (the global lines a chunk's copies and loads touch) and ``b_shared`` (B passes
    through shared memory) feed the tile rule (:func:`rule_cost`); ``fields``
    are the rest of the KernelSpec (make_inputs, reference, gemm_form, max_rows).

    With ``rescale`` the output is the rescaled float tile (:class:`Rescale`): its
    buffers follow ``buffers``, its scalars follow ``pitch`` (the output's rows are D's
    columns apart). Without partials there is no ``ldo`` and no ``kspan`` (no split: one
    CTA per tile walks the whole contraction); with them ``ldo`` (the partials' row
    pitch) and ``kspan`` come last, and the plan is the cheaper by the rule of split_k's
    and one split."""
    name = entry_name(family, tile)
    rows, cols, contraction = gemm

    def extents(d: Dims) -> tuple[int, int, int]:
        return getattr(d, rows), getattr(d, cols), getattr(d, contraction)

    def rule(d: Dims, plan: Plan | None = None) -> tuple[int, int]:
        loop = cost.loop_counts(entry_name(loop_family or family, tile)).fast.instructions
        return rule_cost(*extents(d), tile, b_bits=b_bits, loop_instructions=loop,
                         operand_lines=operand_lines(d, tile), b_shared=b_shared,
                         rescaled_bytes=rescale.element_bytes if rescale else 0,
                         rescaled_split=bool(rescale and rescale.splits), plan=plan)

    def plan(d: Dims) -> Plan:
        if rescale is not None and rescale.splits:  # split only where the rule says it pays
            return min((split_k(*extents(d), tile=tile), split_k(*extents(d), tile=tile, split=False)),
                       key=lambda candidate: rule(d, candidate))
        return split_k(*extents(d), tile=tile, split=rescale is None)

    sizes = tuple(BufferSpec(n, "uint32", None) for n in ("R", "K", "N"))
    split_params = (BufferSpec("ldo", "uint32", None, value=lambda d: output_pitch(getattr(d, cols))),  # int32 words a row
                    BufferSpec("kspan", "uint32", None, value=lambda d: plan(d).span))  # k bytes per split
    if rescale is None:
        params = (*buffers, *sizes, pitch, *split_params)
    else:
        params = (*buffers, *rescale.buffers, *sizes, pitch, *rescale.scalars, *(split_params if rescale.splits else ()))

    def emit() -> str:
        ptx, p = begin(name, params, tile)
        at = Coords(ptx, p["kspan"] if "kspan" in p else p[contraction], tile)
        a, b = operands(ptx, at, p)
        emit_staged(ptx, at, a, b, k_limit=p[contraction], out=p[buffers[0].name], rows=p[rows], cols=p[cols],
                    out_pitch=p["ldo"] if rescale is None else p[cols],
                    rescale=None if rescale is None else (rescale, p))
        return ptx.render()

    return KernelSpec(
        name=name, emit=emit, params=params, stages=tile.stages, family=family, tile=tile.label,
        geometry=lambda d: geometry(rows=getattr(d, rows), cols=getattr(d, cols), plan=plan(d), tile=tile),
        cost=lambda d: rule(d, plan(d)),
        **fields)


def begin(name: str, params: tuple[BufferSpec, ...], tile: Tile) -> tuple[Ptx, dict[str, str]]:
    """A kernel entry of ``tile.threads`` per CTA with its parameters loaded (buffers as global
    pointers, sizes and pitches as u32)."""
    ptx = Ptx(name, [(p.name, "u64" if p.shape else "u32") for p in params], tile.threads,
              min_ctas=tile.min_ctas)
    return ptx, {p.name: ptx.param_ptr(p.name) if p.shape else ptx.param_u32(p.name) for p in params}


def geometry(rows: int, cols: int, plan: Plan, tile: Tile) -> Launch:
    """Grid over a rows x cols output: x walks columns (TILE_N), y walks rows (tile.m),
    z the contraction's splits."""
    return Launch(grid=(*output_tiles(rows, cols, tile), plan.splits), block=(tile.threads, 1, 1))


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


class Source:
    """One operand's part of the chunk loop; each hook emits nothing unless overridden."""

    def issue(self, stage_offset: str | int, whole: bool = False) -> None:
        """Start copying the next chunk into the ring stage at ``stage_offset`` (``whole``:
        the chunk is known to end at or before K)."""

    def whole_next(self) -> str | None:
        """A predicate: the next chunk this source copies ends at or before K, so its
        copies need no tail arithmetic (None: they never do)."""
        return None

    def before_barrier(self) -> None:
        """Write this thread's share of the chunk (the barrier that follows publishes it)."""

    def after_issue(self, more: str) -> None:
        """Start fetching what the next chunk needs (``more``: this CTA has a next chunk)."""

    def end_chunk(self) -> None:
        """Step per-chunk state."""


def nk_fragments(ptx: Ptx, read_at: str) -> list[list[list[str]]]:
    """B fragments from a swizzled [n][k] tile: lane l reads row l & 7 of each n8 tile at
    piece l >> 3 with one ``ldmatrix.x4``, the tile's B registers for both k steps.
    Returns [k step][n tile] -> two registers."""
    tiles = [ptx.ldmatrix_x4(read_at, ni * 8 * CHUNK_K) for ni in range(N_TILES)]
    return [[regs[2 * step:2 * step + 2] for regs in tiles] for step in range(2)]


def nk_read_offset(ptx: Ptx, at: Coords) -> str:
    return swizzled(ptx, ptx.mad(at.warp_n, WARP_N, ptx.band(at.lane, 7)), ptx.shr(at.lane, 3))


def paired_columns(ptx: Ptx, at: Coords) -> str:
    """D column of this lane's c0 when n tiles 2p and 2p + 1 interleave in pairs of
    columns: lane (g, t) holds columns 16p + 4t .. 16p + 4t + 3 of its row, one
    st.shared.v4 when the output is staged (``Epilogue``)."""
    return ptx.add(ptx.mad(at.warp_n, WARP_N, ptx.shl(ptx.band(at.lane, 3), 2)), at.n_base)


def paired_column_of_row(ptx: Ptx, row: str) -> str:
    """The D column (past n_base) that [n][k] B row ``row`` holds so that its fragments
    land as ``paired_columns`` says: row 8 tile + n of a warp's 32 is column
    16 (tile >> 1) + 4 (n >> 1) + 2 (tile & 1) + (n & 1), i.e. bits 3, 2, 1 of the row
    move to bits 1, 3, 2."""
    kept = ptx.band(row, ~0b1110 & 0xFFFFFFFF)
    return ptx.binop("or", ptx.binop("or", kept, ptx.shl(ptx.band(row, 0b0110), 1), "b32"),
                     ptx.band(ptx.shr(row, 2), 0b0010), "b32")


class StagedRows(Source):
    """int8 rows [m][k] (``pitch`` bytes apart) copied into a ring of ``tile.stages`` stages,
    as A (``b=False``: rows are D's rows) or as B stored [n][k] (``b=True``: rows are
    D's columns, B row r holding column ``paired_column_of_row(r)``).

    Thread ``tid`` copies piece ``tid & 3`` of rows ``tid >> 2`` + P j, P = threads / 4
    (``tile.rows_per_pass``), for j < ``tile.copies(rows)``: the P rows of one j are
    64 P bytes of the stage, an immediate apart. Rows past the last
    are zero-filled. Along k, by default a piece is copied whole while it starts inside
    the row (k < K) and zero-filled after (ignore-src): bytes from K to the end of the
    row's last piece are the caller's padding, read as they are, so the other operand
    must be zero there (W's planes are: padded with code 0 to a multiple of 128). With
    ``exact_tail`` the copy's src-size stops at K and the padding is
    never read (a few more instructions per copy), in the chunks that reach past K
    only: a chunk that ends at or before K (``whole_next``) is copied as whole pieces,
    and ``emit_staged`` runs those chunks in a loop of their own.
    """

    def __init__(self, ptx: Ptx, at: Coords, ptr: str, pitch: str, rows: str, k_limit: str,
                 b: bool = False, exact_tail: bool = False):
        self.ptx, self.b, self.exact_tail = ptx, b, exact_tail
        tile = at.tile
        self.m_tiles, self.step_rows = tile.m_tiles, tile.rows_per_pass
        row, piece = ptx.shr(at.tid, 2), ptx.band(at.tid, PIECES - 1)
        self.ring = ring = ptx.shared_array("b_ring" if b else "a_ring", tile.stages * STAGE_BYTES, SHARED_ALIGN)
        self.copy_at = ptx.add(ring, swizzled(ptx, row, piece))
        first = ptx.add(at.n_base, paired_column_of_row(ptx, row)) if b else ptx.add(at.m_base, row)
        rows_j = [ptx.add(first, self.step_rows * j) for j in range(tile.copies(TILE_N if b else tile.m))]
        # each copy's row start stays put; the byte of k this thread's piece starts at
        # walks a chunk per issue and is also the test for pieces past K
        self.rows_at = [ptx.byte_offset(ptr, r, pitch) for r in rows_j]
        self.k_at = ptx.mad(piece, PIECE, at.k_first)
        self.k_limit = k_limit
        # exact tail: src-size = bytes left while the row exists; else ignore-src past it
        self.row_test = [ptx.setp("lt" if exact_tail else "ge", r, rows, "u32") for r in rows_j]
        if exact_tail:  # a whole chunk: ignore-src for a row past the last, no src-size
            self.row_past = [ptx.setp("ge", r, rows, "u32") for r in rows_j]
            # this piece's chunk ends at or before K while k_at <= K - 64 + 16 (tid & 3)
            self.whole_until = ptx.sub(ptx.mad(piece, PIECE, k_limit), CHUNK_K)
        if b:
            self.read_at = ptx.add(ring, nk_read_offset(ptx, at))
            self.col_first = paired_columns(ptx, at)
        else:  # ldmatrix rows (l & 7) + 8 ((l >> 3) & 1) = l & 15 of each m16 tile, piece l >> 4
            read_row = ptx.mad(at.warp_m, tile.warp_m, ptx.band(at.lane, 15))
            self.read_at = ptx.add(ring, swizzled(ptx, read_row, ptx.shr(at.lane, 4)))

    @staticmethod
    def col_offset(tile: int, e: int) -> int:
        """As B: D column of fragment element (tile, c_e) past ``col_first`` (4t), B's rows
        in ``paired_column_of_row`` order: 16 (tile >> 1) + 2 (tile & 1) + e."""
        return 16 * (tile >> 1) + 2 * (tile & 1) + e

    def whole_next(self) -> str | None:
        if not self.exact_tail:
            return None
        return self.ptx.setp("le", self.k_at, self.whole_until, "s32")

    def issue(self, stage_offset: str | int, whole: bool = False) -> None:
        """Copy the next chunk into the stage at ``stage_offset``; step to the one after."""
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
        for j, fill in enumerate(fills):
            ptx.cp_async(dst, ptx.byte_offset(self.rows_at[j], self.k_at, 1), fill,
                         dst_offset=j * self.step_rows * CHUNK_K)
        ptx.increment(self.k_at, CHUNK_K)

    def a_fragments(self, stage_offset: str):
        """Per k step (loaded when the loop asks for it): [m tile] -> the four A registers."""
        ptx = self.ptx
        low = ptx.add(self.read_at, stage_offset)
        high = ptx.binop("xor", low, 2 * PIECE, "b32")  # piece 2 + (l >> 4): bit 5 flips
        for base in (low, high):
            yield [ptx.ldmatrix_x4(base, mi * 16 * CHUNK_K) for mi in range(self.m_tiles)]

    def b_fragments(self, stage_offset: str) -> list[list[list[str]]]:
        return nk_fragments(self.ptx, self.ptx.add(self.read_at, stage_offset))


class FragmentTernary(Source):
    """B[k][n] = ternary W decoded straight into the mma's B fragments, with no shared
    memory between (forward: B = W, k = in-feature, n = out-feature; dX: B = W^T).

    An m16n8k32 B fragment gives lane (g, t) column g of the n8 tile and k = 4t .. 4t + 3
    (b0) and 16 + 4t .. 16 + 4t + 3 (b1) of a k step (PTX ISA, mma.m16n8k32 fragments for
    .s8); over a chunk's two steps that is 16 codes of one column, exactly one word of W's
    ``FRAGMENTS`` planes (``kernels/planes.py``), whose decode gives the four registers in
    order. So each lane loads one word per n tile a chunk ahead (4 per chunk, an immediate
    offset apart from one walking pointer, under the loop's back-edge predicate) and
    decodes them before the barrier; the words are loaded again into the same registers
    after it. Tile ni, row g of a warp holds column ``paired_column_of_row(8 ni + g)``,
    so the epilogue's stores from registers work as for a staged B, and a warp's request
    is 8 columns' 16 bytes in pairs: 4 whole sectors.

    The warps of one n quarter decode the same words (2 of them on the 128 x 128 tile),
    and do not split the decode. A word's decode is 9 SASS instructions (a shift, two
    masks, two shifts, four prmt), 36 of the loop's 106 a chunk (sm_80). Warps cannot
    share registers (a shuffle stays inside a warp), so sharing means shared memory:
    each warp would decode 2 words, store its 8 registers and load the other warp's 8
    (two 16-byte st.shared and two ld.shared): 18 decode instructions and 2 loads
    fewer, 4 memory and about 2 address instructions more a chunk, but 8 KiB of
    decoded B written and read a chunk in a double-buffered 16 KiB (the 48 KiB static
    limit with the 32 KiB ring). By the tile rule's rates (``rule_cost``,
    ``l1_wavefronts``) a chunk of the large tile is tensor-bound: 366 clocks of
    multiply-adds, 320 shared wavefronts (A stored once, read by the four warp
    columns), 212 clocks of issue (8 warps x 106 / 4 schedulers); the 128 wavefronts
    that sharing adds (448) would make shared memory the bound to save issue that is
    not."""

    def __init__(self, ptx: Ptx, at: Coords, w_ptr: str, cols: str):
        self.ptx = ptx
        group, quad = ptx.shr(at.lane, 2), ptx.band(at.lane, 3)
        plane = ptx.shl(ptx.round_up(cols, TILE_N), 4)  # bytes of a plane: 16 per column
        self.step = ptx.widen(plane)  # a chunk is a plane on
        first = ptx.add(at.n_base, paired_column_of_row(ptx, ptx.mad(at.warp_n, WARP_N, group)))
        at_plane = ptx.byte_offset(w_ptr, ptx.shr(at.k_first, 6), plane)  # this split's first chunk
        self.ptr = ptx.byte_offset(at_plane, ptx.mad(first, PIECES, quad), 4)
        # tile ni's column is 16 (ni >> 1) + 2 (ni & 1) past tile 0's (paired_column_of_row)
        self.offsets = [PIECE * (16 * (ni >> 1) + 2 * (ni & 1)) for ni in range(N_TILES)]
        # prmt takes its table from a register: a constant there is warp-uniform, and ptxas
        # keeps it in a uniform register and copies it into a new one for each prmt (12 a
        # chunk on the 128 x 128 tile). Adding tid >> 24 (0: a CTA has at most 1024
        # threads, PTX ISA 10, %tid) makes it a per-thread value, held in one register
        self.table = ptx.mov(TERNARY_PRMT_TABLE)
        ptx.increment(self.table, ptx.shr(at.tid, 24))
        self.packed = self.fetch()
        self.decoded: list[list[str]] = []
        self.col_first = paired_columns(ptx, at)

    def fetch(self, guard: str | None = None, into: list[str] | None = None) -> list[str]:
        """This lane's word of each n tile of the next chunk into fresh registers, or into
        ``into`` where ``guard`` holds; the pointer steps a plane on."""
        ptx = self.ptx
        words = [ptx.load("global", "u32", self.ptr, offset, guard=guard, into=reg)
                 for offset, reg in zip(self.offsets, into or [None] * N_TILES)]
        ptx.increment(self.ptr, self.step, "s64")
        return words

    def before_barrier(self) -> None:
        """Decode this chunk's words into fragment registers, freeing the word registers."""
        self.decoded = [decode_ternary(self.ptx, word, self.table) for word in self.packed]

    def after_issue(self, more: str) -> None:
        """Load the next chunk's words straight into the word registers, and only while
        there is a next chunk (``more``)."""
        self.fetch(guard=more, into=self.packed)

    def b_fragments(self, stage_offset: str) -> list[list[list[str]]]:
        """[k step][n tile] -> the tile's two B registers, as decoded."""
        return [[regs[2 * step:2 * step + 2] for regs in self.decoded] for step in range(2)]

    col_offset = staticmethod(StagedRows.col_offset)


def ring_step(ptx: Ptx, offset: str, stages: int, steps: int, into: str | None = None) -> str:
    """``offset`` + ``steps`` stages, wrapped in a ring of ``stages`` (an and when a power of 2)."""
    ring = stages * STAGE_BYTES
    moved = ptx.add(offset, steps * STAGE_BYTES)
    if stages & (stages - 1) == 0:
        wrapped = ptx.band(moved, ring - 1)
    else:
        wrapped = ptx.selp(ptx.sub(moved, ring), moved, ptx.setp("ge", moved, ring, "u32"))
    if into is not None:
        ptx.ins("mov.b32", into, wrapped)
    return wrapped


def emit_staged(ptx: Ptx, at: Coords, a: StagedRows, b: Source, k_limit: str, out: str,
                rows: str, cols: str, out_pitch: str,
                rescale: "tuple[Rescale, dict[str, str]] | None" = None) -> None:
    """The staged chunk loop over this CTA's split of k and the int32 output (rows
    ``out_pitch`` words apart, ``Epilogue``): stored straight from the accumulators, 16
    bytes a lane, when the launch has one split; staged through the A ring and added with
    red.global.add.s32 (into a zeroed output) when it has several. Rows past ``rows`` are
    neither; columns past ``cols`` are only stored, into the pitch's padding, when they
    share a lane's 16 bytes with one inside. With ``rescale`` (the :class:`Rescale` and
    the loaded parameters) the output is floats, ``out_pitch`` elements a row: with one
    split the sums are staged the same way, then rescaled and stored
    (:class:`RescaledRows`); with several they go through the partials
    (:func:`emit_split_rescale`).

    A source whose copies need tail arithmetic (``whole_next``) gets two loops of the
    same body: "chunk" while the next chunk to copy ends at or before K, copying it
    with no size arithmetic, then "chunk_tail" for the rest; each chunk runs in one of
    them, so the loops' trips are the one loop's."""
    stages = at.tile.stages
    acc = [[[ptx.mov(0) for _ in range(4)] for _ in range(N_TILES)] for _ in range(at.tile.m_tiles)]
    sources = (a, b)
    for stage in range(stages - 1):
        for src in sources:
            src.issue(stage * STAGE_BYTES)
        ptx.cp_async_commit()
    read_stage = ptx.mov(0)
    k_end = ptx.binop("min", ptx.add(at.k_first, at.span), k_limit, "u32")
    # A's copy offset walks a chunk a trip, stages - 1 chunks and its piece ahead of the
    # chunk being multiplied: compared with k_end moved as far, it counts the chunks
    # without a counter of its own (one add a trip fewer)
    copies_end = ptx.add(ptx.sub(a.k_at, at.k_first), k_end)

    # sources step k together against one K, so any one's whole-chunk test is everyone's
    whole = [test for test in (src.whole_next() for src in sources) if test is not None]
    if whole:  # copies with tail arithmetic: whole chunks in "chunk", the rest in "chunk_tail"
        ptx.branch("chunk_tail", guard="!" + whole[0])

    def chunk_loop(label: str, whole_copies: bool) -> None:
        ptx.label(label)
        ptx.cp_async_wait(stages - 2)  # this thread's copies of this chunk have landed
        for src in sources:
            src.before_barrier()
        ptx.barrier()  # everyone's copies and W are in; the previous chunk's stage is free
        write_stage = ring_step(ptx, read_stage, stages, stages - 1)
        for src in sources:
            src.issue(write_stage, whole=whole_copies)
        ptx.cp_async_commit()
        more = ptx.setp("lt", a.k_at, copies_end, "u32")  # a next chunk: fetch for it, and loop
        for src in sources:
            src.after_issue(more)
        frag_b = b.b_fragments(read_stage)
        for step, frag_a in enumerate(a.a_fragments(read_stage)):
            for mi in range(at.tile.m_tiles):
                for ni in range(N_TILES):
                    ptx.mma_s8(acc[mi][ni], frag_a[mi], frag_b[step][ni])
        for src in sources:
            src.end_chunk()
        ring_step(ptx, read_stage, stages, 1, into=read_stage)
        if whole_copies:  # stay while the next chunk is whole too; past the split's end, done
            next_whole = [test for test in (src.whole_next() for src in sources) if test is not None]
            ptx.branch(label, guard=ptx.fresh("pred", "and.pred", more, next_whole[0]))
            ptx.branch("chunks_done", guard="!" + more)
        else:
            ptx.branch(label, guard=more)

    if whole:
        chunk_loop("chunk", True)
        chunk_loop("chunk_tail", False)
        ptx.label("chunks_done")
    else:
        chunk_loop("chunk", False)
    ptx.cp_async_wait(None)  # no copy outlives the CTA or lands in the ring the output reuses

    out = Epilogue(ptx, at, acc, a.ring, b, out, rows, cols, out_pitch, stages * STAGE_BYTES)
    if rescale is not None:
        ptx.barrier()  # every warp's last fragments are read: the A ring is free to stage the sums
        spec, p = rescale
        if spec.splits:
            ptx.branch("rescale_alone", guard=ptx.setp("eq", ptx.special("%nctaid.z"), 1, "u32"))
            partial = Epilogue(ptx, at, acc, a.ring, b, p[spec.partials], rows, cols, p["ldo"], stages * STAGE_BYTES)
            emit_split_rescale(ptx, at, out, partial, spec, p)
            ptx.branch("rescale_done")
            ptx.label("rescale_alone")
        writer = RescaledRows(out, spec, p)
        out.emit(writer.write_row, "rescale", prepare=writer.prepare)
        if spec.splits:
            ptx.label("rescale_done")
        return
    ptx.branch("add_out", guard=ptx.setp("gt", ptx.special("%nctaid.z"), 1, "u32"))
    out.store_fragments()
    ptx.branch("out_done")
    ptx.label("add_out")
    ptx.barrier()  # every warp's last fragments are read: the A ring is free to stage the sums
    out.emit(out.added_row, "add")
    ptx.label("out_done")


def runs(b: Source) -> list[tuple[int, list[tuple[int, int]]]]:
    """A lane's D fragment elements (n tile, e) of one row grouped into runs of
    consecutive columns, each run aligned to its length (one st.shared.v2/.v4):
    [(first column past ``b.col_first``, [(n tile, e), ...])]."""
    groups: list[list[tuple[int, tuple[int, int]]]] = []
    for col, element in sorted((b.col_offset(ni, e), (ni, e)) for ni in range(N_TILES) for e in (0, 1)):
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
    apart, a multiple of 32 (``kernels.pitch.output_pitch``), so every row starts on a
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
        self.runs = runs(b)
        self.row_bytes = 4 * staging_row_words(len(self.runs[0][1]))
        pass_rows = 16 * tile.warps_m
        self.read_rows = pass_rows // tile.warps  # rows each warp reads back per pass
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
PTX_FLOAT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}  # PTX type of each float dtype


class Rescale(NamedTuple):
    """A fused epilogue: the tile's int32 sums written as floats of ``dtype`` ("float32",
    "float16", "bfloat16"), each element (f32(acc) * row factor) * second factor
    (+ bias), every operation rounded to nearest even and none fused
    (``kernels.stepmath.rescale_rows`` / ``rescale_cols`` are the same arithmetic in
    numpy). The second factor is ``beta`` (one f32, read on the device: forward and dX)
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

    @property
    def splits(self) -> bool:
        return self.partials is not None

    @property
    def element_bytes(self) -> int:
        return 4 if self.dtype == "float32" else 2

    @property
    def scalars(self) -> tuple[BufferSpec, ...]:
        """The u32 switch of the bias; a verify cell always adds one (``value``)."""
        return (BufferSpec(self.has_bias, "uint32", None, value=lambda d: 1),) if self.has_bias else ()


def rescaled_output(name: str, rescale: Rescale, rows: Callable[[Dims], int],
                    width: Callable[[Dims], int]) -> BufferSpec:
    """The float output of a :class:`Rescale`: rows x width of its dtype, contiguous (the
    caller's tensor as it is: no pitch, the stores are one element each)."""
    return BufferSpec(name, rescale.dtype, lambda d: (rows(d), width(d)))


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
        self.second = [ptx.load_f32("global", p[rescale.beta])] * out.COLUMN_GROUPS if rescale.beta else []
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
                    self.bias.append(ptx.cvt("f32", PTX_FLOAT[rescale.dtype], half))

    def write_row(self, row: str, j: int) -> None:
        """Rescale and store read-back row ``j`` of this warp (D row ``row``)."""
        out, rescale = self.out, self.rescale
        ptx = out.ptx
        factor = ptx.load_f32("global", ptx.byte_offset(self.p[rescale.row_scales], row, 4))
        ptr = ptx.byte_offset(out.out, ptx.mad(row, out.out_pitch, out.col), self.bytes)
        if self.from_partials:
            sums = ptx.byte_offset(self.p[rescale.partials], ptx.mad(row, self.p["ldo"], out.col), 4)
            zero = ptx.mov(0)
        for c in range(out.COLUMN_GROUPS):
            if self.from_partials:  # read at L2 (.cg): the other splits added there; left 0 for the next launch
                word = ptx.load("global.cg", "b32", sums, 128 * c, guard=self.in_cols[c], zero_fill=True)
                ptx.store("global", "b32", sums, zero, 128 * c, guard=self.in_cols[c])
            else:
                word = ptx.load("shared", "b32", out.read_at, out.tile.warps * j * out.row_bytes + 128 * c)
            value = ptx.fmul(ptx.fmul(ptx.cvt("f32", "s32", word, rnd="rn"), factor), self.second[c])
            if self.bias:
                value = ptx.fadd(value, self.bias[c])
            if self.bytes == 4:
                ptx.store("global", "f32", ptr, value, 128 * c, guard=self.in_cols[c])
            else:
                ptx.store("global", "b16", ptr, ptx.cvt(PTX_FLOAT[rescale.dtype], "f32", value, rnd="rn"), 64 * c,
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
    passed to the CTA through the A ring's first word (no warp reads the ring any more)."""
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
