"""One doit command line's variables (``doit verify shape=smoke backend=emulator``), read once.

:data:`VARIABLES` is every variable a stage reads: its default, the values it takes, who
reads it. :func:`current` reads them once a process, with doit's public ``get_var``, into
a frozen :class:`Request`; the stage creators take that record, and a stage asks it for
Shape records (:meth:`Request.sets`), never for a name it re-parses. A test builds its
own with :func:`parse` instead of patching a global.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Sequence

from doit import get_var

from hslm_ptx.pipeline.core import config

if TYPE_CHECKING:
    from hslm_ptx.pipeline.core.models import Shape


class Variable(NamedTuple):
    default: str
    values: str  # allowed values, for the help text and the error line
    used_by: str
    choices: tuple[str, ...] = ()  # the only values accepted, checked before any task exists


VARIABLES: dict[str, Variable] = {
    "shape": Variable(",".join(config.VERIFY_SETS), "<set,...> (shapes.yaml)",
                      "verify, seal, gate, report; layer (default hslm)"),
    "backend": Variable(config.DEFAULT_BACKEND, "|".join(config.BACKENDS), "verify, seal, gate"),
    "force": Variable("0", "0|1", "verify: 1 runs emulator cells over the work budget", ("0", "1")),
    "gpu": Variable("h200", "h200|h100|rtx4090|a100|a800_pcie (hslm_ptx/cost/devices.json)", "model"),
    "model": Variable("", "<artifacts/model/SET-GPU.predictions.json>",
                      "bench: the model's prediction beside each row (`doit model` writes the file)"),
    "ceiling": Variable("8192", "<n>", "bench: n of the n^3 cuBLAS int8 ceiling run, 0 skips it"),
    "accept_new": Variable("0", "0|1", "bless: 1 raises the cap by the new not-passing entries", ("0", "1")),
    "format": Variable("text", "text|json", "report"),
    "accept_slower": Variable("", "<reason> (hslm_ptx.pipeline.ratchet.ledger.REASONS)",
                              "bless: records a SASS per IMMA rise with that reason"),
    "base": Variable("", "<git ref>", "gate: every loosening of the ledger against that commit, one line each"),
    "executor": Variable("local", "local|ray", "verify, sass, bench: where cells run (docs/cluster.md)", ("local", "ray")),
    "address": Variable("", "<host:port>|auto", "executor=ray: the cluster (default $RAY_ADDRESS, else auto)"),
    "devices": Variable("", "<sm_XY,...>", "executor=ray: the archs GPU cells ask for (verify: one; bench: one run each)"),
}


def describe(*names: str) -> str:
    """'shape=<...> (default ...), ...' for a task's help line (doit shows one line)."""
    return ", ".join(f"{n}={VARIABLES[n].values} (default {VARIABLES[n].default or 'none'})" for n in names)


def bad_value(name: str, value: str) -> str | None:
    """Why ``name=value`` is refused (None when it is accepted): an empty value would
    silently mean the default, and a variable with fixed choices takes only those."""
    known = VARIABLES[name]
    default = f"the default ({known.default})" if known.default else "none"
    if not value.strip():
        return f"error: {name}= is empty; give {known.values}, or leave {name} out for {default}"
    if known.choices and value not in known.choices:
        return f"error: {name}={value}: expected one of {', '.join(known.choices)}"
    return None


def given_variables(argv: Sequence[str]) -> dict[str, str]:
    """The ``name=value`` pairs of a doit command line, by doit's own rule
    (doit.doit_cmd.DoitMain.process_args: an argument that does not start with ``-`` and
    holds ``=``; the last of a repeated name wins). doit keeps the names only in a private
    global, so the names given (an unknown one included) are read here."""
    pairs = (arg.split("=", 1) for arg in argv[1:] if not arg.startswith("-") and "=" in arg)
    return {name: value for name, value in pairs}


class Request(NamedTuple):
    """The known variables given on one command line (name, value), in table order; what was
    not given reads as its table default, or as the default a stage passes."""

    given: tuple[tuple[str, str], ...] = ()

    def value(self, name: str, default: str | None = None) -> str:
        """``name``'s value; when not given, ``default`` or the table's default."""
        fallback = VARIABLES[name].default if default is None else default
        return dict(self.given).get(name) or fallback

    def flag(self, name: str) -> bool:
        """A 0|1 variable as a bool."""
        return self.value(name) == "1"

    def set_names(self, default: str | None = None) -> tuple[str, ...]:
        """``shape=`` as set names (order kept, repeats dropped); :class:`UserError` on an empty list."""
        from hslm_ptx.pipeline.core.shapes import parse_set_names

        return parse_set_names(self.value("shape", default))

    def sets(self, default: str | None = None) -> "dict[str, tuple[Shape, ...]]":
        """``shape=``'s sets as Shape records from shapes.yaml (:class:`UserError` on an unknown name)."""
        from hslm_ptx.pipeline.core.shapes import select_sets

        return select_sets(self.set_names(default))

    def one_set(self, default: str) -> str:
        """``shape=`` for a stage that runs one set at a time (bench, model); a list is refused."""
        from hslm_ptx.pipeline.core.errors import UserError

        names = self.set_names(default)
        if len(names) > 1:
            raise UserError(f"shape={self.value('shape', default)}: this stage takes one set; "
                            f"run it once per set (shape={names[0]}, then shape={names[1]}, ...)")
        self.sets(default)  # an unknown name is refused here, before any task exists
        return names[0]


def parse(argv: Sequence[str]) -> Request:
    """The request of a command line (a test's, or one written out)."""
    given = given_variables(argv)
    return Request(tuple((name, given[name]) for name in VARIABLES if name in given))


def current() -> Request:
    """This command line's request, read with doit's public ``get_var`` (doit has parsed
    the line before it calls a task creator); each creator reads it once and hands it on."""
    return Request(tuple((name, value) for name in VARIABLES if (value := get_var(name)) is not None))
