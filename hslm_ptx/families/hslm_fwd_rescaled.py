"""hslm_fwd_<out> and hslm_fwd_splitk_<out>: Y = (f32(Xq W) * row_scales[r]) * beta + bias[j],
written in f32, f16 or bf16 (hslm_ptx/families/hslm_rescaled.py says how and why; the product is
hslm_fwd_s8's)."""
from __future__ import annotations

import numpy as np

from hslm_ptx.families import hslm_fwd_s8
from hslm_ptx.formats import planes
from hslm_ptx.formats.floats import FLOAT_DTYPES, from_f32, storage_dtype, to_f32
from hslm_ptx.families.hslm_rescaled import (F32, rescaled_rows, row_inputs, row_rescale, row_rescaled_specs,
                                             workspace_of)
from hslm_ptx.formats.layout import Plain
from hslm_ptx.kernel.spec import BufferSpec, Dims


def forward_specs(dtype: str, split: bool = False) -> tuple:
    workspace, zeros, named = workspace_of(split, lambda d: d.R, lambda d: d.N, hslm_fwd_s8.TILES)

    def make_inputs(d: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
        bias = from_f32(rng.standard_normal(d.N).astype(F32), dtype).astype(storage_dtype(dtype))
        return {**hslm_fwd_s8.make_inputs(d, rng), **row_inputs(rng, d.R), "bias": bias, **zeros(d)}

    def reference(d: Dims, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return rescaled_rows(hslm_fwd_s8.reference(d, inputs), inputs, dtype, to_f32(inputs["bias"], dtype))

    rescale = row_rescale(dtype, workspace, named, bias=BufferSpec("bias", dtype, Plain(lambda d: (d.N,))))
    return row_rescaled_specs(
        "fwd", hslm_fwd_s8, split, rescale, out="y", rows="x", row_pitch="ldx", contraction="K", cols="N",
        order=planes.FRAGMENTS, make_inputs=make_inputs, reference=reference)


SPECS = tuple(spec for split in (False, True) for dtype in FLOAT_DTYPES for spec in forward_specs(dtype, split))
