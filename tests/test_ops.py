"""The float ops (hslm_ptx/arrays.py) on the CPU: the real PTX through the emulator, checked
against an f64 reference with the bounds of tests/quantbounds.py.

Each bound is checked not vacuous: the observed error is > 0 and well under the bound,
and a wrong scale granularity (one scale per tensor) breaks it. Shapes stay small: the
emulator runs every thread in numpy.
"""
from __future__ import annotations

import numpy as np
import pytest
from quantbounds import assert_tight, check_bound, codes, data, dw_bound, dx_bound, fwd_bound

from hslm_ptx import arrays as array_ops
from hslm_ptx.kernel import pitch
from hslm_ptx.runtime.launch import launch
from hslm_ptx.catalog.registry import choose, get_kernel
from hslm_ptx.kernel.spec import Dims
from hslm_ptx.reference.quant import quantize_cols, quantize_rows, ternarize
from hslm_ptx.formats.ternary import pack, packed_shape, unpack
from hslm_ptx.validate import LaunchError, module_of


def dims_of(name: str, args) -> Dims:
    """The R, K, N scalars of a kernel's argument list (by parameter name)."""
    sizes = {p.name: int(a) for p, a in zip(get_kernel(name).params, args) if p.is_scalar}
    return Dims(sizes["R"], sizes["K"], sizes["N"])


def reference_fn(name: str, launches: list[Dims] | None = None):
    """A RawKernel-style callable that writes the kernel's integer reference (no PTX)."""
    spec = get_kernel(name)
    buffers = [p for p in spec.params if not p.is_scalar]

    def fn(grid, block, args, shared_mem=0):
        dims = dims_of(name, args)
        spec.output.layout.view(args[0], dims)[...] = spec.reference(
            dims, {p.name: p.layout.view(a, dims) for p, a in zip(buffers[1:], args[1:])})
        if launches is not None:
            launches.append(dims)

    return fn


SHAPES = [(19, 40, 24), (3, 17, 33)]  # K not a multiple of 16, R and N off the tile


@pytest.mark.kernel("hslm_fwd_s8")
@pytest.mark.parametrize("R,K,N", SHAPES)
def test_forward_inside_bound_on_emulator(R, K, N):
    x, _, t, beta = data(np.random.default_rng(R * K), R, K, N)
    w = pack(t)
    got = array_ops.forward(x, w, beta)  # numpy in: the PTX on the emulator
    ref = x @ (t * beta)
    assert got.shape == (R, N) and got.dtype == np.float64
    assert_tight(got, ref, fwd_bound(x, t, beta), np.abs(x) @ np.abs(t) * beta)
    assert np.array_equal(got, array_ops.forward(x, w, beta, fn=reference_fn("hslm_fwd_s8")))


@pytest.mark.kernel("hslm_dx_s8")
@pytest.mark.parametrize("R,K,N", SHAPES)
def test_grad_input_inside_bound_on_emulator(R, K, N):
    _, dy, t, beta = data(np.random.default_rng(R + K), R, K, N)
    w = pack(t)
    got = array_ops.grad_input(dy, w, beta, K)
    ref = dy @ (t * beta).T
    assert got.shape == (R, K)
    assert_tight(got, ref, dx_bound(dy, t, beta), np.abs(dy) @ np.abs(t).T * beta)
    assert np.array_equal(got, array_ops.grad_input(dy, w, beta, K, fn=reference_fn("hslm_dx_s8")))


@pytest.mark.kernel("hslm_dw_s8")
@pytest.mark.parametrize("R,K,N", SHAPES)
def test_grad_weight_inside_bound_on_emulator(R, K, N):
    x, dy, _, _ = data(np.random.default_rng(R * N), R, K, N)
    got = array_ops.grad_weight(x, dy)
    ref = x.T @ dy
    assert got.shape == (K, N)  # W's orientation, as pack takes it
    assert_tight(got, ref, dw_bound(x, dy), np.abs(x).T @ np.abs(dy))
    assert np.array_equal(got, array_ops.grad_weight(x, dy, fn=reference_fn("hslm_dw_s8")))


def test_float32_in_float32_out():
    x, _, t, beta = data(np.random.default_rng(0), 4, 16, 8)
    got = array_ops.forward(x.astype(np.float32), pack(t), beta, fn=reference_fn("hslm_fwd_s8"))
    assert got.dtype == np.float32


# ---- negatives: the bound check catches the wrong scale granularity ----------------

def test_per_tensor_scale_breaks_the_forward_bound():
    x, _, t, beta = data(np.random.default_rng(1), 19, 40, 24)
    s = np.abs(x).max() / 127  # one scale for the whole tensor: small rows quantize to ~0
    wrong = (codes(x, s) @ t) * s * beta
    inside, _, _ = check_bound(wrong, x @ (t * beta), fwd_bound(x, t, beta), np.abs(x) @ np.abs(t) * beta)
    assert not inside


def test_per_tensor_scale_breaks_the_dw_bound():
    x, dy, _, _ = data(np.random.default_rng(2), 37, 40, 24)
    u, v = np.abs(x).max() / 127, np.abs(dy).max() / 127
    wrong = (codes(x, u).T @ codes(dy, v)) * u * v
    inside, _, _ = check_bound(wrong, x.T @ dy, dw_bound(x, dy), np.abs(x).T @ np.abs(dy))
    assert not inside


# ---- the quantizer writes the kernel's layout: the same bytes, no launch-side copy ----

def emulated(family: str, seen: list | None = None):
    """The emulator running the configuration of ``family`` the rule picks for each launch's
    dims, keeping a copy of every buffer argument of every launch in ``seen``."""
    def fn(grid, block, args, shared_mem=0):
        if seen is not None:
            seen.append([a.copy() for a in args[1:] if isinstance(a, np.ndarray)])
        name = choose(family, dims_of(family, args)).name
        array_ops.kernel_function(name, np)(grid, block, args, shared_mem=shared_mem)

    return fn


def old_path(op: str, x, dy, w, beta, K, fn, chunk_rows=8):
    """The float ops as they were: logical int8 codes, copied into the kernel's layout by launch."""
    if op == "forward":
        (q, s), dims = quantize_rows(x), Dims(*x.shape, w.shape[0])
        return (launch(choose("hslm_fwd_s8", dims), fn, dims, {"x": q, "w": w}) * (s * beta)).astype(x.dtype)
    if op == "grad_input":
        (q, t), dims = quantize_rows(dy), Dims(dy.shape[0], K, dy.shape[1])
        return (launch(choose("hslm_dx_s8", dims), fn, dims, {"dy": q, "w": w}) * (t * beta)).astype(dy.dtype)
    (xq, u), (yq, v) = quantize_cols(x), quantize_cols(dy)
    chunks = [Dims(len(xq[r:r + chunk_rows]), K, dy.shape[1]) for r in range(0, x.shape[0], chunk_rows)]
    total = sum(launch(choose("hslm_dw_s8", d), fn, d,
                       {"x": xq[r:r + chunk_rows], "dy": yq[r:r + chunk_rows]}).astype(np.int64)
                for r, d in zip(range(0, x.shape[0], chunk_rows), chunks))
    return (total * (v.reshape(-1, 1) * u)).T


def new_path(op: str, x, dy, w, beta, K, fn, chunk_rows=8):
    if op == "forward":
        return array_ops.forward(x, w, beta, fn=fn)
    if op == "grad_input":
        return array_ops.grad_input(dy, w, beta, K, fn=fn)
    return array_ops.grad_weight(x, dy, chunk_rows=chunk_rows, fn=fn)


OPS = {"forward": "hslm_fwd_s8", "grad_input": "hslm_dx_s8", "grad_weight": "hslm_dw_s8"}


@pytest.mark.kernel(*OPS.values())
@pytest.mark.parametrize("op", list(OPS))
def test_ops_hand_the_kernel_the_bytes_the_old_copy_did_on_emulator(op):
    """Quantizing into the kernel's layout gives byte-identical kernel inputs (padding
    included) and a bit-identical result to quantizing logically and letting launch copy.
    R = 19 with chunks of 8 (dW): every chunk's transposed buffer is off its pitch."""
    R, K, N = 19, 40, 24
    x, dy, t, beta = data(np.random.default_rng(11), R, K, N)
    w = pack(t)
    old_args: list = []
    new_args: list = []
    old = old_path(op, x, dy, w, beta, K, emulated(OPS[op], old_args))
    new = new_path(op, x, dy, w, beta, K, emulated(OPS[op], new_args))
    assert len(new_args) == len(old_args) == (3 if op == "grad_weight" else 1)
    for a, b in zip(old_args, new_args):
        assert all(u.shape == v.shape and np.array_equal(u, v) for u, v in zip(a, b))
    assert new.dtype == old.dtype and np.array_equal(new, old)


@pytest.mark.parametrize("op", list(OPS))
def test_ops_make_no_launch_side_copy(op, monkeypatch):
    """The pitched copy (hslm_ptx.kernel.pitch.aligned_copy) never runs under the float ops; the
    old path, the negative, makes one per pitched operand and launch."""
    copies: list = []
    real = pitch.aligned_copy
    monkeypatch.setattr(pitch, "aligned_copy", lambda rows, row_pitch: copies.append(rows.shape) or real(rows, row_pitch))
    x, dy, t, beta = data(np.random.default_rng(12), 19, 40, 24)  # no width a multiple of 16
    fn = reference_fn(OPS[op])
    new = new_path(op, x, dy, pack(t), beta, 40, fn)
    assert copies == []
    old = old_path(op, x, dy, pack(t), beta, 40, fn)
    assert len(copies) == (6 if op == "grad_weight" else 1)  # dW: 3 chunks x (Xq, dYq)
    assert np.array_equal(new, old)


# ---- dW row chunks ---------------------------------------------------------------

@pytest.mark.kernel("hslm_dw_s8")
def test_chunked_dw_equals_unchunked_on_emulator():
    x, dy, _, _ = data(np.random.default_rng(3), 37, 24, 20)
    whole = array_ops.grad_weight(x, dy)
    launches: list[Dims] = []
    spy = emulated("hslm_dw_s8")

    def counted(grid, block, args, shared_mem=0):
        launches.append(dims_of("hslm_dw_s8", args))
        spy(grid, block, args, shared_mem=shared_mem)

    chunked = array_ops.grad_weight(x, dy, chunk_rows=8, fn=counted)
    assert [d.R for d in launches] == [8, 8, 8, 8, 5]
    assert np.array_equal(chunked, whole)


@pytest.mark.kernel("hslm_dw_s8")
def test_dw_over_the_row_bound_sums_chunks_in_int64():
    spec = get_kernel("hslm_dw_s8")
    R = 140_000  # 127 * 127 * R > 2^31: one int32 launch could not hold it
    assert 127 * 127 * R > 2**31 - 1 >= 127 * 127 * spec.max_rows
    x, dy = np.ones((R, 2)), -np.ones((R, 3))
    launches: list[Dims] = []
    got = array_ops.grad_weight(x, dy, fn=reference_fn("hslm_dw_s8", launches))
    assert [d.R for d in launches] == [spec.max_rows, R - spec.max_rows]
    assert got == pytest.approx(np.full((2, 3), -float(R)), rel=1e-12)  # u = v = 1/127
    # negative: the same two chunk sums added in int32 wrap around
    parts = [np.int32(-127 * 127 * d.R) for d in launches]
    with np.errstate(over="ignore"):
        assert int(parts[0] + parts[1]) != -127 * 127 * R


@pytest.mark.parametrize("chunk", [0, -1, 131072])
def test_dw_refuses_a_chunk_outside_the_exact_range(chunk):
    x = np.ones((4, 2))
    with pytest.raises(LaunchError, match="chunk_rows"):
        array_ops.grad_weight(x, x, chunk_rows=chunk, fn=reference_fn("hslm_dw_s8"))


def test_dw_refuses_row_count_mismatch():
    with pytest.raises(LaunchError, match="rows"):
        array_ops.grad_weight(np.ones((4, 2)), np.ones((5, 2)), fn=reference_fn("hslm_dw_s8"))


def test_array_module_refuses_mixed_arrays():
    fake_cupy = type("ndarray", (), {"__module__": "cupy._core.core"})()
    assert module_of(np.ones(2), np.ones(1)) is np
    with pytest.raises(LaunchError, match="all be numpy or all be cupy"):
        module_of(np.ones(2), fake_cupy)


# ---- on a GPU: CuPy arrays in, the same answer as the CPU path -------------------

def _gpu():
    cupy = pytest.importorskip("cupy", reason="GPU check: needs CuPy and a CUDA device")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("GPU check: CuPy sees no CUDA device")
    except Exception as exc:
        pytest.skip(f"GPU check: no CUDA device ({type(exc).__name__})")
    return cupy


@pytest.mark.kernel("hslm_fwd_s8", "hslm_dx_s8", "hslm_dw_s8")
def test_ops_on_gpu_match_the_cpu_path():
    """CuPy arrays run the PTX on the GPU; the integers and scales are the CPU path's."""
    cp = _gpu()
    x, dy, t, beta = data(np.random.default_rng(7), 45, 243, 81)
    w = pack(t)
    X, DY, W = cp.asarray(x), cp.asarray(dy), cp.asarray(w)
    pairs = [
        (array_ops.forward(X, W, beta), array_ops.forward(x, w, beta, fn=reference_fn("hslm_fwd_s8"))),
        (array_ops.grad_input(DY, W, beta, 243), array_ops.grad_input(dy, w, beta, 243, fn=reference_fn("hslm_dx_s8"))),
        (array_ops.grad_weight(X, DY), array_ops.grad_weight(x, dy, fn=reference_fn("hslm_dw_s8"))),
        (array_ops.grad_weight(X, DY, chunk_rows=16), array_ops.grad_weight(x, dy, fn=reference_fn("hslm_dw_s8"))),
    ]
    for gpu, cpu in pairs:
        assert isinstance(gpu, cp.ndarray)
        assert np.allclose(cp.asnumpy(gpu), cpu, rtol=1e-14, atol=0)


# ---- bad input: one LaunchError line naming the input, expected vs got, what to do -

def _with(value, at, shape=(4, 16)):
    a = np.ones(shape)
    a[at] = value
    return a


W16x8 = pack(np.ones((16, 8), np.int8))
FWD, DX, DW = (reference_fn(n) for n in ("hslm_fwd_s8", "hslm_dx_s8", "hslm_dw_s8"))
BAD_INPUTS = [
    ("1-D x", lambda: array_ops.forward(np.ones(16), W16x8, 1.0, fn=FWD),
     "forward: x must be a 2-D array (R x K), got shape (16,); reshape it, e.g. x.reshape(-1, 16)"),
    ("3-D x", lambda: array_ops.forward(np.ones((2, 4, 16)), W16x8, 1.0, fn=FWD),
     "forward: x must be a 2-D array (R x K), got shape (2, 4, 16); reshape it, e.g. x.reshape(-1, 16)"),
    ("R=0", lambda: array_ops.forward(np.ones((0, 16)), W16x8, 1.0, fn=FWD),
     "forward: x has shape (0, 16) (R x K); every dimension must be >= 1: skip the call for an empty batch"),
    ("K=0", lambda: array_ops.grad_weight(np.ones((4, 0)), np.ones((4, 8)), fn=DW),
     "grad_weight: x has shape (4, 0) (R x K); every dimension must be >= 1: skip the call for an empty batch"),
    ("1-D dy", lambda: array_ops.grad_input(np.ones(8), W16x8, 1.0, 16, fn=DX),
     "grad_input: dy must be a 2-D array (R x N), got shape (8,); reshape it, e.g. dy.reshape(-1, 8)"),
    ("complex x", lambda: array_ops.forward(np.ones((4, 16), complex), W16x8, 1.0, fn=FWD),
     "forward: x is complex128; expected a real array (float16/32/64 or integer)"),
    ("unpacked W", lambda: array_ops.forward(np.ones((4, 16)), np.ones((16, 8), np.int8), 1.0, fn=FWD),
     "hslm_fwd_s8_m32n16: input 'w' is int8(16, 8), expected uint32(8, 1) for R=4 K=16 N=8; "
     "pack the K x N ternary matrix with hslm_ptx.formats.ternary.pack(w)"),
    ("W packed for another K", lambda: array_ops.grad_input(np.ones((4, 8)), W16x8, 1.0, 40, fn=DX),
     "hslm_dx_s8_m32n16: input 'w' is uint32(8, 1), expected uint32(8, 3) for R=4 K=40 N=8; "
     "pack the K x N ternary matrix with hslm_ptx.formats.ternary.pack(w)"),
    ("code 3 in W", lambda: array_ops.forward(np.ones((4, 16)), W16x8 | np.uint32(3 << 30), 1.0, fn=FWD),
     "hslm_fwd_s8_m32n16: input 'w': packed weights: code 3 at column 0, in-feature 15 (word 0, bits 30-31) "
     "is not allowed; the packer never writes it: re-pack the weights (hslm_ptx.formats.ternary.pack)"),
    ("NaN in x", lambda: array_ops.forward(_with(np.nan, (2, 5)), W16x8, 1.0, fn=FWD),
     "forward: x has a non-finite value (nan) at (2, 5), so row 2 has no int8 scale; find where it came "
     "from (a diverging loss, a too-large learning rate)"),
    ("inf in dy", lambda: array_ops.grad_input(_with(np.inf, (3, 1), (4, 8)), W16x8, 1.0, 16, fn=DX),
     "grad_input: dy has a non-finite value (inf) at (3, 1), so row 3 has no int8 scale"),
    ("-inf in dy for dW", lambda: array_ops.grad_weight(np.ones((4, 16)), _with(-np.inf, (1, 6), (4, 8)), fn=DW),
     "grad_weight: dy has a non-finite value (-inf) at (1, 6), so column 6 has no int8 scale"),
    ("torch tensor", lambda: array_ops.forward(np.ones((4, 16)), type("Tensor", (), {"__module__": "torch"})(), 1.0),
     "forward: inputs must all be numpy or all be cupy arrays, got ['numpy', 'torch']; "
     "torch tensors go through hslm_ptx.nn.linear"),
    ("NaN beta", lambda: array_ops.forward(np.ones((4, 16)), W16x8, float("nan"), fn=FWD),
     "forward: beta is nan; expected the finite scale of the ternary weights (hslm_ptx.reference.quant.ternarize)"),
]


@pytest.mark.parametrize("call, message", [pytest.param(c, m, id=i) for i, c, m in BAD_INPUTS])
def test_bad_input_is_one_line_naming_it(call, message):
    with pytest.raises(LaunchError) as info:
        call()
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


@pytest.mark.kernel("hslm_fwd_s8", "hslm_dw_s8")
def test_fortran_ordered_floats_give_the_c_order_result_on_emulator():
    x, dy, t, beta = data(np.random.default_rng(9), 9, 40, 24)
    w = pack(t)
    assert np.array_equal(array_ops.forward(np.asfortranarray(x), w, beta), array_ops.forward(x, w, beta))
    assert np.array_equal(array_ops.grad_weight(np.asfortranarray(x), dy.T.copy().T), array_ops.grad_weight(x, dy))


def test_a_gradient_step_packs_without_a_transpose():
    """grad_weight returns K x N, the orientation pack takes: an SGD step re-packs as is."""
    x, dy, t, beta = data(np.random.default_rng(5), 6, 20, 12)
    dw = array_ops.grad_weight(x, dy, fn=DW)
    t_new, beta_new = ternarize(t * beta - 0.01 * dw / np.abs(dw).max())
    packed = pack(t_new)
    assert packed.shape == packed_shape(20, 12)
    assert np.array_equal(unpack(packed, 20), t_new)
    assert array_ops.forward(x, packed, beta_new, fn=FWD).shape == (6, 12)
    assert pack(dw.T != 0).shape != packed_shape(20, 12)  # the kernel's N x K would not fit W
