"""A stand-in for CuPy on numpy, so the GPU paths run on a machine without a GPU.

Tests put this folder first on PYTHONPATH (or load it into sys.modules). Arrays are
numpy arrays; a module's kernels run on the CPU PTX emulator (hslm_ptx.emu), so our
PTX really executes and is checked. There is no cuBLAS (``from cupy.cuda import
cublas`` fails, so those rows must come out as errors), no CUDA_R_32I (as in CuPy 14),
graphs capture nothing, and timings are host time: this checks flows, records and error
paths, never a speed. Environment knobs: STANDIN_DEVICES (device count, default 1),
STANDIN_JIT_REFUSE (a kernel name whose PTX the stand-in driver refuses to load),
STANDIN_FAULT (a kernel whose launch faults with cudaErrorIllegalAddress, a sticky
error: from then on every CUDA call of the process fails the same way, as on a real
device) and STANDIN_LAUNCH_LOG (a file each kernel launch appends its name to: what
the stand-in ncu reads to know which launches it profiled).

Memory is host memory: ``cuda.UnownedMemory`` over an address (a CPU torch tensor's, in
the tests of hslm_ptx.step.launches.CudaRuntime) refuses a null pointer without a device id,
as CuPy 14.2 does, and ``ndarray(shape, dtype, memptr=...)`` is a numpy array over it
whose ``data`` is a MemoryPointer, as CuPy's is.
"""
import ctypes
import os
import time
import types
import sys

import numpy as np

from hslm_ptx.emu import Module as EmulatorModule

__version__ = "0-standin"
int32, float16, float32, float64 = np.int32, np.float16, np.float32, np.float64


class UnownedMemory:
    """cupy.cuda.UnownedMemory: memory someone else owns. Without a device id CuPy looks
    the pointer's device up, and a null pointer (a zero-size torch tensor's) has none."""

    def __init__(self, ptr, size, owner, device_id=-1):
        if device_id < 0:
            if ptr == 0:
                raise ValueError("UnownedMemory: a null pointer needs device_id (stand-in, as CuPy 14.2)")
            device_id = 0
        self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id


class MemoryPointer:
    def __init__(self, mem, offset):
        self.mem, self.ptr = mem, mem.ptr + offset


class ndarray(np.ndarray):
    """cupy.ndarray over host memory: ``memptr`` names the first byte; every view keeps the
    memory it came from, and ``data`` is the MemoryPointer of its own first byte."""

    def __new__(cls, shape, dtype=float, memptr=None, strides=None, order="C"):
        dtype = np.dtype(dtype)
        if memptr is None:
            memptr = MemoryPointer(UnownedMemory(0, 0, None, 0), 0)
            out = np.zeros(shape, dtype).view(cls)
        else:
            size = int(np.prod(shape)) * dtype.itemsize
            buffer = (ctypes.c_char * size).from_address(memptr.ptr) if size else bytearray(0)
            out = np.ndarray.__new__(cls, shape, dtype, buffer=buffer, strides=strides, order=order)
        out._mem = memptr.mem
        return out

    def __array_finalize__(self, obj):
        self._mem = getattr(obj, "_mem", None)

    @property
    def data(self):
        pointer = MemoryPointer(self._mem, 0)
        pointer.ptr = self.__array_interface__["data"][0] if self.size else 0
        return pointer


class CUDADriverError(RuntimeError):
    """What CuPy raises when the driver refuses a module."""


class CUDARuntimeError(RuntimeError):
    """What CuPy raises when a runtime call fails."""


STICKY = "cudaErrorIllegalAddress: an illegal memory access was encountered"
_context = {"lost": None}  # the sticky error once a launch faulted


def _alive():
    """Every CUDA call of a process whose context a fault broke fails with that fault."""
    if _context["lost"]:
        raise CUDARuntimeError(_context["lost"])


def _checked(fn):
    def call(*args, **kwargs):
        _alive()
        return fn(*args, **kwargs)

    return call


full, zeros, matmul, ascontiguousarray = (_checked(f) for f in (np.full, np.zeros, np.matmul,
                                                                  np.ascontiguousarray))
asnumpy = _checked(np.asarray)


@_checked
def asarray(a, dtype=None):
    return np.array(a, dtype=dtype)


class Event:
    def record(self, stream=None):
        _alive()
        self.t = time.perf_counter()

    def synchronize(self):
        pass


class Stream:
    made_from_external = []  # the (ptr, device_id) of every Stream.from_external

    def __init__(self, non_blocking=False):
        pass

    @classmethod
    def from_external(cls, ptr, device_id=-1):
        cls.made_from_external.append((ptr, device_id))
        return cls()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def begin_capture(self):
        pass

    def end_capture(self):
        return types.SimpleNamespace(launch=lambda stream=None: None)


class Device:
    id = 0
    attributes = {"L2CacheSize": 4096, "MultiProcessorCount": 2}

    def synchronize(self):
        _alive()


class FunctionModule:
    """cupy.cuda.function.Module: PTX bytes in, kernels out (the emulator's)."""

    def load(self, image):
        _alive()
        text = image.decode()
        refuse = os.environ.get("STANDIN_JIT_REFUSE")
        if refuse and f".entry {refuse}(" in text:
            raise CUDADriverError("CUDA_ERROR_INVALID_PTX: a PTX JIT compilation failed (stand-in)")
        self.module = EmulatorModule(code=text)

    def get_function(self, name):
        kernel = self.module.get_function(name)

        def launch(*args, **kwargs):
            _alive()
            log = os.environ.get("STANDIN_LAUNCH_LOG")
            if log:
                with open(log, "a") as f:
                    f.write(name + "\n")
            kwargs.pop("stream", None)  # one stream: launches run in order
            if os.environ.get("STANDIN_FAULT") == name:
                _context["lost"] = STICKY
                raise CUDARuntimeError(STICKY)
            return kernel(*args, **kwargs)

        launch.__name__ = name
        return launch


runtime = types.ModuleType("cupy.cuda.runtime")
runtime.__dict__.update(
    CUDA_R_8I=3,  # like CuPy 14: CUDA_R_8I but no CUDA_R_32I
    getDeviceCount=lambda: int(os.environ.get("STANDIN_DEVICES", "1")),
    driverGetVersion=lambda: 13000, runtimeGetVersion=lambda: 13000,
    getDeviceProperties=_checked(lambda i: {"name": b"STAND-IN numpy GPU", "major": 9, "minor": 0}))
cuda = types.ModuleType("cupy.cuda")
cuda.__dict__.update(runtime=runtime, Event=Event, Stream=Stream, Device=Device,
                     UnownedMemory=UnownedMemory, MemoryPointer=MemoryPointer,
                     ExternalStream=lambda ptr, device_id=-1: Stream(),
                     set_allocator=lambda allocator=None: None,
                     function=types.SimpleNamespace(Module=FunctionModule),
                     get_elapsed_time=lambda a, b: max(b.t - a.t, 1e-6) * 1e3)
sys.modules.setdefault("cupy.cuda", cuda)
sys.modules.setdefault("cupy.cuda.runtime", runtime)
