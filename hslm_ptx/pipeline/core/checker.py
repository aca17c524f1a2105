"""Content-based up-to-date checks for doit: inputs and targets by sha256, never by mtime.

doit's default md5 checker trusts an unchanged mtime (an edit kept by ``cp -p``, tar
or a fast editor is missed) and only checks that targets exist (a damaged target
is trusted). Here every file_dep is hashed on every run and every task's targets are
re-hashed against the hashes saved when it last succeeded (:class:`targets_intact`),
so both cases re-run exactly the stage that owns the file.

A file is hashed once per version (:func:`content_sha256`): every verify cell of a
kernel depends on the same PTX, and a run with nothing to do would otherwise read every
report of every cell. The version is the file's path, inode, size, mtime and ctime, as
git's index keeps them: what is compared with the saved state is still the content's
sha256, so an edit is seen whatever it did to the mtime (ctime moves with every write,
``utime`` and rename, and no one can set it). As in git's "racy clean" rule, a version
hashed within :data:`RACY_NS` of its last change is never taken from the cache (the
clock that stamps ctime is coarse, so a second write in the same tick would otherwise
keep the stamp); it is hashed again, and trusted from then on. A doit run keeps the
versions it hashed for the next run (:func:`keep_hashes`, called by
hslm_ptx.pipeline.core.cmdline.startup); anything unreadable there is a miss.
Readers still check an artifact against the sha256 its result JSON records
(hslm_ptx.pipeline.core.artifacts.check_artifact) before using it.
"""
from __future__ import annotations

import atexit
import json
import os
import time
from pathlib import Path

from doit.dependency import FileChangedChecker
from doit.task import Task

from hslm_ptx.pipeline.core.files import RACY_NS, Version, sha256_file, version, write_atomic

_hashes: dict[Version, tuple[str, int]] = {}  # version -> (sha256, when hashed)
_kept: list[Path] = []  # where this run's hashes go for the next one (keep_hashes)
_new: set[Version] = set()  # versions hashed in this process


def content_sha256(path: str, stat: os.stat_result | None = None) -> str:
    """sha256 of the file at ``path``, read once per version in this process."""
    st = stat or os.stat(path)
    key = version(path, st)
    found = _hashes.get(key)
    if found is not None and st.st_ctime_ns < found[1] - RACY_NS:
        return found[0]
    hashed_at = time.time_ns()
    digest = sha256_file(path)
    _hashes[key] = (digest, hashed_at)
    _new.add(key)
    return digest


def _present_sha256(path: str) -> str | None:
    """sha256 of the file at ``path``, None when there is none (one stat, not two)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return content_sha256(path, st)


def keep_hashes(memo: Path) -> None:
    """Start from the versions ``memo`` holds, and write it back when the process ends
    with the versions that are still current, when this process hashed any."""
    try:
        for path, ino, size, mtime, ctime, digest, hashed_at in json.loads(memo.read_text()):
            if not (isinstance(path, str) and isinstance(digest, str)
                    and all(type(n) is int for n in (ino, size, mtime, ctime, hashed_at))):
                raise TypeError("a row that is not (path, 4 stamps, sha256, when)")
            _hashes.setdefault((path, ino, size, mtime, ctime), (digest, hashed_at))
    except (OSError, ValueError, TypeError):
        _hashes.clear()
    if not _kept:
        atexit.register(_write_kept)
    _kept[:] = [memo]


def drop_kept_hashes() -> None:
    """Write nothing at exit (``doit clean`` removes the memo with everything else)."""
    _kept.clear()


def _current(key: Version) -> bool:
    try:
        return key == version(key[0], os.stat(key[0]))
    except OSError:
        return False


def _write_kept() -> None:
    if not _kept or not _new:
        return
    rows = [[*key, *found] for key, found in _hashes.items() if _current(key)]
    write_atomic(_kept[0], json.dumps(rows))


class ContentChecker(FileChangedChecker):
    """file_dep state = sha256 of the content; mtime and size are never trusted."""

    def check_modified(self, file_path: str, file_stat: os.stat_result, state: str) -> bool:
        return content_sha256(file_path, file_stat) != state

    def get_state(self, dep: str, current_state: str | None) -> str:
        return content_sha256(dep)


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
        return {t: _present_sha256(t) for t in targets}

    def __call__(self, task: Task, values: dict) -> bool:
        saved = values.get(self.KEY)
        return saved is not None and saved == self.hashes(task.targets)
