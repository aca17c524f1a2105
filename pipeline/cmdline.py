"""The command-line variables (``doit verify shape=smoke backend=emulator``), in one table.

doit passes any ``name=value`` through, so a misspelt one (``shap=smoke``) would be
silently ignored and the default used; :func:`startup` refuses it before any task
is created, listing the known ones. :func:`var` reads a known variable or its default.
"""
from __future__ import annotations

import signal
import sys
from typing import NamedTuple

from doit import doit_cmd, get_var

from pipeline import config
from pipeline.artifacts import sweep_temp_files


class Variable(NamedTuple):
    default: str
    values: str  # allowed values, for the help text and the error line
    used_by: str


VARIABLES: dict[str, Variable] = {
    "shape": Variable(",".join(config.VERIFY_SETS), "<set,...> (shapes.yaml)",
                      "verify, seal, gate, report"),
    "backend": Variable(config.DEFAULT_BACKEND, "|".join(config.BACKENDS), "verify, seal, gate"),
    "force": Variable("0", "0|1", "verify: 1 runs emulator cells over the work budget"),
    "gpu": Variable("h200", "h200|rtx4090|a100 (pipeline/gpus.yaml)", "model"),
    "model": Variable("", "<artifacts/model/SET-GPU.predictions.json>",
                      "bench: the model's prediction beside each row (`doit model` writes the file)"),
    "ceiling": Variable("8192", "<n>", "bench: n of the n^3 cuBLAS int8 ceiling run, 0 skips it"),
    "accept_new": Variable("0", "0|1", "bless: 1 raises the cap by the new not-passing entries"),
    "format": Variable("text", "text|json", "report"),
    "accept_slower": Variable("", "<reason> (pipeline.ledger.REASONS)",
                              "bless: records a SASS per IMMA rise with that reason"),
}


def var(name: str, default: str | None = None) -> str:
    """The value of a known variable; when not given, ``default`` or the table's default."""
    fallback = VARIABLES[name].default if default is None else default
    return get_var(name, fallback) or fallback


def describe(*names: str) -> str:
    """'shape=<...> (default ...), ...' for a task's help line (doit shows one line)."""
    return ", ".join(f"{n}={VARIABLES[n].values} (default {VARIABLES[n].default or 'none'})" for n in names)


def unknown_variables() -> list[str]:
    # doit keeps the parsed name=value pairs in this module global; it has no public accessor
    given = doit_cmd._CMDLINE_VARS or {}
    return sorted(set(given) - set(VARIABLES))


def startup() -> None:
    """What every doit run does first: refuse unknown variables (exit 3, doit's status for a
    bad command line), sweep temp files of killed runs, and turn SIGTERM into
    KeyboardInterrupt: doit saves its database only when a run ends (all its backends
    keep it in memory until then), and it does so on an exception, so the cells that
    finished before a Ctrl-C or a SIGTERM are not redone. A SIGKILL still loses them."""
    unknown = unknown_variables()
    if unknown:
        print(f"error: unknown variable '{unknown[0]}'; known: {', '.join(VARIABLES)}", file=sys.stderr)
        raise SystemExit(3)
    sweep_temp_files()
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
    print(f"interrupted ({value or 'Ctrl-C'}); the tasks that finished are saved and will not re-run",
          file=sys.stderr)
    sys.exit(130)
