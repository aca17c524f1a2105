"""The one tile rule: :func:`split_k` (how a launch covers the contraction) and
:func:`rule_cost` (the score ``kernels.registry.choose`` takes the lowest of: clocks of the
largest of tensor, issue, L1 and L2 costs of a tile on a shape), with the L1 and line
counts it is built from. The rates are the cost model's device facts for the GPU the rule
scores for, so the rule and the performance model agree on the device.
"""
from __future__ import annotations

import math

from kernels import cost
from kernels.tile.geometry import CHUNK_K, N_TILES, PIECE, TILE_N, WARPS_N, Plan, Tile, output_tiles

MIN_SPLIT_CHUNKS = 2  # a split runs at least this many chunks (its copy-ahead prologue amortised)
# The tile rule's rates, from the cost model's device facts (kernels/devices.json) for the
# GPU it scores for (kernels.cost.RULE_DEVICE: H200 SXM, 132 SMs, 1.83 GHz tensor clock)
RATES = cost.rule_rates(cost.device(cost.RULE_DEVICE))
TARGET_CTAS = RATES.target_ctas  # split-K fills at most one CTA per SM
MACS_PER_SM_CLOCK = RATES.macs_per_sm_clock  # int8 dense peak x the fraction mma.sync reaches, per SM clock
L2_BYTES_PER_CLOCK = RATES.l2_bytes_per_clock
SCHEDULERS = RATES.schedulers  # warp schedulers per SM, one instruction a clock each


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

