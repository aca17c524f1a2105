"""A value computed from the project's files, kept across runs until one of those files changes.

Creating the build's tasks means importing every kernel (numpy, pydantic), hashing each
kernel's source closure and each cell's inputs: about a second, on every doit command,
for an answer that only changes when a file does. :func:`remembered` keeps that answer
in a JSON file beside the stamp of every file under the folders it was computed from
(path, inode, size, mtime and ctime, as git's index keeps them) and returns it while the
stamp and the key (command-line variables, environment) are the same.

ctime moves with every write, ``utime`` and rename, and no one can set it, so an edit is
seen whatever it did to the mtime. As in git's "racy clean" rule, a value is not kept
when a file it read changed within :data:`RACY_NS` of the stamp (the clock that stamps
ctime is coarse), nor when a file changed while it was computed: the next run computes
it again. Anything unreadable in the memo is a miss, never an error.

The memo is a cache, read before pydantic is imported: plain JSON, checked field by
field, written atomically.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from hslm_ptx.pipeline.core.config import ROOT
from hslm_ptx.pipeline.core.files import RACY_NS, version, write_atomic

FORMAT = 1


def stamp(folders: Iterable[Path], files: Iterable[Path] = ()) -> list[list[Any]]:
    """[path, inode, size, mtime_ns, ctime_ns] of each file under ``folders`` (no
    ``__pycache__``) and of each of ``files`` ([path] alone when it is missing)."""
    found = []
    for folder in folders:
        for top, dirs, names in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            found += [os.path.join(top, name) for name in names if not name.endswith(".pyc")]
    rows = []
    for path in sorted(found) + [str(p) for p in files]:
        try:
            st = os.stat(path)
        except OSError:
            rows.append([_short(path)])
            continue
        rows.append(list(version(_short(path), st)))
    return rows


def _short(path: str) -> str:
    return os.path.relpath(path, ROOT) if path.startswith(str(ROOT)) else path


def _settled(rows: list[list[Any]], now_ns: int) -> bool:
    return all(len(row) == 1 or row[4] < now_ns - RACY_NS for row in rows)


def remembered(memo: Path, key: dict[str, Any], folders: Iterable[Path], files: Iterable[Path],
               compute: Callable[[], Any]) -> Any:
    """``compute()`` (a JSON value), or its value from ``memo`` when the files and ``key``
    (JSON too) are as they were."""
    folders, files = list(folders), list(files)
    before = stamp(folders, files)
    try:
        kept = json.loads(memo.read_text())
        if kept["format"] == FORMAT and kept["key"] == key and kept["stamp"] == before:
            return kept["value"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    text = json.dumps(compute())
    if before == stamp(folders, files) and _settled(before, time.time_ns()):
        write_atomic(memo, json.dumps({"format": FORMAT, "key": key, "stamp": before, "value": json.loads(text)}))
    return json.loads(text)  # as a kept value reads back: lists, never tuples
