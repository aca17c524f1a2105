"""hslm_ptx.runtime.launch refuses bad inputs with one line, reads strided inputs as the caller
meant, and pre-fills the output with poison so a store the kernel skips shows."""
import re

import numpy as np
import pytest
from kernelcases import per_kernel

from hslm_ptx.runtime.launch import OUTPUT_POISON, LaunchError, kernel_args, launch
from hslm_ptx.kernel.pitch import KernelLayout, WPlanes, kernel_buffer
from hslm_ptx.emu import Module
from hslm_ptx.catalog.registry import KERNELS, get_kernel
from hslm_ptx.kernel.spec import Dims
from hslm_ptx.formats import planes
from hslm_ptx.formats.ternary import pack, packed_shape

DIMS = Dims(5, 20, 6)  # K = 20: the last word of each column holds 12 padding codes
WEIGHT_KERNELS = ("hslm_fwd_s8", "hslm_dx_s8")
# the int32 GEMMs: caller-layout int8 operands, one int32 output (the float-output and
# step kernels read buffers their own producers lay out; tests/test_step_kernels.py and
# tests/test_fused_epilogue.py cover their layouts and poison)
INT32_GEMMS = [name for name, spec in KERNELS.items() if spec.is_gemm and spec.output.dtype == "int32"]


def inputs_for(name, dims=DIMS, seed=0):
    return get_kernel(name).make_inputs(dims, np.random.default_rng(seed))


def emulated(name, dims, inputs):
    spec = get_kernel(name)
    return launch(spec, Module(code=spec.emit()).get_function(name), dims, inputs)


def never_called(*args, **kwargs):
    raise AssertionError("the kernel ran on an input launch should have refused")


# ---- packed W: code 3 and padding ------------------------------------------------

@pytest.mark.parametrize("name", WEIGHT_KERNELS)
def test_code_3_is_refused_at_launch(name):
    inputs = inputs_for(name)
    inputs["w"][4, 0] |= np.uint32(3 << 14)  # column 4, in-feature 7
    inputs["w"][2, 1] |= np.uint32(3 << 2)  # column 2, in-feature 17: the first in column order
    with pytest.raises(LaunchError) as info:
        launch(get_kernel(name), never_called, DIMS, inputs)
    assert str(info.value) == (
        f"{name}: input 'w': packed weights: code 3 at column 2, in-feature 17 (word 1, bits 2-3) "
        "is not allowed; the packer never writes it: re-pack the weights (hslm_ptx.formats.ternary.pack)")


@pytest.mark.parametrize("name", WEIGHT_KERNELS)
def test_nonzero_padding_is_refused_at_launch(name):
    inputs = inputs_for(name)
    inputs["w"][3, 1] |= np.uint32(1 << 8)  # column 3, word 1, code 4: in-feature 20 = K
    with pytest.raises(LaunchError, match=r"input 'w': packed weights: padding code at column 3, "
                                          r"in-feature 20 \(word 1, bits 8-9\).*codes past K=20 must be 0"):
        launch(get_kernel(name), never_called, DIMS, inputs)


@pytest.mark.parametrize("name", WEIGHT_KERNELS)
def test_valid_codes_pass_the_check(name):
    inputs = inputs_for(name)
    w = inputs["w"]
    w[3, 1] = (w[3, 1] & ~np.uint32(3 << 6)) | np.uint32(1 << 6)  # in-feature 19 = K - 1: a real code
    calls = []
    launch(get_kernel(name), lambda *a, **k: calls.append(a), DIMS, inputs)
    assert len(calls) == 1


def test_unpacked_int8_weights_are_told_the_packed_shape():
    dims = Dims(4, 40, 8)
    inputs = {"x": np.zeros((4, 40), np.int8), "w": np.ones((40, 8), np.int8)}
    with pytest.raises(LaunchError) as info:
        launch(get_kernel("hslm_fwd_s8"), never_called, dims, inputs)
    assert packed_shape(40, 8) == (8, 3)
    assert str(info.value) == (
        "hslm_fwd_s8: input 'w' is int8(40, 8), expected uint32(8, 3) for R=4 K=40 N=8; "
        "pack the K x N ternary matrix with hslm_ptx.formats.ternary.pack(w)")


@pytest.mark.parametrize("dims", [Dims(0, 16, 8), Dims(4, 0, 8), Dims(4, 16, 0)])
def test_empty_problems_are_refused(dims):
    with pytest.raises(LaunchError, match=r"R, K, N must be >= 1.*skip the launch"):
        launch(get_kernel("hslm_fwd_s8"), never_called, dims, {})


@pytest.mark.parametrize("shape", [(20,), (1, 5, 20)])
def test_wrong_rank_activations_are_refused(shape):
    inputs = inputs_for("hslm_fwd_s8")
    inputs["x"] = np.zeros(shape, np.int8)
    with pytest.raises(LaunchError, match=re.escape(f"input 'x' is int8{shape}, expected int8(5, 20)")):
        launch(get_kernel("hslm_fwd_s8"), never_called, DIMS, inputs)


# ---- strided inputs are read as the caller means them ----------------------------

@pytest.mark.parametrize("name", per_kernel(INT32_GEMMS))
def test_fortran_ordered_and_transposed_inputs_give_the_c_order_result(name):
    spec = get_kernel(name)
    dims = Dims(9, 40, 24)
    inputs = inputs_for(name, dims, seed=4)
    want = spec.reference(dims, inputs)
    fortran = {k: np.asfortranarray(v) for k, v in inputs.items()}
    transposed = {k: np.ascontiguousarray(v.T).T for k, v in inputs.items()}  # a .T view of a C array
    assert not transposed["x" if "x" in inputs else "dy"].flags.c_contiguous
    assert np.array_equal(emulated(name, dims, fortran), want)
    assert np.array_equal(emulated(name, dims, transposed), want)
    assert all(not v.flags.c_contiguous for v in fortran.values() if v.shape[0] > 1 and v.shape[1] > 1)


@pytest.mark.parametrize("make", [
    lambda shape: np.asfortranarray(np.zeros(shape, np.int32)),               # strided
    lambda shape: np.zeros((shape[0], shape[1] - 8), np.int32),               # not at the kernel's pitch
    lambda shape: np.zeros(shape[0] * shape[1] + 1, np.int32)[1:].reshape(shape),  # 4 bytes off 16
], ids=["fortran", "unpitched", "misaligned"])
def test_an_output_not_in_the_kernels_layout_is_refused(make):
    """The kernel stores whole 16-byte vectors at its own row pitch: an output buffer
    handed to kernel_args must be exactly that, else one line says what it needs."""
    spec = get_kernel("hslm_dw_s8")
    dims = Dims(4, 16, 8)
    assert spec.output.layout.shape(dims) == (8, 32)  # 16 columns pitched to a 32-word line
    with pytest.raises(LaunchError, match=r"output 'dw' is .*expected a C-contiguous, 16-byte aligned int32\(8, 32\)"):
        kernel_args(spec, dims, make(spec.output.layout.shape(dims)), inputs_for("hslm_dw_s8", dims))
    assert len(kernel_args(spec, dims, np.zeros((8, 32), np.int32), inputs_for("hslm_dw_s8", dims))) == len(spec.params)


def test_launch_returns_the_logical_view_of_the_pitched_rows():
    spec = get_kernel("hslm_fwd_s8")
    dims = Dims(3, 16, 5)
    written = []

    def fills_rows(grid, block, args, shared_mem=0):
        args[0][...] = np.arange(args[0].size, dtype=np.int32).reshape(args[0].shape)
        written.append(args[0].shape)

    got = launch(spec, fills_rows, dims, inputs_for("hslm_fwd_s8", dims))
    assert written == [(3, 32)] and got.shape == (3, 5)
    assert np.array_equal(got, np.arange(96, dtype=np.int32).reshape(3, 32)[:, :5])


# ---- poison: a store the kernel never makes shows --------------------------------

@pytest.mark.parametrize("name", per_kernel(INT32_GEMMS))
def test_a_skipped_store_shows_where_the_answer_is_zero(name):
    spec = get_kernel(name)
    dims = Dims(4, 16, 8)
    inputs = {k: np.zeros_like(v) for k, v in inputs_for(name, dims).items()}  # every answer is 0

    def skips_element_0(grid, block, args, shared_mem=0):
        buffers = [p for p in spec.params[1:] if not p.is_scalar]
        out = spec.reference(dims, {p.name: p.layout.view(a, dims) for p, a in zip(buffers, args[1:])})
        stored = np.ones(out.shape, bool)
        stored[0, 0] = False  # element (0, 0) is never stored
        spec.output.layout.view(args[0], dims)[stored] = out[stored]

    got = launch(spec, skips_element_0, dims, inputs)
    want = spec.reference(dims, inputs)
    assert want[0, 0] == 0 and got[0, 0] == OUTPUT_POISON
    assert np.count_nonzero(got != want) == 1


# ---- buffers marked as already in the kernel's layout ----------------------------

def marked(name, dims, inputs):
    """``inputs`` with every pitched one written into a marked kernel_buffer, W in marked planes."""
    params = {p.name: p for p in get_kernel(name).params}
    out = dict(inputs)
    for key, value in inputs.items():
        if isinstance(params[key].layout, WPlanes):  # planes permute the codes: made, not written into
            out[key] = KernelLayout(params[key].layout.into(value, dims))
        else:
            out[key], view = kernel_buffer(params[key], dims, np)
            view[...] = value
    return out


def captured(name, dims, inputs):
    """The buffer arguments launch hands the kernel, by parameter name."""
    seen = {}
    spec = get_kernel(name)
    launch(spec, lambda grid, block, args, shared_mem=0: seen.update(zip((p.name for p in spec.params), args)),
           dims, inputs)
    return seen


@pytest.mark.parametrize("name", per_kernel(INT32_GEMMS))
def test_a_marked_buffer_is_passed_as_it_is_and_gives_the_logical_result(name):
    spec = get_kernel(name)
    inputs = inputs_for(name, seed=6)
    ready = marked(name, DIMS, inputs)
    seen = captured(name, DIMS, ready)
    for key, value in ready.items():
        if isinstance(value, KernelLayout):
            assert seen[key] is value.array  # no copy, not even a C-order one
            assert seen[key].shape != inputs[key].shape  # DIMS puts every operand off its pitch
    assert np.array_equal(emulated(name, DIMS, ready), spec.reference(DIMS, inputs))
    # negative: unmarked, launch makes its own buffer (the copy the mark avoids)
    unmarked = captured(name, DIMS, inputs)
    assert all(unmarked[k] is not inputs[k] for k, v in ready.items() if isinstance(v, KernelLayout))


def test_the_mark_decides_the_layout_where_the_shapes_coincide():
    """dW at R = K = N = 16: Xq (R x K) and Xq^T at pitch(R) (K x 16) are both 16 x 16, so
    only the mark tells launch which one it was given."""
    name, dims = "hslm_dw_s8", Dims(16, 16, 16)
    spec = get_kernel(name)
    inputs = inputs_for(name, dims, seed=7)
    want = spec.reference(dims, inputs)
    ready = {k: KernelLayout(np.ascontiguousarray(v.T)) for k, v in inputs.items()}
    assert all(v.shape == ready[k].array.shape for k, v in inputs.items())
    assert np.array_equal(emulated(name, dims, inputs), want)  # unmarked: logical, transposed by launch
    assert np.array_equal(emulated(name, dims, ready), want)  # marked: the kernel's layout, as is
    # negative: the logical buffers marked as the kernel's layout are read untransposed
    assert not np.array_equal(emulated(name, dims, {k: KernelLayout(v) for k, v in inputs.items()}), want)


def _fwd_x(buf):
    inputs = inputs_for("hslm_fwd_s8")
    inputs["x"] = KernelLayout(buf)
    return inputs


BAD_MARKED = [  # DIMS: R=5 K=20, so the forward kernel reads x as 5 x pitch(20) = 5 x 32
    ("the logical shape", np.zeros((5, 20), np.int8), "is int8(5, 20), expected"),
    ("another dtype", np.zeros((5, 32), np.int16), "is int16(5, 32), expected"),
    ("Fortran order", np.asfortranarray(np.zeros((5, 32), np.int8)), "is int8(5, 32), not C-contiguous, expected"),
    ("a column slice", np.zeros((5, 48), np.int8)[:, :32], "is int8(5, 32), not C-contiguous, expected"),
]


@pytest.mark.parametrize("buf, problem", [pytest.param(b, p, id=i) for i, b, p in BAD_MARKED])
def test_a_marked_buffer_not_in_the_kernel_layout_is_refused_in_one_line(buf, problem):
    with pytest.raises(LaunchError) as info:
        launch(get_kernel("hslm_fwd_s8"), never_called, DIMS, _fwd_x(buf))
    assert str(info.value) == (
        f"hslm_fwd_s8: input 'x' (marked KernelLayout) {problem} a C-contiguous int8(5, 32), the kernel's "
        "layout for R=5 K=20 N=6; allocate it with hslm_ptx.kernel.pitch.kernel_buffer, or pass the logical layout unmarked")


@pytest.mark.parametrize("name", WEIGHT_KERNELS)
def test_marked_planes_are_still_scanned_for_code_3_and_padding(name):
    """W marked as already in planes is scanned as the packed buffer is: code 3, and
    (negative, the planes' own padding) a non-zero code in a column past N."""
    inputs = inputs_for(name)
    inputs["w"][1, 0] |= np.uint32(3 << 4)
    order = get_kernel(name).params[2].layout.order
    inputs["w"] = KernelLayout(order(inputs["w"], order.shape(DIMS)))
    with pytest.raises(LaunchError, match=rf"{name}: input 'w': packed weights: code 3 at column 1, in-feature 2 "):
        launch(get_kernel(name), never_called, DIMS, inputs)
    zeros = order(pack(np.zeros((DIMS.K, DIMS.N), np.int8)), order.shape(DIMS))
    k, c = (DIMS.N, 0) if order.transposed else (0, DIMS.N)  # W's column N, in-feature 0
    zeros[k // planes.CHUNK, planes.WORDS * c + order.place[k % planes.CHUNK][0]] = 1 << order.place[k % planes.CHUNK][1]
    with pytest.raises(LaunchError, match=rf"padding code at column {DIMS.N}, in-feature 0 .*columns past N={DIMS.N} "):
        launch(get_kernel(name), never_called, DIMS, {**inputs_for(name), "w": KernelLayout(zeros)})


@pytest.mark.parametrize("name", WEIGHT_KERNELS)
def test_packed_w_is_read_in_planes(name):
    """Launch hands the kernel W in planes (one copy of the packed words); marked planes
    go as they are. Negative: the packed buffer marked as planes has the wrong shape."""
    inputs = inputs_for(name)
    seen = captured(name, DIMS, inputs)
    order = get_kernel(name).params[2].layout.order
    assert order is (planes.FRAGMENTS if name == "hslm_fwd_s8" else planes.FRAGMENTS_T)  # dX reads W^T
    assert np.array_equal(seen["w"], order(inputs["w"], order.shape(DIMS)))
    with pytest.raises(LaunchError, match=rf"input 'w' \(marked KernelLayout\) is uint32\(6, 2\), expected a "
                                          rf"C-contiguous uint32\(2, 512\)"):
        launch(get_kernel(name), never_called, DIMS, {**inputs, "w": KernelLayout(inputs["w"])})
