"""Exact integer products for the kernels' CPU references, fast enough for large shapes.

numpy's integer matmul has no BLAS behind it (minutes at 4096^3); float64 BLAS is exact
here. Every product of an int8 (|v| <= 128) and an int8 or ternary value is an integer
of magnitude <= 2^14, and every partial sum over an inner dimension K, in whatever
order or blocking BLAS adds them (fused multiply-adds included), is an integer of
magnitude <= K * 2^14. float64 holds every integer up to 2^53 exactly, so while
K * max|a| * max|b| <= 2^53 (K <= 2^39 for int8: any real layer) each addition is
exact and the result is the integer product. Past that bound the product is taken
in int64, still in row blocks.

Rows go in blocks of about :data:`BLOCK_MACS` multiply-adds, so Ctrl-C stops a long
reference within a fraction of a second and ``progress`` can report how far it got.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

FLOAT64_EXACT = 2**53
BLOCK_MACS = 2**28


def float64_is_exact(a: np.ndarray, b: np.ndarray) -> bool:
    """True when every partial sum of ``a @ b`` is an integer below 2^53 in magnitude."""
    inner = a.shape[1]
    peak = int(np.abs(a).max(initial=0)) * int(np.abs(b).max(initial=0))
    return inner * peak <= FLOAT64_EXACT


def exact_matmul(a: np.ndarray, b: np.ndarray,
                 progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """``a @ b`` of integer matrices, exact, as int64; ``progress(rows_done, rows)`` after
    each block of rows."""
    rows, inner = a.shape
    a64, b64 = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    exact = float64_is_exact(a64, b64)
    right = b64.astype(np.float64) if exact else b64
    out = np.empty((rows, b.shape[1]), dtype=np.int64)
    step = max(1, BLOCK_MACS // max(1, inner * b.shape[1]))
    for start in range(0, rows, step):
        block = a64[start:start + step]
        out[start:start + step] = (block.astype(np.float64) @ right) if exact else block @ right
        if progress is not None:
            progress(min(rows, start + step), rows)
    return out
