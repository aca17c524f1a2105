"""hslm_fwd_s8: Y[r, j] = sum_i Xq[r, i] W[i, j]  (int8 x ternary -> int32).

The forward product of an HSLM linear layer, on the staged tile
(``hslm_ptx/tile/``), one PTX entry per CTA tile in ``TILES`` (built by
``hslm_ptx.tile.specs.ternary_specs``). D = Y (R x N). A = Xq, rows ``ldx`` bytes apart (a
multiple of 16, ``hslm_ptx/kernel/pitch.py``), copied with 16-byte cp.async into a 4-stage
ring, and reaching the tensor cores through ldmatrix; B = W, read in ``FRAGMENTS``
planes (``hslm_ptx/formats/planes.py``: a chunk of every column side by side, each word the 16
codes one lane holds as B), copied packed into the same ring once per CTA and decoded
straight into the mma's B fragment registers: decoded B never passes through shared
memory.
"""
from __future__ import annotations

import numpy as np

from hslm_ptx.formats import planes
from hslm_ptx.reference.products import exact_matmul
from hslm_ptx.kernel.spec import Dims, GemmForm, Operand
from hslm_ptx.formats.ternary import unpack
from hslm_ptx.reference.testdata import ternary_weights, saturating_int8
from hslm_ptx.tile import geometry, specs

FAMILY = "hslm_fwd_s8"
TILES = (geometry.LARGE, geometry.SMALL, geometry.NARROW)


def make_inputs(d: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"x": saturating_int8(rng, (d.R, d.K)), "w": ternary_weights(rng, d.K, d.N)}


def reference(d: Dims, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return exact_matmul(inputs["x"], unpack(inputs["w"], d.K)).astype(np.int32)


SPECS = specs.ternary_specs(
    FAMILY, TILES, out="y", rows="x", row_pitch="ldx", contraction="K", cols="N", order=planes.FRAGMENTS,
    make_inputs=make_inputs, reference=reference,
    gemm_form=GemmForm(a=Operand("x"), bt=Operand("w", transposed=True)),  # Y = X W
)
