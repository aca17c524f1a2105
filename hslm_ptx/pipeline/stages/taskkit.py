"""What every task module shares: one-line failures, failing tasks, and what `doit clean` leaves.

A stage's actions and creators turn the errors a user can act on into one line (doit
prints no traceback for a :class:`TaskFailed`), and its ``clean`` actions leave no
folder the graph emptied behind.
"""
from __future__ import annotations

import atexit
import functools
import importlib
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

from doit.exceptions import TaskFailed

from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.checker import drop_kept_hashes
from hslm_ptx.pipeline.core.cmdline import DATABASE
from hslm_ptx.cost.model import CostInputError  # a bad devices.json or loop_counts.json (hslm_ptx.cost reads them alone)
from hslm_ptx.pipeline.core.errors import ArtifactError, PtxasError, UserError


def one_line_failure(action: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the errors a user can act on into a TaskFailed of one line (doit prints no traceback)."""

    @functools.wraps(action)
    def run(*args: Any) -> Any:
        try:
            return action(*args)
        except (UserError, ArtifactError, PtxasError, CostInputError) as exc:
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
        except (UserError, CostInputError) as exc:
            yield failing_task(str(exc), name="error")

    return create


class Deferred:
    """A function named by its path, ``"module:name"``, imported when it is first called.

    A task's action, or a stage's judge, table or summary, that needs the kernels, numpy
    or pydantic is declared with one, so creating the task imports none of them: only a
    run that calls it pays for the import. It pickles as its path."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, *args: Any) -> Any:
        module, name = self.path.split(":")
        return getattr(importlib.import_module(module), name)(*args)

    def __repr__(self) -> str:
        return f"Deferred({self.path!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Deferred) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)


# ---- clean ---------------------------------------------------------------------------

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
    if database:  # the memos go with the state they sped up
        drop_kept_hashes()
        shutil.rmtree(config.CACHE_DIR, ignore_errors=True)
    prune_empty_folders(config.ARTIFACTS)
    if database:
        for path in config.ROOT.glob(f"{DATABASE}*"):  # sqlite3 writes this file, the dbm backends a few beside it
            path.unlink(missing_ok=True)


def clean_leftovers(database: bool = False) -> None:
    """A `doit clean` action: when the command ends (after every task's clean, and after doit
    closed its database), the folders the cleaning emptied go, and with ``database`` the
    graph's database too. Emit's clean asks for that: without the PTX every stage re-runs,
    so the recorded state says nothing any more."""
    if database not in _after_clean:
        _after_clean.add(database)
        atexit.register(_leave_nothing, database)
