"""Every source operand is read before any destination is written (PTX ISA, each
instruction's semantics: sources are values, destinations are assigned afterwards).

Each multi-destination form the emulator supports gets a destination aliased to each
of its sources in turn; the answer comes from a model fed the values the registers
held before the instruction. ``mov.b64 {lo, hi}, wide`` has no aliasable pair (its
destinations are narrower than its source), so it is not listed.
"""
from __future__ import annotations

import numpy as np
import pytest
from emucases import mma_model, module

from hslm_ptx.emu import Module


LANES = np.arange(32)

# one warp; %r4 = lane; %rd1 = &out[lane * 4]; %rd2 = &a[lane * 16] (the lane's inputs)
HEAD = """
  mov.u32 %r4, %tid.x;
  ld.param.u64 %rd1, [out];
  mul.wide.u32 %rd9, %r4, 16;
  add.s64 %rd1, %rd1, %rd9;
  ld.param.u64 %rd2, [a];
  mul.wide.u32 %rd9, %r4, 64;
  add.s64 %rd2, %rd2, %rd9;
"""


def run_warp(body: str, inputs: np.ndarray | None = None, words: int = 4, shared: str = "") -> np.ndarray:
    """Run HEAD + body on one warp; body stores its results at [%rd1] (u32 words)."""
    out = np.zeros((32, 4), np.uint32)
    a = np.zeros((32, 16), np.uint32) if inputs is None else np.ascontiguousarray(inputs, np.uint32)
    z = np.zeros(4, np.uint32)
    Module(code=module(HEAD + body, shared=shared)).get_function("k")((1,), (32,), [out, a, z, z])
    return out[:, :words]


def store_preds(*preds: str) -> str:
    lines = []
    for i, p in enumerate(preds):
        lines += [f"  selp.u32 %r{40 + i}, 1, 0, {p};", f"  st.global.u32 [%rd1+{4 * i}], %r{40 + i};"]
    return "\n".join(lines)


# ---- the two cases from the ISA text -------------------------------------------------

def test_setp_second_destination_reads_the_old_c():
    """t = 0 > 5 = false; p = t and c = false; q = !t and c = c (the old %p1 = true)."""
    got = run_warp("""
  setp.eq.u32 %p1, 0, 0;
  setp.gt.and.s32 %p1|%p2, 0, 5, %p1;
""" + store_preds("%p1", "%p2"), words=2)
    assert (got == [0, 1]).all()


def test_mma_c_registers_rotated_against_d():
    """D = {r1..r4}, C = {r2, r3, r4, r1}, A = B = 0: D gets the old C values."""
    got = run_warp("""
  mov.b32 %r1, 100;
  mov.b32 %r2, 200;
  mov.b32 %r3, 300;
  mov.b32 %r4, 400;
  mov.b32 %r5, 0;
  mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%r1, %r2, %r3, %r4}, {%r5, %r5, %r5, %r5}, {%r5, %r5}, {%r2, %r3, %r4, %r1};
  st.global.v4.b32 [%rd1], {%r1, %r2, %r3, %r4};""")
    assert (got == [200, 300, 400, 100]).all()


# ---- setp p|q: each destination aliased to c ----------------------------------------

BOOL = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}


@pytest.mark.parametrize("bop", sorted(BOOL))
@pytest.mark.parametrize("dests", ["%p3|%p2", "%p2|%p3"])
def test_setp_destination_aliases_c(bop, dests):
    """c = %p3 = lane odd; t = lane > 16 (signed); p = t bop c; q = !t bop c."""
    got = run_warp(f"""
  and.b32 %r5, %r4, 1;
  setp.eq.u32 %p3, %r5, 1;
  setp.gt.{bop}.s32 {dests}, %r4, 16, %p3;
""" + store_preds(*dests.split("|")), words=2)
    t, c = LANES > 16, LANES % 2 == 1
    assert got[:, 0].tolist() == BOOL[bop](t, c).astype(int).tolist()
    assert got[:, 1].tolist() == BOOL[bop](~t, c).astype(int).tolist()


# ---- mma: one D register aliased to each A, B and C register ------------------------


def mma_alias_cases():
    for k in (32, 16):
        na, nb = k // 8, k // 16
        for operand, n in (("A", na), ("B", nb), ("C", 4)):
            for j in range(n):
                for d in range(4):
                    yield k, operand, j, d


@pytest.mark.parametrize("k, operand, j, d", list(mma_alias_cases()))
def test_mma_d_register_aliases_a_source(k, operand, j, d):
    na, nb = k // 8, k // 16
    names = {"A": [f"%r{10 + i}" for i in range(na)], "B": [f"%r{14 + i}" for i in range(nb)],
             "C": [f"%r{16 + i}" for i in range(4)], "D": [f"%r{20 + i}" for i in range(4)]}
    names["D"][d] = names[operand][j]
    order = names["A"] + names["B"] + names["C"]
    loads = "\n".join(f"  ld.global.u32 {r}, [%rd2+{4 * i}];" for i, r in enumerate(order))
    rng = np.random.default_rng(100 * k + 10 * j + d)
    inputs = rng.integers(0, 1 << 32, (32, 16), dtype=np.uint64).astype(np.uint32)
    got = run_warp(f"""{loads}
  mma.sync.aligned.m16n8k{k}.row.col.s32.s8.s8.s32 {{{", ".join(names["D"])}}}, {{{", ".join(names["A"])}}}, {{{", ".join(names["B"])}}}, {{{", ".join(names["C"])}}};
  st.global.v4.b32 [%rd1], {{{", ".join(names["D"])}}};""", inputs)
    assert (got == mma_model(inputs[:, :len(order)], k)).all()


# ---- vector loads: a destination aliased to the address register --------------------

@pytest.mark.parametrize("d", range(4))
def test_ld_shared_v4_destination_aliases_the_address(d):
    """Lane l reads the 16 bytes lane l ^ 1 stored; the address is read before the writes."""
    dests = [f"%r{20 + i}" for i in range(4)]
    dests[d] = "%r30"
    got = run_warp(f"""
  mov.u32 %r29, sh;
  shl.b32 %r5, %r4, 4;
  add.u32 %r6, %r29, %r5;
  add.u32 %r7, %r4, 1000;
  st.shared.v4.b32 [%r6], {{%r4, %r7, %r4, %r7}};
  bar.sync 0;
  xor.b32 %r8, %r4, 1;
  shl.b32 %r8, %r8, 4;
  add.u32 %r30, %r29, %r8;
  ld.shared.v4.b32 {{{", ".join(dests)}}}, [%r30];
  st.global.v4.b32 [%rd1], {{{", ".join(dests)}}};""", shared="  .shared .align 16 .b8 sh[512];\n")
    nb = LANES ^ 1
    assert (got == np.stack([nb, nb + 1000, nb, nb + 1000], 1)).all()


@pytest.mark.parametrize("d", range(2))
def test_ld_global_v2_b64_destination_aliases_the_address(d):
    """Each lane's first 16 input bytes hold two u64 words; the address register is
    one of the two destinations."""
    dests = ["%rd20", "%rd21"]
    dests[d] = "%rd2"
    inputs = (np.arange(32 * 16, dtype=np.uint32) * 0x01010101).reshape(32, 16)
    got = run_warp(f"""
  ld.global.v2.b64 {{{", ".join(dests)}}}, [%rd2];
  st.global.v2.b64 [%rd1], {{{", ".join(dests)}}};""", inputs)
    assert (got == inputs[:, :4]).all()
