"""Where a kernel runs: the layer step's runtimes (emulator, CUDA, recording) and the array
API's backends (:mod:`hslm_ptx.runtime.backends`)."""
from __future__ import annotations

from hslm_ptx.runtime.base import Runtime
from hslm_ptx.runtime.cuda import CudaRuntime
from hslm_ptx.runtime.emulator import EmulatorRuntime
from hslm_ptx.validate import LaunchError


def runtime_for(device_type: str, backend: str) -> Runtime:
    """The runtime of a torch device type and backend: ('cpu', 'emulator') or ('cuda', 'cuda')."""
    if backend == "emulator" and device_type == "cpu":
        return EmulatorRuntime()
    if backend == "cuda" and device_type == "cuda":
        return CudaRuntime()
    raise LaunchError(f"layer step: no runtime for device '{device_type}' with backend '{backend}'; "
                      "use ('cpu', 'emulator') or ('cuda', 'cuda')")
