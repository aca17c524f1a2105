"""Row pitches for activations that kernels copy with 16-byte ``cp.async``.

A 16-byte copy needs a 16-byte aligned source (PTX ISA 9.7.9.25), so every row of a
staged operand must start on a 16-byte boundary: the row pitch (leading dimension, in
bytes of int8) is a multiple of ``PITCH_ALIGN`` and at least the row's logical width.
Bytes between the width and the pitch are never read (the copy's src-size stops at
the width), so they may hold anything.

A buffer handed over at its logical width (rows packed back to back) is copied into a
pitched one first: :func:`aligned_copy`, one extra pass over the operand (R x pitch
bytes written, R x width read) and one allocation per launch; quantizing straight into
a pitched buffer avoids it.
"""
from __future__ import annotations

import sys
from typing import Any

PITCH_ALIGN = 16


def pitch(width: int) -> int:
    """The smallest legal pitch for rows of ``width`` bytes."""
    return -(-width // PITCH_ALIGN) * PITCH_ALIGN


def aligned_copy(rows: Any, row_pitch: int) -> Any:
    """``rows`` (R x width, numpy or CuPy) copied into a zeroed R x ``row_pitch`` buffer
    of the same array module and dtype."""
    if row_pitch % PITCH_ALIGN or row_pitch < rows.shape[1]:
        raise ValueError(f"pitch {row_pitch} must be a multiple of {PITCH_ALIGN} and at least "
                         f"the width {rows.shape[1]}")
    xp = sys.modules[type(rows).__module__.split(".")[0]]  # numpy or cupy, as given
    out = xp.zeros((rows.shape[0], row_pitch), dtype=rows.dtype)
    out[:, :rows.shape[1]] = rows
    return out
