"""The performance instruments in the doit graph: ``doit sass`` and ``doit model``.

- ``doit sass`` (``sass:<kernel>``): cubin per arch (ptxas), SASS (nvdisasm), loop
  counts -> artifacts/sass/<kernel>.json (+ the listings as <kernel>.<arch>.sass);
  re-runs when the PTX bytes, hslm_ptx/pipeline/stages/sass.py, the archs or a tool version change; ``sass:summary``
  prints the per-IMMA table.
- ``doit model shape=<set> gpu=<name>`` (default hslm, h200): the cost model
  (hslm_ptx/cost/model.py, through hslm_ptx.pipeline.stages.perf_model): ``model:counts`` writes
  hslm_ptx/cost/loop_counts.json from the cubins' stall counts, ``model:run`` the phases per
  kernel x shape and every launch of the layer step (the set's shapes and the bench's
  large layer, eager and graph-replayed, beside torch bf16 nn.Linear) ->
  artifacts/model/<set>-<gpu>.json and the tables, ``model:calibrate``
  the table beside published measurements ->
  docs/calibration.md, ``model:docs`` the tables the documentation quotes ->
  docs/model-tables.md; every figure is a MODEL prediction, never a measurement.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from doit.tools import config_changed

from hslm_ptx.cost import model as cost
from hslm_ptx.step import launches as layer_step
from hslm_ptx.catalog.registry import KERNELS, forget_scores
from hslm_ptx.kernel.spec import KernelSpec
from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.stages import layer_count
from hslm_ptx.pipeline.stages import perf_model
from hslm_ptx.pipeline.stages import sass
from hslm_ptx.pipeline.core.artifacts import read_model, write_model
from hslm_ptx.pipeline.core.files import rel, remove_folder, write_atomic
from hslm_ptx.pipeline.bench.record import Prediction as BenchPrediction  # the bench file's row; perf_model's is ConfigPrediction
from hslm_ptx.pipeline.core.request import Request, current, describe
from hslm_ptx.pipeline.stages.build_steps import run_executor
from hslm_ptx.pipeline.core.config import MODEL_DIR, SASS_DIR, sass_json
from hslm_ptx.pipeline.core.errors import UserError
from hslm_ptx.pipeline.core.models import PtxasReport
from hslm_ptx.pipeline.stages.ptxas import PtxasError, find_ptxas, ptxas_version
from hslm_ptx.pipeline.stages.report import table
from hslm_ptx.pipeline.stages.sass import SassReport, disassembler_version, find_nvdisasm, sass_report
from hslm_ptx.pipeline.core.shapes import select_sets
from hslm_ptx.pipeline.core.sources import source_files
from hslm_ptx.pipeline.stages.taskkit import failing_task, fails_on_user_error, one_line_failure
from hslm_ptx.pipeline.tasks.build import verify_task_name
from hslm_ptx.pipeline.stages.model_build import build_model, gemm_kernels


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
def _sass(kernel: str, request: Request) -> None:
    report = sass_report(kernel, kernel, config.ptx_path(kernel), config.ARCHS, SASS_DIR,
                         bodies=KERNELS[kernel].is_gemm, runner=run_executor(request))
    write_model(sass_json(kernel), report)
    print(f"{kernel}: SASS counted on {', '.join(config.ARCHS)} "
          f"(ptxas {report.ptxas_version}, nvdisasm {report.nvdisasm_version})")


ELEMENT_COLUMNS = ("kernel", "arch", "loops", "SASS", "elements", "SASS/element")


def element_rows(report: SassReport, spec: KernelSpec) -> list[list[Any]]:
    """A non-GEMM kernel's cost: the whole function's SASS (each loop body counted once,
    NOPs left out) per element one warp handles in one pass of that code
    (``KernelSpec.trip_elements``: a trip of each loop, or the whole run of a loop-free
    kernel)."""
    per = spec.trip_elements
    return [[report.kernel, a.arch, len(a.loops), a.instructions, per or "-",
             round(a.instructions / per, 4) if per else "-"] for a in report.archs]


@one_line_failure
def _sass_summary(kernels: list[str]) -> None:
    gemms = [k for k in kernels if KERNELS[k].is_gemm]
    if gemms:
        rows = [row for k in gemms for row in sass_rows(read_model(sass_json(k), SassReport))]
        print(table(SASS_COLUMNS, rows))
        print("per warp per loop trip; NOPs left out; fast = steady-state body, tail = predicated tail body "
              "(- : the loop has one body)")
    others = [row for k in kernels if k not in gemms
              for row in element_rows(read_model(sass_json(k), SassReport), KERNELS[k])]
    if others:
        print(table(ELEMENT_COLUMNS, others))
        print("kernels that are not GEMMs: the function's SASS per warp, each loop body once, and per element "
              "of one pass (a trip of each loop)")


def task_sass() -> Iterator[dict]:
    """Count each kernel's SASS per loop trip (fast and tail bodies) per arch; print the table."""
    versions, request = _tool_versions(), current()
    for kernel in KERNELS:
        yield {
            "name": kernel,
            "actions": [(_sass, [kernel, request])],
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


task_sass.__doc__ = f"Count each kernel's SASS per loop trip per arch and print the table: {describe('executor', 'address')}"


# ---- model ---------------------------------------------------------------------------

DEFAULT_MODEL_SET = "hslm"
MODEL_COLUMNS = ("", "kernel", "pick", "shape", "CTAs", "waves", "clk/instr", "prologue", "chunks", "outside",
                 "epilogue", "drain", "serial", "L2", "DRAM", "reds", "device us", "per call us", "limiter",
                 "ref config", "ref device us", "ref per call us", "ours/ref per call", "ours/ref device [interval]",
                 "ours/ref per call [interval]", "verdict")
CALIBRATION_COLUMNS = ("point", "device", "what", "metric", "published", "MODEL", "error %", "config", "limiter",
                       "fit")
CALIBRATION_DOC = config.ROOT / "docs" / "calibration.md"


def model_paths(shape_set: str, gpu_name: str) -> tuple[Path, Path]:
    """The model report and the prediction rows ({kernel, shape, predicted_us}) a bench reads."""
    stem = MODEL_DIR / f"{shape_set}-{gpu_name}"
    return stem.with_suffix(".json"), stem.with_name(stem.name + ".predictions.json")


@one_line_failure
def _counts(kernels: list[str]) -> None:
    records = {k: perf_model.kernel_counts(read_model(sass_json(k), SassReport), config.ptx_path(k), k)
               for k in kernels}
    occupancy = {k: perf_model.occupancy_record(read_model(config.ptxas_json(k), PtxasReport))
                 for k in perf_model.scored_kernels()}
    write_atomic(perf_model.COUNTS_FILE,
                 json.dumps({"note": perf_model.COUNTS_NOTE, "kernels": records, "occupancy": occupancy},
                            indent=1, sort_keys=True) + "\n")
    forget_scores()  # the tile rule and model:run in this same doit run read the new file
    cpi = [r["archs"]["sm_90"]["fast"]["issue_clocks"] / r["archs"]["sm_90"]["fast"]["instructions"]
           for r in records.values() if "sm_90" in r["archs"]]
    print(f"{rel(perf_model.COUNTS_FILE)}: {len(records)} kernels; sm_90 fast bodies "
          f"{min(cpi):.2f}-{max(cpi):.2f} stall clocks per instruction")


LAYER_COLUMNS = ("", "layer step", "R", "K", "N", "launches", "GEMMs device us", "others device us", "eager us",
                 "torch bf16 eager us", "eager ours/torch [interval]", "graph us", "torch bf16 graph us",
                 "graph ours/torch [interval]")


def layer_table(steps: list[perf_model.LayerStepRow]) -> list[str]:
    """The layer-step rows, how they were timed, and the targets' lines."""
    rows = [["MODEL", s.shape, s.R, s.K, s.N, len(s.launches), s.gemm_device_us, s.other_device_us, s.eager_us,
             s.torch_eager_us, interval(s.eager_interval), s.graph_us, s.torch_graph_us, interval(s.graph_interval)]
            for s in steps]
    return [table(LAYER_COLUMNS, rows),
            "MODEL layer step = every launch `doit layer` records (X's quantization with W's |W| sums, W's "
            "preparation, dY's quantization, the fused GEMMs): a GEMM on the phase model of the int32 GEMM whose loop it runs, any other "
            "kernel as a memory-bound pass over its buffers' bytes at DRAM's reachable rate + the fixed cost; "
            "torch = bf16 nn.Linear's 3 GEMMs (best library-like configuration each) and, with a bias, its "
            "bias-gradient reduction (a memory-bound pass over dY); "
            "eager adds the host's launch cost per kernel, graph once",
            *(f"MODEL {s.shape} launches, device us: "
              + ", ".join(f"{x.kernel} {x.device_us:.2f} ({x.limiter})" for x in s.launches) for s in steps),
            *perf_model.layer_targets(steps)]


def interval(ratio: tuple[float, float, float] | None) -> str:
    """A ratio's interval as the tables print it: nominal [low-high]; '-' for a row without one."""
    return "-" if ratio is None else str(cost.Interval(*ratio))


def model_table(report: perf_model.ModelReport) -> str:
    rows = [["MODEL", r.kernel, "*" if r.rule_pick else "", r.shape, r.ctas, r.waves, r.clocks_per_instruction,
             *(r.ours.phases[p] for p in perf_model.PHASES), r.ours.bounds["serial"], r.ours.bounds["l2"],
             r.ours.bounds["dram"], r.ours.bounds["reds"], r.ours.device_us, r.ours.per_call_us, r.ours.limiter,
             r.reference.config, r.reference.device_us, r.reference.per_call_us,
             round(r.ours.per_call_us / r.reference.per_call_us, 3), interval(r.device_ratio),
             interval(r.per_call_ratio), r.verdict or "-"]
            for r in report.rows]
    sources = sorted({r.l1_source for r in report.rows})
    picks = [r for r in report.rows if r.rule_pick]
    verdicts = {v: sum(r.verdict == v for r in picks) for v in ("ahead", "level", "behind")}
    per_call = [cost.Interval(*r.per_call_ratio).verdict() for r in picks if r.per_call_ratio]
    lines = [
        f"MODEL (predictions, not measurements): {report.gpu_name}, {report.arch}, shape set {report.shape_set}; "
        "phases and bounds in us; device us = fixed cost + the largest bound; per call adds the host's launch",
        table(MODEL_COLUMNS, rows),
        f"MODEL L1 wavefronts from: {'; '.join(sources)}",
        "MODEL ref = the best per call of the library-like configurations (hslm_ptx.cost.model.dense_configs: 64x64, "
        "128x64, 128x128 (+128x256 cluster on sm_90), each alone, split-K 2/4/8 with a reduction kernel, "
        "stream-K) on the same phase model",
        f"MODEL pick (*) = the configuration the tile rule runs (hslm_ptx.catalog.registry.choose); device time, over the "
        f"ranges of hslm_ptx/cost/devices.json: {verdicts['ahead']} of {len(picks)} picked cells at or below the best "
        f"reference over the whole interval, {verdicts['level']} level (the interval holds 1), {verdicts['behind']} "
        f"behind; per call: {per_call.count('ahead')} at or below, {per_call.count('level')} level, "
        f"{per_call.count('behind')} behind",
    ]
    if report.layer_steps:
        lines += layer_table(report.layer_steps)
    return "\n".join(lines)


@one_line_failure
def _model(shape_set: str, gpu_name: str) -> None:
    report = build_model(shape_set, gpu_name)
    full, predictions = model_paths(shape_set, gpu_name)
    write_model(full, report)
    rows = [BenchPrediction(kernel=r.kernel, shape=r.shape, predicted_us=r.ours.device_us,
                            per_call_us=r.ours.per_call_us).model_dump() for r in report.rows]
    write_atomic(predictions, json.dumps(rows, indent=2) + "\n")
    print(model_table(report))


def calibration_table(rows: list[perf_model.CalibrationRow]) -> str:
    return table(CALIBRATION_COLUMNS, [[r.name, r.device, r.what, r.metric, r.published, r.predicted, r.error_pct,
                                        r.config, r.limiter, "fit" if r.fit else "held-out"] for r in rows])


def calibration_markdown(rows: list[perf_model.CalibrationRow]) -> str:
    """docs/calibration.md: the table with each point's source and, where it misses, why."""
    def cell(text: object) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    head = ["# Calibration of the cost model (MODEL beside published measurements)", "",
            f"Generated by `doit model:calibrate` from `{rel(perf_model.CALIBRATION_FILE)}` and "
            f"`{rel(perf_model.DEVICES_FILE)}`; do not edit by hand. MODEL = the prediction of `hslm_ptx/cost/model.py` "
            "(the best library-like configuration on the phase model); error = MODEL / published - 1. "
            "fit = the model was built against the point (its error was seen while its structure or a constant "
            "was chosen); held-out = scored only after the model was set (each point's `why` in the yaml). "
            "The closing lines give the held-out error first.", "",
            "| point | device | what was timed | metric | published | MODEL | error % | config | limiter | fit "
            "| source | note |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    body = [f"| {cell(r.name)} | {r.device} | {cell(r.what)} | {r.metric} | {r.published} | {r.predicted} | "
            f"{r.error_pct} | {cell(r.config)} | {r.limiter} | {'fit' if r.fit else 'held-out'} | {cell(r.source)} | "
            f"{cell(r.note)} |" for r in rows]
    return "\n".join(head + body + ["", *(f"{line}  " for line in perf_model.calibration_summary(rows)), ""])


@one_line_failure
def _model_docs() -> None:
    from hslm_ptx.pipeline.stages import model_doc  # it builds its reports with build_model, above

    write_atomic(model_doc.MODEL_DOC, model_doc.markdown(model_doc.build_reports(build_model)))
    print(f"{rel(model_doc.MODEL_DOC)}: {len(model_doc.DOC_MODELS)} MODEL sections written")


@one_line_failure
def _calibrate() -> None:
    rows = perf_model.calibration_rows(perf_model.load_calibration(), perf_model.load_assumptions().devices)
    write_atomic(CALIBRATION_DOC, calibration_markdown(rows))
    print("\n".join(perf_model.calibration_summary(rows)))  # the verdict first, then the table it comes from
    print("MODEL beside published measurements (hslm_ptx/cost/calibration.yaml; sources in docs/calibration.md)")
    print(calibration_table(rows))
    print("\n".join(perf_model.calibration_summary(rows)))


MODEL_SUBTASKS = ("counts", "run", "docs", "calibrate")


@fails_on_user_error
def task_model() -> Iterator[dict]:
    """Cost-model MODEL of each GEMM kernel x shape (shape=<set>, default hslm; gpu=h200|h100|rtx4090|a100|a800_pcie);
    model:counts writes hslm_ptx/cost/loop_counts.json, model:calibrate the calibration table."""
    request = current()
    gpu_name = request.value("gpu")
    try:  # a bad devices.json, an unknown gpu or set: every subtask fails with its one line (each name exists)
        perf_model.gpu(perf_model.load_assumptions(), gpu_name)
        shape_set = request.one_set(DEFAULT_MODEL_SET)
        shapes = request.sets(DEFAULT_MODEL_SET)[shape_set]
    except (UserError, cost.CostInputError) as exc:
        for name in MODEL_SUBTASKS:
            yield failing_task(str(exc), name=name)
        return
    try:  # unreadable loop counts: model:counts still rewrites them; what reads them fails in one line
        cost.read_counts_file()
        unreadable = ""
    except cost.CostInputError as exc:
        unreadable = str(exc)
    gemms = gemm_kernels()
    reports = [config.verify_json(k, shape_set, s.name) for k in gemms for s in shapes]
    yield {
        "name": "counts",
        "doc": "ptxas's stall counts of each GEMM loop body -> hslm_ptx/cost/loop_counts.json (read by hslm_ptx/cost/model.py)",
        "actions": [(_counts, [gemms])],
        "file_dep": [str(p) for k in gemms for p in (sass_json(k), config.ptx_path(k))]
        + [str(config.ptxas_json(k)) for k in perf_model.scored_kernels()] + [perf_model.__file__],
        "targets": [str(perf_model.COUNTS_FILE)],
        "verbosity": 2,
    }
    if unreadable:
        yield failing_task(unreadable, name="run")
        yield failing_task(unreadable, name="docs")
        yield calibrate_task()
        return
    yield {
        "name": "run",
        "doc": task_model.__doc__,
        "actions": [(_model, [shape_set, gpu_name])],
        "file_dep": [str(p) for k in gemms for p in (sass_json(k), config.ptxas_json(k), config.ptx_path(k))]
        + [str(perf_model.DEVICES_FILE), str(perf_model.COUNTS_FILE), str(config.SHAPES_FILE), perf_model.__file__,
           cost.__file__]
        # the kernels' sources hold the tile rule that marks each row's pick; the layer step
        # launches every kernel (its ptxas figures give a fused GEMM's occupancy)
        + sorted({str(p) for spec in KERNELS.values() for p in source_files(spec)})
        + [layer_step.__file__, layer_count.__file__, __file__]  # and this module's table and layer rows
        + [str(config.ptxas_json(k)) for k, spec in KERNELS.items() if spec.tile and not spec.is_gemm]
        + [str(p) for p in reports if p.is_file()],
        "targets": [str(p) for p in model_paths(shape_set, gpu_name)],
        "clean": [(remove_folder, [MODEL_DIR])],
        "uptodate": [config_changed({"shape": shape_set, "gpu": gpu_name})],
        "verbosity": 2,
    }
    yield {
        "name": "docs",
        "doc": "docs/model-tables.md: the tables the documentation quotes (hslm and large on the H200, hslm on the "
               "RTX 4090), from the artifacts; the gate compares it",
        "actions": [_model_docs],
        "task_dep": [f"sass:{k}" for k in gemms] + [f"ptxas:{k}" for k in KERNELS]
        + [verify_task_name(k) for k in gemms],
        "uptodate": [False],  # cheap, and its inputs are every input of the model
        "verbosity": 2,
    }
    yield calibrate_task()


def calibrate_task() -> dict:
    """``model:calibrate``: reads hslm_ptx/cost/calibration.yaml and hslm_ptx/cost/devices.json only."""
    return {
        "name": "calibrate",
        "doc": "the cost model beside published measurements: 'held-out: <n> points, median |error| <x>%, max <y>%' "
               "(and the int8 M <= 512 and fit lines), then the table",
        "actions": [(_calibrate, [])],
        "file_dep": [str(perf_model.CALIBRATION_FILE), str(perf_model.DEVICES_FILE), cost.__file__,
                     perf_model.__file__],
        "targets": [str(CALIBRATION_DOC)],
        "uptodate": [False],  # it prints the table each time it is asked for
        "verbosity": 2,
    }
