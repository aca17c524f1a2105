"""hslm_bwd_<dt>_<wdt>[_<dX tile>_<dW tile>]: a layer step's whole backward from float dY
in one launch: dX written in dY's float type ``dt``, dW in the weight's ``wdt``, and the
bias gradient db (f32 column sums of dY).

Nothing quantizes dY before it: each product's CTAs quantize what they stage themselves,
so no launch writes dY's codes and none reads them back.

- dX = (f32(dYq W^T) * s[r]) * beta, s and dYq dY's row scales and codes: the CTA that
  owns a row tile of dY reads its rows across N anyway, so it finds their absmax in a
  first pass and codes each chunk as it stages it (``hslm_ptx.tile.operands.QuantizedRows``,
  as the forward does x's rows, ``hslm_ptx/families/hslm_fwdq.py``);
- dW = (f32(dYq^T Xq)[j, i] * v[j]) * u[i], v and dYq^T dY's column scales and codes: the
  CTA that owns (j, i) reads dY's columns j over all R rows, so its first pass gives their
  scales and its chunks are coded as they are staged (``QuantizedColumns``); Xq^T and u are
  what the forward kept (``hslm_fwdx``);
- db = sum_r dY[r, :]: a CTA per 32 columns, ``hslm_qcols``' first pass and its groups'
  tree (``hslm_ptx.reference.stepmath.column_sums``), no codes.

Every output is the bits of the two-launch backward (``hslm_quant`` on dY, then
``hslm_grads``): the same codes and scales (an absmax is exact in any order), the same
products and epilogues. The parts share dY and nothing any of them writes, so one grid
holds them (``hslm_ptx.tile.grouped``): dX's CTAs first, then dW's, then db's. Each product
splits where its rule says, with its workspace as its split-K family's (``dx_partials``
..., kept zeroed between launches); a split CTA still takes its scales over the whole
contraction (a scale is over all of it).

What it costs: dY is read by every CTA along the other axis, twice (the scales pass,
then the codes), in floats. The products' scores count that (``a_reads``: each chunk's A
bytes are the float elements twice, not one int8 code each), so the step runs this
launch where one launch's fixed cost is worth more than those reads, the HSLM shapes,
and the two launches where the re-reads dominate (``hslm_ptx.step.launches.backward``
compares the two by the same model). So its tile pairs are the HSLM ones (:data:`PAIRS`:
R = 27, 32 x 128n16 with 16 x 128n16; R = 1782, 32 x 128n16 or 32 x 128 with 32 x 128n16 or
64 x 128); the large pair of ``hslm_grads`` (256 x 128 dW, whose ring fills the 48 KiB of
static shared memory) has no room for the row scales beside it. The family's rule is the
sum of its products' scores (neither the bias CTAs nor the grouped launch is modelled
apart).
"""
from __future__ import annotations

import numpy as np

from hslm_ptx.families import hslm_dw_s8, hslm_dx_s8
from hslm_ptx.families.hslm_quant import cols_body, row_quantized
from hslm_ptx.families.hslm_rescaled import f32_vector, rescaled_rows, row_inputs, scales, workspace_of
from hslm_ptx.emit.ptx import Ptx
from hslm_ptx.emit.stepforms import CTA_THREADS, WARP
from hslm_ptx.formats import planes
from hslm_ptx.formats.floats import ELEMENT_BYTES, FLOAT_DTYPES, from_f32, to_f32
from hslm_ptx.formats.layout import Plain
from hslm_ptx.kernel.pitch import pitch_param, pitched_transpose, planes_param
from hslm_ptx.kernel.spec import BufferSpec, Dims, KernelSpec, Launch, ScalarSpec, family_name
from hslm_ptx.reference import stepmath
from hslm_ptx.reference.products import exact_matmul
from hslm_ptx.reference.testdata import float_activations, saturating_int8, ternary_weights
from hslm_ptx.tile import epilogue, geometry, specs
from hslm_ptx.tile.grouped import Member, grouped_spec, staged_member
from hslm_ptx.tile.operands import FragmentTernary, QuantizedColumns, QuantizedRows, StagedRows

SHARED_NAMES = ("R", "K", "N", "dy")  # the sizes, and dY: every part reads it
# (dX tile, dW tile): the first is the family's own name; each pair earns its place
# (hslm_ptx.catalog.earned: 32 x 128 with 64 x 128 won no shape over the model's interval)
PAIRS = ((geometry.NARROW, geometry.SHORT), (geometry.NARROW, geometry.NARROW), (geometry.NARROW, geometry.MID))
PRODUCTS = ("dx", "dw", "db")  # the parts in grid order
PARTS: dict[str, tuple[KernelSpec, KernelSpec]] = {}  # each entry's (dX, dW) products


def family(dtype: str, weight_dtype: str) -> str:
    """hslm_bwd_<dy's type>_<the weight's type>."""
    return family_name("bwd", dtype, weight_dtype)


def _float_dy(d: Dims, rng: np.random.Generator, dtype: str) -> np.ndarray:
    """dY (R x N) scaled per row or per column by a seeded coin, so both products meet their
    tie and non-finite slices over the cells."""
    return float_activations(rng, (d.R, d.N), dtype, axis=int(rng.integers(0, 2)))


def _tile(tiles: tuple[geometry.Tile, ...], label: str) -> geometry.Tile:
    return next(tile for tile in tiles if tile.label == label)


def dx_spec(dtype: str, tile: geometry.Tile) -> KernelSpec:
    """dX from float dY on ``tile``: ``hslm_dx_splitk_<dt>``'s product, A = dY's rows coded
    by the CTA (its row scales kept in shared memory for the epilogue)."""
    tile = _tile(hslm_dx_s8.TILES, tile.label)
    workspace, zeros, named = workspace_of(True, lambda d: d.R, lambda d: d.K, hslm_dx_s8.TILES)

    def make_inputs(d: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"dy": _float_dy(d, rng, dtype), "w": ternary_weights(rng, d.K, d.N),
                "beta": row_inputs(rng, 1)["beta"], **zeros(d)}

    def reference(d: Dims, inputs: dict[str, np.ndarray]) -> np.ndarray:
        rows = row_quantized(Dims(d.R, d.N, d.N), to_f32(inputs["dy"], dtype))
        acc = hslm_dx_s8.reference(d, {"dy": rows["codes"][:, : d.N], "w": inputs["w"]})
        with np.errstate(invalid="ignore", over="ignore"):  # dY's non-finite rows: NaN and inf, as the kernel
            return rescaled_rows(acc, {"row_scales": rows["scales"], "beta": inputs["beta"]}, dtype)

    rescale = epilogue.Rescale(dtype, buffers=(f32_vector("beta", lambda d: 1), *workspace),
                               row_scales="row_scales", beta="beta", row_scales_shared=True, **named)

    def operands(ptx, at, ring, p):
        a = QuantizedRows(ptx, at, ring, p["dy"], dtype, rows=p["R"], k_limit=p["N"])
        p["row_scales"] = a.scales_at  # the epilogue's row factors: the CTA's own
        return a, FragmentTernary(ptx, at, ring, p["w"], cols=p["K"], k_limit=p["N"])

    return specs.staged_spec(
        family_name("dxq", dtype, split=True), tile, gemm=("R", "K", "N"),
        buffers=(epilogue.rescaled_output("dx", rescale, lambda d: d.R, lambda d: d.K),
                 BufferSpec("dy", dtype, Plain(lambda d: (d.R, d.N))), planes_param("w", planes.FRAGMENTS_T)),
        pitch=ScalarSpec("ldy", lambda d: d.N),  # dY's elements a row: contiguous
        operands=operands, b_share=FragmentTernary.SHARE, loop_family=hslm_dx_s8.FAMILY, rescale=rescale,
        occupancy_of=family_name("dx", dtype, split=True), a_reads=2 * ELEMENT_BYTES[dtype], make_inputs=make_inputs, reference=reference)


def dw_spec(dtype: str, weight_dtype: str, tile: geometry.Tile) -> KernelSpec:
    """dW from float dY (``dtype``) and the forward's Xq^T and u on ``tile``, written in
    ``weight_dtype``: ``hslm_dw_splitk_<wdt>``'s product, A = dY's columns coded by the CTA."""
    tile = _tile(hslm_dw_s8.TILES, tile.label)
    workspace, zeros, named = workspace_of(True, lambda d: d.N, lambda d: d.K, hslm_dw_s8.TILES)

    def make_inputs(d: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"dy": _float_dy(d, rng, dtype), "x_t": saturating_int8(rng, (d.R, d.K)), "u": scales(rng, d.K),
                **zeros(d)}

    def reference(d: Dims, inputs: dict[str, np.ndarray]) -> np.ndarray:
        dy = to_f32(inputs["dy"], dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            v = stepmath.scales_of(stepmath.absmax(dy, 0))
            acc = exact_matmul(stepmath.codes(dy, v, 0).T, inputs["x_t"]).astype(np.int32)
            return from_f32(stepmath.rescale_cols(acc, v, inputs["u"]), weight_dtype)

    rescale = epilogue.Rescale(weight_dtype, buffers=(f32_vector("u", lambda d: d.K), *workspace),
                               row_scales="v", col_scales="u", row_scales_shared=True, **named)

    def operands(ptx, at, ring, p):
        a = QuantizedColumns(ptx, at, ring, p["dy"], dtype, rows=p["N"], k_limit=p["R"])
        p["v"] = a.scales_at  # dY's column scales, the epilogue's row factors: the CTA's own
        return a, StagedRows(ptx, at, ring, p["x_t"], p["ldr"], rows=p["K"], k_limit=p["R"], b=True)

    return specs.staged_spec(
        family_name("dwq", dtype, weight_dtype, split=True), tile, gemm=("N", "K", "R"),
        buffers=(epilogue.rescaled_output("dw", rescale, lambda d: d.N, lambda d: d.K),
                 BufferSpec("dy", dtype, Plain(lambda d: (d.R, d.N))),
                 pitched_transpose("x_t", lambda d: d.R, lambda d: d.K)),  # Xq^T, K x pitch(R)
        pitch=pitch_param("ldr", lambda d: d.R), operands=operands, loop_family=hslm_dw_s8.FAMILY,
        rescale=rescale, occupancy_of=family_name("dw", weight_dtype, split=True),
        a_reads=2 * ELEMENT_BYTES[dtype], make_inputs=make_inputs,
        reference=reference, max_rows=hslm_dw_s8.MAX_ROWS)


def bias_spec(dtype: str) -> KernelSpec:
    """db = sum_r dY[r, :] in f32, a CTA per 32 columns (``hslm_qcols``' first pass and tree)."""
    params = (BufferSpec("db", "float32", Plain(lambda d: (d.N,))), BufferSpec("dy", dtype, Plain(lambda d: (d.R, d.N))),
              ScalarSpec("R"), ScalarSpec("N"))

    def emit() -> str:
        ptx = Ptx(family_name("dbias", dtype), [(p.name, "u32" if p.is_scalar else "u64") for p in params], CTA_THREADS)
        p = {q.name: ptx.param_u32(q.name) if q.is_scalar else ptx.param_ptr(q.name) for q in params}
        _bias_body(ptx, dtype, p, ptx.special("%ctaid.x"))
        return ptx.render()

    def make_inputs(d: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"dy": _float_dy(d, rng, dtype)}

    def reference(d: Dims, inputs: dict[str, np.ndarray]) -> np.ndarray:
        with np.errstate(invalid="ignore", over="ignore"):
            return stepmath.column_sums(to_f32(inputs["dy"], dtype))

    return KernelSpec(name=family_name("dbias", dtype), emit=emit, params=params, make_inputs=make_inputs,
                      reference=reference, outputs=("db",),
                      geometry=lambda d: Launch((-(-d.N // WARP), 1, 1), (CTA_THREADS, 1, 1)))


def _bias_body(ptx: Ptx, dtype: str, p: dict[str, str], cta: str) -> None:
    cols_body(ptx, dtype, {"sums": p["db"], "x": p["dy"], "R": p["R"], "C": p["N"]}, lambda: cta)


def bias_member(dtype: str) -> Member:
    def count(ptx: Ptx, columns: str) -> str:
        return ptx.shr(ptx.add(columns, WARP - 1), WARP.bit_length() - 1)

    return Member(bias_spec(dtype), "db", CTA_THREADS, lambda ptx, p: p["N"], count,
                  lambda ptx, p, local, place: _bias_body(ptx, dtype, p, local))


def grads_spec(dx_tile: geometry.Tile, dw_tile: geometry.Tile, dtype: str, weight_dtype: str) -> KernelSpec:
    """The entry holding dX's product on ``dx_tile``, dW's on ``dw_tile`` and db."""
    dx, dw = dx_spec(dtype, dx_tile), dw_spec(dtype, weight_dtype, dw_tile)
    first = (dx_tile, dw_tile) == PAIRS[0]
    name = family(dtype, weight_dtype) if first else f"{family(dtype, weight_dtype)}_{dx.tile}_{dw.tile}"
    PARTS[name] = (dx, dw)
    # registers a thread: the wider product's cap (as many CTAs an SM as it asks)
    min_ctas = max((dx, dw), key=lambda spec: (spec.part.threads, spec.part.min_ctas)).part.min_ctas
    members = (staged_member(dx, "dx"), staged_member(dw, "dw"), bias_member(dtype))
    return grouped_spec(name, family(dtype, weight_dtype), f"{dx.tile}+{dw.tile}", members,
                        SHARED_NAMES, min_ctas, cost=lambda d: dx.cost(d) + dw.cost(d))


SPECS = tuple(grads_spec(dx_tile, dw_tile, dt, wdt)
              for dt in FLOAT_DTYPES for wdt in FLOAT_DTYPES for dx_tile, dw_tile in PAIRS)
