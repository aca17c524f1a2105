"""The emulator runtime: numpy arrays, each kernel's PTX run on the CPU emulator (hslm_ptx.emu)."""
from __future__ import annotations

from typing import Any

import numpy as np

from hslm_ptx.kernel.spec import KernelSpec, Launch
from hslm_ptx.formats.floats import storage_dtype
from hslm_ptx.runtime.base import Runtime

POISON_BYTE = 0xD5  # what the emulator runtime's fresh buffers hold: a byte no kernel wrote shows


class EmulatorRuntime(Runtime):
    """numpy arrays; each kernel's PTX emitted in-process and run on hslm_ptx.emu. Fresh
    buffers are filled with :data:`POISON_BYTE`, so a kernel that reads a byte no kernel
    wrote gives a wrong answer the tests see, as ``torch.empty`` garbage would on a GPU."""

    name = "emulator"

    def __init__(self) -> None:
        self._functions: dict[str, Any] = {}

    def empty(self, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        out = np.empty(shape, dtype=storage_dtype(dtype))
        out.view(np.uint8)[...] = POISON_BYTE
        return out

    def zeros(self, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        return np.zeros(shape, dtype=storage_dtype(dtype))

    def run(self, spec: KernelSpec, geometry: Launch, args: list[Any],
            buffers: list[tuple[str, Any, bool]]) -> None:
        fn = self._functions.get(spec.name)
        if fn is None:
            from hslm_ptx.emu import Module

            fn = self._functions[spec.name] = Module(code=spec.emit()).get_function(spec.name)
        fn(geometry.grid, geometry.block, args, shared_mem=geometry.shared_mem)
