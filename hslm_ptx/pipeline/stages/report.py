"""Tables and one-line summaries of the stages' evidence, for the console.

The doit reporter (hslm_ptx.pipeline.tasks.reporter) prints them at the end of a run; the judge
tasks print the failing lines. Everything here reads result JSONs and writes text.
Within one doit run a record is parsed once (:func:`cached_record`): the judge's
uptodate reads every cell's report, and the reporter's line reads them again.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence, TypeVar

from pydantic import BaseModel

from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.artifacts import read_model, read_present
from hslm_ptx.pipeline.core.files import version
from hslm_ptx.pipeline.core.models import PtxasReport, VerifyReport

VerifyCell = tuple[str, str, str]  # (kernel, set, shape)
M = TypeVar("M", bound=BaseModel)
_records: dict[tuple, BaseModel] = {}

PTXAS_COLUMNS = ("kernel", "arch", "regs", "spill st", "spill ld", "smem B", "stack B", "verdict")
VERIFY_COLUMNS = ("kernel", "set", "shape", "R", "K", "N", "backend", "mismatches", "rows",
                  "max|diff|", "seconds", "verdict")


def cached_record(path: Path, model_type: type[M], required: bool = False) -> M | None:
    """:func:`hslm_ptx.pipeline.core.artifacts.read_present` (``required``: read_model), parsed once per
    file version in this process (hslm_ptx.pipeline.core.files.version: path, inode, size, mtime,
    ctime), so a rewrite (write_model renames a new file in place) is read again."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return read_model(path, model_type) if required else None  # read_model says it is missing
    key = (model_type, version(str(path), st))
    found = _records.get(key)
    if found is None:
        found = _records[key] = read_model(path, model_type)
    return found  # type: ignore[return-value]


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table; number columns right-aligned (floats to 2 places), text left."""
    def text(value: Any) -> str:
        return f"{value:.2f}" if isinstance(value, float) else str(value)

    cells = [list(headers)] + [[text(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [all(isinstance(row[i], (int, float)) for row in rows) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric)).rstrip()
        for row in cells
    )


def ptxas_rows(report: PtxasReport) -> list[list[Any]]:
    rows: list[list[Any]] = [[report.kernel, a.arch, a.registers, a.spill_stores, a.spill_loads, a.shared_bytes,
                              a.stack_bytes, "; ".join(a.problems) or "ok"] for a in report.archs]
    return rows + [[report.kernel, arch, "-", "-", "-", "-", "-", error] for arch, error in report.errors.items()]


def ptxas_problems(report: PtxasReport) -> list[str]:
    """One line per arch that is not within budget, spill-free and assembled."""
    return ([f"{report.kernel} {a.arch}: {p}" for a in report.archs for p in a.problems]
            + [f"{report.kernel} {arch}: {error}" for arch, error in report.errors.items()])


def ptxas_table(kernels: Sequence[str]) -> str:
    reports = [cached_record(config.ptxas_json(k), PtxasReport, True) for k in kernels]
    return table(PTXAS_COLUMNS, [row for r in reports for row in ptxas_rows(r)])


def verify_row(r: VerifyReport) -> list[Any]:
    return [r.kernel, r.shape_set, r.shape, r.R, r.K, r.N, r.backend, r.mismatches, r.rows_checked,
            r.max_abs_diff, r.seconds, "ok" if r.passed else (r.error or "MISMATCH")]


def verify_reports(cells: Sequence[VerifyCell]) -> list[VerifyReport]:
    return [cached_record(config.verify_json(*cell), VerifyReport, True) for cell in cells]


def verify_table(cells: Sequence[VerifyCell]) -> str:
    return table(VERIFY_COLUMNS, [verify_row(r) for r in verify_reports(cells)])


def verify_line(reports: Sequence[VerifyReport], ran: int) -> str:
    """'48 cells on emulator (9 ran): all exact' / '... 2 FAILED'."""
    failed = sum(not r.passed for r in reports)
    backends = ", ".join(sorted({r.backend for r in reports})) or "-"
    fresh = "all up to date" if ran == 0 else f"{ran} ran"
    return f"verify: {len(reports)} cells on {backends} ({fresh}): {f'{failed} FAILED' if failed else 'all exact'}"


def ptxas_line(reports: Sequence[PtxasReport], ran: int) -> str:
    bad = sum(not r.ok for r in reports)
    fresh = "all up to date" if ran == 0 else f"{ran} ran"
    verdict = f"{bad} over budget, spilling or refused" if bad else f"all within budget on {', '.join(config.ARCHS)}"
    return f"ptxas: {len(reports)} kernels ({fresh}): {verdict}"


def last_run(kernels: Sequence[str], cells: Sequence[VerifyCell], fmt: str) -> str:
    """The last ptxas and verify results on disk (and the bench tables when there are any),
    as the console tables or, with ``fmt="json"``, as one JSON object of the records."""
    ptxas = [r for k in kernels if (r := read_present(config.ptxas_json(k), PtxasReport))]
    verify = [r for c in cells if (r := read_present(config.verify_json(*c), VerifyReport))]
    bench = sorted(config.BENCH_DIR.glob("*.md")) if config.BENCH_DIR.is_dir() else []
    if fmt == "json":
        return json.dumps({"ptxas": [r.model_dump(mode="json") for r in ptxas],
                           "verify": [r.model_dump(mode="json", exclude={"launch_stats"}) for r in verify],
                           "bench": [p.name for p in bench]}, indent=2)
    parts = [table(PTXAS_COLUMNS, [row for r in ptxas for row in ptxas_rows(r)]) if ptxas else "ptxas: no reports",
             table(VERIFY_COLUMNS, [verify_row(r) for r in verify]) if verify else "verify: no reports"]
    return "\n\n".join(parts + [p.read_text().rstrip() for p in bench] + [summary(kernels, cells, ptxas, verify, bench)])


def summary(kernels: Sequence[str], cells: Sequence[VerifyCell], ptxas: Sequence[PtxasReport],
            verify: Sequence[VerifyReport], bench: Sequence[Path]) -> str:
    """The report's last lines, so a long report need not be read to its end: what the
    tables above add up to, and how many of the asked kernels and cells have no report."""
    bad = [r.kernel for r in ptxas if not r.ok]
    failed = [f"{r.kernel} {r.shape_set}/{r.shape}" for r in verify if not r.passed]
    backends = ", ".join(sorted({r.backend for r in verify})) or "-"
    lines = [
        f"ptxas: {len(ptxas)} of {len(kernels)} kernels reported; "
        + (f"{len(bad)} over budget, spilling or refused (first: {bad[0]})" if bad
           else f"all within budget on {', '.join(config.ARCHS)}" if ptxas else "nothing to judge"),
        f"verify: {len(verify)} of {len(cells)} cells reported, on {backends}; "
        + (f"{len(failed)} not exact (first: {failed[0]})" if failed else "all exact" if verify else "nothing to judge"),
        f"bench: {len(bench)} table{'s' if len(bench) != 1 else ''}",
    ]
    missing = len(kernels) - len(ptxas) + len(cells) - len(verify)
    if missing:
        lines.append(f"{missing} asked for have no report: run doit verify (or doit gate) first")
    return "summary\n" + "\n".join(f"  {line}" for line in lines)


def print_to_pipe(text: str) -> bool:
    """Print ``text``; False when the reader went away first (``doit report | head``).

    A closed pipe is the reader's choice, not an error: stdout is pointed at /dev/null so
    nothing later in the process (doit's own output, the interpreter's last flush) raises
    again, and the caller ends normally."""
    try:
        print(text, flush=True)
        return True
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return False
