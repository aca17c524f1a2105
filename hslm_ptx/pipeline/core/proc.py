"""Child processes (ptxas, the kernel tests' pytest) that end with the run that started them.

Each child gets its own process group, so the whole tree (pytest and anything it
starts) is ended as one. Ctrl-C, a SIGTERM to doit, or any error while waiting ends
the group (SIGTERM, then SIGKILL after a grace period) before the exception goes on;
on Linux the child is also sent SIGTERM by the kernel if this process dies outright
(PR_SET_PDEATHSIG), which no handler can catch.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from typing import Iterator, Sequence

GRACE_SECONDS = 5.0
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux for SIGTERM when the parent dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def end_group(proc: subprocess.Popen) -> None:
    """SIGTERM the child's process group, SIGKILL it if still there after the grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=GRACE_SECONDS)
            return
        except subprocess.TimeoutExpired:
            continue


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """While inside, SIGTERM raises KeyboardInterrupt (so cleanup runs), main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(cmd: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
    """:func:`subprocess.run` with text capture, the child in its own process group,
    ended with this process (see the module docstring)."""
    preexec = _die_with_parent if sys.platform.startswith("linux") else None
    with sigterm_raises():
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, preexec_fn=preexec, **kwargs)
        try:
            out, err = proc.communicate()
        except BaseException:
            end_group(proc)
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
