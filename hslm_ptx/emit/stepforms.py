"""Emit pieces the layer step's float kernels share: one element of a float buffer read
as f32, and a CTA-wide sum in the tree order of :func:`hslm_ptx.reference.stepmath.tree_sum`.

Element types are the layer's float types (hslm_ptx.formats.floats.FLOAT_DTYPES): f32 is read
as it is, f16 and bf16 as a ``.b16`` register widened by ``cvt.f32.f16`` /
``cvt.f32.bf16``, which is exact (PTX ISA 9.7.9.21), so every kernel computes on the
same f32 values as the numpy references in hslm_ptx.reference.stepmath.
"""
from __future__ import annotations

from hslm_ptx.emit.ptx import Ptx
from hslm_ptx.formats.floats import ELEMENT_BYTES, SHORT_NAMES
from hslm_ptx.reference import stepmath

CTA_THREADS = 256
WARP = 32


def load_f32(ptx: Ptx, dtype: str, address: str, guard: str | None = None, offset: int = 0) -> str:
    """The element of ``dtype`` at ``address`` (+ ``offset`` bytes) as a fresh .f32
    register; +0 where ``guard`` is off (the load is not issued there)."""
    if dtype == "float32":
        value = ptx.fmov(0.0)
        ptx.load("global", "f32", address, offset, guard=guard, into=value)
        return value
    half = ptx.fresh("b16", "mov.b16", 0)
    ptx.load("global", "b16", address, offset, guard=guard, into=half)
    return ptx.cvt("f32", SHORT_NAMES[dtype], half)


def element_address(ptx: Ptx, base: str, index: str, dtype: str) -> str:
    """``base + index * sizeof(dtype)`` (a 32-bit element index, 64-bit address)."""
    return ptx.byte_offset(base, index, ELEMENT_BYTES[dtype])


def cta_tree_sum(ptx: Ptx, value: str, tid: str, scratch: str) -> str:
    """The sum of ``value`` over the CTA's 256 threads, valid in thread 0, added as
    :func:`hslm_ptx.reference.stepmath.tree_sum` adds: v[t] + v[t + h] for h = 128, 64 (shared
    memory, ``scratch``: 1 KiB), 32 (warp 0 reading shared), then 16 .. 1 by
    ``shfl.sync.down`` (lane l takes lane l + h). Every warp runs the shuffles (no
    divergence); only warp 0's values mean anything."""
    slot = ptx.mad(tid, 4, scratch)
    ptx.store("shared", "f32", slot, value)
    return slots_tree_sum(ptx, slot, tid)


def slots_tree_sum(ptx: Ptx, slot: str, tid: str) -> str:
    """:func:`cta_tree_sum` of the 256 values already stored at ``scratch`` (this thread's
    ``slot``: scratch + 4 tid), the first barrier included: a CTA of 128 threads stores two
    slots a thread (t and t + 128) and then adds them in the same tree."""
    ptx.barrier()
    for half in (128, 64):
        inside = ptx.setp("lt", tid, half, "u32")
        low = ptx.fmov(0.0)
        high = ptx.fmov(0.0)
        ptx.load("shared", "f32", slot, guard=inside, into=low)
        ptx.load("shared", "f32", slot, 4 * half, guard=inside, into=high)
        ptx.store("shared", "f32", slot, ptx.fadd(low, high), guard=inside)
        ptx.barrier()
    first_warp = ptx.setp("lt", tid, WARP, "u32")
    low, high = ptx.fmov(0.0), ptx.fmov(0.0)
    ptx.load("shared", "f32", slot, guard=first_warp, into=low)
    ptx.load("shared", "f32", slot, 4 * WARP, guard=first_warp, into=high)
    total = ptx.fadd(low, high)
    for delta in (16, 8, 4, 2, 1):
        total = ptx.fadd(total, ptx.shfl("down", total, delta, 0x1F))
    return total


def warp_max(ptx: Ptx, value: str, lanes: int = WARP) -> str:
    """max.NaN over each run of ``lanes`` lanes (a power of two; the whole warp by
    default), in every lane of the run (``shfl.sync.bfly``; max is exact in any order)."""
    for mask in (16, 8, 4, 2, 1)[(WARP // lanes).bit_length() - 1:]:
        value = ptx.fmax_nan(value, ptx.shfl("bfly", value, mask, 0x1F))
    return value


def scale_of_absmax(ptx: Ptx, absmax: str, qmax: int) -> str:
    """absmax / qmax (``div.rn.f32``), 1 where that is 0: :func:`hslm_ptx.reference.stepmath.scales_of`."""
    scale = ptx.fdiv(absmax, float(qmax))
    return ptx.selp_f32(1.0, scale, ptx.setp_f32("eq", scale, 0.0))


def int8_code(ptx: Ptx, value: str, scale: str) -> str:
    """clip(rint(value / scale), -127, 127) as an s32 (NaN -> 0): :func:`hslm_ptx.reference.stepmath.codes`."""
    rounded = ptx.cvt("s32", "f32", ptx.fdiv(value, scale), rnd="rni")
    return ptx.binop("max", ptx.binop("min", rounded, stepmath.QMAX, "s32"), -stepmath.QMAX, "s32")


def pack_bytes(ptx: Ptx, values: list[str]) -> str:
    """Four registers' low bytes as one word, values[0] in the lowest byte (int8 codes in
    memory order): two prmt pairings, then one merging the pairs."""
    low = ptx.prmt(values[0], values[1], 0x0040)
    high = ptx.prmt(values[2], values[3], 0x0040)
    return ptx.prmt(low, high, 0x5410)


def load_vector_f32(ptx: Ptx, dtype: str, address: str, guard: str) -> list[str]:
    """The 16 bytes at ``address`` (16-byte aligned) as f32 values: 4 of f32, 8 of f16 /
    bf16 (two a word, the lower address first); +0 where ``guard`` is off."""
    if dtype == "float32":
        return ptx.load_vector_into("global", "f32", address, [ptx.fmov(0.0) for _ in range(4)], guard=guard)
    words = ptx.load_vector_into("global", "b32", address, [ptx.mov(0) for _ in range(4)], guard=guard)
    return [ptx.cvt("f32", SHORT_NAMES[dtype], half) for word in words for half in ptx.unpack_halves(word)]


def partials_beta(ptx: Ptx, partials: str, count: str, tid: str, threads: int, scratch: str) -> str:
    """beta = mean|W| from the P = ceil(count / SUM_BLOCK) partial sums of |W| * SUM_SCALE,
    valid in thread 0: the partials summed as :func:`hslm_ptx.reference.stepmath.scale_of_partials`
    does (256 strided sums, partials t, t + 256, ... in turn, one uniform trip count with the
    loads past P off, then the tree), divided by ``count`` * SUM_SCALE (``div.rn.f32``), 1 where
    that is 0. A CTA of ``threads`` = 128 takes the 256 strided sums two a thread (t and
    t + 128), so every CTA size gets the same bits."""
    P = ptx.shr(ptx.add(count, stepmath.SUM_BLOCK - 1), (stepmath.SUM_BLOCK).bit_length() - 1)
    trips = ptx.shr(ptx.add(P, CTA_THREADS - 1), 8)
    sums = [(ptx.fmov(0.0), ptx.add(tid, first)) for first in range(0, CTA_THREADS, threads)]
    trip = ptx.mov(0)
    ptx.label("partials_loop")
    for acc, index in sums:
        inside = ptx.setp("lt", index, P, "u32")
        value = load_f32(ptx, "float32", element_address(ptx, partials, index, "float32"), guard=inside)
        ptx.ins("add.rn.f32", acc, acc, value)
        ptx.increment(index, CTA_THREADS)
    ptx.increment(trip, 1)
    ptx.branch("partials_loop", guard=ptx.setp("lt", trip, trips, "u32"))
    slot = ptx.mad(tid, 4, scratch)
    for i, (acc, _) in enumerate(sums):
        ptx.store("shared", "f32", slot, acc, 4 * threads * i)
    total = slots_tree_sum(ptx, slot, tid)
    scaled = ptx.fmul(ptx.cvt("f32", "u32", count, rnd="rn"), float(stepmath.SUM_SCALE))
    beta = ptx.fdiv(total, scaled)
    return ptx.selp_f32(1.0, beta, ptx.setp_f32("eq", beta, 0.0))


def ternary_threshold(ptx: Ptx, beta: str) -> tuple[str, str, str]:
    """(s, h, -h) with code(w) = (w s > h) - (w s < -h) equal to clip(rint(w / beta), -1, 1)
    (``div.rn.f32``, NaN -> 0) for every f32 w: :func:`hslm_ptx.reference.stepmath.ternary_threshold`,
    whose docstring gives the proof. Two compares an element instead of a division."""
    tiny = ptx.setp_f32("lt", beta, stepmath.THRESHOLD_TINY)
    scale = ptx.selp_f32(stepmath.THRESHOLD_LIFT, 1.0, tiny)
    half = ptx.fmul(beta, ptx.selp_f32(stepmath.THRESHOLD_LIFT / 2, 0.5, tiny))
    return scale, half, ptx.fneg(half)


def threshold_code(ptx: Ptx, value: str, threshold: tuple[str, str]) -> str:
    """The 2-bit ternary code (0: 0, 1: +1, 2: -1) of f32 ``value`` by :func:`ternary_threshold`."""
    scale, half, minus_half = threshold
    lifted = ptx.fmul(value, scale)
    negative = ptx.selp(2, 0, ptx.setp_f32("lt", lifted, minus_half))
    return ptx.selp(1, negative, ptx.setp_f32("gt", lifted, half))


def plane_word(ptx: Ptx, quads: list[str]) -> str:
    """A planes word from four words of 2-bit codes as bytes: word s holds the codes of chunk
    indices 16 s + 4 w + u (u = byte) and they go to bit 4 u + 16 (s & 1) + 2 (s >> 1)
    (hslm_ptx/formats/planes.py): x | x >> 4 puts byte pairs in nibbles, prmt gathers them."""
    nibbles = [ptx.binop("or", q, ptx.shr(q, 4), "b32") for q in quads]
    low = ptx.prmt(nibbles[0], nibbles[1], 0x6420)
    high = ptx.prmt(nibbles[2], nibbles[3], 0x6420)
    return ptx.binop("or", low, ptx.shl(high, 2), "b32")
