"""The build half of the doit graph: emit -> ptxas -> verify, one subtask per kernel.

Names on the command line: ``emit``, ``ptxas``, ``verify`` (each a group: ``emit:<kernel>``,
``ptxas:<kernel>``, ``verify:<kernel>`` (its cells, ``<set>/<shape>``, run inside it), and ``ptxas:check`` /
``verify:check``, the judges).

This module only declares the tasks, from the build plan (hslm_ptx.pipeline.stages.build_plan), and
names what they run by path (hslm_ptx.pipeline.stages.build_steps, through taskkit.Deferred): a
run with nothing to do imports neither the kernels nor numpy nor pydantic.

Up-to-date rules, so only stale work re-runs:
- file_dep are compared by sha256 (hslm_ptx.pipeline.core.checker.ContentChecker): a comment-only
  kernel edit re-runs emit; the PTX bytes are the same, so ptxas and verify do not.
- every task's targets are re-hashed against the hashes saved when it last succeeded
  (hslm_ptx.pipeline.core.checker.targets_intact): a damaged or hand-edited artifact or report
  re-runs the stage that owns it.
- ``config_changed`` carries the parameters (archs, budget, ptxas; for verify each cell's
  inputs hash: dims, backend, seed, launch, the hash of the reference and input generator,
  and of the emulator when it is the backend: hslm_ptx.pipeline.core.sources.check_hash,
  hslm_ptx.pipeline.stages.verify.backend_hash), and inside a kernel's verify task a cell runs
  only when its VerifyIndex entry no longer matches.
- a judge (``ptxas:check``, ``verify:check``) reads the records its cells wrote and is up
  to date while they and the cells are as they were when it last passed
  (hslm_ptx.pipeline.stages.table).

Command-line variables (hslm_ptx.pipeline.core.cmdline) are checked when doit starts. A bad input a
creator reads (shapes.yaml, shape=, backend=) makes only that creator's tasks fail,
with one line; ``doit list`` and ``doit emit`` still work.
"""
from __future__ import annotations

from typing import Any, Iterator

from doit.task import clean_targets
from doit.tools import config_changed

from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.checker import targets_intact
from hslm_ptx.pipeline.core.request import current, describe
from hslm_ptx.pipeline.core.errors import UserError
from hslm_ptx.pipeline.stages.build_plan import KernelCells, build_plan
from hslm_ptx.pipeline.stages.table import RERUN, Stage
from hslm_ptx.pipeline.stages.taskkit import Deferred, clean_leftovers, fails_on_user_error

STEPS = "hslm_ptx.pipeline.stages.build_steps"


def steps(name: str) -> Deferred:
    return Deferred(f"{STEPS}:{name}")


# ---- emit ----------------------------------------------------------------------------

def task_emit() -> Iterator[dict]:
    """Emit each kernel's PTX (artifacts/ptx/<kernel>.ptx and .emit.json)."""
    for kernel in build_plan().kernels:
        yield {
            "name": kernel.name,
            "actions": [(steps("run_emit"), [kernel.name])],
            "file_dep": list(kernel.sources),
            "targets": [str(config.ptx_path(kernel.name)), str(config.emit_json(kernel.name))],
            "uptodate": [targets_intact()],
            "clean": [clean_targets, (clean_leftovers, [True])],
        }


# ---- ptxas ---------------------------------------------------------------------------

def ptxas_config(kernel: str) -> dict[str, Any]:
    """What a ptxas report depends on besides the PTX: archs, budget, which ptxas."""
    return {"archs": list(config.ARCHS), "budget": config.budget(kernel)._asdict(), **dict(build_plan().ptxas)}


def ptxas_task(kernel: str) -> dict:
    return {
        "name": kernel,
        "actions": [(steps("run_ptxas"), [kernel])],
        "file_dep": [str(config.ptx_path(kernel))],
        "targets": [str(config.ptxas_json(kernel))],
        "uptodate": [config_changed(ptxas_config(kernel)), targets_intact()],
        "clean": [clean_targets, clean_leftovers],
    }


PTXAS = Stage(
    name="ptxas",
    doc="Assemble every kernel with ptxas -v per arch; fail on spills, over budget or a refusal.",
    cells=lambda: build_plan().names(),
    cell_task=ptxas_task,
    record="PtxasReport",
    problems=steps("ptxas_problems"),
    judged=lambda kernel: [config.emit_json(kernel), config.ptxas_json(kernel)],
    judge_doc="fail unless every kernel is within budget and spill-free on every arch",
    table=Deferred("hslm_ptx.pipeline.stages.report:ptxas_table"),
    summary=steps("ptxas_summary"),
    rerun=RERUN["ptxas"],
)


# ---- verify --------------------------------------------------------------------------
# One doit task per kernel (``verify:<kernel>``), its cells run inside it: doit's cost is
# per task, and a kernel's cells share its PTX, its reference and its emulator. A cell is
# run again only when its inputs, its PTX or its report file changed since its entry in
# the kernel's VerifyIndex was written (after each cell, so a killed run keeps what finished).

def verify_task_name(kernel: str) -> str:
    return f"verify:{kernel}"


def planned_cells() -> tuple[KernelCells, ...]:
    """The stage's cells, from the plan; a bad shape= or backend= is its one line."""
    cells = build_plan().verify
    if isinstance(cells, str):
        raise UserError(cells)
    return cells


def verify_task(cells: KernelCells) -> dict:
    return {
        "name": cells.kernel,
        "actions": [(steps("run_verify"), [cells, current()])],
        "file_dep": [str(config.ptx_path(cells.kernel))],
        "task_dep": [f"ptxas:{cells.kernel}"],
        "targets": [str(config.verify_json(*cell)) for cell in cells.named()] + [str(config.verify_index(cells.kernel))],
        "uptodate": [config_changed({"cells": dict(zip(cells.keys(), cells.inputs))}), targets_intact()],
        "clean": [clean_targets, clean_leftovers],
        "meta": {"units": len(cells.shapes)},  # the run's live line counts its cells (hslm_ptx.pipeline.stages.progress)
    }


VERIFY = Stage(
    name="verify",
    doc=f"Run every kernel on the shape sets, compare exactly: {describe('shape', 'backend', 'force', 'executor')}",
    cells=planned_cells,
    cell_task=verify_task,
    record="VerifyReport",
    problems=steps("verify_problems"),
    judged=lambda cells: [config.emit_json(cells.kernel), config.verify_index(cells.kernel)],
    judge_doc="fail unless every cell's report is of the current PTX and exact",
    judge_after=("ptxas:check",),
    list_failing=True,
    table=steps("verify_table"),
    summary=steps("verify_summary"),
    rerun=RERUN["verify"],
)


# ---- report --------------------------------------------------------------------------

@fails_on_user_error
def task_report() -> Iterator[dict]:
    # its doc (`doit list`) names the variables: set after the definition
    from hslm_ptx.pipeline.stages.build_plan import verify_plan

    request = current()
    fmt = request.value("format")
    if fmt not in ("text", "json"):
        raise UserError(f"format={fmt}: expected text or json")
    kernels, cells = PTXAS.cells(), [(k, s, shape.name) for k, s, shape in verify_plan(request).cells]
    yield {"name": "last", "actions": [(steps("run_report"), [kernels, cells, fmt])], "uptodate": [False],
           "verbosity": 2, "meta": {"quiet": True}}


task_report.__doc__ = f"Re-print the last ptxas, verify (and bench) tables: {describe('shape', 'format')}"
