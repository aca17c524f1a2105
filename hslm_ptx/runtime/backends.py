"""Where a kernel runs: a GPU through CuPy, or the CPU PTX emulator.

Both hand back a function with CuPy's RawKernel calling convention,
``fn(grid, block, args, shared_mem=0)``, so verify and bench launch kernels the same
way on either (hslm_ptx.runtime.launch.launch). CuPy is optional and imported lazily: on a
machine without it (CI, laptops) only the emulator exists. This is runtime code: the
float ops use it as much as the build pipeline does, so it imports nothing from it.
"""
from __future__ import annotations

import functools
import socket
import sys
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np

EMULATOR_DEVICE = "cpu-emulator"
GPU_HINT = ("pip install -e '.[gpu-cuda12]' (cupy-cuda12x) or '.[gpu-cuda13]' (cupy-cuda13x), CuPy >= 13 "
            "for the machine's CUDA major, on a machine with a CUDA GPU; or use backend=emulator")


@functools.lru_cache(maxsize=None)
def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no cupy, no driver, no device: all mean "no GPU here"
        return False


def array_module(backend: str) -> Any:
    """numpy for the emulator, cupy for the GPU (the ``xp`` of hslm_ptx.runtime.launch.launch)."""
    if backend == "gpu":
        import cupy

        return cupy
    return np


def to_host(array: Any) -> np.ndarray:
    """A numpy copy of a numpy or cupy array."""
    return array.get() if hasattr(array, "get") else np.asarray(array)


def load_ptx(backend: str, ptx: str, entry: str) -> Callable[..., Any]:
    """``entry`` from PTX text, callable as ``fn(grid, block, args, shared_mem=0)``.

    On the GPU the text goes to the driver's JIT through CuPy's module loader (the one
    ``cupy.RawModule(path=...)`` uses; ``RawModule(code=...)`` would compile CUDA C++)."""
    if backend == "gpu":
        import cupy

        module = cupy.cuda.function.Module()
        module.load(ptx.encode())
        return module.get_function(entry)
    from hslm_ptx.emu import Module

    return Module(code=ptx).get_function(entry)


def load_function(backend: str, ptx: Path, entry: str) -> Callable[..., Any]:
    """``entry`` from a PTX file (see :func:`load_ptx`)."""
    return load_ptx(backend, Path(ptx).read_text(), entry)


class DeviceInfo(NamedTuple):
    """Who ran a check, for its report: the device's name, its CUDA driver, its arch."""

    name: str
    driver: str | None  # None on the emulator
    arch: str | None  # "sm_90" (the compute capability); None on the emulator


def node_name() -> str:
    """Where a check ran, for its record: the host, and on a Ray worker the node's id."""
    host = socket.gethostname()
    ray = sys.modules.get("ray")  # loaded on a Ray worker; a local worker does not pay its import
    if ray is not None and ray.is_initialized():
        return f"{host} ray:{ray.get_runtime_context().get_node_id()[:12]}"
    return host


def device_info(backend: str) -> DeviceInfo:
    if backend != "gpu":
        return DeviceInfo(EMULATOR_DEVICE, None, None)
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"]
    version = cupy.cuda.runtime.driverGetVersion()
    return DeviceInfo(name.decode() if isinstance(name, bytes) else str(name),
                      f"{version // 1000}.{version % 1000 // 10}", f"sm_{props['major']}{props['minor']}")
