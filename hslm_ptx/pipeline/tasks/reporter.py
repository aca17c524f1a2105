"""The console reporter: doit's, with up-to-date tasks counted instead of listed.

A task that runs is shown as doit shows it (``.  name``) and failures as doit writes
them. Up-to-date tasks are not listed one by one; at the end, each stage
(hslm_ptx.pipeline.stages.table.Stage) whose cells were part of the run gets its lines: its table when
any of its cells ran, then its summary, e.g. ``verify: 48 cells on emulator (all up to
date): all exact``. A cell task that runs several units returns ``{"ran": n}`` (doit keeps
a python action's returned dict as the task's values), and the summary counts units.
When none of a stage's cells ran and its judge passed, the line is the one the judge kept
(doit loads an up-to-date task's values), so a run with nothing to do reads no record. A
stage's cells are the tasks whose ``meta["stage"]`` is that Stage (the Stage puts it
there, and ``meta["judge"]`` on its judge), so this module names no stage.
"""
from __future__ import annotations

import sys

from doit.reporter import ConsoleReporter
from doit.task import Task

from hslm_ptx.pipeline.core.errors import ArtifactError
from hslm_ptx.pipeline.stages import progress
from hslm_ptx.pipeline.stages.table import NOTHING_RAN, Stage, summary_lines


class StageReporter(ConsoleReporter):
    desc = "console output, one line per stage for up-to-date cells"

    def __init__(self, outstream, options) -> None:
        super().__init__(outstream, options)
        self.seen: dict[Stage, dict[str, int]] = {}  # stage -> its cells' task names -> units run
        self.order: dict[str, int] = {}  # task name -> creation order (registry, then shapes.yaml)
        self.cells: dict[str, object] = {}  # task name -> its cell
        self.judges: dict[Stage, Task] = {}  # stage -> its judge, when it passed or was up to date
        self.counted: dict[Stage, bool] = {}  # stage -> its cells were counted by a live line

    def initialize(self, tasks, selected_tasks) -> None:
        self.order = {name: i for i, name in enumerate(tasks)}
        self.outstream = progress.attach(sum(units(tasks[name]) for name in closure(tasks, selected_tasks)),
                                         self.outstream)
        if isinstance(self.outstream, progress.LineGuard):
            sys.stdout = self.outstream  # the tasks' own lines pass the live line too

    def _note(self, task: Task, ran: int) -> None:
        stage = (task.meta or {}).get("stage")
        if isinstance(stage, Stage) and task.meta.get("judge"):
            self.judges[stage] = task  # its values are there by the end of the run
        elif isinstance(stage, Stage):
            self.seen.setdefault(stage, {})[task.name] = ran
            self.cells[task.name] = task.meta["cell"]
            self.counted[stage] = bool(units(task)) and progress.PROGRESS.live

    def execute_task(self, task: Task) -> None:
        # a task whose output is data (doit report) is not announced, nor one the live line counts
        if not (task.meta or {}).get("quiet") and not (units(task) and progress.PROGRESS.live):
            super().execute_task(task)

    def skip_uptodate(self, task: Task) -> None:
        progress.PROGRESS.skip(units(task))
        self._note(task, ran=0)

    def add_success(self, task: Task) -> None:
        # a task that runs several units (a kernel's verify cells) says how many it ran
        self._note(task, ran=int((task.values or {}).get("ran", 1)))

    def _first(self, names: dict[str, bool]) -> int:
        return min(self.order.get(name, len(self.order)) for name in names)

    def stage_lines(self) -> list[str]:
        """Each stage's lines, stages and cells in the order doit created them."""
        lines = []
        for stage, names in sorted(self.seen.items(), key=lambda item: self._first(item[1])):
            ordered = sorted(names, key=lambda name: self.order.get(name, len(self.order)))
            ran = sum(names.values())
            kept = (self.judges[stage].values or {}).get(NOTHING_RAN) if stage in self.judges and not ran else None
            cells = [self.cells[name] for name in ordered]
            if kept:
                lines.append(kept)
            elif self.counted.get(stage) and stage.summary:
                # on a terminal the live line stood for the cells: their summary; the table is `doit report`'s
                lines += [stage.summary(cells, ran)] + ["(every cell's row: doit report)"] * bool(ran)
            else:
                lines += summary_lines(stage, cells, ran)
        return lines

    def complete_run(self) -> None:
        progress.PROGRESS.finish()
        if isinstance(self.outstream, progress.LineGuard):
            sys.stdout = self.outstream = self.outstream.out
        try:
            for line in self.stage_lines():
                self.write(line + "\n")
        except ArtifactError as exc:  # a report vanished under the run: say so, do not crash
            self.write(f"(no summary: {exc})\n")
        super().complete_run()


def units(task: Task) -> int:
    return int((task.meta or {}).get("units", 0))


def closure(tasks: dict[str, Task], selected: list[str] | None) -> set[str]:
    """The tasks a run of ``selected`` (every task when None) may execute: them and their task_dep."""
    todo, seen = list(tasks if selected is None else selected), set()
    while todo:
        name = todo.pop()
        if name in tasks and name not in seen:
            seen.add(name)
            todo.extend(tasks[name].task_dep)
    return seen
