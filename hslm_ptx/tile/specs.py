"""The staged tile's KernelSpec factories: what every staged kernel shares (the entry, its
parameters, the plan, the launch and the tile rule's score), so a kernel module says only
what differs: its operands and buffers (:func:`staged_spec`), or for a product of int8
rows with ternary W only the names of its fields (:func:`ternary_specs`).
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable

from hslm_ptx.cost import model as cost
from hslm_ptx.kernel.pitch import output_pitch, pitch_param, pitched_output, pitched_rows, planes_param
from hslm_ptx.formats.planes import Planes
from hslm_ptx.emit.ptx import Ptx
from hslm_ptx.kernel.spec import BufferSpec, Dims, KernelSpec, Part, ScalarSpec, buffer_bytes
from hslm_ptx.tile.epilogue import Rescale, rescaled_output
from hslm_ptx.tile.geometry import CHUNK_K, Plan, Tile, begin, entry_name, geometry
from hslm_ptx.tile.mainloop import emit_staged
from hslm_ptx.tile.operands import Coords, FragmentTernary, Ring, Source, StagedRows
from hslm_ptx.tile.rule import phase_cost, split_k, split_plans

# Every launch asks its spec for its geometry (the plan) and every pick asks for scores;
# a score is the cost model's time of a launch (tens of microseconds of Python), so each is
# computed once per shape and kept. hslm_ptx.catalog.registry.forget_scores clears them with the
# files they were read from.
SCORE_CACHES: list[Any] = []


def remembered(fn: Callable[..., Any]) -> Callable[..., Any]:
    cached = functools.lru_cache(maxsize=1024)(fn)
    SCORE_CACHES.append(cached)
    return cached


def ternary_specs(family: str, tiles: tuple[Tile, ...], out: str, rows: str, row_pitch: str,
                  contraction: str, cols: str, order: Planes, loop_family: str | None = None,
                  rescale: "Rescale | None" = None, **fields: Any) -> tuple[KernelSpec, ...]:
    """Each tile's KernelSpec of a product of int8 rows with ternary W (forward and dX):
    D = ``out`` (R x ``cols``), A = ``rows`` (R x ``contraction``, ``row_pitch`` bytes a
    row) staged, B = W in planes of ``order`` decoded into fragments
    (:class:`FragmentTernary`). The tile rule counts A's ``tile.m`` rows of 64 bytes a
    chunk and the first warp row's copies of W's words. ``rescale``: D is written
    rescaled (:class:`Rescale`), contiguous. ``fields``: make_inputs, reference,
    gemm_form."""
    def operands(ptx: Ptx, at: Coords, ring: Ring, p: dict[str, str]) -> tuple[StagedRows, Source]:
        a = StagedRows(ptx, at, ring, p[rows], p[row_pitch], rows=p["R"], k_limit=p[contraction])
        return a, FragmentTernary(ptx, at, ring, p["w"], cols=p[cols], k_limit=p[contraction])

    def width(name: str) -> Callable[[Dims], int]:
        return lambda d: getattr(d, name)

    output = (pitched_output(out, width("R"), width(cols)) if rescale is None
              else rescaled_output(out, rescale, width("R"), width(cols)))
    return tuple(staged_spec(
        family, tile, gemm=("R", cols, contraction),
        buffers=(output, pitched_rows(rows, width("R"), width(contraction)), planes_param("w", order)),
        pitch=pitch_param(row_pitch, width(contraction)), operands=operands, b_share=FragmentTernary.SHARE,
        loop_family=loop_family, rescale=rescale, **fields,
    ) for tile in tiles)



def staged_spec(family: str, tile: Tile, gemm: tuple[str, str, str], buffers: tuple[BufferSpec, ...],
                pitch: ScalarSpec,
                operands: Callable[[Ptx, Coords, Ring, dict[str, str]], tuple["StagedRows", "Source"]],
                b_share: int = StagedRows.B_SHARE, loop_family: str | None = None, rescale: "Rescale | None" = None,
                occupancy_of: str | None = None, a_reads: int = 1, b_bytes: int | None = None,
                **fields: Any) -> KernelSpec:
    """``family`` on ``tile`` as a KernelSpec: what every staged kernel shares, so a kernel
    module says only what differs.

    ``gemm`` names the Dims fields that are D's rows, D's columns and the contraction
    ("R", "N", "K" for forward); ``buffers`` are the output and the inputs, followed by the
    u32 sizes R, K, N, ``pitch`` and the split's ``kspan``; ``operands(ptx, at, ring, p)``
    builds the A and B sources in the CTA's ``ring`` (``hslm_ptx.tile.operands.Ring``, where
    B keeps ``b_share`` bytes of each stage past A's rows: a chunk of TILE_N staged rows
    unless said; with A's rows, what a CTA copies a chunk, the cost model's L2 bytes) from
    the loaded parameters ``p``; the output's row pitch ``ldo``
    (``hslm_ptx.kernel.pitch.output_pitch`` words) follows ``pitch``. The tile rule
    (:func:`phase_cost`) times the launch on the loop counted from ptxas's SASS into
    hslm_ptx/cost/loop_counts.json (``hslm_ptx.cost.model.loop_counts``: this tile's entry of
    ``loop_family``, the int32 family whose main loop the kernel shares, its own by
    default) with this entry's own ptxas occupancy (``hslm_ptx.cost.model.occupancy``; that of this
    tile's entry of the family ``occupancy_of`` where given); ``a_reads``: the L2 bytes
    A's rows take per element of a chunk (1: int8 codes copied once; an operand quantized
    from floats as it is staged reads each float twice, the scales pass and the codes:
    2 x the element's bytes); ``b_bytes``: the L2 bytes B takes a chunk where they are not
    its ``b_share`` (W's floats coded as they are staged); ``fields``
    are the rest of the KernelSpec (make_inputs, reference, gemm_form, max_rows).

    With ``rescale`` the output is the rescaled float tile (:class:`Rescale`): its
    buffers follow ``buffers``, its scalars follow ``pitch`` (the output's rows are D's
    columns apart). Without partials there is no ``ldo`` and no ``kspan`` (no split: one
    CTA per tile walks the whole contraction); with them ``ldo`` (the partials' row
    pitch) and ``kspan`` come last. Where the kernel can split (the int32 families, and
    the rescaled ones with partials) the plan is the cheapest by the rule of
    :func:`split_plans`: one split skips the split-K epilogue (``KernelCounts.outside``),
    so at a short contraction it can beat the shorter chunk loop of a split."""
    name = entry_name(family, tile)
    chunk_bytes = (Ring.copied(tile, b_share) + tile.m * CHUNK_K * (a_reads - 1)
                   + (0 if b_bytes is None else b_bytes - b_share))
    rows, cols, contraction = gemm
    split_rescale = bool(rescale and rescale.splits)
    workspace = tuple(n for n in (rescale.partials, rescale.tickets) if n) if rescale else ()

    def extents(d: Dims) -> tuple[int, int, int]:
        return getattr(d, rows), getattr(d, cols), getattr(d, contraction)

    @remembered
    def rule(d: Dims, plan: Plan) -> float:
        try:
            counts = cost.loop_counts(entry_name(loop_family or family, tile))
            occupancy = cost.occupancy(entry_name(occupancy_of, tile) if occupancy_of else name)
        except cost.NotCounted:  # a configuration not counted yet: never picked, and runs one split,
            return math.inf  # until `doit sass && doit model:counts` count it (the gate checks they did)
        return phase_cost(*extents(d), tile, plan, chunk_bytes, counts, occupancy,
                          buffer_bytes(params, d, () if plan.splits > 1 else workspace), split_rescale)

    @remembered
    def plan(d: Dims) -> Plan:
        if rescale is None or rescale.splits:  # split only where the rule says it pays, as deep as it pays
            return min(split_plans(*extents(d), tile=tile), key=lambda candidate: rule(d, candidate))
        return split_k(*extents(d), tile=tile, split=False)

    sizes = tuple(ScalarSpec(n) for n in ("R", "K", "N"))
    split_params = (ScalarSpec("ldo", lambda d: output_pitch(getattr(d, cols))),  # int32 words a row
                    ScalarSpec("kspan", lambda d: plan(d).span))  # k bytes per split
    if rescale is None:
        params = (*buffers, *sizes, pitch, *split_params)
    else:
        params = (*buffers, *rescale.buffers, *sizes, pitch, *rescale.scalars, *(split_params if rescale.splits else ()))

    def body(ptx: Ptx, p: dict[str, str]) -> None:
        at = Coords(ptx, p["kspan"] if "kspan" in p else p[contraction], tile)
        a, b = operands(ptx, at, Ring(ptx, tile, b_share), p)
        emit_staged(ptx, at, a, b, k_limit=p[contraction], out=p[buffers[0].name], rows=p[rows], cols=p[cols],
                    out_pitch=p["ldo"] if rescale is None else p[cols],
                    rescale=None if rescale is None else (rescale, p))

    def emit() -> str:
        ptx, p = begin(name, params, tile)
        body(ptx, p)
        return ptx.render()

    return KernelSpec(
        name=name, emit=emit, params=params, stages=tile.stages, chunk_bytes=chunk_bytes, family=family,
        tile=tile.label,
        geometry=lambda d: geometry(rows=getattr(d, rows), cols=getattr(d, cols), plan=plan(d), tile=tile),
        cost=lambda d: rule(d, plan(d)), split_rescale=split_rescale, workspace=workspace,
        part=Part(tile.threads, tile.min_ctas, tile.m, gemm, body), **fields)

