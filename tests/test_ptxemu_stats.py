"""Launch statistics: warp instructions issued, counted as hardware issues them."""
import numpy as np
import pytest
from emucases import module

from hslm_ptx.emu import Module


ARGS = [np.zeros(128, np.uint32)] * 4


def stats_of(body: str, grid=(2,), block=(64,)):
    fn = Module(code=module(body)).get_function("k")
    fn(grid, block, ARGS)
    return fn.stats


def test_uniform_code_counts_every_warp_once_per_instruction():
    # 2 CTAs x 64 threads = 4 warps; mov, add, ret
    stats = stats_of("  mov.u32 %r1, %tid.x;\n  add.u32 %r2, %r1, 1;")
    assert stats.warp_instructions == 3 * 4
    assert stats.by_opcode == {"mov": 4, "add": 4, "ret": 4}


def test_predicated_off_instructions_still_issue():
    stats = stats_of("  mov.u32 %r1, %tid.x;\n  setp.eq.u32 %p1, %r1, 999;\n  @%p1 add.u32 %r2, %r1, 1;")
    assert stats.by_opcode["add"] == 4


def test_divergent_branch_counts_only_the_warps_on_each_side():
    # tid < 32 (warp 0 of each CTA) skips the add: 2 of the 4 warps issue it
    body = """
  mov.u32 %r1, %tid.x;
  setp.lt.u32 %p1, %r1, 32;
  @%p1 bra SKIP;
  add.u32 %r2, %r1, 1;
SKIP:
  mov.u32 %r3, 0;"""
    stats = stats_of(body)
    assert stats.by_opcode["add"] == 2
    assert stats.by_opcode["mov"] == 8 and stats.by_opcode["bra"] == 4


def test_partial_warps_count_as_whole_warps_and_memory_ops_keep_their_space():
    stats = stats_of("  mov.u32 %r1, %tid.x;\n  ld.param.u64 %rd1, [out];", grid=(3,), block=(40,))
    assert stats.by_opcode == {"mov": 6, "ld.param": 6, "ret": 6}  # 3 CTAs x 2 warps
    assert stats.per("ld.param") == 3.0
