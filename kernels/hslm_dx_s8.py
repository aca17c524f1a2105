"""hslm_dx_s8: dX[r, i] = sum_j dYq[r, j] W[i, j]  (the input gradient, dY x W^T).

D = dX (R x K), A = dYq straight from global (row-major, k = out-feature j contiguous),
B[k=j][n=i] = W[i, j]. The contraction runs over packed *columns* here, so each thread's
decoded word (16 consecutive i of one j) is stored k-major as [j][i]. Lanes take their
four n tiles as four adjacent columns (INTERLEAVED n order): four 32-bit shared loads of
k rows 4t..4t+3 and one 4x4 byte transpose give a fragment register for every tile.
"""
from __future__ import annotations

import numpy as np

from kernels import mma_tile
from kernels.reference import exact_matmul
from kernels.spec import BufferSpec, Dims, GemmForm, KernelSpec, Launch, Operand
from kernels.ternary import packed_shape, unpack
from kernels.testdata import saturating_int8, ternary_weights

NAME = "hslm_dx_s8"
PARAMS = (
    BufferSpec("dx", "int32", lambda d: (d.R, d.K)),
    BufferSpec("dy", "int8", lambda d: (d.R, d.N)),
    BufferSpec("w", "uint32", lambda d: packed_shape(d.K, d.N)),
    BufferSpec("R", "uint32", None),
    BufferSpec("K", "uint32", None),
    BufferSpec("N", "uint32", None),
)


def emit() -> str:
    ptx, p, lane = mma_tile.begin(NAME, PARAMS)
    # B[k=j][n=i] = W[i, j]: packed columns are the contraction, decoded to shared as [j][i]
    b = mma_tile.TernaryShared(ptx, lane, p["w"], p["K"], col_limit=p["N"], k_major=True)
    # A[m=r][k=j] = dYq[r, j], in B's k order
    a = mma_tile.GlobalFragments(ptx, lane, b.order, p["dy"], lane.m_base, p["R"], row_stride=p["N"],
                                 k_limit=p["N"], k_stride=1, rows=(0, 8), span=mma_tile.TILE_M)
    mma_tile.emit_tile(ptx, lane, a, b, k_limit=p["N"], out=p["dx"], rows=p["R"], cols=p["K"])
    return ptx.render()


def geometry(d: Dims) -> Launch:
    return mma_tile.geometry(rows=d.R, cols=d.K)


def make_inputs(d: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"dy": saturating_int8(rng, (d.R, d.N)), "w": ternary_weights(rng, d.K, d.N)}


def reference(d: Dims, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return exact_matmul(inputs["dy"], unpack(inputs["w"], d.K).T).astype(np.int32)


SPEC = KernelSpec(
    name=NAME, emit=emit, geometry=geometry, params=PARAMS, make_inputs=make_inputs,
    reference=reference,
    # dX = dY W^T
    gemm_form=GemmForm(a=Operand("dy"), bt=Operand("w")),
)
