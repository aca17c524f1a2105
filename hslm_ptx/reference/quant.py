"""Symmetric int8 quantization with the scales the integer kernels assume.

q = clip(round(x / s), -127, 127) with s = max|x| / 127 over one slice (s = 1 for an
all-zero slice), so |x - s q| <= s / 2 elementwise: the bound every f64 test uses.
-128 is never produced, which keeps int8 products symmetric.

Which slice carries one scale depends on the product that follows:
- forward and dX contract along a row of X / dY: one scale per row (``axis=1``);
- dW contracts along rows: one scale per column of X (u_i) and of dY (v_j) (``axis=0``).
Works on numpy and CuPy arrays alike (only array methods and ufuncs are used).
"""
from __future__ import annotations

from typing import Any

import numpy as np

QMAX = 127
F64_MAX = float(np.finfo(np.float64).max)


def scale_of(x: Any, axis: int) -> Any:
    """One f64 scale per slice reduced over ``axis``, keeping that axis (shape (R, 1) for
    ``axis=1``) so ``q * scale`` broadcasts back to ``x``.

    max|x| / 127, or 1 for an all-zero slice (or one so tiny its scale underflows). A
    slice holding inf or NaN gets a non-finite scale: callers check it (hslm_ptx.validate)
    before rounding, so that bad input costs no pass of its own.
    """
    scale = abs(x.astype("float64", copy=False)).max(axis=axis, keepdims=True) / QMAX
    scale[scale == 0] = 1.0
    return scale


def _rounded(x: Any, scale: Any) -> Any:
    """clip(round(x / scale), -127, 127) in one f64 temporary, rounded and clipped in place
    (``round``: half to even), the same values as rounding and clipping into new arrays."""
    q = x / scale
    q.round(out=q)
    return q.clip(-QMAX, QMAX, out=q)


def codes_for(x: Any, scale: Any) -> Any:
    """clip(round(x / scale), -127, 127) as a new int8 array of ``x``'s shape."""
    return _rounded(x, scale).astype("int8")


def codes_into(x: Any, scale: Any, out: Any) -> None:
    """The codes of :func:`codes_for` written into ``out``, an int8 array or view of
    ``x``'s shape (any strides: the logical part of a pitched or transposed kernel
    buffer, hslm_ptx.kernel.pitch.kernel_buffer), so they land in the kernel's layout with no
    int8 array in between. The values are whole numbers in [-127, 127], so the
    assignment's float -> int8 cast is exact."""
    if tuple(out.shape) != tuple(x.shape) or str(out.dtype) != "int8":
        raise ValueError(f"codes_into: out is {out.dtype}{tuple(out.shape)}, expected int8{tuple(x.shape)} (x's shape)")
    if not getattr(getattr(out, "flags", None), "writeable", True):
        raise ValueError("codes_into: out is read-only; pass a writeable int8 array (hslm_ptx.kernel.pitch.kernel_buffer)")
    out[...] = _rounded(x, scale)


def quantize(x: Any, axis: int) -> tuple[Any, Any]:
    """Quantize ``x`` with one scale per slice reduced over ``axis``; returns (q int8, scale f64)."""
    scale = scale_of(x, axis)
    return codes_for(x, scale), scale


def quantize_rows(x: Any) -> tuple[Any, Any]:
    """One scale per row (forward: X; dX: dY)."""
    return quantize(x, axis=1)


def quantize_cols(x: Any) -> tuple[Any, Any]:
    """One scale per column (dW: u_i for X, v_j for dY)."""
    return quantize(x, axis=0)


def ternarize(w: Any) -> tuple[Any, float]:
    """Float weights -> ({-1, 0, +1} int8, beta) with beta = mean|w| (absmean, as BitNet b1.58).

    An all-zero matrix gets beta = 1 so that beta * t reproduces it. A list is taken as a
    numpy array. An empty matrix, one that is not real numbers, or one holding NaN or inf
    has no such scale and is refused (ValueError naming the first bad element): its codes
    would be all zero and beta NaN. Where the plain mean overflows (weights near 1e308) it
    is taken over |w| / max|w|, then scaled back.
    """
    if not hasattr(w, "dtype"):
        try:
            w = np.asarray(w)
        except ValueError:  # a ragged list
            raise ValueError("ternarize: w is a ragged list (rows of different lengths); pass a K x N array") from None
    if w.dtype.kind not in "biuf":
        raise ValueError(f"ternarize: w is {w.dtype}; expected real (float or integer) weights")
    if w.size == 0:
        raise ValueError(f"ternarize: w has shape {tuple(w.shape)}, no weights to take a scale of")
    w = w.astype("float64", copy=False)
    finite = abs(w) <= F64_MAX  # False for NaN and for +-inf; array methods only (numpy or CuPy)
    if not bool(finite.all()):
        where = tuple(int(axis[0]) for axis in (~finite).nonzero())
        raise ValueError(f"ternarize: w has a non-finite value ({w[where].item()}) at {where}; "
                         "find where it came from (a diverging loss, a too-large learning rate)")
    with np.errstate(over="ignore"):
        beta = float(abs(w).mean())
    if not np.isfinite(beta):  # the sum overflowed: the mean of |w| / max|w| cannot
        top = float(abs(w).max())
        beta = float((abs(w) / top).mean()) * top
    if beta == 0.0:
        return w.astype("int8"), 1.0
    return (w / beta).round().clip(-1, 1).astype("int8"), beta
