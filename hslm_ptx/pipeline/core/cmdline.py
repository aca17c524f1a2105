"""What every doit run checks before a task exists: its variables, its database, and
how an interrupted run ends.

doit passes any ``name=value`` through, so a misspelt one (``shap=smoke``) would be
silently ignored and the default used; :func:`startup` refuses it, listing the known
ones (hslm_ptx.pipeline.core.request.VARIABLES), and any empty or out-of-choice value.
"""
from __future__ import annotations

import json
import signal
import sqlite3
import sys
from pathlib import Path

from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.checker import keep_hashes
from hslm_ptx.pipeline.core.files import sweep_scratch_folders, sweep_temp_files
from hslm_ptx.pipeline.core.request import VARIABLES, bad_value, given_variables


DATABASE = ".doit.db"  # DOIT_CONFIG["dep_file"] in dodo.py (doit clean removes it: hslm_ptx.pipeline.stages.taskkit)


def option(argv: list[str], name: str) -> str | None:
    """The value of ``--name X`` or ``--name=X`` on a doit command line, else None."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    return None


def database_file(argv: list[str]) -> Path | None:
    """The sqlite3 database this doit command line uses (``--db-file``'s, else
    :data:`DATABASE`); None when ``--backend`` picks another format."""
    if option(argv, "--backend") not in (None, "sqlite3"):
        return None
    return Path(option(argv, "--db-file") or DATABASE)


def task_data_problem(data: object) -> str | None:
    """Why one decoded ``task_data`` is not what doit reads back (None: it is). doit calls
    dict methods on the row and on its saved values (``_values_:``) and makes a set of its
    file deps (``deps:``, doit.dependency), so anything else would be its traceback."""
    if not isinstance(data, dict):
        return f"task_data is {type(data).__name__} JSON, not an object"
    values, deps = data.get("_values_:"), data.get("deps:")
    if values is not None and not isinstance(values, dict):
        return f"task_data field '_values_:' is {type(values).__name__} JSON, not an object"
    if deps is not None and not (isinstance(deps, list) and all(isinstance(d, str) for d in deps)):
        return "task_data field 'deps:' is not a list of file names"
    return None


def database_problem(path: Path) -> str | None:
    """Why doit's sqlite3 database at ``path`` cannot be used (None: absent or sound).
    doit would stop on it with its own traceback; every row's JSON is decoded here as
    doit decodes it and checked as doit uses it (:func:`task_data_problem`), so a truncated
    or overwritten file is one line before doit opens it."""
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_file():
        return "it is not a regular file"
    try:
        conn = sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True, timeout=30)
        try:
            if conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                return "sqlite's quick_check does not pass"
            table = conn.execute("select name from sqlite_master where type='table' and name='doit'").fetchone()
            # as doit's converter sees it: the column's text (sqlite stores '5' as a number)
            rows = conn.execute("select task_id, cast(task_data as blob) from doit") if table else ()
            for task_id, data in rows:
                if problem := task_data_problem(json.loads(bytes(data or b"").decode("utf-8"))):
                    return f"task {task_id!r}: {problem}"
        finally:
            conn.close()
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):  # another run is writing it: doit waits too
            return None
        return " ".join(str(exc).split()) or type(exc).__name__
    except (sqlite3.Error, ValueError, TypeError) as exc:
        return " ".join(str(exc).split()) or type(exc).__name__
    return None


def startup(argv: list[str] | None = None) -> None:
    """What every doit run does first: refuse unknown variables (exit 3, doit's status for a
    bad command line), sweep temp files of killed runs, start from the file hashes the last
    run kept (hslm_ptx.pipeline.core.checker.keep_hashes), and turn SIGTERM into
    KeyboardInterrupt: doit saves its database only when a run ends (all its backends
    keep it in memory until then), and it does so on an exception, so the cells that
    finished before a Ctrl-C or a SIGTERM are not redone. A SIGKILL still loses them."""
    argv = sys.argv if argv is None else argv
    given = given_variables(argv)
    unknown = sorted(set(given) - set(VARIABLES))
    if unknown:
        print(f"error: unknown variable '{unknown[0]}'; known: {', '.join(VARIABLES)}", file=sys.stderr)
        raise SystemExit(3)
    for name, value in given.items():
        if problem := bad_value(name, value):
            print(problem, file=sys.stderr)
            raise SystemExit(3)
    database = database_file(argv)
    if database is not None and (problem := database_problem(database)):
        print(f"error: the doit database {database} is damaged ({problem}); remove it (rm {database}) "
              "and run again: every task then re-runs once", file=sys.stderr)
        raise SystemExit(2)
    sweep_temp_files()
    sweep_scratch_folders()
    keep_hashes(config.HASHES_MEMO)
    signal.signal(signal.SIGTERM, _interrupt)
    sys.excepthook = _interrupted


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _interrupted(kind, value, trace) -> None:
    """An interrupted run ends with one line (doit saved the tasks that finished), not a
    traceback; any other uncaught error keeps Python's report."""
    if not issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, trace)
        return
    print(f"interrupted ({str(value) or 'Ctrl-C'}); the tasks that finished are saved and will not re-run",
          file=sys.stderr)
    sys.exit(130)
