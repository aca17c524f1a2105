"""Input checks for the float ops and the launch routine: each bad input is one line.

A refusal is a :class:`LaunchError` whose message names the entry (``forward``, a kernel
name), the input, what was expected against what came, and what to do. The checks look
at metadata (ndim, shape, dtype) before any data is touched; the only data checks are
the packed-weight code scan (kernels.ternary.code_problem, one vectorised pass) and the
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
        "torch tensors go through kernels.torch_linear (or numpy/cupy .from_dlpack)"
    )


def float_matrix(op: str, name: str, a: Any, axes: str) -> tuple[int, int]:
    """The (rows, cols) of a non-empty 2-D real array, or a LaunchError naming ``name``.

    ``axes`` names the two dimensions for the message, e.g. ``"R x K"``.
    """
    shape = tuple(getattr(a, "shape", ()))
    if len(shape) != 2:
        hint = f"; reshape it, e.g. {name}.reshape(-1, {shape[-1]})" if shape else ""
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
