"""The float ops over numpy or CuPy arrays: forward, dX and dW around the int8 kernels.

Each op quantizes its float operands with symmetric int8 scales (hslm_ptx/reference/quant.py), launches
the integer kernel through :func:`hslm_ptx.runtime.launch.launch`, and rescales the int32 result.
The quantizing pass writes the int8 codes straight into the layout the kernel reads
(hslm_ptx.kernel.pitch.kernel_buffer: rows at a 16-byte aligned pitch for forward/dX, Xq^T and
dYq^T at a pitch for dW), handed to launch marked KernelLayout, so launch copies nothing:

- forward  Y[r, j]  = s_r beta  * sum_i Xq[r, i] W[i, j]     (s_r: one scale per row of X)
- dX       dX[r, i] = t_r beta  * sum_j dYq[r, j] W[i, j]    (t_r: one scale per row of dY)
- dW       dW[j, i] = v_j u_i   * sum_r dYq[r, j] Xq[r, i]   (u_i, v_j: per column of X, dY)

Orientation: W is K x N everywhere a caller sees it (Y = X W): ``pack`` takes K x N and
``grad_weight`` returns K x N (a transposed view of the kernel's N x K output, no copy),
so ``pack(ternarize(W - lr * grad_weight(x, dy)))`` needs no transpose.

The array module of the inputs picks the backend: numpy arrays run the same PTX on the
CPU emulator (hslm_ptx.emu), CuPy arrays run it on the GPU (hslm_ptx.runtime.backends). Both
are called as CuPy's RawKernel is, so nothing below knows which one ran. The PTX is
emitted in-process from the kernel's spec (the same text `doit emit` writes).

dW accumulates in int32 inside the kernel, exact for R <= spec.max_rows (131071); more
rows are split into chunks of at most that many, each launched separately and summed
in int64. The column scales are taken over all R rows before splitting, so a chunked
dW equals the unchunked one exactly; each chunk is quantized into its own transposed
buffer, so no int8 copy of all R rows exists at once.

Bad input is refused before any work with one LaunchError line (hslm_ptx.validate):
x / dY not 2-D, empty or not real, a non-finite value (seen in the quantization scale
the op computes anyway), a non-finite beta; W's layout and codes are checked by
hslm_ptx.runtime.launch.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from hslm_ptx.runtime.launch import launch
from hslm_ptx.kernel.pitch import KernelLayout, kernel_buffer
from hslm_ptx.reference.quant import codes_into, scale_of
from hslm_ptx.catalog.registry import choose, get_kernel
from hslm_ptx.kernel.spec import Dims, KernelSpec
from hslm_ptx.validate import LaunchError, finite_scales, float_matrix, module_of, real_number, whole_number

_FUNCTIONS: dict[tuple[str, str], Callable[..., Any]] = {}


def kernel_function(name: str, xp: Any) -> Callable[..., Any]:
    """The kernel as a RawKernel-style callable for ``xp``: emulator (numpy) or CuPy."""
    key = (name, xp.__name__)
    if key not in _FUNCTIONS:
        from hslm_ptx.runtime.backends import load_ptx

        backend = "emulator" if xp is np else "gpu"
        _FUNCTIONS[key] = load_ptx(backend, get_kernel(name).emit(), name)
    return _FUNCTIONS[key]


def _run(spec: KernelSpec, dims: Dims, inputs: dict[str, Any], xp: Any, fn: Callable | None) -> Any:
    return launch(spec, fn or kernel_function(spec.name, xp), dims, inputs, xp=xp)


def _scales(op: str, name: str, a: Any, axis: int) -> Any:
    """The f64 scales of ``a`` (one per row for axis=1, per column for axis=0), refusing a
    non-finite value before anything is rounded or launched."""
    scale = scale_of(a, axis)
    finite_scales(op, name, a, scale, axis)
    return scale


def _codes(spec: KernelSpec, name: str, dims: Dims, a: Any, scale: Any, xp: Any) -> KernelLayout:
    """The int8 codes of ``a`` written by the quantizing pass straight into a buffer in the
    layout ``spec`` reads its input ``name`` in (pitched rows, or transposed), so launch
    checks it and copies nothing."""
    param = next(p for p in spec.params if p.name == name)
    buf, logical = kernel_buffer(param, dims, xp)
    codes_into(a, scale, logical)
    return buf


def _check_beta(op: str, beta: float) -> float:
    """beta as a float, refused unless a finite real number (it multiplies every output)."""
    return real_number(op, "beta", beta, "the finite scale of the ternary weights (hslm_ptx.reference.quant.ternarize)")


def _rescale(acc: Any, a: Any, b: Any, xp: Any) -> Any:
    """``acc * (a * b)``: the integer result times its two scales (broadcast), in that order
    wherever ``a * b`` is a normal float. Where that product overflows or is subnormal
    (scales near the ends of the f64 range: x near 1e308 times beta = 1000) the same value
    is taken as mantissas times 2 to the summed exponents, so 0 stays 0 instead of
    0 * inf = NaN and a finite answer stays finite."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):  # the odd cases are redone below
        scale = a * b
        out = acc * scale
    odd = ~(abs(scale) >= xp.finfo(xp.float64).tiny) | ~xp.isfinite(scale)
    if not bool(odd.any()):
        return out
    (ma, ea), (mb, eb) = xp.frexp(a), xp.frexp(b)
    with np.errstate(over="ignore", under="ignore"):  # what overflows now is the answer itself
        exact = xp.ldexp(acc * ma * mb, ea + eb)
    return xp.where(xp.broadcast_to(odd, out.shape), exact, out)


def _packed_columns(w_packed: Any, K: int) -> int:
    """N of a packed (N, Kp/16) buffer; for an unpacked K x N matrix its N, so the launch
    check can name the packed shape it should have been."""
    shape = tuple(getattr(w_packed, "shape", ()))
    if str(getattr(w_packed, "dtype", "")) != "uint32" and len(shape) == 2 and shape[0] == K:
        return shape[1]
    return shape[0] if shape else 1


def _float_dtype(xp: Any, *arrays: Any) -> Any:
    """The result dtype: the inputs' float type (float64 if none is float)."""
    kinds = [a.dtype for a in arrays if a.dtype.kind == "f"]
    return xp.result_type(*kinds) if kinds else xp.float64


def _row_rescaled(op: str, family: str, name: str, a: Any, w_packed: Any, beta: float, dims: Dims, xp: Any,
                  fn: Callable | None) -> Any:
    """Forward and dX alike: per-row scales of ``a``, its codes in the layout of the
    configuration the tile rule picks, the kernel against W, and the rescale by scale x beta."""
    s = _scales(op, name, a, axis=1)
    spec = choose(family, dims)
    out = _run(spec, dims, {name: _codes(spec, name, dims, a, s, xp), "w": w_packed}, xp, fn)
    return _rescale(out, s, beta, xp).astype(_float_dtype(xp, a), copy=False)


def forward(x: Any, w_packed: Any, beta: float, *, fn: Callable | None = None) -> Any:
    """Y = X @ (beta * W): X float R x K, W packed ternary (N, Kp/16); returns R x N."""
    xp = module_of(x, w_packed, op="forward")
    R, K = float_matrix("forward", "x", x, "R x K")
    N = _packed_columns(w_packed, K)
    beta = _check_beta("forward", beta)
    return _row_rescaled("forward", "hslm_fwd_s8", "x", x, w_packed, beta, Dims(R, K, N), xp, fn)


def grad_input(dy: Any, w_packed: Any, beta: float, K: int, *, fn: Callable | None = None) -> Any:
    """dX = dY @ (beta * W)^T: dY float R x N, W packed for K in-features; returns R x K."""
    xp = module_of(dy, w_packed, op="grad_input")
    K = whole_number("grad_input", "K", K)  # the in-features W was packed for
    columns = tuple(getattr(w_packed, "shape", ()))[:1]
    R, N = float_matrix("grad_input", "dy", dy, "R x N", reshape=f"(-1, {columns[0]})" if columns else None)
    beta = _check_beta("grad_input", beta)
    return _row_rescaled("grad_input", "hslm_dx_s8", "dy", dy, w_packed, beta, Dims(R, K, N), xp, fn)


def grad_weight(x: Any, dy: Any, *, chunk_rows: int | None = None,
                fn: Callable | None = None) -> Any:
    """dW = X^T @ dY in W's K x N orientation: X R x K, dY R x N floats; returns K x N.

    The kernel writes N x K (dW[j, i]); the result is its transposed view, so it has
    the orientation :func:`hslm_ptx.formats.ternary.pack` takes. Rows are launched in chunks of
    ``chunk_rows`` (default: the kernel's exact bound, 131071) and summed in int64; a
    chunk over that bound is refused.
    """
    xp = module_of(x, dy, op="grad_weight")
    spec = get_kernel("hslm_dw_s8")
    R, K = float_matrix("grad_weight", "x", x, "R x K")
    if getattr(dy, "ndim", 0) == 2 and dy.shape[0] != R:
        raise LaunchError(f"grad_weight: x has {R} rows but dy has {dy.shape[0]}; both are R rows of one batch")
    N = float_matrix("grad_weight", "dy", dy, "R x N", reshape=f"({R}, -1)")[1]  # dY has X's rows
    chunk = spec.max_rows if chunk_rows is None else whole_number("grad_weight", "chunk_rows", chunk_rows)
    if not 1 <= chunk <= spec.max_rows:
        raise LaunchError(
            f"grad_weight: chunk_rows={chunk_rows} must be in 1..{spec.max_rows} "
            "(int32 accumulation inside one launch is exact only up to that many rows)"
        )
    u = _scales("grad_weight", "x", x, axis=0)  # u: (1, K), over all R rows so chunks share scales
    v = _scales("grad_weight", "dy", dy, axis=0)  # v: (1, N)
    total = xp.zeros((N, K), dtype=xp.int64)
    for r0 in range(0, R, chunk):
        r1 = min(R, r0 + chunk)
        dims = Dims(r1 - r0, K, N)
        config = choose(spec.family_name, dims)  # the configuration the tile rule picks
        inputs = {"x": _codes(config, "x", dims, x[r0:r1], u, xp),  # Xq^T, K x pitch(r1 - r0)
                  "dy": _codes(config, "dy", dims, dy[r0:r1], v, xp)}  # dYq^T, N x pitch(r1 - r0)
        total += _run(config, dims, inputs, xp, fn)
    return _rescale(total, v.reshape(N, 1), u, xp).astype(_float_dtype(xp, x, dy), copy=False).T
