"""The layer step on CPU tensors: the kernels' integers, with float BLAS doing the products.

A TernaryLinear step is three integer products between float passes (hslm_ptx.reference.stepmath
fixes every float operation and its order). On the CPU the quantize and rescale passes
run as torch elementwise ops that give the same bits as stepmath (IEEE f32 division and
multiplication, ``torch.round`` half to even like ``np.rint``; the tests compare them bit
for bit on random data with ties), the ordered reductions (beta's tree sum, the bias
gradient's column tree) call stepmath itself, and the products run as float BLAS on
operands that hold the int8 codes.

Why float BLAS is exact: every product of two codes is an integer, and an IEEE float
holds every integer up to 2^24 (f32) or 2^53 (f64) exactly, so a sum of such products
taken in any order, blocking or fused multiply-add is the exact integer as long as every
partial sum stays inside that range. The largest partial sum is bounded by the sum of
the absolute products:

- forward and dX: |code| <= 127 and |t| <= 1, so 127 * K (forward) and 127 * N (dX);
- dW: |code| <= 127 on both sides, so 127 * 127 * R.

f32 is used while the bound is at most 2^24 (K or N <= 132104; R <= 1040 for dW) and f64
past it. The result is the int32 accumulator the PTX kernels produce (the verify cells
prove those equal the integer reference), converted to f32 once as ``cvt.rn.f32.s32``
does: an f32 product already holds it; an f64 one rounds to the nearest f32 when
narrowed, the same rounding.

Signed zero and overflow: stepmath's rules (a zero sum is +0, the smaller factor first)
carry over through :func:`exact_product` and :func:`rescaled`.

NaN: stepmath's rules carry over unchanged (a NaN in a row of x makes that row's scale
NaN, so the whole row of y is NaN), and nothing here reads a value back to decide.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from hslm_ptx.reference import stepmath

QMAX = stepmath.QMAX
F32_EXACT = 2 ** 24  # every integer of magnitude up to this is an f32


class PreparedWeight(NamedTuple):
    """beta and the ternary codes of one weight version, ready for the products.

    ``codes`` is N x K (the weight's layout) in the float type the products run in."""

    beta: float
    codes: torch.Tensor


class SavedColumns(NamedTuple):
    """What dW needs of x, taken in forward: per-column scales u (K,) and the int8 codes
    of x quantized with them (R x K)."""

    codes: torch.Tensor
    scales: torch.Tensor


def exact_float_type(max_partial_sum: int) -> torch.dtype:
    """The narrowest float type whose integers cover every partial sum of a product."""
    return torch.float32 if max_partial_sum <= F32_EXACT else torch.float64


def widened(tensor: torch.Tensor) -> torch.Tensor:
    """The f32 values of an f32 / f16 / bf16 tensor (widening is exact); no copy for f32."""
    return tensor if tensor.dtype == torch.float32 else tensor.float()


def prepare_weight(weight: torch.Tensor) -> PreparedWeight:
    """beta = stepmath.weight_scale(W) and t = stepmath.ternary_codes(W, beta), the codes
    held as f32 values for the forward and dX products."""
    w = widened(weight.detach())
    beta = float(stepmath.weight_scale(w.numpy()))
    return PreparedWeight(beta, rounded_codes(w / beta, 1, may_be_nan=not np.isfinite(beta)))


def rounded_codes(q: torch.Tensor, limit: int, may_be_nan: bool = True) -> torch.Tensor:
    """clip(rint(q), -limit, limit) with NaN -> 0, as float values (stepmath._rounded_codes),
    in place on ``q``. ``may_be_nan`` False skips the NaN pass: a quotient by a finite
    nonzero scale of a slice whose absmax it is can only be NaN where the scale is not
    finite (x / s is NaN for x NaN, which makes s NaN, or for x and s both infinite)."""
    q = q.round_().clamp_(-limit, limit)
    return q.nan_to_num_(0.0) if may_be_nan else q


def scales(a: torch.Tensor, dim: int) -> torch.Tensor:
    """stepmath.scales_of(stepmath.absmax(a, dim)): absmax / 127 per slice, 1 where 0;
    NaN where the slice holds one (``amax`` propagates NaN as ``max.NaN.f32`` does)."""
    if a.shape[dim] == 0:
        return torch.ones(a.shape[1 - dim], dtype=torch.float32, device=a.device)
    s = a.abs().amax(dim=dim).div_(QMAX)
    return s.masked_fill_(s == 0, 1.0)


def row_codes(a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """stepmath.codes(a, s, axis=1): one scale per row, codes as float values."""
    return rounded_codes(a / s[:, None], QMAX, may_be_nan=not bool(torch.isfinite(s).all()))


def col_codes(a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """stepmath.codes(a, s, axis=0): one scale per column, codes as float values."""
    return rounded_codes(a / s[None, :], QMAX, may_be_nan=not bool(torch.isfinite(s).all()))


def exact_product(a: torch.Tensor, b: torch.Tensor, max_partial_sum: int) -> torch.Tensor:
    """a @ b for float operands holding integers, exact (see the module docstring), as f32.
    A zero sum is +0, as the int32 accumulator is: a code held as a float may be -0.0
    (rint(-0.3)) and a product of a negative code with a zero code is -0.0, so a sum of
    such terms would be -0.0; adding +0.0 makes it +0 and changes no other value (IEEE
    754 6.3: x + 0 is x for x not zero, +0 for a sum of zeros of opposite signs)."""
    dtype = exact_float_type(max_partial_sum)
    out = torch.mm(a.to(dtype), b.to(dtype))
    return (out if dtype == torch.float32 else out.float()).add_(0.0)


def rescaled(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """stepmath.rescaled in place on ``acc``: (acc * lo) * hi, lo the smaller of the factors
    a and b (broadcast against acc; a NaN compares false, as in stepmath.smaller_first)."""
    less = a < b
    return acc.mul_(torch.where(less, a, b)).mul_(torch.where(less, b, a))


def forward(x: torch.Tensor, prepared: PreparedWeight, bias: torch.Tensor | None,
            keep_columns: bool = True) -> tuple[torch.Tensor, SavedColumns | None]:
    """y = rescale_rows(x_codes @ t^T, s, beta, bias) in x's dtype, and x's column codes
    and scales for dW (None when ``keep_columns`` is False: no dW will be asked for). x is R x K (f32 / f16 / bf16); the bias is rounded to x's type
    first, as the fused forward kernel reads it (and as autocast casts nn.Linear's)."""
    x32 = widened(x.detach())
    K = x32.shape[1]
    s = scales(x32, 1)
    acc = exact_product(row_codes(x32, s), prepared.codes.T, QMAX * K)
    y = rescaled(acc, s[:, None], torch.tensor(prepared.beta, dtype=torch.float32))
    if bias is not None:
        y = y.add_(widened(bias.detach().to(x.dtype))[None, :])  # the bias is read in x's type
    if not keep_columns:
        return y.to(x.dtype), None
    u = scales(x32, 0)
    return y.to(x.dtype), SavedColumns(col_codes(x32, u).to(torch.int8), u)


def backward(dy: torch.Tensor, saved: SavedColumns, prepared: PreparedWeight, need_dx: bool,
             need_dw: bool, need_db: bool) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """dx = rescale_rows(dy_codes @ t, t_r, beta) (R x K, dy's dtype), dw =
    rescale_cols(dy_col_codes^T @ x_col_codes, v, u) (N x K, f32) and db = column_sums(dy)
    (f32); None for what is not asked for."""
    dy32 = widened(dy.detach())
    R, N = dy32.shape
    dx = dw = db = None
    if need_dx:
        t_r = scales(dy32, 1)
        acc = exact_product(row_codes(dy32, t_r), prepared.codes, QMAX * N)
        dx = rescaled(acc, t_r[:, None], torch.tensor(prepared.beta, dtype=torch.float32)).to(dy.dtype)
    if need_dw:
        v = scales(dy32, 0)
        acc = exact_product(col_codes(dy32, v).T, saved.codes, QMAX * QMAX * R)
        dw = rescaled(acc, v[:, None], saved.scales[None, :])
    if need_db:
        db = torch.from_numpy(np.ascontiguousarray(stepmath.column_sums(dy32.numpy())))
    return dx, dw, db
