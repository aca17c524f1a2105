"""Files the pipeline writes and hashes, with nothing but the standard library.

Writes go to ``.<name>.tmp-<pid>`` in the same folder and are renamed into place: an
interrupted run leaves the old file or the new one, never half. A run killed before
its rename leaves that temp file; :func:`sweep_temp_files` (run when doit starts and
by ``doit clean``) removes those whose process is gone. Files get the mode the umask
gives (0644 under umask 022), or keep the mode of the file they replace.

Every doit command starts through this module (the checker hashes, the start sweeps),
so it imports no YAML or pydantic: the records' reading and writing is
hslm_ptx.pipeline.core.artifacts.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterable

from hslm_ptx.pipeline.core.config import ROOT, WRITTEN_DIRS


TEMP = re.compile(r"^\..+\.tmp-(\d+)$")
# A file version changed within this long of being read is not trusted by its stamp: the
# clock that stamps ctime is coarse, so a second write in the same tick keeps it (git's
# "racy clean" rule). Far above any file system's timestamp tick.
RACY_NS = 2_000_000_000

Version = tuple[str, int, int, int, int]


def version(path: str, st: os.stat_result) -> Version:
    """A file's version as git's index keeps it: path, inode, size, mtime and ctime. ctime
    moves with every write, ``utime`` and rename, and no one can set it."""
    return (path, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path | str) -> str:
    with open(path, "rb") as handle:
        return sha256_bytes(handle.read())


def temp_path(path: Path) -> Path:
    """Where :func:`write_atomic` stages ``path``: ``.<name>.tmp-<pid>`` beside it."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` via a temp file + rename in the same directory.

    The temp file is created with mode 0666 less the umask (what ``open()`` gives), or
    with the mode of the file it replaces, so a rewrite never changes a file's mode."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode() if isinstance(data, str) else data
    tmp = temp_path(path)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = None
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            if mode is not None:
                os.fchmod(handle.fileno(), mode)
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def alive(pid: int) -> bool:
    """True when process ``pid`` exists (it may belong to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_temp_files(folders: Iterable[Path] = WRITTEN_DIRS, everything: bool = False) -> list[Path]:
    """Remove the temp files of runs that are gone (all of them with ``everything``);
    returns what was removed."""
    removed = []
    for folder in folders:
        for top, _, names in os.walk(folder):  # every doit start walks these: os.walk, not Path.rglob
            for match in filter(None, map(TEMP.match, names)):
                path = Path(top, match.string)
                if path.is_file() and (everything or not alive(int(match.group(1)))):
                    path.unlink(missing_ok=True)
                    removed.append(path)
    return removed


SCRATCH = re.compile(r"^(ptxas|sass)-(\d+)-[^/]+$")  # <tool>-<pid>-<random>, see scratch_folder


def scratch_folder(tool: str) -> tempfile.TemporaryDirectory:
    """A context-managed scratch folder for one tool run, named ``<tool>-<pid>-...`` in the
    system temp folder: removed when the ``with`` ends, and, when a SIGKILL skips that, by
    :func:`sweep_scratch_folders` once the pid is gone."""
    return tempfile.TemporaryDirectory(prefix=f"{tool}-{os.getpid()}-")


def sweep_scratch_folders(folder: Path | None = None) -> list[Path]:
    """Remove the scratch folders (:func:`scratch_folder`) of processes that are gone."""
    removed = []
    root = Path(folder or tempfile.gettempdir())
    try:
        candidates = list(root.iterdir())
    except OSError:
        return removed
    for path in candidates:
        match = SCRATCH.match(path.name)
        if match and path.is_dir() and not path.is_symlink() and not alive(int(match.group(2))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def rel(path: Path) -> str:
    """Path relative to the project root when it is inside it (for messages)."""
    for absolute in (Path(path).absolute(), Path(path).resolve()):  # a link is named as it is, first
        try:
            return str(absolute.relative_to(ROOT))
        except ValueError:
            continue
    return str(path)


def remove_folder(path: Path) -> None:
    """A `doit clean` action: the folder and everything in it (what a task wrote for any
    of its variables, not only the current ones)."""
    shutil.rmtree(path, ignore_errors=True)
