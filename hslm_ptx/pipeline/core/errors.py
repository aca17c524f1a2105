"""Every error the pipeline raises on purpose, in one place, and the one-line form of any error.

Each is caught at a task boundary (hslm_ptx.pipeline.stages.taskkit.one_line_failure) or by the
gate's CLI and printed as one line, no traceback. The kernels' own errors
(hslm_ptx.runtime.launch.LaunchError, hslm_ptx.formats.ternary.PackError, hslm_ptx.emu's EmulatorError)
stay in the kernel side of hslm_ptx, which never imports hslm_ptx.pipeline.
"""
from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix (bad shapes.yaml, unknown set or backend, no ptxas).

    Its str() is one line naming the file or option and what to do; tasks print it
    as is, with no traceback, and fail.
    """


class ArtifactError(Exception):
    """An artifact or result file is missing, unreadable, or does not match its hash."""


class PtxasError(Exception):
    """ptxas refused the PTX, or its output could not be read; str() is one line."""


class SealRefused(UserError):
    """The evidence does not support a seal; nothing was written."""


class BlessRefused(UserError):
    """bless would break a rule; nothing was written."""


def one_line(exc: BaseException, limit: int | None = None) -> str:
    """An exception as one line, 'EmulatorError: ...', whitespace collapsed, cut to
    ``limit`` characters when given."""
    text = f"{type(exc).__name__}: {' '.join(str(exc).split())}".rstrip(": ")
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."
