"""hslm_fwdw_<out>_<wdt>: the training forward of a new weight version in one launch after
``hslm_wsum_<wdt>`` (the partial sums of |W|): where the step took ``hslm_wprep_<wdt>``
(beta and W's planes) and then ``hslm_fwdx_<out>``, one grid (``hslm_ptx.tile.grouped``)
holds

1. the product, y = (f32(Xq Wq) * s[r]) * beta + bias[j] in x's float type, each CTA
   quantizing its own rows of x (``QuantizedRows``, as ``hslm_fwdq``) and coding its own
   columns of W from the latent floats (``hslm_ptx.tile.operands.CodedTernary``: beta
   finished from the partials in every CTA, then two compares an element), so no CTA
   waits on another's planes;
2. ``hslm_qcols_<out>``'s column codes, scales and sums of x (what dW reads later), a CTA
   per 32 columns;
3. ``hslm_wprep_<wdt>``'s body, a CTA per 64 x 64 tile of W: beta and the planes of W and
   W^T, which the backward's dX reads and a kept weight's later forwards reuse.

No member reads what another writes (the product keeps its beta in shared memory, not the
``beta`` the preparation stores), so the grid's CTAs may run in any order; every output is
the bits of the launch it replaces (``hslm_wprep``, ``hslm_fwdx``). So a training step with
a new weight version is ``hslm_wsum`` + this + the backward: 3 launches.

What it costs: every CTA along M reads its W columns' floats (2 or 4 bytes an element, R /
tile.m times over, mostly from L2) where ``hslm_fwdx`` read the planes (a quarter byte);
the tile rule counts those bytes in each chunk's L2 traffic (``b_bytes``), but not the
coding instructions (a load, a multiply, two compares and two selects an element, on the
first row of warps), which the first GPU run measures against the launch it saves.

One entry per forward tile of ``hslm_fwdx`` (f32's 32-row ones only), for every pair of x's
and W's float types (under autocast x is f16 or bf16 and W f32).
"""
from __future__ import annotations

import numpy as np

from hslm_ptx.families import hslm_fwd_s8, hslm_fwdx, hslm_wprep
from hslm_ptx.families.hslm_quant import row_quantized
from hslm_ptx.families.hslm_rescaled import F32, rescaled_rows, workspace_of
from hslm_ptx.formats.floats import ELEMENT_BYTES, FLOAT_DTYPES, from_f32, storage_dtype, to_f32
from hslm_ptx.formats.layout import Plain
from hslm_ptx.kernel.spec import BufferSpec, Dims, KernelSpec, ScalarSpec, family_name
from hslm_ptx.reference import stepmath
from hslm_ptx.reference.testdata import float_activations, latent_weights
from hslm_ptx.tile import epilogue, geometry, specs
from hslm_ptx.tile.geometry import CHUNK_K, SMALL, TILE_N, entry_name
from hslm_ptx.tile.grouped import grouped_spec, staged_member
from hslm_ptx.tile.operands import CodedTernary, QuantizedRows

SHARED_NAMES = ("R", "K", "N", "x", "w", "w_partials")  # the sizes; x, W and its partials: two members read each


def family(dtype: str, weight_dtype: str) -> str:
    """hslm_fwdw_<x's type>_<W's type>."""
    return family_name("fwdw", dtype, weight_dtype)


def product_spec(dtype: str, weight_dtype: str, tile: geometry.Tile) -> KernelSpec:
    """The forward product from float x and float W on ``tile`` (``hslm_fwdq_splitk``'s
    product and split, B coded by the CTA)."""
    workspace, zeros, named = workspace_of(True, lambda d: d.R, lambda d: d.N, hslm_fwd_s8.TILES)

    def make_inputs(d: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
        w = latent_weights(rng, d.N, d.K, weight_dtype)
        bias = from_f32(rng.standard_normal(d.N).astype(F32), dtype).astype(storage_dtype(dtype))
        return {"x": float_activations(rng, (d.R, d.K), dtype, axis=1), "w": w,
                "w_partials": stepmath.abs_partials(to_f32(w, weight_dtype)), "bias": bias, **zeros(d)}

    def reference(d: Dims, inputs: dict[str, np.ndarray]) -> np.ndarray:
        rows = row_quantized(d, to_f32(inputs["x"], dtype))
        beta, packed = hslm_wprep.coded(d, to_f32(inputs["w"], weight_dtype), inputs["w_partials"])
        acc = hslm_fwd_s8.reference(d, {"x": rows["codes"][:, : d.K], "w": packed})
        with np.errstate(invalid="ignore", over="ignore"):  # x's non-finite rows: NaN and inf, as the kernel
            return rescaled_rows(acc, {"row_scales": rows["scales"], "beta": np.array([beta], F32)}, dtype,
                                 to_f32(inputs["bias"], dtype))

    rescale = epilogue.Rescale(
        dtype, buffers=(BufferSpec("bias", dtype, Plain(lambda d: (d.N,))), *workspace),
        row_scales="row_scales", beta="beta_at", bias="bias", has_bias="has_bias", row_scales_shared=True,
        beta_shared=True, **named)

    def operands(ptx, at, ring, p):
        a = QuantizedRows(ptx, at, ring, p["x"], dtype, rows=p["R"], k_limit=p["K"])
        b = CodedTernary(ptx, at, ring, p["w"], weight_dtype, p["w_partials"], cols=p["N"], k_limit=p["K"])
        p["row_scales"], p["beta_at"] = a.scales_at, b.beta_at  # the epilogue's factors: the CTA's own
        return a, b

    return specs.staged_spec(
        family_name("fwdc", dtype, weight_dtype, split=True), tile, gemm=("R", "N", "K"),
        buffers=(epilogue.rescaled_output("y", rescale, lambda d: d.R, lambda d: d.N),
                 BufferSpec("x", dtype, Plain(lambda d: (d.R, d.K))),
                 BufferSpec("w", weight_dtype, Plain(lambda d: (d.N, d.K))), hslm_wprep.partials_param()),
        pitch=ScalarSpec("ldx", lambda d: d.K),  # x's elements a row: contiguous
        operands=operands, b_share=CodedTernary.SHARE, b_bytes=TILE_N * CHUNK_K * ELEMENT_BYTES[weight_dtype],
        loop_family=hslm_fwd_s8.FAMILY, rescale=rescale, occupancy_of=family_name("fwd", dtype, split=True),
        a_reads=2 * ELEMENT_BYTES[dtype], make_inputs=make_inputs, reference=reference)


def tiles_of(dtype: str) -> tuple:
    """hslm_fwdx's tiles, less 32 x 128 where it is not the first (f16, bf16): beside
    128 x 128 and 32 x 128n16 it won no shape over the model's interval
    (hslm_ptx.catalog.earned)."""
    tiles = hslm_fwdx.tiles_of(dtype)
    return tiles[:1] + tuple(tile for tile in tiles[1:] if tile != SMALL)


def forward_specs(dtype: str, weight_dtype: str) -> tuple[KernelSpec, ...]:
    tiles = tiles_of(dtype)
    out = []
    for tile in tiles:
        product = product_spec(dtype, weight_dtype, tile)
        name = family(dtype, weight_dtype) if tile == tiles[0] else entry_name(family(dtype, weight_dtype), tile)
        members = (staged_member(product, "fwd", recompute=True), hslm_fwdx.columns_member(dtype),
                   hslm_wprep.wprep_member(weight_dtype))
        out.append(grouped_spec(name, family(dtype, weight_dtype), tile.label, members, SHARED_NAMES, tile.min_ctas,
                                cost=product.cost))
    return tuple(out)


SPECS = tuple(spec for dtype in FLOAT_DTYPES for wdt in FLOAT_DTYPES for spec in forward_specs(dtype, wdt))
