"""The bench tools' command lines: a user's mistake is one line on stderr and exit 2.

Each ``python -m hslm_ptx.pipeline.bench.run*`` entry point parses its arguments with
:class:`OneLineParser` (argparse: ``--help`` prints the usage and exits 0, so it is
never taken for a file name) and runs its body through :func:`run_cli`.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, NoReturn

from hslm_ptx.pipeline.core.errors import ArtifactError, UserError


class OneLineParser(argparse.ArgumentParser):
    """argparse whose refusal is one ``error: ...`` line (argparse's own is the usage
    block and then the error) and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message}; see {self.prog} --help\n")


def run_cli(body: Callable[[list[str]], int], argv: list[str] | None = None) -> int:
    """``body(args)``'s exit status; a :class:`UserError` or :class:`ArtifactError` it
    raises is printed as ``error: ...`` (one line, no traceback) and gives 2; argparse's
    exit (``--help``: 0, a bad argument: 2) is returned as that status."""
    try:
        return body(sys.argv[1:] if argv is None else argv)
    except (UserError, ArtifactError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # argparse: --help or a refused argument, already printed
        return exc.code if isinstance(exc.code, int) else 2
