"""The float ops a trainer calls: forward, dX and dW around the int8 kernels.

Each op quantizes its float operands with the DESIGN scales (kernels/quant.py), launches
the integer kernel through :func:`kernels.launch.launch`, and rescales the int32 result:

- forward  Y[r, j]  = s_r beta  * sum_i Xq[r, i] W[i, j]     (s_r: one scale per row of X)
- dX       dX[r, i] = t_r beta  * sum_j dYq[r, j] W[i, j]    (t_r: one scale per row of dY)
- dW       dW[j, i] = v_j u_i   * sum_r dYq[r, j] Xq[r, i]   (u_i, v_j: per column of X, dY)

The array module of the inputs picks the backend: numpy arrays run the same PTX on the
CPU emulator (kernels.ptxemu), CuPy arrays run it on the GPU (kernels.backends). Both
are called as CuPy's RawKernel is, so nothing below knows which one ran. The PTX is
emitted in-process from the kernel's spec (the same text `doit emit` writes).

dW accumulates in int32 inside the kernel, exact for R <= spec.max_rows (131071); more
rows are split into chunks of at most that many, each launched separately and summed
in int64. The column scales are taken over all R rows before splitting, so a chunked
dW equals the unchunked one exactly.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from kernels.launch import LaunchError, launch
from kernels.quant import quantize_cols, quantize_rows
from kernels.registry import get_kernel
from kernels.spec import Dims

_FUNCTIONS: dict[tuple[str, str], Callable[..., Any]] = {}


def array_module(*arrays: Any) -> Any:
    """numpy or cupy, from the arrays given; mixing the two is refused."""
    mods = {type(a).__module__.split(".")[0] for a in arrays}
    if mods <= {"numpy"}:
        return np
    if mods == {"cupy"}:
        import cupy

        return cupy
    raise LaunchError(f"inputs must all be numpy or all be cupy arrays, got {sorted(mods)}")


def kernel_function(name: str, xp: Any) -> Callable[..., Any]:
    """The kernel as a RawKernel-style callable for ``xp``: emulator (numpy) or CuPy."""
    key = (name, xp.__name__)
    if key not in _FUNCTIONS:
        from kernels.backends import load_ptx

        backend = "emulator" if xp is np else "gpu"
        _FUNCTIONS[key] = load_ptx(backend, get_kernel(name).emit(), name)
    return _FUNCTIONS[key]


def _run(name: str, dims: Dims, inputs: dict[str, Any], xp: Any, fn: Callable | None) -> Any:
    spec = get_kernel(name)
    return launch(spec, fn or kernel_function(name, xp), dims, inputs, xp=xp)


def _float_dtype(xp: Any, *arrays: Any) -> Any:
    """The result dtype: the inputs' float type (float64 if none is float)."""
    kinds = [a.dtype for a in arrays if a.dtype.kind == "f"]
    return xp.result_type(*kinds) if kinds else xp.float64


def forward(x: Any, w_packed: Any, beta: float, *, fn: Callable | None = None) -> Any:
    """Y = X @ (beta * W): X float R x K, W packed ternary (N, Kp/16); returns R x N."""
    xp = array_module(x, w_packed)
    R, K = x.shape
    N = w_packed.shape[0]
    xq, s = quantize_rows(x)
    y = _run("hslm_fwd_s8", Dims(R, K, N), {"x": xq, "w": w_packed}, xp, fn)
    return (y * (s * beta)).astype(_float_dtype(xp, x), copy=False)


def grad_input(dy: Any, w_packed: Any, beta: float, K: int, *, fn: Callable | None = None) -> Any:
    """dX = dY @ (beta * W)^T: dY float R x N, W packed for K in-features; returns R x K."""
    xp = array_module(dy, w_packed)
    R, N = dy.shape
    yq, t = quantize_rows(dy)
    dx = _run("hslm_dx_s8", Dims(R, K, N), {"dy": yq, "w": w_packed}, xp, fn)
    return (dx * (t * beta)).astype(_float_dtype(xp, dy), copy=False)


def grad_weight(x: Any, dy: Any, *, chunk_rows: int | None = None,
                fn: Callable | None = None) -> Any:
    """dW = dY^T @ X in W's layout: X R x K, dY R x N floats; returns N x K.

    Rows are launched in chunks of ``chunk_rows`` (default: the kernel's exact bound,
    131071) and summed in int64; a chunk over that bound is refused.
    """
    xp = array_module(x, dy)
    spec = get_kernel("hslm_dw_s8")
    R, K = x.shape
    if dy.shape[0] != R:
        raise LaunchError(f"grad_weight: x has {R} rows but dy has {dy.shape[0]}")
    N = dy.shape[1]
    chunk = spec.max_rows if chunk_rows is None else chunk_rows
    if not 1 <= chunk <= spec.max_rows:
        raise LaunchError(
            f"grad_weight: chunk_rows={chunk_rows} must be in 1..{spec.max_rows} "
            "(int32 accumulation inside one launch is exact only up to that many rows)"
        )
    xq, u = quantize_cols(x)  # u: (1, K), over all R rows so chunks share scales
    yq, v = quantize_cols(dy)  # v: (1, N)
    total = xp.zeros((N, K), dtype=xp.int64)
    for r0 in range(0, R, chunk):
        r1 = min(R, r0 + chunk)
        total += _run(spec.name, Dims(r1 - r0, K, N), {"x": xq[r0:r1], "dy": yq[r0:r1]}, xp, fn)
    return (total * (v.reshape(N, 1) * u)).astype(_float_dtype(xp, x, dy), copy=False)
