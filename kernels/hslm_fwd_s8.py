"""hslm_fwd_s8: Y[r, j] = sum_i Xq[r, i] W[i, j]  (int8 x ternary -> int32).

The forward product of an HSLM linear layer, on the staged tile
(``kernels/staged_tile.py``), one PTX entry per CTA tile in ``TILES``. D = Y (R x N). A = Xq, rows ``ldx`` bytes apart (a
multiple of 16, ``kernels/pitch.py``), copied with 16-byte cp.async into a 4-stage
ring; B = W decoded into shared memory as [j][i] a chunk at a time, its packed word
fetched a chunk ahead. Both reach the tensor cores through ldmatrix.
"""
from __future__ import annotations

import numpy as np

from kernels import staged_tile
from kernels.pitch import pitch_param, pitched_rows
from kernels.reference import exact_matmul
from kernels.spec import BufferSpec, Dims, GemmForm, KernelSpec, Launch, Operand
from kernels.ternary import packed_shape, unpack
from kernels.testdata import ternary_weights, saturating_int8

FAMILY = "hslm_fwd_s8"
TILES = (staged_tile.LARGE, staged_tile.SMALL)

# SASS per warp per chunk of each tile's loop on sm_90 (`doit sass`), for the tile rule;
# tests/test_sass.py keeps each within 10% of what ptxas makes of the emitted PTX
LOOP_INSTRUCTIONS = {"128x128": 128, "32x128": 151}

def configuration(tile: staged_tile.Tile) -> KernelSpec:
    """The forward product on ``tile``: its parameters, PTX entry, launch and rule score."""
    name = staged_tile.entry_name(FAMILY, tile)

    def plan(d: Dims) -> staged_tile.Plan:
        """Split-K for this shape (staged_tile.split_k over D = R x N, contraction K)."""
        return staged_tile.split_k(rows=d.R, cols=d.N, contraction=d.K, tile=tile)

    params = (
        BufferSpec("y", "int32", lambda d: (d.R, d.N)),
        pitched_rows("x", lambda d: d.R, lambda d: d.K),
        BufferSpec("w", "uint32", lambda d: packed_shape(d.K, d.N)),
        BufferSpec("R", "uint32", None),
        BufferSpec("K", "uint32", None),
        BufferSpec("N", "uint32", None),
        pitch_param("ldx", lambda d: d.K),
        BufferSpec("kspan", "uint32", None, value=lambda d: plan(d).span),  # k bytes per split
    )

    def emit() -> str:
        ptx, p = staged_tile.begin(name, params, tile)
        at = staged_tile.Coords(ptx, p["kspan"], tile)
        # A[m=r][k=i] = Xq[r, i]
        a = staged_tile.StagedRows(ptx, at, p["x"], p["ldx"], rows=p["R"], k_limit=p["K"])
        # B[k=i][n=j] = W[i, j], decoded to shared as [j][i]
        b = staged_tile.DecodedTernary(ptx, at, p["w"], p["K"], cols=p["N"])
        staged_tile.emit_staged(ptx, at, a, b, k_limit=p["K"], out=p["y"], rows=p["R"], cols=p["N"])
        return ptx.render()

    def geometry(d: Dims) -> Launch:
        return staged_tile.geometry(rows=d.R, cols=d.N, plan=plan(d), tile=tile)

    return KernelSpec(
        name=name, emit=emit, geometry=geometry, params=params, make_inputs=make_inputs,
        reference=reference, stages=tile.stages, family=FAMILY, tile=tile.label,
        cost=lambda d: staged_tile.rule_cost(d.R, d.N, d.K, tile, b_bits=2,
                                             loop_instructions=LOOP_INSTRUCTIONS[tile.label]),
        # Y = X W
        gemm_form=GemmForm(a=Operand("x"), bt=Operand("w", transposed=True)),
    )


def make_inputs(d: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"x": saturating_int8(rng, (d.R, d.K)), "w": ternary_weights(rng, d.K, d.N)}


def reference(d: Dims, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return exact_matmul(inputs["x"], unpack(inputs["w"], d.K)).astype(np.int32)


SPECS = tuple(configuration(tile) for tile in TILES)
