"""What every kernel module declares, so the pipeline can drive any kernel the same way.

A kernel module (``kernels/hslm_fwd_s8.py`` ...) builds one :class:`KernelSpec`.
The pipeline never special-cases a kernel: emit calls ``spec.emit()``, verify calls
``spec.make_inputs`` + :func:`kernels.launch.launch` + ``spec.reference`` and compares,
bench times the same launch. Backends (CuPy's RawModule, our CPU emulator) supply a
``fn(grid, block, args, shared_mem=0)`` callable; nothing here imports either.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import numpy as np


class Dims(NamedTuple):
    """Problem size. R rows (tokens), K in-features, N out-features."""

    R: int
    K: int
    N: int


class Launch(NamedTuple):
    """Launch geometry: CUDA grid and block (x, y, z) and dynamic shared bytes."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int = 0


class BufferSpec(NamedTuple):
    """One kernel parameter: a global buffer (dtype + shape) or a u32 scalar (dtype only)."""

    name: str
    dtype: str  # numpy dtype name: "int8", "uint32", "int32"
    shape: Callable[[Dims], tuple[int, ...]] | None  # None: a scalar taken from Dims
    value: Callable[[Dims], int] | None = None  # a scalar derived from Dims (a row pitch)
    # a buffer callers may hand over in another layout (rows at their logical width, or
    # not transposed): that shape, and how launch turns it into ``shape`` (one copy)
    logical: Callable[[Dims], tuple[int, ...]] | None = None
    prepare: Callable[[Any, tuple[int, ...]], Any] | None = None


@dataclass(frozen=True)
class KernelSpec:
    """Everything the pipeline needs to emit, launch and check one kernel.

    ``params`` is the PTX parameter order. The first buffer is the output, the
    other buffers are inputs (named as in ``make_inputs``), scalars are R, K, N.
    ``modules`` lists the Python modules whose source defines the kernel
    (emitter, shared helpers, reference): their hash is the kernel's source hash.
    """

    name: str
    emit: Callable[[], str]
    geometry: Callable[[Dims], Launch]
    params: tuple[BufferSpec, ...]
    make_inputs: Callable[[Dims, np.random.Generator], dict[str, np.ndarray]]
    reference: Callable[[Dims, dict[str, np.ndarray]], np.ndarray]
    modules: tuple[str, ...]
    max_rows: int | None = None  # R bound the kernel is exact for (dW: int32 overflow)

    @property
    def output(self) -> BufferSpec:
        return self.params[0]
