"""How a kernel's buffer relates to the array its callers hand over or get back.

A kernel reads and writes buffers in its own layout (rows at an aligned pitch, an operand
transposed, W in planes), while callers think in the logical one (R x K rows packed back to
back, the packed W). A :class:`Layout` is that relation for one parameter, as four
operations every caller uses the same way, so no caller asks which layout it holds:

- ``shape(dims)``: the kernel's buffer, what launch allocates and a marked buffer must be;
- ``logical(dims)``: the caller's array, what launch checks an unmarked input against;
- ``into(array, dims)``: the caller's array in the kernel's layout (one copy, or the array
  itself when the two layouts coincide);
- ``view(buffer, dims)``: the kernel's buffer seen in the logical layout (a view, so a
  reference reads and a quantizing pass writes it in place; a copy where the kernel's
  layout is a permutation of the elements, as W's planes are).

Launch's other questions are methods too, with the answer most layouts give as the
default here: :meth:`Layout.zeroed` (a zeroed kernel buffer and the view to write into),
:meth:`Layout.problem` (a rule on the contents beyond shape and dtype: none) and
:meth:`Layout.remedy` (what a caller with a wrong array should do).

An abstract base class rather than a ``typing.Protocol``: the shape checks of ``into`` and
``view`` and those defaults are shared code, not only a signature, and a layout that leaves
out an operation is refused when it is built, not when a launch first needs it.
The pitched layouts and W's planes are in ``hslm_ptx/kernel/pitch.py``; :class:`Plain` is here.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple


class Dims(NamedTuple):
    """Problem size. R rows (tokens), K in-features, N out-features."""

    R: int
    K: int
    N: int


class LayoutError(ValueError):
    """An array that is not the shape a layout converts from, or a layout asked for what it
    cannot give; one line that says which shape was expected."""


class Layout(ABC):
    """One buffer parameter's kernel layout and logical layout, and the conversions between
    them (the module docstring lists what each operation is for)."""

    @abstractmethod
    def shape(self, dims: Dims) -> tuple[int, ...]:
        """The kernel's buffer for ``dims``."""

    @abstractmethod
    def logical(self, dims: Dims) -> tuple[int, ...]:
        """The caller's array for ``dims``."""

    @abstractmethod
    def _to_kernel(self, array: Any, dims: Dims) -> Any:
        """``array``, of the logical shape, in the kernel's layout."""

    @abstractmethod
    def _to_logical(self, buffer: Any, dims: Dims) -> Any:
        """``buffer``, of the kernel's shape, in the logical layout."""

    def into(self, array: Any, dims: Dims) -> Any:
        """The caller's ``array`` (numpy or CuPy, of :meth:`logical`'s shape) in the kernel's
        layout: one copy, or ``array`` itself where the layouts coincide."""
        _expect(self, array, self.logical(dims), "the logical shape", "into takes the caller's array", dims)
        return self._to_kernel(array, dims)

    def view(self, buffer: Any, dims: Dims) -> Any:
        """The kernel's ``buffer`` (of :meth:`shape`) seen in the logical layout."""
        _expect(self, buffer, self.shape(dims), "the kernel's shape", "view takes the kernel's buffer", dims)
        return self._to_logical(buffer, dims)

    def zeroed(self, dims: Dims, dtype: str, xp: Any) -> tuple[Any, Any]:
        """A zeroed kernel buffer in ``xp`` (numpy or CuPy) and the view of its logical part
        to write into, so a producer fills the kernel's layout without a copy."""
        buffer = xp.zeros(self.shape(dims), dtype=dtype)
        return buffer, self._to_logical(buffer, dims)

    def problem(self, array: Any, dims: Dims, in_kernel_layout: bool) -> str | None:
        """What is wrong with the contents of ``array`` (in the kernel's layout when
        ``in_kernel_layout``, else the logical one), or None. Shape and dtype are launch's to
        check; a layout with a rule on the values (W's codes) overrides this."""
        return None

    def remedy(self, dtype: str) -> str:
        """What a caller whose array is not ``dtype`` at :meth:`logical`'s shape should do."""
        return f"pass a {dtype} array of that shape (hslm_ptx.arrays quantizes float inputs)"


@dataclass(frozen=True)
class Plain(Layout):
    """A buffer the kernel reads or writes just as its callers hold it: the logical layout is
    the kernel's, so both conversions hand the array back."""

    extent: Callable[[Dims], tuple[int, ...]]

    def shape(self, dims: Dims) -> tuple[int, ...]:
        return tuple(self.extent(dims))

    def logical(self, dims: Dims) -> tuple[int, ...]:
        return self.shape(dims)

    def _to_kernel(self, array: Any, dims: Dims) -> Any:
        return array

    def _to_logical(self, buffer: Any, dims: Dims) -> Any:
        return buffer


def _expect(layout: Layout, array: Any, want: tuple[int, ...], which: str, hint: str, dims: Dims) -> None:
    """Refuse ``array`` unless it has shape ``want`` (``which``), in one line with ``hint``."""
    got = tuple(getattr(array, "shape", ()))
    if got != tuple(want):
        raise LayoutError(f"{type(layout).__name__} layout for R={dims.R} K={dims.K} N={dims.N}: an array of "
                          f"shape {got}, expected {which} {tuple(want)} ({hint})")
