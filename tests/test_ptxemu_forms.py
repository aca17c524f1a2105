"""One unit test per instruction form the kernels emit, each against the PTX ISA's rule.

A form is the opcode with all its modifiers plus the kind of each operand (reg, pred,
imm, sreg, sym, addr, vecN, label) and whether a guard predicate precedes it, e.g.
``@ld.global.u8 reg, addr``. ``CASES`` below is the list of unit tests; the forms it
covers are read from the cases' own PTX (the lines under test), so the list cannot
drift from the tests. ``test_every_kernel_form_has_a_unit_test`` emits every kernel
and fails naming any form no case covers.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import pytest
from emucases import M32, PROLOGUE, mma_model, prmt_model, s32
from floatcases import BODIES as FLOAT_BODIES
from floatcases import body_source

from hslm_ptx.emu import Module
from hslm_ptx.emu.parse import Entry, Instr, parse
from hslm_ptx.catalog.registry import KERNELS


THREADS, BLOCK = 128, 64       # two CTAs of two warps
SENT = 0xDEADBEEF              # %r10..%r13 before the case runs
UNTOUCHED = 0x0BADF00D         # out before the launch
N_PARAM = 0x12345
_rng = np.random.default_rng(7)
_EDGES = [0, 1, 2, 31, 32, 0x7F, 0x80, 0xFF, 0x7FFFFFFF, 0x80000000, 0x80000001, M32]
A, B, C = ([*_EDGES[k:], *_EDGES[:k], *_rng.integers(0, 1 << 32, THREADS - len(_EDGES)).tolist()]
           for k in (0, 5, 9))
AUX = [0xA0000000 + i for i in range(4 * THREADS)]
M64 = (1 << 64) - 1


def wide(i: int) -> int:
    """%rd14 = {A, B} (A the low word)."""
    return A[i] | B[i] << 32


def split(v: int) -> list[int]:
    return [v & M32, (v >> 32) & M32]


# Per thread i (gid), PROLOGUE's registers: %r1 = tid, %r4 = i, %r5 = A[i], %r6 = B[i],
# %r7 = C[i], %rd2 = 4i, %rd5 = &a[i]; then %p1 = A odd, %p2 = B odd, %p4 = warp odd
# (uniform in a warp); %rd14 = {A, B}; %rd12 = &aux[4i] (16 bytes); %r21 = &sh[16 tid],
# %r22 = &sh[16 (tid ^ 1)]. The case's result is %r10..%r13, stored to out[i, 0..3].
HEAD = PROLOGUE + """
  mul.wide.u32 %rd15, %r4, 16;
  ld.param.u64 %rd1, [aux];
  add.s64 %rd12, %rd1, %rd15;
  and.b32 %r8, %r5, 1;
  setp.eq.u32 %p1, %r8, 1;
  and.b32 %r8, %r6, 1;
  setp.eq.u32 %p2, %r8, 1;
  shr.u32 %r8, %r4, 5;
  and.b32 %r8, %r8, 1;
  setp.eq.u32 %p4, %r8, 1;
  mov.b64 %rd14, {%r5, %r6};
  mov.u32 %r20, sh;
  shl.b32 %r8, %r1, 4;
  add.u32 %r21, %r20, %r8;
  xor.b32 %r8, %r1, 1;
  shl.b32 %r8, %r8, 4;
  add.u32 %r22, %r20, %r8;
  mov.b32 %r10, 0xDEADBEEF;
  mov.b32 %r11, 0xDEADBEEF;
  mov.b32 %r12, 0xDEADBEEF;
  mov.b32 %r13, 0xDEADBEEF;
"""
TAIL = """
  ld.param.u64 %rd1, [out];
  add.s64 %rd1, %rd1, %rd15;
  st.global.v4.b32 [%rd1], {%r10, %r11, %r12, %r13};
"""


def source(pre: str, ins: str, post: str) -> tuple[str, range]:
    """The case's module and the line numbers of the instructions under test."""
    top = (".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k(\n"
           "  .param .u64 out, .param .u64 a, .param .u64 b, .param .u64 c, .param .u64 aux,\n"
           "  .param .u32 n\n)\n{\n  .reg .pred %p<8>;\n  .reg .b32 %r<64>;\n  .reg .b64 %rd<32>;\n"
           "  .shared .align 16 .b8 pad[48];\n  .shared .align 16 .b8 sh[1024];\n" + HEAD + pre + "\n")
    first = top.count("\n") + 1
    text = top + ins + "\n" + post + "\n" + TAIL + "  ret;\n}\n"
    return text, range(first, first + ins.count("\n") + 1)


class Case(NamedTuple):
    ins: str                                   # the instruction(s) under test
    model: Callable[[int], list[int] | None]   # thread i -> out[i, :n] (None: no store)
    pre: str = ""
    post: str = ""


def _lop3(lut: int, a: int, b: int, c: int) -> int:
    """Bit k of d = bit (4 a_k + 2 b_k + c_k) of the LUT (PTX ISA, lop3)."""
    return sum((lut >> (4 * (a >> k & 1) + 2 * (b >> k & 1) + (c >> k & 1)) & 1) << k for k in range(32))


def _mma(i: int) -> list[int]:
    """m16n8k32 with A = {A, B, C, gid}, B = {B, C}, C = {C, A, B, gid} per lane."""
    w = i // 32 * 32
    regs = np.array([[A[j], B[j], C[j], j, B[j], C[j], C[j], A[j], B[j], j] for j in range(w, w + 32)],
                    np.uint32)
    return mma_model(regs, 32)[i - w].tolist()


def pred(expr: Callable[[int], bool]) -> Callable[[int], list[int]]:
    return lambda i: [int(expr(i))]


SELP3 = "  selp.u32 %r10, 1, 0, %p3;"
SPLIT10 = "  mov.b64 {%r10, %r11}, %rd10;"
SHARE = "  st.shared.v4.b32 [%r21], {%r5, %r6, %r7, %r4};\n  bar.sync 0;"
SKIP = "  mov.b32 %r10, 1;\nL1:\n  mov.b32 %r11, 2;"
COPY_OWN = "  cp.async.cg.shared.global [%r21], [%rd12], 16;"
READ_OWN = "  ld.shared.v4.b32 {%r10, %r11, %r12, %r13}, [%r21];"
WAIT_OWN = "  cp.async.wait_all;\n" + READ_OWN


def _aux(i: int, have: int = 16) -> list[int]:
    """Thread i's 16 aux bytes as 4 words, bytes from ``have`` on zero."""
    raw = np.array(AUX[4 * i:4 * i + 4], np.uint32).view(np.uint8).copy()
    raw[have:] = 0
    return raw.view(np.uint32).tolist()


def _ldmatrix(i: int, trans: bool) -> list[int]:
    """SHARE rows: thread j's 16 bytes are {A, B, C, j}; lane l of a warp gives its own row."""
    warp, lane = i // 32 * 32, i % 32
    out = []
    for q in range(4):
        rows = np.array([[A[j], B[j], C[j], j] for j in range(warp + 8 * q, warp + 8 * q + 8)],
                        np.uint32).view(np.uint16).reshape(8, 8)
        rows = rows.T if trans else rows
        lo, hi = rows[lane >> 2, 2 * (lane & 3)], rows[lane >> 2, 2 * (lane & 3) + 1]
        out.append(int(lo) | int(hi) << 16)
    return out

CASES: list[Case] = [
    # memory (PTX ISA ld, st: guarded-off threads neither load nor store)
    Case("  @%p1 st.global.s32 [%rd12], %r6;", lambda i: [B[i] if A[i] & 1 else AUX[4 * i]],
         post="  ld.global.u32 %r10, [%rd12];"),
    Case("  @%p1 st.global.v4.b32 [%rd12], {%r5, %r6, %r7, %r4};",
         lambda i: [A[i], B[i], C[i], i] if A[i] & 1 else AUX[4 * i:4 * i + 4],
         post="  ld.global.v4.b32 {%r10, %r11, %r12, %r13}, [%rd12];"),
    Case("  @%p1 ld.global.u32 %r10, [%rd5];", lambda i: [A[i] if A[i] & 1 else SENT]),
    Case("  @%p1 ld.global.u8 %r10, [%rd5+1];", lambda i: [A[i] >> 8 & 0xFF if A[i] & 1 else SENT]),
    Case("  ld.global.u8 %r10, [%rd5+3];", lambda i: [A[i] >> 24]),
    Case("  ld.global.b32 %r10, [%rd5];", lambda i: [A[i]]),
    Case("  ld.param.u32 %r10, [n];", lambda i: [N_PARAM]),
    Case("  ld.param.u64 %rd10, [a];", lambda i: [A[i]],
         post="  add.s64 %rd10, %rd10, %rd2;\n  ld.global.u32 %r10, [%rd10];"),
    Case("  cvta.to.global.u64 %rd10, %rd5;", lambda i: [A[i]], post="  ld.global.u32 %r10, [%rd10];"),
    Case("  ld.shared.b32 %r10, [%r22+4];", lambda i: [B[i ^ 1]], pre=SHARE),
    Case("  ld.shared.v4.b32 {%r10, %r11, %r12, %r13}, [%r22];",
         lambda i: [A[i ^ 1], B[i ^ 1], C[i ^ 1], i ^ 1], pre=SHARE),
    Case("  ld.shared.v4.u32 {%r10, %r11, %r12, %r13}, [%r22];",
         lambda i: [A[i ^ 1], B[i ^ 1], C[i ^ 1], i ^ 1], pre=SHARE),
    Case("  ld.shared.v2.u32 {%r10, %r11}, [%r22];", lambda i: [A[i ^ 1], B[i ^ 1]], pre=SHARE),
    Case("  st.shared.v4.b32 [%r21], {%r5, %r6, %r7, %r4};", lambda i: [A[i ^ 1], B[i ^ 1], C[i ^ 1], i ^ 1],
         post="  bar.sync 0;\n  ld.shared.v4.b32 {%r10, %r11, %r12, %r13}, [%r22];"),
    Case("  @%p1 st.shared.v4.b32 [%r21], {%r5, %r6, %r7, %r4};",  # a guarded-off thread's slot keeps its words
         lambda i: [A[i ^ 1], B[i ^ 1], C[i ^ 1], i ^ 1] if A[i ^ 1] & 1 else [i ^ 1] * 4,
         pre="  st.shared.v4.b32 [%r21], {%r4, %r4, %r4, %r4};\n  bar.sync 0;",
         post="  bar.sync 0;\n  ld.shared.v4.b32 {%r10, %r11, %r12, %r13}, [%r22];"),
    Case("  st.shared.v2.b32 [%r21+8], {%r5, %r6};", lambda i: [A[i ^ 1], B[i ^ 1]] * 2,  # the upper half over C, i
         pre="  st.shared.v4.b32 [%r21], {%r5, %r6, %r7, %r4};",
         post="  bar.sync 0;\n  ld.shared.v4.b32 {%r10, %r11, %r12, %r13}, [%r22];"),
    Case("  bar.sync 0;", lambda i: [C[i ^ 1]], pre="  st.shared.v4.b32 [%r21], {%r5, %r6, %r7, %r4};",
         post="  ld.shared.b32 %r10, [%r22+8];"),
    # moves and conversions (PTX ISA mov, cvt: truncate / zero-extend unsigned)
    Case("  mov.u32 %r10, sh;", lambda i: [48]),
    Case("  mov.u32 %r10, %tid.x;", lambda i: [i % BLOCK]),
    Case("  mov.b32 %r10, 0xff0100;", lambda i: [0xFF0100]),
    Case("  cvt.u32.u64 %r10, %rd14;", lambda i: [A[i]]),
    Case("  cvt.u64.u32 %rd10, %r5;", lambda i: [A[i], 0], post=SPLIT10),
    Case("  selp.b32 %r10, %r5, 0, %p1;", lambda i: [A[i] if A[i] & 1 else 0]),
    # integer arithmetic (PTX ISA: wraps mod 2^n; .wide is the full 64-bit product)
    Case("  add.s32 %r10, %r5, -7;", lambda i: [(A[i] - 7) & M32]),
    Case("  add.u32 %r10, %r5, 9;", lambda i: [(A[i] + 9) & M32]),
    Case("  add.u32 %r10, %r5, %r6;", lambda i: [(A[i] + B[i]) & M32]),
    Case("  add.s64 %rd10, %rd14, -4;", lambda i: split((wide(i) - 4) & M64), post=SPLIT10),
    Case("  add.s64 %rd10, %rd14, %rd14;", lambda i: split(2 * wide(i) & M64), post=SPLIT10),
    Case("  sub.s32 %r10, %r5, 67;", lambda i: [(A[i] - 67) & M32]),
    Case("  sub.s32 %r10, %r5, %r6;", lambda i: [(A[i] - B[i]) & M32]),
    Case("  sub.u32 %r10, %r5, 1;", lambda i: [(A[i] - 1) & M32]),
    Case("  mul.lo.u32 %r10, %r5, 16;", lambda i: [A[i] * 16 & M32]),
    Case("  mad.lo.u32 %r10, %r5, 0x1111, 0x3210;", lambda i: [(A[i] * 0x1111 + 0x3210) & M32]),
    Case("  mad.lo.u32 %r10, %r5, 64, %r7;", lambda i: [(A[i] * 64 + C[i]) & M32]),
    Case("  mad.lo.u32 %r10, %r5, %r6, %r7;", lambda i: [(A[i] * B[i] + C[i]) & M32]),
    Case("  mul.wide.u32 %rd10, 4, 4;", lambda i: [16, 0], post=SPLIT10),
    Case("  mul.wide.u32 %rd10, %r5, 0xFFFFFFFF;", lambda i: split(A[i] * M32), post=SPLIT10),
    Case("  mul.wide.u32 %rd10, %r5, %r6;", lambda i: split(A[i] * B[i]), post=SPLIT10),
    Case("  div.u32 %r10, %r5, %r8;", lambda i: [A[i] // (B[i] | 1)], pre="  or.b32 %r8, %r6, 1;"),
    Case("  min.s32 %r10, %r5, %r6;", lambda i: [min(s32(A[i]), s32(B[i])) & M32]),
    Case("  min.u32 %r10, %r5, %r6;", lambda i: [min(A[i], B[i])]),
    # logic and bits
    Case("  and.b32 %r10, %r5, 0xff00ff;", lambda i: [A[i] & 0xFF00FF]),
    Case("  and.b64 %rd10, %rd14, -4;", lambda i: split(wide(i) & (M64 - 3)), post=SPLIT10),
    Case("  and.pred %p3, %p1, %p2;", pred(lambda i: A[i] & B[i] & 1), post=SELP3),
    Case("  shl.b32 %r10, %r5, 4;", lambda i: [A[i] << 4 & M32]),
    Case("  shr.u32 %r10, %r5, 27;", lambda i: [A[i] >> 27]),
    Case("  lop3.b32 %r10, %r5, %r6, 0xff00ff, 168;", lambda i: [_lop3(168, A[i], B[i], 0xFF00FF)]),
    Case("  prmt.b32 %r10, %r5, 0, %r7;", lambda i: [prmt_model(A[i], 0, C[i])]),
    Case("  prmt.b32 %r10, %r5, %r6, 0x5410;", lambda i: [prmt_model(A[i], B[i], 0x5410)]),
    Case("  prmt.b32 %r10, %r5, %r6, %r7;", lambda i: [prmt_model(A[i], B[i], C[i])]),
    # compare (PTX ISA setp: .s signed, .u unsigned)
    Case("  setp.gt.s32 %p3, %r5, -2;", pred(lambda i: s32(A[i]) > -2), post=SELP3),
    Case("  setp.lt.s32 %p3, %r5, %r6;", pred(lambda i: s32(A[i]) < s32(B[i])), post=SELP3),
    Case("  setp.lt.u32 %p3, %r5, %r6;", pred(lambda i: A[i] < B[i]), post=SELP3),
    # control (bra.uni: taken by whole warps; ret ends the thread before its store)
    Case("  bra.uni L1;", lambda i: [SENT, 2], post=SKIP),
    Case("  @%p4 bra.uni L1;", lambda i: [SENT if i >> 5 & 1 else 1, 2], post=SKIP),
    Case("  ret;", lambda i: None),
    # more integer and predicate forms the staged kernels use
    Case("  xor.b32 %r10, %r5, %r6;", lambda i: [A[i] ^ B[i]]),
    Case("  xor.b32 %r10, %r5, 32;", lambda i: [A[i] ^ 32]),
    Case("  or.b32 %r10, %r5, %r6;", lambda i: [A[i] | B[i]]),
    Case("  mul.lo.u32 %r10, %r5, %r6;", lambda i: [A[i] * B[i] & M32]),
    Case("  sub.u32 %r10, %r5, %r6;", lambda i: [(A[i] - B[i]) & M32]),
    Case("  max.s32 %r10, %r5, 0;", lambda i: [max(s32(A[i]), 0)]),
    Case("  min.s32 %r10, %r5, 16;", lambda i: [min(s32(A[i]), 16) & M32]),
    Case("  mov.b32 %r10, %r6;", lambda i: [B[i]]),
    Case("  selp.b32 %r10, %r5, %r6, %p2;", lambda i: [A[i] if B[i] & 1 else B[i]]),
    Case("  setp.ge.u32 %p3, %r5, %r6;", pred(lambda i: A[i] >= B[i]), post=SELP3),
    Case("  setp.ge.u32 %p3, %r5, 0x6000;", pred(lambda i: A[i] >= 0x6000), post=SELP3),
    # 64-bit: %rd14 = {A, B} against {B, A}, so the high words decide unless they are equal
    Case("  setp.ge.u64 %p3, %rd14, %rd10;", pred(lambda i: (A[i] | B[i] << 32) >= (B[i] | A[i] << 32)),
         pre="  mov.b64 %rd10, {%r6, %r5};", post=SELP3),
    Case("  setp.eq.u32 %p3, %r5, 0;", pred(lambda i: A[i] == 0), post=SELP3),
    Case("  setp.le.s32 %p3, %r5, 0;", pred(lambda i: s32(A[i]) <= 0), post=SELP3),
    Case("  setp.le.s32 %p3, %r5, %r6;", pred(lambda i: s32(A[i]) <= s32(B[i])), post=SELP3),
    Case("  or.pred %p3, %p1, %p2;", pred(lambda i: (A[i] | B[i]) & 1), post=SELP3),
    Case("  setp.gt.u32 %p3, %r5, 1;", pred(lambda i: A[i] > 1), post=SELP3),
    # red (PTX ISA red.add: atomic, wraps; guarded-off threads add nothing)
    Case("  @%p1 red.global.add.s32 [%rd12], %r6;",
         lambda i: [(AUX[4 * i] + B[i]) & M32 if A[i] & 1 else AUX[4 * i]],
         post="  ld.global.u32 %r10, [%rd12];"),
    Case("  ld.global.u32 %r10, [%rd5];", lambda i: [A[i]]),
    # cp.async (PTX ISA cp.async: src-size bytes copied, the rest of 16 zero-filled; ignore-src
    # set: all zeros; visible to the issuing thread after its wait)
    Case("  cp.async.cg.shared.global [%r21], [%rd12], 16, %p1;", lambda i: [0] * 4 if A[i] & 1 else _aux(i),
         post=WAIT_OWN),
    Case("  cp.async.cg.shared.global [%r21], [%rd12], 16, %r8;", lambda i: _aux(i, A[i] & 15),
         pre="  and.b32 %r8, %r5, 15;", post=WAIT_OWN),
    Case("  @%p2 cp.async.cg.shared.global [%r21], [%rd12], 16, %r8;",
         lambda i: _aux(i, A[i] & 15) if B[i] & 1 else [A[i], B[i], C[i], i],
         pre="  and.b32 %r8, %r5, 15;\n  st.shared.v4.b32 [%r21], {%r5, %r6, %r7, %r4};", post=WAIT_OWN),
    # guarded off, a thread copies nothing: its 16 bytes keep what was there
    Case("  @%p2 cp.async.cg.shared.global [%r21], [%rd12], 16, %p1;",
         lambda i: ([0] * 4 if A[i] & 1 else _aux(i)) if B[i] & 1 else [A[i], B[i], C[i], i],
         pre="  st.shared.v4.b32 [%r21], {%r5, %r6, %r7, %r4};", post=WAIT_OWN),
    # the 4-byte form (.ca: 4, 8 or 16 bytes) writes its word alone: the rest of the 16 stays
    Case("  cp.async.ca.shared.global [%r21], [%rd12], 4, %p1;",
         lambda i: [0 if A[i] & 1 else AUX[4 * i], B[i], C[i], i],
         pre="  st.shared.v4.b32 [%r21], {%r5, %r6, %r7, %r4};", post=WAIT_OWN),
    # guarded off, the 4-byte form leaves its word too
    Case("  @%p2 cp.async.ca.shared.global [%r21], [%rd12], 4, %p1;",
         lambda i: [(0 if A[i] & 1 else AUX[4 * i]) if B[i] & 1 else A[i], B[i], C[i], i],
         pre="  st.shared.v4.b32 [%r21], {%r5, %r6, %r7, %r4};", post=WAIT_OWN),
    Case("  cp.async.commit_group;", _aux, pre=COPY_OWN, post="  cp.async.wait_group 0;\n" + READ_OWN),
    Case("  cp.async.wait_group 0;", _aux, pre=COPY_OWN + "\n  cp.async.commit_group;", post=READ_OWN),
    Case("  cp.async.wait_all;", _aux, pre=COPY_OWN, post=READ_OWN),
    # ldmatrix (PTX ISA: lanes 8q.. address matrix q's rows; register q of lane l holds row
    # l >> 2, b16 pair l & 3; .trans: element l >> 2 of rows 2(l & 3), 2(l & 3) + 1)
    Case("  ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r10, %r11, %r12, %r13}, [%r21];",
         lambda i: _ldmatrix(i, False), pre=SHARE),
    Case("  ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%r10, %r11, %r12, %r13}, [%r21];",
         lambda i: _ldmatrix(i, True), pre=SHARE),
    # tensor core (PTX ISA mma m16n8k32 fragment layout, exact int32 accumulate)
    Case("  mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%r10, %r11, %r12, %r13}, "
         "{%r5, %r6, %r7, %r4}, {%r6, %r7}, {%r7, %r5, %r6, %r4};", _mma),
]


def kind(tok, entry: Entry) -> str:
    """The operand kind a form names."""
    if isinstance(tok, tuple):
        return f"vec{len(tok)}"
    if tok.startswith("["):
        return "addr"
    if tok.startswith("!") or entry.regs.get(tok) == "pred":
        return "pred"
    if tok in entry.regs:
        return "reg"
    if tok.startswith("%"):
        return "sreg"
    if tok in entry.labels:
        return "label"
    if any(tok == s[0] for s in entry.shared):
        return "sym"
    return "imm"


def form(ins: Instr, entry: Entry) -> str:
    return f"{'@' if ins.guard else ''}{ins.op} {', '.join(kind(a, entry) for a in ins.args)}".rstrip()


def forms(text: str, lines: range | None = None) -> dict[str, Instr]:
    """Every form in the module's entries (only on ``lines`` if given), with an example."""
    found: dict[str, Instr] = {}
    for entry in parse(text).values():
        for ins in entry.body:
            if lines is None or ins.line in lines:
                found.setdefault(form(ins, entry), ins)
    return found


COVERED = {f for case in CASES for f in forms(*source(case.pre, case.ins, case.post))}
COVERED |= {f for name in FLOAT_BODIES for f in forms(*body_source(name))}  # test_ptxemu_float


def uncovered(text: str, lines: range | None = None) -> list[str]:
    return [f"line {ins.line}: `{f}` (e.g. `{ins.text}`)" for f, ins in forms(text, lines).items()
            if f not in COVERED]


@pytest.mark.parametrize("case", CASES, ids=[c.ins.strip() for c in CASES])
def test_form(case: Case):
    text, _ = source(case.pre, case.ins, case.post)
    out = np.full((THREADS, 4), UNTOUCHED, np.uint32)
    u32 = [np.array(x, np.uint64).astype(np.uint32) for x in (A, B, C, AUX)]
    Module(code=text).get_function("k")((THREADS // BLOCK,), (BLOCK,), [out, *u32, np.uint32(N_PARAM)])
    for i in range(THREADS):
        want = case.model(i)
        row = [UNTOUCHED] * 4 if want is None else [*want, *[SENT] * (4 - len(want))]
        assert out[i].tolist() == row, f"thread {i}"


def test_each_case_tests_exactly_the_forms_on_its_lines():
    for case in CASES:
        text, lines = source(case.pre, case.ins, case.post)
        assert len(forms(text, lines)) == case.ins.count(";"), case.ins


@pytest.mark.parametrize("name", list(KERNELS))
def test_every_kernel_form_has_a_unit_test(name):
    missing = uncovered(KERNELS[name].emit())
    assert not missing, f"{name}: forms without a unit test in CASES: " + "; ".join(missing)


def test_an_unlisted_form_is_reported():
    """A planted form no case covers (bfi, and add with an immediate first source)."""
    text, lines = source("", "  bfi.b32 %r10, %r5, %r6, 8, 4;\n  add.u32 %r10, 9, %r5;", "")
    missing = uncovered(text, lines)
    assert [m.split("`")[1] for m in missing] == ["bfi.b32 reg, reg, reg, imm, imm", "add.u32 reg, imm, reg"]
