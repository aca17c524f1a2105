"""hslm_dx_s8: dX[r, i] = sum_j dYq[r, j] W[i, j]  (the input gradient, dY x W^T).

On the staged tile (``hslm_ptx/tile/``), one PTX entry per CTA tile in
``TILES`` (built by ``hslm_ptx.tile.specs.ternary_specs``). dX = dY W^T is the forward product
with W^T for W: D = dX (R x K), A = dYq, rows ``ldy`` bytes apart (a multiple of 16),
copied with 16-byte cp.async into a 4-stage ring; B[k=j][n=i] = W^T[j, i], read in W^T's
``FRAGMENTS_T`` planes (``hslm_ptx/formats/planes.py``, made by launch from the packed W) and
decoded straight into the mma's B registers, as forward does.
"""
from __future__ import annotations

import numpy as np

from hslm_ptx.formats import planes
from hslm_ptx.reference.products import exact_matmul
from hslm_ptx.kernel.spec import Dims, GemmForm, Operand
from hslm_ptx.formats.ternary import unpack
from hslm_ptx.reference.testdata import saturating_int8, ternary_weights
from hslm_ptx.tile import geometry, specs

FAMILY = "hslm_dx_s8"
TILES = (geometry.LARGE, geometry.SMALL, geometry.NARROW)


def make_inputs(d: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"dy": saturating_int8(rng, (d.R, d.N)), "w": ternary_weights(rng, d.K, d.N)}


def reference(d: Dims, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return exact_matmul(inputs["dy"], unpack(inputs["w"], d.K).T).astype(np.int32)


SPECS = specs.ternary_specs(
    FAMILY, TILES, out="dx", rows="dy", row_pitch="ldy", contraction="N", cols="K", order=planes.FRAGMENTS_T,
    make_inputs=make_inputs, reference=reference,
    gemm_form=GemmForm(a=Operand("dy"), bt=Operand("w")),  # dX = dY W^T
)
