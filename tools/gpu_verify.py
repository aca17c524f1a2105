"""Verify every kernel on the GPU from its emitted PTX: no ptxas, no doit.

    python3 tools/gpu_verify.py [SET ...] [--kernels K1,K2] [--jobs N] [--budget-s S] [--summary PATH]
    python3 tools/gpu_verify.py [SET ...] --plan   (the cells and their estimated time; no GPU needed)
    python3 tools/gpu_verify.py --emit-only        (the PTX the bench and one_launch.py load)

Emits each kernel's PTX, then runs every verify cell (hslm_ptx.pipeline.stages.verify.verify_cell,
backend gpu: the same inputs, reference and report files as `doit verify
backend=gpu`) and prints one line per cell. Cells run set by set in the order given
(default smoke, tails, hslm), every kernel within a set, so a run the budget cuts short
has still covered every kernel on the first set. ``--jobs N`` splits the kernels over N
shards (kernel i to shard i % N), each one job of the local executor that `doit verify`
uses (hslm_ptx.pipeline.stages.executor: a worker process each, with its own CUDA context): the
integer CPU reference, not the GPU, is most of a cell's time. ``--budget-s``: no cell starts after
that many seconds; the cells left are recorded as not run.

A failing cell never stops the others: whatever it raises is that cell's error. After a
sticky CUDA error (a kernel fault: the process's CUDA context is lost and every later
call would fail with it) the cells left run in a fresh process, which carries the count
on. Every cell's verdict is appended to a JSON-lines file as it ends (partial evidence
when the run is killed); ``--summary`` gets :class:`VerifySummary`. Exit 0 when every cell
ran and is exact, 1 when any is not exact or was not run, 2 when it cannot start (no GPU,
an unknown set or kernel).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from hslm_ptx.catalog.registry import KERNELS  # noqa: E402
from hslm_ptx.kernel.spec import KernelSpec  # noqa: E402
from hslm_ptx.pipeline.core.artifacts import write_model  # noqa: E402
from hslm_ptx.pipeline.core.cli import OneLineParser, run_cli  # noqa: E402
from hslm_ptx.pipeline.bench.device import is_sticky  # noqa: E402
from hslm_ptx.pipeline.core.config import VERIFY_SETS  # noqa: E402
from hslm_ptx.pipeline.stages.emit import emit  # noqa: E402
from hslm_ptx.pipeline.stages.executor import Job, LocalExecutor  # noqa: E402
from hslm_ptx.pipeline.core.errors import UserError  # noqa: E402
from hslm_ptx.pipeline.core.models import Record, Shape  # noqa: E402
from hslm_ptx.pipeline.core.shapes import select_sets  # noqa: E402
from hslm_ptx.pipeline.stages.verify import one_line, resolve_backend, verdict, verify_cell, work  # noqa: E402

MAX_FRESH_PROCESSES = 8  # sticky errors after which the cells left are reported, not run
# The time model of one cell on the GPU machine, measured on the CPU machine (the
# reference and inputs are numpy there as here): the 54 kernels of the time x the hslm set (40 G
# multiply-adds) took 18.5 CPU s, and the 810 smoke and tails cells 4.4 CPU s besides
# start-up; a PTX module's first JIT by the driver is taken as 0.3 s (later loads hit the
# driver's compute cache), a process's start (imports, CUDA context) as 3 s.
REFERENCE_MACS_PER_S = 2.2e9
CELL_OVERHEAD_S = 0.015  # inputs, copies, launch, compare, report file
FIRST_JIT_S = 0.3
PROCESS_START_S = 3.0

Cell = tuple[KernelSpec, str, Shape]


class CellVerdict(Record):
    """One cell's outcome, one JSON line each, appended as the cell ends."""

    kernel: str
    shape_set: str
    shape: str
    status: Literal["exact", "failed", "not_run"]
    line: str


class VerifySummary(Record):
    """What the verify step found: the cells, by outcome, and which kernels no exact cell covers."""

    backend: str
    sets: list[str]
    kernels: int
    cells: int
    exact: int
    failed: list[str]  # the FAILED lines
    not_run: int
    not_run_by_set: dict[str, int]
    kernels_not_covered: list[str]  # kernels with no exact cell on any set
    estimate_s: float
    seconds: float


def parser() -> OneLineParser:
    p = OneLineParser(prog="python3 tools/gpu_verify.py",
                      description="Verify every kernel on the GPU from its emitted PTX (no ptxas, no doit).")
    p.add_argument("sets", nargs="*", metavar="SET", help=f"shape sets (default: {' '.join(VERIFY_SETS)})")
    p.add_argument("--emit-only", action="store_true", help="emit every kernel's PTX and stop")
    p.add_argument("--plan", action="store_true", help="print the cells per set and the time estimate, run nothing")
    p.add_argument("--kernels", default="all", help="comma-separated kernel names (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="processes the kernels are split over (default 1)")
    p.add_argument("--budget-s", type=float, help="start no cell after this many seconds; the rest are not run")
    p.add_argument("--summary", type=Path, help="write the VerifySummary JSON here (atomically)")
    # what a worker, or a fresh process after a sticky error, is given
    p.add_argument("--results", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--from-cell", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--failed-before", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--fresh", type=int, default=0, help=argparse.SUPPRESS)
    return p


def pick_kernels(text: str) -> list[KernelSpec]:
    names = list(KERNELS) if text == "all" else [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in KERNELS]
    if unknown or not names:
        raise UserError(f"--kernels '{text}': unknown kernel '{unknown[0] if unknown else ''}'; "
                        f"known: {', '.join(KERNELS)}, or all")
    return [KERNELS[n] for n in names]


def cells_of(sets: dict[str, tuple[Shape, ...]], kernels: list[KernelSpec]) -> list[Cell]:
    """Set by set in the order given, every kernel within a set."""
    return [(spec, shape_set, shape) for shape_set, shapes in sets.items() for shape in shapes for spec in kernels]


def estimate_s(cells: list[Cell], jobs: int) -> float:
    """Seconds the cells should take on ``jobs`` processes (the time model above)."""
    kernels = {spec.name for spec, _, _ in cells}
    cpu = sum(CELL_OVERHEAD_S + work(shape) / REFERENCE_MACS_PER_S for _, _, shape in cells)
    return PROCESS_START_S + (cpu + FIRST_JIT_S * len(kernels)) / max(1, min(jobs, len(kernels) or 1))


def record(results: Path | None, spec: KernelSpec, shape_set: str, shape: Shape, status: str, line: str) -> None:
    if results is not None:
        with open(results, "a") as f:  # one short line per write: appends from one process stay whole
            f.write(CellVerdict(kernel=spec.name, shape_set=shape_set, shape=shape.name, status=status,
                                line=line).model_dump_json() + "\n")


def fresh_process(opts: argparse.Namespace, next_cell: int, failed: int) -> int:
    """Run this script for the cells from ``next_cell`` on in a new process (a new CUDA
    context) and return its exit status: this process's context is lost."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *opts.sets, "--kernels", opts.kernels, "--worker",
           "--from-cell", str(next_cell), "--failed-before", str(failed), "--fresh", str(opts.fresh + 1)]
    if opts.results is not None:
        cmd += ["--results", str(opts.results)]
    if opts.deadline is not None:
        cmd += ["--deadline", repr(opts.deadline)]
    sys.stdout.flush()
    return subprocess.run(cmd).returncode


def run_cells(opts: argparse.Namespace, cells: list[Cell], backend: str) -> int:
    """The cells from ``--from-cell`` on, in this process (and fresh ones after a sticky error)."""
    failed = opts.failed_before
    for index in range(opts.from_cell, len(cells)):
        spec, shape_set, shape = cells[index]
        if opts.deadline is not None and time.time() > opts.deadline:
            left = cells[index:]
            for s, cell_set, cell_shape in left:
                record(opts.results, s, cell_set, cell_shape, "not_run", "not run: the time budget ran out")
            print(f"not run: the time budget ran out before {len(left)} cells "
                  f"(from {spec.name} {shape_set}/{shape.name})", flush=True)
            return 1
        sticky = False
        if opts.fresh >= MAX_FRESH_PROCESSES:
            ok, line = False, (f"{spec.name} {shape_set}/{shape.name}: not run: the CUDA context was "
                               f"lost {opts.fresh} times, no more fresh processes")
        else:
            try:
                report = verify_cell(spec, shape_set, shape, backend)
                ok, line, sticky = report.passed, verdict(report), is_sticky(report.error)
            except Exception as exc:  # whatever a cell raises is that cell's error
                ok, line, sticky = False, f"{spec.name} {shape_set}/{shape.name}: {one_line(exc)}", is_sticky(exc)
        failed += not ok
        record(opts.results, spec, shape_set, shape, "exact" if ok else "failed", line if ok else f"FAILED {line}")
        print(line if ok else f"FAILED {line}", flush=True)
        if sticky and index + 1 < len(cells):
            print(f"sticky CUDA error: this process's CUDA context is lost; the {len(cells) - index - 1} "
                  "cells left run in a fresh process", flush=True)
            return fresh_process(opts, index + 1, failed)
    return 1 if failed else 0


def run_shard(sets: list[str], names: str, results: str, deadline: float | None) -> int:
    """One shard of the kernels, as a job of the local executor: its cells in that worker
    process (and fresh ones after a sticky error), each verdict appended to ``results``."""
    args = [*sets, "--kernels", names, "--worker", "--results", results]
    opts = parser().parse_args(args + (["--deadline", repr(deadline)] if deadline is not None else []))
    cells = cells_of(select_sets(tuple(sets) or VERIFY_SETS), pick_kernels(names))
    return run_cells(opts, cells, resolve_backend("gpu"))


def run_jobs(opts: argparse.Namespace, kernels: list[KernelSpec], results: Path) -> None:
    """The kernels split over ``--jobs`` shards (kernel i to shard i % N), each one job of the
    local executor (hslm_ptx.pipeline.stages.executor: one process each, its own CUDA context);
    their lines go straight to stdout."""
    jobs = max(1, min(opts.jobs, len(kernels)))
    sys.stdout.flush()
    shards = [Job(run_shard, (opts.sets, ",".join(spec.name for spec in kernels[shard::jobs]), f"{results}.{shard}",
                              opts.deadline), gpu=True) for shard in range(jobs)]
    for shard, outcome in LocalExecutor(jobs).run(shards):  # a shard's cells with no verdict count as not run
        if isinstance(outcome, BaseException):
            print(f"shard {shard} stopped: {one_line(outcome)}", flush=True)


def read_verdicts(paths: list[Path]) -> list[CellVerdict]:
    out = []
    for path in paths:
        if path.is_file():
            out += [CellVerdict(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    return out


def summarize(verdicts: list[CellVerdict], cells: list[Cell], sets: list[str], backend: str,
              estimate: float, seconds: float) -> VerifySummary:
    """The verdicts of ``cells``; a cell with no verdict (its process was killed) counts as not run."""
    by_cell = {(v.kernel, v.shape_set, v.shape): v for v in verdicts}
    statuses = [(spec.name, shape_set, by_cell.get((spec.name, shape_set, shape.name))) for spec, shape_set, shape in cells]
    not_run_by_set: dict[str, int] = {}
    for _, shape_set, v in statuses:
        if v is None or v.status == "not_run":
            not_run_by_set[shape_set] = not_run_by_set.get(shape_set, 0) + 1
    covered = {name for name, _, v in statuses if v is not None and v.status == "exact"}
    kernels = list(dict.fromkeys(spec.name for spec, _, _ in cells))
    return VerifySummary(
        backend=backend, sets=sets, kernels=len(kernels), cells=len(cells),
        exact=sum(v is not None and v.status == "exact" for _, _, v in statuses),
        failed=[v.line for _, _, v in statuses if v is not None and v.status == "failed"],
        not_run=sum(not_run_by_set.values()), not_run_by_set=not_run_by_set,
        kernels_not_covered=[k for k in kernels if k not in covered],
        estimate_s=round(estimate, 1), seconds=round(seconds, 1))


def conclusion(summary: VerifySummary) -> str:
    """The last line: every cell exact, or what was not."""
    parts = [f"{len(summary.failed)} FAILED"] if summary.failed else []
    if summary.not_run:
        parts.append(f"{summary.not_run} not run (the time budget ran out)")
    return f"{summary.cells} cells on {summary.backend}: {', '.join(parts) if parts else 'all exact'}"


def main(argv: list[str]) -> int:
    opts = parser().parse_args(argv)
    if opts.emit_only:
        for spec in KERNELS.values():
            print(f"emitted {emit(spec).ptx_path}", flush=True)
        return 0
    if opts.jobs < 1:
        raise UserError(f"--jobs {opts.jobs}: expected a number of processes >= 1")
    if opts.budget_s is not None and opts.budget_s <= 0:
        raise UserError(f"--budget-s {opts.budget_s:g}: expected a number of seconds > 0")
    kernels = pick_kernels(opts.kernels)
    sets = select_sets(tuple(opts.sets) or VERIFY_SETS)
    cells = cells_of(sets, kernels)
    estimate = estimate_s(cells, opts.jobs)
    if opts.plan:
        for shape_set, shapes in sets.items():
            print(f"{shape_set}: {len(shapes)} shapes x {len(kernels)} kernels = {len(shapes) * len(kernels)} cells")
        print(f"{len(cells)} cells of {len(kernels)} kernels; estimate {estimate:.0f} s on {opts.jobs} processes")
        return 0
    backend = resolve_backend("gpu")
    if opts.worker:
        return run_cells(opts, cells, backend)
    start = time.time()
    if opts.budget_s is not None:
        opts.deadline = start + opts.budget_s
    for spec in kernels:
        result = emit(spec)
        print(f"emitted {result.ptx_path} sha256 {result.ptx_sha256[:12]}", flush=True)
    print(f"{len(cells)} cells of {len(kernels)} kernels on {opts.jobs} process(es): estimate {estimate:.0f} s"
          + (f", budget {opts.budget_s:g} s" if opts.budget_s is not None else ""), flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu-verify-") as scratch:
        # beside the summary the verdicts outlive a killed run (its partial evidence)
        folder = opts.summary.parent if opts.summary is not None else Path(scratch)
        results = folder / f"{opts.summary.stem if opts.summary is not None else 'verify'}.cells.jsonl"
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob(f"{results.name}*"):
            stale.unlink()
        if opts.jobs > 1:
            run_jobs(opts, kernels, results)
            paths = [Path(f"{results}.{shard}") for shard in range(opts.jobs)]
        else:
            opts.results = results
            run_cells(opts, cells, backend)
            paths = [results]
        summary = summarize(read_verdicts(paths), cells, list(sets), backend, estimate, time.time() - start)
    if opts.summary is not None:
        write_model(opts.summary, summary)
    print(conclusion(summary), flush=True)
    return 1 if summary.failed or summary.not_run else 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
