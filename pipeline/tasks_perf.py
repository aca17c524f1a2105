"""The performance instruments in the doit graph: ``doit sass`` and ``doit model``.

- ``doit sass`` (``sass:<kernel>``): cubin per arch (ptxas), SASS (nvdisasm), loop
  counts -> artifacts/sass/<kernel>.json (+ the listings as <kernel>.<arch>.sass);
  re-runs when the PTX bytes, the archs or a tool version change; ``sass:summary``
  prints the per-IMMA table.
- ``doit model shape=<set> gpu=<name>`` (default hslm, h200): the first-order
  performance model (pipeline.perf_model) -> artifacts/model/<set>-<gpu>.json and a
  table; every figure is a MODEL prediction, never a measurement.
"""
from __future__ import annotations

from typing import Any, Iterator

from doit.tools import config_changed

from kernels.registry import KERNELS
from pipeline import config
from pipeline.artifacts import ARTIFACTS, UserError, read_model, write_model
from pipeline.ptxas import PtxasError, find_ptxas, ptxas_version
from pipeline.sass import SassReport, find_nvdisasm, sass_report, tool_version
from pipeline.tasks_build import one_line_failure, table

SASS_DIR = ARTIFACTS / "sass"


def sass_json(kernel: str):
    return SASS_DIR / f"{kernel}.json"


def _tool_versions() -> dict[str, Any]:
    """What a SASS record depends on besides the PTX; a missing tool is not an error here
    (creating tasks must work without one; the action says what to install)."""
    found: dict[str, Any] = {"archs": list(config.ARCHS)}
    for name, finder, version in (("ptxas", find_ptxas, ptxas_version), ("nvdisasm", find_nvdisasm, tool_version)):
        try:
            found[name] = version(finder())
        except (UserError, PtxasError):
            found[name] = None
    return found


SASS_COLUMNS = ("kernel", "arch", "loop", "fast SASS/IMMA", "fast LSU/IMMA", "tail SASS/IMMA",
                "tail LSU/IMMA", "fast instr", "tail instr", "IMMA/trip")


def sass_rows(report: SassReport) -> list[list[Any]]:
    def figure(value: float | None) -> Any:
        return "-" if value is None else value

    rows = []
    for a in report.archs:
        fast, tail = a.fast, a.tail
        rows.append([report.kernel, a.arch, a.steady_loop or "-",
                     figure(fast and fast.per_imma), figure(fast and fast.lsu_per_imma),
                     figure(tail and tail.per_imma), figure(tail and tail.lsu_per_imma),
                     figure(fast and fast.instructions), figure(tail and tail.instructions),
                     figure((fast or tail) and (fast or tail).imma)])
    return rows


@one_line_failure
def _sass(kernel: str) -> None:
    report = sass_report(kernel, kernel, config.ptx_path(kernel), config.ARCHS, SASS_DIR)
    write_model(sass_json(kernel), report)
    print(f"{kernel}: SASS counted on {', '.join(config.ARCHS)} "
          f"(ptxas {report.ptxas_version}, nvdisasm {report.nvdisasm_version})")


@one_line_failure
def _sass_summary(kernels: list[str]) -> None:
    rows = [row for k in kernels for row in sass_rows(read_model(sass_json(k), SassReport))]
    print(table(SASS_COLUMNS, rows))
    print("per warp per loop trip; NOPs left out; fast = predicate-free body, tail = predicated body")


def task_sass() -> Iterator[dict]:
    """Count each kernel's SASS per loop trip (fast and tail bodies) per arch; print the table."""
    versions = _tool_versions()
    for kernel in KERNELS:
        yield {
            "name": kernel,
            "actions": [(_sass, [kernel])],
            "file_dep": [str(config.ptx_path(kernel))],
            "targets": [str(sass_json(kernel))] + [str(SASS_DIR / f"{kernel}.{a}.sass") for a in config.ARCHS],
            "uptodate": [config_changed(versions)],
            "clean": True,
        }
    yield {
        "name": "summary",
        "doc": "print the SASS-per-IMMA table from artifacts/sass/*.json",
        "actions": [(_sass_summary, [list(KERNELS)])],
        "file_dep": [str(sass_json(k)) for k in KERNELS],
        "verbosity": 2,
    }
