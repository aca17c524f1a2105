"""TernaryLinear (hslm_ptx/nn/linear.py, hslm_ptx/nn/ops.py, hslm_ptx/nn/cpu_step.py).

- The CPU backend gives the bits of hslm_ptx.reference.stepmath: each torch primitive it uses against
  its stepmath / numpy twin on random data with ties, NaN, inf and subnormals, then whole
  steps (y, dX, dW, db) against a numpy reference whose products are exact int64 sums.
- Float BLAS on integer operands is exact inside the stated bound and the bound is real
  (past it f32 is wrong and the f64 the bound selects is right).
- A drop-in for nn.Linear: constructor, parameters, state_dict, empty batches, K = 0,
  leading dimensions, dtypes, autocast, .to(), refusals in one line, double backward.
- The prepared-weight cache: forward and backward share one preparation per version.
- The float reference (kernels=False) against the int8 step inside the quantization bounds.
- The emulator backend against the CPU backend, bit for bit (when the step's kernels are
  registered), and the CUDA backend on a GPU (skipped without one).

torch is an optional extra; CI installs it (.ci/run: .[dev]) and sets CI, and there a
missing torch fails this module instead of skipping it.
"""
from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quantbounds import assert_tight, check_bound, data, dw_bound, dx_bound, fwd_bound
from torchcases import gradients, torch

from hslm_ptx import TernaryLinear
from hslm_ptx.formats import floats
from hslm_ptx.nn import cpu_step as layer_cpu, ops as torch_ops
from hslm_ptx.reference import stepmath
from hslm_ptx.nn.linear import ternary_linear

FLOAT_TYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
SHAPES = [(19, 40, 24), (3, 17, 33), (64, 243, 81)]  # K not a multiple of 16, R and N off any tile


# ---- numpy references ------------------------------------------------------------------

def nasty(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """f32 values whose quotients by their scales hit ties: small integers and halves, mixed
    with Gaussians of very different magnitude per row."""
    a = rng.standard_normal(shape).astype(np.float32) * np.float32(10.0) ** rng.integers(-3, 3, shape[:1])[:, None]
    halves = (rng.integers(-254, 255, shape) / 2).astype(np.float32)
    a = np.where(rng.random(shape) < 0.3, halves, a).astype(np.float32)
    a[:, 0] = 127.0  # rows whose absmax is 127: scale 1, so x / s are the halves themselves
    return a


def f32_values(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().numpy()


def reference_step(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, dy: np.ndarray):
    """(y, dx, dw, db) in f32 from hslm_ptx.reference.stepmath, the products as exact int64 sums."""
    beta = stepmath.weight_scale(w)
    t = stepmath.ternary_codes(w, beta).astype(np.int64)
    s = stepmath.scales_of(stepmath.absmax(x, 1))
    y = stepmath.rescale_rows(stepmath.codes(x, s, 1).astype(np.int64) @ t.T, s, beta, b)
    t_r = stepmath.scales_of(stepmath.absmax(dy, 1))
    dx = stepmath.rescale_rows(stepmath.codes(dy, t_r, 1).astype(np.int64) @ t, t_r, beta)
    u, v = stepmath.scales_of(stepmath.absmax(x, 0)), stepmath.scales_of(stepmath.absmax(dy, 0))
    acc = stepmath.codes(dy, v, 0).astype(np.int64).T @ stepmath.codes(x, u, 0).astype(np.int64)
    return y, dx, stepmath.rescale_cols(acc, v, u), stepmath.column_sums(dy)


def bits(t: torch.Tensor) -> np.ndarray:
    """The storage of a float tensor as numpy (bf16 as its uint16 patterns)."""
    t = t.detach()
    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()


def assert_same(got: torch.Tensor, want_f32: np.ndarray) -> None:
    """got equals want rounded into got's dtype, bit for bit (NaN equal to NaN)."""
    dtype = FLOAT_TYPES[got.dtype]
    want = floats.from_f32(want_f32.astype(np.float32), dtype)
    assert got.shape == want.shape
    same = floats.same_values(bits(got), want, dtype)
    assert same.all(), f"{(~same).sum()} of {same.size} elements differ"


def step(layer: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor):
    """(y, x.grad, weight.grad, bias.grad) for the loss sum(y * dy), the gradients fresh."""
    y, dx, _ = gradients(layer, list(layer.parameters()), x, dy)
    return y, dx, layer.weight.grad, None if layer.bias is None else layer.bias.grad


# ---- the torch primitives give stepmath's bits -------------------------------------------

def test_torch_round_is_half_to_even_like_rint():
    ties = np.arange(-300, 301, dtype=np.float32) + np.float32(0.5)
    near = np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf))
    for values in (ties, *near):
        assert np.array_equal(torch.round(torch.from_numpy(values)).numpy(), np.rint(values))
    assert torch.round(torch.tensor([0.5, 1.5, 2.5, -0.5])).tolist() == [0.0, 2.0, 2.0, -0.0]


def test_torch_division_and_amax_are_stepmaths():
    rng = np.random.default_rng(0)
    a = nasty(rng, (64, 243))
    a[5, 7], a[9, 2], a[11, 3] = np.nan, np.inf, 1e-42  # NaN, inf and a subnormal
    for axis in (0, 1):
        m = stepmath.absmax(a, axis)
        got = layer_cpu.scales(torch.from_numpy(a), axis).numpy()
        assert floats.same_values(got, stepmath.scales_of(m), "float32").all()
        assert np.isnan(got).sum() == 1  # the NaN's slice: propagated, as max.NaN.f32
    s = stepmath.scales_of(stepmath.absmax(a, 1))
    assert np.array_equal(layer_cpu.row_codes(torch.from_numpy(a), torch.from_numpy(s)).numpy(),
                          stepmath.codes(a, s, 1))
    u = stepmath.scales_of(stepmath.absmax(a, 0))
    assert np.array_equal(layer_cpu.col_codes(torch.from_numpy(a), torch.from_numpy(u)).numpy(),
                          stepmath.codes(a, u, 0))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=40),
       st.floats(width=32, min_value=2.0 ** -126, max_value=2.0 ** 100))
def test_codes_equal_stepmaths_for_any_values(values, scale):
    """rint / clip / NaN -> 0 on any f32 quotient, the NaN pass skipped only where it may be."""
    a = np.array(values, dtype=np.float32)[None, :]
    s = stepmath.scales_of(stepmath.absmax(a, 1))
    got = layer_cpu.row_codes(torch.from_numpy(a), torch.from_numpy(s)).numpy()
    assert np.array_equal(got, stepmath.codes(a, s, 1))
    beta = np.float32(scale)
    assert np.array_equal(layer_cpu.rounded_codes(torch.from_numpy(a) / float(beta), 1,
                                                  may_be_nan=not np.isfinite(a).all()).numpy(),
                          stepmath.ternary_codes(a, beta))


def test_skipping_the_nan_pass_where_a_nan_can_occur_is_wrong():
    """Negative: the NaN pass matters (NaN codes would poison a whole product row)."""
    q = torch.tensor([np.nan, 0.7, -3.0])
    assert torch.isnan(layer_cpu.rounded_codes(q.clone(), 1, may_be_nan=False)).any()
    assert layer_cpu.rounded_codes(q.clone(), 1).tolist() == [0.0, 1.0, -1.0]


def test_torch_rounding_to_bf16_and_f16_is_floats():
    """torch's .to(bfloat16 / float16) is round to nearest even, as floats.from_f32: on
    random values, on exact ties (odd and even kept bit), at overflow and on NaN."""
    rng = np.random.default_rng(1)
    random = rng.standard_normal(20000).astype(np.float32) * np.float32(1e3)
    tie_bits = (rng.integers(0, 2 ** 15, 4000, dtype=np.uint32) << 16) | np.uint32(0x8000)
    ties = tie_bits.view(np.float32)
    ties = ties[np.isfinite(ties)]
    edge = np.array([np.nan, np.inf, -np.inf, 3.4e38, 65519.0, 65520.0, 1e-8, -0.0], dtype=np.float32)
    f16_ties = (rng.integers(-2048, 2048, 4000).astype(np.float32) + np.float32(0.5)) * np.float32(2 ** -5)
    for values in (random, ties, edge, f16_ties):
        t = torch.from_numpy(values)
        assert floats.same_values(bits(t.to(torch.bfloat16)), floats.f32_to_bf16(values), "bfloat16").all()
        assert floats.same_values(t.to(torch.float16).numpy(), floats.f32_to_f16(values), "float16").all()
    assert (floats.f32_to_bf16(ties) & 1 == 0).all()  # ties went to the even neighbour
    truncated = bits(torch.from_numpy(ties).to(torch.bfloat16)) == (tie_bits[np.isfinite(tie_bits.view(np.float32))]
                                                                    >> 16).astype(np.uint16)
    assert not truncated.all()  # negative: truncation is not what torch does (odd ties round up)


# ---- exact products and their bound --------------------------------------------------------

def test_the_exact_bound_picks_f64_where_f32_would_be_wrong():
    """dW's partial sums reach 127 * 127 * R. At R = 1040 (<= 2^24) f32 holds every partial
    sum and the product is the exact integer. Past it the bound picks f64, whose product,
    narrowed once, is the exact integer rounded to f32 (what cvt.rn.f32.s32 makes of the
    int32 accumulator); f32 accumulation past 2^24 rounds at every step and misses that."""
    rng = np.random.default_rng(3)
    a = torch.full((3, 1040), 127.0)
    b = torch.full((1040, 2), 127.0)
    b[0, 1] = -127.0
    exact = a.numpy().astype(np.int64) @ b.numpy().astype(np.int64)
    assert layer_cpu.exact_float_type(127 * 127 * 1040) == torch.float32
    assert np.array_equal(layer_cpu.exact_product(a, b, 127 * 127 * 1040).numpy().astype(np.int64), exact)
    assert exact[0, 0] == 127 * 127 * 1040
    R = 5000
    a = torch.from_numpy(rng.integers(100, 128, (4, R)).astype(np.float32))
    b = torch.from_numpy(rng.integers(100, 128, (R, 4)).astype(np.float32))
    rounded = (a.numpy().astype(np.int64) @ b.numpy().astype(np.int64)).astype(np.float32)
    assert layer_cpu.exact_float_type(127 * 127 * R) == torch.float64
    assert np.array_equal(layer_cpu.exact_product(a, b, 127 * 127 * R).numpy(), rounded)
    assert not np.array_equal(torch.mm(a, b).numpy(), rounded)  # negative: f32 past the bound drifts
    assert layer_cpu.exact_float_type(127 * 132104) == torch.float32  # forward: K up to 132104
    assert layer_cpu.exact_float_type(127 * 132105) == torch.float64


def test_f32_products_at_the_forward_bound_equal_int64():
    rng = np.random.default_rng(2)
    K = 132104
    q = rng.integers(-127, 128, (2, K)).astype(np.float32)
    q[0] = 127.0  # the worst case: every product +127
    t = rng.integers(-1, 2, (3, K)).astype(np.float32)
    t[0] = 1.0
    got = layer_cpu.exact_product(torch.from_numpy(q), torch.from_numpy(t).T, 127 * K)
    assert np.array_equal(got.numpy().astype(np.int64), q.astype(np.int64) @ t.astype(np.int64).T)
    assert got[0, 0] == 127 * K


# ---- whole steps against stepmath -----------------------------------------------------------

@pytest.mark.parametrize("R,K,N", SHAPES)
@pytest.mark.parametrize("dtype", list(FLOAT_TYPES), ids=list(FLOAT_TYPES.values()))
def test_a_cpu_step_is_stepmath_bit_for_bit(R, K, N, dtype):
    rng = np.random.default_rng(R * K + N)
    torch.manual_seed(R)
    layer = TernaryLinear(K, N, dtype=dtype)
    x = torch.from_numpy(nasty(rng, (R, K))).to(dtype)
    dy = torch.from_numpy(nasty(rng, (R, N))).to(dtype)
    y, dx, dw, db = step(layer, x, dy)
    want = reference_step(f32_values(x), f32_values(layer.weight), f32_values(layer.bias), f32_values(dy))
    for got, ref in zip((y, dx, dw, db), want):
        assert got.dtype == dtype
        assert_same(got, ref)


def test_mixed_dtypes_follow_x_for_y_and_the_parameters_for_their_gradients():
    """f32 parameters with bf16 activations (autocast's case): y and dX in bf16, dW and db in
    f32, the bias rounded to bf16 before it is added."""
    torch.manual_seed(3)
    layer = TernaryLinear(40, 24)  # f32 parameters
    x = torch.randn(7, 40).to(torch.bfloat16)
    dy = torch.randn(7, 24).to(torch.bfloat16)
    y, dx, dw, db = step(layer, x, dy)
    assert (y.dtype, dx.dtype, dw.dtype, db.dtype) == (torch.bfloat16, torch.bfloat16, torch.float32, torch.float32)
    bias = f32_values(layer.bias.to(torch.bfloat16))  # read in x's type, as the fused kernel reads it
    assert not np.array_equal(bias, f32_values(layer.bias))
    want = reference_step(f32_values(x), f32_values(layer.weight), bias, f32_values(dy))
    for got, ref in zip((y, dx, dw, db), want):
        assert_same(got, ref)


def test_a_wrong_step_is_caught_by_the_bit_comparison(monkeypatch):
    """Negative: dX rescaled by (s * beta) in one multiply instead of stepmath's two is off in
    some bits, and the comparison sees it."""
    torch.manual_seed(4)
    layer = TernaryLinear(243, 81)
    rng = np.random.default_rng(4)
    x, dy = torch.from_numpy(nasty(rng, (64, 243))), torch.from_numpy(nasty(rng, (64, 81)))
    real = layer_cpu.backward

    def fused(dy, saved, prepared, need_dx, need_dw, need_db):
        dx, dw, db = real(dy, saved, prepared, False, need_dw, need_db)
        t_r = layer_cpu.scales(dy, 1)
        acc = layer_cpu.exact_product(layer_cpu.row_codes(dy, t_r), prepared.codes, 127 * dy.shape[1])
        return acc * (t_r[:, None] * prepared.beta), dw, db

    monkeypatch.setattr(layer_cpu, "backward", fused)
    _, dx, _, _ = step(layer, x, dy)
    want = reference_step(x.numpy(), f32_values(layer.weight), f32_values(layer.bias), dy.numpy())[1]
    assert not floats.same_values(dx.numpy(), want, "float32").all()


def test_a_nan_row_gives_a_nan_row_and_nothing_else():
    torch.manual_seed(5)
    layer = TernaryLinear(16, 8)
    x = torch.randn(4, 16)
    x[1, 3] = float("nan")
    dy = torch.randn(4, 8)
    dy[2, 5] = float("nan")
    y, dx, dw, _ = step(layer, x, dy)
    assert torch.isnan(y).all(dim=1).tolist() == [False, True, False, False]
    assert torch.isfinite(y[[0, 2, 3]]).all()
    assert torch.isnan(dx).all(dim=1).tolist() == [False, False, True, False]
    assert torch.isnan(dw[:, 3]).all() and torch.isnan(dw[5]).all()  # x's column 3, dy's column 5
    x[1, 3] = float("inf")
    assert torch.isnan(layer(x)[1]).all() and torch.isfinite(layer(x)[0]).all()
    with torch.no_grad():
        layer.weight[0, 0] = float("inf")
    y, dx, dw, _ = step(layer, x[[0, 2]], dy[[0, 1]])
    assert torch.isnan(y).all() and torch.isnan(dx).all() and torch.isfinite(dw).all()


# ---- a drop-in for nn.Linear -----------------------------------------------------------------

def test_same_constructor_parameters_initialization_and_state_dict():
    torch.manual_seed(6)
    linear = torch.nn.Linear(16, 8)
    torch.manual_seed(6)
    layer = TernaryLinear(16, 8)
    assert [(n, p.shape) for n, p in layer.named_parameters()] == [(n, p.shape) for n, p in linear.named_parameters()]
    assert torch.equal(layer.weight, linear.weight) and torch.equal(layer.bias, linear.bias)  # same draws
    layer.load_state_dict(torch.nn.Linear(16, 8).state_dict(), strict=True)
    torch.nn.Linear(16, 8).load_state_dict(layer.state_dict(), strict=True)
    plain = TernaryLinear(16, 8, False, "cpu", torch.bfloat16)  # nn.Linear's positional order
    assert plain.bias is None and plain.weight.dtype == torch.bfloat16 and "bias" not in plain.state_dict()
    with pytest.raises(RuntimeError, match="Unexpected key"):
        plain.load_state_dict(linear.state_dict(), strict=True)  # negative: strict still means strict


def test_empty_batches_and_their_backward():
    layer = TernaryLinear(16, 8)
    x = torch.randn(0, 16, requires_grad=True)
    y = layer(x)
    assert y.shape == (0, 8)
    y.sum().backward()
    assert x.grad.shape == (0, 16)
    assert torch.equal(layer.weight.grad, torch.zeros(8, 16)) and torch.equal(layer.bias.grad, torch.zeros(8))
    assert layer(torch.randn(2, 0, 16)).shape == (2, 0, 8)


def test_zero_in_features_behaves_like_nn_linear():
    with pytest.warns(UserWarning):  # nn.Linear's own warning for a zero-element weight
        layer = TernaryLinear(0, 8)
    linear = torch.nn.Linear(0, 8)
    linear.load_state_dict(layer.state_dict())
    x = torch.randn(3, 0, requires_grad=True)
    assert torch.equal(layer(x), linear(x))
    layer(x).sum().backward()
    assert x.grad.shape == (3, 0) and layer.weight.grad.shape == (8, 0)
    assert layer.bias.grad.tolist() == [3.0] * 8


def test_leading_dimensions_and_a_vector():
    torch.manual_seed(7)
    layer = TernaryLinear(16, 8)
    x = torch.randn(2, 3, 16)
    y = layer(x)
    assert y.shape == (2, 3, 8) and torch.equal(y.reshape(6, 8), layer(x.reshape(6, 16)))
    assert torch.equal(layer(x[0, 0]), layer(x[0, :1])[0])


@pytest.mark.parametrize("dtype", list(FLOAT_TYPES), ids=list(FLOAT_TYPES.values()))
def test_to_dtype_and_the_dtypes_of_every_result(dtype):
    layer = TernaryLinear(16, 8).to("cpu", dtype)
    x = torch.randn(5, 16, dtype=dtype, requires_grad=True)
    layer(x).sum().backward()
    assert layer(x).dtype == x.grad.dtype == layer.weight.grad.dtype == layer.bias.grad.dtype == dtype


def test_autocast_gives_the_autocast_dtype():
    torch.manual_seed(8)
    layer = TernaryLinear(16, 8)
    x = torch.randn(3, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, layer(x.to(torch.bfloat16)))  # x cast first, as nn.Linear's inputs are
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and layer.weight.grad.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.int8, torch.complex64])
def test_non_float_inputs_are_refused_in_one_line(dtype):
    with pytest.raises(TypeError) as info:
        TernaryLinear(16, 8)(torch.ones(2, 16, dtype=dtype))
    assert str(info.value) == (f"TernaryLinear(16, 8): x is {dtype}; expected a float tensor (float32, float16 "
                               "or bfloat16), as nn.Linear does: cast it with x.float()")


def test_float64_is_refused_by_the_step_and_run_by_the_reference():
    with pytest.raises(TypeError, match=r"^TernaryLinear\(16, 8\): weight is torch.float64; the int8 step"):
        TernaryLinear(16, 8, dtype=torch.float64)(torch.ones(2, 16))
    assert TernaryLinear(16, 8, kernels=False, dtype=torch.float64)(torch.ones(2, 16, dtype=torch.float64)).dtype \
        == torch.float64


def test_the_wrong_feature_count_a_wrong_backend_and_a_wrong_device_are_one_line():
    layer = TernaryLinear(16, 8)
    with pytest.raises(ValueError) as info:
        layer(torch.randn(4, 15))
    assert str(info.value) == ("TernaryLinear(16, 8): x has shape (4, 15), expected last dimension "
                               "in_features=16; pass (..., 16)")
    with pytest.raises(ValueError, match=r"^TernaryLinear: backend='gpu', expected one of cpu, emulator, cuda"):
        TernaryLinear(16, 8, backend="gpu")
    with pytest.raises(ValueError, match=r"^TernaryLinear\(16, 8\): x is on 'cpu', backend 'cuda' runs on cuda"):
        TernaryLinear(16, 8, backend="cuda")(torch.randn(2, 16))


def test_double_backward_is_refused_in_one_line():
    layer = TernaryLinear(16, 8)
    x = torch.randn(3, 16, requires_grad=True)
    (grad,) = torch.autograd.grad(layer(x).sum(), x, create_graph=True)  # one backward with a graph: fine
    with pytest.raises(RuntimeError, match=r"^TernaryLinear: double backward is not supported"):
        grad.sum().backward()


def test_no_dx_when_the_input_needs_no_gradient(monkeypatch):
    asked = []
    real = layer_cpu.backward
    monkeypatch.setattr(layer_cpu, "backward", lambda *a: asked.append(a[3:]) or real(*a))
    layer = TernaryLinear(16, 8, bias=False)
    layer(torch.randn(4, 16)).sum().backward()
    assert asked == [(False, True, False)] and layer.weight.grad.abs().sum() > 0


def test_inference_keeps_nothing_for_dw(monkeypatch):
    """Under no_grad (or with a frozen weight) forward skips x's column pass; with a
    weight gradient to come it takes it (so the spy can see a call)."""
    calls = []
    real = layer_cpu.col_codes
    monkeypatch.setattr(layer_cpu, "col_codes", lambda *a: calls.append(1) or real(*a))
    layer = TernaryLinear(16, 8)
    x = torch.randn(4, 16)
    with torch.no_grad():
        y = layer(x)
    layer.weight.requires_grad_(False)
    frozen = layer(x.requires_grad_())
    frozen.sum().backward()
    assert calls == [] and torch.equal(y, frozen.detach()) and layer.weight.grad is None
    layer.weight.requires_grad_(True)
    layer(x).sum().backward()
    assert len(calls) == 2 and layer.weight.grad is not None  # x's columns in forward, dy's in backward


# ---- the prepared-weight cache -------------------------------------------------------------

def test_every_forward_prepares_and_its_backward_reuses_that_preparation(preparations):
    layer = TernaryLinear(16, 8)
    x = torch.randn(4, 16, requires_grad=True)
    before = preparations.count
    layer(x).sum().backward()
    assert preparations.count == before + 1  # forward prepared, backward reused it
    layer(x).sum().backward()  # the same weight: prepared again all the same (nothing says it is the same)
    assert preparations.count == before + 2


def test_a_cached_weight_is_prepared_once_per_stamp(preparations):
    layer = TernaryLinear(16, 8, cache_weight=True)
    x = torch.randn(4, 16, requires_grad=True)
    before = preparations.count
    layer(x).sum().backward()
    layer(x).sum().backward()  # the same stamp: no preparation at all
    assert preparations.count == before + 1
    torch.optim.SGD(layer.parameters(), lr=0.1).step()  # a step: a new stamp
    y = layer(x)
    assert preparations.count == before + 2
    layer.cache_weight = False  # the attribute switches it off again
    assert torch.equal(layer(x), y)
    assert preparations.count == before + 3
    assert torch.equal(twin(layer)(x), y)  # the new weight's codes, not the old ones


def test_the_cache_never_keeps_a_weight_alive_nor_confuses_two():
    a, b = TernaryLinear(16, 8, bias=False), TernaryLinear(16, 8, bias=False)
    with torch.no_grad():
        b.weight.copy_(-a.weight)
    x = torch.randn(3, 16)
    assert torch.equal(a(x), -b(x))
    alive = weakref.ref(a.weight)
    gc.collect()  # earlier tests' layers: gone before counting
    storages = len(torch_ops._PREPARED)
    del a
    gc.collect()
    assert alive() is None and len(torch_ops._PREPARED) == storages - 1


def test_inference_mode_weights_have_no_version_and_are_prepared_each_time(preparations):
    x = torch.randn(3, 16)
    with torch.inference_mode():
        layer = TernaryLinear(16, 8)
        before = preparations.count
        y = layer(x)
        assert torch.equal(layer(x), y)
    assert preparations.count == before + 2
    with torch.no_grad():
        twin = TernaryLinear(16, 8)
        twin.weight.copy_(layer.weight)
        twin.bias.copy_(layer.bias)
    assert torch.equal(twin(x), y)


def twin(layer: TernaryLinear) -> TernaryLinear:
    """A new layer holding ``layer``'s parameters in new storage: its first forward
    prepares them from scratch, so its output is what ``layer``'s must be."""
    fresh = TernaryLinear(layer.in_features, layer.out_features, layer.bias is not None,
                          dtype=layer.weight.dtype)
    fresh.load_state_dict(layer.state_dict())
    return fresh


def optimizer_step(make):
    """An edit: one step of the optimizer ``make(params)`` on the gradients of a training step."""
    def edit(layer, x):
        optimizer = make(layer.parameters())
        layer(x).square().sum().backward()
        optimizer.step()
    return edit


def numpy_view_edit(layer, x):
    view = layer.weight.detach().numpy()  # shares the weight's memory; numpy bumps no version
    view *= -1


def reload(layer, x):
    other = TernaryLinear(layer.in_features, layer.out_features)
    layer.load_state_dict(other.state_dict())


def in_place_under_no_grad(layer, x):
    with torch.no_grad():
        layer.weight.mul_(-1)


EDITS = {  # the ways a training loop changes a weight; the first five leave _version as it was
    "adam_fused": optimizer_step(lambda p: torch.optim.Adam(p, lr=0.5, fused=True)),
    "adamw_fused": optimizer_step(lambda p: torch.optim.AdamW(p, lr=0.5, fused=True)),
    "sgd_fused": optimizer_step(lambda p: torch.optim.SGD(p, lr=1.0, momentum=0.9, fused=True)),
    "data_mul": lambda layer, x: layer.weight.data.mul_(-1),
    "numpy_view": numpy_view_edit,
    "adam_foreach": optimizer_step(lambda p: torch.optim.Adam(p, lr=0.5, foreach=True)),
    "sgd": optimizer_step(lambda p: torch.optim.SGD(p, lr=1.0)),
    "load_state_dict": reload,
    "no_grad_in_place": in_place_under_no_grad,
}
STAMP_BLIND = ("data_mul", "numpy_view")  # what a cached weight cannot see: refresh_weight()


def assert_next_forward_reads_the_edited_weight(layer, edit, x):
    y = layer(x).detach()
    edit(layer, x)
    after = layer(x)
    assert not torch.equal(after, y)  # the edit changed the answer...
    assert torch.equal(after, twin(layer)(x))  # ...to what the edited weight gives


@pytest.mark.parametrize("edit", list(EDITS))
def test_the_next_forward_reads_every_edit_of_the_weight(edit):
    torch.manual_seed(3)
    layer = TernaryLinear(16, 8)
    assert_next_forward_reads_the_edited_weight(layer, EDITS[edit], torch.randn(5, 16))


@pytest.mark.parametrize("edit", [e for e in EDITS if e not in STAMP_BLIND])
def test_a_cached_weight_sees_every_edit_its_stamp_covers(edit):
    torch.manual_seed(3)
    layer = TernaryLinear(16, 8, cache_weight=True)
    assert_next_forward_reads_the_edited_weight(layer, EDITS[edit], torch.randn(5, 16))


@pytest.mark.parametrize("edit", STAMP_BLIND)
def test_a_cached_weight_is_stale_after_a_blind_edit_until_refresh_weight(edit):
    """Negative: the documented limit of the cache, and its remedy."""
    torch.manual_seed(3)
    layer = TernaryLinear(16, 8, bias=False, cache_weight=True)
    x = torch.randn(5, 16)
    y = layer(x)
    EDITS[edit](layer, x)
    assert torch.equal(layer(x), y)  # stale: the stamp did not change
    layer.refresh_weight()
    assert torch.equal(layer(x), -y) and torch.equal(layer(x), twin(layer)(x))


@pytest.mark.parametrize("cache_weight", [False, True])
def test_to_a_new_dtype_prepares_the_converted_weight(cache_weight):
    torch.manual_seed(4)
    layer = TernaryLinear(16, 8, cache_weight=cache_weight)
    x = torch.randn(5, 16)
    y = layer(x)
    layer.to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.mul_(-1)  # as a bf16 weight now
    assert torch.equal(layer(x.bfloat16()), twin(layer)(x.bfloat16()))
    layer.to(torch.float32)
    assert torch.equal(layer(x), twin(layer)(x)) and not torch.equal(layer(x), y)


@pytest.mark.parametrize("cache_weight", [False, True])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
def test_training_with_adam_lowers_the_loss(fused, cache_weight):
    """30 steps of MSE regression on a teacher's outputs: the loss falls with fused Adam
    (whose steps leave the weight's version as it was) as with foreach Adam."""
    torch.manual_seed(5)
    teacher = torch.nn.Linear(32, 16)
    x = torch.randn(64, 32)
    target = teacher(x).detach()
    layer = TernaryLinear(32, 16, cache_weight=cache_weight)
    optimizer = torch.optim.Adam(layer.parameters(), lr=0.02, fused=fused, foreach=not fused)
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(layer(x), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses
    assert sum(b < a for a, b in zip(losses, losses[1:])) >= 20, losses  # falling, not one lucky step


# ---- the float reference, inside the quantization bounds -------------------------------------

@pytest.mark.parametrize("R,K,N", SHAPES[:2])
def test_the_int8_step_is_inside_the_quantization_bounds_of_the_float_reference(R, K, N):
    x, dy, _, _ = data(np.random.default_rng(R * K + N), R, K, N)
    x, dy = x.astype(np.float32), dy.astype(np.float32)
    torch.manual_seed(R)
    fast = TernaryLinear(K, N, bias=False)
    slow = TernaryLinear(K, N, bias=False, kernels=False, dtype=torch.float64)
    slow.load_state_dict(fast.state_dict())
    got = step(fast, torch.from_numpy(x), torch.from_numpy(dy))
    want = step(slow, torch.from_numpy(x).double(), torch.from_numpy(dy).double())
    w = slow.weight.detach().numpy()
    beta = np.abs(w).mean()
    t = np.clip(np.round(w / beta), -1, 1).T
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    y, dx, dw = (g.double().numpy() for g in got[:3])
    ref_y, ref_dx, ref_dw = (g.numpy() for g in want[:3])
    assert_tight(y, ref_y, fwd_bound(x64, t, beta), np.abs(x64) @ np.abs(t) * beta)
    assert_tight(dx, ref_dx, dx_bound(dy64, t, beta), np.abs(dy64) @ np.abs(t).T * beta)
    assert_tight(dw.T, ref_dw.T, dw_bound(x64, dy64), np.abs(x64).T @ np.abs(dy64))
    inside, _, _ = check_bound(y, ref_y / beta, fwd_bound(x64, t, beta), np.abs(x64) @ np.abs(t))
    assert not inside  # negative: the reference without beta is outside the bound


# ---- backends ---------------------------------------------------------------------------------

def step_kernels_registered() -> bool:
    """Whether hslm_ptx.catalog.registry holds every kernel family hslm_ptx.step.launches launches."""
    from hslm_ptx.catalog import registry

    kinds = ("wsum", "wprep", "qrows", "qcols", "quant", "fwd", "dx", "dw")
    return all(f"hslm_{kind}_f32" in registry.FAMILIES for kind in kinds)


@pytest.mark.parametrize("dtype", list(FLOAT_TYPES), ids=list(FLOAT_TYPES.values()))
def test_the_emulator_backend_equals_the_cpu_backend(dtype):
    if not step_kernels_registered():
        pytest.skip("the layer step's kernels (hslm_wsum/wprep/qrows/qcols/quant) are not in hslm_ptx.catalog.registry yet")
    R, K, N = 19, 40, 24
    rng = np.random.default_rng(9)
    torch.manual_seed(9)
    cpu = TernaryLinear(K, N, dtype=dtype)
    emulator = TernaryLinear(K, N, dtype=dtype, backend="emulator")
    emulator.load_state_dict(cpu.state_dict())
    x = torch.from_numpy(nasty(rng, (R, K))).to(dtype)
    dy = torch.from_numpy(nasty(rng, (R, N))).to(dtype)
    for got, want in zip(step(emulator, x, dy), step(cpu, x, dy)):
        assert got.dtype == want.dtype
        assert floats.same_values(bits(got), bits(want), FLOAT_TYPES[dtype]).all()


def test_the_emulator_backend_equals_the_cpu_backend_with_mixed_dtypes_and_nan():
    """f32 parameters, bf16 activations (the bias read in bf16 by both), a NaN row in x."""
    if not step_kernels_registered():
        pytest.skip("the layer step's kernels (hslm_wsum/wprep/qrows/qcols/quant) are not in hslm_ptx.catalog.registry yet")
    rng = np.random.default_rng(13)
    torch.manual_seed(13)
    cpu, emulator = TernaryLinear(40, 24), TernaryLinear(40, 24, backend="emulator")
    emulator.load_state_dict(cpu.state_dict())
    x = torch.from_numpy(nasty(rng, (5, 40))).to(torch.bfloat16)
    x[2, 7] = float("nan")
    dy = torch.from_numpy(nasty(rng, (5, 24))).to(torch.bfloat16)
    got, want = step(emulator, x, dy), step(cpu, x, dy)
    assert torch.isnan(want[0][2]).all() and torch.isfinite(want[0][[0, 1, 3, 4]]).all()
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        assert floats.same_values(bits(g), bits(w), FLOAT_TYPES[g.dtype]).all()


# ---- signed zero: one rule on every backend ------------------------------------------------

ZERO_CASES = ("mixed", "one_input", "one_output")


def zero_cases(case: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, W, dY) whose exact sums are zero in every way they can be. "mixed" (6 x 5 x 4):
    a row of x all -0.0, rows of negative values, ties that round to -0 codes (-0.5 with
    scale 1), a weight row and a weight column of zero codes, dY rows all negative.
    "one_input" (K = 1) and "one_output" (N = 1): a contraction of length one, where
    float BLAS keeps the sign of a single -0.0 product (forward, then dX)."""
    if case == "one_input":
        return (np.array([[-0.0], [2.0], [-3.0]], np.float32), np.array([[1.0], [0.5]], np.float32),
                np.array([[-1.0, 2.0], [-0.0, -0.0], [-0.5, -0.5]], np.float32))
    if case == "one_output":
        return (np.array([[1.0, -2.0, 3.0], [-0.0, -0.0, 0.0]], np.float32),
                np.array([[1.0, 0.01, -1.0]], np.float32), np.array([[-1.0], [-0.0]], np.float32))
    x = np.array([[-0.0] * 5,
                  [-127.0, -0.5, -0.5, -2.5, -0.0],
                  [-1.0, -2.0, -3.0, -4.0, -5.0],
                  [127.0, -0.5, 0.5, -1.5, 0.0],
                  [-3.0, 3.0, -0.0, 0.0, -1e-3],
                  [2.0, -2.0, 2.0, -2.0, 0.0]], dtype=np.float32)
    w = np.array([[1.0, -1.0, 1.0, 1e-3, -1.0],
                  [1e-3, -1e-3, 1e-3, -1e-3, 1e-3],  # every code 0
                  [-1.0, 1.0, 0.5, 1e-3, 1.0],
                  [0.5, -0.5, -1.0, -1e-3, 1.0]], dtype=np.float32)  # column 3: every code 0
    dy = np.array([[-1.0, -2.0, -0.5, -3.0], [-0.0, -0.0, -0.0, -0.0], [1.0, -1.0, 0.5, -0.5],
                   [-0.5, -127.0, -0.5, -1.5], [2.0, 2.0, 2.0, 2.0], [-1e-3, -1.0, -1e-3, -1.0]],
                  dtype=np.float32)
    return x, w, dy


def zero_case_layer(case: str, backend: str, bias: bool) -> TernaryLinear:
    _, w, _ = zero_cases(case)
    layer = TernaryLinear(w.shape[1], w.shape[0], bias=bias, backend=backend)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(w))
        if bias:
            layer.bias.copy_(torch.tensor([-0.0, 0.0, -0.0, 1.0][: w.shape[0]]))
    return layer


def zero_signs(t: torch.Tensor) -> set[float]:
    """The signs of t's zeros: 1.0 for +0, -1.0 for -0."""
    zeros = t.detach().float()[t.detach().float() == 0]
    return set(torch.copysign(torch.ones_like(zeros), zeros).tolist())


@pytest.mark.parametrize("case", ZERO_CASES)
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_a_zero_sum_is_plus_zero_on_the_cpu_backend_as_in_stepmath(bias, case):
    """The accumulators are integers, so an exact zero sum is +0 (stepmath's rule) even
    where every float product of the codes is -0.0 (what float BLAS alone gives)."""
    x, w, dy = zero_cases(case)
    layer = zero_case_layer(case, "cpu", bias)
    got = step(layer, torch.from_numpy(x), torch.from_numpy(dy))
    want = reference_step(x, w, f32_values(layer.bias) if bias else None, dy)
    for g, ref in zip(got, want):
        if g is not None:
            assert_same(g, ref)
    assert zero_signs(got[0]) == {1.0} and zero_signs(got[1]) == {1.0}  # y and dX: +0 only


def test_float_blas_alone_gives_minus_zero_for_a_zero_sum():
    """Negative: without the rule the CPU backend's products make -0.0 (x = -0.0 codes to
    -0.0 as a float, and -0.0 * 1 is -0.0), where the int32 accumulator is +0."""
    codes = layer_cpu.row_codes(torch.tensor([[-0.0], [2.0]]), torch.tensor([1.0, 2.0 / 127]))
    t = torch.tensor([[1.0, 1.0]])
    assert zero_signs(torch.mm(codes, t)[0]) == {-1.0}
    assert zero_signs(layer_cpu.exact_product(codes, t, 127)[0]) == {1.0}
    assert layer_cpu.exact_product(-codes, t, 127)[1].tolist() == [-127.0, -127.0]  # other values as they were


def test_the_issues_signed_zero_cases():
    layer = TernaryLinear(1, 2, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0], [0.5]]))
    y = layer(torch.tensor([[-0.0], [2.0]]))
    assert zero_signs(y[0]) == {1.0} and y[0].tolist() == [0.0, 0.0] and (y[1] > 0).all()
    layer = TernaryLinear(3, 2, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 0.01, -1.0], [-1.0, 0.01, 1.0]]))
    x = torch.ones(1, 3, requires_grad=True)
    layer(x).backward(torch.tensor([[-1.0, -2.0]]))
    assert x.grad[0, 1] == 0 and zero_signs(x.grad[:, 1]) == {1.0}


@pytest.mark.parametrize("case", ZERO_CASES)
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_the_emulator_backend_gives_the_cpu_backends_signed_zeros(bias, case):
    if not step_kernels_registered():
        pytest.skip("the layer step's kernels are not in hslm_ptx.catalog.registry yet")
    x, _, dy = zero_cases(case)
    got = step(zero_case_layer(case, "emulator", bias), torch.from_numpy(x), torch.from_numpy(dy))
    want = step(zero_case_layer(case, "cpu", bias), torch.from_numpy(x), torch.from_numpy(dy))
    for g, w in zip(got, want):
        if w is not None:
            assert floats.same_values(bits(g), bits(w), "float32").all(), (g, w)


# ---- no overflow where the exact answer is finite -------------------------------------------

F32_MAX = float(np.finfo(np.float32).max)
EDGE_CASES = {  # name: (x, W, dY, dtype); each would overflow an intermediate of the old order
    "wide_x": ([[3e38, 3e38]], [[0.01, 0.01]], [[1.0]], torch.float32),  # y = 6e36
    "huge_weights": (np.full((2, 4), 1e-3), np.full((3, 4), 1e38), np.ones((2, 3)), torch.float32),  # y = 4e35
    "wide_dy": ([[1e-3, 2e-3]], [[0.01, -0.01], [0.02, 0.01]], [[3e38, -3e38]], torch.float32),  # dX, dW
    "f32_top": ([[F32_MAX], [-F32_MAX]], [[1.0], [0.5]], [[F32_MAX, 1.0], [1.0, -F32_MAX]], torch.float32),
    "bf16_wide_x": ([[3e38, 3e38]], [[0.01, 0.01]], [[1.0]], torch.bfloat16),
    "f16_top": ([[65504.0, 65504.0]], [[0.5, 0.5], [1.0, 1.0]], [[65504.0, -65504.0]], torch.float16),
}


def edge_layer(name: str, backend: str) -> tuple[TernaryLinear, torch.Tensor, torch.Tensor]:
    x, w, dy, dtype = EDGE_CASES[name]
    w = torch.tensor(np.asarray(w, np.float32), dtype=dtype)
    layer = TernaryLinear(w.shape[1], w.shape[0], bias=False, dtype=dtype, backend=backend)
    with torch.no_grad():
        layer.weight.copy_(w)
    return layer, torch.tensor(np.asarray(x, np.float32), dtype=dtype), torch.tensor(np.asarray(dy, np.float32), dtype=dtype)


def exact_results(x: np.ndarray, w: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, ...]:
    """y, dX and dW of the step's own codes and scales with every product exact (float64
    from int64 sums): the ternary answer the f32 arithmetic approximates."""
    beta = np.abs(w.astype(np.float64)).mean()  # the exact mean, not the step's f32 sum
    t = stepmath.ternary_codes(w, np.float32(beta)).astype(np.int64)
    s, t_r = (stepmath.scales_of(stepmath.absmax(a, 1)).astype(np.float64) for a in (x, dy))
    u, v = (stepmath.scales_of(stepmath.absmax(a, 0)).astype(np.float64) for a in (x, dy))
    y = (stepmath.codes(x, s, 1).astype(np.int64) @ t.T) * s[:, None] * beta
    dx = (stepmath.codes(dy, t_r, 1).astype(np.int64) @ t) * t_r[:, None] * beta
    dw = (stepmath.codes(dy, v, 0).astype(np.int64).T @ stepmath.codes(x, u, 0).astype(np.int64)) * v[:, None] * u
    return y, dx, dw


@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_no_overflow_where_the_exact_answer_is_finite(name):
    """y, dX and dW are inf exactly where the exact answer, rounded to the output's type,
    is past its range, and within two roundings of it elsewhere; and they are stepmath's bits."""
    layer, x, dy = edge_layer(name, "cpu")
    got = step(layer, x, dy)[:3]
    xf, wf, dyf = f32_values(x), f32_values(layer.weight), f32_values(dy)
    with np.errstate(over="ignore"):
        exact = [floats.to_f32(floats.from_f32(e.astype(np.float32), FLOAT_TYPES[x.dtype]), FLOAT_TYPES[x.dtype])
                 for e in exact_results(xf, wf, dyf)]
    for g, e in zip(got, exact):
        g = f32_values(g)
        assert np.array_equal(np.isfinite(g), np.isfinite(e)), (g, e)
        finite = np.isfinite(e)
        assert np.allclose(g[finite], e[finite], rtol=2 ** -6 if x.dtype != torch.float32 else 2 ** -22, atol=0)
    for g, ref in zip(got, reference_step(xf, wf, None, dyf)[:3]):
        assert_same(g, ref)
    assert any(np.isfinite(e).any() for e in exact)


def test_the_old_order_overflows_where_the_answer_is_finite():
    """Negative: (f32(acc) * s) * beta and an unscaled |W| sum give inf in two of the cases."""
    s, beta = stepmath.scales_of(np.float32([3e38]))[0], np.float32(0.01)
    with np.errstate(over="ignore"):
        assert np.isinf((np.float32(254) * s) * beta)
        assert np.isinf(np.sum(np.full(12, 1e38, np.float32), dtype=np.float32))
    assert np.isfinite(stepmath.rescale_rows(np.int32([[254]]), np.float32([s]), beta)).all()
    assert stepmath.weight_scale(np.full((3, 4), 1e38, np.float32)) == np.float32(1e38)


@settings(max_examples=300, deadline=None)
@given(acc=st.integers(-(2 ** 24), 2 ** 24),
       a=st.floats(0, F32_MAX, width=32, exclude_min=True), b=st.floats(0, F32_MAX, width=32, exclude_min=True))
def test_a_rescale_is_finite_wherever_its_exact_product_is(acc, a, b):
    """stepmath.rescaled: inf only past the range (allowing the first product's rounding),
    +0 for a zero accumulator."""
    got = stepmath.rescaled(np.int32([acc]), np.float32(a), np.float32(b))[0]
    exact = abs(acc * np.float64(a) * np.float64(b))
    if exact < F32_MAX * (1 - 2 ** -22):
        assert np.isfinite(got)
    if acc == 0:
        assert got == 0 and not np.signbit(got)
    else:
        assert np.isinf(got) or abs(float(got) - acc * float(a) * float(b)) <= exact * 2 ** -22 + 2 ** -140


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-F32_MAX, F32_MAX, width=32), min_size=1, max_size=300))
def test_beta_is_finite_for_every_finite_weight(values):
    """stepmath.weight_scale: never inf for finite weights, and the mean of |W| to within
    the sum's roundings wherever the weights are normal after the 2^-32 scale."""
    w = np.float32(values)
    beta = stepmath.weight_scale(w)
    mean = np.abs(w.astype(np.float64)).mean()
    assert np.isfinite(beta) and beta > 0
    if mean > 2.0 ** -90:
        assert abs(float(beta) - mean) <= mean * 2 ** -14


def test_weights_below_the_scaled_range_sum_to_zero():
    """The documented price of the 2^-32 scale: weights all below 2^-117 in magnitude
    sum to 0, so beta is 1 and every code 0 (2^-94 and up are exact)."""
    assert stepmath.weight_scale(np.full(3, 2.0 ** -120, np.float32)) == 1
    assert stepmath.weight_scale(np.full(3, 2.0 ** -94, np.float32)) == np.float32(2.0 ** -94)


@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_the_emulator_backend_agrees_at_the_range_edges(name):
    if not step_kernels_registered():
        pytest.skip("the layer step's kernels are not in hslm_ptx.catalog.registry yet")
    got, want = (step(*edge_layer(name, backend)) for backend in ("emulator", "cpu"))
    for g, w in zip(got, want):
        if w is not None:
            assert floats.same_values(bits(g), bits(w), FLOAT_TYPES[w.dtype]).all(), (g, w)


def test_meta_tensors_give_shapes_and_dtypes_only():
    """Deferred initialization (device='meta') runs the operators' fake implementations."""
    layer = TernaryLinear(16, 8, device="meta", dtype=torch.bfloat16)
    x = torch.empty(3, 4, 16, device="meta", dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    assert y.shape == (3, 4, 8) and y.dtype == torch.bfloat16 and y.is_meta
    y.sum().backward()
    assert x.grad.shape == x.shape and layer.weight.grad.shape == (8, 16) and layer.bias.grad.dtype == torch.bfloat16


def test_ternary_linear_is_the_layers_function():
    torch.manual_seed(10)
    layer = TernaryLinear(16, 8)
    x = torch.randn(2, 5, 16)
    assert torch.equal(ternary_linear(x, layer.weight, layer.bias), layer(x))


# ---- on a GPU: the CUDA backend, the same bits, and a CUDA graph -------------------------

def cuda_or_skip() -> None:
    if not torch.cuda.is_available():
        pytest.skip("GPU check: torch sees no CUDA device")
    pytest.importorskip("cupy", reason="GPU check: needs CuPy")
    if not step_kernels_registered():
        pytest.skip("the layer step's kernels are not in hslm_ptx.catalog.registry yet")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_cuda_tensors_give_the_cpu_backends_bits(dtype):
    cuda_or_skip()
    R, K, N = 45, 243, 81
    rng = np.random.default_rng(11)
    torch.manual_seed(11)
    cpu = TernaryLinear(K, N, dtype=dtype)
    gpu = TernaryLinear(K, N, dtype=dtype).cuda()
    gpu.load_state_dict(cpu.state_dict())
    x = torch.from_numpy(nasty(rng, (R, K))).to(dtype)
    dy = torch.from_numpy(nasty(rng, (R, N))).to(dtype)
    for got, want in zip(step(gpu, x.cuda(), dy.cuda()), step(cpu, x, dy)):
        assert got.is_cuda
        assert floats.same_values(bits(got.cpu()), bits(want), FLOAT_TYPES[dtype]).all()


def test_a_cuda_graph_replays_a_training_step():
    """Captured forward + backward, replayed after an optimizer step, equals eager on the
    updated weights (the graph holds the weight preparation, so it sees the new version)."""
    cuda_or_skip()
    torch.manual_seed(12)
    layer = TernaryLinear(243, 81).cuda()
    eager = TernaryLinear(243, 81).cuda()
    x = torch.randn(64, 243, device="cuda")
    dy = torch.randn(64, 81, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture stream, as torch's docs ask
        for _ in range(2):
            layer.weight.grad = layer.bias.grad = None
            layer(x).backward(dy)
    torch.cuda.current_stream().wait_stream(side)
    layer.weight.grad = layer.bias.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = layer(x)
        y.backward(dy)
    with torch.no_grad():
        layer.weight.mul_(-1.5)
    graph.replay()
    eager.load_state_dict(layer.state_dict())
    want = step(eager, x, dy)
    assert torch.equal(y, want[0]) and torch.equal(layer.weight.grad, want[2]) and torch.equal(layer.bias.grad, want[3])


# ---- the package around the layer ---------------------------------------------------------

def test_trainer_imports_never_touch_ptxas():
    """kernels and the torch layer import and run with the nvcc wheel and the build pipeline
    unimportable and no subprocess allowed (ptxas is only a build step)."""
    code = r"""
import importlib.abc, subprocess, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "nvidia" or name.startswith("hslm_ptx.pipeline"):
            raise ImportError(f"blocked: {name}")
sys.meta_path.insert(0, Block())
def no_subprocess(*a, **k):
    raise AssertionError(f"subprocess started: {a}")
subprocess.Popen = no_subprocess
try:
    import nvidia.cuda_nvcc
    raise SystemExit("the block did not hold")
except ImportError:
    pass
import torch
import hslm_ptx
from hslm_ptx import TernaryLinear, forward, pack
layer = TernaryLinear(16, 8)
layer(torch.randn(3, 16, requires_grad=True)).sum().backward()
assert layer.weight.grad is not None
print("ok", sorted(m for m in sys.modules if m.startswith(("nvidia", "hslm_ptx.pipeline"))))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok []"


def test_the_training_demo_runs(tmp_path):
    """examples/train_demo.py end to end for a few steps: three models, a PNG."""
    out = tmp_path / "demo.png"
    result = subprocess.run([sys.executable, "examples/train_demo.py", "--steps", "3", "--out", str(out)],
                            capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("held-out accuracy") == 3
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_export_is_documented():
    import hslm_ptx

    assert "TernaryLinear" in hslm_ptx.__all__ and "forward" in hslm_ptx.__all__
    for name in hslm_ptx.__all__:
        doc = getattr(hslm_ptx, name).__doc__
        assert doc and doc.strip(), f"kernels.{name} has no docstring"
    with pytest.raises(AttributeError):
        hslm_ptx.no_such_name  # noqa: B018
