"""hslm_dw_s8: dW[j, i] = sum_r dYq[r, j] Xq[r, i]  (the weight gradient, X^T x dY).

D = dW (N x K, W's [column][in-feature] order), contraction over rows r. Both
operands are read transposed from global: A[m=j][k=r] = dYq[r, j] and
B[k=r][n=i] = Xq[r, i], so fragment rows are contiguous bytes (row offsets are
immediates) and k walks with a stride of N or K bytes, one byte load per element;
chunks far enough from the last row need no predicates at all.

int32 is exact while R * 127 * 127 < 2^31, i.e. R <= 131071 (``MAX_ROWS``); the
float op in kernels/ops.py splits longer batches and sums the chunks in int64.
"""
from __future__ import annotations

import numpy as np

from kernels import mma_tile
from kernels.reference import exact_matmul
from kernels.spec import BufferSpec, Dims, GemmForm, KernelSpec, Launch, Operand
from kernels.testdata import saturating_int8

NAME = "hslm_dw_s8"
MAX_ROWS = 131071  # 127 * 127 * 131071 < 2^31 <= 127 * 127 * 131072 + ...
PARAMS = (
    BufferSpec("dw", "int32", lambda d: (d.N, d.K)),
    BufferSpec("x", "int8", lambda d: (d.R, d.K)),
    BufferSpec("dy", "int8", lambda d: (d.R, d.N)),
    BufferSpec("R", "uint32", None),
    BufferSpec("K", "uint32", None),
    BufferSpec("N", "uint32", None),
)


def emit() -> str:
    ptx, p, lane = mma_tile.begin(NAME, PARAMS)
    order = mma_tile.BLOCKED  # lane t walks rows 16t..16t+15 of each chunk
    # A[m=j][k=r] = dYq[r, j]: rows contiguous, k strides by N
    a = mma_tile.GlobalFragments(ptx, lane, order, p["dy"], lane.m_base, p["N"], row_stride=1,
                                 k_limit=p["R"], k_stride=p["N"], rows=(0, 8), span=mma_tile.TILE_M)
    # B[k=r][n=i] = Xq[r, i]: the four n tiles are rows g, g+8, g+16, g+24
    b = mma_tile.GlobalFragments(ptx, lane, order, p["x"], lane.n_base, p["K"], row_stride=1,
                                 k_limit=p["R"], k_stride=p["K"], rows=(0, 8, 16, 24),
                                 span=mma_tile.TILE_N)
    mma_tile.emit_tile(ptx, lane, a, b, k_limit=p["R"], out=p["dw"], rows=p["N"], cols=p["K"])
    return ptx.render()


def geometry(d: Dims) -> Launch:
    return mma_tile.geometry(rows=d.N, cols=d.K)


def make_inputs(d: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"x": saturating_int8(rng, (d.R, d.K)), "dy": saturating_int8(rng, (d.R, d.N))}


def reference(d: Dims, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return exact_matmul(inputs["dy"].T, inputs["x"]).astype(np.int32)


SPEC = KernelSpec(
    name=NAME, emit=emit, geometry=geometry, params=PARAMS, make_inputs=make_inputs,
    reference=reference, max_rows=MAX_ROWS,
    # dW = dY^T X
    gemm_form=GemmForm(a=Operand("dy", transposed=True), bt=Operand("x", transposed=True)),
)
