"""The performance instruments in the doit graph: ``doit sass`` and ``doit model``.

- ``doit sass`` (``sass:<kernel>``): cubin per arch (ptxas), SASS (nvdisasm), loop
  counts -> artifacts/sass/<kernel>.json (+ the listings as <kernel>.<arch>.sass);
  re-runs when the PTX bytes, pipeline/sass.py, the archs or a tool version change; ``sass:summary``
  prints the per-IMMA table.
- ``doit model shape=<set> gpu=<name>`` (default hslm, h200): the first-order
  performance model (pipeline.perf_model) -> artifacts/model/<set>-<gpu>.json and a
  table; every figure is a MODEL prediction, never a measurement.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from doit.tools import config_changed

from kernels.registry import KERNELS
from kernels.spec import KernelSpec
from pipeline import config, perf_model, sass
from pipeline.artifacts import read_model, rel, remove_folder, write_atomic, write_model
from pipeline.bench_record import Prediction as BenchPrediction
from pipeline.cmdline import var
from pipeline.config import MODEL_DIR, SASS_DIR, sass_json
from pipeline.errors import UserError
from pipeline.models import MemoryAccess, PtxasReport, Shape
from pipeline.ptxas import PtxasError, find_ptxas, ptxas_version
from pipeline.report import table
from pipeline.sass import SassReport, disassembler_version, find_nvdisasm, sass_report
from pipeline.shapes import select_sets
from pipeline.sources import source_files
from pipeline.tasks_build import fails_on_user_error, one_line_failure
from pipeline.verify import work


def _tool_versions() -> dict[str, Any]:
    """What a SASS record depends on besides the PTX; a missing tool is not an error here
    (creating tasks must work without one; the action says what to install)."""
    found: dict[str, Any] = {"archs": list(config.ARCHS)}
    for name, finder, version in (("ptxas", find_ptxas, ptxas_version), ("nvdisasm", find_nvdisasm, disassembler_version)):
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
    print("per warp per loop trip; NOPs left out; fast = steady-state body, tail = predicated tail body (- : the loop has one body)")


def task_sass() -> Iterator[dict]:
    """Count each kernel's SASS per loop trip (fast and tail bodies) per arch; print the table."""
    versions = _tool_versions()
    for kernel in KERNELS:
        yield {
            "name": kernel,
            "actions": [(_sass, [kernel])],
            "file_dep": [str(config.ptx_path(kernel)), sass.__file__],
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


# ---- model ---------------------------------------------------------------------------

DEFAULT_MODEL_SET = "hslm"
MODEL_COLUMNS = ("", "kernel", "pick", "shape", "CTAs", "waves", "issue", "tensor", "L1", "latency", "L2", "DRAM",
                 "device us", "per call us", "limiter", "% int8 peak", "ref device us", "ref limiter",
                 "ref % peak")


def model_paths(shape_set: str, gpu_name: str) -> tuple[Path, Path]:
    """The model report and the prediction rows ({kernel, shape, predicted_us}) a bench reads."""
    stem = MODEL_DIR / f"{shape_set}-{gpu_name}"
    return stem.with_suffix(".json"), stem.with_name(stem.name + ".predictions.json")


def memory_counts(spec: KernelSpec, shape_set: str, shape: Shape, ptx: str) -> tuple[list[MemoryAccess] | None, str]:
    """Emulator memory rows for one cell: the verify report's, else a fresh emulator run's,
    unless the shape is over the emulator's work budget (then none: the SASS ideal stands in)."""
    report = config.verify_json(spec.name, shape_set, shape.name)
    rows = perf_model.memory_rows_from_report(report)
    if rows is not None:
        return rows, f"emulator ({rel(report)})"
    if work(shape) > config.EMULATOR_WORK_BUDGET:
        return None, "SASS ideal (over the emulator's work budget)"
    return perf_model.memory_rows_from_emulator(spec, shape, ptx), "emulator (run by the model)"


def build_model(shape_set: str, gpu_name: str) -> perf_model.ModelReport:
    assumptions = perf_model.load_assumptions()
    g = perf_model.gpu(assumptions, gpu_name)
    shapes = select_sets((shape_set,))[shape_set]
    rows, tools = [], {}
    for name, spec in KERNELS.items():
        counts = read_model(sass_json(name), SassReport)
        ptxas = next((a for a in read_model(config.ptxas_json(name), PtxasReport).archs if a.arch == g.arch), None)
        if ptxas is None:
            raise UserError(f"{rel(config.ptxas_json(name))}: no figures for {g.arch} ({gpu_name}); "
                            f"add it to ARCHS in pipeline/config.py")
        tools[name] = f"ptxas {counts.ptxas_version} / nvdisasm {counts.nvdisasm_version}"
        ptx = config.ptx_path(name).read_text()
        for shape in shapes:
            memory, source = memory_counts(spec, shape_set, shape, ptx)
            rows.append(perf_model.model_row(spec, shape, g, assumptions.reference, counts.arch(g.arch), ptxas,
                                             memory, source))
    return perf_model.ModelReport(shape_set=shape_set, gpu=gpu_name, gpu_name=g.name, arch=g.arch,
                                  assumptions_sha256=perf_model.assumptions_sha256(), sass_tools=tools, rows=rows)


def model_table(report: perf_model.ModelReport) -> str:
    rows = [["MODEL", r.kernel, "*" if r.rule_pick else "", r.shape, r.ctas, r.waves,
             *(r.ours.bounds[b] for b in perf_model.BOUNDS), r.ours.device_us, r.ours.per_call_us, r.ours.limiter,
             r.ours.pct_int8_peak, r.reference.device_us, r.reference.limiter, r.reference.pct_int8_peak]
            for r in report.rows]
    sources = sorted({r.l1_source for r in report.rows})
    picks = [r for r in report.rows if r.rule_pick]
    at_or_below = sum(r.ours.device_us <= r.reference.device_us for r in picks)
    return "\n".join([
        f"MODEL (predictions, not measurements): {report.gpu_name}, {report.arch}, shape set {report.shape_set}; "
        "bounds in us, device us = the largest",
        table(MODEL_COLUMNS, rows),
        f"MODEL L1 wavefronts from: {'; '.join(sources)}",
        "MODEL ref = CUTLASS 2.x int8 GEMM class, 128x128x64 tile, 3 stages, on the problem padded to its tile",
        f"MODEL pick (*) = the configuration the tile rule runs (kernels.registry.choose); {at_or_below} of "
        f"{len(picks)} picked cells at or below the reference's time",
    ])


@one_line_failure
def _model(shape_set: str, gpu_name: str) -> None:
    report = build_model(shape_set, gpu_name)
    full, predictions = model_paths(shape_set, gpu_name)
    write_model(full, report)
    rows = [BenchPrediction(kernel=r.kernel, shape=r.shape, predicted_us=r.ours.device_us,
                            per_call_us=r.ours.per_call_us).model_dump() for r in report.rows]
    write_atomic(predictions, json.dumps(rows, indent=2) + "\n")
    print(model_table(report))


@fails_on_user_error
def task_model() -> Iterator[dict]:
    """First-order MODEL of device time per kernel x shape (shape=<set>, default hslm; gpu=h200|rtx4090|a100)."""
    shape_set, gpu_name = var("shape", DEFAULT_MODEL_SET), var("gpu")
    perf_model.gpu(perf_model.load_assumptions(), gpu_name)  # an unknown gpu stops here, one line
    shapes = select_sets((shape_set,))[shape_set]
    reports = [config.verify_json(k, shape_set, s.name) for k in KERNELS for s in shapes]
    yield {
        "basename": "model",
        "doc": task_model.__doc__,
        "actions": [(_model, [shape_set, gpu_name])],
        "file_dep": [str(p) for k in KERNELS for p in (sass_json(k), config.ptxas_json(k), config.ptx_path(k))]
        + [str(perf_model.GPUS_FILE), str(config.SHAPES_FILE), perf_model.__file__]
        # the kernels' sources hold the tile rule that marks each row's pick
        + sorted({str(p) for spec in KERNELS.values() for p in source_files(spec)})
        + [str(p) for p in reports if p.is_file()],
        "targets": [str(p) for p in model_paths(shape_set, gpu_name)],
        "clean": [(remove_folder, [MODEL_DIR])],
        "uptodate": [config_changed({"shape": shape_set, "gpu": gpu_name,
                                     "emulator_memory": perf_model.emulator_counts_memory()})],
        "verbosity": 2,
    }
