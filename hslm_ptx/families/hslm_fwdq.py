"""hslm_fwdq_<out> and hslm_fwdq_splitk_<out>: the forward product straight from float x,
Y = (f32(Xq W) * s[r]) * beta + bias[j] in x's float type, where Xq and s are x's row
codes and scales as ``hslm_qrows_<out>`` makes them: one launch where the quantization and
the product took two.

The product, the tiles, the splits and the epilogue are ``hslm_fwd_<out>``'s
(hslm_ptx/families/hslm_rescaled.py); only A differs: a CTA quantizes the rows of its tile itself
(``hslm_ptx.tile.operands.QuantizedRows``: a pass for the rows' scales, then the codes as it
stages each chunk) and rescales with those scales, kept in shared memory. x's codes and
row scales are never written, so there is nothing a later launch could read of them: the
layer step runs this forward where nothing but y is wanted of it (an inference forward, or
one whose weight takes no gradient), and ``hslm_quant_<dt>`` + ``hslm_fwd_<out>`` where dW
needs x's column codes, which no CTA of the forward can make (a column's scale is over all R
rows, every row tile's; dW's own CTAs can, ``hslm_ptx.tile.operands.QuantizedColumns``, but
they read dY's columns, not x's).

The tile rule scores a configuration as it does ``hslm_fwd_<out>``'s (its loop counts and
its ptxas occupancy): the scales pass and the codes in the loop are not in the model.
"""
from __future__ import annotations

import numpy as np

from hslm_ptx.families import hslm_fwd_s8
from hslm_ptx.formats.floats import FLOAT_DTYPES, from_f32, storage_dtype, to_f32
from hslm_ptx.families.hslm_quant import row_quantized
from hslm_ptx.families.hslm_rescaled import (F32, rescaled_rows, row_inputs, workspace_of, f32_vector)
from hslm_ptx.formats.layout import Plain
from hslm_ptx.formats.planes import FRAGMENTS
from hslm_ptx.kernel.pitch import planes_param
from hslm_ptx.kernel.spec import BufferSpec, Dims, KernelSpec, ScalarSpec, family_name
from hslm_ptx.reference.testdata import float_activations, ternary_weights
from hslm_ptx.tile import epilogue, specs
from hslm_ptx.tile.operands import FragmentTernary, QuantizedRows


def forward_specs(dtype: str, split: bool = False) -> tuple[KernelSpec, ...]:
    workspace, zeros, named = workspace_of(split, lambda d: d.R, lambda d: d.N, hslm_fwd_s8.TILES)

    def make_inputs(d: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
        bias = from_f32(rng.standard_normal(d.N).astype(F32), dtype).astype(storage_dtype(dtype))
        return {"x": float_activations(rng, (d.R, d.K), dtype, axis=1), "w": ternary_weights(rng, d.K, d.N),
                "beta": row_inputs(rng, 1)["beta"], "bias": bias, **zeros(d)}

    def reference(d: Dims, inputs: dict[str, np.ndarray]) -> np.ndarray:
        rows = row_quantized(d, to_f32(inputs["x"], dtype))
        acc = hslm_fwd_s8.reference(d, {"x": rows["codes"][:, : d.K], "w": inputs["w"]})
        with np.errstate(invalid="ignore", over="ignore"):  # x's non-finite rows: NaN and inf, as the kernel
            return rescaled_rows(acc, {"row_scales": rows["scales"], "beta": inputs["beta"]}, dtype,
                                 to_f32(inputs["bias"], dtype))

    rescale = epilogue.Rescale(
        dtype, buffers=(f32_vector("beta", lambda d: 1), BufferSpec("bias", dtype, Plain(lambda d: (d.N,))),
                        *workspace),
        row_scales="row_scales", beta="beta", bias="bias", has_bias="has_bias", row_scales_shared=True, **named)

    def operands(ptx, at, ring, p):
        a = QuantizedRows(ptx, at, ring, p["x"], dtype, rows=p["R"], k_limit=p["K"])
        p["row_scales"] = a.scales_at  # the epilogue's row factors: the CTA's own
        return a, FragmentTernary(ptx, at, ring, p["w"], cols=p["N"], k_limit=p["K"])

    return tuple(specs.staged_spec(
        family_name("fwdq", dtype, split=split), tile, gemm=("R", "N", "K"),
        buffers=(epilogue.rescaled_output("y", rescale, lambda d: d.R, lambda d: d.N),
                 BufferSpec("x", dtype, Plain(lambda d: (d.R, d.K))), planes_param("w", FRAGMENTS)),
        pitch=ScalarSpec("ldx", lambda d: d.K),  # x's elements a row: contiguous
        operands=operands, b_share=FragmentTernary.SHARE, loop_family=hslm_fwd_s8.FAMILY, rescale=rescale,
        occupancy_of=family_name("fwd", dtype, split=split), make_inputs=make_inputs, reference=reference,
    ) for tile in hslm_fwd_s8.TILES)


SPECS = tuple(spec for split in (False, True) for dtype in FLOAT_DTYPES for spec in forward_specs(dtype, split))
