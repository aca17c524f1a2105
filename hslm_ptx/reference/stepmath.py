"""The float arithmetic of one layer step, in the order the step's kernels perform it.

A TernaryLinear step is integer products between float passes: ternarize W, quantize
the activations, rescale the int32 accumulators. Every one of those passes is a PTX
kernel of this project, and each kernel's numpy reference is built from the functions
here, so verify can demand the same bits (IEEE f32, round to nearest even, every
operation in the stated order; no fused multiply-add: the kernels emit ``mul.rn`` /
``add.rn``, which ptxas may not contract). The CPU path of the layer calls the same
functions, so a CPU step and a GPU step give the same numbers.

Conventions (all arrays numpy, float32 unless said):

- beta = mean|W| (BitNet b1.58 absmean), a sum taken in a fixed tree (see
  :func:`abs_sum`) of |W| * 2^-32, divided by count * 2^-32; 1 when that is 0 (all-zero
  or empty W). The power-of-two scale is exact for every |w| >= 2^-94 and keeps the sum
  of up to 2^32 elements (every count a u32 holds) below f32's largest value; weights
  all below 2^-117 in magnitude sum to 0 (beta 1, every code 0).
- ternary codes t = clip(rint(W / beta), -1, 1).
- activation scales s = absmax / 127 over the slice (a row for forward and dX, a column
  for dW), 1 where that is 0; codes q = clip(rint(x / s), -127, 127). ``max`` propagates
  NaN (PTX ``max.NaN.f32``), and a NaN divides into a NaN whose code is 0 (a float to
  integer ``cvt`` gives 0 for NaN), so a NaN anywhere in a slice makes its scale NaN
  and every output that scale multiplies NaN: a non-finite input never gives a finite
  wrong answer, as with ``nn.Linear``.
- rescale: y = (f32(acc) * lo) * hi (+ bias_j), {lo, hi} = {s_r, beta} for forward and
  dX and {v_j, u_i} for dW, lo the smaller (:func:`smaller_first`). ``f32(acc)`` is
  ``cvt.rn.f32.s32``.
- the bias gradient db_j = sum_r dY[r, j] in the column tree of :func:`column_sums`.

Overflow: no intermediate of the step is past f32's range where the exact ternary result
is inside it. The scaled |W| sum is at most count * 2^-32 * max|W|. A rescale multiplies
by the smaller factor first: if lo <= 1, |f32(acc) * lo| <= |acc| < 2^31; else both
factors exceed 1 and |f32(acc) * lo| <= |acc * lo * hi|. So y is inf only where the exact
product (within its first rounding) is past f32's range, and a zero accumulator gives
+0, never 0 * inf = NaN, while both factors are finite. (A bias added to a product that
is already past the range stays inf; nn.Linear's f32 sums are no different there.)

Signed zero, one rule for every backend: a code is an integer (int8, no sign of zero) and
an accumulator an int32, so an exact zero sum is +0 (``cvt.rn.f32.s32`` of 0), whatever
signs the zeros of the input had. Every factor is positive (a scale is absmax / 127 or 1,
beta a mean of |W| or 1), so rescaling keeps that +0, and -0.0 appears in a result only
where a nonzero value underflows to zero (IEEE rounding keeps its sign) or, in forward,
where such a -0.0 meets a -0.0 bias. Where there is no bias none is added (the kernels add
-0.0, which changes nothing: +0 + -0 is +0, IEEE 754 6.3). A CPU path that holds codes as
floats must add +0.0 to its sums (hslm_ptx.nn.cpu_step.exact_product).
"""
from __future__ import annotations

import numpy as np

QMAX = 127
F32 = np.float32

# |W| is summed by CTAs of SUM_THREADS threads, each adding SUM_ITEMS elements in turn
SUM_THREADS = 256
SUM_ITEMS = 16
SUM_BLOCK = SUM_THREADS * SUM_ITEMS  # elements one partial sum covers
SUM_SCALE = F32(2.0 ** -32)  # |W| is summed times this, count scaled alike: no sum of u32-many overflows
COL_GROUPS = 8  # a column reduction: rows g, g + 8, g + 16, ... per group g, then a tree over groups


def tree_sum(v: np.ndarray) -> np.ndarray:
    """Sum over the last axis (a power of two long) by halves: v[:h] + v[h:], h = n/2, n/4 ..
    1 -- the order a shared-memory or ``shfl.sync.down`` reduction adds in."""
    v = np.asarray(v, dtype=F32)
    n = v.shape[-1]
    if n & (n - 1):
        raise ValueError(f"tree_sum: the reduced axis has {n} elements, expected a power of two")
    while v.shape[-1] > 1:
        h = v.shape[-1] // 2
        v = v[..., :h] + v[..., h:]
    return v[..., 0]


def strided_sum(v: np.ndarray, threads: int) -> np.ndarray:
    """Sum of a 1-D f32 array as ``threads`` threads take it: thread t adds elements t,
    t + threads, t + 2 threads ... in turn (zero past the end), then :func:`tree_sum`."""
    v = np.asarray(v, dtype=F32).ravel()
    steps = max(1, -(-v.size // threads))
    padded = np.zeros(steps * threads, dtype=F32)
    padded[: v.size] = v
    lanes = padded.reshape(steps, threads)
    acc = np.zeros(threads, dtype=F32)
    for row in lanes:  # sequential in each thread
        acc = acc + row
    return tree_sum(acc)


def abs_partials(w: np.ndarray) -> np.ndarray:
    """The partial sums of |W| * SUM_SCALE the first weight-preparation launch writes, one
    per block of SUM_BLOCK elements of W in memory order: in block c, thread t adds
    elements c*SUM_BLOCK + i*SUM_THREADS + t for i = 0 .. SUM_ITEMS-1 in turn, then a tree
    over t."""
    flat = np.abs(np.asarray(w, dtype=F32).ravel()) * SUM_SCALE
    blocks = max(1, -(-flat.size // SUM_BLOCK))
    padded = np.zeros(blocks * SUM_BLOCK, dtype=F32)
    padded[: flat.size] = flat
    items = padded.reshape(blocks, SUM_ITEMS, SUM_THREADS)
    acc = np.zeros((blocks, SUM_THREADS), dtype=F32)
    for i in range(SUM_ITEMS):
        acc = acc + items[:, i, :]
    return tree_sum(acc)


def abs_sum(w: np.ndarray) -> np.float32:
    """sum |W| * SUM_SCALE in f32: the partials of :func:`abs_partials`, summed by SUM_THREADS threads
    (:func:`strided_sum`), as every CTA of the second launch does it (so all agree)."""
    return F32(strided_sum(abs_partials(w), SUM_THREADS))


def weight_scale(w: np.ndarray) -> np.float32:
    """beta = sum|W| / count (``div.rn.f32``), 1 when that is 0 or W is empty; NaN stays NaN."""
    count = np.asarray(w).size
    if count == 0:
        return F32(1.0)
    return scale_of_partials(abs_partials(w), count)


def scale_of_partials(partials: np.ndarray, count: int) -> np.float32:
    """beta from the partial sums of |W| (:func:`abs_partials`) of ``count`` elements: what
    each CTA of the second weight-preparation launch computes from the first one's output
    (:func:`strided_sum`, then ``div.rn.f32`` by ``cvt.rn.f32.u32(count) * SUM_SCALE``,
    exact; 1 when that is 0)."""
    with np.errstate(invalid="ignore", over="ignore"):
        beta = F32(F32(strided_sum(partials, SUM_THREADS)) / (F32(count) * SUM_SCALE))
    return F32(1.0) if beta == 0 else beta


def ternary_codes(w: np.ndarray, beta: np.float32) -> np.ndarray:
    """clip(rint(W / beta), -1, 1) as int8 (NaN -> 0)."""
    return _rounded_codes(np.asarray(w, dtype=F32) / F32(beta), 1)


# ternary_threshold: below this beta, w and beta are lifted by 2^64 before the compare
THRESHOLD_TINY = 2.0 ** -100
THRESHOLD_LIFT = 2.0 ** 64


def ternary_threshold(beta: np.float32) -> tuple[np.float32, np.float32]:
    """(s, h) such that clip(rint(w / beta), -1, 1) is (w s > h) - (w s < -h) for every f32
    w (NaN: 0): the forward that codes W as it stages it compares instead of dividing.

    Why. With q = rn(w / beta) (``div.rn.f32``), the code is +1 iff q > 1/2 (rint(1/2) = 0,
    ties to even). rn is monotonic and 1/2 is a float whose next float up is 1/2 (1 + 2^-23),
    so q > 1/2 iff w / beta lies above the midpoint 1/2 (1 + 2^-24) (a tie rounds to 1/2,
    its even neighbour); i.e. iff w > h (1 + 2^-24) with h = beta / 2 exact. That threshold
    lies strictly between h and the next float above h (it is h + h 2^-24, and
    ulp(h) / 2 <= h 2^-24 < ulp(h)), so for a float w it is just w > h. h = beta / 2 is
    exact while beta >= 2^-125; below THRESHOLD_TINY both sides are lifted by s = 2^64
    (h = beta 2^63, exact for any beta >= 2^-149, and w s exact: |w| <= sum |W| keeps it
    far from overflow). The negative side is the mirror image. beta = inf or NaN makes
    every compare false, as w / beta is 0 or NaN there; beta is never 0 (1 instead)."""
    beta = F32(beta)
    tiny = bool(beta < F32(THRESHOLD_TINY))
    scale = F32(THRESHOLD_LIFT) if tiny else F32(1.0)
    with np.errstate(over="ignore", invalid="ignore"):
        return scale, F32(beta * F32(THRESHOLD_LIFT / 2 if tiny else 0.5))


def ternary_codes_by_threshold(w: np.ndarray, beta: np.float32) -> np.ndarray:
    """:func:`ternary_codes` by :func:`ternary_threshold`'s compares (the same codes)."""
    scale, half = ternary_threshold(beta)
    with np.errstate(over="ignore", invalid="ignore"):
        lifted = np.asarray(w, dtype=F32) * scale
    return (lifted > half).astype(np.int8) - (lifted < -half).astype(np.int8)


def absmax(a: np.ndarray, axis: int) -> np.ndarray:
    """max|a| over ``axis`` in f32, NaN if the slice holds one (``max.NaN.f32``); 0 for an
    empty slice."""
    a = np.abs(np.asarray(a, dtype=F32))
    if a.shape[axis] == 0:
        return np.zeros(a.shape[:axis] + a.shape[axis + 1:], dtype=F32)
    return a.max(axis=axis)


def scales_of(m: np.ndarray) -> np.ndarray:
    """Scales from absmax values: m / 127 (``div.rn.f32``), 1 where that is 0."""
    s = np.asarray(m, dtype=F32) / F32(QMAX)
    return np.where(s == 0, F32(1.0), s).astype(F32)


def _rounded_codes(q: np.ndarray, limit: int) -> np.ndarray:
    """clip(rint(q), -limit, limit) as int8, NaN -> 0 (rint is half to even, ``cvt.rni``)."""
    q = np.rint(np.asarray(q, dtype=F32))
    q = np.where(np.isnan(q), F32(0), q)
    return np.clip(q, -limit, limit).astype(np.int8)


def codes(a: np.ndarray, scales: np.ndarray, axis: int) -> np.ndarray:
    """int8 codes of ``a`` with one scale per slice reduced over ``axis`` (axis=1: a scale
    per row, ``scales`` of shape (R,); axis=0: per column, shape (C,))."""
    s = np.asarray(scales, dtype=F32)
    s = s[:, None] if axis == 1 else s[None, :]
    return _rounded_codes(np.asarray(a, dtype=F32) / s, QMAX)


def smaller_first(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi): the smaller and the larger of two factors, elementwise, as ``setp.lt.f32``
    and two ``selp.f32`` pick them (a NaN compares false: it lands in one of the two, and
    the product is NaN either way)."""
    a, b = np.asarray(a, dtype=F32), np.asarray(b, dtype=F32)
    less = a < b
    return np.where(less, a, b).astype(F32), np.where(less, b, a).astype(F32)


def rescaled(acc: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(f32(acc) * lo) * hi for the factors a and b (broadcast against acc), the smaller
    first so no intermediate overflows where the result does not (module docstring)."""
    lo, hi = smaller_first(a, b)
    with np.errstate(over="ignore", invalid="ignore"):
        return ((np.asarray(acc, dtype=np.int32).astype(F32) * lo) * hi).astype(F32)


def rescale_rows(acc: np.ndarray, row_scales: np.ndarray, beta: np.float32,
                 bias: np.ndarray | None = None) -> np.ndarray:
    """Forward / dX epilogue: :func:`rescaled` by s_r and beta, then + bias_j when there is one."""
    y = rescaled(acc, np.asarray(row_scales, dtype=F32)[:, None], F32(beta))
    if bias is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            y = y + np.asarray(bias, dtype=F32)[None, :]
    return y.astype(F32)


def rescale_cols(acc: np.ndarray, v: np.ndarray, u: np.ndarray) -> np.ndarray:
    """dW epilogue on the kernel's N x K accumulators: :func:`rescaled` by v_j and u_i."""
    return rescaled(acc, np.asarray(v, dtype=F32)[:, None], np.asarray(u, dtype=F32)[None, :])


def column_sums(a: np.ndarray) -> np.ndarray:
    """sum over rows per column in f32: group g adds rows g, g + COL_GROUPS, ... in turn,
    then a tree over the COL_GROUPS groups (the bias gradient, db = sum_r dY[r, :])."""
    a = np.asarray(a, dtype=F32)
    rows, cols = a.shape
    steps = max(1, -(-rows // COL_GROUPS))
    padded = np.zeros((steps * COL_GROUPS, cols), dtype=F32)
    padded[:rows] = a
    groups = padded.reshape(steps, COL_GROUPS, cols)
    acc = np.zeros((COL_GROUPS, cols), dtype=F32)
    for step in groups:
        acc = acc + step
    return tree_sum(acc.T)
