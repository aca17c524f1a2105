"""What the hardware, ptxas and the driver refuse before a kernel runs, and the
instruction budget that stops a launch which would never end.

CUDA C++ Programming Guide, "Compute Capabilities", table "Technical Specifications
per Compute Capability" (and "Shared Memory" of each architecture's section):

- at most 1024 threads per block; block dimensions at most (1024, 1024, 64); grid
  dimensions at most (2^31 - 1, 65535, 65535);
- at most 48 KiB of static shared memory per block (ptxas refuses more);
- dynamic shared memory: static + dynamic at most 48 KiB unless the kernel opts in with
  the attribute ``cudaFuncAttributeMaxDynamicSharedMemorySize`` (CuPy:
  ``kernel.max_dynamic_shared_size_bytes = n``), whose value static + n may not exceed
  the architecture's opt-in maximum: 96 KiB sm_70, 64 KiB sm_75, 163 KiB sm_80 and sm_87,
  99 KiB sm_86, sm_89 and sm_120, 227 KiB sm_90 and sm_100. A launch asking for more
  dynamic shared memory than the attribute allows fails.
"""
from __future__ import annotations

import numpy as np

from hslm_ptx.emu.parse import EmulatorError

KIB = 1024
MAX_THREADS = 1024
MAX_BLOCK = (1024, 1024, 64)
MAX_GRID = (2 ** 31 - 1, 65535, 65535)
STATIC_SHARED_MAX = 48 * KIB
OPT_IN_SHARED_MAX = {"sm_70": 96 * KIB, "sm_72": 96 * KIB, "sm_75": 64 * KIB,
                     "sm_80": 163 * KIB, "sm_86": 99 * KIB, "sm_87": 163 * KIB,
                     "sm_89": 99 * KIB, "sm_90": 227 * KIB, "sm_100": 227 * KIB,
                     "sm_120": 99 * KIB}

# The instruction budget (see default_budget): trips a loop may make beyond what the
# launch's scalar parameters and its data per thread could ask for.
BUDGET_SLACK = 64


def opt_in_max(arch: str, line: int) -> int:
    if arch not in OPT_IN_SHARED_MAX:
        raise EmulatorError("launch", line, "", f"target {arch}: its shared-memory limits are "
                            f"not known here (known: {', '.join(OPT_IN_SHARED_MAX)})")
    return OPT_IN_SHARED_MAX[arch]


def check_static_shared(static: int, line: int) -> None:
    if static > STATIC_SHARED_MAX:
        raise EmulatorError("launch", line, "", f"the entry declares {static} bytes of static "
                            f".shared, over the {STATIC_SHARED_MAX} (48 KiB) ptxas allows; "
                            "declare the rest `.extern .shared` and opt in to more dynamic "
                            "shared memory (max_dynamic_shared_size_bytes)")


def check_dynamic_attribute(value, static: int, arch: str, line: int) -> int:
    """The value of ``max_dynamic_shared_size_bytes`` as the driver accepts it."""
    limit = opt_in_max(arch, line) - static
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or \
            not 0 <= value <= limit:
        raise EmulatorError("launch", line, "", f"max_dynamic_shared_size_bytes must be an "
                            f"int from 0 to {limit} on {arch} ({opt_in_max(arch, line)} bytes "
                            f"opt-in maximum less {static} static), got {value!r}")
    return int(value)


def check_dynamic_launch(shared_mem: int, allowed: int, opted_in: bool, static: int,
                         arch: str, line: int) -> None:
    if shared_mem <= allowed:
        return
    how = (f"the function allows {allowed} (its max_dynamic_shared_size_bytes)" if opted_in
           else f"without the opt-in static + dynamic may be at most {STATIC_SHARED_MAX} "
                f"(48 KiB; {static} static); set fn.max_dynamic_shared_size_bytes = "
                f"{shared_mem} (at most {opt_in_max(arch, line) - static} on {arch})")
    raise EmulatorError("launch", line, "", f"shared_mem={shared_mem} bytes of dynamic shared "
                        f"memory: {how}")


def check_geometry(grid: tuple[int, int, int], block: tuple[int, int, int], line: int) -> None:
    threads = block[0] * block[1] * block[2]
    if threads > MAX_THREADS:
        raise EmulatorError("launch", line, "", f"block {block} has {threads} threads, over "
                            f"{MAX_THREADS}")
    for what, dims, limit in (("block", block, MAX_BLOCK), ("grid", grid, MAX_GRID)):
        for axis, size, most in zip("xyz", dims, limit):
            if size > most:
                raise EmulatorError("launch", line, "", f"{what}.{axis} = {size} is over the "
                                    f"{most} CUDA allows ({what} limits {limit})")


def default_budget(instructions: int, params: list[int], buffer_bytes: list[int],
                   threads: int) -> int:
    """Lockstep steps a launch may take: every instruction of the kernel, as many times
    as the largest scalar parameter (a loop over K, N or a count; at most the bytes of
    all the buffers, since a mask or a seed is no trip count), plus the bytes of data per
    thread (a grid-stride loop), plus BUDGET_SLACK, twice over. A real kernel's loop runs
    over its tile, a small fraction of that, so a launch that reaches the budget is one
    whose loop never ends; it is stopped after that many steps instead of hanging."""
    data = sum(buffer_bytes)
    largest = min(max(params, default=0), data)
    work = largest + data // max(1, threads) + BUDGET_SLACK
    return 2 * instructions * work
