"""Helpers the emulator's tests share: a one-entry PTX module around a body, the usual
prologue (each thread's operands from global memory), the error check every error test
makes, and plain-Python models of the PTX ISA's prmt and mma fragment layouts.

Here rather than in one of the test modules, so the emulator's test modules import
none of each other."""
from __future__ import annotations

import numpy as np
import pytest

from hslm_ptx.emu import EmulatorError, Module

M32 = 0xFFFFFFFF


def module(body: str, params=("out", "a", "b", "c"), shared: str = "") -> str:
    """A one-entry module `k` with the usual registers; u64 params unless `name:u32`."""
    decl = ",\n".join(f"  .param .{(p.split(':') + ['u64'])[1]} {p.split(':')[0]}"
                      for p in params)
    return (".version 8.0\n.target sm_80\n.address_size 64\n"
            f".visible .entry k(\n{decl}\n)\n{{\n"
            "  .reg .pred %p<8>;\n  .reg .b16 %rs<8>;\n  .reg .b32 %r<64>;\n"
            f"  .reg .b64 %rd<32>;\n{shared}{body}\n  ret;\n}}\n")


# thread gid = %r4 (PTX ISA, Special Registers: %tid, %ctaid, %ntid): the first lines of every
# prologue, here and in tests/floatcases.py
THREAD_ID = """
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mad.lo.s32 %r4, %r2, %r3, %r1;
"""


def element_address(param: str, base: str, offset: str, dest: str) -> str:
    """Lines leaving in ``dest`` the global address ``offset`` bytes into the u64 param
    ``param`` (read into ``base`` and converted with cvta.to.global)."""
    return (f"  ld.param.u64 {base}, [{param}];\n  cvta.to.global.u64 {base}, {base};\n"
            f"  add.s64 {dest}, {base}, {offset};\n")


# %rd2 = 4 gid; %rd3 = &out[gid] (u32); %r5, %r6, %r7 = a[gid], b[gid], c[gid]
PROLOGUE = (THREAD_ID + "  mul.wide.u32 %rd2, %r4, 4;\n" + element_address("out", "%rd1", "%rd2", "%rd3")
            + "".join(element_address(param, f"%rd{4 + 2 * i}", "%rd2", f"%rd{5 + 2 * i}")
                      + f"  ld.global.u32 %r{5 + i}, [%rd{5 + 2 * i}];\n" for i, param in enumerate("abc")))


def s32(x) -> int:
    x = int(x) & M32
    return x - (1 << 32) if x >> 31 else x


def line_of(text: str, snippet: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if snippet in ln)


def prmt_model(a: int, b: int, c: int) -> int:
    pool, r = (b << 32) | a, 0
    for k in range(4):
        sel = (c >> (4 * k)) & 15
        x = (pool >> (8 * (sel & 7))) & 0xFF
        if sel & 8:
            x = 0xFF if x & 0x80 else 0
        r |= x << (8 * k)
    return r


Z = np.zeros(128, np.uint32)  # expect's default buffers: out, a, b, c


def expect(text: str, kind: str, snippet: str | int, ctaid=None, tid=None, grid=(2,), block=(64,),
           args=None, shared_mem: int = 0, **modkw) -> EmulatorError:
    """Run (or just load) ``text``; it must fail with ``kind`` at the line of ``snippet``
    (the first line containing it, or a line number)."""
    with pytest.raises(EmulatorError) as info:
        fn = Module(code=text, **modkw).get_function("k")
        fn(grid, block, args if args is not None else [Z.copy(), Z, Z, Z], shared_mem=shared_mem)
    e = info.value
    assert e.kind == kind, str(e)
    assert e.line == (snippet if isinstance(snippet, int) else line_of(text, snippet)), str(e)
    assert (e.ctaid, e.tid) == (ctaid, tid), str(e)
    msg = str(e)
    assert "\n" not in msg and msg.startswith(f"ptxemu: {kind} at line {e.line} `")
    if ctaid is not None:
        assert f"ctaid=({','.join(map(str, ctaid))}) tid=({','.join(map(str, tid))})" in msg
    return e


def a_index(k: int):
    """(lane, reg, byte) -> (row, col) of A (16 x k)."""
    rows, cols = np.zeros((32, k // 8, 4), int), np.zeros((32, k // 8, 4), int)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i in range(k // 2):
            rows[lane, i // 4, i % 4] = g + 8 * ((i >> 2) & 1)
            cols[lane, i // 4, i % 4] = 4 * t + (i & 3) + 16 * (i >> 3)
    return rows, cols


def b_index(k: int):
    """(lane, reg, byte) -> (k row, n col) of B (k x 8)."""
    rows, cols = np.zeros((32, k // 16, 4), int), np.zeros((32, k // 16, 4), int)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i in range(k // 4):
            rows[lane, i // 4, i % 4] = 4 * t + (i & 3) + 16 * (i >> 2)
            cols[lane, i // 4, i % 4] = g
    return rows, cols


def c_index():
    """(lane, reg) -> (row, col) of C/D (16 x 8)."""
    lane, i = np.meshgrid(np.arange(32), np.arange(4), indexing="ij")
    return (lane >> 2) + 8 * (i >> 1), 2 * (lane & 3) + (i & 1)


def mma_model(regs: np.ndarray, k: int) -> np.ndarray:
    """D fragments from the ISA's per-element layout; regs = [lane, A.. B.. C..] words."""
    na, nb = k // 8, k // 16
    abytes = regs[:, :na].copy().view(np.int8).reshape(32, na, 4)
    bbytes = regs[:, na:na + nb].copy().view(np.int8).reshape(32, nb, 4)
    A, B = np.zeros((16, k), np.int64), np.zeros((k, 8), np.int64)
    ar, ac = a_index(k)
    br, bc = b_index(k)
    A[ar, ac] = abytes
    B[br, bc] = bbytes
    C = np.zeros((16, 8), np.int64)
    cr, cc = c_index()
    C[cr, cc] = regs[:, na + nb:na + nb + 4].view(np.int32)
    D = (A @ B + C).astype(np.int32)
    return D[cr, cc].view(np.uint32)
