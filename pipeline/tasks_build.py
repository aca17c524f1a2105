"""The build half of the doit graph: emit -> ptxas -> verify, one subtask per kernel (x shape).

Names on the command line: ``emit``, ``ptxas``, ``verify`` (each a group: ``emit:<kernel>``,
``ptxas:<kernel>``, ``verify:<kernel>/<set>/<shape>``, and ``ptxas:check`` /
``verify:check``, the judges).

A cell records its evidence and succeeds, whatever the evidence says: a ptxas report
with spills, a verify report with mismatches or a launch error. It fails only when it
could produce no evidence (no ptxas, an unreadable artifact, a cell refused as too
big). The judges (``ptxas:check``, ``verify:check``) fail when a cell's evidence does
not pass, and are up to date exactly when all of it passes (an ``uptodate`` that reads
the reports, no saved state). So ``doit gate`` can depend on the cells and judge a
failing one against the ledger, and whatever it ran is up to date for ``doit verify``.

Up-to-date rules, so only stale work re-runs:
- file_dep are compared by sha256 (pipeline.checker.ContentChecker): a comment-only
  kernel edit re-runs emit; the PTX bytes are the same, so ptxas and verify do not.
- every task's targets are re-hashed against the hashes saved when it last succeeded
  (pipeline.checker.targets_intact): a damaged or hand-edited artifact or report
  re-runs the stage that owns it.
- ``config_changed`` carries the parameters (archs, budget, ptxas, dims, backend, seed,
  the hash of the reference and input generator, and of the emulator when it is the
  backend: pipeline.sources.check_hash, pipeline.verify.backend_hash).

Command-line variables (pipeline.cmdline) are checked when doit starts. A bad input a
creator reads (shapes.yaml, shape=, backend=) makes only that creator's tasks fail,
with one line; ``doit list`` and ``doit emit`` still work.
"""
from __future__ import annotations

import atexit
import functools
import os
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Sequence

from doit.exceptions import TaskFailed
from doit.task import clean_targets
from doit.tools import config_changed

from kernels.registry import KERNELS
from kernels.spec import Dims, KernelSpec
from pipeline import config, report
from pipeline.artifacts import read_present, rel, write_model
from pipeline.checker import targets_intact
from pipeline.cmdline import describe, var
from pipeline.emit import emit
from pipeline.errors import ArtifactError, PtxasError, UserError
from pipeline.models import EmitResult, PtxasReport, Shape, VerifyReport
from pipeline.ptxas import assemble, find_ptxas, ptxas_version
from pipeline.shapes import parse_set_names, select_sets
from pipeline.sources import check_hash, source_files
from pipeline.verify import backend_hash, resolve_backend, seed, verdict, verify_cell


def one_line_failure(action: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the errors a user can act on into a TaskFailed of one line (doit prints no traceback)."""

    @functools.wraps(action)
    def run(*args: Any) -> Any:
        try:
            return action(*args)
        except (UserError, ArtifactError, PtxasError) as exc:
            return TaskFailed(str(exc))

    return run


def _fail(message: str) -> TaskFailed:
    return TaskFailed(message)  # doit takes a class as an action for a command, so wrap it


def failing_task(message: str, **extra: Any) -> dict:
    """A task that fails with ``message``: what a creator yields when its input is bad."""
    return {"actions": [(_fail, [message])], "uptodate": [False], "verbosity": 2, **extra}


def fails_on_user_error(creator: Callable[[], Iterator[dict]]) -> Callable[[], Iterator[dict]]:
    """For task creators (generators) that read user input (shapes.yaml, shape=, backend=):
    a :class:`UserError` while creating becomes one failing subtask ``<name>:error``, so
    only the tasks that read the bad input fail, with its one line."""

    @functools.wraps(creator)
    def create() -> Iterator[dict]:
        try:
            yield from creator()
        except UserError as exc:
            yield failing_task(str(exc), name="error")

    return create


def chosen_sets() -> dict[str, tuple[Shape, ...]]:
    """The shape sets of ``shape=`` (default config.VERIFY_SETS), from shapes.yaml."""
    return select_sets(parse_set_names(var("shape")))


# ---- clean ---------------------------------------------------------------------------

DATABASE = ".doit.db"  # dodo.py's dep_file: sqlite3 writes this file, the dbm backends a few beside it
_after_clean: set[bool] = set()


def prune_empty_folders(top: Path) -> None:
    """Remove every empty folder under ``top``, deepest first, and ``top`` when it ends empty."""
    if not top.is_dir():
        return
    for folder, _, _ in os.walk(top, topdown=False):
        try:
            os.rmdir(folder)
        except OSError:  # not empty: something not the graph's is there, or a file left
            pass


def _leave_nothing(database: bool) -> None:
    prune_empty_folders(config.ARTIFACTS)
    if database:
        for path in config.ROOT.glob(f"{DATABASE}*"):
            path.unlink(missing_ok=True)


def clean_leftovers(database: bool = False) -> None:
    """A `doit clean` action: when the command ends (after every task's clean, and after doit
    closed its database), the folders the cleaning emptied go, and with ``database`` the
    graph's database too. Emit's clean asks for that: without the PTX every stage re-runs,
    so the recorded state says nothing any more."""
    if database not in _after_clean:
        _after_clean.add(database)
        atexit.register(_leave_nothing, database)


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
            "clean": [clean_targets, (clean_leftovers, [True])],
        }


# ---- ptxas ---------------------------------------------------------------------------

def _ptxas_config(kernel: str) -> dict[str, Any]:
    """What a ptxas report depends on besides the PTX: archs, budget, which ptxas.
    A missing ptxas is not an error here (``doit emit`` must work without one)."""
    try:
        ptxas = find_ptxas()
        found = {"ptxas": str(ptxas), "version": ptxas_version(ptxas)}
    except UserError:
        found = {"ptxas": None}
    return {"archs": list(config.ARCHS), "budget": config.budget(kernel)._asdict(), **found}


@one_line_failure
def _ptxas(kernel: str) -> None:
    result = assemble(kernel, kernel, config.ptx_path(kernel), config.ARCHS, config.budget(kernel))
    write_model(config.ptxas_json(kernel), result)
    problems = report.ptxas_problems(result)
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        print(f"{problems[0]}{more}; see {rel(config.ptxas_json(kernel))}")
    else:
        print(f"{kernel}: within budget on {', '.join(config.ARCHS)} (ptxas {result.ptxas_version})")


def _current_ptxas(kernel: str) -> PtxasReport | None:
    """The kernel's ptxas report when it is of the current PTX, else None."""
    emitted = read_present(config.emit_json(kernel), EmitResult)
    found = read_present(config.ptxas_json(kernel), PtxasReport)
    return found if emitted and found and found.ptx_sha256 == emitted.ptx_sha256 else None


def ptxas_all_pass(kernels: Sequence[str]) -> bool:
    """The ptxas judge's uptodate: every kernel's current report is within budget."""
    try:
        return all((r := _current_ptxas(k)) is not None and r.ok for k in kernels)
    except ArtifactError:
        return False


@one_line_failure
def _ptxas_check(kernels: Sequence[str]) -> TaskFailed | None:
    problems = []
    for kernel in kernels:
        found = _current_ptxas(kernel)
        problems += report.ptxas_problems(found) if found else [f"{kernel}: no ptxas report of the current PTX"]
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return TaskFailed(f"{problems[0]}{more}")
    return None


def task_ptxas() -> Iterator[dict]:
    """Assemble every kernel with ptxas -v per arch; fail on spills, over budget or a refusal."""
    for spec in KERNELS.values():
        ptx, result = config.ptx_path(spec.name), config.ptxas_json(spec.name)
        yield {
            "name": spec.name,
            "actions": [(_ptxas, [spec.name])],
            "file_dep": [str(ptx)],
            "targets": [str(result)],
            "uptodate": [config_changed(_ptxas_config(spec.name)), targets_intact()],
            "meta": {"stage": "ptxas"},
            "clean": [clean_targets, clean_leftovers],
        }
    kernels = list(KERNELS)
    yield {
        "name": "check",
        "doc": "fail unless every kernel is within budget and spill-free on every arch",
        "actions": [(_ptxas_check, [kernels])],
        "task_dep": [f"ptxas:{k}" for k in kernels],
        "uptodate": [functools.partial(ptxas_all_pass, kernels)],
    }


# ---- verify --------------------------------------------------------------------------

@one_line_failure
def _verify(kernel: str, shape_set: str, shape: Shape, backend: str, force: bool) -> None:
    print(verdict(verify_cell(KERNELS[kernel], shape_set, shape, backend, force)))


def _failing_reports(cells: Sequence[tuple[str, str, str]]) -> list[str]:
    """The verdict line of each cell whose report is missing, stale or not passing."""
    lines = []
    emits = {k: read_present(config.emit_json(k), EmitResult) for k in dict.fromkeys(k for k, _, _ in cells)}
    for kernel, shape_set, shape in cells:
        emitted = emits[kernel]
        found = read_present(config.verify_json(kernel, shape_set, shape), VerifyReport)
        if emitted is None or found is None or found.ptx_sha256 != emitted.ptx_sha256:
            lines.append(f"{kernel} {shape_set}/{shape}: no verify report of the current PTX")
        elif not found.passed:
            lines.append(verdict(found))
    return lines


def verify_all_pass(cells: Sequence[tuple[str, str, str]]) -> bool:
    """The verify judge's uptodate: every cell's report is of the current PTX and exact."""
    try:
        return not _failing_reports(cells)
    except ArtifactError:
        return False


@one_line_failure
def _verify_check(cells: Sequence[tuple[str, str, str]]) -> TaskFailed | None:
    failing = _failing_reports(cells)
    for line in failing[1:]:
        print(line)
    if failing:
        return TaskFailed(f"{failing[0]}" + (f" (+{len(failing) - 1} more above)" if len(failing) > 1 else ""))
    return None


class VerifyPlan(NamedTuple):
    """The verify cells this command line asks for, and how to run them."""

    cells: list[tuple[str, str, Shape]]  # (kernel, set, shape), registry then file order
    backend: str
    force: bool


def verify_plan() -> VerifyPlan:
    """From ``shape=``, ``backend=`` and ``force=``; :class:`UserError` on a bad one. The
    tasks that depend on verify cells (seal, gate) read the same plan, so a bad input
    fails them the same way instead of leaving them a dependency that does not exist."""
    sets = chosen_sets()
    cells = [(spec.name, shape_set, shape) for spec in KERNELS.values()
             for shape_set, shapes in sets.items() for shape in shapes]
    return VerifyPlan(cells, resolve_backend(var("backend")), var("force") == "1")


def launch_config(spec: KernelSpec, shape: Shape) -> str:
    """The cell's launch as data: grid, block, shared bytes and the scalar arguments. A
    change to a tile or split-K rule that leaves the PTX bytes alone still changes how
    the cell runs, so the cell re-runs; a comment edit changes none of it."""
    dims = Dims(shape.R, shape.K, shape.N)
    scalars = [p.value(dims) if p.value else getattr(dims, p.name) for p in spec.params if p.shape is None]
    return repr((tuple(spec.geometry(dims)), scalars))


def cell_task(kernel: str, shape_set: str, shape: Shape) -> str:
    return f"verify:{kernel}/{shape_set}/{shape.name}"


@fails_on_user_error
def task_verify() -> Iterator[dict]:
    # its doc, the line `doit list` shows, names the variables: set after the definition
    chosen, backend, force = verify_plan()
    emulator = backend_hash(backend)
    checked_by = {k: check_hash(KERNELS[k]) for k in dict.fromkeys(k for k, _, _ in chosen)}
    for kernel, shape_set, shape in chosen:
        params = {"R": shape.R, "K": shape.K, "N": shape.N, "backend": backend,
                  "seed": seed(kernel, shape), "reference": checked_by[kernel], "emulator": emulator,
                  "launch": launch_config(KERNELS[kernel], shape)}
        yield {
            "name": cell_task(kernel, shape_set, shape).split(":", 1)[1],
            "actions": [(_verify, [kernel, shape_set, shape, backend, force])],
            "file_dep": [str(config.ptx_path(kernel))],
            "task_dep": [f"ptxas:{kernel}"],
            "targets": [str(config.verify_json(kernel, shape_set, shape.name))],
            "uptodate": [config_changed(params), targets_intact()],
            "meta": {"stage": "verify", "cell": (kernel, shape_set, shape.name)},
            "clean": [clean_targets, clean_leftovers],
        }
    cells = [(k, s, shape.name) for k, s, shape in chosen]
    yield {
        "name": "check",
        "doc": "fail unless every cell's report is of the current PTX and exact",
        "actions": [(_verify_check, [cells])],
        "task_dep": [cell_task(*c) for c in chosen] + ["ptxas:check"],
        "uptodate": [functools.partial(verify_all_pass, cells)],
    }


task_verify.__doc__ = f"Run every kernel on the shape sets, compare exactly: {describe('shape', 'backend', 'force')}"


# ---- report --------------------------------------------------------------------------

@one_line_failure  # an unreadable report is one line, not a traceback
def _report(kernels: Sequence[str], cells: Sequence[tuple[str, str, str]], fmt: str) -> None:
    report.print_to_pipe(report.last_run(kernels, cells, fmt))  # `doit report | head` ends quietly


@fails_on_user_error
def task_report() -> Iterator[dict]:
    # its doc (`doit list`) names the variables: set after the definition
    fmt = var("format")
    if fmt not in ("text", "json"):
        raise UserError(f"format={fmt}: expected text or json")
    cells = [(k, s, shape.name) for k, s, shape in verify_plan().cells]
    yield {"name": "last", "actions": [(_report, [list(KERNELS), cells, fmt])], "uptodate": [False], "verbosity": 2,
           "meta": {"quiet": True}}


task_report.__doc__ = f"Re-print the last ptxas, verify (and bench) tables: {describe('shape', 'format')}"
