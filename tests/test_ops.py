"""The float ops (kernels/ops.py) on the CPU: the real PTX through the emulator, checked
against an f64 reference with the bounds of DESIGN "Scales".

Bounds (|x - s q| <= s/2 per element, W exactly ternary * beta):
  forward  |Y - Y~|[r, j]   <= (s_r / 2) sum_i |W[i, j]| beta
  dX       |dX - dX~|[r, i] <= (t_r / 2) sum_j |W[i, j]| beta
  dW       |dW - dW~|[j, i] <= sum_r |u_i qx| v_j / 2 + |v_j qy| u_i / 2 + u_i v_j / 4
Each is checked not vacuous: the observed error is > 0 and well under the bound, and a
wrong scale granularity (one scale per tensor) breaks it. Scales are recomputed here
from the definition (s = max|x| / 127 per slice), not taken from kernels/quant.py.
Shapes stay small: the emulator runs every thread in numpy.
"""
from __future__ import annotations

import numpy as np
import pytest

from kernels import ops
from kernels.launch import LaunchError
from kernels.pitch import logical_view
from kernels.registry import get_kernel
from kernels.spec import Dims
from kernels.ternary import pack

EPS = 1e-12  # f64 rounding slack, relative to the size of the terms summed


def dims_of(name: str, args) -> Dims:
    """The R, K, N scalars of a kernel's argument list (by parameter name)."""
    sizes = {p.name: int(a) for p, a in zip(get_kernel(name).params, args) if p.shape is None}
    return Dims(sizes["R"], sizes["K"], sizes["N"])


def reference_fn(name: str, launches: list[Dims] | None = None):
    """A RawKernel-style callable that writes the kernel's integer reference (no PTX)."""
    spec = get_kernel(name)
    buffers = [p for p in spec.params if p.shape is not None]

    def fn(grid, block, args, shared_mem=0):
        dims = dims_of(name, args)
        args[0][...] = spec.reference(dims, {p.name: logical_view(p, a, dims)
                                             for p, a in zip(buffers[1:], args[1:])})
        if launches is not None:
            launches.append(dims)

    return fn


def row_scales(a: np.ndarray, axis: int) -> np.ndarray:
    s = np.abs(a).max(axis=axis, keepdims=True) / 127
    return np.where(s == 0, 1.0, s)


def codes(a: np.ndarray, s: np.ndarray) -> np.ndarray:
    return np.clip(np.round(a / s), -127, 127)


def data(rng, R, K, N):
    """Rows and columns of very different magnitude, so the scale granularity matters."""
    x = rng.standard_normal((R, K)) * 10.0 ** rng.uniform(-3, 2, (R, 1)) * 10.0 ** rng.uniform(-1, 1, (1, K))
    dy = rng.standard_normal((R, N)) * 10.0 ** rng.uniform(-3, 2, (R, 1)) * 10.0 ** rng.uniform(-1, 1, (1, N))
    t = rng.integers(-1, 2, size=(K, N)).astype(np.int8)
    return x, dy, t, float(rng.uniform(0.01, 2.0))


def check_bound(got, ref, bound, scale):
    """(inside, error, median error / bound); inside allows only f64 rounding over the bound."""
    err = np.abs(got - ref)
    inside = bool((err <= bound + EPS * scale).all())
    return inside, err, float(np.median(err[bound > 0] / bound[bound > 0]))


def fwd_bound(x, t, beta):
    return (row_scales(x, 1) / 2) * np.abs(t).sum(axis=0)[None, :] * beta


def dx_bound(dy, t, beta):
    return (row_scales(dy, 1) / 2) * np.abs(t).sum(axis=1)[None, :] * beta


def dw_bound(x, dy):
    u, v = row_scales(x, 0), row_scales(dy, 0)  # (1, K), (1, N)
    sx = np.abs(u * codes(x, u)).sum(axis=0)  # (K,)
    sy = np.abs(v * codes(dy, v)).sum(axis=0)  # (N,)
    R = x.shape[0]
    return v.T / 2 * sx[None, :] + u / 2 * sy[:, None] + R * (v.T * u) / 4


def assert_tight(got, ref, bound, scale):
    inside, err, typical = check_bound(got, ref, bound, scale)
    assert inside, f"error over the bound by {(err - bound).max():g}"
    assert err.max() > 0, "no error at all: the bound was never tested"
    # random rounding errors add like sqrt(n) against the bound's n: far from the bound
    assert 0 < typical < 0.3, f"median error is {typical:.2f} of the bound"


SHAPES = [(19, 40, 24), (3, 17, 33)]  # K not a multiple of 16, R and N off the tile


@pytest.mark.kernel("hslm_fwd_s8")
@pytest.mark.parametrize("R,K,N", SHAPES)
def test_forward_inside_bound_on_emulator(R, K, N):
    x, _, t, beta = data(np.random.default_rng(R * K), R, K, N)
    w = pack(t)
    got = ops.forward(x, w, beta)  # numpy in: the PTX on the emulator
    ref = x @ (t * beta)
    assert got.shape == (R, N) and got.dtype == np.float64
    assert_tight(got, ref, fwd_bound(x, t, beta), np.abs(x) @ np.abs(t) * beta)
    assert np.array_equal(got, ops.forward(x, w, beta, fn=reference_fn("hslm_fwd_s8")))


@pytest.mark.kernel("hslm_dx_s8")
@pytest.mark.parametrize("R,K,N", SHAPES)
def test_grad_input_inside_bound_on_emulator(R, K, N):
    _, dy, t, beta = data(np.random.default_rng(R + K), R, K, N)
    w = pack(t)
    got = ops.grad_input(dy, w, beta, K)
    ref = dy @ (t * beta).T
    assert got.shape == (R, K)
    assert_tight(got, ref, dx_bound(dy, t, beta), np.abs(dy) @ np.abs(t).T * beta)
    assert np.array_equal(got, ops.grad_input(dy, w, beta, K, fn=reference_fn("hslm_dx_s8")))


@pytest.mark.kernel("hslm_dw_s8")
@pytest.mark.parametrize("R,K,N", SHAPES)
def test_grad_weight_inside_bound_on_emulator(R, K, N):
    x, dy, _, _ = data(np.random.default_rng(R * N), R, K, N)
    got = ops.grad_weight(x, dy)
    ref = dy.T @ x
    assert got.shape == (N, K)
    assert_tight(got, ref, dw_bound(x, dy), np.abs(dy).T @ np.abs(x))
    assert np.array_equal(got, ops.grad_weight(x, dy, fn=reference_fn("hslm_dw_s8")))


def test_float32_in_float32_out():
    x, _, t, beta = data(np.random.default_rng(0), 4, 16, 8)
    got = ops.forward(x.astype(np.float32), pack(t), beta, fn=reference_fn("hslm_fwd_s8"))
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
    wrong = (codes(dy, v).T @ codes(x, u)) * u * v
    inside, _, _ = check_bound(wrong, dy.T @ x, dw_bound(x, dy), np.abs(dy).T @ np.abs(x))
    assert not inside


# ---- dW row chunks ---------------------------------------------------------------

@pytest.mark.kernel("hslm_dw_s8")
def test_chunked_dw_equals_unchunked_on_emulator():
    x, dy, _, _ = data(np.random.default_rng(3), 37, 24, 20)
    whole = ops.grad_weight(x, dy)
    launches: list[Dims] = []
    spy = ops.kernel_function("hslm_dw_s8", np)

    def counted(grid, block, args, shared_mem=0):
        launches.append(dims_of("hslm_dw_s8", args))
        spy(grid, block, args, shared_mem=shared_mem)

    chunked = ops.grad_weight(x, dy, chunk_rows=8, fn=counted)
    assert [d.R for d in launches] == [8, 8, 8, 8, 5]
    assert np.array_equal(chunked, whole)


@pytest.mark.kernel("hslm_dw_s8")
def test_dw_over_the_row_bound_sums_chunks_in_int64():
    spec = get_kernel("hslm_dw_s8")
    R = 140_000  # 127 * 127 * R > 2^31: one int32 launch could not hold it
    assert 127 * 127 * R > 2**31 - 1 >= 127 * 127 * spec.max_rows
    x, dy = np.ones((R, 2)), -np.ones((R, 3))
    launches: list[Dims] = []
    got = ops.grad_weight(x, dy, fn=reference_fn("hslm_dw_s8", launches))
    assert [d.R for d in launches] == [spec.max_rows, R - spec.max_rows]
    assert got == pytest.approx(np.full((3, 2), -float(R)), rel=1e-12)  # u = v = 1/127
    # negative: the same two chunk sums added in int32 wrap around
    parts = [np.int32(-127 * 127 * d.R) for d in launches]
    with np.errstate(over="ignore"):
        assert int(parts[0] + parts[1]) != -127 * 127 * R


@pytest.mark.parametrize("chunk", [0, -1, 131072])
def test_dw_refuses_a_chunk_outside_the_exact_range(chunk):
    x = np.ones((4, 2))
    with pytest.raises(LaunchError, match="chunk_rows"):
        ops.grad_weight(x, x, chunk_rows=chunk, fn=reference_fn("hslm_dw_s8"))


def test_dw_refuses_row_count_mismatch():
    with pytest.raises(LaunchError, match="rows"):
        ops.grad_weight(np.ones((4, 2)), np.ones((5, 2)), fn=reference_fn("hslm_dw_s8"))


def test_array_module_refuses_mixed_arrays():
    fake_cupy = type("ndarray", (), {"__module__": "cupy._core.core"})()
    assert ops.array_module(np.ones(2), np.ones(1)) is np
    with pytest.raises(LaunchError, match="all be numpy or all be cupy"):
        ops.array_module(np.ones(2), fake_cupy)


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
        (ops.forward(X, W, beta), ops.forward(x, w, beta, fn=reference_fn("hslm_fwd_s8"))),
        (ops.grad_input(DY, W, beta, 243), ops.grad_input(dy, w, beta, 243, fn=reference_fn("hslm_dx_s8"))),
        (ops.grad_weight(X, DY), ops.grad_weight(x, dy, fn=reference_fn("hslm_dw_s8"))),
        (ops.grad_weight(X, DY, chunk_rows=16), ops.grad_weight(x, dy, fn=reference_fn("hslm_dw_s8"))),
    ]
    for gpu, cpu in pairs:
        assert isinstance(gpu, cp.ndarray)
        assert np.allclose(cp.asnumpy(gpu), cpu, rtol=1e-14, atol=0)
