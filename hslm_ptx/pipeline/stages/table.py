"""A stage of the graph, declared once: its cells, their task, their record, its judge and its line.

A :class:`Stage` is what doit calls a task group (``doit ptxas`` runs ``ptxas:<kernel>``
for every kernel, then ``ptxas:check``). From its one declaration come:

- the doit tasks: doit takes any object with a ``create_doit_tasks`` attribute as a task
  creator, named by its ``basename`` (pydoit's "custom task definition"), so ``dodo.py``
  lists the stages and each becomes its group: every cell's task carries
  ``meta={"stage": <the Stage>, "cell": cell}``;
- the judge ``<name>:check`` when the stage has ``problems``: it fails with the first
  failing line, so the cells record evidence and only the judge fails. Its file_dep are
  the records the cells' problems are read from (``judged``) and its ``config_changed``
  the cells, so it is up to date exactly while nothing it read has changed since it last
  passed (doit saves a task's state only when it succeeds: a failing judge runs again on
  every run);
- the reporter's lines (hslm_ptx.pipeline.tasks.reporter): ``table`` when a cell ran, then
  ``summary``. A passing judge keeps, as its doit value, the summary a run with nothing
  to do prints, so such a run reads no record;
- the gate's re-run command for one of the stage's cells (:func:`rerun`).

A cell is plain data (a name, a tuple): its repr is what the judge's ``config_changed``
keeps. The fields that read records are hslm_ptx.pipeline.stages.taskkit.Deferred paths, so
creating a stage's tasks imports no record module.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Hashable, Iterator, Sequence

from doit.exceptions import TaskFailed
from doit.tools import config_changed

from hslm_ptx.pipeline.stages.taskkit import fails_on_user_error, one_line_failure

Cell = Hashable  # a stage's unit of work: a kernel, (kernel, set, shape), a shape set


@dataclass(frozen=True, repr=False)
class Stage:
    """One stage: ``doit <name>`` runs ``cell_task(c)`` for each ``c`` of ``cells()``."""

    name: str  # the task group, the first word of its summary line, the gate's check of its cells
    doc: str  # the group's line in `doit list`
    cells: Callable[[], Sequence[Cell]]  # the cells this command line asks for; a UserError fails only this stage
    cell_task: Callable[[Cell], dict]  # one cell's doit task: name, actions, file_dep, targets, uptodate, clean
    record: str = ""  # the hslm_ptx.pipeline.core.models record a cell writes (documentation and the report's key)
    problems: Callable[[Cell], list[str]] | None = None  # a cell's failing lines (empty: it passes); makes a judge
    judged: Callable[[Cell], Sequence[Path]] = lambda cell: ()  # the records ``problems`` reads for a cell
    judge_doc: str = ""
    judge_after: tuple[str, ...] = ()  # tasks the judge waits for besides the cells (another stage's judge)
    list_failing: bool = False  # the judge prints every failing line, not only the first
    table: Callable[[Sequence[Cell]], str] | None = None  # printed at the end of a run in which a cell ran
    summary: Callable[[Sequence[Cell], int], str] | None = None  # the stage's line at the end of every run
    rerun: str = ""  # the command that re-runs one cell, "{set}" the set of the gate's target

    def __repr__(self) -> str:  # what `doit info` shows in a cell's meta
        return f"Stage({self.name!r})"

    def tasks(self) -> Iterator[dict]:
        cells = self.cells()
        names = []
        for cell in cells:
            task = self.cell_task(cell)
            names.append(f"{self.name}:{task['name']}")
            yield {**task, "meta": {**task.get("meta", {}), "stage": self, "cell": cell}}
        if self.problems is not None:
            yield {
                "name": "check",
                "doc": self.judge_doc,
                "actions": [(judge, [self, cells])],
                "task_dep": names + list(self.judge_after),
                "file_dep": sorted({str(path) for cell in cells for path in self.judged(cell)}),
                "uptodate": [config_changed({"cells": [repr(cell) for cell in cells]})],
                "meta": {"stage": self, "judge": True},
            }

    def __post_init__(self) -> None:
        # doit's loader takes any object of a dodo with this attribute as a task creator. It is
        # set on the instance, not the class, so a dodo that imports Stage itself is no creator.
        create = fails_on_user_error(self.tasks)
        create.basename = self.name  # doit names the group by this
        create.__doc__ = self.doc
        object.__setattr__(self, "create_doit_tasks", create)


def failing_lines(problems: Callable[[Cell], list[str]], cells: Sequence[Cell]) -> list[str]:
    return [line for cell in cells for line in problems(cell)]


NOTHING_RAN = "line"  # a passing judge's value: the stage's summary when none of its cells ran


@one_line_failure
def judge(stage: Stage, cells: Sequence[Cell]) -> TaskFailed | dict:
    """A judge's action: the first failing line as the failure, and how many more; when
    every cell passes, the summary line a run with nothing to do prints (kept by doit)."""
    failing = failing_lines(stage.problems, cells)
    if not failing:
        return {NOTHING_RAN: stage.summary(cells, 0)} if stage.summary else {}
    list_failing = stage.list_failing
    if list_failing:
        for line in failing[1:]:
            print(line)
    more = f" (+{len(failing) - 1} more{' above' if list_failing else ''})" if len(failing) > 1 else ""
    return TaskFailed(failing[0] + more)


# The command that re-runs a cell of each stage whose cells the ledger holds: the stages'
# declarations (hslm_ptx.pipeline.tasks.build) and the gate's fix lines read it here.
RERUN = {"ptxas": "doit ptxas", "verify": "doit verify shape={set} backend=emulator"}


def stage_rerun(check: str, target: str) -> str:
    """The command that re-runs the cell ``target`` of stage ``check`` (the gate's fix line)."""
    if check not in RERUN:
        raise KeyError(f"no stage '{check}' with a re-run command")
    return RERUN[check].format(set=target.split("/")[0])


def summary_lines(stage: Stage, cells: Sequence[Cell], ran: int) -> list[str]:
    """What the reporter prints for ``stage`` at the end of a run: its table when a cell
    ran, then its one line."""
    lines = [stage.table(cells)] if ran and stage.table else []
    return lines + ([stage.summary(cells, ran)] if stage.summary else [])
