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
from pathlib import Path

from hslm_ptx.pipeline.core import proc
from hslm_ptx.pipeline.core.files import rel, scratch_folder, sha256_file
from hslm_ptx.pipeline.core.config import Budget
from hslm_ptx.pipeline.core.errors import PtxasError, UserError
from hslm_ptx.pipeline.core.models import PtxasArch, PtxasReport, PtxasUsage

INSTALL_HINT = "pip install nvidia-cuda-nvcc-cu12 (or set PTXAS=/path/to/ptxas)"

ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
SPILLS = re.compile(r"^\s+(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"ptxas info\s*: Used (.*)$")
REGISTERS = re.compile(r"^(\d+) registers?$")
SMEM = re.compile(r"^(\d+) bytes smem$")
ERROR = re.compile(r"(error|fatal)\s*:")
VERSION = re.compile(r"release [\d.]+, V([\d.]+)")
BANNER = "ptxas: NVIDIA (R) Ptx optimizing assembler"


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
    """$PTXAS, else the wheel's ptxas, else PATH, once its version banner says it is ptxas;
    :class:`UserError` says what was found and how to get a ptxas."""
    override = os.environ.get("PTXAS")
    if override:
        path = Path(override)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise UserError(f"PTXAS={override}: not an executable file; fix it or unset PTXAS")
        ptxas_version(path, f"PTXAS={override}")
        return path
    found = wheel_ptxas() or shutil.which("ptxas")
    if found is None:
        raise UserError(f"ptxas not found: {INSTALL_HINT}")
    ptxas_version(Path(found), str(found))
    return Path(found)


@functools.lru_cache(maxsize=None)
def tool_version(tool: Path, banner: str = BANNER, label: str | None = None, hint: str = INSTALL_HINT) -> str:
    """'12.9.86' from a CUDA tool's ``--version`` ('release X, VX.Y.Z', as ptxas, nvdisasm and
    cuobjdump print it); :class:`UserError` when the banner is not ``banner`` (say
    PTXAS=/bin/true, which prints nothing and exits 0)."""
    try:
        out = proc.run([str(tool), "--version"]).stdout
    except OSError as exc:
        raise UserError(f"{label or tool}: cannot run it ({exc.strerror}); {hint}") from None
    match = VERSION.search(out)
    if banner not in out or match is None:
        name = banner.split(":")[0]
        raise UserError(f"{label or tool}: '--version' printed no '{banner}' banner: it is not {name}; {hint}")
    return match.group(1)


def ptxas_version(ptxas: Path, label: str | None = None) -> str:
    """ptxas's version; refuses a program that is not ptxas."""
    return tool_version(ptxas, BANNER, label)


def parse_verbose(stderr: str) -> dict[tuple[str, str], PtxasUsage]:
    """``ptxas -v`` stderr -> {(entry, arch): PtxasUsage} for every entry it compiled."""
    found: dict[tuple[str, str], PtxasUsage] = {}
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
            found[current] = PtxasUsage(registers=regs[0], spill_stores=stores, spill_loads=loads,
                                        shared_bytes=smem[0] if smem else 0, stack_bytes=stack)
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
    """Assemble ``ptx`` for ``arch`` (the cubin goes to a scratch folder that is removed
    however the run ends); returns the -v stderr."""
    with scratch_folder("ptxas") as tmp:
        done = proc.run([str(ptxas), "-v", f"-arch={arch}", "-o", str(Path(tmp) / "out.cubin"), str(ptx)])
    if done.returncode != 0:
        raise PtxasError(f"{rel(ptx)} ({arch}): {first_error(done.stderr, done.returncode)}")
    return done.stderr


def judge(arch: str, usage: PtxasUsage, limit: Budget) -> PtxasArch:
    """One arch's figures plus the problems that fail the stage (spills, over budget)."""
    problems = []
    if usage.spill_stores or usage.spill_loads:
        problems.append(f"spills {usage.spill_stores} bytes stores / {usage.spill_loads} bytes loads")
    if usage.registers > limit.max_registers:
        problems.append(f"{usage.registers} registers > budget {limit.max_registers}")
    if usage.shared_bytes > limit.max_shared_bytes:
        problems.append(f"{usage.shared_bytes} bytes shared > budget {limit.max_shared_bytes}")
    return PtxasArch(arch=arch, **usage.model_dump(), problems=problems)


def assemble_arch(ptxas: Path, entry: str, ptx: Path, arch: str, limit: Budget) -> PtxasArch:
    """ptxas on ``ptx`` for one arch, ``entry``'s figures judged against ``limit``;
    :class:`PtxasError` with the tool's first error line when it refuses."""
    usage = parse_verbose(run_ptxas(ptxas, ptx, arch)).get((entry, arch))
    if usage is None:
        raise PtxasError(f"{rel(ptx)} ({arch}): ptxas -v reported no entry '{entry}'")
    return judge(arch, usage, limit)


def assemble(kernel: str, entry: str, ptx: Path, archs: tuple[str, ...], limit: Budget,
             ptxas: Path | None = None) -> PtxasReport:
    """Run ptxas on ``ptx`` for each arch and report ``entry``'s usage against ``limit``.
    An arch ptxas refuses is evidence too: its first error line goes in ``errors``."""
    ptxas = ptxas or find_ptxas()
    results, errors = [], {}
    for arch in archs:
        try:
            results.append(assemble_arch(ptxas, entry, ptx, arch, limit))
        except PtxasError as exc:
            errors[arch] = str(exc)
    return PtxasReport(
        kernel=kernel, ptx_sha256=sha256_file(ptx), ptxas=str(ptxas),
        ptxas_version=ptxas_version(ptxas), max_registers=limit.max_registers,
        max_shared_bytes=limit.max_shared_bytes, archs=results, errors=errors,
    )
