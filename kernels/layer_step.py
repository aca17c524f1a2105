"""One TernaryLinear step as launches of this project's kernels, on any runtime.

A step is weight preparation (once per weight version), forward, and backward (dX, dW and
the bias gradient). Every GPU operation in it is one of the step's PTX kernels:

- ``prepare_weight``: ``hslm_wsum_<dt>`` (partial sums of |W|), ``hslm_wprep_<dt>``
  (beta = mean|W|, the planes of W and of W^T): 2 launches, once per weight version
  (``prepare_and_forward``: then the forward);
- ``forward``: ``hslm_fwdx_<out>``, the fused GEMM quantizing its own rows of x, with x's
  column scales and transposed codes (kept for dW) made in the same grid: 1 launch; with
  no weight gradient to come (inference, a frozen weight) ``hslm_fwdq_<out>``, the GEMM
  alone: 1;
- ``backward``: ``hslm_quant_<dt>`` on dY (its column sums are the bias gradient; only
  ``hslm_qrows_<dt>`` or ``hslm_qcols_<dt>`` when dX or dW alone is asked for), then
  ``hslm_grads_<dt>_<wdt>`` (dX's and dW's products in one grid, kernels/hslm_grads.py;
  ``hslm_dx_<out>`` or ``hslm_dw_<wdt>`` when one alone is asked for): 2 launches, so a
  training step with a new weight version is 5 launches, 3 with a kept one.

Each fused GEMM has an unsplit family and a split-K one (``hslm_fwd_splitk_<out>`` ...,
which reduces in int32 into a workspace it leaves zeroed); :func:`pick` runs the split one
only where the tile rule scores it lower (dW at R = 1782, forward or dX at R = 27 when the
contraction is 729 deep), and the runtime keeps its workspace between steps, zeroed once.
The grouped backward holds the split families' bodies, each splitting where its rule says;
a part of one split is passed no workspace (any valid pointer, never read).

Each launch is driven by its kernel's :class:`kernels.spec.KernelSpec`: the configuration
from :func:`kernels.registry.choose`, the grid, block and shared bytes from
``spec.geometry``, the argument order and every buffer's shape and dtype from
``spec.params``. Outputs are allocated at the shapes the specs declare, by the runtime.
This path is lean on purpose: every buffer is either the caller's input
(checked by metadata only: shape and dtype) or one the step's own kernels wrote, so no
buffer is ever scanned and no value is read back to the host. A non-finite input is not
looked for: the kernels propagate NaN (``kernels.stepmath``), as ``nn.Linear`` does.

Runtimes (:func:`runtime_for`) say where arrays live and how a kernel runs:

- ``emulator``: numpy arrays, the PTX on the CPU emulator (``kernels.ptxemu``);
- ``cuda``: CuPy views of tensors from torch's caching allocator (``torch.empty``), launches
  on ``torch.cuda.current_stream()``, so a step can be captured in a CUDA graph;
- :class:`RecordingRuntime`: fake device buffers (shape and dtype, no data) that record what
  a step launches, synchronizes, copies and allocates; the code above runs on it
  unchanged, which is how ``doit layer`` counts a step.

bf16 buffers are held as their uint16 bit patterns (numpy and CuPy have no bfloat16;
``kernels.floats``), so a uint16 array is read as bf16 here.
"""
from __future__ import annotations

import math
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple

import numpy as np

from kernels import grouped, hslm_grads, registry
from kernels.floats import FLOAT_DTYPES, storage_dtype
from kernels.pitch import pitch
from kernels.spec import BufferSpec, Dims, KernelSpec, Launch
from kernels.stepmath import SUM_BLOCK
from kernels.validate import LaunchError

DTYPE_SUFFIX = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}  # kernel name suffix per float type
POISON_BYTE = 0xD5  # what the emulator runtime's fresh buffers hold: a byte no kernel wrote shows


class PreparedWeight(NamedTuple):
    """A weight version as the GEMMs read it: beta (f32[1], on the device), the planes of W
    (forward) and of W^T (dX), W's shape (N x K, nn.Linear's) and its float type (dW is
    written in it)."""

    beta: Any
    planes: Any
    planes_t: Any
    N: int
    K: int
    dtype: str = "float32"


class SavedActivations(NamedTuple):
    """What forward keeps for dW: X's codes transposed (K x pitch(R)), its column scales u
    (f32[K]) and the row count."""

    x_t: Any
    u: Any
    R: int


# ---- the runtimes --------------------------------------------------------------------------

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


class EmulatorRuntime(Runtime):
    """numpy arrays; each kernel's PTX emitted in-process and run on kernels.ptxemu. Fresh
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
            from kernels.ptxemu import Module

            fn = self._functions[spec.name] = Module(code=spec.emit()).get_function(spec.name)
        fn(geometry.grid, geometry.block, args, shared_mem=geometry.shared_mem)


class CudaRuntime(Runtime):
    """CuPy views of torch tensors on the current CUDA device. Memory comes from torch's
    caching allocator (``torch.empty``; under graph capture, the graph's pool), each view
    keeping its tensor alive, and every array handed back to torch is a view of the very
    tensor it came from (same storage, so the caching allocator frees it and cudagraph
    trees can checkpoint it); kernels launch on ``torch.cuda.current_stream()`` as it is
    at each launch, so a captured step records onto the capture stream. Nothing here reads
    a device value.

    A zero-size buffer never reaches CuPy or the driver: it has no address (torch gives
    it a null pointer, which CuPy's pointer lookup refuses), so :meth:`view` gives it an
    array over no memory on the tensor's device and :meth:`tensor` a fresh empty tensor.

    ``cupy``, ``torch`` and ``device`` are for stand-ins: a test passes a CuPy over host
    memory and ``device="cpu"`` to run this class without a GPU."""

    name = "cuda"

    def __init__(self, cupy: Any = None, torch: Any = None, device: str = "cuda") -> None:
        if cupy is None:
            import cupy  # optional: only a GPU machine has it
        if torch is None:
            import torch

        self._cupy, self._torch, self._device = cupy, torch, device
        self._functions: dict[str, Any] = {}
        self._streams: dict[tuple[int, int], Any] = {}
        self._tensors: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
        self._torch_dtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                              "int8": torch.int8, "int32": torch.int32, "uint32": torch.int32,
                              "uint16": torch.int16}

    def empty(self, shape: tuple[int, ...], dtype: str) -> Any:
        tensor = self._torch.empty(tuple(shape), dtype=self._torch_dtypes[dtype], device=self._device)
        return self.view(tensor, dtype)

    def zeros(self, shape: tuple[int, ...], dtype: str) -> Any:
        tensor = self._torch.zeros(tuple(shape), dtype=self._torch_dtypes[dtype], device=self._device)
        return self.view(tensor, dtype)

    def workspace(self, key: tuple, shape: tuple[int, ...], dtype: str) -> Any:
        """:meth:`Runtime.workspace`, one per device."""
        return super().workspace(key + (self._device_index(),), shape, dtype)

    def _device_index(self) -> int:
        return self._torch.cuda.current_device() if self._device == "cuda" else 0

    def view(self, tensor: Any, dtype: str | None = None) -> Any:
        """A CuPy array over ``tensor``'s memory (contiguous), no copy and no DLPack (which
        has no bf16 in CuPy): the storage dtype of ``dtype`` (default: the tensor's)."""
        cp = self._cupy
        name = dtype or str(tensor.dtype).removeprefix("torch.")
        if not tensor.is_contiguous() or tensor.device.type != self._device:
            raise LaunchError(f"layer step: a {tuple(tensor.shape)} tensor on {tensor.device} that is "
                              f"{'' if tensor.is_contiguous() else 'not '}contiguous; pass a contiguous CUDA tensor "
                              "(tensor.contiguous())")
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes == 0:  # no address to look up: the device is named, nothing is mapped
            memory = cp.cuda.UnownedMemory(0, 0, tensor, tensor.device.index or 0)
        else:
            memory = cp.cuda.UnownedMemory(tensor.data_ptr(), nbytes, tensor)
            self._tensors[tensor.data_ptr()] = tensor
        return cp.ndarray(tuple(tensor.shape), dtype=storage_dtype(name), memptr=cp.cuda.MemoryPointer(memory, 0))

    def tensor(self, array: Any, dtype: str) -> Any:
        """The torch tensor over a CuPy array of this runtime (no copy), seen as ``dtype``:
        a view of the storage of the tensor :meth:`view` mapped it from, so it is torch's
        caching allocator's memory (bf16 bits as int16, uint32 words as int32). An array
        this runtime did not map (none of the step's are) is copied into a fresh
        ``torch.empty``, never wrapped: its memory would be CuPy's, not torch's."""
        torch = self._torch
        want = self._torch_dtypes.get(dtype, self._torch_dtypes.get(str(array.dtype)))
        if array.size == 0:
            return torch.empty(tuple(array.shape), dtype=want, device=self._device)
        owner = self._tensors.get(array.data.mem.ptr)
        if owner is None:
            out = torch.empty(tuple(array.shape), dtype=want, device=self._device)
            self.view(out, str(array.dtype))[...] = array
            return out
        storage, itemsize = owner.untyped_storage(), array.dtype.itemsize
        offset = array.data.ptr - storage.data_ptr()
        strides = tuple(s // itemsize for s in array.strides)
        out = torch.empty(0, dtype=self._torch_dtypes[str(array.dtype)], device=self._device)
        out.set_(storage, offset // itemsize, tuple(array.shape), strides)
        return out.view(want)

    def run(self, spec: KernelSpec, geometry: Launch, args: list[Any],
            buffers: list[tuple[str, Any, bool]]) -> None:
        key = (spec.name, self._device_index())  # a module is loaded per device
        fn = self._functions.get(key)
        if fn is None:
            from kernels.backends import load_ptx

            fn = self._functions[key] = load_ptx("gpu", spec.emit(), spec.name)
        fn(geometry.grid, geometry.block, tuple(args), shared_mem=geometry.shared_mem, stream=self._stream())

    def _stream(self) -> Any:
        """CuPy's handle on torch's current stream, made once per stream:
        ``Stream.from_external`` where CuPy has it (14 and later; ``ExternalStream`` is
        deprecated there), ``ExternalStream`` before."""
        ptr = self._torch.cuda.current_stream().cuda_stream if self._device == "cuda" else 0
        key = (ptr, self._device_index())
        if key not in self._streams:
            cuda = self._cupy.cuda
            make = getattr(cuda.Stream, "from_external", None) or cuda.ExternalStream
            self._streams[key] = make(*key)
        return self._streams[key]


def runtime_for(device_type: str, backend: str) -> Runtime:
    """The runtime of a torch device type and backend: ('cpu', 'emulator') or ('cuda', 'cuda')."""
    if backend == "emulator" and device_type == "cpu":
        return EmulatorRuntime()
    if backend == "cuda" and device_type == "cuda":
        return CudaRuntime()
    raise LaunchError(f"layer step: no runtime for device '{device_type}' with backend '{backend}'; "
                      "use ('cpu', 'emulator') or ('cuda', 'cuda')")


# ---- the recording stand-in ----------------------------------------------------------------

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


def _caller() -> str:
    """file:line of the code that touched a fake buffer (the first frame outside this module)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == __file__:
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


# ---- launching a step kernel ---------------------------------------------------------------

def _same_storage(a: str, b: str) -> bool:
    return storage_dtype(a) == storage_dtype(b)


def pick(families: str | tuple[str, ...], dims: Dims) -> KernelSpec:
    """The kernel to run: each registered family's configuration for ``dims``
    (:func:`kernels.registry.choose`), the one the tile rule scores lowest across them, the
    first listed on a tie. A product lists its unsplit family first and its split-K one
    second, so a split (and its kept workspace) is used only where the rule says it pays."""
    families = (families,) if isinstance(families, str) else families
    picks = [registry.choose(family, dims) for family in families if family in registry.FAMILIES]
    if not picks:
        raise LaunchError(f"layer step: unknown kernel family '{families[0]}'; known: {', '.join(registry.FAMILIES)}; "
                          "the step needs it in kernels/registry.py")
    return min(picks, key=lambda spec: spec.cost(dims) if spec.cost else -math.inf)  # no rule: no choice to make


def _launch(rt: Runtime, family: str | tuple[str, ...], dims: Dims, given: Mapping[str, Any],
            allocate: Iterable[str] = (), scalars: Mapping[str, int] | None = None,
            unused: Iterable[str] = ()) -> dict[str, Any]:
    """Launch the kernel :func:`pick` takes for ``dims`` and return every buffer argument by
    name.

    ``given``: buffers by parameter name, checked by shape and dtype only (each either the
    caller's input or one a step kernel wrote). ``allocate``: buffers made here by the
    runtime, at the shape and dtype the spec declares. Any other buffer the spec has that
    the kernel does not write is a workspace kept by the runtime (:meth:`Runtime.workspace`).
    ``scalars``: u32 values by name; a scalar not given comes from its spec
    (``ScalarSpec.value``: its rule, or the Dims field). ``unused``: buffers the launch does not touch (a bias when there is
    none), passed but not counted."""
    spec = pick(family, dims)
    if spec.max_rows is not None and dims.R > spec.max_rows:
        raise LaunchError(f"{spec.name}: R={dims.R} rows is over {spec.max_rows}, where its int32 sums could "
                          "overflow; split the batch into steps of at most that many rows")
    scalars, unused, allocate = dict(scalars or {}), set(unused), set(allocate)
    buffers, args, touched = {}, [], []
    written = {p.name for p in spec.output_params}
    for param in spec.params:
        if param.is_scalar:
            value = scalars[param.name] if param.name in scalars else param.value(dims)
            args.append(np.dtype(param.dtype).type(value))
            continue
        want = tuple(param.layout.shape(dims))
        if param.name in allocate:
            buf = rt.empty(want, param.dtype)
        elif param.name in given:
            buf = given[param.name]
            if param.name not in unused:
                buf = _checked(spec, dims, param, buf, want)
        elif param.name not in written:
            buf = rt.workspace((spec.name, param.name, want), want, param.dtype)
        else:
            raise LaunchError(f"{spec.name}: output '{param.name}' was not allocated by the layer step")
        buffers[param.name] = buf
        args.append(buf)
        if param.name not in unused:
            touched.append((param.name, buf, param.name in written))
    rt.run(spec, spec.geometry(dims), args, touched)
    return buffers


def _checked(spec: KernelSpec, dims: Dims, param: BufferSpec, buf: Any, want: tuple[int, ...]) -> Any:
    """``buf`` against the spec's shape and storage dtype (metadata only), seen in the spec's
    shape when it holds the same elements in the same order (W N x K read as N*K: a view)."""
    shape, dtype = tuple(getattr(buf, "shape", ())), str(getattr(buf, "dtype", ""))
    contiguous = getattr(getattr(buf, "flags", None), "c_contiguous", True)  # a FakeBuffer has no strides
    if not contiguous:  # a kernel reads rows from the base pointer: a strided view would be garbage
        raise LaunchError(f"{spec.name}: '{param.name}' is a strided view {dtype}{shape}; pass a C-contiguous "
                          "array (ascontiguousarray, or tensor.contiguous())")
    if _same_storage(dtype, param.dtype):
        if shape == want:
            return buf
        if math.prod(shape) == math.prod(want):
            return buf.reshape(want)
    raise LaunchError(f"{spec.name}: '{param.name}' is {dtype}{shape}, expected {param.dtype}{want} "
                      f"for R={dims.R} K={dims.K} N={dims.N}")


def _float_type(rt: Runtime, op: str, name: str, array: Any) -> str:
    dtype = rt.dtype_of(array)
    if dtype not in DTYPE_SUFFIX:
        raise LaunchError(f"{op}: {name} is {dtype}; the layer step reads {', '.join(FLOAT_DTYPES)}")
    return dtype


def _matrix(op: str, name: str, array: Any, axes: str) -> tuple[int, int]:
    shape = tuple(array.shape)
    if len(shape) != 2 or 0 in shape:
        raise LaunchError(f"{op}: {name} has shape {shape}, expected a non-empty 2-D array ({axes})")
    return shape


def quant_dims(rows: int, cols: int) -> Dims:
    """The Dims a quantization kernel is declared on: R = rows, K = N = the columns."""
    return Dims(rows, cols, cols)


def weight_dims(N: int, K: int) -> Dims:
    """The Dims the weight-preparation kernels are declared on (W is N x K)."""
    return Dims(1, K, N)


def sum_partials(count: int) -> int:
    """How many partial sums of |W| the first preparation launch writes (its grid)."""
    return max(1, -(-count // SUM_BLOCK))


# ---- the step ------------------------------------------------------------------------------

def prepare_weight(rt: Runtime, w: Any) -> PreparedWeight:
    """beta and the planes of W and W^T from the latent float W (N x K), in two launches:
    per-block partial sums of |W|, then beta and both planes (every CTA of the second sums
    the partials the same way, so all agree on beta). Done once per weight version; the
    first forward of a version can take the first launch along (:func:`prepare_and_forward`)."""
    N, K = _matrix("prepare_weight", "w", w, "N x K")
    dt = DTYPE_SUFFIX[_float_type(rt, "prepare_weight", "w", w)]
    first = _launch(rt, f"hslm_wsum_{dt}", weight_dims(N, K), {"w": w}, allocate=("partials",),
                    scalars={"count": N * K})
    return _planes(rt, w, first["partials"])


def _planes(rt: Runtime, w: Any, partials: Any) -> PreparedWeight:
    """The second preparation launch: beta and both plane sets from W and its partial sums."""
    N, K = w.shape
    dt = DTYPE_SUFFIX[rt.dtype_of(w)]
    second = _launch(rt, f"hslm_wprep_{dt}", weight_dims(N, K), {"w": w, "partials": partials},
                     allocate=("planes", "planes_t", "beta"), scalars={"N": N, "K": K, "P": sum_partials(N * K)})
    return PreparedWeight(second["beta"], second["planes"], second["planes_t"], N, K, rt.dtype_of(w))


def _product(product: str, dt: str) -> tuple[str, str]:
    """A fused GEMM's families: unsplit first, split-K second (see :func:`pick`)."""
    return (f"hslm_{product}_{dt}", f"hslm_{product}_splitk_{dt}")


def _quantize_rows(rt: Runtime, a: Any, dt: str) -> dict[str, Any]:
    """Row scales and codes of ``a`` (rows x cols) in the GEMMs' pitched layout."""
    rows, cols = a.shape
    return _launch(rt, f"hslm_qrows_{dt}", quant_dims(rows, cols), {"x": a}, allocate=("codes", "scales"),
                   scalars={"R": rows, "C": cols, "ld": pitch(cols)})


def _quantize_cols(rt: Runtime, a: Any, dt: str) -> dict[str, Any]:
    """Column scales, transposed codes (cols x pitch(rows)) and column sums of ``a``."""
    rows, cols = a.shape
    return _launch(rt, f"hslm_qcols_{dt}", quant_dims(rows, cols), {"x": a},
                   allocate=("codes_t", "scales", "sums"), scalars={"R": rows, "C": cols, "ldr": pitch(rows)})


QUANT_OUTPUTS = ("codes", "row_scales", "codes_t", "col_scales", "sums")  # hslm_quant's, after any partials


def _quant_scalars(rows: int, cols: int) -> dict[str, int]:
    """The sizes and both code pitches of a fused quantization of a rows x cols matrix."""
    return {"R": rows, "C": cols, "ld": pitch(cols), "ldr": pitch(rows)}


def _quantize_both(rt: Runtime, a: Any, dt: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`_quantize_rows` and :func:`_quantize_cols` of ``a`` in one launch
    (``hslm_quant_<dt>``), returned as theirs would be."""
    rows, cols = a.shape
    return _quantized(_launch(rt, f"hslm_quant_{dt}", quant_dims(rows, cols), {"x": a}, allocate=QUANT_OUTPUTS,
                              scalars=_quant_scalars(rows, cols)))


def _activations(rt: Runtime, op: str, x: Any, in_features: int) -> tuple[int, int, str]:
    """x's rows, columns and kernel suffix, checked against the weight's in_features."""
    R, K = _matrix(op, "x", x, "R x K")
    if K != in_features:
        raise LaunchError(f"{op}: x has {K} columns, the weight has in_features={in_features}")
    return R, K, DTYPE_SUFFIX[_float_type(rt, op, "x", x)]


def forward(rt: Runtime, x: Any, prepared: PreparedWeight, bias: Any = None,
            keep_columns: bool = True) -> tuple[Any, SavedActivations | None]:
    """y = x (beta W_t)^T (+ bias) in x's float type, and what dW needs later (None
    without ``keep_columns``: no weight gradient to come): 1 launch, the GEMM that
    quantizes its own rows of x, with x's column quantization in the same grid
    (``hslm_fwdx_<dt>``) or without it (``hslm_fwdq_<dt>``)."""
    R, K, dt = _activations(rt, "forward", x, prepared.K)
    if not keep_columns:
        return _quantizing_product(rt, x, prepared, bias), None
    dims, family = Dims(R, K, prepared.N), f"hslm_fwdx_{dt}"
    idle = grouped.idle_workspace(pick(family, dims), dims)  # one split: any valid pointer, never read
    given = {"x": x, "w": prepared.planes, "beta": prepared.beta, "bias": prepared.beta if bias is None else bias,
             **{name: prepared.beta for name in idle}}  # no bias: any valid pointer, never read
    out = _launch(rt, family, dims, given, allocate=("y", "codes_t", "scales", "sums"),
                  scalars={"R": R, "K": K, "N": dims.N, "ldx": K, "has_bias": int(bias is not None), "C": K,
                           "ldr": pitch(R)},
                  unused=(*idle, *(("bias",) if bias is None else ())))
    return out["y"], SavedActivations(out["codes_t"], out["scales"], R)


def _quantizing_product(rt: Runtime, x: Any, prepared: PreparedWeight, bias: Any) -> Any:
    """y from float x in one launch: the forward GEMM quantizing its own rows of x."""
    R, K = x.shape
    dt, N = DTYPE_SUFFIX[rt.dtype_of(x)], prepared.N
    given = {"x": x, "w": prepared.planes, "beta": prepared.beta,
             "bias": prepared.beta if bias is None else bias}  # no bias: any valid pointer, never read
    return _launch(rt, _product("fwdq", dt), Dims(R, K, N), given, allocate=("y",),
                   scalars={"R": R, "K": K, "N": N, "ldx": K, "has_bias": int(bias is not None)},
                   unused=("bias",) if bias is None else ())["y"]


def prepare_and_forward(rt: Runtime, x: Any, w: Any, bias: Any = None) -> tuple[PreparedWeight, Any, SavedActivations]:
    """:func:`prepare_weight` then :func:`forward`: 3 launches. The first forward of a
    weight version, in training every step."""
    N, K = _matrix("prepare_and_forward", "w", w, "N x K")
    _float_type(rt, "prepare_and_forward", "w", w)
    _activations(rt, "prepare_and_forward", x, K)
    prepared = prepare_weight(rt, w)
    y, saved = forward(rt, x, prepared, bias)
    return prepared, y, saved


def _quantized(out: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A fused quantization's outputs as :func:`_quantize_rows` and :func:`_quantize_cols` name theirs."""
    return ({"codes": out["codes"], "scales": out["row_scales"]},
            {"codes_t": out["codes_t"], "scales": out["col_scales"], "sums": out["sums"]})


def backward(rt: Runtime, dy: Any, saved: SavedActivations, prepared: PreparedWeight,
             need_dx: bool = True, need_dw: bool = True, need_db: bool = False) -> tuple[Any, Any, Any]:
    """(dX in dY's float type, dW N x K in the weight's, db as f32 column sums of dY); each
    None when not asked for. Up to 2 launches: the quantization of dY (rows for dX, columns
    for dW and db: one launch when both are asked), then dX and dW in one launch
    (``hslm_grads_<dt>_<wdt>``), or the one of them asked for."""
    R, N = _matrix("backward", "dy", dy, "R x N")
    if (R, N) != (saved.R, prepared.N):
        raise LaunchError(f"backward: dy has shape {(R, N)}, expected ({saved.R}, {prepared.N}) from forward")
    dtype = _float_type(rt, "backward", "dy", dy)
    dt, K = DTYPE_SUFFIX[dtype], prepared.K
    dx = dw = db = None
    need_cols = need_dw or need_db
    if need_dx and need_cols:
        rows, cols = _quantize_both(rt, dy, dt)
    elif need_dx:
        rows = _quantize_rows(rt, dy, dt)
    elif need_cols:
        cols = _quantize_cols(rt, dy, dt)
    db = cols["sums"] if need_db else None
    dx_given = {"dy": rows["codes"], "w": prepared.planes_t, "row_scales": rows["scales"],
                "beta": prepared.beta} if need_dx else {}
    dw_given = {"x_t": saved.x_t, "dy_t": cols["codes_t"], "u": saved.u, "v": cols["scales"]} if need_dw else {}
    dims, wdt = Dims(R, K, N), DTYPE_SUFFIX[prepared.dtype]
    if need_dx and need_dw:  # both products in one launch
        family = hslm_grads.family(dt, wdt)
        idle = grouped.idle_workspace(pick(family, dims), dims)  # a part of one split: any valid pointer
        out = _launch(rt, family, dims, dx_given | dw_given | {name: rows["scales"] for name in idle},
                      allocate=("dx", "dw"), scalars={"R": R, "K": K, "N": N, "ldy": pitch(N), "ldr": pitch(R)},
                      unused=idle)
        return out["dx"], out["dw"], db
    if need_dx:
        dx = _launch(rt, _product("dx", dt), dims, dx_given, allocate=("dx",),
                     scalars={"R": R, "K": K, "N": N, "ldy": pitch(N)})["dx"]
    if need_dw:
        dw = _launch(rt, _product("dw", wdt), dims, dw_given, allocate=("dw",),
                     scalars={"R": R, "K": K, "N": N, "ldr": pitch(R)})["dw"]
    return dx, dw, db


def step_bytes_minimum(R: int, K: int, N: int, dtype: str, weight_dtype: str, bias: bool) -> int:
    """The bytes a forward + dX + dW step cannot avoid: x, W, the bias and dY read once; y,
    dX, dW and db written once (each in its own float type)."""
    act, wt = storage_dtype(dtype).itemsize, storage_dtype(weight_dtype).itemsize
    reads = R * K * act + N * K * wt + R * N * act + (N * act if bias else 0)
    writes = R * N * act + R * K * act + N * K * wt + (N * act if bias else 0)
    return reads + writes
