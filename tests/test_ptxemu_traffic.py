"""Memory traffic per PTX line (LaunchCounts.memory): hand-computed cases, and the
vectorized counts against a per-warp model written straight from the definitions."""
from __future__ import annotations

import numpy as np
import pytest
from emucases import PROLOGUE, line_of, module

from hslm_ptx.emu import AccessStats, Module
from hslm_ptx.emu.traffic import Traffic


Z = np.zeros(4096, np.uint32)


def traffic(body: str, grid=(2,), block=(64,), shared: str = ""):
    """Run PROLOGUE + body; (stats, module text). %r1 = tid, %rd4 = a (global)."""
    text = module(PROLOGUE + body, shared=shared)
    fn = Module(code=text).get_function("k")
    fn(grid, block, [Z.copy(), Z.copy(), Z.copy(), Z.copy()])
    return fn.stats, text


def at(stats, text: str, snippet: str) -> AccessStats:
    line = line_of(text, snippet)
    return next(a for a in stats.memory if a.line == line)


# ---- global: sectors and lines ------------------------------------------------------------

@pytest.mark.parametrize("stride, sectors, lines", [(4, 4, 1), (8, 8, 2), (128, 32, 32), (0, 1, 1)])
def test_global_u32_loads_per_warp(stride, sectors, lines):
    """Lane l reads a + stride*l: 4 bytes each, 2 CTAs x 2 warps = 4 requests."""
    stats, text = traffic(f"""
  mul.wide.u32 %rd10, %r1, {stride};
  add.s64 %rd11, %rd4, %rd10;
  ld.global.u32 %r10, [%rd11];""")
    a = at(stats, text, "ld.global.u32 %r10, [%rd11];")
    assert (a.opcode, a.space, a.in_loop) == ("ld.global", "global", False)
    assert (a.requests, a.bytes_used, a.sectors, a.lines) == (4, 4 * 128, 4 * sectors, 4 * lines)
    assert (a.wavefronts, a.ideal_wavefronts) == (0, 0)


def test_prologue_loads_and_stores_are_listed_and_params_are_not():
    stats, text = traffic("  st.global.u32 [%rd3], %r5;")
    assert [a.opcode for a in stats.memory] == ["ld.global"] * 3 + ["st.global"]
    assert stats.memory == tuple(sorted(stats.memory))                 # by line
    st = at(stats, text, "st.global.u32 [%rd3], %r5;")
    assert (st.requests, st.sectors, st.lines) == (4, 16, 4)


def test_guarded_lanes_and_idle_warps_do_not_count():
    """Only lanes 0-7 of warp 0 of each CTA load: 2 requests of 32 bytes, 1 sector each."""
    stats, text = traffic("""
  setp.lt.u32 %p1, %r1, 8;
  @%p1 ld.global.u32 %r10, [%rd5];""")
    a = at(stats, text, "@%p1 ld.global.u32")
    assert (a.requests, a.bytes_used, a.sectors, a.lines) == (2, 64, 2, 2)


def test_loop_lines_and_totals():
    """Three trips of a loop whose load moves 16 bytes a trip (bytes 0-127, 16-143,
    32-159): 4, 5 and 4 sectors, 1, 2 and 2 lines (a shifted pattern is counted
    afresh); then one load outside at 48-175: 5 sectors, 2 lines."""
    stats, text = traffic("""
  mov.u32 %r11, 0;
  mul.wide.u32 %rd10, %r1, 4;
  add.s64 %rd11, %rd4, %rd10;
LOOP:
  ld.global.u32 %r10, [%rd11];
  add.s64 %rd11, %rd11, 16;
  add.u32 %r11, %r11, 1;
  setp.lt.u32 %p1, %r11, 3;
  @%p1 bra LOOP;
  ld.global.u32 %r12, [%rd11];""", grid=(1,), block=(32,))
    inner = at(stats, text, "ld.global.u32 %r10, [%rd11];")
    after = at(stats, text, "ld.global.u32 %r12, [%rd11];")
    assert inner.in_loop and not after.in_loop
    assert (inner.requests, inner.sectors, inner.lines) == (3, 4 + 5 + 4, 1 + 2 + 2)
    assert (after.requests, after.sectors, after.lines) == (1, 5, 2)
    loop = stats.memory_totals("global", in_loop=True)
    assert loop == {"requests": 3, "bytes_used": 3 * 128, "sectors": 13, "lines": 5,
                    "wavefronts": 0, "ideal_wavefronts": 0}
    everything = stats.memory_totals("global")
    assert everything["requests"] == 3 + 1 + 3        # + the prologue's three loads
    assert everything == {k: loop[k] + stats.memory_totals("global", in_loop=False)[k] for k in loop}
    assert stats.memory_totals("shared") == dict.fromkeys(loop, 0)


# ---- shared: bank wavefronts ----------------------------------------------------------------

SHARED = "  .shared .align 16 .b8 sh[8192];\n"


def shared_load(ins: str, stride: int, store: str = "st.shared.v4.b32 [%r21], {%r1, %r1, %r1, %r1};"):
    """Every thread fills its 16 bytes, then lane l runs ``ins`` at sh + stride*l."""
    stats, text = traffic(f"""
  mov.u32 %r20, sh;
  shl.b32 %r22, %r1, 4;
  add.u32 %r21, %r20, %r22;
  {store}
  bar.sync 0;
  and.b32 %r23, %r1, 31;
  mul.lo.u32 %r23, %r23, {stride};
  add.u32 %r24, %r20, %r23;
  {ins}""", grid=(1,), block=(256,), shared=SHARED)
    return at(stats, text, ins), at(stats, text, store)


@pytest.mark.parametrize("ins, stride, waves, ideal", [
    ("ld.shared.b32 %r10, [%r24];", 4, 1, 1),               # consecutive words
    ("ld.shared.b32 %r10, [%r24];", 128, 32, 1),            # stride 32 words: one bank
    ("ld.shared.b32 %r10, [%r24];", 8, 2, 1),               # stride 2 words: 2-way
    ("ld.shared.b32 %r10, [%r24];", 0, 1, 1),               # broadcast
    ("ld.shared.u8 %r10, [%r24];", 1, 1, 1),                # 4 lanes per word
    ("ld.shared.v2.b32 {%r10, %r11}, [%r24];", 8, 2, 2),    # two half-warps, no conflict
    ("ld.shared.v2.b32 {%r10, %r11}, [%r24];", 16, 4, 2),   # each half-warp 2-way
    ("ld.shared.v4.b32 {%r10, %r11, %r12, %r13}, [%r24];", 16, 4, 4),   # 4 quarter-warps
    ("ld.shared.v4.b32 {%r10, %r11, %r12, %r13}, [%r24];", 32, 8, 4),   # each 2-way
])
def test_shared_wavefronts_per_warp(ins, stride, waves, ideal):
    load, store = shared_load(ins, stride)
    assert (load.opcode, load.space, load.sectors, load.lines) == ("ld.shared", "shared", 0, 0)
    assert (load.requests, load.wavefronts, load.ideal_wavefronts) == (8, 8 * waves, 8 * ideal)
    assert (store.opcode, store.wavefronts, store.ideal_wavefronts) == ("st.shared", 8 * 4, 8 * 4)


# ---- the vectorized counts against a model of the definitions ------------------------------

def model(warps, lanes, addr, threads, size, space):
    """Per warp in Python: the distinct sectors/lines, or per phase the most distinct
    words one bank serves."""
    out = dict(requests=0, bytes_used=0, sectors=0, lines=0, wavefronts=0, ideal_wavefronts=0)
    for w in sorted(set(warps[threads].tolist())):
        mine = [(int(lanes[t]), int(a)) for t, a in zip(threads, addr) if warps[t] == w]
        out["requests"] += 1
        out["bytes_used"] += size * len(mine)
        if space == "global":
            out["sectors"] += len({a // 32 for _, a in mine})
            out["lines"] += len({a // 128 for _, a in mine})
            continue
        k = max(1, size // 4)
        for phase in range(k):
            words = {a // 4 + j for lane, a in mine if lane // (32 // k) == phase for j in range(k)}
            if words:
                out["wavefronts"] += max(sum(1 for x in words if x % 32 == b) for b in range(32))
                out["ideal_wavefronts"] += 1
    return out


@pytest.mark.parametrize("space, size", [("global", 1), ("global", 4), ("global", 16),
                                         ("shared", 1), ("shared", 4), ("shared", 8), ("shared", 16)])
@pytest.mark.parametrize("seed", range(3))
def test_counts_match_the_model(space, size, seed):
    rng = np.random.default_rng(seed)
    tpc = 96 if seed == 2 else 80                # 80: a partial warp per CTA
    T = 2 * tpc
    tid = np.arange(T) % tpc
    warps, lanes = np.arange(T) // tpc * -(-tpc // 32) + tid // 32, tid % 32
    tr = Traffic(warps, lanes)
    cases = []
    for trip in range(4):
        active = rng.random(T) < (1.0 if trip == 0 else 0.6)
        threads = np.flatnonzero(active)
        spread = [64, 512, 4096][trip % 3]
        addr = (rng.integers(0, spread, threads.size) * size).astype(np.uint64)
        addr += np.uint64(1 << 32 if space == "global" else 0)
        cases.append(model(warps, lanes, addr.tolist(), threads, size, space))
        tr.record(7, "ld." + space, space, addr, threads, size)
        tr.record(7, "ld." + space, space, addr + np.uint64(128), threads, size)   # cached
        cases.append(cases[-1])
    (got,) = tr.stats(set())
    assert got._asdict() == {"line": 7, "opcode": "ld." + space, "space": space, "in_loop": False,
                             **{f: sum(c[f] for c in cases) for f in cases[0]}}


def test_the_model_comparison_catches_a_planted_broadcast_bug(monkeypatch):
    """Count every lane's word as its own (no broadcast): the comparison must fail."""
    from hslm_ptx.emu import traffic as tr_module
    real = tr_module.shared_counts

    def no_broadcast(rows):
        rows = rows.copy()
        rows += (np.arange(rows.shape[1], dtype=np.uint64) * np.uint64(32)) * (rows != tr_module.NONE)
        return real(rows)
    monkeypatch.setattr(tr_module, "shared_counts", no_broadcast)
    with pytest.raises(AssertionError):
        test_counts_match_the_model("shared", 4, 0)


# ---- the row helpers the counts and the memories use -------------------------------------

def test_take_and_put_move_rows_like_numpy_indexing():
    from hslm_ptx.emu.memory import put, take
    rng = np.random.default_rng(1)
    for k, dtype in ((1, np.int32), (2, np.int32), (4, np.uint32), (16, np.uint8), (3, np.uint8)):
        a = rng.integers(0, 100, (50, k)).astype(dtype)
        rows = rng.permutation(50)[:20]
        assert np.array_equal(take(a, rows), a[rows])
        want, got = a.copy(), a.copy()
        v = rng.integers(0, 100, (20, k)).astype(dtype)
        want[rows] = v
        put(got, rows, v)
        assert np.array_equal(got, want)
        want[rows] = v[:, :1]                   # a column broadcast along the row
        put(got, rows, v[:, :1])
        assert np.array_equal(got, want)
        want[rows] = 9                          # a scalar
        put(got, rows, 9)
        assert np.array_equal(got, want)
        put(got, rows[:1], 5)                   # negative: a row that changed is seen
        assert not np.array_equal(got, want)


def test_distinct_finds_repeated_rows_without_sorting():
    from hslm_ptx.emu.memory import distinct
    mark = np.empty(100, np.int32)
    assert distinct(np.array([3, 5, 9]), mark)                      # increasing
    assert distinct(np.array([9, 3, 5, 0]), mark)                   # any order
    assert not distinct(np.array([9, 3, 5, 3]), mark)               # a repeat
    assert not distinct(np.array([7, 7]), mark)
    assert distinct(np.array([4]), mark) and distinct(np.array([], np.int64), mark)
