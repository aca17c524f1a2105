"""Weight preparation: the latent float W (nn.Linear's N x K) -> beta = mean|W| and the
ternary planes forward and dX read, in two launches, with nothing read back to the host.

1. ``hslm_wsum_<dt>`` (grid P = ceil(N K / 4096), 256 threads): CTA c sums |W| * 2^-32
   (``stepmath.SUM_SCALE``: exact, and no sum of a u32 count of elements overflows) over
   elements c*4096 .. c*4096 + 4095 in memory order, thread t taking elements
   c*4096 + 256 i + t for i = 0 .. 15 in turn, then a tree over the threads: one partial
   per CTA, :func:`hslm_ptx.reference.stepmath.abs_partials` bit for bit. Each load instruction of a
   warp reads 32 consecutive elements (whole 32-byte sectors); the order is fixed by the
   reference, which puts a thread's elements 256 apart, so wider loads would hand one
   thread four threads' elements.
2. ``hslm_wprep_<dt>`` (grid (Kp/64, Np/64), K and N padded to 128, 256 threads): every
   CTA sums the P partials in :func:`hslm_ptx.reference.stepmath.abs_sum`'s order, so all CTAs hold
   the same beta without a grid-wide sync; CTA (0, 0) stores it. Each CTA then codes a
   64 x 64 tile of W (rows n, columns k), clip(rint(W / beta), -1, 1) by two compares
   with beta / 2 (``stepforms.threshold_code``; NaN compares false: code 0), which is
   :func:`hslm_ptx.reference.stepmath.ternary_codes` exactly
   (:func:`hslm_ptx.reference.stepmath.ternary_threshold` says why), and writes that tile's share
   of both plane sets (hslm_ptx/formats/planes.py): forward's plane k/64, columns n (W as K x N),
   and dX's plane n/64, columns k (W^T). Both are 1 KiB contiguous per CTA, one word
   per thread, so every warp store covers whole lines.

The tile reaches the two word orders through shared memory: each code as a byte in a
row-major tile (forward: a word is 16 codes of one row) and, four rows packed in a word,
in a column-major tile (dX: a word is 16 codes of one column). Both layouts are chosen
so no access pattern of either phase has a bank conflict (see the offsets below).
Tiles past N or K (the planes' padding to 128) are coded 0, as the host conversion pads.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from hslm_ptx.reference import stepmath
from hslm_ptx.formats.floats import FLOAT_DTYPES, to_f32
from hslm_ptx.formats.planes import FRAGMENTS, FRAGMENTS_T, shape as planes_shape
from hslm_ptx.emit.ptx import Ptx
from hslm_ptx.tile.grouped import Member
from hslm_ptx.formats.layout import Plain
from hslm_ptx.kernel.spec import BufferSpec, Dims, KernelSpec, Launch, ScalarSpec, family_name
from hslm_ptx.emit.stepforms import (CTA_THREADS, cta_tree_sum, element_address, load_f32, pack_bytes, partials_beta,
                                     plane_word, ternary_threshold, threshold_code)
from hslm_ptx.formats.ternary import pack
from hslm_ptx.tile.geometry import SHARED_ALIGN
from hslm_ptx.reference.testdata import latent_weights

TILE = 64  # rows and columns of W a preparation CTA codes: one plane chunk each way
ITEMS = stepmath.SUM_ITEMS
# shared tiles of the preparation CTA (bytes)
ROW_TILE_PITCH = 80  # row-major codes: 20 words a row, so a row's 16-byte pieces of 8 rows sit in distinct banks
COLUMN_TILE_BYTES = TILE * TILE  # column-major: 16 row-quads x 64 columns of words

Operand = str | int


def partial_count(count: int) -> int:
    """P: the number of partial sums (and CTAs) of the first launch for ``count`` elements."""
    return max(1, -(-count // stepmath.SUM_BLOCK))


def _count(d: Dims) -> int:
    return d.N * d.K


# ---- hslm_wsum -----------------------------------------------------------------------


def emit_wsum(dtype: str) -> str:
    """One partial sum of |W| per CTA (:func:`hslm_ptx.reference.stepmath.abs_partials`)."""
    ptx = Ptx(family_name("wsum", dtype), [("partials", "u64"), ("w", "u64"), ("count", "u32")], CTA_THREADS)
    p = {"partials": ptx.param_ptr("partials"), "w": ptx.param_ptr("w"), "count": ptx.param_u32("count")}
    wsum_body(ptx, dtype, p, lambda: ptx.special("%ctaid.x"))
    return ptx.render()


def wsum_body(ptx: Ptx, dtype: str, p: dict[str, str], cta_of: Callable[[], str]) -> None:
    """CTA ``cta_of()``'s partial sum (p: partials, w, count), every thread of the CTA
    taking part (the tree has barriers)."""
    partials, w, count = p["partials"], p["w"], p["count"]
    tid, cta = ptx.special("%tid.x"), cta_of()
    scratch = ptx.shared_array("sum_scratch", 4 * CTA_THREADS)
    first = ptx.mad(cta, stepmath.SUM_BLOCK, tid)
    values = []
    for item in range(ITEMS):  # every load first: 16 independent requests in flight
        index = ptx.add(first, item * stepmath.SUM_THREADS)
        inside = ptx.setp("lt", index, count, "u32")
        values.append(load_f32(ptx, dtype, element_address(ptx, w, index, dtype), guard=inside))
    acc = ptx.fmov(0.0)
    for value in values:  # in turn, as the reference adds
        acc = ptx.fadd(acc, ptx.fmul(ptx.fabs(value), float(stepmath.SUM_SCALE)))  # exact: a power of two
    total = cta_tree_sum(ptx, acc, tid, scratch)
    ptx.store("global", "f32", ptx.byte_offset(partials, cta, 4), total, guard=ptx.setp("eq", tid, 0, "u32"))


def wsum_geometry(d: Dims) -> Launch:
    return Launch((partial_count(_count(d)), 1, 1), (CTA_THREADS, 1, 1))


def wsum_spec(dtype: str) -> KernelSpec:
    def make_inputs(d: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"w": latent_weights(rng, d.N, d.K, dtype)}

    def reference(d: Dims, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"partials": stepmath.abs_partials(to_f32(inputs["w"], dtype))}

    return KernelSpec(
        name=family_name("wsum", dtype), emit=lambda: emit_wsum(dtype), geometry=wsum_geometry,
        params=(BufferSpec("partials", "float32", Plain(lambda d: (partial_count(_count(d)),))),
                BufferSpec("w", dtype, Plain(lambda d: (d.N, d.K))),
                ScalarSpec("count", _count)),
        make_inputs=make_inputs, reference=reference,
        outputs=("partials",), trip_elements=ITEMS * 32,
    )


# ---- hslm_wprep ----------------------------------------------------------------------


def _beta(ptx: Ptx, p: dict[str, str], tid: str, scratch: str, broadcast: str) -> str:
    """beta in every thread (``stepforms.partials_beta``, then through shared memory);
    thread 0 of CTA (0, 0) stores it."""
    beta = partials_beta(ptx, p["w_partials"], ptx.mul(p["N"], p["K"]), tid, CTA_THREADS, scratch)
    thread0 = ptx.setp("eq", tid, 0, "u32")
    ptx.store("shared", "f32", broadcast, beta, guard=thread0)
    corner = ptx.binop("or", ptx.binop("or", ptx.special("%ctaid.x"), ptx.special("%ctaid.y"), "b32"), tid, "b32")
    ptx.store("global", "f32", p["beta"], beta, guard=ptx.setp("eq", corner, 0, "u32"))
    ptx.barrier()
    return ptx.load_f32("shared", broadcast)


def _column_word(ptx: Ptx, column_tile: str, column: Operand, quad: Operand) -> str:
    """Shared address of the word holding rows 4 quad .. 4 quad + 3 of tile column
    ``column``: word 64 quad + (column + 8 quad) mod 64, so the 32 consecutive columns a
    warp stores and the 8 columns x 4 quads a warp reads each fall in 32 distinct banks."""
    rotated = ptx.band(ptx.add(column, ptx.shl(quad, 3) if isinstance(quad, str) else 8 * quad), TILE - 1)
    word = ptx.add(rotated, ptx.shl(quad, 6) if isinstance(quad, str) else 64 * quad)
    return ptx.mad(word, 4, column_tile)


BUFFERS = ("planes", "planes_t", "beta", "w", "w_partials")


def emit_wprep(dtype: str) -> str:
    """beta, then this CTA's 64 x 64 tile of W coded into both plane sets."""
    ptx = Ptx(family_name("wprep", dtype), [(n, "u64") for n in BUFFERS] + [(n, "u32") for n in ("N", "K")],
              CTA_THREADS)
    wprep_body(ptx, dtype, {n: ptx.param_ptr(n) for n in BUFFERS} | {n: ptx.param_u32(n) for n in ("N", "K")})
    return ptx.render()


def wprep_body(ptx: Ptx, dtype: str, p: dict[str, str]) -> None:
    """CTA (%ctaid.x, %ctaid.y)'s share of the preparation (a grouped entry sets the
    coordinates as its own, ``Ptx.specials``)."""
    tid = ptx.special("%tid.x")
    scratch = ptx.shared_array("sum_scratch", 4 * CTA_THREADS)
    broadcast = ptx.shared_array("beta_shared", 16)
    # both code tiles in one array named as the staged products' ring, so a grouped entry
    # holding this body and a product (hslm_fwdw) has them inside the ring's bytes
    row_tile = ptx.shared_array("ring", TILE * ROW_TILE_PITCH + COLUMN_TILE_BYTES, SHARED_ALIGN)
    column_tile = ptx.add(row_tile, TILE * ROW_TILE_PITCH)
    threshold = ternary_threshold(ptx, _beta(ptx, p, tid, scratch, broadcast))

    ptx.comment("code the tile: warp w takes rows 4w..4w+3 and 32+4w..32+4w+3, lane l columns l and 32+l")
    k0, n0 = ptx.shl(ptx.special("%ctaid.x"), 6), ptx.shl(ptx.special("%ctaid.y"), 6)
    warp, lane = ptx.shr(tid, 5), ptx.band(tid, 31)
    for column_half in (0, 32):
        column = ptx.add(lane, column_half)
        k = ptx.add(k0, column)
        k_inside = ptx.setp("lt", k, p["K"], "u32")
        for row_half in (0, 32):
            quad = ptx.add(warp, row_half // 4)  # rows 4 quad .. 4 quad + 3
            codes = []
            for j in range(4):
                row = ptx.add(ptx.shl(quad, 2), j)
                n = ptx.add(n0, row)
                inside = ptx.fresh("pred", "and.pred", k_inside, ptx.setp("lt", n, p["N"], "u32"))
                index = ptx.mad(n, p["K"], k)
                value = load_f32(ptx, dtype, element_address(ptx, p["w"], index, dtype), guard=inside)
                code = threshold_code(ptx, value, threshold)
                ptx.store("shared", "u8", ptx.add(ptx.mad(row, ROW_TILE_PITCH, row_tile), column), code)
                codes.append(code)
            ptx.store("shared", "u32", _column_word(ptx, column_tile, column, quad), pack_bytes(ptx, codes))
    ptx.barrier()

    ptx.comment("build the words: thread t owns word t % 4 of tile column (or row) t / 4")
    owner, word = ptx.shr(tid, 2), ptx.band(tid, 3)
    forward = [ptx.load("shared", "u32", ptx.add(ptx.mad(owner, ROW_TILE_PITCH, row_tile), ptx.shl(word, 2)), 16 * s)
               for s in range(4)]
    transposed = [ptx.load("shared", "u32", _column_word(ptx, column_tile, owner, ptx.add(word, 4 * s)))
                  for s in range(4)]
    # forward planes: plane k0/64 of W as K x N, columns n0.. (4 words each); dX's: plane n0/64, columns k0..
    forward_row = ptx.shl(ptx.round_up(p["N"], 128), 2)  # words per plane
    transposed_row = ptx.shl(ptx.round_up(p["K"], 128), 2)
    at = ptx.mad(ptx.special("%ctaid.x"), forward_row, ptx.add(ptx.shl(n0, 2), tid))
    ptx.store("global", "u32", ptx.byte_offset(p["planes"], at, 4), plane_word(ptx, forward))
    at_t = ptx.mad(ptx.special("%ctaid.y"), transposed_row, ptx.add(ptx.shl(k0, 2), tid))
    ptx.store("global", "u32", ptx.byte_offset(p["planes_t"], at_t, 4), plane_word(ptx, transposed))


def wprep_geometry(d: Dims) -> Launch:
    return Launch((planes_shape(d.K, 1)[0], planes_shape(d.N, 1)[0], 1), (CTA_THREADS, 1, 1))


def partials_param() -> BufferSpec:
    """``w_partials``: the first launch's partial sums of |W|, as the kernels that finish
    beta from them read them."""
    return BufferSpec("w_partials", "float32", Plain(lambda d: (partial_count(_count(d)),)))


def coded(d: Dims, w: np.ndarray, partials: np.ndarray) -> tuple[np.float32, np.ndarray]:
    """beta from the partials and W's codes (f32 values, N x K) packed as W is, K x N
    (hslm_ptx/formats/ternary.py)."""
    beta = stepmath.scale_of_partials(partials, _count(d))
    with np.errstate(invalid="ignore"):
        codes = stepmath.ternary_codes(w, beta)
    return beta, pack(codes.T)


def prepared(d: Dims, w: np.ndarray, partials: np.ndarray) -> dict[str, np.ndarray]:
    """beta, and hslm_ptx/formats/planes.py's own conversion of W's codes into each plane order."""
    beta, packed = coded(d, w, partials)
    return {"planes": FRAGMENTS(packed, FRAGMENTS.shape(d)), "planes_t": FRAGMENTS_T(packed, FRAGMENTS_T.shape(d)),
            "beta": np.array([beta], dtype=np.float32)}


def wprep_spec(dtype: str) -> KernelSpec:
    def make_inputs(d: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """W, and the partials the first launch makes of it."""
        w = latent_weights(rng, d.N, d.K, dtype)
        return {"w": w, "w_partials": stepmath.abs_partials(to_f32(w, dtype))}

    def reference(d: Dims, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return prepared(d, to_f32(inputs["w"], dtype), inputs["w_partials"])

    return KernelSpec(
        name=family_name("wprep", dtype), emit=lambda: emit_wprep(dtype), geometry=wprep_geometry,
        params=(BufferSpec("planes", "uint32", Plain(FRAGMENTS.shape)),
                BufferSpec("planes_t", "uint32", Plain(FRAGMENTS_T.shape)),
                BufferSpec("beta", "float32", Plain(lambda d: (1,))),
                BufferSpec("w", dtype, Plain(lambda d: (d.N, d.K))),
                partials_param(),
                ScalarSpec("N"), ScalarSpec("K")),
        make_inputs=make_inputs, reference=reference,
        outputs=("planes", "planes_t", "beta"), trip_elements=TILE * TILE // (CTA_THREADS // 32),
    )


def wprep_member(dtype: str) -> Member:
    """``hslm_wprep``'s body as a member of a grouped entry: its (Kp / 64) x (Np / 64) CTAs."""
    def place(ptx: Ptx, p: dict[str, str]) -> tuple[str, str]:
        return tuple(ptx.shr(ptx.round_up(p[size], 128), 6) for size in ("K", "N"))

    def emit(ptx: Ptx, p: dict[str, str], local: str, grid: tuple[str, str]) -> None:
        y = ptx.binop("div", local, grid[0])
        ptx.specials = {"%ctaid.x": ptx.sub(local, ptx.mul(y, grid[0]), "u32"), "%ctaid.y": y}
        wprep_body(ptx, dtype, p)
        ptx.specials = {}

    return Member(wprep_spec(dtype), "wprep", CTA_THREADS, place, lambda ptx, grid: ptx.mul(*grid), emit)


SPECS = tuple(wsum_spec(dt) for dt in FLOAT_DTYPES) + tuple(wprep_spec(dt) for dt in FLOAT_DTYPES)
