"""Seeded verify inputs that exercise every value a kernel must handle.

Random data alone rarely hits the extremes, so each generator plants them: int8
activations reach -127 and +127 (the quantizer never emits -128, but -128 is also
planted once so a kernel that mishandles sign extension cannot hide), and ternary
weights use all three codes.
"""
from __future__ import annotations

import numpy as np

from hslm_ptx.formats.floats import from_f32
from hslm_ptx.formats.ternary import pack


def saturating_int8(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Uniform int8 in [-128, 127] with -128, -127 and 127 planted at fixed places."""
    out = rng.integers(-128, 128, size=shape, dtype=np.int8)
    flat = out.reshape(-1)
    for position, value in zip((0, -1, flat.size // 2), (127, -127, -128)):
        flat[position] = value
    return out


def ternary_weights(rng: np.random.Generator, K: int, N: int) -> np.ndarray:
    """Packed K x N ternary weights with -1, 0 and +1 all present (when K*N >= 3)."""
    w = rng.integers(-1, 2, size=(K, N), dtype=np.int8)
    flat = w.reshape(-1)
    flat[: min(3, flat.size)] = (-1, 0, 1)[: min(3, flat.size)]
    return pack(w)


# -- float inputs of the layer step's kernels (hslm_ptx.reference.stepmath) --------------------------
# Values are made in f32 and stored in the buffer's type (hslm_ptx.formats.floats: bf16 as uint16
# bits); every planted value is exactly representable in f16 and bf16, so a planted tie
# stays a tie after storage.


def _stored(values: np.ndarray, dtype: str) -> np.ndarray:
    return from_f32(np.asarray(values, dtype=np.float32), dtype)


def float_activations(rng: np.random.Generator, shape: tuple[int, int], dtype: str, axis: int,
                      non_finite: bool = True) -> np.ndarray:
    """A float R x C matrix to quantize with one scale per slice (``axis`` = 1: per row, 0:
    per column): normal values at a different power-of-two magnitude per slice, and planted
    in it: tie slices (absmax exactly 127 * 2^e, so the scale is 2^e exactly, and values
    (k + 1/2) 2^e, exact rounding ties of x / s), negative zeros, an all-zero slice and,
    with ``non_finite``, a slice holding a NaN and one holding an infinity."""
    x = rng.standard_normal(shape).astype(np.float32)
    slices = shape[0] if axis == 1 else shape[1]
    view = x if axis == 1 else x.T  # a row per slice
    view *= np.exp2(rng.integers(-6, 7, size=(slices, 1))).astype(np.float32)
    x[rng.random(shape) < 0.05] = -0.0
    order = rng.permutation(slices)
    ties, rest = order[: max(1, slices // 3)], order[max(1, slices // 3):]
    for i in ties:
        e = np.float32(np.exp2(rng.integers(-6, 7)))
        row = (rng.integers(-127, 127, size=view.shape[1]) + np.float32(0.5)).astype(np.float32)
        row[rng.integers(0, view.shape[1])] = 127 * (1 if rng.random() < 0.5 else -1)
        view[i] = row * e
    planted = list(rest)
    if planted:
        view[planted.pop()] = 0.0
    if non_finite and planted:
        view[planted.pop(), rng.integers(0, view.shape[1])] = np.nan
    if non_finite and planted:
        view[planted.pop(), rng.integers(0, view.shape[1])] = np.inf * (1 if rng.random() < 0.5 else -1)
    return _stored(x, dtype)


def latent_weights(rng: np.random.Generator, N: int, K: int, dtype: str) -> np.ndarray:
    """A float N x K latent weight, one of two kinds (a seeded coin):

    - with exact ties: magnitudes in {0, 1/2, 1, 3/2, 2} x 2^e arranged so that mean|W|
      is exactly 2^e (every partial sum is exact), so W / beta hits 1/2 and 3/2 exactly;
    - general: normal values, whose sum of |W| depends on the order of the additions.

    Both have an all-zero row (when N > 1) and negative zeros."""
    count = N * K
    if rng.random() < 0.5:
        e = np.float32(np.exp2(rng.integers(-6, 5)))
        pairs = np.array([[0.5, 1.5], [1.0, 1.0], [0.0, 2.0], [1.5, 0.5]], dtype=np.float32)
        zero_row = K if N > 1 and count - K >= K else 0
        # the zero row's partners: elements of magnitude 2 elsewhere; the rest in pairs of sum 2
        body = count - 2 * zero_row
        magnitudes = pairs[rng.integers(0, len(pairs), size=body // 2)].ravel()
        tail = np.ones(body % 2, dtype=np.float32)
        rest = np.concatenate([np.full(zero_row, 2.0, np.float32), magnitudes, tail])
        rest = rest[rng.permutation(rest.size)]
        w = np.concatenate([np.zeros(zero_row, np.float32), rest]).reshape(N, K) * e
    else:
        w = (rng.standard_normal((N, K)) * np.exp2(rng.integers(-6, 3))).astype(np.float32)
        if N > 1:
            w[rng.integers(0, N)] = 0.0
    signs = np.where(rng.random((N, K)) < 0.5, np.float32(-1), np.float32(1))
    w = (w * signs).astype(np.float32)  # zeros times -1: negative zeros
    return _stored(w, dtype)
