"""bar.sync as PTX defines it (PTX ISA, "Parallel Synchronization and Communication
Instructions: bar, barrier"; "Control Flow Instructions: exit").

bar.sync is barrier.sync.aligned: every thread of a warp executes the same barrier
instruction, in conditional code only if the condition is the same for all of them;
the barrier waits for the non-exited threads, and exiting threads never hold it up.
So a warp part of which exits is fine; a guard or a loop trip count that splits a
warp at the barrier is a divergence error naming the line and a thread.
"""
from __future__ import annotations

import numpy as np
import pytest
from emucases import PROLOGUE, expect, line_of, module

from hslm_ptx.emu import Module


TID = np.arange(64) % 32 + np.arange(64) // 32 * 32     # one CTA of 64: tid = gid


def launch(body: str) -> np.ndarray:
    """One CTA of 64 threads (two warps); returns out (u32 per thread, 0 if unstored)."""
    out = np.zeros(64, np.uint32)
    z = np.zeros(64, np.uint32)
    Module(code=module(PROLOGUE + body)).get_function("k")((1,), (64,), [out, z, z, z])
    return out


STORE = "  mov.u32 %r10, 5;\n  st.global.u32 [%rd3], %r10;"


# ---- (i) part of the warp exits: exited threads do not count ----------------------------

@pytest.mark.parametrize("leave", ["  @%p1 exit;", "  @%p1 bra END;"])
def test_half_warp_at_the_barrier_while_the_rest_exits(leave):
    """Lanes 16-31 of each warp leave (directly, or by a branch to the exit); lanes
    0-15 pass the barrier once the others have exited."""
    got = launch(f"""
  and.b32 %r8, %r1, 31;
  setp.ge.u32 %p1, %r8, 16;
{leave}
  bar.sync 0;
{STORE}
END:
  ret;""")
    assert got.tolist() == [5 if t % 32 < 16 else 0 for t in TID]


def test_lanes_that_work_and_then_exit_leave_the_barrier_behind():
    """The same half warp, but the leaving lanes store first: they are not exiting
    threads on their way out while their warp waits at an aligned barrier."""
    text = module(PROLOGUE + f"""
  and.b32 %r8, %r1, 31;
  setp.ge.u32 %p1, %r8, 16;
  @%p1 bra OTHER;
  bar.sync 0;
{STORE}
  ret;
OTHER:
  st.global.u32 [%rd3], %r8;
  ret;""")
    e = expect(text, "divergence", "bar.sync 0;", (0, 0, 0), (16, 0, 0), grid=(1,))
    assert f"ran line {line_of(text, 'st.global.u32 [%rd3], %r8;')}" in str(e)
    assert "tid=(0,0,0)" in str(e)


def test_lanes_that_work_elsewhere_then_reach_the_same_barrier_pass():
    """A block placed after the barrier that jumps back to it: the warp meets at the
    same barrier, so the lanes waiting first are not left behind."""
    got = launch("""
  and.b32 %r8, %r1, 31;
  setp.ge.u32 %p1, %r8, 16;
  mov.u32 %r9, 0;
  @%p1 bra COLD;
BACK:
  bar.sync 0;
  add.u32 %r10, %r9, 5;
  st.global.u32 [%rd3], %r10;
  ret;
COLD:
  mov.u32 %r9, 1;
  bra BACK;""")
    assert got.tolist() == [5 + (t % 32 >= 16) for t in TID]


# ---- (ii) a guard that differs within the warp ------------------------------------------

def test_guarded_barrier_true_for_part_of_a_warp():
    text = module(PROLOGUE + f"""
  setp.lt.u32 %p1, %r1, 5;
  @%p1 bar.sync 0;
{STORE}""")
    e = expect(text, "divergence", "@%p1 bar.sync 0;", (0, 0, 0), (5, 0, 0), grid=(1,))
    assert "tid=(0,0,0) executes it" in str(e)


def test_guarded_barrier_true_for_every_thread_passes():
    got = launch(f"""
  setp.lt.u32 %p1, %r1, 64;
  @%p1 bar.sync 0;
{STORE}""")
    assert (got == 5).all()


# ---- (iii) a barrier in a loop whose trip count differs within the warp -----------------

LOOP = """
  mov.u32 %r11, 0;
LOOP:
  bar.sync 0;
  add.u32 %r11, %r11, 1;
  setp.lt.u32 %p2, %r11, %r12;
  @%p2 bra LOOP;
  st.global.u32 [%rd3], %r11;"""


def test_barrier_in_a_loop_with_per_lane_trip_counts():
    """Lanes 0-15 go round once, lanes 16-31 twice: the second time round, half the
    warp waits at the barrier while the other half stores after the loop."""
    text = module(PROLOGUE + """
  and.b32 %r8, %r1, 31;
  shr.u32 %r12, %r8, 4;
  add.u32 %r12, %r12, 1;""" + LOOP)
    e = expect(text, "divergence", "bar.sync 0;", (0, 0, 0), (0, 0, 0), grid=(1,))
    assert f"ran line {line_of(text, 'st.global.u32 [%rd3], %r11;')}" in str(e)


def test_barrier_in_a_loop_with_per_warp_trip_counts_passes():
    """Warp 0 goes round once and exits while warp 1 goes round twice: exited threads
    do not hold the second barrier up."""
    got = launch("""
  shr.u32 %r12, %r1, 5;
  add.u32 %r12, %r12, 1;""" + LOOP)
    assert got.tolist() == [1 + t // 32 for t in TID]
