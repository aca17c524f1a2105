"""Seeded verify inputs that exercise every value a kernel must handle.

Random data alone rarely hits the extremes, so each generator plants them: int8
activations reach -127 and +127 (the quantizer never emits -128, but -128 is also
planted once so a kernel that mishandles sign extension cannot hide), and ternary
weights use all three codes.
"""
from __future__ import annotations

import numpy as np

from kernels.ternary import pack


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
