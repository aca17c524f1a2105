"""Row pitches for activations that kernels copy with 16-byte ``cp.async``.

A 16-byte copy needs a 16-byte aligned source (PTX ISA 9.7.9.25), so every row of a
staged operand must start on a 16-byte boundary: the row pitch (leading dimension, in
bytes of int8) is a multiple of ``PITCH_ALIGN`` and at least the row's logical width.
Bytes between the width and the pitch may hold anything: forward and dX copy whole
16-byte pieces, so the last piece of a row brings some of them along, but they meet W's
padding codes, which are 0 (``hslm_ptx.formats.ternary`` refuses anything else); dW's copies stop
at R exactly (src-size) and never read them. Buffers made here keep them 0 all the same.

Two ways to hand a staged operand to ``hslm_ptx.runtime.launch``:
- in the kernel's layout, marked :class:`KernelLayout`: the float ops (hslm_ptx.arrays)
  allocate it with :func:`kernel_buffer` and the quantizing pass writes the codes
  straight into its logical part, so launch checks it and passes it on, never copying;
- in the logical layout (rows packed back to back, not transposed), unmarked: launch
  copies it into the kernel's layout first (:func:`aligned_copy`): one extra pass over
  the operand (R x width bytes read, R x pitch written) and one allocation per launch,
  nothing when the logical shape already is the kernel's (forward/dX with the width a
  multiple of 16).
The mark is explicit because a shape cannot tell the two apart: a logical R x K and a
transposed K x pitch(R) are both 16 x 16 when R = K = 16.

Packed ternary W is read in planes (``hslm_ptx/formats/planes.py``), each kernel in its order: callers pass the
packed (N, Kp/16) buffer and launch makes the planes (one copy of the words, a few KiB
for the HSLM layers), or pass planes marked :class:`KernelLayout`.

The int32 output is pitched too, by ``OUTPUT_ALIGN`` words (one 128-byte line), and
never by the caller: launch allocates it and returns the logical view (rows x width), so
every row starts on a line and the kernel stores each row of its tile as whole 16-byte
vectors (one ``st.global.v4`` per lane, PTX ISA 9.7.9.9: a vector access is aligned to
its size) whatever the width. Words between the width and the pitch hold anything.

Each of these is a :class:`hslm_ptx.formats.layout.Layout` (:class:`PitchedRows`,
:class:`PitchedTranspose`, :class:`PitchedOutput`, :class:`WPlanes`), so launch, the float
ops and the tests convert every buffer with the same two calls, ``into`` and ``view``, and
never ask which layout a parameter has.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

from hslm_ptx.formats import planes
from hslm_ptx.formats.layout import Layout, LayoutError
from hslm_ptx.kernel.spec import BufferSpec, Dims, ScalarSpec
from hslm_ptx.formats.ternary import code_problem, packed_shape

PITCH_ALIGN = 16
OUTPUT_ALIGN = 32  # int32 words: a 128-byte line


@dataclass(frozen=True)
class KernelLayout:
    """An input buffer already in the kernel's layout (``param.layout.shape(dims)``,
    C-contiguous): launch checks it against that shape and never copies it."""

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


def output_pitch(width: int) -> int:
    """Words between rows of an int32 output of ``width`` columns: a whole number of lines."""
    return -(-width // OUTPUT_ALIGN) * OUTPUT_ALIGN


@dataclass(frozen=True)
class PitchedRows(Layout):
    """Logical ``rows`` x ``width`` rows, held ``pitch(width)`` apart (forward's X, dX's dY):
    the logical part of each kernel row is its first ``width`` elements."""

    rows: Callable[[Dims], int]
    width: Callable[[Dims], int]

    def row_pitch(self, width: int) -> int:
        """Elements between rows of ``width``: the cp.async rule (a subclass, the output's)."""
        return pitch(width)

    def shape(self, dims: Dims) -> tuple[int, int]:
        return (self.rows(dims), self.row_pitch(self.width(dims)))

    def logical(self, dims: Dims) -> tuple[int, int]:
        return (self.rows(dims), self.width(dims))

    def _to_kernel(self, array: Any, dims: Dims) -> Any:
        """No copy when the width already is a pitch (the two layouts are one)."""
        want = self.shape(dims)
        return array if tuple(array.shape) == want else aligned_copy(array, want[1])

    def _to_logical(self, buffer: Any, dims: Dims) -> Any:
        return buffer[:, :self.width(dims)]


@dataclass(frozen=True)
class PitchedOutput(PitchedRows):
    """The int32 output, ``rows`` x ``width`` at ``output_pitch(width)`` words a row (whole
    128-byte lines): launch allocates it and hands the caller the rows x width view."""

    def row_pitch(self, width: int) -> int:
        return output_pitch(width)


@dataclass(frozen=True)
class PitchedTranspose(Layout):
    """Logical ``rows`` x ``width`` (dW's Xq, dYq) held transposed, ``width`` x
    ``pitch(rows)``: the kernel walks the rows as its contraction, 16 bytes at a time."""

    rows: Callable[[Dims], int]
    width: Callable[[Dims], int]

    def shape(self, dims: Dims) -> tuple[int, int]:
        return (self.width(dims), pitch(self.rows(dims)))

    def logical(self, dims: Dims) -> tuple[int, int]:
        return (self.rows(dims), self.width(dims))

    def _to_kernel(self, array: Any, dims: Dims) -> Any:
        """Always a copy: even where the shapes coincide (R = K = 16) the elements move."""
        return aligned_copy(array.T, self.shape(dims)[1])

    def _to_logical(self, buffer: Any, dims: Dims) -> Any:
        return buffer[:, :self.rows(dims)].T


@dataclass(frozen=True)
class WPlanes(Layout):
    """Packed ternary W (N, Kp/16) as the kernel reads it, in planes of ``order``. The
    planes permute the codes, so the logical form is a copy (to read), never a view to
    write into; their codes are scanned as the packed buffer's are (``problem``)."""

    order: planes.Planes

    def shape(self, dims: Dims) -> tuple[int, int]:
        return self.order.shape(dims)

    def logical(self, dims: Dims) -> tuple[int, int]:
        return packed_shape(dims.K, dims.N)

    def _to_kernel(self, array: Any, dims: Dims) -> Any:
        return self.order(array, self.shape(dims))

    def _to_logical(self, buffer: Any, dims: Dims) -> Any:
        return self.order.packed(buffer, dims.K, dims.N)

    def zeroed(self, dims: Dims, dtype: str, xp: Any) -> tuple[Any, Any]:
        raise LayoutError(f"packed W: make its planes from the packed buffer with "
                          f"hslm_ptx.formats.planes.{self.order.name.upper()}(packed, shape), not by writing into a view")

    def problem(self, array: Any, dims: Dims, in_kernel_layout: bool) -> str | None:
        """Code 3 or a non-zero padding code, in W's own terms, in whichever layout it came."""
        if in_kernel_layout:
            return self.order.problem(array, dims.K, dims.N)
        return code_problem(array, dims.K)

    def remedy(self, dtype: str) -> str:
        return "pack the K x N ternary matrix with hslm_ptx.formats.ternary.pack(w)"


def pitched_rows(name: str, rows: Callable[[Dims], int], width: Callable[[Dims], int]) -> BufferSpec:
    """An int8 input the kernel reads as ``rows`` x pitch(``width``); callers may pass rows
    x width (copied) or the kernel's layout marked :class:`KernelLayout`."""
    return BufferSpec(name, "int8", PitchedRows(rows, width))


def pitched_transpose(name: str, rows: Callable[[Dims], int], width: Callable[[Dims], int]) -> BufferSpec:
    """An int8 input the kernel reads transposed, ``width`` x pitch(``rows``); callers pass
    rows x width (copied) or the kernel's layout marked :class:`KernelLayout`."""
    return BufferSpec(name, "int8", PitchedTranspose(rows, width))


def pitched_output(name: str, rows: Callable[[Dims], int], width: Callable[[Dims], int]) -> BufferSpec:
    """The int32 output, rows x output_pitch(``width``) words; launch allocates it and hands
    the caller its rows x width view."""
    return BufferSpec(name, "int32", PitchedOutput(rows, width))


def planes_param(name: str, order: planes.Planes) -> BufferSpec:
    """The packed W a kernel reads in planes of ``order``; callers pass the packed
    (N, Kp/16) buffer (launch makes the planes: one pass over the codes) or planes marked
    KernelLayout."""
    return BufferSpec(name, "uint32", WPlanes(order))


def pitch_param(name: str, width: Callable[[Dims], int]) -> ScalarSpec:
    """The u32 pitch parameter that goes with a pitched input."""
    return ScalarSpec(name, lambda d: pitch(width(d)))


def kernel_buffer(param: BufferSpec, dims: Dims, xp: Any) -> tuple[KernelLayout, Any]:
    """A zeroed buffer of ``param``'s kernel layout in ``xp`` (numpy or cupy), marked for
    launch, and the view of its logical part to write into (rows x width: ``buf[:, :width]``,
    or ``buf[:, :rows].T`` for a transposed operand)."""
    try:
        buf, view = param.layout.zeroed(dims, param.dtype, xp)
    except LayoutError as refused:
        raise LayoutError(f"kernel_buffer '{param.name}': {refused}") from None
    return KernelLayout(buf), view
