"""The CUDA runtime: CuPy views of torch tensors, launches on torch's current stream."""
from __future__ import annotations

import weakref
from typing import Any

from hslm_ptx.kernel.spec import KernelSpec, Launch
from hslm_ptx.formats.floats import FLOAT_DTYPES, storage_dtype
from hslm_ptx.runtime.base import Runtime
from hslm_ptx.validate import LaunchError


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
        self._torch_dtypes = {**{name: getattr(torch, name) for name in FLOAT_DTYPES}, "int8": torch.int8, "int32": torch.int32, "uint32": torch.int32,
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
            from hslm_ptx.runtime.backends import load_ptx

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
