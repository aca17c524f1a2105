"""Content-based up-to-date checks for doit: inputs and targets by sha256, never by mtime.

doit's default md5 checker trusts an unchanged mtime (an edit kept by ``cp -p``, tar
or a fast editor is missed) and only checks that targets exist (a damaged target
is trusted). Here every file_dep is hashed on every run (our inputs are small) and
every task's targets are re-hashed against the hashes saved when it last succeeded
(:class:`targets_intact`), so both cases re-run exactly the stage that owns the file.
Readers still check an artifact against the sha256 its result JSON records
(pipeline.artifacts.check_artifact) before using it.
"""
from __future__ import annotations

import os
from pathlib import Path

from doit.dependency import FileChangedChecker
from doit.task import Task

from pipeline.artifacts import sha256_file


class ContentChecker(FileChangedChecker):
    """file_dep state = sha256 of the content; mtime and size are never trusted."""

    def check_modified(self, file_path: str, file_stat: os.stat_result, state: str) -> bool:
        return sha256_file(Path(file_path)) != state

    def get_state(self, dep: str, current_state: str | None) -> str:
        return sha256_file(Path(dep))


class targets_intact:
    """An ``uptodate`` check: every target still has the sha256 it had when the task last
    succeeded (saved in doit's DB beside the task), so a damaged, truncated or hand-edited
    artifact or result JSON re-runs the task that writes it. Named like doit's own
    ``config_changed``, used the same way: ``"uptodate": [targets_intact()]``."""

    KEY = "_targets_sha256"

    def configure_task(self, task: Task) -> None:
        task.value_savers.append(lambda: {self.KEY: self.hashes(task.targets)})

    @staticmethod
    def hashes(targets: list[str]) -> dict[str, str | None]:
        return {t: sha256_file(Path(t)) if os.path.exists(t) else None for t in targets}

    def __call__(self, task: Task, values: dict) -> bool:
        saved = values.get(self.KEY)
        return saved is not None and saved == self.hashes(task.targets)
