"""The one tile rule: :func:`split_k` (how a launch covers the contraction) and
:func:`phase_cost` (the score ``hslm_ptx.catalog.registry.choose`` takes the lowest of: the cost
model's device time of the launch, ``hslm_ptx.cost.model.staged_phases``, on the GPU the rule
scores for). So the configuration a caller runs is the one ``doit model`` predicts
fastest on the same figures: the loop counts and ptxas occupancy `doit model:counts`
committed in hslm_ptx/cost/loop_counts.json, and the device facts of hslm_ptx/cost/devices.json.
:func:`staged_work` is that launch as the cost model takes it, shared with
``hslm_ptx.pipeline.stages.perf_model`` (which replaces its L1 and L2 figures by the emulator's
counts where it has them).
"""
from __future__ import annotations

import math
from functools import lru_cache

from hslm_ptx.cost import model as cost
from hslm_ptx.kernel.spec import Launch
from hslm_ptx.tile.geometry import CHUNK_K, Plan, Tile, geometry, output_tiles

MIN_SPLIT_CHUNKS = 2  # a split runs at least this many chunks (its copy-ahead prologue amortised)


@lru_cache(maxsize=1)
def rule_device() -> cost.Device:
    """The GPU the rule scores for (H200 SXM, 132 SMs), read when the rule is first asked,
    so a bad hslm_ptx/cost/devices.json is one line from the command that needs it, not an
    import error of every command."""
    return cost.device(cost.RULE_DEVICE)


def __getattr__(name: str) -> object:
    """``RULE_DEVICE`` (:func:`rule_device`) and ``TARGET_CTAS`` (one CTA an SM of it:
    split_k fills up to ``fill`` times this), read on first use."""
    if name == "RULE_DEVICE":
        return rule_device()
    if name == "TARGET_CTAS":
        return rule_device().sms
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


FAST_SLACK_BYTES = 4  # a chunk runs the fast body while it and one word more lie inside every row


SPLIT_FILLS = (1, 2, 4)  # CTAs an SM the offered split plans fill up to


def split_k(rows: int, cols: int, contraction: int, tile: Tile, split: bool = True, fill: int = 1) -> Plan:
    """Split the contraction into as many parts as keep the launch within ``fill`` x
    TARGET_CTAS CTAs (``fill`` an SM), keeping at least MIN_SPLIT_CHUNKS chunks per split.
    Splits add their partial sums into a zeroed output with red.global.add.s32 (exact:
    int32 addition wraps, so any order gives the same, in-range, total). ``split=False``:
    one CTA walks the whole contraction (the rescaled outputs, which must see a tile's
    whole int32 sum before they round it: :class:`Rescale`). Which plan a launch takes is
    the tile rule's (:func:`split_plans`, scored by :func:`phase_cost`)."""
    tiles = math.prod(output_tiles(rows, cols, tile))
    total = -(-contraction // CHUNK_K)
    if not split:
        return Plan(splits=1, span=total * CHUNK_K)
    wanted = min(fill * rule_device().sms // tiles, total // MIN_SPLIT_CHUNKS)
    per_split = -(-total // max(1, wanted))
    return Plan(splits=-(-total // per_split), span=per_split * CHUNK_K)


def split_plans(rows: int, cols: int, contraction: int, tile: Tile) -> tuple[Plan, ...]:
    """The plans a family that can split chooses among by its score: one split (no split-K
    epilogue), and :func:`split_k`'s at up to 1, 2 and 4 CTAs an SM. A second CTA on an SM
    shortens no chunk chain of its own, but at 1-2 warps a scheduler the two CTAs' chains
    overlap in each other's stalls (:func:`hslm_ptx.cost.model.trip_cycles`), so a deeper split
    can halve a long contraction's time; its reds and epilogues are in the score too."""
    plans = [split_k(rows, cols, contraction, tile, split=False)]
    plans += [split_k(rows, cols, contraction, tile, fill=fill) for fill in SPLIT_FILLS]
    return tuple(dict.fromkeys(plans))


def chunks(span: int, has_tail_body: bool = True) -> tuple[int, int]:
    """(fast, tail) chunks of a CTA's ``span`` bytes of k: fast while the chunk and its
    slack lie inside the rows; a loop with one body (tails by zero-filling copies) runs
    every chunk on it."""
    starts = range(0, span, CHUNK_K)
    if not has_tail_body:
        return len(starts), 0
    fast = sum(k0 + CHUNK_K + FAST_SLACK_BYTES <= span for k0 in starts)
    return fast, len(starts) - fast


def staged_work(launch: Launch, rows: int, cols: int, contraction: int, stages: int, chunk_bytes: int,
                counts: cost.KernelCounts, resident: int, dram_bytes: float,
                split_rescale: bool = False) -> cost.StagedWork:
    """One staged launch on a rows x cols output over ``contraction`` bytes of k, as
    :func:`hslm_ptx.cost.model.staged_phases` takes it: the grid's CTAs (x and y the output
    tiles, z the splits), each walking its split's chunks on the counted loop (``counts``:
    the int32 GEMM's loop on this tile, which a fused kernel shares), ``resident`` CTAs an
    SM, the int32 tile it writes (or adds, split), and the bytes through L2: what the CTA
    copies into its ring a chunk (``chunk_bytes``: A's rows and B's share, each once)
    plus the output.
    A fused kernel's epilogue is counted as the int32 kernel's; a split one
    (``split_rescale``) also waits two L2 round trips in its last CTA (the arrival ticket,
    then the summed tile read back) before it writes. ``dram_bytes``: every buffer once
    (``KernelSpec.buffer_bytes``)."""
    tiles, splits = launch.grid[0] * launch.grid[1], launch.grid[2]
    warps = math.prod(launch.block) // 32
    span = -(-(-(-contraction // CHUNK_K)) // splits) * CHUNK_K
    fast, tail = chunks(min(span, contraction), has_tail_body=counts.tail is not None)
    output = 4 * rows * cols / tiles
    return cost.StagedWork(
        ctas=tiles * splits, warps_per_cta=warps, resident=resident, fast_chunks=fast, tail_chunks=tail,
        stages=stages, counts=counts, epilogue_wavefronts=output_wavefronts(output, splits),
        output_bytes_per_cta=output, splits=splits, l2_bytes=tiles * splits * ((fast + tail) * chunk_bytes + output),
        dram_bytes=dram_bytes, settle_round_trips=2 if split_rescale and splits > 1 else 0,
        first_touch=cost.first_touch_share(launch.grid[0], launch.grid[1]))


def phase_cost(rows: int, cols: int, contraction: int, tile: Tile, plan: Plan, chunk_bytes: int,
               counts: cost.KernelCounts, occupancy: cost.Occupancy, dram_bytes: float,
               split_rescale: bool = False) -> float:
    """The tile rule's score (lower is better): the device us of ``tile`` on the shape,
    split by ``plan``, on the rule's GPU (:func:`hslm_ptx.cost.model.staged_phases` of
    :func:`staged_work`). Every configuration of a family pays the same host launch, so
    the device time orders them as the per-call time does.

    A short batch (R = 27) wastes most of a 128-row tile, so the small tile's shorter
    serial phases win there; a large problem fills every SM with either, and the large
    tile's fewer L2 bytes per multiply-add win."""
    launch = geometry(rows, cols, plan, tile)
    resident = cost.resident_ctas(rule_device(), tile.warps, occupancy)
    work = staged_work(launch, rows, cols, contraction, tile.stages, chunk_bytes, counts, resident, dram_bytes,
                       split_rescale)
    return cost.staged_phases(rule_device(), work).device_us


def output_wavefronts(output_bytes: float, splits: int) -> float:
    """L1 wavefronts of writing ``output_bytes`` of int32 results (``Epilogue``): from the
    accumulators, 64 contiguous bytes a row of a request (one wavefront per 128-byte line,
    so bytes / 64) with one split; staged and added with several (written to shared, read
    back, added to global: three passes of bytes / 128)."""
    return output_bytes * (1 / 64 if splits == 1 else 3 / 128)
