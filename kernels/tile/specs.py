"""The staged tile's KernelSpec factories: what every staged kernel shares (the entry, its
parameters, the plan, the launch and the tile rule's score), so a kernel module says only
what differs: its operands and buffers (:func:`staged_spec`), or for a product of int8
rows with ternary W only the names of its fields (:func:`ternary_specs`).
"""
from __future__ import annotations

from typing import Any, Callable

from kernels import cost
from kernels.pitch import (output_pitch, pitch as row_pitch_of, pitch_param, pitched_output, pitched_rows,
                           planes_param)
from kernels.planes import Planes
from kernels.ptx_emit import Ptx
from kernels.spec import BufferSpec, Dims, KernelSpec, ScalarSpec
from kernels.tile.epilogue import Rescale, rescaled_output
from kernels.tile.geometry import CHUNK_K, Plan, Tile, begin, entry_name, geometry
from kernels.tile.mainloop import emit_staged
from kernels.tile.operands import Coords, FragmentTernary, Source, StagedRows
from kernels.tile.rule import fragment_w_lines, rule_cost, segment_lines, split_k

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



def staged_spec(family: str, tile: Tile, gemm: tuple[str, str, str], buffers: tuple[BufferSpec, ...],
                pitch: ScalarSpec, operands: Callable[[Ptx, Coords, dict[str, str]], tuple["StagedRows", "Source"]],
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

    sizes = tuple(ScalarSpec(n) for n in ("R", "K", "N"))
    split_params = (ScalarSpec("ldo", lambda d: output_pitch(getattr(d, cols))),  # int32 words a row
                    ScalarSpec("kspan", lambda d: plan(d).span))  # k bytes per split
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

