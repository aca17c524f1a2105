"""Every emulator error kind, each pinned to its PTX line, thread and address."""
from __future__ import annotations

import numpy as np
import pytest
from emucases import PROLOGUE, expect, line_of, module

from hslm_ptx.emu import EmulatorError, Module


Z = np.zeros(128, np.uint32)


# ---- unsupported: refused when the module loads, naming the line --------------------

@pytest.mark.parametrize("ins", [
    "atom.global.cas.b32 %r10, [%rd3], 1, 2;",     # instruction
    "add.cc.u32 %r10, %r5, %r6;",                  # modifier
    "add.f64 %rd10, %rd1, %rd1;",                  # type
    "cvt.sat.u8.u32 %r10, %r5;",                   # modifier on a supported op
    "prmt.b32.f4e %r10, %r5, %r6, %r7;",           # prmt mode
    "ld.global.v8.u32 {%r10, %r11}, [%rd3];",      # vector width
    "ld.global.L1::evict_last.u32 %r10, [%rd3];",  # cache policy not accepted silently
    "add.u32 %r10, %rd1, 1;",                      # register width != type width
    "setp.lt.b32 %p1, %r5, %r6;",                  # ordered compare on .b32
    "setp.lo.s32 %p1, %r5, %r6;",                  # unsigned-only compare on .s32
    "mul.hi.u64 %rd10, %rd1, %rd1;",               # 128-bit product
    "bar.sync 0, 64;",                             # barrier with a thread count
    "bra NOWHERE;",                                # unknown label
])
def test_unsupported_forms_are_refused_at_load(ins):
    text = module(PROLOGUE + "\n  " + ins)
    e = expect(text, "unsupported", ins)
    assert e.ctaid is None and ins.rstrip(";") in str(e)


@pytest.mark.parametrize("decl", [".local .align 4 .b8 stack[16];", ".reg .f128 %q;",
                                  ".shared .align 4 .b8 s[4] = {1, 2, 3, 4};"])
def test_unsupported_declarations_are_refused(decl):
    text = module(PROLOGUE + "\n  " + decl)
    expect(text, "unsupported", decl.split()[0] + " " + decl.split()[1])


def test_unsupported_module_level_function():
    text = ".version 8.0\n.target sm_80\n.address_size 64\n.func f()\n{\n  ret;\n}\n"
    with pytest.raises(EmulatorError) as info:
        Module(code=text)
    assert info.value.kind == "unsupported" and info.value.line == 4


# ---- divergence ------------------------------------------------------------------------

def test_non_uniform_bra_uni():
    body = """
  setp.lt.u32 %p1, %r1, 5;
  @%p1 bra.uni SKIP;
  mov.u32 %r10, 1;
SKIP:
  ret;"""
    text = module(PROLOGUE + body)
    e = expect(text, "divergence", "bra.uni", (0, 0, 0), (5, 0, 0))
    assert "tid=(0,0,0) branches" in str(e)
    Module(code=text.replace("bra.uni", "bra")).get_function("k")((2,), (64,), [Z.copy(), Z, Z, Z])


def test_bra_uni_may_differ_between_warps():
    """.uni promises uniformity per warp: warp 0 branching and warp 1 not is legal."""
    body = """
  setp.lt.u32 %p1, %r1, 32;
  mov.u32 %r10, 7;
  @%p1 bra.uni SKIP;
  mov.u32 %r10, 9;
SKIP:
  st.global.u32 [%rd3], %r10;"""
    out = Z.copy()
    Module(code=module(PROLOGUE + body)).get_function("k")((2,), (64,), [out, Z, Z, Z])
    assert out.tolist() == ([7] * 32 + [9] * 32) * 2


def test_threads_waiting_at_different_barriers():
    body = """
  setp.ge.u32 %p1, %r1, 8;
  @%p1 bra SKIP;
  bar.sync 0;
SKIP:
  bar.sync 0;"""
    text = module(PROLOGUE + body)
    second = line_of(text, "SKIP:") + 1
    e = expect(text, "divergence", second, (0, 0, 0), (8, 0, 0), grid=(1,), block=(32,))
    assert f"line {line_of(text, 'bar.sync 0;')}" in str(e)
    uniform = text.replace("  @%p1 bra SKIP;\n  bar.sync 0;\n", "")
    Module(code=uniform).get_function("k")((1,), (32,), [Z.copy(), Z, Z, Z])


# ---- memory bounds and alignment --------------------------------------------------------

def test_global_read_past_the_end():
    text = module(PROLOGUE)
    a = np.zeros(100, np.uint32)                       # 128 threads read a[gid]
    e = expect(text, "out_of_bounds", "ld.global.u32 %r5", (1, 0, 0), (36, 0, 0),
               args=[Z.copy(), a, Z, Z])
    assert e.address == (2 << 32) + 400 and "buffer 1 'a' has 400 bytes" in str(e)


def test_global_write_through_a_wild_pointer():
    text = module(PROLOGUE + "\n  add.s64 %rd20, %rd3, -8;\n  st.global.u32 [%rd20], %r5;")
    e = expect(text, "out_of_bounds", "st.global.u32 [%rd20]", (0, 0, 0), (0, 0, 0))
    assert e.address == (1 << 32) - 8 and "not inside any buffer" in str(e)


def test_shared_access_past_the_window():
    body = """
  shl.b32 %r11, %r1, 2;
  mov.u32 %r12, sm;
  add.s32 %r13, %r12, %r11;
  st.shared.u32 [%r13], %r1;"""
    text = module(PROLOGUE + body, shared="  .shared .align 4 .b8 sm[64];\n")
    e = expect(text, "out_of_bounds", "st.shared.u32", (0, 0, 0), (16, 0, 0), block=(32,))
    assert e.address == 64


@pytest.mark.parametrize("space", ["global", "shared"])
def test_vector_access_at_offset_4_is_misaligned(space):
    if space == "global":
        body = "\n  ld.global.v4.b32 {%r20, %r21, %r22, %r23}, [%rd4+4];"
        want = (2 << 32) + 4
    else:
        body = ("\n  mov.u32 %r11, sm;\n  st.shared.v4.b32 [%r11+4], {%r1, %r1, %r1, %r1};")
        want = 4
    text = module(PROLOGUE + body, shared="  .shared .align 16 .b8 sm[64];\n")
    e = expect(text, "misaligned", f"{space}.v4.b32", (0, 0, 0), (0, 0, 0))
    assert e.address == want and "16-byte alignment" in str(e)


# ---- uninitialized --------------------------------------------------------------------

def test_read_of_a_register_some_threads_never_wrote():
    body = """
  and.b32 %r8, %r1, 1;
  setp.eq.u32 %p1, %r8, 1;
  @%p1 mov.u32 %r11, 7;
  @%p1 add.u32 %r12, %r11, 1;
  add.u32 %r10, %r11, 1;"""
    text = module(PROLOGUE + body)
    e = expect(text, "uninitialized", "add.u32 %r10, %r11", (0, 0, 0), (0, 0, 0))
    assert "%r11" in str(e)


def test_guard_predicate_never_written():
    text = module(PROLOGUE + "\n  @%p4 mov.u32 %r10, 1;")
    expect(text, "uninitialized", "@%p4", (0, 0, 0), (0, 0, 0))


def test_shared_bytes_never_written():
    body = "\n  mov.u32 %r11, sm;\n  ld.shared.u32 %r12, [%r11+8];"
    text = module(PROLOGUE + body, shared="  .shared .align 16 .b8 sm[64];\n")
    e = expect(text, "uninitialized", "ld.shared.u32", (0, 0, 0), (0, 0, 0))
    assert e.address == 8
    Module(code=text, strict_shared_init=False).get_function("k")((2,), (64,),
                                                                   [Z.copy(), Z, Z, Z])


# ---- shared-memory races --------------------------------------------------------------

EXCHANGE = """
  shl.b32 %r11, %r1, 2;
  mov.u32 %r12, sm;
  add.s32 %r13, %r12, %r11;
  st.shared.u32 [%r13], %r1;
  BARRIER
  xor.b32 %r14, %r13, 4;
  ld.shared.u32 %r10, [%r14];
  st.global.u32 [%rd3], %r10;"""


def test_missing_barrier_between_store_and_neighbour_load_is_a_race():
    text = module(PROLOGUE + EXCHANGE.replace("BARRIER", ""),
                  shared="  .shared .align 4 .b8 sm[256];\n")
    e = expect(text, "race", "ld.shared.u32 %r10", (0, 0, 0), (0, 0, 0))
    assert e.address == 4 and "other thread tid=(1,0,0)" in str(e)


def test_the_same_exchange_with_bar_sync_passes():
    text = module(PROLOGUE + EXCHANGE.replace("BARRIER", "bar.sync 0;"),
                  shared="  .shared .align 4 .b8 sm[256];\n")
    out = Z.copy()
    Module(code=text).get_function("k")((2,), (64,), [out, Z, Z, Z])
    assert out.tolist() == (np.arange(128) % 64 ^ 1).tolist()


# thread 0 writes a word, everyone reads it after a barrier: a clean start for a race
WRITE_BARRIER_READ = """
  mov.u32 %r12, sm;
  setp.eq.u32 %p1, %r1, 0;
  @%p1 st.shared.u32 [%r12], %r1;
  bar.sync 0;
  ld.shared.u32 %r10, [%r12];"""


def test_write_after_another_threads_read_is_a_race():
    body = WRITE_BARRIER_READ + """
  setp.eq.u32 %p2, %r1, 3;
  @%p2 st.shared.u32 [%r12], %r1;"""
    text = module(PROLOGUE + body, shared="  .shared .align 4 .b8 sm[16];\n")
    e = expect(text, "race", "@%p2 st.shared", (0, 0, 0), (3, 0, 0))
    assert "read by another thread" in str(e)


def test_two_threads_writing_one_word_in_one_instruction():
    body = "\n  mov.u32 %r12, sm;\n  st.shared.u32 [%r12+4], %r1;"
    text = module(PROLOGUE + body, shared="  .shared .align 4 .b8 sm[16];\n")
    e = expect(text, "race", "st.shared.u32", (0, 0, 0), (1, 0, 0))
    assert "other thread tid=(0,0,0)" in str(e)


def test_byte_stores_by_neighbours_are_not_a_race():
    body = """
  mov.u32 %r12, sm;
  add.s32 %r13, %r12, %r1;
  st.shared.u8 [%r13], %r1;
  bar.sync 0;
  and.b32 %r14, %r1, -4;
  add.s32 %r14, %r12, %r14;
  ld.shared.u32 %r10, [%r14];
  st.global.u32 [%rd3], %r10;"""
    text = module(PROLOGUE + body, shared="  .shared .align 4 .b8 sm[64];\n")
    out = Z.copy()
    Module(code=text).get_function("k")((2,), (64,), [out, Z, Z, Z])
    t = np.arange(128) % 64 & ~3
    assert out.tolist() == (t | (t + 1) << 8 | (t + 2) << 16 | (t + 3) << 24).tolist()


# ---- undefined results and bad launches -----------------------------------------------

def test_division_by_zero():
    text = module(PROLOGUE + "\n  div.u32 %r10, %r5, %r6;")
    b = np.ones(128, np.uint32)
    b[77] = 0
    expect(text, "undefined", "div.u32", (1, 0, 0), (13, 0, 0), args=[Z.copy(), Z, b, Z])


@pytest.mark.parametrize("args, why", [
    ([Z, Z, Z], "takes 4 arguments"),
    ([Z, Z, Z, 5], "numpy array or numpy integer scalar"),
    ([Z, Z, Z, np.uint32(5)], "is .u64"),
    ([Z, Z, Z, np.zeros((8, 8), np.uint32)[:, ::2]], "C-contiguous"),
])
def test_bad_arguments_are_launch_errors(args, why):
    fn = Module(code=module(PROLOGUE)).get_function("k")
    with pytest.raises(EmulatorError) as info:
        fn((2,), (64,), args)
    assert info.value.kind == "launch" and why in str(info.value)


def test_scalar_width_must_match_the_parameter():
    text = module(PROLOGUE, params=("out", "a", "b", "c", "n:u32"))
    fn = Module(code=text).get_function("k")
    with pytest.raises(EmulatorError) as info:
        fn((2,), (64,), [Z, Z, Z, Z, np.uint64(3)])
    assert info.value.kind == "launch" and "'n' is .u32" in str(info.value)
    fn((2,), (64,), [Z.copy(), Z, Z, Z, np.uint32(3)])


def test_bad_geometry_and_unknown_entry():
    mod = Module(code=module(PROLOGUE))
    with pytest.raises(EmulatorError) as info:
        mod.get_function("nope")
    assert info.value.kind == "launch" and "entries: k" in str(info.value)
    for grid, block in (((0,), (64,)), ((1,), (2048,)), ((1, 1, 1, 1), (32,))):
        with pytest.raises(EmulatorError) as info:
            mod.get_function("k")(grid, block, [Z, Z, Z, Z])
        assert info.value.kind == "launch"


def test_race_is_kept_across_another_ctas_barrier():
    """CTA 1 passes a barrier alone (its own epoch); CTA 0's read-then-write race stays."""
    body = WRITE_BARRIER_READ + """
  setp.eq.u32 %p3, %r2, 0;
  @%p3 bra LATER;
  bar.sync 0;
  setp.eq.u32 %p2, %r1, 3;
  @%p2 st.shared.u32 [%r12], %r1;
  bra END;
LATER:
  setp.eq.u32 %p2, %r1, 3;
  @%p2 st.shared.u32 [%r12+4], %r1;
  @%p2 st.shared.u32 [%r12], %r1;
END:
  ret;"""
    text = module(PROLOGUE + body, shared="  .shared .align 4 .b8 sm[16];\n")
    e = expect(text, "race", line_of(text, "END:") - 1, (0, 0, 0), (3, 0, 0))
    assert "read by another thread" in str(e)
