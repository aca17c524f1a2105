"""A stand-in for CuPy on numpy, so the GPU paths run on a machine without a GPU.

Tests put this folder first on PYTHONPATH (or load it into sys.modules). Arrays are
numpy arrays; a module's kernels run on the CPU PTX emulator (kernels.ptxemu), so our
PTX really executes and is checked. There is no cuBLAS (``from cupy.cuda import
cublas`` fails, so those rows must come out as errors), no CUDA_R_32I (as in CuPy 14),
graphs capture nothing, and timings are host time: this checks flows, records and error
paths, never a speed. Environment knobs: STANDIN_DEVICES (device count, default 1),
STANDIN_JIT_REFUSE (a kernel name whose PTX the stand-in driver refuses to load),
STANDIN_FAULT (a kernel whose launch faults with cudaErrorIllegalAddress, a sticky
error: from then on every CUDA call of the process fails the same way, as on a real
device) and STANDIN_LAUNCH_LOG (a file each kernel launch appends its name to: what
the stand-in ncu reads to know which launches it profiled).
"""
import os
import time
import types
import sys

import numpy as np

from kernels.ptxemu import Module as EmulatorModule

__version__ = "0-standin"
int32, float16, float32, float64 = np.int32, np.float16, np.float32, np.float64
ndarray = np.ndarray


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
    def __init__(self, non_blocking=False):
        pass

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
                     set_allocator=lambda allocator=None: None,
                     function=types.SimpleNamespace(Module=FunctionModule),
                     get_elapsed_time=lambda a, b: max(b.t - a.t, 1e-6) * 1e3)
sys.modules.setdefault("cupy.cuda", cuda)
sys.modules.setdefault("cupy.cuda.runtime", runtime)
