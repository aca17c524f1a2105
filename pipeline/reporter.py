"""The console reporter: doit's, with up-to-date tasks counted instead of listed.

A task that runs is shown as doit shows it (``.  name``) and failures as doit writes
them. Up-to-date tasks are not listed one by one; at the end, each stage whose cells
were part of the run (tasks carrying ``meta={"stage": ...}``, verify cells also
``"cell": (kernel, set, shape)``) gets one line, and its
table when any of its cells ran, e.g. ``verify: 48 cells on emulator (all up to
date): all exact``.
"""
from __future__ import annotations

from doit.reporter import ConsoleReporter
from doit.task import Task

from kernels.registry import KERNELS
from pipeline import config, report
from pipeline.artifacts import read_model
from pipeline.errors import ArtifactError
from pipeline.models import PtxasReport


class StageReporter(ConsoleReporter):
    desc = "console output, one line per stage for up-to-date cells"

    def __init__(self, outstream, options) -> None:
        super().__init__(outstream, options)
        self.seen: dict[str, dict[str, bool]] = {}  # stage -> task name -> ran
        self.order: dict[str, int] = {}  # task name -> creation order (registry, then shapes.yaml)
        self.cells: dict[str, tuple[str, str, str]] = {}  # verify task name -> (kernel, set, shape)

    def initialize(self, tasks, selected_tasks) -> None:
        self.order = {name: i for i, name in enumerate(tasks)}

    def _note(self, task: Task, ran: bool) -> None:
        meta = task.meta or {}
        if "stage" in meta:
            self.seen.setdefault(meta["stage"], {})[task.name] = ran
        if "cell" in meta:
            self.cells[task.name] = tuple(meta["cell"])

    def execute_task(self, task: Task) -> None:
        if not (task.meta or {}).get("quiet"):  # a task whose output is data (doit report) is not announced
            super().execute_task(task)

    def skip_uptodate(self, task: Task) -> None:
        self._note(task, ran=False)

    def add_success(self, task: Task) -> None:
        self._note(task, ran=True)

    def stage_lines(self) -> list[str]:
        lines = []
        ptxas = self.seen.get("ptxas", {})
        if ptxas:
            kernels = [k for k in KERNELS if f"ptxas:{k}" in ptxas]
            ran = sum(ptxas.values())
            if ran:
                lines.append(report.ptxas_table(kernels))
            lines.append(report.ptxas_line([read_model(config.ptxas_json(k), PtxasReport) for k in kernels], ran))
        verify = self.seen.get("verify", {})
        if verify:
            names = sorted(verify, key=lambda name: self.order.get(name, len(self.order)))
            cells = [self.cells[name] for name in names]
            ran = sum(verify.values())
            if ran:
                lines.append(report.verify_table(cells))
            lines.append(report.verify_line(report.verify_reports(cells), ran))
        return lines

    def complete_run(self) -> None:
        try:
            for line in self.stage_lines():
                self.write(line + "\n")
        except ArtifactError as exc:  # a report vanished under the run: say so, do not crash
            self.write(f"(no summary: {exc})\n")
        super().complete_run()
