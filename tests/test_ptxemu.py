"""The CPU PTX emulator against hand-written PTX whose answer is known.

Each instruction group is checked against a plain-Python model of the PTX ISA text
(the PTX ISA's instruction sections), over many threads at once: every thread gets its own
operands from global memory, so one launch checks hundreds of cases.
"""
from __future__ import annotations

import operator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emucases import M32, PROLOGUE, module, prmt_model, s32

from hslm_ptx.emu import Module


EDGES = [0, 1, 2, 31, 32, 33, 0x7F, 0x80, 0xFF, 0x7FFFFFFF, 0x80000000, 0x80000001, M32]


def run(body: str, a, b=None, c=None, block: int = 64, **kw) -> np.ndarray:
    """Run PROLOGUE + body over len(a) threads; body leaves its u32 result in %r10."""
    a = np.asarray(a, np.uint64).astype(np.uint32)
    n = a.size
    b = np.zeros(n, np.uint32) if b is None else np.asarray(b, np.uint64).astype(np.uint32)
    c = np.zeros(n, np.uint32) if c is None else np.asarray(c, np.uint64).astype(np.uint32)
    assert n % block == 0
    out = np.zeros(n, np.uint32)
    fn = Module(code=module(PROLOGUE + body + "\n  st.global.u32 [%rd3], %r10;", **kw))
    fn.get_function("k")((n // block,), (block,), [out, a, b, c])
    return out


def pairs(values=EDGES, extra: int = 0, seed: int = 0):
    """All pairs of edge values plus random pairs; padded to a multiple of 64 threads."""
    rng = np.random.default_rng(seed)
    a, b = (np.array(x, np.uint64) for x in zip(*[(x, y) for x in values for y in values]))
    n = -(-(a.size + extra) // 64) * 64
    ra, rb = rng.integers(0, 1 << 32, (2, n - a.size), dtype=np.uint64)
    return np.concatenate([a, ra]), np.concatenate([b, rb])


# ---- arithmetic ------------------------------------------------------------------------

@pytest.mark.parametrize("ins, model", [
    ("add.s32 %r10, %r5, %r6;", lambda x, y: x + y),
    ("sub.u32 %r10, %r5, %r6;", lambda x, y: x - y),
    ("mul.lo.s32 %r10, %r5, %r6;", lambda x, y: s32(x) * s32(y)),
    ("mul.hi.u32 %r10, %r5, %r6;", lambda x, y: (x * y) >> 32),
    ("mul.hi.s32 %r10, %r5, %r6;", lambda x, y: (s32(x) * s32(y)) >> 32),
    ("mad.lo.s32 %r10, %r5, %r6, %r5;", lambda x, y: x * y + x),
    ("min.s32 %r10, %r5, %r6;", lambda x, y: min(s32(x), s32(y))),
    ("min.u32 %r10, %r5, %r6;", min),
    ("max.s32 %r10, %r5, %r6;", lambda x, y: max(s32(x), s32(y))),
    ("max.u32 %r10, %r5, %r6;", max),
    ("add.sat.s32 %r10, %r5, %r6;", lambda x, y: max(-2**31, min(2**31 - 1, s32(x) + s32(y)))),
    ("add.s32 %r10, %r5, -7;", lambda x, y: x - 7),
    ("xor.b32 %r10, %r5, 0xF0F0;", lambda x, y: x ^ 0xF0F0),
    ("not.b32 %r10, %r5;", lambda x, y: ~x),
    ("neg.s32 %r10, %r5;", lambda x, y: -x),
    ("abs.s32 %r10, %r5;", lambda x, y: abs(s32(x))),
])
def test_integer_arithmetic_wraps_like_hardware(ins, model):
    a, b = pairs(extra=200)
    got = run(ins, a, b)
    want = [model(int(x), int(y)) & M32 for x, y in zip(a, b)]
    assert got.tolist() == want


def test_wide_multiply_and_64_bit_split():
    a, b = pairs()
    body = """
  mul.wide.s32 %rd10, %r5, %r6;
  mul.wide.u32 %rd11, %r5, %r6;
  mov.b64 {%r11, %r12}, %rd10;
  mov.b64 {%r13, %r14}, %rd11;
  xor.b32 %r10, %r12, %r14;
  add.s32 %r10, %r10, %r11;"""
    got = run(body, a, b)
    want = []
    for x, y in zip(a.tolist(), b.tolist()):
        sw, uw = (s32(x) * s32(y)) & (2**64 - 1), x * y
        want.append((((sw >> 32) ^ (uw >> 32)) + (sw & M32)) & M32)
    assert got.tolist() == want


def test_div_rem_truncate_toward_zero():
    a, b = pairs([1, 7, 0x80000000, M32, 0xFFFFFFF9, 100])
    got_q = run("div.s32 %r10, %r5, %r6;", a, b)
    got_r = run("rem.s32 %r10, %r5, %r6;", a, b)
    got_u = run("div.u32 %r10, %r5, %r6;", a, b)
    for x, y, q, r, u in zip(a.tolist(), b.tolist(), got_q, got_r, got_u):
        sx, sy = s32(x), s32(y)
        tq = abs(sx) // abs(sy) * (1 if (sx < 0) == (sy < 0) else -1)
        assert int(q) == tq & M32 and int(r) == (sx - tq * sy) & M32 and int(u) == x // y


@pytest.mark.parametrize("ins, model", [
    ("shl.b32 %r10, %r5, %r6;", lambda x, n: (x << n) & M32 if n < 32 else 0),
    ("shr.u32 %r10, %r5, %r6;", lambda x, n: x >> n if n < 32 else 0),
    ("shr.b32 %r10, %r5, %r6;", lambda x, n: x >> n if n < 32 else 0),
    ("shr.s32 %r10, %r5, %r6;", lambda x, n: (s32(x) >> min(n, 31)) & M32),
])
def test_shifts_clamp_past_the_width(ins, model):
    amounts = list(range(0, 40)) + [63, 64, 255, 256, 0x80000000, M32]
    a = np.array([x for x in (0x80000001, 0x12345678, M32, 1) for _ in amounts] + [0] * 8)
    n = np.array([s for _ in range(4) for s in amounts] + [0] * 8)
    got = run(ins, a, n)
    assert got.tolist() == [model(int(x), int(s)) for x, s in zip(a, n)]


def test_shift_by_literal_past_width():
    a = np.full(64, 0x80000000)
    assert (run("shr.s32 %r10, %r5, 40;", a) == M32).all()
    assert (run("shl.b32 %r10, %r5, 32;", a) == 0).all()


CMP = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
       "gt": operator.gt, "ge": operator.ge,
       "lo": operator.lt, "ls": operator.le, "hi": operator.gt, "hs": operator.ge}


@pytest.mark.parametrize("cmp, ty", [(c, t) for t in ("s32", "u32") for c in CMP
                                     if t == "u32" or c not in ("lo", "ls", "hi", "hs")])
def test_setp_signed_versus_unsigned(cmp, ty):
    a, b = pairs()
    got = run(f"setp.{cmp}.{ty} %p1, %r5, %r6;\n  selp.u32 %r10, 1, 0, %p1;", a, b)
    conv = s32 if ty == "s32" else int
    assert got.tolist() == [int(CMP[cmp](conv(x), conv(y))) for x, y in zip(a, b)]


def test_setp_combining_and_two_destinations():
    a, b = pairs()
    body = """
  setp.lt.u32 %p1, %r6, 1000;
  setp.ge.and.s32 %p2|%p3, %r5, %r6, %p1;
  selp.u32 %r10, 1, 0, %p2;
  selp.u32 %r11, 2, 0, %p3;
  or.b32 %r10, %r10, %r11;"""
    got = run(body, a, b)
    want = [(int(s32(x) >= s32(y) and y < 1000) | 2 * int(s32(x) < s32(y) and y < 1000))
            for x, y in zip(a.tolist(), b.tolist())]
    assert got.tolist() == want


# ---- bit manipulation -------------------------------------------------------------------


@pytest.mark.parametrize("a, b, c, want", [
    (0x03020100, 0x07060504, 0x7531, 0x07050301),       # the PTX ISA's prmt example
    (0x00FF0100, 0, 0x3210, 0x00FF0100),
    (0x00FF0100, 0, 0x0123, 0x0001FF00),
    (0x00FF0100, 0, 0x2222, 0xFFFFFFFF),
    (0x807F0180, 0, 0x8888, 0xFFFFFFFF),                 # sign of byte 0 (0x80) replicated
    (0x807F0180, 0, 0xBA98, 0xFF0000FF),                 # signs of bytes 0..3: FF,00,00,FF
    (0x03020100, 0x87060504, 0xFFFF7654, 0x87060504),    # c[31:16] ignored
    (0x03020100, 0x87060504, 0xFFFFF654, 0xFF060504),    # sign of byte 7
])
def test_prmt_selector_forms(a, b, c, want):
    assert prmt_model(a, b, c) == want
    got_reg = run("prmt.b32 %r10, %r5, %r6, %r7;", [a] * 64, [b] * 64, [c] * 64)
    got_lit = run(f"prmt.b32 %r10, %r5, %r6, {c:#x};", [a] * 64, [b] * 64)
    assert (got_reg == want).all() and (got_lit == want).all()


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(*[st.integers(0, M32)] * 3), min_size=64, max_size=64))
def test_prmt_matches_model_on_random_operands(triples):
    a, b, c = (np.array(x, np.uint64) for x in zip(*triples))
    got = run("prmt.b32 %r10, %r5, %r6, %r7;", a, b, c)
    assert got.tolist() == [prmt_model(*map(int, t)) for t in triples]


def bfe_model(a: int, pos: int, ln: int, signed: bool) -> int:
    pos, ln = pos & 0xFF, ln & 0xFF
    sbit = (a >> min(pos + ln - 1, 31)) & 1 if signed and ln else 0
    return sum(((a >> (pos + i)) & 1 if i < ln and pos + i <= 31 else sbit) << i
               for i in range(32))


def bfi_model(a: int, b: int, pos: int, ln: int) -> int:
    pos, ln = pos & 0xFF, ln & 0xFF
    for i in range(ln):
        if pos + i <= 31:
            b = (b & ~(1 << (pos + i))) | (((a >> i) & 1) << (pos + i))
    return b & M32


def test_bfe_bfi_examples_from_ptx_facts():
    assert run("bfe.u32 %r10, %r5, 4, 8;", [0xF0F0F0F0] * 64)[0] == 0x0F
    assert run("bfe.s32 %r10, %r5, 8, 4;", [0x00000F00] * 64)[0] == 0xFFFFFFFF
    assert run("bfi.b32 %r10, %r5, %r6, 8, 4;", [0xF] * 64, [0x12345678] * 64)[0] == 0x12345F78


@pytest.mark.parametrize("ins, want", [("bfe.u32 %r10, %r5, 0, 0;", 0),
                                       ("bfe.s32 %r10, %r5, 0, 0;", 0),
                                       ("bfe.s32 %r10, %r5, 40, 0;", 0),
                                       ("bfe.s32 %r10, %r5, 28, 8;", M32)])
def test_bfe_literal_position_and_length_edges(ins, want):
    """len 0 gives 0 (no sign bit to extend); a field running past bit 31 takes the
    sign from bit 31 (PTX ISA, bfe); no numpy warning on the scalar path."""
    assert (run(ins, [M32] * 64) == want).all()


def test_bfe_bfi_match_model():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 1 << 32, 512, dtype=np.uint64)
    pos = np.concatenate([np.arange(256), rng.integers(0, 1 << 32, 256, dtype=np.uint64)])
    ln = np.concatenate([rng.integers(0, 40, 256), rng.integers(0, 1 << 32, 256, dtype=np.uint64)])
    for signed in (False, True):
        got = run(f"bfe.{'s' if signed else 'u'}32 %r10, %r5, %r6, %r7;", a, pos, ln)
        assert got.tolist() == [bfe_model(int(x), int(p), int(n), signed)
                                for x, p, n in zip(a, pos, ln)]
    body = "bfi.b32 %r10, %r5, %r6, %r7, %r8;"
    got = run("xor.b32 %r8, %r7, %r4;\n  shr.u32 %r8, %r8, 27;\n  " + body, a, a[::-1].copy(), pos)
    gid = np.arange(512)
    want = [bfi_model(int(x), int(y), int(p), ((int(p) ^ int(g)) & M32) >> 27)
            for x, y, p, g in zip(a, a[::-1], pos, gid)]
    assert got.tolist() == want


@pytest.mark.parametrize("lut, f", [(0x80, lambda a, b, c: a & b & c),
                                    (0xFE, lambda a, b, c: a | b | c),
                                    (0x96, lambda a, b, c: a ^ b ^ c),
                                    (0xCA, lambda a, b, c: (a & b) | (~a & c))])
def test_lop3_truth_tables(lut, f):
    a, b = pairs()
    c = np.roll(a, 5)
    got = run(f"lop3.b32 %r10, %r5, %r6, %r7, {lut:#x};", a, b, c)
    assert got.tolist() == [f(int(x), int(y), int(z)) & M32 for x, y, z in zip(a, b, c)]


def test_dp4a_and_cvt():
    a, b = pairs()
    got = run("dp4a.s32.u32 %r10, %r5, %r6, %r5;", a, b)
    for x, y, g in zip(a.tolist(), b.tolist(), got.tolist()):
        xs = [((x >> 8 * i) & 0xFF) - (256 if (x >> 8 * i) & 0x80 else 0) for i in range(4)]
        ys = [(y >> 8 * i) & 0xFF for i in range(4)]
        assert g == (x + sum(p * q for p, q in zip(xs, ys))) & M32
    got = run("cvt.s64.s32 %rd10, %r5;\n  cvt.u16.u32 %rs1, %r5;\n  cvt.s32.s8 %r11, %r5;\n"
              "  cvt.u32.u16 %r12, %rs1;\n  mov.b64 {%r13, %r14}, %rd10;\n"
              "  xor.b32 %r10, %r14, %r11;\n  add.s32 %r10, %r10, %r12;", a)
    for x, g in zip(a.tolist(), got.tolist()):
        hi = M32 if x >> 31 else 0
        s8 = (x & 0xFF) - 256 if x & 0x80 else x & 0xFF
        assert g == ((hi ^ (s8 & M32)) + (x & 0xFFFF)) & M32


# ---- memory --------------------------------------------------------------------------

def test_vector_loads_and_stores_keep_element_order():
    src = np.arange(64 * 4, dtype=np.uint32) * 0x01010101 + 0x03020100
    body = """
  mul.wide.u32 %rd10, %r4, 16;
  add.s64 %rd11, %rd4, %rd10;
  ld.global.v4.b32 {%r20, %r21, %r22, %r23}, [%rd11];
  add.s64 %rd12, %rd1, %rd10;
  st.global.v4.b32 [%rd12], {%r23, %r22, %r21, %r20};
  ld.global.v2.u32 {%r24, %r25}, [%rd11+8];
  ld.global.u8 %r26, [%rd11+1];
  ld.global.s8 %r27, [%rd11+3];
  mov.u32 %r10, 0;"""
    text = module(PROLOGUE + body + """
  mul.wide.u32 %rd13, %r4, 16;
  ld.param.u64 %rd14, [b];
  cvta.to.global.u64 %rd14, %rd14;
  add.s64 %rd15, %rd14, %rd13;
  st.global.v2.b32 [%rd15], {%r24, %r25};
  st.global.u32 [%rd15+8], %r27;
  st.global.u8 [%rd15+12], %r26;""")
    out = np.zeros(64 * 4, np.uint32)
    got = np.zeros(64 * 4, np.uint32)
    Module(code=text).get_function("k")((1,), (64,), [out, src, got, np.zeros(64, np.uint32)])
    v = src.reshape(64, 4)
    assert (out.reshape(64, 4) == v[:, ::-1]).all()
    g = got.reshape(64, 4)
    assert (g[:, :2] == v[:, 2:]).all()
    b3 = (v[:, 0] >> 24).astype(np.uint8).view(np.int8).astype(np.int32).view(np.uint32)
    assert (g[:, 2] == b3).all() and (g[:, 3] == (v[:, 0] >> 8) & 0xFF).all()


def test_shared_window_symbols_and_dynamic_shared():
    """Static symbols get offsets from 0 in declaration order; .extern follows them."""
    shared = ("  .shared .align 4 .b8 s1[12];\n  .shared .align 16 .b8 s2[32];\n"
              "  .extern .shared .align 16 .b8 dyn[];\n")
    body = """
  mov.u32 %r11, s2;
  mov.u32 %r12, dyn;
  shl.b32 %r13, %r1, 2;
  add.s32 %r14, %r12, %r13;
  st.shared.u32 [%r14], %r1;
  bar.sync 0;
  xor.b32 %r15, %r13, 4;
  add.s32 %r15, %r12, %r15;
  ld.shared.u32 %r16, [%r15];
  setp.eq.u32 %p3, %r1, 0;
  @%p3 st.shared.u32 [s1+4], %r16;
  shl.b32 %r10, %r11, 16;
  or.b32 %r10, %r10, %r12;
  add.s32 %r10, %r10, %r16;"""
    text = module(PROLOGUE + body + "\n  st.global.u32 [%rd3], %r10;", shared=shared)
    out = np.zeros(64, np.uint32)
    z = np.zeros(64, np.uint32)
    Module(code=text).get_function("k")((2,), (32,), [out, z, z, z], shared_mem=128)
    tid = np.arange(64) % 32
    assert out.tolist() == ((16 << 16) + 48 + (tid ^ 1)).tolist()


# ---- control flow -------------------------------------------------------------------

def test_predicated_instructions_mask_per_thread():
    a = np.arange(128)
    body = """
  and.b32 %r8, %r5, 1;
  setp.eq.u32 %p1, %r8, 1;
  mov.u32 %r10, 100;
  @%p1 add.u32 %r10, %r10, %r5;
  @!%p1 sub.u32 %r10, %r10, %r5;"""
    got = run(body, a)
    assert got.tolist() == [(100 + x if x & 1 else 100 - x) & M32 for x in a.tolist()]


def test_loop_with_uniform_trip_count():
    body = """
  mov.u32 %r10, 0;
  mov.u32 %r11, 0;
LOOP:
  add.u32 %r10, %r10, %r5;
  add.u32 %r11, %r11, 1;
  setp.lt.u32 %p1, %r11, 10;
  @%p1 bra.uni LOOP;"""
    a = np.arange(64)
    assert run(body, a).tolist() == (10 * a).tolist()


def test_divergent_if_else_and_loops_reconverge():
    """Per-thread branches and trip counts, then a barrier all threads must reach."""
    body = """
  and.b32 %r8, %r5, 3;
  setp.eq.u32 %p1, %r8, 0;
  @%p1 bra ELSE;
  mul.lo.u32 %r10, %r5, 3;
  bra DONE;
ELSE:
  mov.u32 %r10, 7;
  mov.u32 %r11, 0;
INNER:
  add.u32 %r10, %r10, %r11;
  add.u32 %r11, %r11, 1;
  setp.lt.u32 %p2, %r11, %r5;
  @%p2 bra INNER;
DONE:
  bar.sync 0;
  add.u32 %r10, %r10, 1;"""
    a = np.arange(128) % 37
    want = [(3 * x if x & 3 else 7 + sum(range(max(x, 1)))) + 1 for x in a.tolist()]
    assert run(body, a).tolist() == want


def test_early_exit_threads_do_not_block_barriers():
    """`if (tid >= 20) return; __syncthreads();` as nvcc emits it: the threads that
    branch to the exit are still running when the others reach the barrier; the
    barrier opens once they have exited (hardware counts exited threads as arrived)."""
    body = """
  setp.ge.u32 %p1, %r1, 20;
  @%p1 bra END;
  bar.sync 0;
  mov.u32 %r10, 5;
  st.global.u32 [%rd3], %r10;
END:
  exit;"""
    z = np.zeros(64, np.uint32)
    for variant in (body, body.replace("@%p1 bra END;", "@%p1 exit;")):
        out = np.zeros(64, np.uint32)
        Module(code=module(PROLOGUE + variant)).get_function("k")((2,), (32,), [out, z, z, z])
        assert out.tolist() == [5 if t < 20 else 0 for t in np.arange(64) % 32]


def test_special_registers_in_three_dimensions():
    body = """
  mov.u32 %r20, %tid.x;
  mov.u32 %r21, %tid.y;
  mov.u32 %r22, %tid.z;
  mov.u32 %r23, %ctaid.x;
  mov.u32 %r24, %ctaid.y;
  mov.u32 %r25, %ctaid.z;
  mov.u32 %r26, %ntid.y;
  mov.u32 %r27, %nctaid.z;
  mov.u32 %r28, %laneid;
  mov.u32 %r30, %ntid.x;
  mov.u32 %r31, %ntid.z;
  mad.lo.u32 %r32, %r22, %r26, %r21;
  mad.lo.u32 %r32, %r32, %r30, %r20;
  mov.u32 %r33, %nctaid.x;
  mov.u32 %r34, %nctaid.y;
  mad.lo.u32 %r35, %r25, %r34, %r24;
  mad.lo.u32 %r35, %r35, %r33, %r23;
  mul.lo.u32 %r36, %r30, %r26;
  mul.lo.u32 %r36, %r36, %r31;
  mad.lo.u32 %r37, %r35, %r36, %r32;
  mul.wide.u32 %rd10, %r37, 8;
  ld.param.u64 %rd11, [out];
  add.s64 %rd12, %rd11, %rd10;
  prmt.b32 %r40, %r20, %r21, 0x40;
  prmt.b32 %r41, %r22, %r23, 0x40;
  prmt.b32 %r42, %r40, %r41, 0x5410;
  shl.b32 %r43, %r24, 4;
  or.b32 %r43, %r43, %r25;
  shl.b32 %r44, %r28, 8;
  or.b32 %r43, %r43, %r44;
  st.global.v2.u32 [%rd12], {%r42, %r43};"""
    # out[linear thread] = (tid.x | tid.y<<8 | tid.z<<16 | ctaid.x<<24, ctaid.y<<4|ctaid.z|lane<<8)
    text = module(body, params=("out",))
    grid, block = (3, 2, 2), (4, 3, 5)
    n = 12 * 60
    out = np.zeros(2 * n, np.uint32)
    Module(code=text).get_function("k")(grid, block, [out])
    got = out.reshape(n, 2)
    i = 0
    for cz in range(2):
        for cy in range(2):
            for cx in range(3):
                for tz in range(5):
                    for ty in range(3):
                        for tx in range(4):
                            lin = tx + 4 * ty + 12 * tz
                            assert got[i, 0] == tx | ty << 8 | tz << 16 | cx << 24
                            assert got[i, 1] == (cy << 4 | cz | (lin % 32) << 8)
                            i += 1
