"""The emitted PTX, run on the CPU emulator, equals the integer reference exactly,
including every tail case; and the same check fails on planted kernel bugs."""
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from kernelcases import (INT32_EPILOGUE, STAGED, TERNARY, TWO_STAGED, contraction, emulated, exact, family_configs,
                         gemm_dims, inputs_of, per_kernel, per_module, plans_scored, span_of, stated, tile_of)

from hslm_ptx.cost import model as cost
from hslm_ptx.runtime.launch import LaunchError, launch, launch_outputs
from hslm_ptx.kernel.pitch import WPlanes
from hslm_ptx.catalog.registry import KERNELS, get_kernel
from hslm_ptx.kernel.spec import Dims
from hslm_ptx.emu import EmulatorError, Module
from hslm_ptx.tile import epilogue, geometry

TAILS = [Dims(1, 1, 1), Dims(1, 17, 3), Dims(5, 16, 8), Dims(33, 31, 9), Dims(65, 64, 33), Dims(17, 129, 40),
         # fast chunks that end exactly at a row's (or the buffer's) last byte
         Dims(3, 68, 8), Dims(5, 132, 9), Dims(130, 68, 132), Dims(130, 1, 1), Dims(200, 3, 5)]


def run(name, dims, ptx=None, seed=0):
    """Every output of one emulator launch of ``name``, and the reference's, by name."""
    spec = get_kernel(name)
    fn = Module(code=ptx).get_function(name) if ptx else emulated(name)
    inputs = spec.make_inputs(dims, np.random.default_rng(seed))
    return launch_outputs(spec, fn, dims, inputs), spec.expected(dims, inputs)


def differing(name, got, want) -> int:
    """Elements of ``name``'s outputs that differ from the reference's."""
    return sum(int(np.count_nonzero(got[k] != want[k])) for k in want)


def tail_cases() -> list:
    """Each family on every tail shape, its configurations taking the shapes in turn
    (shape i on configuration i mod n): every tile meets tails, and a family built on
    more tiles or output types costs no more shapes than one built on one."""
    cases = []
    for family in dict.fromkeys(KERNELS[n].family_name for n in KERNELS):
        configs = family_configs(family)
        for i, dims in enumerate(TAILS):
            name = configs[i % len(configs)]
            cases.append(pytest.param(name, dims, marks=pytest.mark.kernel(name),
                                      id=f"{name}-{'x'.join(map(str, dims))}"))
    return cases


@pytest.mark.parametrize("name, dims", tail_cases())
def test_exact_on_tail_shapes(name, dims):
    got, want = run(name, dims)
    spec = get_kernel(name)
    assert {k: (v.shape, v.dtype.name) for k, v in got.items()} == \
        {p.name: (p.layout.logical(dims), p.storage) for p in spec.output_params}
    assert exact(spec, got, want)


@pytest.mark.parametrize("names", per_module())
@settings(max_examples=30, deadline=None)
@given(data=st.data(), R=st.integers(1, 200), K=st.integers(1, 200), N=st.integers(1, 140), seed=st.integers(0, 9))
def test_exact_for_any_shape(names, data, R, K, N, seed):
    """Per kernel module, each example draws one of its kernels as well as the shape."""
    name = data.draw(st.sampled_from(names), label="kernel")
    got, want = run(name, Dims(R, K, N), seed=seed)
    assert exact(get_kernel(name), got, want)


# a W fetch's source address up to its offset (a copy through the ring, or a load)
W_FETCH = r"((?:ld\.global\.u32 %r\d+, |cp\.async\.ca\.shared\.global \[%r\d+(?:\+\d+)?\], )\[%rd\d+)"
# (family, what the mutation breaks, regex, replacement, what must catch it); run on a
# shape with fast chunks (K, N = 200, 140) and a tail, so both loop bodies are exercised.
# A kernel module states its own in PLANTED_BUGS (kernelcases.stated), in this format
# without the family.
PLANTED = [
    ("hslm_fwd_s8", "decode table with +1 and -1 swapped", r"0xff0100;", "0x1ff00;", "mismatch"),
    ("hslm_fwd_s8", "no wait for the chunk's copies", r"\tcp\.async\.wait_group 2;\n", "", "race"),
    ("hslm_fwd_s8", "waiting for one chunk too few", r"cp\.async\.wait_group 2;", "cp.async.wait_group 3;",
     "race"),
    ("hslm_fwd_s8", "no barrier after the wait", r"(chunk:\n(?:[^\n]*\n)*?)\tbar\.sync 0;\n", r"\1", "race"),
    ("hslm_fwd_s8", "rows past R copied instead of zero-filled", r"or\.pred (%p\d+), (%p\d+), %p\d+;",
     r"mov.pred \1, \2;", "out_of_bounds"),
    ("hslm_fwd_s8", "swizzle ignored by the ldmatrix rows", r"xor\.b32 (%r\d+), (%r\d+), 32;",
     # rows run past the rows A holds in a stage, onto W's words there, or into the next
     # stage, still in flight: read as A, they are wrong
     r"add.u32 \1, \2, 32;", "race/uninitialized/mismatch"),
    ("hslm_dx_s8", "no barrier after the wait", r"(chunk:\n(?:[^\n]*\n)*?)\tbar\.sync 0;\n", r"\1", "race"),
    ("hslm_fwd_s8", "decode keeps one bit of each code", r"0x33333333;", "0x11111111;", "mismatch"),
    ("hslm_dx_s8", "the W pointer does not step a plane a chunk", r"\tadd\.s64 (%rd\d+), \1, %rd\d+;\n", "",
     "mismatch"),
    ("hslm_dx_s8", "n tiles 1 and 3 read tile 0's and 2's columns", W_FETCH + r"\+(32|288)\]",
     lambda m: f"{m.group(1)}+{int(m.group(2)) - 32}]", "mismatch"),
    ("hslm_dw_s8", "A copies not stopped at R", r"(cp\.async[^\n]*), 16, %r\d+;", r"\1, 16;", "out_of_bounds"),
    ("hslm_dw_s8", "B rows past K copied", r"or\.pred (%p\d+), (%p\d+), %p\d+;", r"mov.pred \1, \2;",
     "out_of_bounds"),
    ("hslm_dw_s8", "waiting for one chunk too few", r"cp\.async\.wait_group (\d+);",
     lambda m: f"cp.async.wait_group {int(m.group(1)) + 1};", "race"),
    ("hslm_dw_s8", "ring wraps one stage late", r"setp\.ge\.u32 (%p\d+), (%r\d+), (0x[0-9a-f]+);",
     r"setp.gt.u32 \1, \2, \3;", "out_of_bounds"),  # the ring (its size, hex) ends at the window
] + [(family, *case) for family, case in stated("PLANTED_BUGS")]


@pytest.mark.parametrize("name, what, old, new, expect",
                         [pytest.param(name, *case[1:], marks=pytest.mark.kernel(name), id=f"{name}: {case[1]}")
                          for case in PLANTED for name in family_configs(case[0])])
def test_planted_bug_is_caught(name, what, old, new, expect):
    ptx, count = re.subn(old, new, KERNELS[name].emit())  # every occurrence: both loop bodies
    assert count >= 1, f"the mutation '{what}' no longer applies"
    dims, kinds = Dims(70, 200, 140), expect.split("/")
    try:
        got, want = run(name, dims, ptx=ptx)
    except EmulatorError as exc:  # a fault the emulator refuses: one of the kinds stated
        assert exc.kind in kinds, f"'{what}' faulted as {exc.kind}, not {expect}"
    else:  # it ran: then only a wrong output may catch it
        assert "mismatch" in kinds and differing(name, got, want) > 0


@pytest.mark.kernel("hslm_dw_s8")
def test_dw_refuses_rows_past_the_int32_bound():
    spec = get_kernel("hslm_dw_s8")
    with pytest.raises(LaunchError, match="R=131072 is over 131071"):
        launch(spec, lambda *a, **k: None, Dims(131072, 1, 1), {})


@pytest.mark.kernel("hslm_fwd_s8")
def test_launch_refuses_a_grid_cuda_cannot_run():
    spec = get_kernel("hslm_fwd_s8")
    rows = 65535 * geometry.LARGE.m  # the largest R that fits
    launch(spec, lambda *a, **k: None, Dims(rows, 1, 1), {
        "x": np.zeros((rows, 1), np.int8), "w": np.zeros((1, 1), np.uint32)})
    with pytest.raises(LaunchError, match=r"needs grid\.y=65536, over CUDA's 65535"):
        launch(spec, lambda *a, **k: None, Dims(rows + 1, 1, 1), {})


@pytest.mark.parametrize("name", per_kernel())
def test_launch_refuses_mismatched_inputs(name):
    spec = get_kernel(name)
    dims = Dims(4, 16, 8)
    inputs = spec.make_inputs(dims, np.random.default_rng(0))
    key = next(iter(inputs))
    inputs[key] = inputs[key][:1]
    with pytest.raises(LaunchError, match=f"input '{key}' is"):
        launch(spec, lambda *a, **k: None, dims, inputs)


ROW_STAGED = TERNARY  # A: int8 rows staged by cp.async; B: packed W in planes


def run_pitched(name: str, dims: Dims, row_pitch: int, seed: int = 0):
    """``name`` with its staged input in rows ``row_pitch`` bytes apart, junk between the
    row's width and the pitch."""
    spec = get_kernel(name)
    rng = np.random.default_rng(seed)
    inputs = spec.make_inputs(dims, rng)
    params = {p.name: p for p in spec.params}
    key, packed = inputs_of(spec)  # the staged rows, then W
    assert isinstance(params[packed].layout, WPlanes)
    rows = rng.integers(-128, 128, (dims.R, row_pitch), dtype=np.int8)
    rows[:, :inputs[key].shape[1]] = inputs[key]
    w = params[packed].layout.into(inputs[packed], dims)  # W in the kernel's planes
    return launch_raw(name, dims, [rows, w], row_pitch), spec.reference(dims, inputs)


def launch_raw(name: str, dims: Dims, buffers: list, row_pitch: int, ptx: str | None = None,
               span: int | None = None, out_pitch: int | None = None) -> np.ndarray:
    """One emulator launch with the input buffers as given, the pitch ``row_pitch``,
    ``span`` bytes of k per split (default: the kernel's own plan) and the output's rows
    ``out_pitch`` words apart (default: the kernel's own); returns the output's rows x width."""
    spec = get_kernel(name)
    span = span or span_of(name, dims)
    geo = spec.geometry(dims)
    grid = (*geo.grid[:2], -(-contraction(name, dims) // span))
    rows, width = spec.output.layout.logical(dims)
    out = np.zeros((rows, out_pitch or spec.output.layout.shape(dims)[1]), np.int32)
    sizes = [np.uint32(v) for v in (dims.R, dims.K, dims.N, row_pitch, out.shape[1], span)]
    fn = Module(code=ptx).get_function(name) if ptx else emulated(name)
    fn(grid, geo.block, [out, *buffers, *sizes])
    return out[:, :width]


@pytest.mark.parametrize("dims, row_pitch", [(Dims(129, 243, 130), 256), (Dims(27, 64, 9), 96),
                                             (Dims(5, 17, 3), 48), (Dims(130, 1, 129), 160)])
@pytest.mark.parametrize("name", per_kernel(ROW_STAGED))
def test_staged_kernels_exact_with_a_pitch_wider_than_the_row_and_junk_padding(name, dims, row_pitch):
    got, want = run_pitched(name, dims, row_pitch)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("name", per_kernel(ROW_STAGED))
def test_staged_kernels_refuse_a_pitch_that_breaks_16_byte_alignment(name):
    with pytest.raises(EmulatorError) as info:
        run_pitched(name, Dims(8, 40, 40), 40)
    assert info.value.kind == "misaligned" and "cp.async" in info.value.text


@pytest.mark.kernel("hslm_fwd_s8")
def test_launch_copies_unpitched_rows_into_an_aligned_buffer():
    spec = get_kernel("hslm_fwd_s8")
    dims = Dims(9, 40, 8)
    inputs = spec.make_inputs(dims, np.random.default_rng(4))
    assert inputs["x"].shape == (9, 40) and spec.params[1].layout.shape(dims) == (9, 48)
    seen = {}
    launch(spec, lambda grid, block, args, shared_mem=0: seen.update(x=args[1], ldx=args[6]), dims, inputs)
    assert seen["x"].shape == (9, 48) and seen["ldx"] == 48
    assert np.array_equal(seen["x"][:, :40], inputs["x"]) and not seen["x"][:, 40:].any()


@pytest.mark.parametrize("name", per_kernel(TWO_STAGED))
@pytest.mark.parametrize("dims, row_pitch", [(Dims(70, 200, 140), 96), (Dims(128, 33, 128), 144)])
def test_dw_exact_on_its_own_layout_with_junk_padding(name, dims, row_pitch):
    """Both operands handed over ready (dW: Xq^T and dYq^T), rows ``row_pitch`` apart,
    junk past the contraction in both."""
    spec = get_kernel(name)
    rng = np.random.default_rng(5)
    inputs = spec.make_inputs(dims, rng)
    a, bt = spec.gemm_operands(inputs, dims)  # the kernel's layout: the contraction along each row
    by_name = {spec.gemm_form.a.name: a, spec.gemm_form.bt.name: bt}
    ready = []
    for key in inputs_of(spec):
        rows = rng.integers(-128, 128, (by_name[key].shape[0], row_pitch), dtype=np.int8)
        rows[:, :contraction(name, dims)] = by_name[key]
        ready.append(rows)
    assert np.array_equal(launch_raw(name, dims, ready, row_pitch), spec.reference(dims, inputs))


def conflicted(name: str, ptx: str | None = None) -> list[tuple[str, int, int]]:
    """Shared accesses of the chunk loop that need more bank wavefronts than the minimum."""
    spec = get_kernel(name)
    fn = Module(code=ptx).get_function(name) if ptx else emulated(name)
    dims = Dims(256, 192, 256)
    inputs = spec.make_inputs(dims, np.random.default_rng(1))
    assert exact(spec, launch_outputs(spec, fn, dims, inputs), spec.expected(dims, inputs))
    return [(a.opcode, a.wavefronts, a.ideal_wavefronts) for a in fn.stats.memory
            if a.in_loop and a.space == "shared" and a.wavefronts > a.ideal_wavefronts]


@pytest.mark.parametrize("name", per_kernel(STAGED))
def test_staged_loop_has_no_shared_bank_conflicts(name):
    assert conflicted(name) == []


@pytest.mark.parametrize("name", per_kernel(STAGED))
def test_an_unswizzled_layout_is_exact_but_conflicted(name):
    ptx, count = re.subn(r"xor\.b32 (%r\d+), (%r\d+), %r\d+;", r"mov.b32 \1, \2;", get_kernel(name).emit())
    assert count >= 1
    assert any(op == "ldmatrix" for op, _, _ in conflicted(name, ptx))


# 256-row launches whose output rows are whole 128-byte lines (192 columns), as
# (rows, cols, contraction): the first split-K (word-per-lane adds through shared
# memory), the second one split (stores from registers)
SPLIT = (256, 192, 1024)
WHOLE = (256, 192, 64)


def epilogue_traffic(name: str, ptx: str | None = None, shapes: tuple[int, int, int] = SPLIT) -> list:
    """The memory rows after the chunk loop (the staged output) of ``name`` on ``shapes``
    (rows, cols, contraction), checked exact unless the PTX is a planted one."""
    spec = get_kernel(name)
    fn = Module(code=ptx).get_function(name) if ptx else emulated(name)
    dims = gemm_dims(name, *shapes)
    inputs = spec.make_inputs(dims, np.random.default_rng(1))
    got = launch(spec, fn, dims, inputs)
    assert ptx is not None or np.array_equal(got, spec.reference(dims, inputs))
    assert (spec.geometry(dims).grid[2] > 1) == (shapes is SPLIT)
    return [a for a in fn.stats.memory if not a.in_loop and a.opcode in OUTPUT_OPCODES]


OUTPUT_OPCODES = ("st.shared", "ld.shared", "st.global", "red.global")


@pytest.mark.parametrize("name", per_kernel(INT32_EPILOGUE))
def test_staged_output_is_conflict_free_and_one_line_per_request(name):
    rows = epilogue_traffic(name)
    assert {a.opcode for a in rows} >= {"st.shared", "ld.shared"}
    assert all(a.wavefronts == a.ideal_wavefronts for a in rows if a.space == "shared")
    written = [a for a in rows if a.space == "global"]
    assert written and all(a.lines == a.requests and a.bytes_used == 128 * a.requests for a in written)


@pytest.mark.parametrize("name", per_kernel(INT32_EPILOGUE))
def test_one_split_stores_from_registers_whole_sectors(name):
    """One split: each lane stores four consecutive columns from its accumulators with
    one st.global.v4, a warp 8 rows x 64 bytes: every sector it touches whole (two a
    row), at most 8 lines a request, and no shared memory or barrier on the way."""
    rows = epilogue_traffic(name, shapes=WHOLE)
    assert {a.opcode for a in rows} == {"st.global"}
    assert all(a.bytes_used == 32 * a.sectors and a.lines <= 8 * a.requests for a in rows)
    logical = get_kernel(name).output.layout.logical(gemm_dims(name, *WHOLE))
    assert sum(a.bytes_used for a in rows) == 4 * math.prod(logical)


@pytest.mark.parametrize("name", per_kernel(INT32_EPILOGUE))
def test_output_rows_off_16_byte_alignment_are_caught_misaligned(name):
    """Negative: the same launch with the output's rows 243 words apart (the width, not
    the kernel's pitch): row 1's 16-byte stores are misaligned (and the last row's last
    group runs past the buffer), and the emulator refuses whichever it meets first."""
    spec = get_kernel(name)
    dims = gemm_dims(name, rows=5, cols=243, contraction=64)
    inputs = spec.make_inputs(dims, np.random.default_rng(0))
    buffers, row_pitch = in_kernel_layout(name, dims, inputs)
    assert np.array_equal(launch_raw(name, dims, buffers, row_pitch), spec.reference(dims, inputs))
    with pytest.raises(EmulatorError) as info:
        launch_raw(name, dims, buffers, row_pitch, out_pitch=243)
    assert info.value.kind in ("misaligned", "out_of_bounds") and "st.global" in info.value.text


@pytest.mark.parametrize("name", per_kernel(INT32_EPILOGUE))
def test_unpadded_output_staging_is_caught_conflicted(name, monkeypatch):
    monkeypatch.setattr(epilogue, "staging_row_words", lambda run: geometry.TILE_N)
    rows = epilogue_traffic(name)
    assert any(a.wavefronts > a.ideal_wavefronts for a in rows if a.opcode == "st.shared")


@pytest.mark.parametrize("name", per_kernel(INT32_EPILOGUE))
def test_lanes_off_consecutive_columns_are_caught_uncoalesced(name):
    """Plant: the read-back lane's global column is 4 lane, not lane."""
    ptx = get_kernel(name).emit()
    lane = re.search(r"and\.b32 (%r\d+), %r\d+, 31;", ptx).group(1)
    ptx, count = re.subn(rf"add\.u32 (%r\d+), (%r\d+), {lane};", rf"mad.lo.u32 \1, {lane}, 4, \2;", ptx)
    assert count == 1
    written = [a for a in epilogue_traffic(name, ptx) if a.space == "global"]
    assert any(a.lines > a.requests for a in written)


SPLIT_K = 1024  # a contraction the tile rule splits on one 27-row tile: eight splits of two chunks


def output_requests(name: str, width: int, ptx: str | None = None, contraction: int = 128) -> dict[str, int]:
    """Requests (and bytes stored) of the output's accesses for an output of 27 rows x
    ``width`` columns (128, or 127: odd, the last lane's group ends in the pitch) over
    ``contraction`` (128: one split; SPLIT_K: split-K, eight splits of two chunks), checked
    exact: one CTA tile across the columns, and down the rows one (two on a 16-row tile)."""
    spec = get_kernel(name)
    fn = Module(code=ptx).get_function(name) if ptx else emulated(name)
    dims = gemm_dims(name, rows=27, cols=width, contraction=contraction)
    assert spec.geometry(dims).grid == (1, -(-27 // tile_of(name).m), 1 if contraction == 128 else 8)
    inputs = spec.make_inputs(dims, np.random.default_rng(3))
    assert np.array_equal(launch(spec, fn, dims, inputs), spec.reference(dims, inputs))
    rows = [a for a in fn.stats.memory if not a.in_loop]
    got = {op: sum(a.requests for a in rows if a.opcode == op)
           for op in ("st.shared", "ld.shared", "st.global", "red.global")}
    return got | {"bytes": sum(a.bytes_used for a in rows if a.opcode in ("st.global", "red.global"))}


@pytest.mark.parametrize("width", [128, 127], ids=["aligned", "odd"])
@pytest.mark.parametrize("name", per_kernel(INT32_EPILOGUE))
def test_rows_past_the_last_are_not_stored(name, width):
    """One split: 4 warp columns x rows 0-31 of the first warp row in steps of 8 (the 4th
    partly past row 27) x 2 runs of four columns (8 warp columns x 1 run on the 8-warp
    tiles; rows 16-31 in the second CTA of a 16-row tile); no request for a step wholly past
    the last row, nothing through shared memory. Each row's 128 columns are stored whole
    (the odd width's last group ends in the pitch's padding)."""
    got = output_requests(name, width)
    assert got == {"st.shared": 0, "ld.shared": 0, "st.global": 4 * 4 * 2, "red.global": 0, "bytes": 27 * 512}


@pytest.mark.parametrize("width", [128, 127], ids=["aligned", "odd"])
@pytest.mark.parametrize("name", per_kernel(INT32_EPILOGUE))
def test_split_k_sums_of_rows_past_the_last_are_not_read_back(name, width):
    """Split-K: all fragments staged (m_tiles passes x 2 halves x warps x a v4 per two n
    tiles) by each CTA of the 8 splits (of each row tile); 27 rows read back and added, 4
    words a lane, none past the width."""
    got, tile = output_requests(name, width, contraction=SPLIT_K), tile_of(name)
    ctas = 8 * -(-27 // tile.m)
    assert got == {"st.shared": ctas * tile.m_tiles * 2 * tile.warps * tile.n_tiles // 2, "ld.shared": 8 * 27 * 4,
                   "st.global": 0, "red.global": 8 * 27 * 4, "bytes": 8 * 27 * width * 4}


@pytest.mark.parametrize("name", per_kernel(INT32_EPILOGUE))
def test_storing_every_row_is_caught_out_of_bounds(name):
    """Plant: the row test of the one-split stores always passes."""
    ptx = get_kernel(name).emit()
    direct = ptx.split("bra.uni add_out;", 1)[1].split("add_out:", 1)[0]
    planted, count = re.subn(r"(setp\.gt\.s32 %p\d+, %r\d+, )\d+;", r"\g<1>-2147483648;", direct)
    assert count == 2 * tile_of(name).m_tiles
    with pytest.raises(EmulatorError) as info:
        output_requests(name, 128, ptx.replace(direct, planted))
    assert info.value.kind == "out_of_bounds" and "st.global" in info.value.text


@pytest.mark.parametrize("name", per_kernel(INT32_EPILOGUE))
def test_reading_back_every_row_is_caught_out_of_bounds(name):
    """Plant: the split-K read-back no longer skips rows past the last."""
    ptx, count = re.subn(r"\t@%p\d+ bra\.uni add_written_\d_\d;\n", "", get_kernel(name).emit())
    tile = tile_of(name)
    assert count == tile.m_tiles * tile.rows_read_back
    with pytest.raises(EmulatorError) as info:
        output_requests(name, 128, ptx, contraction=SPLIT_K)
    assert info.value.kind == "out_of_bounds" and "red.global" in info.value.text


def in_kernel_layout(name: str, dims: Dims, inputs: dict) -> tuple[list, int]:
    """``inputs`` as the kernel reads them (pitched, dW's transposed), and their row pitch."""
    spec = get_kernel(name)
    params = {p.name: p for p in spec.params}
    names = inputs_of(spec)
    buffers = [params[k].layout.into(inputs[k], dims) for k in names]
    return buffers, params[names[0]].layout.shape(dims)[1]


def split_run(name: str, dims: Dims, span: int, ptx: str | None = None):
    """``name`` launched with ``span`` bytes of k per split, inputs in the kernel's layout."""
    spec = get_kernel(name)
    inputs = spec.make_inputs(dims, np.random.default_rng(2))
    buffers, row_pitch = in_kernel_layout(name, dims, inputs)
    return launch_raw(name, dims, buffers, row_pitch, ptx, span), spec.reference(dims, inputs)


@pytest.mark.parametrize("name", per_kernel(INT32_EPILOGUE))
def test_output_rows_at_a_wider_pitch_are_exact_and_the_padding_past_the_last_group_untouched(name):
    """The output's row pitch is a parameter: at 64 words more than the kernel's own the
    rows are still exact, and the only padding word stored is the one sharing a lane's
    16 bytes with the last column (width 131: column 131; 132 on stay as they were)."""
    spec = get_kernel(name)
    dims = gemm_dims(name, rows=33, cols=131, contraction=70)
    inputs = spec.make_inputs(dims, np.random.default_rng(6))
    buffers, row_pitch = in_kernel_layout(name, dims, inputs)
    pitch = spec.output.layout.shape(dims)[1] + 64
    got = launch_raw(name, dims, buffers, row_pitch, out_pitch=pitch)
    rows = got.base  # the whole pitched buffer, zeroed before the launch
    assert rows.shape == (spec.output.layout.logical(dims)[0], 224) and got.shape[1] == 131
    assert np.array_equal(got, spec.reference(dims, inputs))
    assert not rows[:, 132:].any()


@pytest.mark.parametrize("span", [64, 128, 192])  # 200 = 3 x 64 + 8, 128 + 72, 192 + 8: uneven parts
@pytest.mark.parametrize("name", per_kernel(INT32_EPILOGUE))
def test_split_k_parts_that_do_not_divide_the_contraction_are_exact(name, span):
    got, want = split_run(name, Dims(200, 200, 200), span)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("name", per_kernel(INT32_EPILOGUE))
def test_split_k_with_plain_stores_is_caught(name):
    """The split path must add: stores would keep only one split's partial sums. The
    emulator refuses the second CTA's store to a word another CTA stored (a race: CTAs
    are not ordered); an emulator that let it through would show the lost sums."""
    ptx, count = re.subn(r"(@%p\d+) red\.global\.add\.s32", r"\1 st.global.s32", get_kernel(name).emit())
    assert count == tile_of(name).m_tiles * tile_of(name).n_tiles * 4  # one per accumulator element
    try:
        got, want = split_run(name, Dims(70, 200, 140), 64, ptx)
    except EmulatorError as error:
        assert error.kind == "race" and "st.global.s32" in error.text
    else:
        assert np.count_nonzero(got != want) > 0


@pytest.mark.parametrize("name", per_kernel(INT32_EPILOGUE))
def test_the_split_rule_stays_within_four_ctas_per_sm_and_keeps_two_chunks_per_split(name):
    for dims in (Dims(27, 243, 243), Dims(1782, 729, 243), Dims(4096, 4096, 4096), Dims(1, 1, 1)):
        span, geo = span_of(name, dims), get_kernel(name).geometry(dims)
        splits = geo.grid[2]
        assert splits == -(-contraction(name, dims) // span) and span % 64 == 0
        assert splits == 1 or span >= 128  # at least two chunks per split
        tiles = geo.grid[0] * geo.grid[1]
        assert splits == 1 or tiles * splits <= 4 * 132  # no split beyond four CTAs an SM (rule.SPLIT_FILLS)


@pytest.mark.kernel("hslm_fwd_s8")
def test_the_split_rule_offers_28_tiles_splits_up_to_four_ctas_an_sm_and_takes_the_cheapest():
    """ffn_down at 1782 rows: 28 tiles x 12 chunks; split_k offers 4 splits of 3 chunks at
    one CTA an SM (112 SMs; 6 of 2 would be 168) and 6 of 2 at two or four, and the launch
    takes the cheapest by the tile rule's score of those and of one split (which skips the
    split-K epilogue)."""
    down = Dims(1782, 729, 243)
    scores = plans_scored("hslm_fwd_s8", down)
    assert [(p.splits, p.span) for p in scores] == [(1, 768), (4, 192), (6, 128)]
    assert get_kernel("hslm_fwd_s8").geometry(down).grid == (2, 14, min(scores, key=scores.get).splits)


def w_loads(name: str, dims: Dims, ptx: str | None = None) -> tuple[np.ndarray, np.ndarray, list]:
    """One launch on ``dims``: its output, the reference, and the traced W fetches: the
    4-byte ``cp.async.ca`` that copy W through the ring (A's copies are 16-byte
    ``cp.async.cg``; an ``ld.global`` would be W loaded some other way)."""
    spec = get_kernel(name)
    source = (ptx or spec.emit()).splitlines()
    fn = Module(code=ptx).get_function(name) if ptx else emulated(name)
    inputs = spec.make_inputs(dims, np.random.default_rng(4))
    got = launch(spec, fn, dims, inputs)
    return got, spec.reference(dims, inputs), [a for a in fn.stats.memory if a.opcode == "ld.global" or (
        a.opcode == "cp.async" and "cp.async.ca." in source[a.line - 1])]


def w_fetches(name: str, dims: Dims, ptx: str | None = None) -> int:
    """Warp-level requests of the packed-W loads in one launch on ``dims``, checked exact."""
    got, want, loads = w_loads(name, dims, ptx)
    assert np.array_equal(got, want)
    return sum(a.requests for a in loads)


def one_cta(name: str, depth: int) -> Dims:
    """Dims of one CTA of ``name``'s tile over a contraction of ``depth``."""
    return gemm_dims(name, rows=tile_of(name).m, cols=128, contraction=depth)


@pytest.mark.parametrize("name", per_kernel(STAGED))
def test_a_cta_copies_chunk_bytes_a_chunk_as_the_cost_model_counts(name):
    """The cost model's L2 figure (``KernelSpec.chunk_bytes``: A's rows and B's share of a
    ring stage, each once) is what the emulator sees one CTA's copies read from global
    memory: one CTA (a full tile) over 3 whole chunks (too few to split: a split runs at
    least two) reads 3 x chunk_bytes, whole sectors. The figure it replaced, every warp's requests from the loop's SASS
    (``LoopFigures.global_bytes``), counts a guarded copy in every warp: more than the
    CTA reads wherever some threads skip their copies (the ternary tiles' W past the
    first warp row, the 8-warp 32-row tile's A past the first 128 threads), and exactly
    it elsewhere."""
    spec, dims = get_kernel(name), one_cta(name, 3 * geometry.CHUNK_K)
    assert spec.geometry(dims).grid == (1, 1, 1)
    fn = emulated(name)
    inputs = spec.make_inputs(dims, np.random.default_rng(5))
    assert np.array_equal(launch(spec, fn, dims, inputs), spec.reference(dims, inputs))
    copies = [a for a in fn.stats.memory if a.opcode == "cp.async"]
    assert 32 * sum(a.sectors for a in copies) == sum(a.bytes_used for a in copies) == 3 * spec.chunk_bytes
    tile, requested = tile_of(name), tile_of(name).warps * cost.loop_counts(name).fast.global_bytes
    guarded = (name in TERNARY and tile.warps_m > 1) or tile.copying_threads(tile.m) < tile.threads
    assert requested >= spec.chunk_bytes and (requested > spec.chunk_bytes) == guarded


@pytest.mark.parametrize("name", per_kernel(TERNARY))
def test_ternary_kernels_fetch_w_once_a_cta_for_the_chunks_they_run(name):
    """One CTA, a contraction of 190: 3 chunks (one split), so each warp of the first warp
    row copies its words 3 times (the prologue's 3 stages are the 3 chunks) and the other
    rows read them from the ring. Negatives: every copy past W's last plane ignores its
    source, and without that the loop's copies read past the planes; with more than one
    warp row, copies not kept to the first one write each slot once per row, a race."""
    tile, dims = tile_of(name), one_cta(name, 190)
    words = tile.n_tiles  # a word per n tile a lane
    assert get_kernel(name).geometry(dims).grid == (1, 1, 1)
    assert w_fetches(name, dims) == tile.warps_n * words * 3
    ptx, count = re.subn(r"(cp\.async\.ca\.shared\.global [^;]*, 4), %p\d+;", r"\1;", get_kernel(name).emit())
    assert count == words * tile.stages  # the prologue's stages - 1 and the loop's
    with pytest.raises(EmulatorError) as info:
        w_fetches(name, dims, ptx)
    assert info.value.kind == "out_of_bounds"
    ptx, count = re.subn(r"@%p\d+ (cp\.async\.ca\.shared\.global)", r"\1", get_kernel(name).emit())
    assert count == (0 if tile.warps_m == 1 else words * tile.stages)
    if count:  # every warp row fetching: the rows write the same slots, a race the emulator stops
        with pytest.raises(EmulatorError) as info:
            w_fetches(name, dims, ptx)
        assert info.value.kind == "race"


@pytest.mark.parametrize("name", per_kernel(TERNARY))
def test_w_loads_read_whole_sectors(name):
    """At the HSLM ffn sizes (a contraction of 729 or 243, the other side 243 or 729) every
    W request reads 128 bytes in 4 whole 32-byte sectors: planes put a chunk's words of
    neighbouring columns side by side (in the packed order a column's 16 bytes of a chunk
    sat in a sector of their own, half of it unused)."""
    dims = gemm_dims(name, rows=tile_of(name).m, cols=243, contraction=729)
    got, want, loads = w_loads(name, dims)
    assert np.array_equal(got, want)
    requests = sum(a.requests for a in loads)
    assert requests > 0 and sum(a.bytes_used for a in loads) == 128 * requests
    assert sum(a.sectors for a in loads) == 4 * requests


@pytest.mark.parametrize("name", per_kernel(TERNARY))
def test_w_sectors_count_a_fetch_that_straddles_them(name):
    """Negative for the test above: tile 0's word read 8 bytes further on (its pairs of
    columns then straddle sector boundaries; tile 1's words follow, so it stays inside the
    planes) makes that request 8 sectors for 128 bytes (one request of each lane's n_tiles)."""
    ptx, count = re.subn(W_FETCH + r"\]", r"\1+8]", get_kernel(name).emit())
    assert count == get_kernel(name).stages  # the prologue's stages - 1, the loop's
    _, _, loads = w_loads(name, gemm_dims(name, rows=tile_of(name).m, cols=243, contraction=729), ptx)
    requests = sum(a.requests for a in loads)
    assert sum(a.sectors for a in loads) == 4 * requests + 4 * (requests // tile_of(name).n_tiles)
