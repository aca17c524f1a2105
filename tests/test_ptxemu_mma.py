"""mma.sync integer fragments: the emulator against the PTX ISA fragment layout.

The fragments are packed here straight from the ISA's per-element formulas
(PTX ISA, "Matrix Fragments for mma.m16n8k32": g = lane >> 2, t = lane % 4), written independently of the
emulator's reshapes, then the emulator's D must equal A @ B + C exactly.
"""
from __future__ import annotations

import numpy as np
import pytest
from emucases import PROLOGUE, a_index, b_index, c_index, module

from hslm_ptx.emu import EmulatorError, Module


def pack(mats: np.ndarray, idx) -> np.ndarray:
    """[warps, R, C] 8-bit matrices -> [warps*32, regs] u32 fragments."""
    r, c = idx
    b = mats.astype(np.uint8)[:, r, c]                        # [warps, 32, regs, 4]
    return np.ascontiguousarray(b).view(np.uint32).reshape(-1, r.shape[1])


def mma(A, B, C, k: int, ta="s8", tb="s8", sat: bool = False) -> np.ndarray:
    """Run one mma per warp on [warps, 16, k] A, [warps, k, 8] B, [warps, 16, 8] C."""
    na, nb = k // 8, k // 16
    va = {4: "ld.global.v4.b32 {%r20, %r21, %r22, %r23}", 2: "ld.global.v2.b32 {%r20, %r21}"}
    vb = {2: "ld.global.v2.b32 {%r24, %r25}", 1: "ld.global.b32 %r24"}
    areg = ", ".join(f"%r{20 + j}" for j in range(na))
    breg = ", ".join(f"%r{24 + j}" for j in range(nb))
    body = f"""
  mul.wide.u32 %rd10, %r4, {4 * na};
  add.s64 %rd11, %rd4, %rd10;
  {va[na]}, [%rd11];
  mul.wide.u32 %rd12, %r4, {4 * nb};
  add.s64 %rd13, %rd6, %rd12;
  {vb[nb]}, [%rd13];
  mul.wide.u32 %rd14, %r4, 16;
  add.s64 %rd15, %rd8, %rd14;
  ld.global.v4.b32 {{%r26, %r27, %r28, %r29}}, [%rd15];
  mma.sync.aligned.m16n8k{k}.row.col{'.satfinite' if sat else ''}.s32.{ta}.{tb}.s32 {{%r30, %r31, %r32, %r33}}, {{{areg}}}, {{{breg}}}, {{%r26, %r27, %r28, %r29}};
  add.s64 %rd16, %rd1, %rd14;
  st.global.v4.b32 [%rd16], {{%r30, %r31, %r32, %r33}};"""
    warps = A.shape[0]
    a, b = pack(A, a_index(k)), pack(B, b_index(k))
    ci = c_index()
    c = np.ascontiguousarray(C.astype(np.int32)[:, ci[0], ci[1]]).reshape(-1, 4)
    d = np.zeros_like(c)
    Module(code=module(PROLOGUE + body)).get_function("k")((warps // 2,), (64,), [d, a, b, c])
    D = np.zeros((warps, 16, 8), np.int32)
    D[:, ci[0], ci[1]] = d.reshape(warps, 32, 4)
    return D


@pytest.mark.parametrize("k", [32, 16])
def test_mma_a_fragment_elements(k):
    """One-hot B picks column 8w + n of A in warp w: D names the A element it got."""
    warps = k // 8
    B = np.zeros((warps, k, 8), np.int8)
    for w in range(warps):
        B[w, 8 * w + np.arange(8), np.arange(8)] = 1
    m, kk = np.meshgrid(np.arange(16), np.arange(k), indexing="ij")
    C = np.zeros((warps, 16, 8), np.int32)
    rows = mma(np.broadcast_to(m, (warps, 16, k)), B, C, k)
    cols = mma(np.broadcast_to(kk, (warps, 16, k)), B, C, k)
    for w in range(warps):
        assert (rows[w] == np.arange(16)[:, None]).all()
        assert (cols[w] == 8 * w + np.arange(8)[None, :]).all()


@pytest.mark.parametrize("k", [32, 16])
def test_mma_b_fragment_elements(k):
    """One-hot A row m picks row (m + 16w) % k of B in warp w."""
    warps = 2
    A = np.zeros((warps, 16, k), np.int8)
    for w in range(warps):
        A[w, np.arange(16), (np.arange(16) + 16 * w) % k] = 1
    kk, n = np.meshgrid(np.arange(k), np.arange(8), indexing="ij")
    C = np.zeros((warps, 16, 8), np.int32)
    rows = mma(A, np.broadcast_to(kk, (warps, k, 8)), C, k)
    cols = mma(A, np.broadcast_to(n, (warps, k, 8)), C, k)
    for w in range(warps):
        assert (rows[w] == ((np.arange(16) + 16 * w) % k)[:, None]).all()
        assert (cols[w] == np.arange(8)[None, :]).all()


@pytest.mark.parametrize("k", [32, 16])
@pytest.mark.parametrize("ta, tb", [("s8", "s8"), ("u8", "s8"), ("s8", "u8"), ("u8", "u8")])
def test_mma_matches_numpy_with_extremes_and_accumulate(k, ta, tb):
    rng = np.random.default_rng(k)
    warps = 8
    lo = {"s8": (-128, 128), "u8": (0, 256)}
    A = rng.integers(*lo[ta], (warps, 16, k))
    B = rng.integers(*lo[tb], (warps, k, 8))
    A[0], B[0] = lo[ta][0], lo[tb][0]                  # -128 * -128 everywhere
    A[1], B[1] = lo[ta][1] - 1, lo[tb][0]
    C = rng.integers(-2**31, 2**31, (warps, 16, 8))
    C[2] = 2**31 - 1                                   # + a positive sum wraps
    got = mma(A, B, C, k, ta, tb)
    want = (A.astype(np.int64) @ B.astype(np.int64) + C).astype(np.int32)   # wraps
    assert (got == want).all()
    assert (got[2] < 0).any()                          # the wrap really happened


def test_mma_satfinite_clamps_to_int32():
    warps = 2
    A = np.full((warps, 16, 32), 127)
    B = np.full((warps, 32, 8), 127)
    B[1] = -128
    C = np.zeros((warps, 16, 8), np.int64)
    C[0], C[1] = 2**31 - 10, -2**31 + 10
    got = mma(A, B, C, 32, sat=True)
    assert (got[0] == 2**31 - 1).all() and (got[1] == -2**31).all()
    wrapped = mma(A, B, C, 32)
    assert (wrapped[0] < 0).all() and (wrapped[1] > 0).all()


def test_mma_in_a_partial_warp_is_divergence():
    body = """
  setp.lt.u32 %p1, %r1, 16;
  mov.u32 %r20, 0;
  @%p1 mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%r30, %r31, %r32, %r33}, {%r20, %r20}, {%r20}, {%r20, %r20, %r20, %r20};"""
    text = module(PROLOGUE + body)
    z = np.zeros(64, np.uint32)
    try:
        Module(code=text).get_function("k")((1,), (64,), [z, z, z, z])
        raise AssertionError("expected a divergence error")
    except EmulatorError as e:
        assert e.kind == "divergence" and e.line == text.splitlines().index(
            next(ln for ln in text.splitlines() if "mma.sync" in ln)) + 1
        assert e.tid == (0, 0, 0) and "16 of 32 lanes" in str(e)
