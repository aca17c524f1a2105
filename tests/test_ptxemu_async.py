"""cp.async, ldmatrix, red/atom and vector global stores on the emulator: the ISA's
rules as plain-numpy models, and the bugs they exist to catch, planted.

``tests/data/ptx/async.ptx`` is nvcc 13.0's PTX for ``async.cu``
(`nvcc -ptx -arch=sm_80 async.cu`): the same forms as a compiler writes them.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from emucases import PROLOGUE, expect, module

from hslm_ptx.emu import EmulatorError, Module

U = np.uint32
PTX = Path(__file__).parent / "data" / "ptx" / "async.ptx"
LANE = np.arange(32)


def launch(body: str, args, shared: str, grid=(1,), block=(64,)) -> None:
    Module(code=module(PROLOGUE + body, shared=shared)).get_function("k")(grid, block, args)


# ---- cp.async --------------------------------------------------------------------------

# thread t copies SIZE bytes from a + SIZE*t into sm + SIZE*t (src-size in %r6 = b[t]),
# waits, and after the barrier writes thread (t ^ 1)'s bytes to out + SIZE*t
STAGE = """
  mul.wide.u32 %rd10, %r1, SIZE;
  add.s64 %rd11, %rd4, %rd10;
  mul.lo.u32 %r11, %r1, SIZE;
  mov.u32 %r12, sm;
  add.u32 %r13, %r12, %r11;
  COPY
  cp.async.commit_group;
  WAIT
  BARRIER
  xor.b32 %r14, %r11, SIZE;
  add.u32 %r15, %r12, %r14;
  add.s64 %rd12, %rd1, %rd10;
  LOAD_STORE"""
MOVE = {4: "ld.shared.u32 %r20, [%r15];\n  st.global.u32 [%rd12], %r20;",
        8: "ld.shared.v2.u32 {%r20, %r21}, [%r15];\n  st.global.v2.u32 [%rd12], {%r20, %r21};",
        16: "ld.shared.v4.u32 {%r20, %r21, %r22, %r23}, [%r15];\n"
            "  st.global.v4.u32 [%rd12], {%r20, %r21, %r22, %r23};"}


def stage(size: int, level: str = "ca", src_size: bool = True, wait="cp.async.wait_group 0;",
          barrier="bar.sync 0;") -> str:
    copy = f"cp.async.{level}.shared.global [%r13], [%rd11], {size}" + (", %r6;" if src_size else ";")
    return module(PROLOGUE + STAGE.replace("SIZE", str(size)).replace("COPY", copy)
                  .replace("WAIT", wait).replace("BARRIER", barrier)
                  .replace("LOAD_STORE", MOVE[size]),
                  shared=f"  .shared .align 16 .b8 sm[{64 * size}];\n")


def swap_model(src: np.ndarray, have: np.ndarray, size: int) -> np.ndarray:
    """ISA: the first src-size bytes are copied, the rest of cp-size zero-filled."""
    rows = np.where(np.arange(size) < have[:, None], src.reshape(-1, size)[:have.size], 0)
    return rows[np.arange(have.size) ^ 1].astype(np.uint8).reshape(-1)


@pytest.mark.parametrize("level, size", [("ca", 4), ("ca", 8), ("ca", 16), ("cg", 16)])
def test_cp_async_copies_and_zero_fills_past_src_size(level, size):
    rng = np.random.default_rng(size)
    src = rng.integers(1, 256, 64 * size).astype(np.uint8)
    have = rng.integers(0, size + 1, 64).astype(U)
    have[:4] = [0, size, 1, size - 1]
    out = np.full(64 * size, 0xAA, np.uint8)
    Module(code=stage(size, level)).get_function("k")((1,), (64,), [out, src, have, np.zeros(64, U)])
    assert (out == swap_model(src, have, size)).all()


def test_cp_async_without_src_size_copies_everything():
    src = np.random.default_rng(1).integers(0, 256, 1024).astype(np.uint8)
    out = np.zeros(1024, np.uint8)
    Module(code=stage(16, src_size=False)).get_function("k")((1,), (64,), [out, src, np.zeros(64, U), np.zeros(64, U)])
    assert (out == swap_model(src, np.full(64, 16), 16)).all()


def test_zero_filled_bytes_are_never_read():
    """src-size 0 at an address past the buffer: nothing is read, so no fault."""
    src = np.arange(16 * 63, dtype=np.uint8)  # thread 63's 16 bytes lie past the end
    have = np.full(64, 16, U)
    have[63] = 0
    out = np.zeros(1024, np.uint8)
    Module(code=stage(16)).get_function("k")((1,), (64,), [out, src, have, np.zeros(64, U)])
    assert (out == swap_model(np.r_[src, np.zeros(16, np.uint8)], have, 16)).all()
    have[63] = 1
    with pytest.raises(EmulatorError) as info:
        Module(code=stage(16)).get_function("k")((1,), (64,), [out, src, have, np.zeros(64, U)])
    assert info.value.kind == "out_of_bounds" and info.value.tid == (63, 0, 0)


def copy_traffic(have: np.ndarray):
    """The cp.async line's traffic row for 64 threads copying 16 bytes each, src-size ``have``."""
    fn = Module(code=stage(16)).get_function("k")
    fn((1,), (64,), [np.zeros(1024, np.uint8), np.zeros(1024, np.uint8), have.astype(U), np.zeros(64, U)])
    (row,) = [a for a in fn.stats.memory if a.opcode == "cp.async"]
    return row


def test_copy_traffic_counts_only_the_lanes_that_read():
    """A zero-filled lane (src-size 0) asks global memory for nothing: warp 0 reads all
    of its 512 bytes (16 sectors, 4 lines), warp 1 only lane 0's first byte (one sector);
    a warp whose every lane is zero-filled is no request at all."""
    have = np.zeros(64, U)
    have[:32], have[32] = 16, 1
    row = copy_traffic(have)
    assert (row.requests, row.sectors, row.lines, row.bytes_used) == (2, 16 + 1, 4 + 1, 33 * 16)
    have[32] = 0
    assert (copy_traffic(have).requests, copy_traffic(have).sectors) == (1, 16)
    # negative: counting every lane, as a copy that ignored src-size would, is 32 sectors
    assert copy_traffic(np.full(64, 16, U)).sectors == 32


def test_missing_wait_group_is_refused():
    text = stage(16, wait="")
    src, have = np.zeros(1024, np.uint8), np.full(64, 16, U)
    e = expect(text, "race", "ld.shared.v4", (0, 0, 0), (0, 0, 0), grid=(1,),
               args=[np.zeros(1024, np.uint8), src, have, np.zeros(64, U)])
    assert "cp.async.wait_group" in str(e) and e.address == 16


def test_missing_barrier_after_the_wait_is_refused():
    """The wait makes the bytes the issuing thread's; a neighbour needs a bar.sync."""
    text = stage(16, barrier="")
    e = expect(text, "race", "ld.shared.v4", (0, 0, 0), (0, 0, 0), grid=(1,),
               args=[np.zeros(1024, np.uint8), np.zeros(1024, np.uint8), np.full(64, 16, U),
                     np.zeros(64, U)])
    assert "written by another thread" in str(e) and "tid=(1,0,0)" in str(e)


# thread t's word: sm + 4t in %r13, &a[t] in %rd11
WORDS = """
  mov.u32 %r12, sm;
  mul.lo.u32 %r11, %r1, 4;
  add.u32 %r13, %r12, %r11;
  mul.wide.u32 %rd10, %r1, 4;
  add.s64 %rd11, %rd4, %rd10;"""


def test_a_thread_reads_its_own_copy_after_its_wait_without_a_barrier():
    body = WORDS + """
  cp.async.ca.shared.global [%r13], [%rd11], 4;
  cp.async.wait_all;
  ld.shared.u32 %r10, [%r13];
  st.global.u32 [%rd3], %r10;"""
    a = np.arange(64, dtype=U) * 3
    out = np.zeros(64, U)
    launch(body, [out, a, a, a], "  .shared .align 16 .b8 sm[256];\n")
    assert (out == a).all()


# two groups: A (word t) then B (word 64 + t); wait_group 1 leaves B pending
TWO_GROUPS = WORDS + """
  cp.async.ca.shared.global [%r13], [%rd11], 4;
  cp.async.commit_group;
  cp.async.ca.shared.global [%r13+256], [%rd11+256], 4;
  cp.async.commit_group;
  cp.async.wait_group 1;
  ld.shared.u32 %r10, [%r13];
  READ_B"""


def test_wait_group_n_leaves_the_n_newest_groups_pending():
    a = np.arange(128, dtype=U) + 5
    out = np.zeros(64, U)
    launch(TWO_GROUPS.replace("READ_B", "st.global.u32 [%rd3], %r10;"), [out, a, a, a],
           "  .shared .align 16 .b8 sm[512];\n")
    assert (out == a[:64]).all()
    text = module(PROLOGUE + TWO_GROUPS.replace("READ_B", "ld.shared.u32 %r10, [%r13+256];"),
                  shared="  .shared .align 16 .b8 sm[512];\n")
    e = expect(text, "race", "[%r13+256];", (0, 0, 0), (0, 0, 0), grid=(1,), args=[out, a, a, a])
    assert e.address == 256


def test_refilling_a_stage_another_thread_read_needs_a_barrier():
    """Write-after-read: the copy may land as soon as it issues."""
    body = WORDS + """
  st.shared.u32 [%r13], %r1;
  bar.sync 0;
  xor.b32 %r14, %r11, 4;
  add.u32 %r15, %r12, %r14;
  ld.shared.u32 %r10, [%r15];
  cp.async.ca.shared.global [%r13], [%rd11], 4;"""
    text = module(PROLOGUE + body, shared="  .shared .align 16 .b8 sm[256];\n")
    a = np.zeros(64, U)
    e = expect(text, "race", "cp.async.ca", (0, 0, 0), (0, 0, 0), grid=(1,), args=[a, a, a, a])
    assert "read by another thread" in str(e)


@pytest.mark.parametrize("ins, kind", [
    ("cp.async.cg.shared.global [%r13], [%rd4], 8;", "unsupported"),   # .cg is 16 only
    ("cp.async.ca.shared.global [%r13], [%rd4], 2;", "unsupported"),   # 4, 8, 16
    ("cp.async.ca.shared.global [%r13], [%rd4], 16, 17;", "undefined"),  # src-size > cp-size
    ("cp.async.ca.shared.global [%r13], [%rd4+4], 8;", "misaligned"),
    ("cp.async.ca.shared.global [%r13+4], [%rd4], 8;", "misaligned"),
    ("cp.async.wait_group %r1;", "unsupported"),
])
def test_bad_cp_async_forms(ins, kind):
    body = f"\n  mov.u32 %r13, sm;\n  {ins}"
    text = module(PROLOGUE + body, shared="  .shared .align 16 .b8 sm[64];\n")
    z = np.zeros(64, U)
    tid = None if kind == "unsupported" else (0, 0, 0)
    expect(text, kind, ins, tid and (0, 0, 0), tid, grid=(1,), args=[z, z, z, z])


def test_nvcc_staged_copy_with_zero_fill():
    rng = np.random.default_rng(2)
    src = rng.integers(0, 256, 16 * 512).astype(np.uint8)
    dst = np.zeros(16 * 512, np.uint8)
    n = 16 * 300 + 5
    Module(path=PTX).get_function("stage_swap")((2,), (256,), [src, dst, U(n)])
    want = np.where(np.arange(src.size) < n, src, 0).reshape(2, 256, 16)[:, np.arange(256) ^ 1]
    assert (dst == want.reshape(-1)).all()


# ---- ldmatrix --------------------------------------------------------------------------

def ldmatrix_model(rows: np.ndarray, count: int, trans: bool) -> np.ndarray:
    """ISA 9.7.14.5.15: lanes 8q.. address the rows of matrix q; register q of lane l holds
    row l >> 2, b16 columns 2(l & 3), 2(l & 3) + 1 (of the transposed matrix with .trans)."""
    out = np.zeros((count, 32), U)
    for q in range(count):
        mat = rows[8 * q:8 * q + 8].view(np.uint16).reshape(8, 8)
        mat = mat.T if trans else mat
        lo, hi = mat[LANE >> 2, 2 * (LANE & 3)], mat[LANE >> 2, 2 * (LANE & 3) + 1]
        out[q] = lo.astype(U) | hi.astype(U) << 16
    return out


LDSM = """
  mul.wide.u32 %rd10, %r1, 16;
  add.s64 %rd11, %rd4, %rd10;
  ld.global.v4.u32 {%r30, %r31, %r32, %r33}, [%rd11];
  mov.u32 %r12, sm;
  mul.lo.u32 %r13, %r1, 16;
  add.u32 %r14, %r12, %r13;
  st.shared.v4.u32 [%r14], {%r30, %r31, %r32, %r33};
  bar.sync 0;
  shl.b32 %r15, %r6, 4;
  add.u32 %r16, %r12, %r15;
  ldmatrix.sync.aligned.m8n8.xCOUNTTRANS.shared.b16 {REGS}, [%r16];
  STORES"""


@pytest.mark.parametrize("count", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_fragment_layout(count, trans):
    rng = np.random.default_rng(count + 10 * trans)
    words = rng.integers(0, 2**32, 128, dtype=np.uint64).astype(U)  # 32 rows of 16 bytes
    perm = np.r_[rng.permutation(32), np.zeros(96, int)].astype(U)  # lane l gives row perm[l]
    regs = [f"%r{20 + q}" for q in range(count)]
    stores = "\n  ".join(f"st.global.u32 [%rd3+{128 * q}], {r};" for q, r in enumerate(regs))
    body = (LDSM.replace("COUNT", str(count)).replace("TRANS", ".trans" if trans else "")
            .replace("REGS", ", ".join(regs)).replace("STORES", stores))
    out = np.zeros(4 * 32, U)
    launch(body, [out, words, perm, perm], "  .shared .align 16 .b8 sm[512];\n", block=(32,))
    rows = words.reshape(32, 4)[perm[:32]]
    assert (out.reshape(4, 32)[:count] == ldmatrix_model(rows, count, trans)).all()


def test_ldmatrix_x4_gives_the_mma_m16n8k32_a_fragment():
    """Lane l addressing A row (l & 7) + 8((l >> 3) & 1), byte 16(l >> 4): the four
    registers are exactly A's fragment (rows g, g+8; k 4t.. and 16+4t..)."""
    a = np.random.default_rng(3).integers(-128, 128, (16, 32)).astype(np.int8)
    l = LANE
    row_of_lane = (l & 7) + 8 * ((l >> 3) & 1)
    rows = a.view(np.uint8).reshape(16, 2, 16)[row_of_lane, l >> 4]
    got = ldmatrix_model(np.ascontiguousarray(rows).view(U).reshape(32, 4), 4, False)
    g, t = l >> 2, l & 3
    frag = [a[(g + 8 * (r & 1))[:, None], 16 * (r >> 1) + 4 * t[:, None] + np.arange(4)]
            for r in range(4)]
    want = [np.ascontiguousarray(f).view(U)[:, 0] for f in frag]
    assert all((got[r] == want[r]).all() for r in range(4))


def test_nvcc_ldmatrix_x4_and_trans():
    rng = np.random.default_rng(4)
    tile = rng.integers(0, 2**32, 128, dtype=np.uint64).astype(U)
    perm = rng.permutation(32).astype(U)
    out = np.zeros(256, U)
    Module(path=PTX).get_function("ldsm")((1,), (32,), [tile, out, perm])
    rows = tile.reshape(32, 4)[perm]
    assert (out[:128].reshape(4, 32) == ldmatrix_model(rows, 4, False)).all()
    assert (out[128:].reshape(4, 32) == ldmatrix_model(rows, 4, True)).all()


@pytest.mark.parametrize("plant, kind, snippet", [
    ("shl.b32 %r15, %r6, 3;", "misaligned", "ldmatrix"),          # rows 8-byte aligned
    ("bar.sync 0;", "race", "ldmatrix"),                            # no barrier after the fill
])
def test_ldmatrix_planted_bugs(plant, kind, snippet):
    body = (LDSM.replace("COUNT", "1").replace("TRANS", "").replace("REGS", "%r20")
            .replace("STORES", ""))
    body = body.replace("shl.b32 %r15, %r6, 4;", plant) if plant.startswith("shl") \
        else body.replace(plant, "")
    perm = np.r_[np.arange(1, 33), np.zeros(96, int)].astype(U)
    text = module(PROLOGUE + body, shared="  .shared .align 16 .b8 sm[1024];\n")
    z = np.zeros(128, U)
    e = expect(text, kind, snippet, (0, 0, 0), (0, 0, 0), grid=(1,), block=(32,),
               args=[z, z, perm, perm])
    assert e.kind == kind


def test_ldmatrix_needs_the_whole_warp():
    body = (LDSM.replace("COUNT", "1").replace("TRANS", "").replace("REGS", "%r20")
            .replace("STORES", "").replace("ldmatrix", "setp.lt.u32 %p1, %r1, 16;\n  @%p1 ldmatrix"))
    text = module(PROLOGUE + body, shared="  .shared .align 16 .b8 sm[1024];\n")
    z = np.zeros(128, U)
    expect(text, "divergence", "ldmatrix", (0, 0, 0), (0, 0, 0), grid=(1,), block=(32,),
           args=[z, z, z, z])


# ---- red / atom ------------------------------------------------------------------------

@pytest.mark.parametrize("ins", ["red.global.add.s32 [%rd11], %r5;",
                                 "red.relaxed.gpu.global.add.u32 [%rd11], %r5;",
                                 "atom.global.add.s32 %r10, [%rd11], %r5;"])
def test_red_and_atom_sum_colliding_adds_and_wrap(ins):
    """Threads add a[t] to word b[t] % 5; the sums wrap mod 2^32 (ISA: two's complement)."""
    rng = np.random.default_rng(5)
    a = rng.integers(0, 2**32, 256, dtype=np.uint64).astype(U)
    b = rng.integers(0, 5, 256).astype(U)
    bins = np.full(256, 7, U)
    body = f"""
  rem.u32 %r11, %r6, 5;
  mul.wide.u32 %rd10, %r11, 4;
  add.s64 %rd11, %rd8, %rd10;
  {ins}"""
    out = np.zeros(256, U)
    launch(body + ("\n  st.global.u32 [%rd3], %r10;" if "atom" in ins else ""),
           [out, a, b, bins], "", grid=(4,))
    want = np.full(5, 7, np.uint64)
    np.add.at(want, b % 5, a.astype(np.uint64))
    assert (bins[:5] == (want % 2**32).astype(U)).all() and (bins[5:] == 7).all()
    if "atom" in ins:  # the old values: each word's running sum in thread order
        for k in range(5):
            mine = np.flatnonzero(b % 5 == k)
            run = (7 + np.r_[0, np.cumsum(a[mine].astype(np.uint64))[:-1]]) % 2**32
            assert (out[mine] == run.astype(U)).all()


def test_red_out_of_bounds_and_misaligned():
    z = np.zeros(64, U)
    for ins, kind in (("red.global.add.s32 [%rd8+256], 1;", "out_of_bounds"),
                      ("red.global.add.s32 [%rd8+2], 1;", "misaligned")):
        text = module(PROLOGUE + "\n  " + ins)
        expect(text, kind, ins, (0, 0, 0), (0, 0, 0), grid=(1,), args=[z, z, z, z.copy()])


def test_nvcc_atomic_histogram():
    rng = np.random.default_rng(6)
    x = rng.integers(0, 2**32, 3000, dtype=np.uint64).astype(U)
    bins = np.zeros(7, np.int32)
    Module(path=PTX).get_function("histogram")((12,), (256,), [x, bins, U(3000), U(7)])
    want = np.zeros(7, np.int64)
    np.add.at(want, x % 7, x.astype(np.int64) - 7)
    assert (bins.view(U) == (want % 2**32).astype(U)).all()


# ---- vector global stores ----------------------------------------------------------------

@pytest.mark.parametrize("vec", [2, 4])
def test_vector_global_store_puts_element_0_lowest(vec):
    regs = ", ".join(f"%r{20 + j}" for j in range(vec))
    movs = "\n  ".join(f"add.u32 %r{20 + j}, %r1, {1000 * j};" for j in range(vec))
    body = f"""
  {movs}
  mul.wide.u32 %rd10, %r1, {4 * vec};
  add.s64 %rd11, %rd1, %rd10;
  st.global.v{vec}.u32 [%rd11], {{{regs}}};"""
    out = np.zeros(64 * vec, U)
    z = np.zeros(64, U)
    launch(body, [out, z, z, z], "")
    assert (out.reshape(64, vec) == np.arange(64)[:, None] + 1000 * np.arange(vec)).all()
    bad = body.replace("[%rd11]", "[%rd11+4]")
    expect(module(PROLOGUE + bad), "misaligned", f"st.global.v{vec}", (0, 0, 0), (0, 0, 0),
           grid=(1,), args=[np.zeros(65 * vec, U), z, z, z])


def test_ignore_src_predicate_zero_fills_the_whole_copy():
    """PTX 7.5's ignore-src operand: set, the copy reads nothing and writes zeros."""
    text = stage(16).replace("16, %r6;", "16, %p5;").replace(
        "cp.async.cg", "setp.ne.u32 %p5, %r6, 16;\n  cp.async.cg").replace(
        "cp.async.ca", "setp.ne.u32 %p5, %r6, 16;\n  cp.async.ca")
    src = np.random.default_rng(7).integers(1, 256, 1024).astype(np.uint8)
    have = np.where(np.arange(64) % 3, 16, 5).astype(U)   # 5: ignored, so 0 bytes, not 5
    out = np.zeros(1024, np.uint8)
    Module(code=text).get_function("k")((1,), (64,), [out, src, have, np.zeros(64, U)])
    assert (out == swap_model(src, np.where(have == 16, 16, 0), 16)).all()


def test_a_copy_waited_for_by_some_of_its_threads_stays_pending_for_the_rest():
    """The pending check looks only where copies in flight lie (their spans of window
    offsets); what is left of a copy after part of its threads waited keeps its span, so
    a thread that did not wait still may not read its bytes (and those that did may)."""
    body = WORDS + """
  cp.async.ca.shared.global [%r13], [%rd11], 4;
  setp.ge.u32 %p1, %r1, GATE;
  @%p1 bra SKIP;
  cp.async.wait_all;
SKIP:
  ld.shared.u32 %r10, [%r13];
  st.global.u32 [%rd3], %r10;"""
    a = np.arange(64, dtype=U) + 7
    out = np.zeros(64, U)
    shared = "  .shared .align 16 .b8 sm[256];\n"
    launch(body.replace("GATE", "64"), [out, a, a, a], shared)       # every thread waits
    assert (out == a).all()
    text = module(PROLOGUE + body.replace("GATE", "32"), shared=shared)
    e = expect(text, "race", "ld.shared.u32 %r10, [%r13];", (0, 0, 0), (32, 0, 0), grid=(1,),
               args=[out, a, a, a])
    assert "cp.async.wait_group" in str(e) and e.address == 128
