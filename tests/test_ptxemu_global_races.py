"""Global-memory races the hardware leaves to chance, refused by the emulator: one CTA
reading (or overwriting what another read) a word another CTA stored without a release
and acquire between them; lanes of one st.global storing different values to one word;
a store to the source of a cp.async still in flight; and a store into a read-only
array, named by its PTX line like every other emulator error."""
from __future__ import annotations

import numpy as np
import pytest

from emucases import PROLOGUE, Z, expect, line_of, module
from hslm_ptx.emu import EmulatorError, Module, machine

U = np.uint32


@pytest.fixture(autouse=True, params=["one lockstep group", "a group a CTA"])
def cta_groups(request, monkeypatch):
    """Every race is caught whether the CTAs run in one lockstep array or one after
    another (machine.GROUP_THREADS: a launch's CTAs run in groups)."""
    if request.param == "a group a CTA":
        monkeypatch.setattr(machine, "GROUP_THREADS", 1)
    return request.param

# %p1: thread 0 of CTA 1; %p2: thread 0 of CTA 0
FIRST_THREADS = ("  setp.eq.u32 %p3, %r1, 0;\n  setp.eq.u32 %p4, %r2, 1;\n  and.pred %p1, %p3, %p4;\n"
                 "  setp.eq.u32 %p4, %r2, 0;\n  and.pred %p2, %p3, %p4;\n"
                 "  ld.param.u64 %rd20, [out];\n  cvta.to.global.u64 %rd20, %rd20;\n")


def run(text: str, grid=(2,), block=(32,), args=None):
    fn = Module(code=text).get_function("k")
    fn(grid, block, args if args is not None else [np.zeros(128, U), Z, Z, Z])


def test_a_cta_reading_a_word_another_cta_stored_is_a_race(cta_groups):
    body = FIRST_THREADS + "  @%p1 st.global.u32 [%rd20], %r1;\n  @%p2 ld.global.u32 %r20, [%rd20];"
    if cta_groups == "a group a CTA":   # CTA 0 has read the word before CTA 1 stores it
        e = expect(module(PROLOGUE + body), "race", "@%p1 st.global", (1, 0, 0), (0, 0, 0), block=(32,))
        assert "where CTA ctaid=(0,0,0) read" in str(e)
        return
    e = expect(module(PROLOGUE + body), "race", "@%p2 ld.global", (0, 0, 0), (0, 0, 0), block=(32,))
    assert "load of buffer 0 'out' where CTA ctaid=(1,0,0) stored" in str(e)


def test_a_cta_storing_a_word_another_cta_read_is_a_race():
    body = FIRST_THREADS + "  @%p2 ld.global.u32 %r20, [%rd20];\n  @%p1 st.global.u32 [%rd20], %r1;"
    e = expect(module(PROLOGUE + body), "race", "@%p1 st.global", (1, 0, 0), (0, 0, 0), block=(32,))
    assert "where CTA ctaid=(0,0,0) read" in str(e)


def test_a_cta_may_read_and_store_its_own_words():
    body = FIRST_THREADS + ("  @%p1 st.global.u32 [%rd20], %r1;\n  @%p1 ld.global.u32 %r20, [%rd20];\n"
                            "  @%p2 ld.global.u32 %r21, [%rd20+4];\n  @%p2 st.global.u32 [%rd20+4], %r1;")
    run(module(PROLOGUE + body))


# Every CTA stores its own word out[ctaid], then takes a ticket (thread 0); the CTA whose
# ticket is the last (nctaid - 1) sums every CTA's word into out[64]. RELEASE and ACQUIRE
# are the fences the pattern needs (PTX ISA 8.10, release and acquire patterns).
LAST_CTA = FIRST_THREADS + """
  mul.wide.u32 %rd21, %r2, 4;
  add.s64 %rd22, %rd20, %rd21;
  add.u32 %r20, %r2, 10;
  @%p3 st.global.u32 [%rd22], %r20;
  RELEASE
  ld.param.u64 %rd23, [a];
  cvta.to.global.u64 %rd23, %rd23;
  mov.u32 %r21, 0;
  @%p3 atom.global.add.u32 %r21, [%rd23+508], 1;
  ACQUIRE
  mov.u32 %r22, %nctaid.x;
  sub.u32 %r22, %r22, 1;
  setp.eq.u32 %p5, %r21, %r22;
  and.pred %p5, %p5, %p3;
  @!%p5 bra DONE;
  ld.global.u32 %r23, [%rd20];
  ld.global.u32 %r24, [%rd20+4];
  ld.global.u32 %r25, [%rd20+8];
  add.u32 %r23, %r23, %r24;
  add.u32 %r23, %r23, %r25;
  st.global.u32 [%rd20+256], %r23;
DONE:"""
FENCE = "fence.acq_rel.gpu;"


def test_the_last_cta_of_a_ticket_reads_what_the_others_released():
    """The order the emulator guarantees: tickets in lockstep then thread order, so CTA 2
    of 3 draws the last one and sees the words CTAs 0 and 1 stored before their fence."""
    out, a = np.zeros(128, U), np.zeros(128, U)
    run(module(PROLOGUE + LAST_CTA.replace("RELEASE", FENCE).replace("ACQUIRE", FENCE)),
        grid=(3,), args=[out, a, Z, Z])
    assert out[64] == 10 + 11 + 12 and a[127] == 3
    assert out[:3].tolist() == [10, 11, 12]


@pytest.mark.parametrize("release, acquire", [("", FENCE), (FENCE, ""), ("membar.cta;", FENCE),
                                              (FENCE, "fence.acq_rel.cta;")])
def test_the_last_cta_needs_both_fences_at_gpu_scope(release, acquire):
    text = module(PROLOGUE + LAST_CTA.replace("RELEASE", release).replace("ACQUIRE", acquire))
    e = expect(text, "race", "ld.global.u32 %r23, [%rd20];", (2, 0, 0), (0, 0, 0), grid=(3,),
               block=(32,), args=[np.zeros(128, U), np.zeros(128, U), Z, Z])
    assert "CTA ctaid=(0,0,0) stored" in str(e)


def test_a_membar_gl_orders_like_a_gpu_fence():
    out, a = np.zeros(128, U), np.zeros(128, U)
    run(module(PROLOGUE + LAST_CTA.replace("RELEASE", "membar.gl;").replace("ACQUIRE", "membar.sys;")),
        grid=(3,), args=[out, a, Z, Z])
    assert out[64] == 33


# ---- one st.global, several lanes, one word ------------------------------------------------

def test_lanes_storing_different_values_to_one_word_are_a_race():
    body = "  ld.param.u64 %rd20, [out];\n  cvta.to.global.u64 %rd20, %rd20;\n  st.global.u32 [%rd20+8], %r1;"
    text = module(PROLOGUE + body)
    e = expect(text, "race", "st.global.u32 [%rd20+8]", (0, 0, 0), (1, 0, 0), grid=(1,), block=(32,))
    assert "two threads of one instruction store different values" in str(e) and e.address % (1 << 32) == 8
    assert "other thread tid=(0,0,0)" in str(e)


def test_lanes_storing_one_value_to_one_word_are_fine():
    body = "  ld.param.u64 %rd20, [out];\n  cvta.to.global.u64 %rd20, %rd20;\n  st.global.u32 [%rd20+8], %r2;"
    out = np.ones(128, U)
    run(module(PROLOGUE + body), grid=(1,), args=[out, Z, Z, Z])
    assert out[2] == 0


def test_vector_lanes_overlapping_with_different_values_are_a_race():
    """Lanes 0 and 1 write the same 16 bytes; only the last word differs."""
    body = ("  ld.param.u64 %rd20, [out];\n  cvta.to.global.u64 %rd20, %rd20;\n  mov.u32 %r20, 7;\n"
            "  setp.lt.u32 %p1, %r1, 2;\n  @%p1 st.global.v4.u32 [%rd20+16], {%r20, %r20, %r20, %r1};")
    expect(module(PROLOGUE + body), "race", "st.global.v4", (0, 0, 0), (1, 0, 0), grid=(1,), block=(32,))


# ---- a cp.async still reading its source -------------------------------------------------

COPY = """
  mov.u32 %r20, sm;
  shl.b32 %r21, %r1, 2;
  add.u32 %r20, %r20, %r21;
  ld.param.u64 %rd20, [a];
  cvta.to.global.u64 %rd20, %rd20;
  mul.wide.u32 %rd21, %r1, 4;
  add.s64 %rd21, %rd20, %rd21;
  cp.async.ca.shared.global [%r20], [%rd21], 4;
  cp.async.commit_group;
  WAIT
  WRITE
  cp.async.wait_all;
  ld.shared.u32 %r22, [%r20];
  st.global.u32 [%rd3], %r22;"""
SM = "  .shared .align 16 .b8 sm[256];\n"


@pytest.mark.parametrize("write", ["st.global.u32 [%rd21], %r1;", "red.global.add.u32 [%rd21], 1;",
                                   "st.global.u8 [%rd21+3], %r1;"])
def test_writing_the_source_of_a_copy_in_flight_is_a_race(write):
    text = module(PROLOGUE + COPY.replace("WAIT", "").replace("WRITE", write), shared=SM)
    e = expect(text, "race", write, (0, 0, 0), (0, 0, 0), grid=(1,), block=(32,),
               args=[np.zeros(32, U), np.zeros(64, U), Z, Z])
    assert "source of a cp.async" in str(e)


def test_writing_the_source_after_the_wait_or_beside_it_is_fine():
    a, out = np.arange(64, dtype=U), np.zeros(32, U)
    text = module(PROLOGUE + COPY.replace("WAIT", "cp.async.wait_group 0;")
                  .replace("WRITE", "st.global.u32 [%rd21], %r1;"), shared=SM)
    run(text, grid=(1,), args=[out, a, Z, Z])
    assert out.tolist() == list(range(32))
    a = np.arange(64, dtype=U)
    run(module(PROLOGUE + COPY.replace("WAIT", "").replace("WRITE", "st.global.u32 [%rd21+128], %r1;"),
               shared=SM), grid=(1,), args=[out, a, Z, Z])
    assert a[32:].tolist() == list(range(32))


# ---- read-only arrays --------------------------------------------------------------------

@pytest.mark.parametrize("write", ["st.global.u32 [%rd3], %r1;", "red.global.add.u32 [%rd3], 1;"])
def test_a_store_into_a_read_only_array_names_its_line(write):
    out = np.zeros(128, U)
    out.flags.writeable = False
    text = module(PROLOGUE + "  " + write)
    with pytest.raises(EmulatorError) as info:
        Module(code=text).get_function("k")((2,), (32,), [out, Z, Z, Z])
    e = info.value
    assert e.kind == "read_only" and e.line == line_of(text, write) and "buffer 0 'out'" in str(e)
    assert (out == 0).all()


def test_reading_a_read_only_array_is_fine():
    a = np.arange(128, dtype=U)
    a.flags.writeable = False
    out = np.zeros(128, U)
    run(module(PROLOGUE + "  st.global.u32 [%rd3], %r5;"), grid=(2,), args=[out, a, a, a])
    assert out[:64].tolist() == list(range(64))
