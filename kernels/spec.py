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

from kernels.ternary import unpack


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


class Operand(NamedTuple):
    """One operand of a kernel's dense GEMM form: a kernel input by name, transposed or not.
    A packed ternary input (uint32) stands for its K x N int8 matrix."""

    name: str
    transposed: bool = False


class GemmForm(NamedTuple):
    """The kernel's output as one dense int8 GEMM: ``out == A @ Bt.T``, A (M x inner) and
    Bt (cols x inner). Bench times library GEMMs on exactly this problem."""

    a: Operand
    bt: Operand


@dataclass(frozen=True)
class KernelSpec:
    """Everything the pipeline needs to emit, launch and check one kernel.

    ``params`` is the PTX parameter order. The first buffer is the output, the
    other buffers are inputs (named as in ``make_inputs``), scalars are R, K, N.
    The kernel's source is its module and what that imports from kernels/
    (pipeline.sources walks the imports), so nothing here lists files by hand.
    """

    name: str
    emit: Callable[[], str]
    geometry: Callable[[Dims], Launch]
    params: tuple[BufferSpec, ...]
    make_inputs: Callable[[Dims, np.random.Generator], dict[str, np.ndarray]]
    reference: Callable[[Dims, dict[str, np.ndarray]], np.ndarray]
    gemm_form: GemmForm
    max_rows: int | None = None  # R bound the kernel is exact for (dW: int32 overflow)
    stages: int = 1  # chunks in its copy ring (stages - 1 in flight ahead); 1: nothing prefetched
    # A family is one product (forward, dX, dW) built in several configurations (CTA
    # tiles), each its own PTX entry and KernelSpec; ``cost`` is the family's one rule
    # scoring this configuration on a shape (lower wins, kernels.registry.choose).
    family: str = ""  # "" : the kernel is a family of one, named ``name``
    tile: str = ""  # the configuration's CTA tile, "128x128"
    cost: Callable[[Dims], tuple[int, ...]] | None = None

    @property
    def output(self) -> BufferSpec:
        return self.params[0]

    @property
    def family_name(self) -> str:
        return self.family or self.name

    @property
    def module(self) -> str:
        """The module that defines the kernel (where its reference lives; its emitter may
        be built by a shared helper such as ``staged_tile.staged_spec``)."""
        return self.reference.__module__

    def gemm_operands(self, inputs: dict[str, np.ndarray], dims: Dims) -> tuple[np.ndarray, np.ndarray]:
        """Contiguous int8 (A, Bt) of :attr:`gemm_form`, with the output == A @ Bt.T."""
        def operand(op: Operand) -> np.ndarray:
            value = inputs[op.name]
            matrix = unpack(value, dims.K) if value.dtype == np.uint32 else value
            return np.ascontiguousarray(matrix.T if op.transposed else matrix, dtype=np.int8)

        return operand(self.gemm_form.a), operand(self.gemm_form.bt)
