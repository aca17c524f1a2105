"""hslm_dx_<out> and hslm_dx_splitk_<out>: dX = (f32(dYq W^T) * row_scales[r]) * beta,
written in f32, f16 or bf16 (kernels/hslm_rescaled.py says how and why; the product is
hslm_dx_s8's)."""
from __future__ import annotations

import numpy as np

from kernels import hslm_dx_s8, planes, staged_tile
from kernels.floats import from_f32
from kernels.hslm_rescaled import OUT_TYPES, f32_vector, family, row_inputs, workspace_of
from kernels.spec import Dims
from kernels.stepmath import rescale_rows


def dx_specs(suffix: str, split: bool = False) -> tuple:
    dtype = OUT_TYPES[suffix]
    workspace, zeros, named = workspace_of(split, lambda d: d.R, lambda d: d.K)

    def make_inputs(d: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {**hslm_dx_s8.make_inputs(d, rng), **row_inputs(rng, d.R), **zeros(d)}

    def reference(d: Dims, inputs: dict[str, np.ndarray]) -> np.ndarray:
        acc = hslm_dx_s8.reference(d, inputs)
        return from_f32(rescale_rows(acc, inputs["row_scales"], inputs["beta"][0]), dtype)

    rescale = staged_tile.Rescale(
        dtype, buffers=(f32_vector("row_scales", lambda d: d.R), f32_vector("beta", lambda d: 1), *workspace),
        row_scales="row_scales", beta="beta", **named)
    return staged_tile.ternary_specs(
        family("dx", suffix, split), hslm_dx_s8.TILES, out="dx", rows="dy", row_pitch="ldy", contraction="N",
        cols="K", order=planes.FRAGMENTS_T, loop_family=hslm_dx_s8.FAMILY, rescale=rescale,
        make_inputs=make_inputs, reference=reference)


SPECS = tuple(spec for split in (False, True) for suffix in OUT_TYPES for spec in dx_specs(suffix, split))
