"""Symmetric int8 quantization: range, scales, and the |x - s q| <= s/2 bound."""
import numpy as np
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

import pytest

from hslm_ptx.reference.quant import codes_for, codes_into, quantize_cols, quantize_rows, scale_of, ternarize

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


# ---- codes_into: the same codes, written into a caller's (pitched, transposed) view ----

def _awkward(rng):
    """Random rows with exact .5 ties (the row max 127 makes the scale 1), an all-zero row
    and an all-zero column, in float32 and float64."""
    x = rng.standard_normal((13, 21)) * 10.0 ** rng.uniform(-3, 3, (13, 1))
    x[2] = rng.integers(-126, 126, 21) + 0.5  # ties: round half to even decides each one
    x[2, 0] = 127.0
    x[5] = 0.0
    x[:, 7] = 0.0
    return x


def _old_codes(x, scale):
    """The expression the float ops used before codes_into existed."""
    return (x / scale).round().clip(-127, 127).astype("int8")


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize("axis", [0, 1])
def test_codes_into_equals_codes_for(dtype, axis):
    rng = np.random.default_rng(axis)
    x = _awkward(rng).astype(dtype)
    for scale in (scale_of(x, axis), scale_of(x, axis) / 3):  # / 3: a third of the codes clip
        want = _old_codes(x, scale)
        out = np.full(x.shape, 99, np.int8)
        codes_into(x, scale, out)
        assert np.array_equal(out, want) and np.array_equal(codes_for(x, scale), want)
    # the data is not vacuous: ties, clipping and all-zero slices all occur
    assert np.any(np.abs(x[2].astype(np.float64)) % 1 == 0.5) and (np.abs(x / scale) > 128).sum() >= 10
    assert not want[5].any() and not want[:, 7].any()


def test_ties_round_to_even_not_away_from_zero():
    """Negative: rounding half away from zero (a plausible other implementation) differs
    on the tie row, so the equality above would catch it."""
    x = _awkward(np.random.default_rng(0))
    scale = scale_of(x, 1)
    out = np.zeros(x.shape, np.int8)
    codes_into(x, scale, out)
    away = (np.sign(x / scale) * np.floor(np.abs(x / scale) + 0.5)).astype(np.int8)
    assert scale[2, 0] == 1.0 and not np.array_equal(out[2], away[2])
    assert out[2].tolist() == np.round(x[2]).astype(int).tolist()


def test_codes_into_a_transposed_pitched_view_leaves_the_padding_alone():
    x = _awkward(np.random.default_rng(3))
    scale = scale_of(x, 0)
    buf = np.zeros((21, 16), np.int8)  # x^T at pitch 16 (13 rows of x, 3 bytes padding)
    codes_into(x, scale, buf[:, :13].T)
    assert np.array_equal(buf[:, :13], codes_for(x, scale).T) and not buf[:, 13:].any()
    rows = np.zeros((13, 32), np.int8)  # x at pitch 32
    codes_into(x, scale, rows[:, :21])
    assert np.array_equal(rows[:, :21], codes_for(x, scale)) and not rows[:, 21:].any()


@pytest.mark.parametrize("out", [np.zeros((13, 20), np.int8), np.zeros((21, 13), np.int8),
                                 np.zeros((13, 21), np.int16)])
def test_codes_into_refuses_an_out_of_another_shape_or_dtype(out):
    x = np.ones((13, 21))
    with pytest.raises(ValueError, match=r"codes_into: out is int\d+\(\d+, \d+\), expected int8\(13, 21\)"):
        codes_into(x, scale_of(x, 1), out)
