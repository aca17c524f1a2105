"""The bench tools' command lines: a user's mistake is one line on stderr and exit 2."""
from __future__ import annotations

import sys
from typing import Callable

from pipeline.errors import ArtifactError, UserError


def run_cli(body: Callable[[list[str]], int], argv: list[str] | None = None) -> int:
    """``body(args)``'s exit status; a :class:`UserError` or :class:`ArtifactError` it
    raises is printed as ``error: ...`` (one line, no traceback) and gives 2."""
    try:
        return body(sys.argv[1:] if argv is None else argv)
    except (UserError, ArtifactError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
