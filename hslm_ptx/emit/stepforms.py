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
