"""Input checks for the float ops and the launch routine: each bad input is one line.

A refusal is a :class:`LaunchError` whose message names the entry (``forward``, a kernel
name), the input, what was expected against what came, and what to do. The checks look
at metadata (ndim, shape, dtype) before any data is touched; the only data checks are
the packed-weight code scan (hslm_ptx.formats.ternary.code_problem, one vectorised pass) and the
finiteness of the quantization scales, which the quantizer computes anyway (a NaN or an
inf in a row makes that row's max|x|, hence its scale, non-finite).
Works on numpy and CuPy arrays alike.
"""
from __future__ import annotations

from typing import Any

import numpy as np


class LaunchError(ValueError):
    """A launch or float op was refused before it started (bad input shape, dtype, value or size)."""


def module_of(*arrays: Any, op: str = "") -> Any:
    """numpy or cupy, from the arrays given; mixing the two (or another library) is refused
    (``op`` names the caller in that message)."""
    mods = {type(a).__module__.split(".")[0] for a in arrays}
    if mods <= {"numpy"}:
        return np
    if mods == {"cupy"}:
        import cupy  # optional: only reached when a CuPy array was passed in

        return cupy
    raise LaunchError(
        f"{op + ': ' if op else ''}inputs must all be numpy or all be cupy arrays, got {sorted(mods)}; "
        "torch tensors go through hslm_ptx.nn.linear (or numpy/cupy .from_dlpack)"
    )


def _scalar(value: Any) -> Any:
    """A 0-d numpy or CuPy array of numbers as its Python scalar; anything else as it is."""
    if getattr(value, "ndim", None) == 0 and getattr(getattr(value, "dtype", None), "kind", "") in "biuf":
        return value.item()
    return value


def whole_number(op: str, name: str, value: Any, low: int = 1) -> int:
    """``value`` as an int when it is a whole number >= ``low`` given as an integer (a bool, a
    float such as 20.0, or a string such as '20' is refused: each hides a caller's mistake)."""
    value = _scalar(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise LaunchError(f"{op}: {name}={value!r} is a {type(value).__name__}; expected an int >= {low}")
    if value < low:
        raise LaunchError(f"{op}: {name}={value} is below {low}; expected an int >= {low}")
    return int(value)


def real_number(op: str, name: str, value: Any, what: str = "a finite float") -> float:
    """``value`` as a float when it is a finite real number (int, float or a numpy scalar, not a
    string or a bool); ``what`` says in the refusal what it should have been."""
    value = _scalar(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise LaunchError(f"{op}: {name}={value!r} is a {type(value).__name__}; expected {what}")
    if not np.isfinite(value):
        raise LaunchError(f"{op}: {name} is {value}; expected {what}")
    return float(value)


def check_dims(op: str, dims: Any) -> None:
    """Every field of a Dims (R, K, N) a whole number >= 1, else one LaunchError line naming it."""
    for field, value in zip(getattr(dims, "_fields", ("R", "K", "N")), dims):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise LaunchError(f"{op}: Dims.{field}={value!r} is a {type(value).__name__}; sizes are ints >= 1")
        if value < 1:
            raise LaunchError(f"{op}: R, K, N must be >= 1, got {tuple(dims)}; an empty problem has nothing to "
                              "compute: skip the launch")


def float_matrix(op: str, name: str, a: Any, axes: str, reshape: str | None = None) -> tuple[int, int]:
    """The (rows, cols) of a non-empty 2-D real array, or a LaunchError naming ``name``.

    ``axes`` names the two dimensions for the message, e.g. ``"R x K"``; ``reshape`` is the
    reshape that fits a 1-D or n-D array where the caller knows a dimension (``"(27, -1)"``:
    dY's rows are X's), else one row of its last dimension's width is suggested.
    """
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        raise LaunchError(f"{op}: {name} is a {type(a).__name__}; expected a 2-D numpy or cupy array ({axes})")
    shape = tuple(a.shape)
    if len(shape) != 2:
        fits = reshape or f"(-1, {shape[-1]})"
        hint = f"; reshape it, e.g. {name}.reshape{fits}" if shape else ""
        raise LaunchError(f"{op}: {name} must be a 2-D array ({axes}), got shape {shape}{hint}")
    if 0 in shape:
        raise LaunchError(
            f"{op}: {name} has shape {shape} ({axes}); every dimension must be >= 1: "
            "skip the call for an empty batch"
        )
    if a.dtype.kind not in "fiu":
        raise LaunchError(f"{op}: {name} is {a.dtype}; expected a real array (float16/32/64 or integer)")
    return shape


def finite_scales(op: str, name: str, a: Any, scale: Any, axis: int) -> None:
    """Refuse ``a`` when a slice's quantization scale is not finite (the slice holds inf or NaN)."""
    if bool(module_of(scale).isfinite(scale).all()):
        return
    xp = module_of(a)
    r, c = (int(v) for v in xp.argwhere(~xp.isfinite(a))[0])
    slice_name = f"row {r}" if axis == 1 else f"column {c}"
    raise LaunchError(
        f"{op}: {name} has a non-finite value ({a[r, c].item()}) at ({r}, {c}), so {slice_name} "
        "has no int8 scale; find where it came from (a diverging loss, a too-large learning rate)"
    )
