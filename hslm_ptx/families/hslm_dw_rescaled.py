"""hslm_dw_<out> and hslm_dw_splitk_<out>: dW[j, i] = (f32(dYq^T Xq)[j, i] * v[j]) * u[i], N x K
(nn.Linear's weight layout), written in f32, f16 or bf16 (hslm_ptx/families/hslm_rescaled.py says
how and why; the product is hslm_dw_s8's)."""
from __future__ import annotations

import numpy as np

from hslm_ptx.families import hslm_dw_s8
from hslm_ptx.formats.floats import FLOAT_DTYPES, from_f32
from hslm_ptx.families.hslm_rescaled import f32_vector, scales, workspace_of
from hslm_ptx.kernel.pitch import pitch_param, pitched_transpose
from hslm_ptx.kernel.spec import Dims, family_name
from hslm_ptx.reference.stepmath import rescale_cols
from hslm_ptx.tile import epilogue, specs


def dw_specs(dtype: str, split: bool = False) -> tuple:
    workspace, zeros, named = workspace_of(split, lambda d: d.N, lambda d: d.K, hslm_dw_s8.TILES)

    def make_inputs(d: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
        products = hslm_dw_s8.make_inputs(d, rng)
        return {"x_t": products["x"], "dy_t": products["dy"], "u": scales(rng, d.K), "v": scales(rng, d.N),
                **zeros(d)}

    def reference(d: Dims, inputs: dict[str, np.ndarray]) -> np.ndarray:
        acc = hslm_dw_s8.reference(d, {"x": inputs["x_t"], "dy": inputs["dy_t"]})
        return from_f32(rescale_cols(acc, inputs["v"], inputs["u"]), dtype)

    rescale = epilogue.Rescale(
        dtype, buffers=(f32_vector("u", lambda d: d.K), f32_vector("v", lambda d: d.N), *workspace),
        row_scales="v", col_scales="u", **named)
    return tuple(specs.staged_spec(
        family_name("dw", dtype, split=split), tile, gemm=("N", "K", "R"),
        buffers=(epilogue.rescaled_output("dw", rescale, lambda d: d.N, lambda d: d.K),
                 pitched_transpose("x_t", lambda d: d.R, lambda d: d.K),  # Xq^T, K x pitch(R)
                 pitched_transpose("dy_t", lambda d: d.R, lambda d: d.N)),  # dYq^T, N x pitch(R)
        pitch=pitch_param("ldr", lambda d: d.R), operands=hslm_dw_s8.transposed_operands("x_t", "dy_t"),
        loop_family=hslm_dw_s8.FAMILY,
        rescale=rescale, make_inputs=make_inputs, reference=reference, max_rows=hslm_dw_s8.MAX_ROWS,
    ) for tile in hslm_dw_s8.TILES)


SPECS = tuple(spec for split in (False, True) for dtype in FLOAT_DTYPES for spec in dw_specs(dtype, split))
