"""hslm_dw_s8: dW[j, i] = sum_r dYq[r, j] Xq[r, i]  (the weight gradient, X^T x dY).

A plain TN GEMM on the staged tile (``hslm_ptx/tile/``), one PTX entry per CTA
tile in ``TILES``: D = dW (N x K, W's [column][in-feature] order), contraction over
rows r. The kernel reads transposed copies with r contiguous, rows ``ldr`` = pitch(R)
bytes apart: A[m=j][k=r] = dYq^T and B[k=r][n=i] = Xq^T stored [i][r]. Both go global
-> shared by 16-byte cp.async into one ring, a stage holding A's rows then B's 128 (3
stages; 2 on the 256-row tile, whose stages of 384 rows fill the 48 KiB), and reach the
tensor cores through ldmatrix. The float op quantizes straight into those
transposed buffers; a caller passing Xq and dYq as R x K and R x N gets them copied
by launch (``hslm_ptx/kernel/pitch.py``). A's copies stop at R (src-size), so the padding of
either copy is never multiplied by anything but zero.

int32 is exact while R * 127 * 127 < 2^31, i.e. R <= 131071 (``MAX_ROWS``); the
float op in hslm_ptx/arrays.py splits longer batches and sums the chunks in int64.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from hslm_ptx.kernel.pitch import pitch_param, pitched_output, pitched_transpose
from hslm_ptx.emit.ptx import Ptx
from hslm_ptx.reference.products import exact_matmul
from hslm_ptx.kernel.spec import Dims, GemmForm, Operand
from hslm_ptx.reference.testdata import saturating_int8
from hslm_ptx.tile import geometry, specs
from hslm_ptx.tile.operands import Coords, Ring, Source, StagedRows

FAMILY = "hslm_dw_s8"
MAX_ROWS = 131071  # 127 * 127 * 131071 < 2^31 <= 127 * 127 * 131072 + ...
STAGES = 3  # the 128 x 128 tile's 3 stages of 256 rows: the 48 KiB of static shared memory
TILES = (*(tile._replace(stages=STAGES)
           for tile in (geometry.LARGE, geometry.NARROW, geometry.MID, geometry.SHORT)),
         geometry.TALL)


def transposed_operands(x: str, dy: str) -> Callable[[Ptx, Coords, Ring, dict[str, str]],
                                                     tuple[StagedRows, Source]]:
    """The operands from the parameters named ``x`` (Xq^T) and ``dy`` (dYq^T):
    A[m=j][k=r] = dYq^T[j, r], copies stopping at R so B's padding meets zeros;
    B[k=r][n=i] = Xq[r, i], stored [i][r]."""
    def operands(ptx: Ptx, at: Coords, ring: Ring, p: dict[str, str]) -> tuple[StagedRows, Source]:
        a = StagedRows(ptx, at, ring, p[dy], p["ldr"], rows=p["N"], k_limit=p["R"], exact_tail=True)
        b = StagedRows(ptx, at, ring, p[x], p["ldr"], rows=p["K"], k_limit=p["R"], b=True)
        return a, b
    return operands


def make_inputs(d: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"x": saturating_int8(rng, (d.R, d.K)), "dy": saturating_int8(rng, (d.R, d.N))}


def reference(d: Dims, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return exact_matmul(inputs["dy"].T, inputs["x"]).astype(np.int32)


SPECS = tuple(specs.staged_spec(
    FAMILY, tile, gemm=("N", "K", "R"),  # D = dW (N x K), contraction R
    buffers=(pitched_output("dw", lambda d: d.N, lambda d: d.K),
             pitched_transpose("x", lambda d: d.R, lambda d: d.K),  # kernel layout: Xq^T, K x pitch(R)
             pitched_transpose("dy", lambda d: d.R, lambda d: d.N)),  # dYq^T, N x pitch(R)
    pitch=pitch_param("ldr", lambda d: d.R), operands=transposed_operands("x", "dy"),
    make_inputs=make_inputs, reference=reference, max_rows=MAX_ROWS,
    gemm_form=GemmForm(a=Operand("dy", transposed=True), bt=Operand("x", transposed=True)),  # dW = dY^T X
) for tile in TILES)
