"""What a GPU refuses or faults on, the emulator refuses too: alignment on the absolute
address, global stores of one byte from two CTAs of a launch, the launch and shared
memory limits of the target (CUDA C++ Programming Guide, "Compute Capabilities"), and a
launch that runs past its instruction budget (a loop that never ends)."""
from __future__ import annotations

import numpy as np
import pytest

from hslm_ptx.emu import EmulatorError, Module
from hslm_ptx.emu.limits import OPT_IN_SHARED_MAX
from hslm_ptx.emu.memory import allocation_offset


U = np.uint32
KIB = 1024
HEAD = ".version 8.0\n.target sm_80\n.address_size 64\n"


def kernel(body: str, shared: str = "", target: str = "sm_80") -> str:
    """Entry k(out, a, n): %r4 = global thread index, %rd2 = a, %rd3 = out, %r9 = n."""
    return (HEAD.replace("sm_80", target) + ".visible .entry k(\n  .param .u64 out,\n"
            "  .param .u64 a,\n  .param .u32 n\n)\n{\n"
            "  .reg .pred %p<4>;\n  .reg .b32 %r<32>;\n  .reg .b64 %rd<16>;\n" + shared +
            "  mov.u32 %r1, %tid.x;\n  mov.u32 %r2, %ctaid.x;\n  mov.u32 %r3, %ntid.x;\n"
            "  mad.lo.s32 %r4, %r2, %r3, %r1;\n  ld.param.u64 %rd2, [a];\n"
            "  ld.param.u64 %rd3, [out];\n  ld.param.u32 %r9, [n];\n" + body + "\n  ret;\n}\n")


def fn_of(body: str, **kw):
    return Module(code=kernel(body, **{k: v for k, v in kw.items() if k in ("shared", "target")}),
                  **{k: v for k, v in kw.items() if k == "arch"}).get_function("k")


def line_of(text: str, snippet: str) -> int:
    return next(i for i, s in enumerate(text.splitlines(), 1) if snippet in s)


# ---- alignment on the absolute address ---------------------------------------------

READ16 = ("  mul.wide.u32 %rd4, %r4, 16;\n  add.s64 %rd5, %rd2, %rd4;\n"
          "  ld.global.v4.b32 {%r10, %r11, %r12, %r13}, [%rd5];\n"
          "  add.s64 %rd6, %rd3, %rd4;\n  st.global.v4.b32 [%rd6], {%r10, %r11, %r12, %r13};")


def test_a_16_byte_load_through_a_view_at_offset_1_is_misaligned():
    view = np.zeros(129, np.int8)[1:].reshape(4, 32)
    assert allocation_offset(view) == 1
    out = np.zeros((4, 32), np.int8)
    fn = fn_of(READ16)
    with pytest.raises(EmulatorError) as info:
        fn((1,), (8,), [out, view, U(0)])
    e = info.value
    assert e.kind == "misaligned" and e.text.startswith("ld.global.v4.b32")
    assert e.address % 256 == 1 and "starts 1 bytes past a 256-byte boundary" in str(e)
    assert e.tid == (0, 0, 0)


def test_the_same_bytes_in_an_aligned_view_load_fine():
    base = np.arange(256 + 128, dtype=np.uint8).astype(np.int8)
    for start in (0, 16, 256):                # 256: a whole allocation alignment further
        view = base[start:start + 128].reshape(4, 32)
        out = np.zeros((4, 32), np.int8)
        fn_of(READ16)((1,), (8,), [out, view, U(0)])
        assert (out == view).all()


@pytest.mark.parametrize("start, ok", [(2, False), (4, True), (8, True), (12, True)])
def test_word_loads_need_a_word_aligned_view(start, ok):
    body = ("  mul.wide.u32 %rd4, %r4, 4;\n  add.s64 %rd5, %rd2, %rd4;\n"
            "  ld.global.u32 %r10, [%rd5];\n  add.s64 %rd6, %rd3, %rd4;\n  st.global.u32 [%rd6], %r10;")
    raw = np.arange(64 + 16, dtype=np.uint8)
    view = raw[start:start + 64].view(U) if start % 4 == 0 else raw[start:start + 64]
    out = np.zeros(16, U)
    fn = fn_of(body)
    if ok:
        fn((1,), (16,), [out, view, U(0)])
        assert (out == raw[start:start + 64].view(U)).all()
    else:
        with pytest.raises(EmulatorError) as info:
            fn((1,), (16,), [out, view, U(0)])
        assert info.value.kind == "misaligned" and info.value.address % 4 == 2


def test_reading_before_a_view_is_out_of_bounds():
    body = "  ld.global.u8 %r10, [%rd2+-1];\n  st.global.u8 [%rd3], %r10;"
    view = np.zeros(64, np.uint8)[8:]
    with pytest.raises(EmulatorError) as info:
        fn_of(body)((1,), (1,), [np.zeros(4, np.uint8), view, U(0)])
    assert info.value.kind == "out_of_bounds"


# ---- stores of one byte from two CTAs ----------------------------------------------------

def test_two_ctas_storing_one_word_is_a_race():
    body = "  st.global.u32 [%rd3+8], %r2;"        # every thread of every CTA: out[2]
    text = kernel(body)
    with pytest.raises(EmulatorError) as info:
        Module(code=text).get_function("k")((3,), (32,), [np.zeros(4, U), np.zeros(4, U), U(0)])
    e = info.value
    assert e.kind == "race" and e.line == line_of(text, "st.global.u32 [%rd3+8]")
    assert e.ctaid == (1, 0, 0) and "CTA ctaid=(0,0,0)" in str(e)
    assert e.address % (1 << 32) == 8 and "buffer 0 'out'" in str(e)


def test_two_ctas_storing_in_one_instruction_and_across_instructions():
    # CTA 1 thread 0 writes out[3] in the second store; CTA 0 wrote it (0 from every lane) in the first
    body = ("  setp.eq.u32 %p1, %r2, 0;\n  @%p1 st.global.u32 [%rd3+12], %r2;\n"
            "  setp.eq.u32 %p2, %r1, 0;\n  setp.ne.u32 %p3, %r2, 0;\n  and.pred %p2, %p2, %p3;\n"
            "  @%p2 st.global.u32 [%rd3+12], %r2;")
    text = kernel(body)
    with pytest.raises(EmulatorError) as info:
        Module(code=text).get_function("k")((2, 1, 1), (32,), [np.zeros(4, U), np.zeros(4, U), U(0)])
    assert info.value.kind == "race" and info.value.line == line_of(text, "@%p2 st.global")
    assert info.value.ctaid == (1, 0, 0)


@pytest.mark.parametrize("wide, narrow", [("st.global.v4.b32 [%rd3+16], {%r1, %r1, %r1, %r1}",
                                           "st.global.u32 [%rd3+28], %r1"),
                                          ("st.global.u32 [%rd3+4], %r1",
                                           "st.global.u8 [%rd3+7], %r1")])
def test_a_narrow_store_inside_another_ctas_wide_one_is_a_race(wide, narrow):
    body = (f"  setp.eq.u32 %p1, %r2, 0;\n  @%p1 {wide};\n  setp.eq.u32 %p2, %r2, 1;\n"
            f"  @%p2 {narrow};")
    text = kernel(body)
    out = np.zeros(20, U)[4:]                      # a view 16 bytes into its allocation
    with pytest.raises(EmulatorError) as info:
        Module(code=text).get_function("k")((2,), (1,), [out, np.zeros(1, U), U(0)])
    assert info.value.kind == "race" and info.value.ctaid == (1, 0, 0)
    assert info.value.line == line_of(text, narrow) and "ctaid=(0,0,0)" in str(info.value)


def test_ctas_storing_their_own_bytes_or_adding_atomically_are_fine():
    # CTA c, thread t writes byte 32c + t; then every thread adds 1 to word 0 of a (red)
    body = ("  cvt.u64.u32 %rd4, %r4;\n  add.s64 %rd5, %rd3, %rd4;\n  st.global.u8 [%rd5], %r1;\n"
            "  red.global.add.u32 [%rd2], 1;\n  atom.global.add.u32 %r10, [%rd2+4], 2;")
    out, a = np.zeros(128, np.uint8), np.zeros(2, U)
    fn_of(body)((4,), (32,), [out, a, U(0)])
    assert (out == np.tile(np.arange(32), 4)).all() and a.tolist() == [128, 256]


def test_a_one_cta_launch_may_store_a_word_twice():
    body = "  st.global.u32 [%rd3], %r1;\n  st.global.u32 [%rd3], %r2;"
    out = np.ones(1, U)
    fn_of(body)((1,), (1,), [out, np.zeros(1, U), U(0)])
    assert out[0] == 0


# ---- launch and shared-memory limits ------------------------------------------------------

def test_static_shared_over_48_kib_is_refused_at_load():
    fn_of("", shared="  .shared .align 16 .b8 big[49152];\n")       # exactly 48 KiB: fine
    with pytest.raises(EmulatorError) as info:
        fn_of("", shared="  .shared .align 16 .b8 big[65536];\n")
    assert info.value.kind == "launch" and "65536 bytes of static .shared" in str(info.value)


EXTERN = "  .shared .align 16 .b8 pad[1024];\n  .extern .shared .align 16 .b8 dyn[];\n"
TOUCH = "  mov.u32 %r10, dyn;\n  shl.b32 %r11, %r1, 2;\n  add.u32 %r10, %r10, %r11;\n  st.shared.u32 [%r10], %r1;"


@pytest.mark.parametrize("dynamic", [200 * KIB, 1024 * KIB, 48 * KIB])
def test_dynamic_shared_past_48_kib_needs_the_opt_in(dynamic):
    fn = fn_of(TOUCH, shared=EXTERN)
    with pytest.raises(EmulatorError) as info:
        fn((1,), (32,), [np.zeros(1, U)] * 2 + [U(0)], shared_mem=dynamic)
    assert info.value.kind == "launch"
    assert "max_dynamic_shared_size_bytes" in str(info.value) and "48 KiB" in str(info.value)
    fn((1,), (32,), [np.zeros(1, U)] * 2 + [U(0)], shared_mem=47 * KIB)   # 1 KiB static + 47


@pytest.mark.parametrize("arch, ok", [("sm_80", False), ("sm_90", True), ("sm_86", False)])
def test_the_opt_in_is_capped_by_the_architecture(arch, ok):
    fn = fn_of(TOUCH, shared=EXTERN, arch=arch)
    if ok:
        fn.max_dynamic_shared_size_bytes = 200 * KIB
        fn((1,), (32,), [np.zeros(1, U)] * 2 + [U(0)], shared_mem=200 * KIB)
        with pytest.raises(EmulatorError) as info:    # the attribute caps the launch
            fn((1,), (32,), [np.zeros(1, U)] * 2 + [U(0)], shared_mem=200 * KIB + 16)
        assert "the function allows 204800" in str(info.value)
    else:
        with pytest.raises(EmulatorError) as info:
            fn.max_dynamic_shared_size_bytes = 200 * KIB
        assert info.value.kind == "launch" and arch in str(info.value)
        assert str(OPT_IN_SHARED_MAX[arch] - KIB) in str(info.value)
    with pytest.raises(EmulatorError):
        fn.max_dynamic_shared_size_bytes = 1024 * KIB


def test_sm_80_opts_in_to_its_163_kib():
    fn = fn_of(TOUCH, shared=EXTERN)
    fn.max_dynamic_shared_size_bytes = 162 * KIB
    out = np.zeros(1, U)
    fn((1,), (32,), [out, np.zeros(1, U), U(0)], shared_mem=162 * KIB)
    assert fn.max_dynamic_shared_size_bytes == 162 * KIB
    assert Module(code=kernel("", target="sm_90")).arch == "sm_90"


@pytest.mark.parametrize("grid, block, words", [
    ((1,), (1, 1, 1024), "block.z = 1024"),
    ((1,), (32, 33), "1056 threads"),
    ((1,), (2048,), "2048 threads"),
    ((1, 65536), (32,), "grid.y = 65536"),
    ((1, 1, 65536), (32,), "grid.z = 65536"),
    ((2 ** 31,), (32,), "grid.x = 2147483648"),
])
def test_launch_geometry_limits(grid, block, words):
    with pytest.raises(EmulatorError) as info:
        fn_of("")(grid, block, [np.zeros(1, U)] * 2 + [U(0)])
    assert info.value.kind == "launch" and words in str(info.value)


def test_the_largest_legal_block_runs():
    out = np.zeros(1024, U)
    body = "  mul.wide.u32 %rd4, %r1, 4;\n  add.s64 %rd5, %rd3, %rd4;\n  st.global.u32 [%rd5], %r1;"
    fn_of(body)((1,), (1024, 1, 1), [out, np.zeros(1, U), U(0)])
    assert (out == np.arange(1024)).all()


# ---- the instruction budget --------------------------------------------------------

LOOP = "  mov.u32 %r10, 0;\nLOOP:\n  add.u32 %r10, %r10, 1;\n  bra LOOP;"


def test_an_endless_loop_stops_at_its_budget_naming_the_line():
    text = kernel(LOOP)
    fn = Module(code=text).get_function("k")
    with pytest.raises(EmulatorError) as info:
        fn((2,), (64,), [np.zeros(64, U), np.zeros(64, U), U(10)])
    e = info.value
    assert e.kind == "budget" and "instruction budget" in str(e)
    assert e.line in (line_of(text, "add.u32 %r10, %r10, 1"), line_of(text, "bra LOOP"))
    assert str(e).count("\n") == 0


def test_a_divergent_endless_loop_names_where_the_threads_are():
    body = ("  setp.lt.u32 %p1, %r1, 16;\n  @%p1 bra DONE;\n  mov.u32 %r10, 0;\nSPIN:\n"
            "  add.u32 %r10, %r10, 1;\n  bra SPIN;\nDONE:\n  st.global.u32 [%rd3], %r1;")
    text = kernel(body)
    with pytest.raises(EmulatorError) as info:
        Module(code=text).get_function("k")((1,), (32,), [np.zeros(1, U), np.zeros(1, U), U(0)])
    spin, done = line_of(text, "add.u32 %r10, %r10, 1"), line_of(text, "st.global.u32 [%rd3]")
    assert info.value.kind == "budget" and f"line(s) {spin}, {done}:" in str(info.value)


COUNTED = ("  mov.u32 %r10, 0;\nLOOP:\n  add.u32 %r10, %r10, 1;\n  setp.lt.u32 %p1, %r10, %r9;\n"
           "  @%p1 bra LOOP;\n  mul.wide.u32 %rd4, %r4, 4;\n  add.s64 %rd5, %rd3, %rd4;\n"
           "  st.global.u32 [%rd5], %r10;")


def test_a_loop_counted_by_a_parameter_fits_the_default_budget():
    """3000 trips over a 3000-word buffer: the count is no bigger than the data."""
    out = np.zeros(3000, U)
    fn = fn_of(COUNTED)
    fn((1,), (64,), [out, np.zeros(1, U), U(3000)])
    assert (out[:64] == 3000).all() and fn.stats.steps < fn.stats.budget


@pytest.mark.parametrize("bad", [0, -5, 2.5, "many", True])
def test_a_bad_budget_is_one_clear_line(bad):
    fn = fn_of(COUNTED)
    fn.instruction_budget = bad
    with pytest.raises(EmulatorError) as info:
        fn((1,), (64,), [np.zeros(64, U), np.zeros(1, U), U(3)])
    assert info.value.kind == "launch" and "instruction_budget must be None" in str(info.value)


def test_a_mask_parameter_does_not_inflate_the_budget():
    fn = Module(code=kernel(LOOP)).get_function("k")
    with pytest.raises(EmulatorError) as info:
        fn((1,), (32,), [np.zeros(1, U), np.zeros(1, U), U(0xFFFFFFFF)])
    assert info.value.kind == "budget" and fn.stats is None


def test_a_set_budget_stops_a_finite_loop():
    fn = fn_of(COUNTED)
    fn.instruction_budget = 1000
    with pytest.raises(EmulatorError) as info:
        fn((1,), (64,), [np.zeros(3000, U), np.zeros(1, U), U(3000)])
    assert info.value.kind == "budget" and "ran 1000 lockstep steps" in str(info.value)
