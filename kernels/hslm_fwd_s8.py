"""hslm_fwd_s8: Y[r, j] = sum_i Xq[r, i] W[i, j]  (int8 x ternary -> int32).

The forward product of an HSLM linear layer. D = Y (R x N). B = W decoded into shared
memory as [j][i] (64-byte rows); in the BLOCKED k order a lane's 16 bytes of a chunk
for one n tile are one ``ld.shared.v4``. A = Xq read straight from global in the same
k order: five aligned words funnelled by prmt per row in fast chunks, predicated bytes
in the tail chunk.
"""
from __future__ import annotations

import numpy as np

from kernels import mma_tile
from kernels.reference import exact_matmul
from kernels.spec import BufferSpec, Dims, GemmForm, KernelSpec, Launch, Operand
from kernels.ternary import packed_shape, unpack
from kernels.testdata import ternary_weights, saturating_int8

NAME = "hslm_fwd_s8"
PARAMS = (
    BufferSpec("y", "int32", lambda d: (d.R, d.N)),
    BufferSpec("x", "int8", lambda d: (d.R, d.K)),
    BufferSpec("w", "uint32", lambda d: packed_shape(d.K, d.N)),
    BufferSpec("R", "uint32", None),
    BufferSpec("K", "uint32", None),
    BufferSpec("N", "uint32", None),
)


def emit() -> str:
    ptx, p, lane = mma_tile.begin(NAME, PARAMS)
    # B[k=i][n=j] = W[i, j], decoded to shared as [j][i]
    b = mma_tile.TernaryShared(ptx, lane, p["w"], p["K"], col_limit=p["N"], k_major=False)
    # A[m=r][k=i] = Xq[r, i], in B's k order
    a = mma_tile.GlobalFragments(ptx, lane, b.order, p["x"], lane.m_base, p["R"], row_stride=p["K"],
                                 k_limit=p["K"], k_stride=1, rows=(0, 8), span=mma_tile.TILE_M)
    mma_tile.emit_tile(ptx, lane, a, b, k_limit=p["K"], out=p["y"], rows=p["R"], cols=p["N"])
    return ptx.render()


def geometry(d: Dims) -> Launch:
    return mma_tile.geometry(rows=d.R, cols=d.N)


def make_inputs(d: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"x": saturating_int8(rng, (d.R, d.K)), "w": ternary_weights(rng, d.K, d.N)}


def reference(d: Dims, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return exact_matmul(inputs["x"], unpack(inputs["w"], d.K)).astype(np.int32)


SPEC = KernelSpec(
    name=NAME, emit=emit, geometry=geometry, params=PARAMS, make_inputs=make_inputs,
    reference=reference,
    # Y = X W
    gemm_form=GemmForm(a=Operand("x"), bt=Operand("w", transposed=True)),
)
