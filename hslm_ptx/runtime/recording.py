"""The recording stand-in: fake device buffers (shape and dtype, no data) that record what a
layer step launches, synchronizes, copies and allocates. The step's code runs on it
unchanged, which is how ``doit layer`` counts a step exactly without a GPU."""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, NamedTuple

import numpy as np

from hslm_ptx.kernel.spec import KernelSpec, Launch
from hslm_ptx.formats.floats import storage_dtype
from hslm_ptx.runtime.base import Runtime


class LaunchRecord(NamedTuple):
    """One launch: kernel, geometry, and (name, bytes, written) of each buffer it touches."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    buffers: tuple[tuple[str, int, bool], ...]

    @property
    def bytes(self) -> int:
        return sum(size for _, size, _ in self.buffers)


@dataclass
class Recording:
    """What a run on :class:`RecordingRuntime` did. ``host_syncs``, ``h2d_copies`` and
    ``foreign_allocations`` hold where each happened (file:line)."""

    launches: list[LaunchRecord] = field(default_factory=list)
    host_syncs: list[str] = field(default_factory=list)
    h2d_copies: list[str] = field(default_factory=list)
    allocations: int = 0  # through the runtime's allocator (torch's, on a GPU)
    foreign_allocations: list[str] = field(default_factory=list)

    @property
    def bytes_moved(self) -> int:
        """Bytes of every buffer each launch reads or writes, once per launch: the DRAM-level
        floor of the step (a buffer a kernel reads twice, or one served from L2, counts once
        per launch all the same), not the L2 traffic the kernels make."""
        return sum(launch.bytes for launch in self.launches)


_INSIDE = (str(Path(__file__).parent), str(Path(__file__).parents[1] / "step"))  # the runtimes and the step


def _caller() -> str:
    """file:line of the code that touched a fake buffer: the first frame outside the
    runtimes and the step (the code that called the step)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_INSIDE):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"


def _storage_nbytes(shape: tuple[int, ...], dtype: str) -> int:
    return math.prod(shape) * storage_dtype(dtype).itemsize


class FakeBuffer:
    """A device buffer with a shape and a dtype and no data. Metadata (shape, dtype, nbytes,
    views by basic slicing, reshape, .T) is free; anything that needs the values on the
    host (``.get()``, ``float()``, ``bool()``, ``int()``, ``.item()``, ``np.asarray``) is a
    host sync, recorded and answered with zeros; arithmetic, comparisons and reductions are
    GPU operations that are not the step's kernels, recorded as foreign launches whose
    results are foreign allocations."""

    __array_priority__ = 1000  # numpy defers to these operators

    def __init__(self, runtime: "RecordingRuntime", shape: Iterable[int], dtype: str) -> None:
        self._rt, self.shape, self.dtype = runtime, tuple(int(s) for s in shape), str(dtype)

    # metadata: no data needed
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return _storage_nbytes(self.shape, self.dtype)

    @property
    def T(self) -> "FakeBuffer":
        return FakeBuffer(self._rt, self.shape[::-1], self.dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def reshape(self, *shape: Any) -> "FakeBuffer":
        want = list(shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)
        if -1 in want:
            known = math.prod(s for s in want if s != -1)
            want[want.index(-1)] = self.size // known if known else 0
        if math.prod(want) != self.size:
            raise ValueError(f"cannot reshape {self.shape} into {tuple(want)}")
        return FakeBuffer(self._rt, want, self.dtype)

    def __getitem__(self, key: Any) -> "FakeBuffer":
        keys = key if isinstance(key, tuple) else (key,)
        if any(isinstance(k, FakeBuffer) for k in keys):  # a mask or index array: its count is data
            self._rt.sync()
            self._rt.foreign("gather")
            return self._rt.foreign_buffer(self.shape, self.dtype)
        return FakeBuffer(self._rt, np.broadcast_to(np.empty((), np.bool_), self.shape)[key].shape, self.dtype)

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(key, FakeBuffer) or (isinstance(key, tuple) and any(isinstance(k, FakeBuffer) for k in key)):
            self._rt.sync()
        if isinstance(value, np.ndarray):
            self._rt.h2d()
        self._rt.foreign("assign")

    def __repr__(self) -> str:
        return f"FakeBuffer({self.dtype}{self.shape})"

    # the host needs the values: a sync each
    def get(self, *args: Any, **kwargs: Any) -> np.ndarray:
        self._rt.sync()
        return np.zeros(self.shape, dtype=storage_dtype(self.dtype))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.get().astype(dtype) if dtype is not None else self.get()

    def item(self) -> float:
        self._rt.sync()
        return 0

    def tolist(self) -> Any:
        return self.get().tolist()

    def __float__(self) -> float:
        self._rt.sync()
        return 0.0

    def __int__(self) -> int:
        self._rt.sync()
        return 0

    __index__ = __int__

    def __bool__(self) -> bool:
        self._rt.sync()
        return False

    # GPU work that is not one of the step's kernels
    def _elementwise(self, name: str, other: Any = None, dtype: str | None = None) -> "FakeBuffer":
        if isinstance(other, np.ndarray):
            self._rt.h2d()
        shape = self.shape
        if isinstance(other, (FakeBuffer, np.ndarray)):
            shape = np.broadcast_shapes(self.shape, tuple(other.shape))
        self._rt.foreign(name)
        return self._rt.foreign_buffer(shape, dtype or self.dtype)

    def _reduce(self, name: str) -> "FakeBuffer":
        self._rt.foreign(name)
        return self._rt.foreign_buffer((), self.dtype)

    def astype(self, dtype: Any, **kwargs: Any) -> "FakeBuffer":
        return self._elementwise("astype", dtype=str(np.dtype(dtype)))

    def copy(self, *args: Any, **kwargs: Any) -> "FakeBuffer":
        return self._elementwise("copy")

    def any(self, *args: Any, **kwargs: Any) -> "FakeBuffer":
        return self._reduce("any")

    def all(self, *args: Any, **kwargs: Any) -> "FakeBuffer":
        return self._reduce("all")

    def sum(self, *args: Any, **kwargs: Any) -> "FakeBuffer":
        return self._reduce("sum")

    def max(self, *args: Any, **kwargs: Any) -> "FakeBuffer":
        return self._reduce("max")

    def min(self, *args: Any, **kwargs: Any) -> "FakeBuffer":
        return self._reduce("min")

    def mean(self, *args: Any, **kwargs: Any) -> "FakeBuffer":
        return self._reduce("mean")


def _binary(name: str, result: str | None = None):
    def op(self: FakeBuffer, other: Any = None) -> FakeBuffer:
        return self._elementwise(name, other, result)

    op.__name__ = f"__{name}__"
    return op


for _name in ("add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "floordiv", "mod", "pow",
              "and", "rand", "or", "ror", "xor", "lshift", "rshift", "matmul", "neg", "abs", "invert"):
    setattr(FakeBuffer, f"__{_name}__", _binary(_name))
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    setattr(FakeBuffer, f"__{_name}__", _binary(_name, "bool"))
FakeBuffer.__hash__ = object.__hash__  # defining __eq__ would drop it; buffers are identities


class RecordingArrayModule:
    """A stand-in for ``cupy`` on the recording runtime: every function is a GPU operation
    that is not a step kernel (a foreign launch); creating an array is a foreign allocation
    (memory outside the runtime's allocator), from host data an h2d copy as well."""

    def __init__(self, runtime: "RecordingRuntime") -> None:
        self._rt = runtime

    def _make(self, shape: Any, dtype: Any, fill: bool) -> FakeBuffer:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if fill:
            self._rt.foreign("fill")
        return self._rt.foreign_buffer(shape, str(np.dtype(dtype or "float64")))

    def empty(self, shape: Any, dtype: Any = "float64", **kwargs: Any) -> FakeBuffer:
        return self._make(shape, dtype, fill=False)

    def zeros(self, shape: Any, dtype: Any = "float64", **kwargs: Any) -> FakeBuffer:
        return self._make(shape, dtype, fill=True)

    def ones(self, shape: Any, dtype: Any = "float64", **kwargs: Any) -> FakeBuffer:
        return self._make(shape, dtype, fill=True)

    def full(self, shape: Any, value: Any, dtype: Any = "float64", **kwargs: Any) -> FakeBuffer:
        return self._make(shape, dtype, fill=True)

    def asarray(self, data: Any, dtype: Any = None, **kwargs: Any) -> FakeBuffer:
        if isinstance(data, FakeBuffer):
            return data if dtype is None or str(np.dtype(dtype)) == data.dtype else data.astype(dtype)
        host = np.asarray(data, dtype=dtype)
        self._rt.h2d()
        return self._rt.foreign_buffer(host.shape, str(host.dtype))

    array = asarray

    def ascontiguousarray(self, data: Any, dtype: Any = None) -> FakeBuffer:
        return self.asarray(data, dtype)

    def __getattr__(self, name: str) -> Any:
        def operation(first: Any = None, *args: Any, **kwargs: Any) -> FakeBuffer:
            self._rt.foreign(name)
            shape = first.shape if isinstance(first, FakeBuffer) else ()
            return self._rt.foreign_buffer(shape, first.dtype if isinstance(first, FakeBuffer) else "float32")

        return operation


class RecordingRuntime(Runtime):
    """The stand-in for a GPU runtime that counts what a step does (:class:`Recording`).

    Arrays are :class:`FakeBuffer`; :meth:`empty` is the allocator path (torch's caching
    allocator on a GPU) and is counted as such; :meth:`run` records each launch with the
    bytes of every buffer argument (a host array among them is an h2d copy and a foreign
    allocation). ``xp`` stands in for cupy, so an array made or touched outside the step's
    kernels is seen. Nothing is computed."""

    name = "recording"

    def __init__(self) -> None:
        self.recording = Recording()
        self.xp = RecordingArrayModule(self)

    def empty(self, shape: tuple[int, ...], dtype: str) -> FakeBuffer:
        self.recording.allocations += 1
        return FakeBuffer(self, shape, dtype)

    def zeros(self, shape: tuple[int, ...], dtype: str) -> FakeBuffer:
        """From the allocator, then a fill that is not a step kernel (a kept workspace's,
        once: :meth:`Runtime.workspace`)."""
        self.foreign("zero fill")
        return self.empty(shape, dtype)

    def input(self, shape: tuple[int, ...], dtype: str) -> FakeBuffer:
        """A caller's device input (x, W, bias, dY): it exists before the step, so it is
        neither an allocation nor a copy of the step's."""
        return FakeBuffer(self, shape, dtype)

    def run(self, spec: KernelSpec, geometry: Launch, args: list[Any],
            buffers: list[tuple[str, Any, bool]]) -> None:
        touched = []
        for name, buf, written in buffers:
            if not isinstance(buf, FakeBuffer):  # host memory handed to a kernel: copied over first
                self.h2d()
                self.recording.foreign_allocations.append(_caller())
            touched.append((name, int(buf.nbytes), written))
        self.recording.launches.append(LaunchRecord(spec.name, tuple(geometry.grid), tuple(geometry.block),
                                                    int(geometry.shared_mem), tuple(touched)))

    # what FakeBuffer and RecordingArrayModule report
    def sync(self) -> None:
        self.recording.host_syncs.append(_caller())

    def h2d(self) -> None:
        self.recording.h2d_copies.append(_caller())

    def foreign(self, what: str) -> None:
        self.recording.launches.append(LaunchRecord(f"<not a step kernel: {what}>", (0, 0, 0), (0, 0, 0), 0, ()))

    def foreign_buffer(self, shape: tuple[int, ...], dtype: str) -> FakeBuffer:
        self.recording.foreign_allocations.append(_caller())
        return FakeBuffer(self, shape, dtype)
