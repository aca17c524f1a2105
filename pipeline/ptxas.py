"""Assemble PTX with ptxas -v for every configured arch and judge it against the budget.

ptxas is found as $PTXAS, then the ``nvidia-cuda-nvcc-cu12`` wheel's
``nvidia/cuda_nvcc/bin/ptxas`` (located through importlib, so any venv works), then
PATH. Its ``-v`` report goes to stderr; the items on its "Used" line vary by arch
and kernel (no smem item when a kernel uses none, no cmem item on sm_90, a
"cumulative stack size" item when it spills), so each item is matched on its own
rather than by position. Missing figures are an error, never a silent zero.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

from pipeline.artifacts import UserError, rel, sha256_file
from pipeline.config import Budget
from pipeline.models import PtxasArch, PtxasReport

INSTALL_HINT = "pip install nvidia-cuda-nvcc-cu12 (or set PTXAS=/path/to/ptxas)"

ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
SPILLS = re.compile(r"^\s+(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"ptxas info\s*: Used (.*)$")
REGISTERS = re.compile(r"^(\d+) registers?$")
SMEM = re.compile(r"^(\d+) bytes smem$")
ERROR = re.compile(r"(error|fatal)\s*:")
VERSION = re.compile(r"release [\d.]+, V([\d.]+)")


class PtxasError(Exception):
    """ptxas refused the PTX, or its output could not be read; str() is one line."""


class Usage(NamedTuple):
    """What ``ptxas -v`` reports for one entry on one arch."""

    registers: int
    spill_stores: int
    spill_loads: int
    shared_bytes: int
    stack_bytes: int


def wheel_ptxas() -> Path | None:
    """The ptxas shipped in the nvidia-cuda-nvcc-cu12 wheel, if that wheel is installed."""
    try:
        spec = importlib.util.find_spec("nvidia.cuda_nvcc")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / "bin" / "ptxas"
        if candidate.is_file():
            return candidate
    return None


def find_ptxas() -> Path:
    """$PTXAS, else the wheel's ptxas, else PATH; :class:`UserError` says how to install one."""
    override = os.environ.get("PTXAS")
    if override:
        path = Path(override)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise UserError(f"PTXAS={override}: not an executable file; fix it or unset PTXAS")
        return path
    found = wheel_ptxas() or shutil.which("ptxas")
    if found is None:
        raise UserError(f"ptxas not found: {INSTALL_HINT}")
    return Path(found)


@functools.lru_cache(maxsize=None)
def ptxas_version(ptxas: Path) -> str:
    """'12.9.86' from ``ptxas --version``."""
    out = subprocess.run([str(ptxas), "--version"], capture_output=True, text=True).stdout
    match = VERSION.search(out)
    if match is None:
        raise PtxasError(f"{ptxas} --version: no 'release X, VX.Y.Z' line; is it ptxas?")
    return match.group(1)


def parse_verbose(stderr: str) -> dict[tuple[str, str], Usage]:
    """``ptxas -v`` stderr -> {(entry, arch): Usage} for every entry it compiled."""
    found: dict[tuple[str, str], Usage] = {}
    current: tuple[str, str] | None = None
    spill: tuple[int, int, int] | None = None
    for line in stderr.splitlines():
        if match := ENTRY.search(line):
            current, spill = (match.group(1), match.group(2)), None
        elif current and (match := SPILLS.match(line)):
            spill = (int(match.group(1)), int(match.group(2)), int(match.group(3)))
        elif current and (match := USED.search(line)):
            if spill is None:
                raise PtxasError(f"ptxas -v: no stack/spill line for '{current[0]}' on {current[1]}")
            items = [item.strip() for item in match.group(1).split(",")]
            regs = [int(m.group(1)) for item in items if (m := REGISTERS.match(item))]
            smem = [int(m.group(1)) for item in items if (m := SMEM.match(item))]
            if len(regs) != 1:
                raise PtxasError(f"ptxas -v: no register count in {line.strip()!r}")
            stack, stores, loads = spill
            found[current] = Usage(regs[0], stores, loads, smem[0] if smem else 0, stack)
            current = None
    return found


def first_error(stderr: str, returncode: int) -> str:
    """The first ``error :`` or ``fatal :`` line of a failed run (an unsupported .version
    is only a fatal line), else a fallback naming the exit code."""
    for line in stderr.splitlines():
        if ERROR.search(line):
            return line.strip()
    last = stderr.strip().splitlines()[-1:] or ["no output"]
    return f"ptxas exited {returncode}: {last[0].strip()}"


def run_ptxas(ptxas: Path, ptx: Path, arch: str) -> str:
    """Assemble ``ptx`` for ``arch`` (cubin thrown away); returns the -v stderr."""
    with tempfile.TemporaryDirectory(prefix="ptxas-") as tmp:
        proc = subprocess.run(
            [str(ptxas), "-v", f"-arch={arch}", "-o", str(Path(tmp) / "out.cubin"), str(ptx)],
            capture_output=True, text=True,
        )
    if proc.returncode != 0:
        raise PtxasError(f"{rel(ptx)} ({arch}): {first_error(proc.stderr, proc.returncode)}")
    return proc.stderr


def judge(arch: str, usage: Usage, limit: Budget) -> PtxasArch:
    """One arch's figures plus the problems that fail the stage (spills, over budget)."""
    problems = []
    if usage.spill_stores or usage.spill_loads:
        problems.append(f"spills {usage.spill_stores} bytes stores / {usage.spill_loads} bytes loads")
    if usage.registers > limit.max_registers:
        problems.append(f"{usage.registers} registers > budget {limit.max_registers}")
    if usage.shared_bytes > limit.max_shared_bytes:
        problems.append(f"{usage.shared_bytes} bytes shared > budget {limit.max_shared_bytes}")
    return PtxasArch(arch=arch, **usage._asdict(), problems=problems)


def assemble(kernel: str, entry: str, ptx: Path, archs: tuple[str, ...], limit: Budget,
             ptxas: Path | None = None) -> PtxasReport:
    """Run ptxas on ``ptx`` for each arch and report ``entry``'s usage against ``limit``."""
    ptxas = ptxas or find_ptxas()
    results = []
    for arch in archs:
        usage = parse_verbose(run_ptxas(ptxas, ptx, arch)).get((entry, arch))
        if usage is None:
            raise PtxasError(f"{rel(ptx)} ({arch}): ptxas -v reported no entry '{entry}'")
        results.append(judge(arch, usage, limit))
    return PtxasReport(
        kernel=kernel, ptx_sha256=sha256_file(ptx), ptxas=str(ptxas),
        ptxas_version=ptxas_version(ptxas), max_registers=limit.max_registers,
        max_shared_bytes=limit.max_shared_bytes, archs=results,
    )
