"""A runtime: where a layer step's arrays live and how its kernels run.

The step (hslm_ptx.step.launches) is written once against :class:`Runtime`; the emulator
(numpy arrays, the PTX on the CPU), CUDA (CuPy views of torch tensors) and the recording
stand-in (fake buffers that count what a step does) each give ``empty`` and ``run``.
bf16 buffers are held as their uint16 bit patterns (numpy and CuPy have no bfloat16), so a
uint16 array is read as bf16.
"""
from __future__ import annotations

from typing import Any

from hslm_ptx.kernel.spec import KernelSpec, Launch


class Runtime:
    """Where a step's arrays live and how its kernels run. Subclasses give ``empty`` and
    ``run``; ``dtype_of`` reads a float type back from an array (uint16 is bf16)."""

    name = "runtime"

    def empty(self, shape: tuple[int, ...], dtype: str) -> Any:
        raise NotImplementedError

    def zeros(self, shape: tuple[int, ...], dtype: str) -> Any:
        raise NotImplementedError

    def workspace(self, key: tuple, shape: tuple[int, ...], dtype: str) -> Any:
        """A buffer kept between launches: zeroed once when first asked for, and left zeroed
        by every launch that uses it (a split-K kernel's int32 sums and arrival tickets), so
        no step pays a fill. Launches on one runtime run in order on one stream, so every
        launch of a key finds it zeroed."""
        kept = self.__dict__.setdefault("_workspaces", {})
        if key not in kept:
            kept[key] = self.zeros(shape, dtype)
        return kept[key]

    def run(self, spec: KernelSpec, geometry: Launch, args: list[Any],
            buffers: list[tuple[str, Any, bool]]) -> None:
        """Launch ``spec`` with ``args`` (PTX parameter order). ``buffers``: (name, array,
        written) of each buffer argument the launch touches, for runtimes that count."""
        raise NotImplementedError

    def dtype_of(self, array: Any) -> str:
        name = str(array.dtype)
        return "bfloat16" if name == "uint16" else name
