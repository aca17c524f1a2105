"""Symmetric int8 quantization: range, scales, and the |x - s q| <= s/2 bound."""
import numpy as np
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from kernels.quant import quantize_cols, quantize_rows, scale_of, ternarize

finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=64)


@settings(max_examples=80, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 6), st.integers(1, 9)), elements=finite))
def test_error_within_half_a_step(x):
    for quantize, axis in ((quantize_rows, 1), (quantize_cols, 0)):
        q, s = quantize(x)
        assert q.dtype == np.int8 and q.min() >= -127
        assert s.shape == (x.shape[0], 1) if axis == 1 else s.shape == (1, x.shape[1])
        assert np.all(np.abs(x - s * q) <= s / 2 * (1 + 1e-12))


def test_row_maximum_maps_to_127_and_zero_rows_get_scale_one():
    x = np.array([[0.0, 0.0], [-2.0, 1.0], [0.5, 0.25]])
    q, s = quantize_rows(x)
    assert s.ravel().tolist() == [1.0, 2 / 127, 0.5 / 127]
    assert q.tolist() == [[0, 0], [-127, 64], [127, 64]]


def test_column_scales_are_per_column():
    x = np.array([[1.0, -4.0], [-0.5, 2.0]])
    q, s = quantize_cols(x)
    assert s.ravel().tolist() == [1 / 127, 4 / 127]
    assert q[:, 0].tolist() == [127, -64] and q[:, 1].tolist() == [-127, 64]


def test_error_is_not_vacuously_zero():
    x = np.random.default_rng(1).standard_normal((8, 64))
    q, s = quantize_rows(x)
    err = np.abs(x - s * q)
    assert err.max() > 0.1 * s.max() / 2  # real rounding happens...
    assert np.all(err <= s / 2)  # ...and stays inside the bound


def test_ternarize_absmean():
    w = np.array([[0.9, -0.05], [-1.1, 0.4]])
    t, beta = ternarize(w)
    assert beta == np.abs(w).mean()
    assert t.tolist() == [[1, 0], [-1, 1]]
    zero_t, zero_beta = ternarize(np.zeros((2, 2)))
    assert zero_beta == 1.0 and not zero_t.any()


def test_a_non_finite_value_shows_in_its_slice_scale_only():
    """The float ops' non-finite check reads the scales: a NaN or inf must reach exactly
    the scale of its own row (axis=1) or column (axis=0)."""
    x = np.ones((3, 4))
    x[1, 2], x[2, 0] = np.nan, -np.inf
    rows, cols = scale_of(x, axis=1).ravel(), scale_of(x, axis=0).ravel()
    assert np.isfinite(rows).tolist() == [True, False, False]
    assert np.isfinite(cols).tolist() == [False, True, False, True]
