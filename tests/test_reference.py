"""The integer CPU references: exact against a float64 einsum, and the quantized float
math of each kernel stays inside the bound that follows from |x - s q| <= s/2."""
import numpy as np
import pytest
from kernelcases import GEMMS, per_kernel

from hslm_ptx.reference.quant import quantize_cols, quantize_rows, ternarize
from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.kernel.spec import Dims
from hslm_ptx.formats.ternary import pack, unpack

DIMS = [Dims(1, 17, 3), Dims(27, 243, 29), Dims(5, 64, 8)]
# what each family computes, written out independently of the kernel modules; a GEMM
# without an entry is checked against its GEMM form (KernelSpec.gemm_operands) instead
EINSUM = {
    "hslm_fwd_s8": lambda d, v: np.einsum("ri,ij->rj", v["x"], unpack(v["w"], d.K).astype(np.float64)),
    "hslm_dx_s8": lambda d, v: np.einsum("rj,ij->ri", v["dy"], unpack(v["w"], d.K).astype(np.float64)),
    "hslm_dw_s8": lambda d, v: np.einsum("rj,ri->ji", v["dy"], v["x"]),
}


def gemm_form_product(spec):
    def product(d, v):
        a, bt = spec.gemm_operands(v, d)
        return a.astype(np.float64) @ bt.T.astype(np.float64)
    return product


@pytest.mark.parametrize("dims", DIMS, ids=str)
@pytest.mark.parametrize("name", per_kernel(GEMMS))
def test_reference_matches_float64_einsum(name, dims):
    spec = KERNELS[name]
    inputs = spec.make_inputs(dims, np.random.default_rng(7))
    got = spec.reference(dims, inputs)
    if spec.family_name in EINSUM:
        floats = {k: v if v.dtype == np.uint32 else v.astype(np.float64) for k, v in inputs.items()}
        want = EINSUM[spec.family_name](dims, floats)
    else:
        want = gemm_form_product(spec)(dims, inputs)
    assert got.dtype == np.int32 and got.shape == spec.output.layout.logical(dims)
    assert np.array_equal(got, want)  # float64 is exact far beyond these sums


@pytest.mark.parametrize("name", per_kernel(GEMMS))
def test_verify_inputs_reach_the_extremes(name):
    """A GEMM's operands span their range: packed W all three codes, int8 +-127 (other
    kernels' inputs, scales and float buffers, are checked by their own tests)."""
    spec = KERNELS[name]
    inputs = spec.make_inputs(Dims(27, 243, 29), np.random.default_rng(3))
    operands = {op.name for op in spec.gemm_form}
    assert operands <= set(inputs)
    for key in operands:
        value = inputs[key]
        if value.dtype == np.uint32:
            assert set(np.unique(unpack(value, 243))) == {-1, 0, 1}
        else:
            assert value.dtype == np.int8 and value.min() <= -127 and value.max() == 127


def _layer(rng, R=48, K=200, N=72):
    x = rng.standard_normal((R, K))
    w = rng.standard_normal((K, N))
    dy = rng.standard_normal((R, N))
    t, beta = ternarize(w)
    return x, t, beta, dy


def _assert_tight(err, bound):
    assert np.all(err <= bound * (1 + 1e-12))
    assert err.max() > 0  # quantization really happened
    assert (err / bound).max() < 0.5  # and the bound is not vacuous slack either


@pytest.mark.kernel("hslm_fwd_s8")
def test_forward_quantized_within_bound():
    x, t, beta, _ = _layer(np.random.default_rng(11))
    spec, d = KERNELS["hslm_fwd_s8"], Dims(x.shape[0], *t.shape)
    xq, s = quantize_rows(x)
    y = s * spec.reference(d, {"x": xq, "w": pack(t)}) * beta
    exact = x @ (beta * t)
    bound = s / 2 * beta * np.abs(t).sum(axis=0)[None, :]
    _assert_tight(np.abs(y - exact), bound)


@pytest.mark.kernel("hslm_dx_s8")
def test_dx_quantized_within_bound():
    _, t, beta, dy = _layer(np.random.default_rng(12))
    spec, d = KERNELS["hslm_dx_s8"], Dims(dy.shape[0], *t.shape)
    dyq, s = quantize_rows(dy)
    dx = s * spec.reference(d, {"dy": dyq, "w": pack(t)}) * beta
    exact = dy @ (beta * t).T
    bound = s / 2 * beta * np.abs(t).sum(axis=1)[None, :]
    _assert_tight(np.abs(dx - exact), bound)


@pytest.mark.kernel("hslm_dw_s8")
def test_dw_quantized_within_bound():
    x, t, _, dy = _layer(np.random.default_rng(13))
    spec, d = KERNELS["hslm_dw_s8"], Dims(x.shape[0], t.shape[0], t.shape[1])
    xq, u = quantize_cols(x)  # u: (1, K)
    dyq, v = quantize_cols(dy)  # v: (1, N)
    dw = v.T * spec.reference(d, {"x": xq, "dy": dyq}) * u
    exact = dy.T @ x
    ax, ay = np.abs(u * xq), np.abs(v * dyq)  # |u q_x| (R, K), |v q_y| (R, N)
    bound = (ay.T @ np.ones_like(ax)) * u / 2 + v.T / 2 * (np.ones_like(ay).T @ ax) + x.shape[0] * v.T * u / 4
    _assert_tight(np.abs(dw - exact), bound)
