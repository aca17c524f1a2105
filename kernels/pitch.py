"""Row pitches for activations that kernels copy with 16-byte ``cp.async``.

A 16-byte copy needs a 16-byte aligned source (PTX ISA 9.7.9.25), so every row of a
staged operand must start on a 16-byte boundary: the row pitch (leading dimension, in
bytes of int8) is a multiple of ``PITCH_ALIGN`` and at least the row's logical width.
Bytes between the width and the pitch may hold anything: forward and dX copy whole
16-byte pieces, so the last piece of a row brings some of them along, but they meet W's
padding codes, which are 0 (``kernels.ternary`` refuses anything else); dW's copies stop
at R exactly (src-size) and never read them. Buffers made here keep them 0 all the same.

Two ways to hand a staged operand to ``kernels.launch``:
- in the kernel's layout, marked :class:`KernelLayout`: the float ops (kernels.array_ops)
  allocate it with :func:`kernel_buffer` and the quantizing pass writes the codes
  straight into its logical part, so launch checks it and passes it on, never copying;
- in the logical layout (rows packed back to back, not transposed), unmarked: launch
  copies it into the kernel's layout first (:func:`aligned_copy`): one extra pass over
  the operand (R x width bytes read, R x pitch written) and one allocation per launch,
  nothing when the logical shape already is the kernel's (forward/dX with the width a
  multiple of 16).
The mark is explicit because a shape cannot tell the two apart: a logical R x K and a
transposed K x pitch(R) are both 16 x 16 when R = K = 16.

Packed ternary W is read in planes (``kernels/planes.py``), each kernel in its order: callers pass the
packed (N, Kp/16) buffer and launch makes the planes (one copy of the words, a few KiB
for the HSLM layers), or pass planes marked :class:`KernelLayout`.

The int32 output is pitched too, by ``OUTPUT_ALIGN`` words (one 128-byte line), and
never by the caller: launch allocates it and returns the logical view (rows x width), so
every row starts on a line and the kernel stores each row of its tile as whole 16-byte
vectors (one ``st.global.v4`` per lane, PTX ISA 9.7.9.9: a vector access is aligned to
its size) whatever the width. Words between the width and the pitch hold anything.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

from kernels import planes
from kernels.spec import BufferSpec, Dims
from kernels.ternary import packed_shape

PITCH_ALIGN = 16
OUTPUT_ALIGN = 32  # int32 words: a 128-byte line


@dataclass(frozen=True)
class KernelLayout:
    """An input buffer already in the kernel's layout (``param.shape(dims)``, C-contiguous):
    launch checks it against that shape and never copies it."""

    array: Any


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


def rows_into(rows: Any, want: tuple[int, int]) -> Any:
    """Logical R x width rows -> the kernel's R x pitch buffer (as it is when width is
    already a pitch)."""
    return rows if tuple(rows.shape) == tuple(want) else aligned_copy(rows, want[1])


def transposed_into(rows: Any, want: tuple[int, int]) -> Any:
    """Logical R x width rows -> the kernel's width x pitch(R) transposed buffer."""
    return aligned_copy(rows.T, want[1])


def pitched_rows(name: str, rows: Callable[[Dims], int], width: Callable[[Dims], int]) -> BufferSpec:
    """An int8 input the kernel reads as ``rows`` x pitch(``width``); callers may pass rows
    x width (copied) or the kernel's layout marked :class:`KernelLayout`."""
    return BufferSpec(name, "int8", lambda d: (rows(d), pitch(width(d))),
                      logical=lambda d: (rows(d), width(d)), prepare=rows_into)


def pitched_transpose(name: str, rows: Callable[[Dims], int], width: Callable[[Dims], int]) -> BufferSpec:
    """An int8 input the kernel reads transposed, ``width`` x pitch(``rows``); callers pass
    rows x width (copied) or the kernel's layout marked :class:`KernelLayout`."""
    return BufferSpec(name, "int8", lambda d: (width(d), pitch(rows(d))),
                      logical=lambda d: (rows(d), width(d)), prepare=transposed_into)


def output_pitch(width: int) -> int:
    """Words between rows of an int32 output of ``width`` columns: a whole number of lines."""
    return -(-width // OUTPUT_ALIGN) * OUTPUT_ALIGN


def pitched_output(name: str, rows: Callable[[Dims], int], width: Callable[[Dims], int]) -> BufferSpec:
    """The int32 output, rows x output_pitch(``width``) words; launch allocates it and hands
    the caller its rows x width view."""
    return BufferSpec(name, "int32", lambda d: (rows(d), output_pitch(width(d))),
                      logical=lambda d: (rows(d), width(d)))


def planes_param(name: str, order: planes.Planes) -> BufferSpec:
    """The packed W a kernel reads in planes of ``order``; callers pass the packed
    (N, Kp/16) buffer (launch makes the planes: one pass over the codes) or planes marked
    KernelLayout."""
    return BufferSpec(name, "uint32", order.shape, logical=lambda d: packed_shape(d.K, d.N), prepare=order)


def pitch_param(name: str, width: Callable[[Dims], int]) -> BufferSpec:
    """The u32 pitch parameter that goes with a pitched input."""
    return BufferSpec(name, "uint32", None, value=lambda d: pitch(width(d)))


def logical_view(param: BufferSpec, buf: Any, dims: Dims) -> Any:
    """A buffer in the kernel's layout seen in its logical one (a view: references read
    it, the quantizer writes into it; W's planes give a packed copy, to read)."""
    if param.logical is None:
        return buf
    if isinstance(param.prepare, planes.Planes):  # a permutation of the packed codes: a copy
        return param.prepare.packed(buf, dims.K, dims.N)
    rows, width = param.logical(dims)
    return buf[:, :rows].T if param.prepare is transposed_into else buf[:, :width]


def kernel_buffer(param: BufferSpec, dims: Dims, xp: Any) -> tuple[KernelLayout, Any]:
    """A zeroed buffer of ``param``'s kernel layout in ``xp`` (numpy or cupy), marked for
    launch, and the view of its logical part to write into (rows x width: ``buf[:, :width]``,
    or ``buf[:, :rows].T`` for a transposed operand)."""
    if isinstance(param.prepare, planes.Planes):
        raise ValueError(f"'{param.name}' is packed W: make its planes from the packed buffer "
                         f"with kernels.planes.{param.prepare.name.upper()}(packed, shape), not by writing into a view")
    buf = xp.zeros(param.shape(dims), dtype=param.dtype)
    return KernelLayout(buf), logical_view(param, buf, dims)
