"""hslm_dx_<out> and hslm_dx_splitk_<out>: dX = (f32(dYq W^T) * row_scales[r]) * beta,
written in f32, f16 or bf16 (hslm_ptx/families/hslm_rescaled.py says how and why; the product is
hslm_dx_s8's)."""
from __future__ import annotations

import numpy as np

from hslm_ptx.families import hslm_dx_s8
from hslm_ptx.formats import planes
from hslm_ptx.formats.floats import FLOAT_DTYPES
from hslm_ptx.families.hslm_rescaled import (rescaled_rows, row_inputs, row_rescale, row_rescaled_specs,
                                             workspace_of)
from hslm_ptx.kernel.spec import Dims


def dx_specs(dtype: str, split: bool = False) -> tuple:
    workspace, zeros, named = workspace_of(split, lambda d: d.R, lambda d: d.K, hslm_dx_s8.TILES)

    def make_inputs(d: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {**hslm_dx_s8.make_inputs(d, rng), **row_inputs(rng, d.R), **zeros(d)}

    def reference(d: Dims, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return rescaled_rows(hslm_dx_s8.reference(d, inputs), inputs, dtype)

    return row_rescaled_specs(
        "dx", hslm_dx_s8, split, row_rescale(dtype, workspace, named), out="dx", rows="dy", row_pitch="ldy",
        contraction="N", cols="K", order=planes.FRAGMENTS_T, make_inputs=make_inputs, reference=reference)


SPECS = tuple(spec for split in (False, True) for dtype in FLOAT_DTYPES for spec in dx_specs(dtype, split))
