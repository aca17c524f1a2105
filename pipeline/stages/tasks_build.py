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
- file_dep are compared by sha256 (pipeline.core.checker.ContentChecker): a comment-only
  kernel edit re-runs emit; the PTX bytes are the same, so ptxas and verify do not.
- every task's targets are re-hashed against the hashes saved when it last succeeded
  (pipeline.core.checker.targets_intact): a damaged or hand-edited artifact or report
  re-runs the stage that owns it.
- ``config_changed`` carries the parameters (archs, budget, ptxas, dims, backend, seed,
  the hash of the reference and input generator, and of the emulator when it is the
  backend: pipeline.core.sources.check_hash, pipeline.stages.verify.backend_hash).

Command-line variables (pipeline.core.cmdline) are checked when doit starts. A bad input a
creator reads (shapes.yaml, shape=, backend=) makes only that creator's tasks fail,
with one line; ``doit list`` and ``doit emit`` still work.
"""
from __future__ import annotations

import functools
from typing import Any, Iterator, NamedTuple, Sequence

from doit.task import clean_targets
from doit.tools import config_changed

from kernels.registry import KERNELS
from kernels.spec import Dims, KernelSpec
from pipeline.core import config
from pipeline.stages import report
from pipeline.core.artifacts import rel, write_model
from pipeline.core.checker import targets_intact
from pipeline.core.cmdline import describe, var
from pipeline.stages.emit import emit
from pipeline.core.errors import UserError
from pipeline.core.models import EmitResult, PtxasReport, Shape, VerifyReport
from pipeline.stages.ptxas import assemble, find_ptxas, ptxas_version
from pipeline.core.shapes import parse_set_names, select_sets
from pipeline.core.sources import check_hash, source_files
from pipeline.stages.table import Stage
from pipeline.stages.taskkit import clean_leftovers, fails_on_user_error, one_line_failure
from pipeline.stages.verify import backend_hash, resolve_backend, seed, verdict, verify_cell


def chosen_sets() -> dict[str, tuple[Shape, ...]]:
    """The shape sets of ``shape=`` (default config.VERIFY_SETS), from shapes.yaml."""
    return select_sets(parse_set_names(var("shape")))


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


def current_ptxas(kernel: str) -> PtxasReport | None:
    """The kernel's ptxas report when it is of the current PTX, else None."""
    emitted = report.cached_record(config.emit_json(kernel), EmitResult)
    found = report.cached_record(config.ptxas_json(kernel), PtxasReport)
    return found if emitted and found and found.ptx_sha256 == emitted.ptx_sha256 else None


def ptxas_problems(kernel: str) -> list[str]:
    """The judge's lines for one kernel: each arch not within budget, or no current report."""
    found = current_ptxas(kernel)
    return report.ptxas_problems(found) if found else [f"{kernel}: no ptxas report of the current PTX"]


def ptxas_task(kernel: str) -> dict:
    ptx, result = config.ptx_path(kernel), config.ptxas_json(kernel)
    return {
        "name": kernel,
        "actions": [(_ptxas, [kernel])],
        "file_dep": [str(ptx)],
        "targets": [str(result)],
        "uptodate": [config_changed(_ptxas_config(kernel)), targets_intact()],
        "clean": [clean_targets, clean_leftovers],
    }


PTXAS = Stage(
    name="ptxas",
    doc="Assemble every kernel with ptxas -v per arch; fail on spills, over budget or a refusal.",
    cells=lambda: list(KERNELS),
    cell_task=ptxas_task,
    record="PtxasReport",
    problems=ptxas_problems,
    judge_doc="fail unless every kernel is within budget and spill-free on every arch",
    table=report.ptxas_table,
    summary=lambda kernels, ran: report.ptxas_line([report.cached_record(config.ptxas_json(k), PtxasReport, True)
                                                    for k in kernels], ran),
    rerun="doit ptxas",
)


# ---- verify --------------------------------------------------------------------------

@one_line_failure
def _verify(kernel: str, shape_set: str, shape: Shape, backend: str, force: bool) -> None:
    print(verdict(verify_cell(KERNELS[kernel], shape_set, shape, backend, force)))


def verify_problems(cell: tuple[str, str, Shape]) -> list[str]:
    """The judge's line for one cell: its verdict when it does not pass, or no current report."""
    kernel, shape_set, shape = cell
    emitted = report.cached_record(config.emit_json(kernel), EmitResult)
    found = report.cached_record(config.verify_json(kernel, shape_set, shape.name), VerifyReport)
    if emitted is None or found is None or found.ptx_sha256 != emitted.ptx_sha256:
        return [f"{kernel} {shape_set}/{shape.name}: no verify report of the current PTX"]
    return [] if found.passed else [verdict(found)]


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


@functools.lru_cache(maxsize=None)
def _check_hash(kernel: str) -> str:
    return check_hash(KERNELS[kernel])  # one kernel's reference hash serves all its cells


@functools.lru_cache(maxsize=None)
def _resolved(backend: str) -> str:
    return resolve_backend(backend)  # 'auto' looks for a GPU once, not once a cell


@functools.lru_cache(maxsize=None)
def _backend_hash(backend: str) -> str:
    return backend_hash(backend)


def verify_task(cell: tuple[str, str, Shape]) -> dict:
    kernel, shape_set, shape = cell
    backend, force = _resolved(var("backend")), var("force") == "1"
    params = {"R": shape.R, "K": shape.K, "N": shape.N, "backend": backend,
              "seed": seed(kernel, shape), "reference": _check_hash(kernel), "emulator": _backend_hash(backend),
              "launch": launch_config(KERNELS[kernel], shape)}
    return {
        "name": cell_task(kernel, shape_set, shape).split(":", 1)[1],
        "actions": [(_verify, [kernel, shape_set, shape, backend, force])],
        "file_dep": [str(config.ptx_path(kernel))],
        "task_dep": [f"ptxas:{kernel}"],
        "targets": [str(config.verify_json(kernel, shape_set, shape.name))],
        "uptodate": [config_changed(params), targets_intact()],
        "clean": [clean_targets, clean_leftovers],
    }


def _named(cells: Sequence[tuple[str, str, Shape]]) -> list[tuple[str, str, str]]:
    return [(k, s, shape.name) for k, s, shape in cells]


VERIFY = Stage(
    name="verify",
    doc=f"Run every kernel on the shape sets, compare exactly: {describe('shape', 'backend', 'force')}",
    cells=lambda: verify_plan().cells,
    cell_task=verify_task,
    record="VerifyReport",
    problems=verify_problems,
    judge_doc="fail unless every cell's report is of the current PTX and exact",
    judge_after=("ptxas:check",),
    list_failing=True,
    table=lambda cells: report.verify_table(_named(cells)),
    summary=lambda cells, ran: report.verify_line(report.verify_reports(_named(cells)), ran),
    rerun="doit verify shape={set} backend=emulator",
)


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
    kernels, cells = PTXAS.cells(), _named(VERIFY.cells())
    yield {"name": "last", "actions": [(_report, [kernels, cells, fmt])], "uptodate": [False], "verbosity": 2,
           "meta": {"quiet": True}}


task_report.__doc__ = f"Re-print the last ptxas, verify (and bench) tables: {describe('shape', 'format')}"
