"""Activation quantization for the layer step: float activations (f32, f16, bf16) ->
int8 codes in the exact layouts the GEMMs read, and their f32 scales.

- ``hslm_qrows_<dt>``: one scale per row (forward reads Xq, dX reads dYq): a warp per
  row, absmax over the row (``max.NaN.f32``, exact in any order, then a butterfly of
  ``shfl.sync.bfly``), s = absmax / 127 (:func:`hslm_ptx.reference.stepmath.scales_of`), then the
  row's codes clip(rint(x / s), -127, 127) (``div.rn.f32``, ``cvt.rni.s32.f32``, which
  gives 0 for NaN, PTX ISA 9.7.9.21) written straight into the pitched R x ld buffer
  (hslm_ptx/kernel/pitch.py), the padding bytes up to ld written 0. Every load instruction of a
  warp reads 32 consecutive elements of its row and every store writes 32 consecutive
  codes (whole sectors); the row is read twice, the second time from cache.
- ``hslm_qcols_<dt>``: one scale per column (dW reads Xq^T and dYq^T): a CTA per 32
  columns, warp g summing and taking the absmax of rows g, g + 8, ... in turn, lane =
  column, so each load of a warp reads 32 consecutive columns of one row. The eight
  groups are combined in shared memory in :func:`hslm_ptx.reference.stepmath.column_sums`' tree
  (the column sums are the bias gradient when x is dY). The second pass codes 128-row
  tiles into shared memory, column-major (16 rows of a column packed into one 16-byte
  piece), and writes the transposed C x ldr buffer as whole 128-byte rows of 16-byte
  stores, rows past R coded 0 up to the pitch.
- ``hslm_quant_<dt>``: both of the above on the same x in one launch (the row CTAs
  first, then the column CTAs), for a backward computing dX and dW (dYq and dYq^T).
  Outputs and bits are the two kernels' own; what it saves is one launch's fixed cost.
  (A forward quantizes x's rows inside its GEMM, ``hslm_ptx/families/hslm_fwdq.py``, and x's
  columns in the same grid, ``hslm_ptx/families/hslm_fwdx.py``.)

The reads use 32-bit (f32) or 16-bit elements rather than 16-byte vectors: the HSLM
widths (243, 729, 2187) leave most rows unaligned to 16 bytes, and a warp's scalar loads
of consecutive elements already use every byte of the sectors they touch.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from hslm_ptx.reference import stepmath
from hslm_ptx.formats.floats import ELEMENT_BYTES, FLOAT_DTYPES, to_f32
from hslm_ptx.kernel.pitch import pitch, pitch_param
from hslm_ptx.emit.ptx import Ptx
from hslm_ptx.formats.layout import Plain
from hslm_ptx.kernel.spec import BufferSpec, Dims, KernelSpec, Launch, ScalarSpec, family_name
from hslm_ptx.emit.stepforms import (CTA_THREADS, WARP, element_address, int8_code,
                                     load_f32, load_vector_f32, pack_bytes, scale_of_absmax, warp_max)
from hslm_ptx.reference.testdata import float_activations

WARPS = CTA_THREADS // WARP
UNROLL = 4  # elements per lane per trip of a row loop: independent loads in flight
VECTOR_BYTES = 16
VECTOR_UNROLL = 2  # 16-byte vectors per lane per trip of an aligned row's loop
GROUPS = stepmath.COL_GROUPS  # = WARPS: warp g is the column reduction's group g
TILE_ROWS = 128  # rows of codes a qcols CTA stages per trip: 16 per warp, one 16-byte piece a column
PIECE = 16
assert GROUPS == WARPS


def _trips(ptx: Ptx, count: str, step: int) -> str:
    """ceil(count / step) for a power-of-two ``step``."""
    return ptx.shr(ptx.add(count, step - 1), step.bit_length() - 1)


def _uniform_loop(ptx: Ptx, name: str, trips: str, body) -> None:
    """``body(trip)`` for trip = 0 .. trips - 1 (trips >= 1, the same in every thread)."""
    trip = ptx.mov(0)
    ptx.label(name)
    body(trip)
    ptx.increment(trip, 1)
    ptx.branch(name, guard=ptx.setp("lt", trip, trips, "u32"))


# ---- hslm_qrows ----------------------------------------------------------------------


def emit_qrows(dtype: str) -> str:
    """Per-row scales and codes, a warp per row (:func:`_rows_body`)."""
    ptx = Ptx(family_name("qrows", dtype), [("codes", "u64"), ("scales", "u64"), ("x", "u64"),
                                                  ("R", "u32"), ("C", "u32"), ("ld", "u32")], CTA_THREADS)
    p = {n: ptx.param_ptr(n) for n in ("codes", "scales", "x")} | {n: ptx.param_u32(n) for n in ("R", "C", "ld")}
    _rows_body(ptx, dtype, p, lambda: ptx.special("%ctaid.x"))
    return ptx.render()


def _rows_body(ptx: Ptx, dtype: str, p: dict[str, str], cta: Callable[[], str]) -> None:
    """CTA ``cta()``'s 8 rows, a warp each (p: codes, scales, x, R, C, ld); rows of a
    16-byte multiple from a 16-byte aligned base (the launch decides, uniformly) take
    16-byte vectors, others elements. A warp past R goes to ``done`` (no barrier follows)."""
    tid = ptx.special("%tid.x")
    lane = ptx.band(tid, WARP - 1)
    row = ptx.mad(cta(), WARPS, ptx.shr(tid, 5))
    ptx.branch("done", guard=ptx.setp("ge", row, p["R"], "u32"))  # a whole warp: no barrier follows
    first = element_address(ptx, p["x"], ptx.mul(row, p["C"]), dtype)  # the row's first element
    out_row = ptx.byte_offset(p["codes"], row, p["ld"])
    misaligned = ptx.binop("or", ptx.mul(p["C"], ELEMENT_BYTES[dtype]), ptx.cvt("u32", "u64", p["x"]), "b32")
    ptx.branch("vector_rows", guard=ptx.setp("eq", ptx.band(misaligned, 15), 0, "u32"))
    _element_row(ptx, dtype, p, row, lane, first, out_row)
    ptx.branch("done")
    ptx.label("vector_rows")
    _vector_row(ptx, dtype, p, row, lane, first, out_row)
    ptx.label("done")


def _row_scale(ptx: Ptx, maxima: list[str], p: dict[str, str], row: str, lane: str) -> str:
    """The row's scale from each lane's absmax accumulators, in every lane; lane 0 stores it."""
    absmax = maxima[0]
    for other in maxima[1:]:
        absmax = ptx.fmax_nan(absmax, other)
    scale = scale_of_absmax(ptx, warp_max(ptx, absmax), stepmath.QMAX)
    ptx.store("global", "f32", ptx.byte_offset(p["scales"], row, 4), scale, guard=ptx.setp("eq", lane, 0, "u32"))
    return scale


def _row_passes(ptx: Ptx, p: dict[str, str], row: str, lane: str, unroll: int, counts: tuple[str, str],
                load: Callable[[str], list[str]], store: Callable[[str, list[str], str], None],
                loop_prefix: str = "", note: str = "") -> None:
    """The row's two passes, over units (elements or 16-byte vectors) of which lane l takes
    l, l + 32, ... (``unroll`` a trip, independent loads in flight): pass 1 folds the
    absmax of ``load(unit)``'s f32 values into the row's scale over the row's ``counts[0]``
    units, pass 2 hands them and the scale to ``store(unit, values, scale)`` over the
    ``counts[1]`` units of the pitched output row. ``loop_prefix`` and ``note`` tell the
    loop labels and comments of one form from the other's."""
    step = WARP * unroll
    ptx.comment(f"pass 1{note}: absmax of the row")
    maxima = [ptx.fmov(0.0) for _ in range(unroll)]
    unit = ptx.mov(lane)

    def absmax_trip(trip: str) -> None:
        for u in range(unroll):
            for value in load(ptx.add(unit, u * WARP)):
                ptx.ins("max.NaN.f32", maxima[u], maxima[u], ptx.fabs(value))
        ptx.increment(unit, step)

    _uniform_loop(ptx, f"{loop_prefix}absmax_loop", _trips(ptx, counts[0], step), absmax_trip)
    scale = _row_scale(ptx, maxima, p, row, lane)

    ptx.comment(f"pass 2{note}: codes into the pitched row, padding 0 up to ld")
    unit2 = ptx.mov(lane)

    def code_trip(trip: str) -> None:
        for u in range(unroll):
            at = ptx.add(unit2, u * WARP)
            store(at, load(at), scale)
        ptx.increment(unit2, step)

    _uniform_loop(ptx, f"{loop_prefix}code_loop", _trips(ptx, counts[1], step), code_trip)


def _element_row(ptx: Ptx, dtype: str, p: dict[str, str], row: str, lane: str, first: str, out_row: str) -> None:
    """A row element by element: each load of a warp reads 32 consecutive elements."""
    def load(at: str) -> list[str]:
        return [load_f32(ptx, dtype, element_address(ptx, first, at, dtype), guard=ptx.setp("lt", at, p["C"], "u32"))]

    def store(at: str, values: list[str], scale: str) -> None:
        ptx.store("global", "u8", ptx.byte_offset(out_row, at, 1), int8_code(ptx, values[0], scale),
                  guard=ptx.setp("lt", at, p["ld"], "u32"))

    _row_passes(ptx, p, row, lane, UNROLL, (p["C"], p["ld"]), load, store)


def _vector_row(ptx: Ptx, dtype: str, p: dict[str, str], row: str, lane: str, first: str, out_row: str) -> None:
    """A row by 16-byte vectors (4 f32 or 8 f16 / bf16 a lane): C is a whole number of
    vectors here, so a vector is entirely inside the row or entirely past it; each load of
    a warp reads 512 consecutive bytes, each store writes 4 or 8 codes a lane."""
    per = VECTOR_BYTES // ELEMENT_BYTES[dtype]  # elements a vector
    shift = per.bit_length() - 1
    vectors, out_vectors = ptx.shr(p["C"], shift), ptx.shr(p["ld"], shift)

    def load(at: str) -> list[str]:
        return load_vector_f32(ptx, dtype, ptx.byte_offset(first, at, VECTOR_BYTES), ptx.setp("lt", at, vectors, "u32"))

    def store(at: str, values: list[str], scale: str) -> None:
        codes = [int8_code(ptx, value, scale) for value in values]
        words = [pack_bytes(ptx, codes[i:i + 4]) for i in range(0, per, 4)]
        ptx.store("global", "u32" if len(words) == 1 else f"v{len(words)}.b32",
                  ptx.byte_offset(out_row, at, per), words[0] if len(words) == 1 else words,
                  guard=ptx.setp("lt", at, out_vectors, "u32"))

    _row_passes(ptx, p, row, lane, VECTOR_UNROLL, (vectors, out_vectors), load, store,
                loop_prefix="vector_", note=" (vectors)")


def qrows_geometry(d: Dims) -> Launch:
    return Launch((-(-d.R // WARPS), 1, 1), (CTA_THREADS, 1, 1))


def row_quantized(d: Dims, x: np.ndarray) -> dict[str, np.ndarray]:
    """Row scales and codes of the f32 values ``x`` (R x K), codes in the pitched layout."""
    with np.errstate(invalid="ignore"):
        scales = stepmath.scales_of(stepmath.absmax(x, 1))
        codes = np.zeros((d.R, pitch(d.K)), dtype=np.int8)
        codes[:, : d.K] = stepmath.codes(x, scales, 1)
    return {"codes": codes, "scales": scales}


def _quantization_spec(kind: str, dtype: str, axis: int, emit: Callable[[str], str],
                       geometry: Callable[[Dims], Launch], quantized: Callable[[Dims, np.ndarray], dict],
                       outputs: tuple[BufferSpec, ...], code_pitch: ScalarSpec, trip_elements: int) -> KernelSpec:
    """``hslm_<kind>_<dt>`` as a KernelSpec: both quantizers take the same inputs (x, R x K
    activations of ``dtype`` whose scales vary along ``axis``; the sizes R and C = K; the
    codes' pitch) after their ``outputs``, and their reference is ``quantized`` of x's f32
    values."""
    def make_inputs(d: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"x": float_activations(rng, (d.R, d.K), dtype, axis=axis)}

    def reference(d: Dims, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return quantized(d, to_f32(inputs["x"], dtype))

    return KernelSpec(
        name=family_name(kind, dtype), emit=lambda: emit(dtype), geometry=geometry,
        params=(*outputs,
                BufferSpec("x", dtype, Plain(lambda d: (d.R, d.K))),
                ScalarSpec("R"),
                ScalarSpec("C", lambda d: d.K),
                code_pitch),
        make_inputs=make_inputs, reference=reference,
        outputs=tuple(buffer.name for buffer in outputs), trip_elements=trip_elements,
    )


def qrows_spec(dtype: str) -> KernelSpec:
    return _quantization_spec(
        "qrows", dtype, 1, emit_qrows, qrows_geometry, row_quantized,
        outputs=(BufferSpec("codes", "int8", Plain(lambda d: (d.R, pitch(d.K)))),
                 BufferSpec("scales", "float32", Plain(lambda d: (d.R,)))),
        code_pitch=pitch_param("ld", lambda d: d.K),
        trip_elements=WARP * UNROLL)  # a trip of each pass: the same elements


# ---- hslm_qcols ----------------------------------------------------------------------


def _tile_piece(ptx: Ptx, tile: str, column: str, piece: str) -> str:
    """Shared address of 16-byte piece ``piece`` (rows 16 piece ..) of tile column
    ``column``: 128 bytes a column, pieces swizzled by piece ^ (column & 7), so the 8
    lanes of a 16-byte access phase (8 columns storing one piece, or one column loading
    8 pieces) reach 8 distinct bank groups."""
    swizzled = ptx.binop("xor", piece, ptx.band(column, 7), "b32")
    return ptx.add(ptx.shl(column, 7), ptx.add(ptx.shl(swizzled, 4), tile))


def emit_qcols(dtype: str) -> str:
    """Per-column scales, sums and transposed codes, a CTA per 32 columns (:func:`cols_body`)."""
    ptx = Ptx(family_name("qcols", dtype), [("codes_t", "u64"), ("scales", "u64"), ("sums", "u64"),
                                                  ("x", "u64"), ("R", "u32"), ("C", "u32"), ("ldr", "u32")],
              CTA_THREADS)
    p = {n: ptx.param_ptr(n) for n in ("codes_t", "scales", "sums", "x")} | {n: ptx.param_u32(n) for n in ("R", "C", "ldr")}
    cols_body(ptx, dtype, p, lambda: ptx.special("%ctaid.x"))
    return ptx.render()


def cols_body(ptx: Ptx, dtype: str, p: dict[str, str], cta: Callable[[], str]) -> None:
    """CTA ``cta()``'s 32 columns (p: codes_t, scales, sums, x, R, C, ldr), every thread of
    the CTA taking part (it has barriers). Without codes_t (p: sums, x, R, C) only the
    column sums: the first pass's adds and the groups' tree (the bias gradient of
    ``hslm_grads``)."""
    coded = "codes_t" in p
    sums, x, R, C = (p[n] for n in ("sums", "x", "R", "C"))
    tid = ptx.special("%tid.x")
    warp, lane = ptx.shr(tid, 5), ptx.band(tid, WARP - 1)
    c0 = ptx.shl(cta(), 5)
    column = ptx.add(c0, lane)
    column_inside = ptx.setp("lt", column, C, "u32")
    if coded:  # declared in this order: the quantizers' PTX as it was before sums alone existed
        group_maxima = ptx.shared_array("group_max", 4 * GROUPS * WARP)
    group_sums = ptx.shared_array("group_sum", 4 * GROUPS * WARP)
    if coded:
        column_scales = ptx.shared_array("column_scale", 4 * WARP)
        tile = ptx.shared_array("code_tile", WARP * TILE_ROWS)

    ptx.comment("pass 1: group g = warp adds rows g, g + 8, ... of its column in turn")
    rows_per_trip = GROUPS * PIECE
    total, absmax, row = ptx.fmov(0.0), ptx.fmov(0.0), ptx.mov(warp)

    def group_trip(trip: str) -> None:
        values = []
        for u in range(PIECE):  # the loads first, the adds in the group's order
            at = ptx.add(row, u * GROUPS)
            inside = ptx.fresh("pred", "and.pred", column_inside, ptx.setp("lt", at, R, "u32"))
            values.append(load_f32(ptx, dtype, element_address(ptx, x, ptx.mad(at, C, column), dtype), guard=inside))
        for value in values:
            ptx.ins("add.rn.f32", total, total, value)
            if coded:
                ptx.ins("max.NaN.f32", absmax, absmax, ptx.fabs(value))
        ptx.increment(row, rows_per_trip)

    _uniform_loop(ptx, "group_loop", _trips(ptx, R, rows_per_trip), group_trip)
    slot = ptx.mad(tid, 4, 0)
    ptx.store("shared", "f32", ptx.add(slot, group_sums), total)
    if coded:
        ptx.store("shared", "f32", ptx.add(slot, group_maxima), absmax)
    ptx.barrier()

    ptx.comment("warp 0: the groups' tree (g + 4, then + 2, then + 1) and the scale of its column")
    first_warp = ptx.setp("eq", warp, 0, "u32")
    ptx.branch("groups_done", guard=ptx.fresh("pred", "not.pred", first_warp))
    lane_slot = ptx.shl(lane, 2)
    group = [ptx.load_f32("shared", ptx.add(lane_slot, group_sums), 4 * WARP * g) for g in range(GROUPS)]
    while len(group) > 1:
        half = len(group) // 2
        group = [ptx.fadd(group[i], group[i + half]) for i in range(half)]
    if not coded:
        ptx.store("global", "f32", ptx.byte_offset(sums, column, 4), group[0], guard=column_inside)
        ptx.label("groups_done")
        return
    codes_t, scales, ldr = p["codes_t"], p["scales"], p["ldr"]
    maxima = [ptx.load_f32("shared", ptx.add(lane_slot, group_maxima), 4 * WARP * g) for g in range(GROUPS)]
    absmax = maxima[0]
    for other in maxima[1:]:
        absmax = ptx.fmax_nan(absmax, other)
    scale = scale_of_absmax(ptx, absmax, stepmath.QMAX)
    ptx.store("shared", "f32", ptx.add(lane_slot, column_scales), scale)
    ptx.store("global", "f32", ptx.byte_offset(scales, column, 4), scale, guard=column_inside)
    ptx.store("global", "f32", ptx.byte_offset(sums, column, 4), group[0], guard=column_inside)
    ptx.label("groups_done")
    ptx.barrier()
    scale = ptx.load_f32("shared", ptx.add(ptx.shl(lane, 2), column_scales))

    ptx.comment("pass 2: 128-row tiles; warp w codes rows 16w .. 16w + 15 of the tile into one piece per column")
    r0 = ptx.mov(0)
    out_column, out_piece = ptx.shr(tid, 3), ptx.band(tid, 7)  # the write-out: 8 lanes a column
    out_inside = ptx.setp("lt", ptx.add(c0, out_column), C, "u32")
    out_row = ptx.byte_offset(codes_t, ptx.add(c0, out_column), ldr)

    def tile_trip(trip: str) -> None:
        first_row = ptx.add(r0, ptx.shl(warp, 4))
        codes = []
        for u in range(PIECE):
            at = ptx.add(first_row, u)
            inside = ptx.fresh("pred", "and.pred", column_inside, ptx.setp("lt", at, R, "u32"))
            value = load_f32(ptx, dtype, element_address(ptx, x, ptx.mad(at, C, column), dtype), guard=inside)
            codes.append(int8_code(ptx, value, scale))
        words = [pack_bytes(ptx, codes[i:i + 4]) for i in range(0, PIECE, 4)]
        ptx.store("shared", "v4.b32", _tile_piece(ptx, tile, lane, warp), words)
        ptx.barrier()
        piece = ptx.load_vector("shared", "b32", _tile_piece(ptx, tile, out_column, out_piece), 4)
        at = ptx.add(r0, ptx.shl(out_piece, 4))
        inside = ptx.fresh("pred", "and.pred", out_inside, ptx.setp("lt", at, ldr, "u32"))
        ptx.store("global", "v4.b32", ptx.byte_offset(out_row, at, 1), piece, guard=inside)
        ptx.barrier()  # the tile is rewritten by the next trip
        ptx.increment(r0, TILE_ROWS)

    _uniform_loop(ptx, "tile_loop", _trips(ptx, ldr, TILE_ROWS), tile_trip)


def qcols_geometry(d: Dims) -> Launch:
    return Launch((-(-d.K // WARP), 1, 1), (CTA_THREADS, 1, 1))


def column_quantized(d: Dims, x: np.ndarray) -> dict[str, np.ndarray]:
    """Column scales, transposed codes (C x pitch(R)) and column sums of the f32 values ``x``."""
    with np.errstate(invalid="ignore", over="ignore"):
        scales = stepmath.scales_of(stepmath.absmax(x, 0))
        codes_t = np.zeros((d.K, pitch(d.R)), dtype=np.int8)
        codes_t[:, : d.R] = stepmath.codes(x, scales, 0).T
        sums = stepmath.column_sums(x)
    return {"codes_t": codes_t, "scales": scales, "sums": sums}


def qcols_spec(dtype: str) -> KernelSpec:
    return _quantization_spec(
        "qcols", dtype, 0, emit_qcols, qcols_geometry, column_quantized,
        outputs=(BufferSpec("codes_t", "int8", Plain(lambda d: (d.K, pitch(d.R)))),
                 BufferSpec("scales", "float32", Plain(lambda d: (d.K,))),
                 BufferSpec("sums", "float32", Plain(lambda d: (d.K,)))),
        code_pitch=pitch_param("ldr", lambda d: d.R),
        trip_elements=PIECE * WARP)  # a trip of each pass: 16 rows x 32 columns


# ---- hslm_quant: independent passes in one launch ----------------------------------------


def quant_ctas(d: Dims) -> tuple[int, int]:
    """(row CTAs, column CTAs) of ``hslm_quant``'s grid: qrows' grid, then qcols'."""
    return qrows_geometry(d).grid[0], qcols_geometry(d).grid[0]


def emit_quant(dtype: str) -> str:
    """The row and the column quantization of the same x in one launch: the first
    ceil(R / 8) CTAs run :func:`_rows_body`, the rest :func:`cols_body` on CTA
    ctaid.x - ceil(R / 8). Each branch is CTA-uniform, so every barrier of a part sees
    all the threads of its CTA. The parts share no data; one launch saves the other's
    fixed launch-and-teardown time."""
    pointers = ("codes", "row_scales", "codes_t", "col_scales", "sums", "x")
    sizes = ("R", "C", "ld", "ldr")
    ptx = Ptx(family_name("quant", dtype), [(n, "u64") for n in pointers] + [(n, "u32") for n in sizes],
              CTA_THREADS)
    p = {n: ptx.param_ptr(n) for n in pointers} | {n: ptx.param_u32(n) for n in sizes}
    cta = ptx.special("%ctaid.x")
    row_ctas = _trips(ptx, p["R"], WARPS)
    ptx.branch("columns", guard=ptx.setp("ge", cta, row_ctas, "u32"))
    _rows_body(ptx, dtype, p | {"scales": p["row_scales"]}, lambda: cta)
    ptx.branch("quant_end")
    ptx.label("columns")
    cols_body(ptx, dtype, p | {"scales": p["col_scales"]}, lambda: ptx.sub(cta, row_ctas, "u32"))
    ptx.label("quant_end")
    return ptx.render()


def quant_spec(dtype: str) -> KernelSpec:
    """``hslm_quant_<dt>``: qrows' outputs (codes, row_scales) and qcols' (codes_t,
    col_scales, sums) of one x (R x K), each exactly its own kernel's reference. Its test
    data varies the scale per row or per column by a seeded coin, so both halves meet
    their tie and non-finite slices over the cells."""
    def make_inputs(d: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"x": float_activations(rng, (d.R, d.K), dtype, axis=int(rng.integers(0, 2)))}

    def reference(d: Dims, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = to_f32(inputs["x"], dtype)
        rows, cols = row_quantized(d, x), column_quantized(d, x)
        return {"codes": rows["codes"], "row_scales": rows["scales"], "codes_t": cols["codes_t"],
                "col_scales": cols["scales"], "sums": cols["sums"]}

    outputs = (BufferSpec("codes", "int8", Plain(lambda d: (d.R, pitch(d.K)))),
               BufferSpec("row_scales", "float32", Plain(lambda d: (d.R,))),
               BufferSpec("codes_t", "int8", Plain(lambda d: (d.K, pitch(d.R)))),
               BufferSpec("col_scales", "float32", Plain(lambda d: (d.K,))),
               BufferSpec("sums", "float32", Plain(lambda d: (d.K,))))
    sizes = (ScalarSpec("R"), ScalarSpec("C", lambda d: d.K), pitch_param("ld", lambda d: d.K),
             pitch_param("ldr", lambda d: d.R))

    def geometry(d: Dims) -> Launch:
        return Launch((sum(quant_ctas(d)), 1, 1), (CTA_THREADS, 1, 1))

    return KernelSpec(
        name=family_name("quant", dtype), emit=lambda: emit_quant(dtype), geometry=geometry,
        params=(*outputs, BufferSpec("x", dtype, Plain(lambda d: (d.R, d.K))), *sizes),
        make_inputs=make_inputs, reference=reference,
        outputs=tuple(buffer.name for buffer in outputs), trip_elements=WARP * UNROLL,  # a row trip, as qrows
    )


SPECS = (tuple(qrows_spec(dt) for dt in FLOAT_DTYPES) + tuple(qcols_spec(dt) for dt in FLOAT_DTYPES)
         + tuple(quant_spec(dt) for dt in FLOAT_DTYPES))
