"""What every kernel module declares, so the pipeline can drive any kernel the same way.

A kernel module (``hslm_ptx/families/hslm_fwd_s8.py`` ...) builds one :class:`KernelSpec`.
The pipeline never special-cases a kernel: emit calls ``spec.emit()``, verify calls
``spec.make_inputs`` + :func:`hslm_ptx.runtime.launch.launch` + ``spec.reference`` and compares,
bench times the same launch. Backends (CuPy's RawModule, our CPU emulator) supply a
``fn(grid, block, args, shared_mem=0)`` callable; nothing here imports either.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, NamedTuple

import numpy as np

from hslm_ptx.formats.floats import FLOAT_DTYPES, SHORT_NAMES, storage_dtype
from hslm_ptx.formats.layout import Dims, Layout  # Dims: the problem size every layout is a function of
from hslm_ptx.formats.ternary import unpack


def family_name(product: str, *float_types: str, split: bool = False) -> str:
    """A family's name, the one way one is built: ``hslm_<product>[_splitk]_<short>...`` from
    its product (``fwd``, ``quant``, ...) and the float types it reads or writes, in order
    (``family_name("grads", "float32", "bfloat16")`` is ``hslm_grads_f32_bf16``). A tile
    configuration of the family appends its tile to this (hslm_ptx.tile.specs)."""
    return "_".join(["hslm", product] + (["splitk"] if split else []) + [SHORT_NAMES[t] for t in float_types])


class Launch(NamedTuple):
    """Launch geometry: CUDA grid and block (x, y, z) and dynamic shared bytes."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int = 0


class BufferSpec(NamedTuple):
    """One global-buffer parameter (a ``.u64`` pointer in the PTX): its element type and its
    :class:`hslm_ptx.formats.layout.Layout`, the kernel's shape and the caller's, and the conversions
    between them (``hslm_ptx.kernel.pitch`` builds the pitched and planes ones)."""

    name: str
    dtype: str  # "int8", "uint32", "int32", or a float type: "float32", "float16", "bfloat16"
    layout: Layout

    is_scalar = False  # a class attribute, not a field (ScalarSpec's is True)

    @property
    def storage(self) -> str:
        """The numpy dtype name the buffer is held in: ``dtype``, but uint16 bit patterns for
        bfloat16, which numpy lacks (hslm_ptx.formats.floats)."""
        return storage_dtype(self.dtype).name

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES


@dataclass(frozen=True)
class ScalarSpec:
    """One u32 scalar parameter (a ``.u32`` in the PTX): a Dims field of the same name, or
    ``derived`` from Dims (a row pitch, a split's span).

    Its own type rather than a BufferSpec without a shape: a scalar has no layout and a
    buffer always has one, so neither carries a field that is meaningless for it (no shape
    of ``None`` to test for), and the element type cannot tell them apart (packed W is u32
    too). Callers branch on ``is_scalar``, which both types answer."""

    name: str
    derived: Callable[[Dims], int] | None = None  # None: the Dims field ``name``

    is_scalar: ClassVar[bool] = True
    dtype: ClassVar[str] = "uint32"

    def value(self, dims: Dims) -> int:
        """The argument for ``dims``. A scalar with no rule that is no Dims field (one the
        layer step passes itself) is refused here, where a launch would need it."""
        if self.derived is not None:
            return self.derived(dims)
        if self.name not in Dims._fields:
            raise ValueError(f"scalar parameter '{self.name}' is not a Dims field ({', '.join(Dims._fields)}) and "
                             "has no rule: give ScalarSpec the function that derives it from Dims, or pass its value")
        return getattr(dims, self.name)


Param = BufferSpec | ScalarSpec  # one PTX parameter of a kernel


class Part(NamedTuple):
    """A staged kernel's body as a part of another entry (``hslm_ptx.families.hslm_grads``): its
    CTA's ``threads`` and ``min_ctas``, its tile's rows ``tile_m``, the Dims fields of its
    output's rows, its output's columns and its contraction (``gemm``), and ``emit(ptx,
    p)``, which writes the body into ``ptx`` from the loaded parameters ``p`` by name,
    reading its CTA coordinates through ``Ptx.special``."""

    threads: int
    min_ctas: int
    tile_m: int
    gemm: tuple[str, str, str]
    emit: Callable[[Any, dict[str, str]], None]


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


def buffer_bytes(params: tuple[Param, ...], dims: Dims, leave_out: tuple[str, ...] = ()) -> int:
    """The bytes of the buffers among ``params`` on ``dims``, each in the caller's layout,
    but those named in ``leave_out``."""
    return sum(int(np.prod(p.layout.logical(dims))) * storage_dtype(p.dtype).itemsize
               for p in params if not p.is_scalar and p.name not in leave_out)


@dataclass(frozen=True)
class KernelSpec:
    """Everything the pipeline needs to emit, launch and check one kernel.

    ``params`` is the PTX parameter order. ``outputs`` names the buffers the kernel
    writes (empty: the first buffer alone, as for the int32 GEMMs); the other buffers are
    inputs (named as in ``make_inputs``); scalars are Dims fields or derived from them.
    ``reference`` returns the one output's array, or a dict of every output by name
    (:meth:`expected` gives the dict either way). ``gemm_form`` is None for a kernel
    that is not an int8 GEMM (a quantizer, the weight preparation): bench, the model and
    the SASS-per-IMMA figures leave such a kernel out.
    The kernel's source is its module and what that imports from hslm_ptx (outside hslm_ptx.pipeline)
    (hslm_ptx.pipeline.core.sources walks the imports), so nothing here lists files by hand.
    """

    name: str
    emit: Callable[[], str]
    geometry: Callable[[Dims], Launch]
    params: tuple[Param, ...]
    make_inputs: Callable[[Dims, np.random.Generator], dict[str, np.ndarray]]
    reference: Callable[[Dims, dict[str, np.ndarray]], np.ndarray | dict[str, np.ndarray]]
    gemm_form: GemmForm | None = None
    max_rows: int | None = None  # R bound the kernel is exact for (dW: int32 overflow)
    stages: int = 1  # chunks in its copy ring (stages - 1 in flight ahead); 1: nothing prefetched
    chunk_bytes: int = 0  # global bytes one CTA copies into its ring per whole chunk (the cost model's L2 figure)
    # A family is one product (forward, dX, dW) built in several configurations (CTA
    # tiles), each its own PTX entry and KernelSpec; ``cost`` is the family's one rule
    # scoring this configuration on a shape (lower wins, hslm_ptx.catalog.registry.choose).
    family: str = ""  # "" : the kernel is a family of one, named ``name``
    tile: str = ""  # the configuration's CTA tile, "128x128"
    cost: Callable[[Dims], float] | None = None  # the cost model's device us on the rule's GPU
    # a split launch adds its int32 sums and the last CTA of a tile rescales them (hslm_ptx/families/hslm_rescaled.py)
    split_rescale: bool = False
    workspace: tuple[str, ...] = ()  # buffers only a split launch touches (its partial sums and tickets)
    outputs: tuple[str, ...] = ()  # the params the kernel writes, by name; (): params[0] only
    # elements one trip of the kernel's main loop handles per warp, for a non-GEMM kernel's
    # SASS figure (instructions per element, hslm_ptx.pipeline.stages.sass); 0: not counted per element
    trip_elements: int = 0
    part: Part | None = None  # a staged kernel's body, which a grouped entry can hold

    @property
    def output_params(self) -> tuple[BufferSpec, ...]:
        """The buffers the kernel writes, in parameter order."""
        if not self.outputs:
            return (self.params[0],)
        named = tuple(p for p in self.params if p.name in self.outputs)
        if len(named) != len(self.outputs):
            known = ", ".join(p.name for p in self.params)
            raise ValueError(f"{self.name}: outputs {self.outputs} are not all parameters ({known})")
        return named

    @property
    def output(self) -> BufferSpec:
        """The first output (the int32 GEMMs' only one)."""
        return self.output_params[0]

    @property
    def is_gemm(self) -> bool:
        return self.gemm_form is not None

    def buffer_bytes(self, dims: Dims, splits: int = 1) -> int:
        """Every buffer's bytes in the caller's layout: what the launch must read or write
        at least once (the cost model's DRAM bound); the workspace only when it splits."""
        return buffer_bytes(self.params, dims, () if splits > 1 else self.workspace)

    def expected(self, dims: Dims, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The reference's value of every output, by name."""
        want = self.reference(dims, inputs)
        if not isinstance(want, dict):
            return {self.output.name: want}
        names = [p.name for p in self.output_params]
        if sorted(want) != sorted(names):
            raise ValueError(f"{self.name}: the reference returned {sorted(want)}, expected the outputs {names}")
        return want

    @property
    def family_name(self) -> str:
        return self.family or self.name

    @property
    def module(self) -> str:
        """The module that defines the kernel (where its reference lives; its emitter may
        be built by a shared helper such as ``hslm_ptx.tile.specs.staged_spec``)."""
        return self.reference.__module__

    def gemm_operands(self, inputs: dict[str, np.ndarray], dims: Dims) -> tuple[np.ndarray, np.ndarray]:
        """Contiguous int8 (A, Bt) of :attr:`gemm_form`, with the output == A @ Bt.T."""
        if self.gemm_form is None:
            raise ValueError(f"{self.name} is not an int8 GEMM: it has no GEMM form")
        def operand(op: Operand) -> np.ndarray:
            value = inputs[op.name]
            matrix = unpack(value, dims.K) if value.dtype == np.uint32 else value
            return np.ascontiguousarray(matrix.T if op.transposed else matrix, dtype=np.int8)

        return operand(self.gemm_form.a), operand(self.gemm_form.bt)
