"""The layer step's orchestration (hslm_ptx.step.launches) on the recording stand-in, and the
stand-in itself: what one step launches, synchronizes, copies, allocates and moves.

The step kernels' specs are declared in their published parameter lists
(tests/stepcases.py, :func:`standin_specs`), installed in the registry for a test, so the real
``prepare_weight`` / ``forward`` / ``backward`` run unchanged on the recording runtime
whether or not the kernels are registered yet; where the real kernels are registered,
the same counts are checked on them too.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hslm_ptx.step import launches as layer_step
from hslm_ptx.formats import planes
from hslm_ptx.catalog import registry
from hslm_ptx.runtime import runtime_for
from hslm_ptx.runtime.emulator import POISON_BYTE, EmulatorRuntime
from hslm_ptx.runtime.recording import FakeBuffer, Recording, RecordingRuntime
from hslm_ptx.step.launches import (backward, forward, prepare_and_forward, prepare_weight, quant_dims,
                                    step_bytes_minimum, sum_partials, weight_dims)
from hslm_ptx.kernel.pitch import pitch
from hslm_ptx.kernel.spec import Dims, KernelSpec
from hslm_ptx.validate import LaunchError
from stepcases import FLOATS, HSLM, SUFFIXES, install_standins, standin_spec, standin_specs

STEP_LAUNCHES = 3  # |W|'s sums, the forward preparing W in its grid, 1 backward


def run_step(rt, R: int, K: int, N: int, dtype: str = "bfloat16", weight_dtype: str = "bfloat16",
             bias: bool = True, need_dx: bool = True):
    """One recorded training step: prepare W with the forward, backward with dX, dW and db."""
    w = rt.input((N, K), weight_dtype)
    x = rt.input((R, K), dtype)
    prepared, y, saved = prepare_and_forward(rt, x, w, rt.input((N,), dtype) if bias else None)
    dy = rt.input(tuple(y.shape), dtype)
    return y, backward(rt, dy, saved, prepared, need_dx=need_dx, need_dw=True, need_db=bias)


@pytest.fixture
def standins(monkeypatch):
    install_standins(monkeypatch)


# ---- the step on the recording runtime ------------------------------------------------------

@pytest.mark.parametrize("shape", HSLM)
def test_hslm_step_meets_its_targets(standins, shape):
    R, K, N = HSLM[shape]
    rt = RecordingRuntime()
    y, (dx, dw, db) = run_step(rt, R, K, N)
    rec = rt.recording
    assert [launch.kernel for launch in rec.launches] == [
        "hslm_wsum_bf16", "hslm_fwdw_bf16_bf16", "hslm_bwd_bf16_bf16"]
    assert (rec.host_syncs, rec.h2d_copies, rec.foreign_allocations) == ([], [], [])
    minimum = step_bytes_minimum(R, K, N, "bfloat16", "bfloat16", bias=True)
    assert minimum <= rec.bytes_moved <= 3 * minimum
    assert (y.shape, dx.shape, dw.shape, db.shape) == ((R, N), (R, K), (N, K), (N,))
    assert (y.dtype, dx.dtype, dw.dtype, db.dtype) == ("bfloat16", "bfloat16", "bfloat16", "float32")


@pytest.mark.parametrize("shape", HSLM)
def test_hslm_step_on_the_registered_kernels_meets_its_targets(monkeypatch, shape):
    """The same step where the real specs exist (stand-ins only for kernels not registered)."""
    install_standins(monkeypatch, keep_registered=True)
    R, K, N = HSLM[shape]
    rt = RecordingRuntime()
    run_step(rt, R, K, N)  # the first step zero-fills what a split-K kernel keeps, once
    extra = [x.kernel for x in rt.recording.launches if not x.kernel.startswith("hslm_")]
    assert extra == ["<not a step kernel: zero fill>"] * (len(rt.recording.launches) - STEP_LAUNCHES)
    rt.recording = Recording()
    run_step(rt, R, K, N)
    rec = rt.recording
    assert len(rec.launches) == STEP_LAUNCHES and rec.allocations == 11  # every output and scratch buffer
    assert (rec.host_syncs, rec.h2d_copies, rec.foreign_allocations) == ([], [], [])
    minimum = step_bytes_minimum(R, K, N, "bfloat16", "bfloat16", bias=True)
    assert minimum <= rec.bytes_moved <= 3 * minimum
    fwd = layer_step.pick("hslm_fwdw_bf16_bf16", Dims(R, K, N))
    assert rec.launches[1].kernel == fwd.name and rec.launches[1].grid == fwd.geometry(Dims(R, K, N)).grid


def test_a_split_is_picked_only_where_it_pays():
    """dW at R = 1782 splits (the rule scores the split family lower); at R = 27 nothing does
    but forward of ffn_down and dX of ffn_up, where the split family's own pick splits 6 ways."""
    if "hslm_dw_splitk_bf16" not in registry.FAMILIES:
        pytest.skip("no split-K families registered")
    splits = {shape: [layer_step.pick((f"hslm_{p}_bf16", f"hslm_{p}_splitk_bf16"), Dims(*HSLM[shape])).name
                      for p in ("fwd", "dx", "dw")] for shape in HSLM}
    split = {shape: [("_splitk_" in name) for name in names] for shape, names in splits.items()}
    assert split["attn_r1782"] == split["ffn_up_r1782"] == split["ffn_down_r1782"] == [False, False, True]
    assert split["ffn_down_r27"] == [True, False, False] and split["ffn_up_r27"] == [False, True, False]
    assert split["attn_r27"] == [False, False, False]


def test_the_new_weight_forward_is_one_grid_where_the_rule_scores_it_no_higher():
    """bf16 at every HSLM shape: hslm_fwdw after the |W| sums; at K = N = 4096, R = 8192,
    where every CTA along M would read W's floats again (64 row tiles), the preparation and
    the forward on its planes."""
    assert {shape: layer_step.forward_launches(Dims(*HSLM[shape]), "bfloat16", "bfloat16") for shape in HSLM} == {
        shape: 1 for shape in HSLM}
    big = Dims(8192, 4096, 4096)
    assert layer_step.forward_launches(big, "bfloat16", "bfloat16") == 2
    assert layer_step.pick("hslm_fwdw_bf16_bf16", big).cost(big) > layer_step.pick("hslm_fwdx_bf16", big).cost(big)
    rt = RecordingRuntime()
    prepare_and_forward(rt, rt.input((8192, 4096), "bfloat16"), rt.input((4096, 4096), "bfloat16"))
    step = [x.kernel for x in rt.recording.launches if x.kernel.startswith("hslm_")]  # past the zero fills
    assert step[:2] == ["hslm_wsum_bf16", "hslm_wprep_bf16"] and step[2].startswith("hslm_fwdx_bf16")


def test_the_backward_is_one_launch_where_the_rule_scores_it_no_higher():
    """bf16 at every HSLM shape: one launch (hslm_bwd); at K = N = 4096, where each of its CTAs
    would read dY's floats again (32 CTAs along the other axis), the two launches of codes."""
    assert {shape: layer_step.backward_launches(Dims(*HSLM[shape]), "bfloat16", "bfloat16") for shape in HSLM} == {
        shape: 1 for shape in HSLM}
    assert layer_step.backward_launches(Dims(8192, 4096, 4096), "bfloat16", "bfloat16") == 2
    one = layer_step.pick("hslm_bwd_bf16_bf16", Dims(8192, 4096, 4096))
    two = layer_step.pick("hslm_grads_bf16_bf16", Dims(8192, 4096, 4096))
    assert one.cost(Dims(8192, 4096, 4096)) > two.cost(Dims(8192, 4096, 4096))


def test_geometry_and_bytes_come_from_the_specs(standins):
    rt = RecordingRuntime()
    run_step(rt, 27, 243, 729)
    by_name = {launch.kernel: launch for launch in rt.recording.launches}
    fwd = registry.KERNELS["hslm_fwdw_bf16_bf16"]
    assert by_name["hslm_fwdw_bf16_bf16"].grid == fwd.geometry(Dims(27, 243, 729)).grid
    first = by_name["hslm_wsum_bf16"]  # |W|'s partial sums
    assert first.grid == (sum_partials(243 * 729), 1, 1) and first.block == (256, 1, 1)
    # forward reads x, W's floats, their partial sums and the bias; writes y, x's column codes,
    # scales and sums, beta and both plane sets
    assert dict((n, b) for n, b, _ in by_name["hslm_fwdw_bf16_bf16"].buffers) == {
        "y": 27 * 729 * 2, "x": 27 * 243 * 2, "w": 729 * 243 * 2, "w_partials": sum_partials(243 * 729) * 4,
        "bias": 729 * 2, "codes_t": 243 * pitch(27), "scales": 243 * 4, "sums": 243 * 4,
        "planes": math.prod(planes.FRAGMENTS.shape(Dims(27, 243, 729))) * 4,
        "planes_t": math.prod(planes.FRAGMENTS_T.shape(Dims(27, 243, 729))) * 4, "beta": 4}
    # the backward reads dY itself (no launch quantized it), the planes of W^T, beta, x's codes and scales
    assert dict((n, b) for n, b, _ in by_name["hslm_bwd_bf16_bf16"].buffers) == {
        "dx": 27 * 243 * 2, "dy": 27 * 729 * 2, "w": math.prod(planes.FRAGMENTS_T.shape(Dims(27, 243, 729))) * 4,
        "beta": 4, "dw": 729 * 243 * 2, "x_t": 243 * pitch(27), "u": 243 * 4, "db": 729 * 4}
    assert [n for n, _, written in by_name["hslm_bwd_bf16_bf16"].buffers if written] == ["dx", "dw", "db"]
    assert "hslm_quant_bf16" not in by_name  # dY is quantized by the products that read it


def test_parameter_order_is_the_specs(monkeypatch):
    """Reorder forward's parameters: the arguments follow, nothing in the step changes."""
    specs = standin_specs()
    fwd = next(s for s in specs if s.name == "hslm_fwdq_f32")
    reordered = fwd.params[::-1]
    specs = [s if s is not fwd else standin_spec(fwd.name, reordered, fwd.geometry, fwd.outputs) for s in specs]
    install_standins(monkeypatch, specs)
    seen = {}

    class Capturing(RecordingRuntime):
        def run(self, spec, geometry, args, buffers):
            seen[spec.name] = args
            super().run(spec, geometry, args, buffers)

    rt = Capturing()
    prepared = prepare_weight(rt, rt.input((24, 40), "float32"))
    forward(rt, rt.input((5, 40), "float32"), prepared, None, keep_columns=False)
    args = seen["hslm_fwdq_f32"]
    assert [type(a).__name__ for a in args[:6]] == ["uint32"] * 5 + ["FakeBuffer"]
    assert [int(a) for a in args[:5]] == [0, 40, 24, 40, 5]  # has_bias, ldx, N, K, R
    assert args[-1].shape == (5, 24) and args[-2].shape == (5, 40)  # y, then x


def test_no_bias_is_neither_read_nor_counted(standins):
    rt = RecordingRuntime()
    run_step(rt, 27, 243, 243, bias=False)
    fwd = next(launch for launch in rt.recording.launches if launch.kernel == "hslm_fwdw_bf16_bf16")
    assert "bias" not in [n for n, _, _ in fwd.buffers]
    assert len(rt.recording.launches) == STEP_LAUNCHES


def test_backward_launches_only_what_is_asked(standins):
    rt = RecordingRuntime()
    prepared = prepare_weight(rt, rt.input((8, 16), "float32"))
    _, saved = forward(rt, rt.input((4, 16), "float32"), prepared)
    before = len(rt.recording.launches)
    dx, dw, db = backward(rt, rt.input((4, 8), "float32"), saved, prepared, need_dx=False, need_dw=False, need_db=True)
    assert (dx, dw) == (None, None) and db.shape == (8,)
    assert [launch.kernel for launch in rt.recording.launches[before:]] == ["hslm_qcols_f32"]
    before = len(rt.recording.launches)
    dx, dw, db = backward(rt, rt.input((4, 8), "float32"), saved, prepared, need_dx=True, need_dw=False, need_db=False)
    assert dw is None and db is None and dx.shape == (4, 16)
    assert [launch.kernel for launch in rt.recording.launches[before:]] == ["hslm_qrows_f32", "hslm_dx_f32"]
    before = len(rt.recording.launches)
    dx, dw, db = backward(rt, rt.input((4, 8), "float32"), saved, prepared, need_dx=True, need_dw=False, need_db=True)
    assert dw is None and dx.shape == (4, 16) and db.shape == (8,)
    assert [launch.kernel for launch in rt.recording.launches[before:]] == ["hslm_quant_f32", "hslm_dx_f32"]


def test_preparing_with_the_forward_is_two_launches(standins):
    """prepare_and_forward: |W|'s sums, then one grid for the forward and the preparation,
    where prepare_weight + forward take three launches."""
    apart, fused = RecordingRuntime(), RecordingRuntime()
    forward(apart, apart.input((5, 40), "float16"), prepare_weight(apart, apart.input((24, 40), "float32")))
    prepare_and_forward(fused, fused.input((5, 40), "float16"), fused.input((24, 40), "float32"))
    assert [launch.kernel for launch in fused.recording.launches] == ["hslm_wsum_f32", "hslm_fwdw_f16_f32"]
    assert [launch.kernel for launch in apart.recording.launches] == ["hslm_wsum_f32", "hslm_wprep_f32", "hslm_fwdx_f16"]
    assert fused.recording.bytes_moved < apart.recording.bytes_moved


def test_a_forward_without_dw_to_come_is_one_launch(standins):
    """Inference on a prepared weight: the GEMM quantizes x's rows itself, nothing is kept;
    it reads x, W's planes, beta and the bias, and writes y alone."""
    rt = RecordingRuntime()
    prepared = prepare_weight(rt, rt.input((8, 16), "float32"))
    before = len(rt.recording.launches)
    y, saved = forward(rt, rt.input((4, 16), "float32"), prepared, rt.input((8,), "float32"), keep_columns=False)
    assert saved is None and y.shape == (4, 8)
    launches = rt.recording.launches[before:]
    assert [launch.kernel for launch in launches] == ["hslm_fwdq_f32"]
    assert sorted((n, written) for n, _, written in launches[0].buffers) == [
        ("beta", False), ("bias", False), ("w", False), ("x", False), ("y", True)]
    _, unbiased = forward(rt, rt.input((4, 16), "float32"), prepared, keep_columns=False), rt.recording.launches[-1]
    assert "bias" not in [n for n, _, _ in unbiased.buffers]


def test_mixed_float_types_name_their_kernels(standins):
    rt = RecordingRuntime()
    run_step(rt, 3, 17, 5, dtype="float16", weight_dtype="float32")
    names = [launch.kernel for launch in rt.recording.launches]
    assert names[:2] == ["hslm_wsum_f32", "hslm_fwdw_f16_f32"] and names[-1] == "hslm_bwd_f16_f32"


@settings(max_examples=40, deadline=None)
@given(R=st.integers(1, 3000), K=st.integers(1, 900), N=st.integers(1, 900),
       dtype=st.sampled_from(sorted(FLOATS.values())), bias=st.booleans())
def test_every_shape_is_three_launches_and_at_least_the_minimum(R, K, N, dtype, bias):
    with pytest.MonkeyPatch.context() as mp:
        install_standins(mp)
        rt = RecordingRuntime()
        run_step(rt, R, K, N, dtype=dtype, weight_dtype=dtype, bias=bias)
    rec = rt.recording
    assert len(rec.launches) == STEP_LAUNCHES
    assert (len(rec.host_syncs), len(rec.h2d_copies), len(rec.foreign_allocations)) == (0, 0, 0)
    assert rec.bytes_moved >= step_bytes_minimum(R, K, N, dtype, dtype, bias)


# ---- negative: what the stand-in catches -------------------------------------------------------

def test_a_planted_host_sync_is_counted(standins, monkeypatch):
    real = layer_step._launch

    def checking(rt, family, *args, **kwargs):
        out = real(rt, family, *args, **kwargs)
        if family.startswith("hslm_bwd_") and bool(out["db"].any()):  # a value check: the host waits for the device
            pass
        return out

    monkeypatch.setattr(layer_step, "_launch", checking)
    rt = RecordingRuntime()
    run_step(rt, 27, 243, 243)
    assert len(rt.recording.host_syncs) == 1  # backward's db
    assert all(__file__ in where for where in rt.recording.host_syncs)
    assert len(rt.recording.launches) == STEP_LAUNCHES + 1  # and the .any() is a launch of its own


def test_a_planted_extra_launch_is_counted(standins, monkeypatch):
    real = layer_step._launch

    def twice(rt, family, *args, **kwargs):
        if family.startswith("hslm_bwd_"):
            real(rt, family, *args, **kwargs)
        return real(rt, family, *args, **kwargs)

    monkeypatch.setattr(layer_step, "_launch", twice)
    rt = RecordingRuntime()
    run_step(rt, 27, 243, 243)
    assert len(rt.recording.launches) == STEP_LAUNCHES + 1  # the backward run twice


def test_a_planted_foreign_op_is_a_launch_and_an_allocation(standins, monkeypatch):
    real = layer_step.prepare_weight

    def rescaled(rt, w):
        prepared = real(rt, w)
        return prepared._replace(beta=prepared.beta * 2)  # an elementwise op outside the step's kernels

    monkeypatch.setattr(layer_step, "prepare_weight", rescaled)
    rt = RecordingRuntime()
    layer_step.prepare_weight(rt, rt.input((8, 16), "float32"))
    rec = rt.recording
    assert rec.launches[-1].kernel == "<not a step kernel: mul>"
    assert len(rec.foreign_allocations) == 1 and rec.host_syncs == []


@pytest.mark.parametrize("touch", [
    lambda b: b.get(), lambda b: float(b[0]), lambda b: int(b[0]), lambda b: bool(b), lambda b: b.item(),
    lambda b: np.asarray(b), lambda b: b.tolist(), lambda b: [0, 1][b[0]], lambda b: b[b > 0],
])
def test_every_read_of_a_value_is_a_host_sync(touch):
    rt = RecordingRuntime()
    buf = rt.empty((4,), "float32")
    touch(buf)
    assert len(rt.recording.host_syncs) == 1


def test_metadata_is_free():
    rt = RecordingRuntime()
    buf = rt.empty((6, 32), "bfloat16")
    views = [buf[:, :20], buf.T, buf.reshape(-1), buf.reshape(3, 64), buf[2]]
    assert [v.shape for v in views] == [(6, 20), (32, 6), (192,), (3, 64), (32,)]
    assert (buf.nbytes, buf.size, buf.ndim, len(buf)) == (384, 192, 2, 6)
    rec = rt.recording
    assert (rec.launches, rec.host_syncs, rec.h2d_copies, rec.foreign_allocations, rec.allocations) == ([], [], [], [], 1)


def test_the_array_module_stand_in_sees_copies_and_allocations():
    rt = RecordingRuntime()
    rt.xp.zeros((4, 4), "float32")
    rt.xp.asarray(np.ones(3, np.float32))
    rt.xp.abs(rt.empty((2,), "float32"))
    buf = rt.empty((3,), "float32")
    buf[...] = np.zeros(3, np.float32)
    rec = rt.recording
    assert len(rec.foreign_allocations) == 3 and len(rec.h2d_copies) == 2
    assert [launch.kernel for launch in rec.launches] == [
        "<not a step kernel: fill>", "<not a step kernel: abs>", "<not a step kernel: assign>"]


def test_a_host_array_handed_to_a_kernel_is_a_copy(standins):
    rt = RecordingRuntime()
    prepare_weight(rt, np.zeros((8, 16), np.float32))
    assert len(rt.recording.h2d_copies) == 2 and len(rt.recording.foreign_allocations) == 2


# ---- refusals -------------------------------------------------------------------------------------

def test_a_missing_kernel_is_named(monkeypatch):
    monkeypatch.delitem(registry.FAMILIES, "hslm_wsum_f32", raising=False)
    rt = RecordingRuntime()
    with pytest.raises(LaunchError, match=r"hslm_wsum_f32.*hslm_ptx/catalog/registry.py") as info:
        prepare_weight(rt, rt.input((8, 16), "float32"))
    assert "\n" not in str(info.value)


def test_a_buffer_off_its_spec_is_refused(standins):
    rt = RecordingRuntime()
    prepared = prepare_weight(rt, rt.input((8, 16), "float32"))
    bad = prepared._replace(planes=rt.empty((1, 4), "uint32"))
    with pytest.raises(LaunchError, match=r"hslm_fwdx_f32: 'w' is uint32\(1, 4\), expected uint32\(2, 512\)"):
        forward(rt, rt.input((4, 16), "float32"), bad)


@pytest.mark.parametrize("x, message", [
    (("int64", (4, 16)), "forward: x is int64; the layer step reads float32, float16, bfloat16"),
    (("float32", (4, 15)), "forward: x has 15 columns, the weight has in_features=16"),
    (("float32", (16,)), r"forward: x has shape \(16,\), expected a non-empty 2-D array"),
])
def test_bad_inputs_are_one_line(standins, x, message):
    rt = RecordingRuntime()
    prepared = prepare_weight(rt, rt.input((8, 16), "float32"))
    with pytest.raises(LaunchError, match=message):
        forward(rt, rt.input(x[1], x[0]), prepared)


def test_a_batch_past_dws_row_bound_is_refused(monkeypatch):
    bounded = ("hslm_dw_f32", "hslm_bwd_f32_f32")  # dW alone, and dW with dX in one launch
    specs = [s if s.name not in bounded else KernelSpec(**{**s.__dict__, "max_rows": 8}) for s in standin_specs()]
    install_standins(monkeypatch, specs)
    rt = RecordingRuntime()
    prepared = prepare_weight(rt, rt.input((8, 16), "float32"))
    _, saved = forward(rt, rt.input((9, 16), "float32"), prepared)
    with pytest.raises(LaunchError, match="hslm_bwd_f32_f32: R=9 rows is over 8, where its int32 sums could"):
        backward(rt, rt.input((9, 8), "float32"), saved, prepared)
    with pytest.raises(LaunchError, match="hslm_dw_f32: R=9 rows is over 8, where its int32 sums could overflow"):
        backward(rt, rt.input((9, 8), "float32"), saved, prepared, need_dx=False)
    backward(rt, rt.input((8, 8), "float32"), forward(rt, rt.input((8, 16), "float32"), prepared)[1], prepared)


def test_a_strided_input_is_refused(standins):
    rt = EmulatorRuntime()
    with pytest.raises(LaunchError, match=r"hslm_wsum_f32: 'w' is a strided view float32\(8, 16\); pass a C-contiguous"):
        prepare_weight(rt, np.zeros((16, 8), np.float32).T)


def test_runtime_for_refuses_a_mismatch():
    assert isinstance(runtime_for("cpu", "emulator"), EmulatorRuntime)
    with pytest.raises(LaunchError, match="no runtime for device 'cpu' with backend 'cuda'"):
        runtime_for("cpu", "cuda")


def test_emulator_buffers_start_poisoned():
    buf = EmulatorRuntime().empty((3, 5), "bfloat16")
    assert buf.dtype == np.uint16 and (buf.view(np.uint8) == POISON_BYTE).all()
    assert EmulatorRuntime().dtype_of(buf) == "bfloat16"


def test_the_dims_the_step_declares_kernels_on():
    assert quant_dims(27, 243) == Dims(27, 243, 243) and weight_dims(729, 243) == Dims(1, 243, 729)
    assert [sum_partials(n) for n in (1, 4096, 4097)] == [1, 1, 2]


def test_fake_buffers_are_not_arrays():
    rt = RecordingRuntime()
    assert isinstance(rt.input((2, 2), "float32"), FakeBuffer) and rt.recording.allocations == 0


# ---- the real kernels on the emulator ---------------------------------------------------------------

STEP_FAMILIES = [f"hslm_{k}_{dt}" for k in ("wsum", "wprep", "qrows", "qcols", "quant", "fwd", "dx", "dw") for dt in SUFFIXES]


def _ternary_planes(t: np.ndarray, dims: Dims, order: planes.Planes) -> np.ndarray:
    from hslm_ptx.formats.ternary import pack

    return order(pack(t.T.astype(np.int8)), order.shape(dims))  # pack takes W as K x N


@pytest.mark.skipif("hslm_fwd_f32" not in registry.FAMILIES, reason="hslm_fwd_f32 is not registered")
def test_the_step_launcher_drives_a_real_gemm_on_the_emulator():
    """forward's fused GEMM through the step's own launch path (spec-driven arguments and
    geometry), on operands quantized with hslm_ptx.reference.stepmath: bit for bit its reference."""
    from hslm_ptx.reference import stepmath

    rng = np.random.default_rng(7)
    R, K, N = 5, 40, 24
    dims = Dims(R, K, N)
    x = rng.standard_normal((R, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    beta = stepmath.weight_scale(w)
    t = stepmath.ternary_codes(w, beta)
    s = stepmath.scales_of(stepmath.absmax(x, 1))
    rt = EmulatorRuntime()
    codes = rt.empty((R, pitch(K)), "int8")
    codes[:, :K] = stepmath.codes(x, s, 1)
    given = {"x": codes, "w": _ternary_planes(t, dims, planes.FRAGMENTS), "row_scales": s,
             "beta": np.array([beta], np.float32), "bias": bias}
    y = layer_step._launch(rt, "hslm_fwd_f32", dims, given, allocate=("y",),
                           scalars={"R": R, "K": K, "N": N, "ldx": pitch(K), "has_bias": 1})["y"]
    acc = stepmath.codes(x, s, 1).astype(np.int64) @ t.T.astype(np.int64)
    assert np.array_equal(y.view(np.uint32), stepmath.rescale_rows(acc, s, beta, bias).view(np.uint32))


@pytest.mark.skipif(not set(STEP_FAMILIES) <= set(registry.FAMILIES),
                    reason="the step's kernels are not all registered yet")
@pytest.mark.parametrize("dtype, weight_dtype", [("float32", "float32"), ("bfloat16", "bfloat16"),
                                                 ("float16", "float32")])
def test_a_whole_step_on_the_emulator_is_stepmath_bit_for_bit(dtype, weight_dtype):
    from hslm_ptx.formats import floats
    from hslm_ptx.reference import stepmath

    rng = np.random.default_rng(11)
    R, K, N = 19, 40, 24
    as_input = lambda a, t=dtype: floats.from_f32(a.astype(np.float32), t)  # noqa: E731
    x, bias, dy = (as_input(rng.standard_normal(shape)) for shape in ((R, K), (N,), (R, N)))
    w = as_input(rng.standard_normal((N, K)), weight_dtype)
    rt = runtime_for("cpu", "emulator")
    prepared = prepare_weight(rt, w)
    y, saved = forward(rt, x, prepared, bias)
    dx, dw, db = backward(rt, dy, saved, prepared, True, True, True)
    xf, bf, dyf = (floats.to_f32(a, dtype) for a in (x, bias, dy))
    wf = floats.to_f32(w, weight_dtype)
    beta = stepmath.weight_scale(wf)
    t = stepmath.ternary_codes(wf, beta).astype(np.int64)
    s, r = stepmath.scales_of(stepmath.absmax(xf, 1)), stepmath.scales_of(stepmath.absmax(dyf, 1))
    u, v = stepmath.scales_of(stepmath.absmax(xf, 0)), stepmath.scales_of(stepmath.absmax(dyf, 0))
    want_y = stepmath.rescale_rows(stepmath.codes(xf, s, 1).astype(np.int64) @ t.T, s, beta, bf)
    want_dx = stepmath.rescale_rows(stepmath.codes(dyf, r, 1).astype(np.int64) @ t, r, beta)
    want_dw = stepmath.rescale_cols(stepmath.codes(dyf, v, 0).astype(np.int64).T
                                    @ stepmath.codes(xf, u, 0).astype(np.int64), v, u)
    assert float(prepared.beta[0]) == beta
    inferred, _ = forward(rt, x, prepared, bias, keep_columns=False)  # one launch: x's rows quantized in the GEMM
    for got, want, kind in ((y, want_y, dtype), (inferred, want_y, dtype), (dx, want_dx, dtype),
                            (dw, want_dw, weight_dtype)):
        assert floats.same_values(got, floats.from_f32(want, kind), kind).all()
    assert np.array_equal(db, stepmath.column_sums(dyf))


@pytest.mark.skipif(not set(STEP_FAMILIES) <= set(registry.FAMILIES),
                    reason="the step's kernels are not all registered yet")
def test_a_nan_input_gives_nan_where_it_reaches_never_a_finite_wrong_answer():
    """No value is checked on the host, so a NaN in x must show: its row of y, its column of
    dW (u_i is NaN), nothing else; the rows of y without it are as without the NaN."""
    rng = np.random.default_rng(3)
    R, K, N = 9, 40, 24
    x, w = rng.standard_normal((R, K)).astype(np.float32), rng.standard_normal((N, K)).astype(np.float32)
    dy = rng.standard_normal((R, N)).astype(np.float32)
    rt = EmulatorRuntime()
    prepared = prepare_weight(rt, w)
    clean, _ = forward(rt, x, prepared)
    x[2, 5] = np.nan
    y, saved = forward(rt, x, prepared)
    _, dw, _ = backward(rt, dy, saved, prepared, need_dx=False, need_dw=True)
    assert np.isnan(y[2]).all() and not np.isnan(np.delete(y, 2, axis=0)).any()
    assert np.array_equal(np.delete(y, 2, axis=0), np.delete(clean, 2, axis=0))
    assert np.isnan(dw[:, 5]).all() and not np.isnan(np.delete(dw, 5, axis=1)).any()


@pytest.mark.skipif("hslm_fwd_splitk_f32" not in registry.FAMILIES or not set(STEP_FAMILIES) <= set(registry.FAMILIES),
                    reason="the split-K families are not registered")
def test_a_split_forward_keeps_its_workspace_zeroed_between_steps():
    """ffn_down at R = 27: forward splits 6 ways into a kept workspace; a second forward on
    the same runtime finds it zeroed and gives the same bits, which are stepmath's."""
    from hslm_ptx.reference import stepmath

    R, K, N = 27, 729, 243
    assert "_splitk_" in layer_step.pick(("hslm_fwd_f32", "hslm_fwd_splitk_f32"), Dims(R, K, N)).name
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((R, K)).astype(np.float32), rng.standard_normal((N, K)).astype(np.float32)
    rt = EmulatorRuntime()
    prepared = prepare_weight(rt, w)
    first, _ = forward(rt, x, prepared)
    second, _ = forward(rt, x, prepared)
    beta = stepmath.weight_scale(w)
    s = stepmath.scales_of(stepmath.absmax(x, 1))
    want = stepmath.rescale_rows(stepmath.codes(x, s, 1).astype(np.int64) @ stepmath.ternary_codes(w, beta).T, s, beta)
    assert np.array_equal(first.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(second.view(np.uint32), want.view(np.uint32))
    kept = rt.__dict__["_workspaces"]
    assert len(kept) == 2 and all(not buf.any() for buf in kept.values())


def test_the_grouped_backward_keeps_its_split_workspace_zeroed_between_steps():
    """ffn_up at R = 27: the backward's dX part splits 6 ways into its kept workspace (dW's
    part runs one split and is given none); a second backward finds it zeroed and gives
    the same bits, which are stepmath's."""
    from hslm_ptx.tile import grouped
    from hslm_ptx.reference import stepmath

    R, K, N = 27, 243, 729
    spec = layer_step.pick("hslm_grads_f32_f32", Dims(R, K, N))
    assert grouped.idle_workspace(spec, Dims(R, K, N)) == ("dw_partials", "dw_tickets")
    rng = np.random.default_rng(7)
    x, w, dy = (rng.standard_normal(shape).astype(np.float32) for shape in ((R, K), (N, K), (R, N)))
    rt = EmulatorRuntime()
    prepared = prepare_weight(rt, w)
    _, saved = forward(rt, x, prepared)
    before = set(rt.__dict__.get("_workspaces", {}))
    dxs = [backward(rt, dy, saved, prepared)[0] for _ in range(2)]
    beta = stepmath.weight_scale(w)
    r = stepmath.scales_of(stepmath.absmax(dy, 1))
    want = stepmath.rescale_rows(stepmath.codes(dy, r, 1).astype(np.int64) @ stepmath.ternary_codes(w, beta), r, beta)
    assert all(np.array_equal(dx.view(np.uint32), want.view(np.uint32)) for dx in dxs)
    kept = {key: buf for key, buf in rt.__dict__["_workspaces"].items() if key not in before}
    assert sorted(key[1] for key in kept) == ["dx_partials", "dx_tickets"] and all(not b.any() for b in kept.values())


# ---- on a GPU (skipped without CUDA torch and a CuPy device) -----------------------------------------

def _cuda_ready() -> bool:
    try:
        import torch
    except ImportError:
        return False
    from hslm_ptx.runtime.backends import gpu_available

    return torch.cuda.is_available() and gpu_available()


def _cuda_step(rt, tensors: dict, weight_dtype: str, dtype: str):
    """prepare + forward + backward on CuPy views of the tensors; the results as tensors."""
    prepared = prepare_weight(rt, rt.view(tensors["w"]))
    y, saved = forward(rt, rt.view(tensors["x"]), prepared, rt.view(tensors["bias"]))
    dx, dw, db = backward(rt, rt.view(tensors["dy"]), saved, prepared, True, True, True)
    return [rt.tensor(y, dtype), rt.tensor(dx, dtype), rt.tensor(dw, weight_dtype), rt.tensor(db, "float32")]


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_ready(), reason="needs CUDA torch and a CuPy device")
@pytest.mark.parametrize("R, K, N", [(19, 40, 24), (27, 729, 243)])  # the second splits forward
def test_the_cuda_runtime_gives_the_emulators_bits(R, K, N):
    import torch

    torch.manual_seed(1)
    tensors = {name: torch.randn(shape, dtype=torch.bfloat16) for name, shape in
               (("x", (R, K)), ("w", (N, K)), ("bias", (N,)), ("dy", (R, N)))}
    got = _cuda_step(runtime_for("cuda", "cuda"), {k: v.cuda() for k, v in tensors.items()}, "bfloat16", "bfloat16")
    torch.cuda.synchronize()
    rt = EmulatorRuntime()
    host = {k: v.view(torch.int16).numpy().view(np.uint16) for k, v in tensors.items()}
    prepared = prepare_weight(rt, host["w"])
    y, saved = forward(rt, host["x"], prepared, host["bias"])
    want = [y, *backward(rt, host["dy"], saved, prepared, True, True, True)]
    for g, w in zip(got, want):
        g = g.cpu()
        bits = g.view(torch.int16).numpy().view(np.uint16) if g.dtype == torch.bfloat16 else g.numpy()
        assert np.array_equal(bits.view(np.uint8), np.ascontiguousarray(w).view(np.uint8))


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_ready(), reason="needs CUDA torch and a CuPy device")
@pytest.mark.parametrize("R, K, N", [(27, 729, 243), (1782, 243, 729)])  # a split forward; a split dW
def test_a_cuda_step_is_captured_in_a_graph_and_replays_its_bits(R, K, N):
    """No host sync (capture would fail on one), and a replay on new inputs gives the bits an
    eager step gives on them."""
    import torch

    torch.manual_seed(2)
    make = lambda: {name: torch.randn(shape, dtype=torch.bfloat16, device="cuda")  # noqa: E731
                    for name, shape in (("x", (R, K)), ("w", (N, K)), ("bias", (N,)), ("dy", (R, N)))}
    static, fresh = make(), make()
    rt = runtime_for("cuda", "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _cuda_step(rt, static, "bfloat16", "bfloat16")  # warm-up: modules loaded, workspaces made
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = _cuda_step(rt, static, "bfloat16", "bfloat16")
    for name, tensor in fresh.items():
        static[name].copy_(tensor)
    graph.replay()
    eager = _cuda_step(rt, fresh, "bfloat16", "bfloat16")
    torch.cuda.synchronize()
    for replayed, direct in zip(outputs, eager):
        assert torch.equal(replayed.view(torch.int16) if replayed.dtype == torch.bfloat16 else replayed,
                           direct.view(torch.int16) if direct.dtype == torch.bfloat16 else direct)
