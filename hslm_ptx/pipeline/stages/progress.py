"""One live line for a run's cells: how many are done of the total, and the time left.

The reporter (hslm_ptx.pipeline.tasks.reporter) knows the total before any task runs (the units
of the cell tasks the run selected: a kernel's verify task is one unit per cell) and
counts an up-to-date task's units as done; a running task counts each of its cells as
it finishes (:meth:`Progress.advance`), from whichever doit thread runs it.

On a terminal the line is redrawn in place on stderr, and the run's stdout goes through
:class:`LineGuard`, which takes the line away before a line of output and draws it again
after, so output and the live line never share a line. Elsewhere (a log, CI) a plain
line is printed every :data:`LOG_EVERY_S` seconds.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

DRAW_EVERY_S = 0.2
LOG_EVERY_S = 30.0
CLEAR = "\r\x1b[K"


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


class Progress:
    """Cells done of the total; the time left from the rate of the cells run so far."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.reset()

    def reset(self, stream: TextIO | None = None, live: bool = False) -> None:
        with self._lock:
            self.total = self.done = self.ran = 0
            self.started: float | None = None  # when the first cell was sent to run
            self.stream, self.live = stream, live
            self.shown = False
            self.last_draw = time.perf_counter()  # the first line after one interval

    def expect(self, units: int) -> None:
        with self._lock:
            self.total += units

    def skip(self, units: int = 1) -> None:
        """``units`` cells found up to date."""
        with self._lock:
            self.done += units

    def start(self) -> None:
        """Cells are about to run: the clock for the time left starts at the first."""
        with self._lock:
            if self.started is None:
                self.started = time.perf_counter()

    def advance(self, units: int = 1) -> None:
        """``units`` cells ran."""
        with self._lock:
            self.done += units
            self.ran += units
            self.start()
            self.draw()

    def left_s(self) -> float | None:
        """Seconds the cells not done should take at the rate so far (None before one ran)."""
        if not self.ran or self.started is None:
            return None
        rate = self.ran / max(time.perf_counter() - self.started, 1e-9)
        return max(self.total - self.done, 0) / rate

    def line(self) -> str:
        left = self.left_s()
        return f"{self.done}/{self.total} cells done" + (f", about {duration(left)} left" if left is not None else "")

    def draw(self, force: bool = False) -> None:
        with self._lock:
            if self.stream is None or not self.total:
                return
            now = time.perf_counter()
            if not force and now - self.last_draw < (DRAW_EVERY_S if self.live else LOG_EVERY_S):
                return
            self.last_draw = now
            if self.live:
                self.stream.write(CLEAR + self.line())
                self.shown = True
            else:
                self.stream.write(self.line() + "\n")
            self.stream.flush()

    def clear(self) -> None:
        with self._lock:
            if self.shown:
                self.stream.write(CLEAR)
                self.stream.flush()
                self.shown = False

    def finish(self) -> None:
        self.clear()
        with self._lock:
            self.stream = None


class LineGuard:
    """A stdout that clears the live line before output and redraws it after each full line."""

    def __init__(self, out: TextIO, progress: Progress) -> None:
        self.out, self.progress = out, progress

    def write(self, text: str) -> int:
        with self.progress._lock:
            self.progress.clear()
            written = self.out.write(text)
            self.out.flush()
            if text.endswith("\n"):
                self.progress.draw(force=True)
            return written

    def __getattr__(self, name: str):
        return getattr(self.out, name)


PROGRESS = Progress()  # the run's: the reporter sets it up, the verify tasks advance it


def attach(total: int, stdout: TextIO | None = None, stderr: TextIO | None = None) -> TextIO:
    """Start the run's line for ``total`` cells; the stdout the run should write to."""
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    live = stderr.isatty() and stdout.isatty()
    PROGRESS.reset(stderr if total else None, live)
    PROGRESS.expect(total)
    return LineGuard(stdout, PROGRESS) if live and total else stdout
