"""The build half of the doit graph: emit -> ptxas -> verify, one subtask per kernel (x shape).

dodo.py imports DOIT_CONFIG and the task_* creators from here. Names on the command
line: ``emit``, ``ptxas``, ``verify`` (each a group: ``emit:<kernel>``,
``ptxas:<kernel>``, ``verify:<kernel>/<set>/<shape>``, and ``ptxas:summary`` /
``verify:summary``, which print one table from the result JSONs once their cells ran).

Up-to-date rules, so only stale work re-runs:
- file_dep are compared by sha256 (pipeline.checker.ContentChecker): a comment-only
  kernel edit re-runs emit; the PTX bytes are the same, so ptxas and verify do not.
- every task's targets are re-hashed against the hashes saved when it last succeeded
  (pipeline.checker.targets_intact): a damaged or hand-edited artifact or report
  re-runs the stage that owns it.
- ``config_changed`` carries the parameters (archs, budget, ptxas, dims, backend, seed,
  the hash of the reference and input generator, and of the emulator when it is the
  backend: pipeline.verify.check_hash / backend_hash).
- the summaries depend on the reports' content: a no-op run prints no table (and runs
  nothing); the table appears whenever a report changed.

User mistakes (bad shapes.yaml, unknown set or backend) stop task creation with one
line on stderr and exit status 2; a stage failure (ptxas missing, spills, mismatches)
fails its task with one line. Neither prints a traceback.
"""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable, Iterator, NoReturn, Sequence

from doit import get_var
from doit.exceptions import TaskFailed
from doit.tools import config_changed

from kernels.registry import KERNELS
from pipeline import config
from pipeline.artifacts import ArtifactError, UserError, read_model, rel, write_model
from pipeline.verify import resolve_backend
from pipeline.checker import ContentChecker, targets_intact
from pipeline.emit import emit, source_files
from pipeline.models import PtxasReport, Shape, VerifyReport
from pipeline.ptxas import PtxasError, assemble, find_ptxas, ptxas_version
from pipeline.shapes import parse_set_names, select_sets
from pipeline.verify import backend_hash, check_hash, seed, verdict, verify_cell

DOIT_CONFIG = {
    "default_tasks": ["verify"],
    "check_file_uptodate": ContentChecker,
    "dep_file": ".doit.db",
    "backend": "sqlite3",
    "verbosity": 2,
}


def _var(name: str, default: str) -> str:
    """doit command-line variable (``name=value``); doit's get_var gives None outside a run."""
    return get_var(name, default) or default


def _exit(exc: UserError) -> NoReturn:
    """A user mistake found while creating tasks: one line, exit 2, no traceback."""
    print(f"error: {exc}", file=sys.stderr)
    raise SystemExit(2)


def exits_on_user_error(creator: Callable[[], Iterator[dict]]) -> Callable[[], Iterator[dict]]:
    """For task creators (generators) that read user input (shapes.yaml, shape=, backend=):
    a :class:`UserError` while creating tasks is :func:`_exit`. doit creates every task for
    every command, so one bad input must not turn into a traceback anywhere."""

    @functools.wraps(creator)
    def create() -> Iterator[dict]:
        try:
            yield from creator()
        except UserError as exc:
            _exit(exc)

    return create


def one_line_failure(action: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the errors a user can act on into a TaskFailed of one line (doit prints no traceback)."""

    @functools.wraps(action)
    def run(*args: Any) -> Any:
        try:
            return action(*args)
        except (UserError, ArtifactError, PtxasError) as exc:
            return TaskFailed(str(exc))

    return run


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table; number columns right-aligned (floats to 2 places), text left."""
    def text(value: Any) -> str:
        return f"{value:.2f}" if isinstance(value, float) else str(value)

    cells = [list(headers)] + [[text(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [all(isinstance(row[i], (int, float)) for row in rows) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric)).rstrip()
        for row in cells
    )


# ---- emit ----------------------------------------------------------------------------

@one_line_failure
def _emit(kernel: str) -> None:
    result = emit(KERNELS[kernel])
    print(f"{kernel}: {result.ptx_path} {result.ptx_bytes} bytes sha256 {result.ptx_sha256[:12]}")


def task_emit() -> Iterator[dict]:
    """Emit each kernel's PTX (artifacts/ptx/<kernel>.ptx and .emit.json)."""
    for spec in KERNELS.values():
        ptx, result = config.ptx_path(spec.name), config.emit_json(spec.name)
        yield {
            "name": spec.name,
            "actions": [(_emit, [spec.name])],
            "file_dep": [str(p) for p in source_files(spec)],
            "targets": [str(ptx), str(result)],
            "uptodate": [targets_intact()],
            "clean": True,
        }


# ---- ptxas ---------------------------------------------------------------------------

def _ptxas_config(kernel: str) -> dict[str, Any]:
    """What a ptxas report depends on besides the PTX: archs, budget, which ptxas.
    A missing ptxas is not an error here (``doit emit`` must work without one)."""
    try:
        ptxas = find_ptxas()
        found = {"ptxas": str(ptxas), "version": ptxas_version(ptxas)}
    except (UserError, PtxasError):
        found = {"ptxas": None}
    return {"archs": list(config.ARCHS), "budget": config.budget(kernel)._asdict(), **found}


PTXAS_COLUMNS = ("kernel", "arch", "regs", "spill st", "spill ld", "smem B", "stack B", "verdict")


def _ptxas_rows(report: PtxasReport) -> list[list[Any]]:
    return [[report.kernel, a.arch, a.registers, a.spill_stores, a.spill_loads, a.shared_bytes,
             a.stack_bytes, "; ".join(a.problems) or "ok"] for a in report.archs]


@one_line_failure
def _ptxas(kernel: str) -> TaskFailed | None:
    report = assemble(kernel, kernel, config.ptx_path(kernel), config.ARCHS, config.budget(kernel))
    write_model(config.ptxas_json(kernel), report)
    problems = [f"{kernel} {a.arch}: {p}" for a in report.archs for p in a.problems]
    if problems:  # the summary will not run: show this kernel's rows now
        print(table(PTXAS_COLUMNS, _ptxas_rows(report)))
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return TaskFailed(f"{problems[0]}{more}; see {rel(config.ptxas_json(kernel))}")
    print(f"{kernel}: within budget on {', '.join(config.ARCHS)} (ptxas {report.ptxas_version})")
    return None


@one_line_failure
def _ptxas_summary(kernels: Sequence[str]) -> None:
    rows = [row for k in kernels for row in _ptxas_rows(read_model(config.ptxas_json(k), PtxasReport))]
    print(table(PTXAS_COLUMNS, rows))


def task_ptxas() -> Iterator[dict]:
    """Assemble every kernel with ptxas -v per arch, print the table; fail on spills or over budget."""
    for spec in KERNELS.values():
        ptx, report = config.ptx_path(spec.name), config.ptxas_json(spec.name)
        yield {
            "name": spec.name,
            "actions": [(_ptxas, [spec.name])],
            "file_dep": [str(ptx)],
            "targets": [str(report)],
            "uptodate": [config_changed(_ptxas_config(spec.name)), targets_intact()],
            "clean": True,
        }
    yield {
        "name": "summary",
        "doc": "print the ptxas table (kernel x arch) from artifacts/ptxas/*.json",
        "actions": [(_ptxas_summary, [list(KERNELS)])],
        "file_dep": [str(config.ptxas_json(k)) for k in KERNELS],
    }


# ---- verify --------------------------------------------------------------------------

@one_line_failure
def _verify(kernel: str, shape_set: str, shape: Shape, backend: str) -> TaskFailed | None:
    report = verify_cell(KERNELS[kernel], shape_set, shape, backend)
    line = verdict(report)
    print(line)
    return None if report.passed else TaskFailed(line)


@one_line_failure
def _verify_summary(cells: Sequence[tuple[str, str, str]]) -> None:
    reports = [read_model(config.verify_json(*cell), VerifyReport) for cell in cells]
    rows = [[r.kernel, r.shape_set, r.shape, r.R, r.K, r.N, r.backend, r.mismatches,
             r.rows_checked, r.max_abs_diff, r.seconds, "ok" if r.passed else (r.error or "MISMATCH")]
            for r in reports]
    print(table(["kernel", "set", "shape", "R", "K", "N", "backend", "mismatches", "rows",
                 "max|diff|", "seconds", "verdict"], rows))
    failed = sum(not r.passed for r in reports)
    backends = ", ".join(sorted({r.backend for r in reports})) or "-"
    print(f"{len(reports)} cells on {backends}: {f'{failed} FAILED' if failed else 'all exact'}")


@exits_on_user_error
def task_verify() -> Iterator[dict]:
    """Run every kernel on shape=<sets> (default smoke,tails,hslm) via backend=auto|gpu|emulator and compare exactly."""
    sets = select_sets(parse_set_names(_var("shape", ",".join(config.VERIFY_SETS))))
    backend = resolve_backend(_var("backend", config.DEFAULT_BACKEND))
    cells, emulator = [], backend_hash(backend)
    for spec in KERNELS.values():
        ptx, checked_by = config.ptx_path(spec.name), check_hash(spec)
        for shape_set, shapes in sets.items():
            for shape in shapes:
                report = config.verify_json(spec.name, shape_set, shape.name)
                params = {"R": shape.R, "K": shape.K, "N": shape.N, "backend": backend,
                          "seed": seed(spec.name, shape), "reference": checked_by, "emulator": emulator}
                cells.append((spec.name, shape_set, shape.name))
                yield {
                    "name": f"{spec.name}/{shape_set}/{shape.name}",
                    "actions": [(_verify, [spec.name, shape_set, shape, backend])],
                    "file_dep": [str(ptx)],
                    "task_dep": [f"ptxas:{spec.name}"],
                    "targets": [str(report)],
                    "uptodate": [config_changed(params), targets_intact()],
                    "clean": True,
                }
    yield {
        "name": "summary",
        "doc": "print the verify table from artifacts/verify/**.json",
        "actions": [(_verify_summary, [cells])],
        "file_dep": [str(config.verify_json(*cell)) for cell in cells],
    }
