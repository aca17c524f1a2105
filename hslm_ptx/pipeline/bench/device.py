"""What the bench runs on: the GPU check, optional torch, and the device record.

:func:`require_gpu` looks for what the bench needs (``import cupy`` and a device count
>= 1) and stops with one line saying which was missing and what to do.
:func:`probe_device` reads name, driver, clocks, L2 and library versions for the
report's header; clocks come from a read-only nvidia-smi query taken right after the
timed loops, while the clocks are still up. :func:`is_sticky` tells a CUDA error that
leaves the process's context unusable (a kernel fault) from one that does not, so the
GPU tools can carry on in a fresh process instead of failing everything after it.
"""
from __future__ import annotations

import re
import subprocess
from typing import Any

from hslm_ptx.runtime.backends import device_info, node_name
from hslm_ptx.pipeline.core.errors import UserError
from hslm_ptx.pipeline.bench.record import Device, peak_for
from hslm_ptx.pipeline.core.errors import one_line

# Which CuPy works: one wheel per CUDA major, matching the driver's major or older.
CUPY_BUILDS = ("CuPy >= 13 built for the machine's CUDA major: cupy-cuda12x "
               "(pip install -e '.[gpu-cuda12]', also what '.[gpu]' installs) or cupy-cuda13x "
               "(pip install -e '.[gpu-cuda13]')")


# Errors after which "the process is in an inconsistent state and any further CUDA work
# will return the same error; to continue using CUDA, the process must be terminated and
# relaunched" (CUDA Runtime API, enum cudaError): as the runtime, the driver
# (CUDA_ERROR_*) and torch ("CUDA error: <description>") word them.
STICKY_ERRORS = (
    "cudaErrorIllegalAddress", "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered",
    "cudaErrorLaunchFailure", "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure",
    "cudaErrorIllegalInstruction", "CUDA_ERROR_ILLEGAL_INSTRUCTION", "an illegal instruction was encountered",
    "cudaErrorMisalignedAddress", "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address",
    "cudaErrorInvalidAddressSpace", "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "cudaErrorInvalidPc", "CUDA_ERROR_INVALID_PC",
    "cudaErrorHardwareStackError", "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "cudaErrorAssert", "CUDA_ERROR_ASSERT", "device-side assert triggered",
    "cudaErrorLaunchTimeout", "CUDA_ERROR_LAUNCH_TIMEOUT",
    "cudaErrorECCUncorrectable", "CUDA_ERROR_ECC_UNCORRECTABLE", "uncorrectable ECC error",
)
_STICKY = re.compile("|".join(re.escape(s) for s in STICKY_ERRORS), flags=re.I)


def is_sticky(error: BaseException | str | None) -> bool:
    """Whether ``error`` (an exception or its recorded one-line text) is a sticky CUDA error."""
    if error is None:
        return False
    return bool(_STICKY.search(error if isinstance(error, str) else f"{type(error).__name__}: {error}"))


class NoGpu(UserError):
    """The bench cannot run here: no CuPy or no CUDA device."""


def require_gpu() -> Any:
    """CuPy, once it has imported and sees a device; else :class:`NoGpu` in one line."""
    todo = ("run it on a GPU machine (see tools/on-device.sh); "
            "`doit verify` checks the kernels on the CPU emulator")
    try:
        import cupy  # optional: only a GPU machine has it
    except Exception as exc:  # ImportError, or a broken CUDA install raising on import
        raise NoGpu(f"bench needs a CUDA GPU: looked for `import cupy` and it failed "
                    f"({type(exc).__name__}: {exc}); install {CUPY_BUILDS}, and {todo}") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
        why = ""
    except Exception as exc:  # CUDARuntimeError: no driver, no device
        count, why = 0, f" ({type(exc).__name__}: {exc})"
    if count < 1:
        raise NoGpu(f"bench needs a CUDA GPU: cupy imported but "
                    f"cupy.cuda.runtime.getDeviceCount() found no device{why}; {todo}")
    return cupy


def load_torch() -> tuple[Any, str | None]:
    """(torch, None) when torch sees a CUDA device, else (None, why not)."""
    try:
        import torch  # optional: its rows say "not run" without it

        if not torch.cuda.is_available():
            return None, "torch imports but sees no CUDA device"
        return torch, None
    except Exception as exc:
        return None, f"torch not importable ({one_line(exc)[:300]})"


SMI_FIELDS = ("name", "driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm",
              "clocks.max.mem", "temperature.gpu", "power.draw")
SMI_CLOCKS = {"sm_mhz": "clocks.sm", "mem_mhz": "clocks.mem", "sm_max_mhz": "clocks.max.sm",
              "mem_max_mhz": "clocks.max.mem", "temp_c": "temperature.gpu", "power_w": "power.draw"}


def nvidia_smi() -> dict[str, str] | None:
    """One GPU's fields from nvidia-smi (read-only query), or None when it cannot be run."""
    try:
        res = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}",
                              "--format=csv,noheader,nounits", "--id=0"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0 or not res.stdout.strip():
        return None
    return dict(zip(SMI_FIELDS, (v.strip() for v in res.stdout.splitlines()[0].split(","))))


def probe_device(cp: Any, torch: Any) -> Device:
    """Name, driver, clocks (read after the timed loops, while the clocks are up), L2, peak."""
    name, cuda_driver, arch = device_info("gpu")
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    attrs = dev.attributes
    smi = nvidia_smi()
    if smi:
        clocks = {key: smi[field] for key, field in SMI_CLOCKS.items()}
        source, driver = "nvidia-smi, read after the timed loops", smi["driver_version"]
    else:
        clocks = {key: str(attrs[a] // 1000) for key, a in (("sm_max_mhz", "ClockRate"),
                                                            ("mem_max_mhz", "MemoryClockRate"))
                  if a in attrs}
        source, driver = "cupy device attributes (nvidia-smi not available)", None
    libs = {"cupy": cp.__version__}
    try:
        libs["cublas"] = str(cp.cuda.cublas.getVersion(cp.cuda.device.get_cublas_handle()))
    except Exception:  # an old cupy without getVersion: the version is optional
        pass
    if torch is not None:
        libs["torch"] = torch.__version__
    peak, peak_source = peak_for(name)
    return Device(
        name=name, driver=driver or f"CUDA driver {cuda_driver}",
        cuda_runtime=str(cp.cuda.runtime.runtimeGetVersion()),
        compute_capability=f"{props['major']}.{props['minor']}", arch=arch, node=node_name(),
        sm_count=attrs.get("MultiProcessorCount"), l2_bytes=attrs.get("L2CacheSize"),
        clocks=clocks, clocks_source=source, libraries=libs,
        peak_int8_tops=peak, peak_source=peak_source)
