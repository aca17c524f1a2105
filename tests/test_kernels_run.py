"""The emitted PTX, run on the CPU emulator, equals the integer reference exactly,
including every tail case; and the same check fails on planted kernel bugs."""
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from kernelcases import per_kernel

from kernels.launch import LaunchError, launch
from kernels.registry import KERNELS, get_kernel
from kernels.spec import Dims
from pipeline.ptxemu import EmulatorError, Module

TAILS = [Dims(1, 1, 1), Dims(1, 17, 3), Dims(5, 16, 8), Dims(33, 31, 9), Dims(65, 64, 33), Dims(17, 129, 40)]


def run(name, dims, ptx=None, seed=0):
    spec = get_kernel(name)
    fn = Module(code=ptx or spec.emit()).get_function(name)
    inputs = spec.make_inputs(dims, np.random.default_rng(seed))
    return launch(spec, fn, dims, inputs), spec.reference(dims, inputs)


@pytest.mark.parametrize("dims", TAILS, ids=lambda d: "x".join(map(str, d)))
@pytest.mark.parametrize("name", per_kernel())
def test_exact_on_tail_shapes(name, dims):
    got, want = run(name, dims)
    assert got.shape == want.shape and got.dtype == np.int32
    assert np.array_equal(got, want)


@pytest.mark.parametrize("name", per_kernel())
@settings(max_examples=12, deadline=None)
@given(R=st.integers(1, 70), K=st.integers(1, 90), N=st.integers(1, 70), seed=st.integers(0, 9))
def test_exact_for_any_shape(name, R, K, N, seed):
    got, want = run(name, Dims(R, K, N), seed=seed)
    assert np.array_equal(got, want)


PLANTED = {
    # decode table with +1 and -1 swapped: wrong values, found as mismatches
    "ternary_fwd_s8": ("0xff0100;", "0x1ff00;", "mismatch"),
    # the barrier after the shared store removed: a race the emulator reports
    "hslm_dx_s8": ("st.shared.v4.b32", None, "race"),
    # a k-tail predicate dropped: the tail read runs off the end of the buffer
    "hslm_dw_s8": (r"@%p\d+ (ld\.global\.u8)", r"\1", "out_of_bounds"),
}


@pytest.mark.parametrize("name", per_kernel())
def test_planted_bug_is_caught(name):
    old, new, expect = PLANTED[name]
    ptx = KERNELS[name].emit()
    if new is None:  # drop the bar.sync that follows the first occurrence of `old`
        head, tail = ptx.split(old, 1)
        ptx = head + old + tail.replace("bar.sync 0;", "", 1)
    else:
        ptx = re.sub(old, new, ptx, count=1)
    assert ptx != KERNELS[name].emit()
    if expect == "mismatch":
        got, want = run(name, Dims(9, 40, 12), ptx=ptx)
        assert np.count_nonzero(got != want) > 0
    else:
        with pytest.raises(EmulatorError) as info:
            run(name, Dims(9, 40, 12), ptx=ptx)
        assert info.value.kind == expect


@pytest.mark.kernel("hslm_dw_s8")
def test_dw_refuses_rows_past_the_int32_bound():
    spec = get_kernel("hslm_dw_s8")
    with pytest.raises(LaunchError, match="R=131072 is over 131071"):
        launch(spec, lambda *a, **k: None, Dims(131072, 1, 1), {})


@pytest.mark.kernel("ternary_fwd_s8")
def test_launch_refuses_a_grid_cuda_cannot_run():
    spec = get_kernel("ternary_fwd_s8")
    launch(spec, lambda *a, **k: None, Dims(65535 * 64, 1, 1), {  # the largest R that fits
        "x": np.zeros((65535 * 64, 1), np.int8), "w": np.zeros((1, 1), np.uint32)})
    with pytest.raises(LaunchError, match=r"needs grid\.y=65536, over CUDA's 65535"):
        launch(spec, lambda *a, **k: None, Dims(65535 * 64 + 1, 1, 1), {})


@pytest.mark.parametrize("name", per_kernel())
def test_launch_refuses_mismatched_inputs(name):
    spec = get_kernel(name)
    dims = Dims(4, 16, 8)
    inputs = spec.make_inputs(dims, np.random.default_rng(0))
    key = next(iter(inputs))
    inputs[key] = inputs[key][:1]
    with pytest.raises(LaunchError, match=f"input '{key}' is"):
        launch(spec, lambda *a, **k: None, dims, inputs)
