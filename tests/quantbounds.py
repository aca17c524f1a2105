"""Error bounds of the quantized float ops, shared by the ops and torch tests.

Bounds (|x - s q| <= s/2 per element, W exactly ternary * beta):
  forward  |Y - Y~|[r, j]   <= (s_r / 2) sum_i |W[i, j]| beta
  dX       |dX - dX~|[r, i] <= (t_r / 2) sum_j |W[i, j]| beta
  dW       |dW - dW~|[i, j] <= sum_r |v_j qy| u_i / 2 + |u_i qx| v_j / 2 + u_i v_j / 4
Scales are recomputed here from the definition (s = max|x| / 127 per slice), not taken
from hslm_ptx/reference/quant.py.
"""
from __future__ import annotations

import numpy as np

EPS = 1e-12  # f64 rounding slack, relative to the size of the terms summed


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
    """K x N, the orientation of ops.grad_weight's result."""
    u, v = row_scales(x, 0), row_scales(dy, 0)  # (1, K), (1, N)
    sx = np.abs(u * codes(x, u)).sum(axis=0)  # (K,)
    sy = np.abs(v * codes(dy, v)).sum(axis=0)  # (N,)
    R = x.shape[0]
    return u.T / 2 * sy[None, :] + v / 2 * sx[:, None] + R * (u.T * v) / 4


def assert_tight(got, ref, bound, scale):
    inside, err, typical = check_bound(got, ref, bound, scale)
    assert inside, f"error over the bound by {(err - bound).max():g}"
    assert err.max() > 0, "no error at all: the bound was never tested"
    # random rounding errors add like sqrt(n) against the bound's n: far from the bound
    assert 0 < typical < 0.3, f"median error is {typical:.2f} of the bound"
