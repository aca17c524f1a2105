"""`doit bench shape=<set>`: our kernels against cuBLAS and torch on the same problems.

GPU only (hslm_ptx.pipeline.bench.device.require_gpu stops with one line without one). Per
kernel and shape, every implementation (hslm_ptx.pipeline.bench.baselines) is
1. launched once on a buffer set whose output holds poison, and checked against the
   exact integer reference (float baselines within
   :data:`hslm_ptx.pipeline.bench.record.TOLERANCE`), so a wrong implementation is never
   counted as a fast one;
2. sized and timed (hslm_ptx.pipeline.bench.timing): rotated buffer sets past L2, back-to-back
   launches on one stream, then the same launches replayed from a CUDA graph.
Every "ours" row runs before any baseline, so a run cut short loses baselines first. A
baseline times a (product, shape) once, the dense int8 GEMM that every configuration of
the product (a family: forward, dX, dW, each in several CTA tiles) computes on that
shape, and its rows are shared by those configurations (:func:`plan_rows`).
Whatever fails on the way (a library refusing a shape, the driver refusing our PTX,
a failed graph capture) becomes that row's error; the run goes on.

The record is rewritten (atomically) after every row, marked ``complete: false``, so a
run that a time limit kills still leaves a valid record of the rows it finished; with a
budget (``--budget-s``) the rows it has no time for are recorded as not run, and the
tables are written before the limit. A sticky CUDA error (a kernel fault: the
process's CUDA context is lost, every later call would fail) ends that row; the rows
left run in a fresh process that resumes from the record.
"""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np

from hslm_ptx.runtime.backends import load_function
from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.kernel.spec import Dims, KernelSpec
from hslm_ptx.pipeline.core.artifacts import read_model, write_model
from hslm_ptx.pipeline.core.files import rel, sha256_file
from hslm_ptx.pipeline.core.errors import UserError
from hslm_ptx.pipeline.bench.baselines import (Case, Problem, case_cublas_f16, case_cublas_f32, case_cublas_int8,
                                               case_ours, case_torch_bf16, case_torch_int_mm, exact_product,
                                               gemm_problem, make_problem)
from hslm_ptx.pipeline.core.cli import OneLineParser, run_cli
from hslm_ptx.pipeline.bench.device import is_sticky, load_torch, probe_device, require_gpu
from hslm_ptx.pipeline.bench.record import (BASELINES, IMPLS, BenchReport, Check, Device, Method, Row, load_predictions,
                                            summarize, with_predictions)
from hslm_ptx.pipeline.bench.report import markdown, output_paths, write_outputs
from hslm_ptx.pipeline.bench.timing import calls_per_sample, estimate_us, sets_needed, time_graph, time_stream
from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.config import BENCH_DIR, ROOT, ptx_path
from hslm_ptx.pipeline.core.models import Shape
from hslm_ptx.pipeline.core.shapes import select_sets
from hslm_ptx.pipeline.core.errors import one_line

DEFAULT_METHOD = Method(warmup=10, repeats=100, target_sample_us=200.0, l2_multiple=2.0)
CEILING_N = 8192
MAX_FRESH_PROCESSES = 8  # sticky errors after which the rows left are recorded as not run
# the kernels whose output is the int8 GEMM the baselines compute (the rescaled kernels'
# float epilogue has no such baseline)
GEMM_KERNELS: tuple[str, ...] = tuple(k for k, spec in KERNELS.items() if spec.gemm_form is not None)


class NotRun(Exception):
    """An implementation that cannot run here (torch missing, R over a kernel's bound)."""


def row_error(exc: BaseException) -> str:
    """The row's error: a NotRun's reason as is, anything else with its type named."""
    return str(exc) if isinstance(exc, NotRun) else one_line(exc)[:300]


def bench_case(cp: Any, torch: Any, p: Problem, impl: str, build: Callable[[], Case],
               m: Method, l2_bytes: int) -> Row:
    """Check, then time one implementation; any failure becomes the row's error, not a crash."""
    base = dict(kernel=p.kernel, shape=p.shape.name, R=p.dims.R, K=p.dims.K, N=p.dims.N,
                impl=impl, gemm=p.gemm)
    try:
        case = build()
        case.sets = [case.make_set()]
        case.launch(case.sets[0])  # the checked launch: its output started as poison
        cp.cuda.Device().synchronize()
        tol = case.tolerance
        check = Check.of(case.result(case.sets[0]), p.ref.astype(np.float64 if tol else np.int64), tol)
        set_bytes = sum(v.nbytes for v in case.sets[0].values() if hasattr(v, "nbytes"))
        n_sets = sets_needed(set_bytes, l2_bytes, m.l2_multiple)
        case.sets += [case.make_set() for _ in range(n_sets - 1)]
        calls = calls_per_sample(estimate_us(cp, case), n_sets, m.target_sample_us)
        stream = time_stream(case, calls, m)
    except Exception as exc:  # a library refusing a shape is a result, not a crash
        return Row(**base, error=row_error(exc), not_run=isinstance(exc, NotRun))
    graph, graph_error = None, None
    try:
        graph = time_graph(cp, torch, case, calls, m)
    except Exception as exc:
        graph_error = row_error(exc)
    return Row(**{**base, "gemm": case.gemm}, note=case.note, buffer_sets=n_sets, stream=stream,
               graph=graph, graph_error=graph_error, check=check)


def measure_ceiling(cp: Any, m: Method, l2_bytes: int, n: int = CEILING_N) -> tuple[float | None, str]:
    """The device's int8 rate as cuBLAS reaches it on a large random n^3 GEMM, in TOPS.

    Run first, so it also brings the clocks up before the kernels are timed; n = 0 skips it.
    """
    if n < 1:
        return None, "not measured (ceiling=0)"
    rng = np.random.default_rng(0)
    A, Bt = (rng.integers(-127, 128, size=(n, n), dtype=np.int8) for _ in range(2))
    p = Problem("ceiling", Shape(name=f"sq{n}", R=n, K=n, N=n), Dims(n, n, n), {}, A, Bt,
                exact_product(cp, A, Bt))
    row = bench_case(cp, None, p, "cublas_int8", lambda: case_cublas_int8(cp, p), m, l2_bytes)
    if not row.ok:
        return None, f"cuBLAS int8 {n}^3 did not give a figure: {row.error or 'wrong result'}"
    return row.gops() / 1e3, (f"measured in this run: cuBLAS int8 gemmEx {n}x{n}x{n} on random "
                              f"data, median of {m.repeats}, output checked exact")


def _refuse(reason: str | None) -> Callable[[], Case]:
    def build() -> Case:
        raise NotRun(reason or "not available")

    return build


def _ours(cp: Any, p: Problem, spec: KernelSpec) -> Callable[[], Case]:
    """Our kernel's case; loading the PTX (the driver's JIT) happens inside the row, so a
    refusal is that row's error."""
    if spec.max_rows is not None and p.dims.R > spec.max_rows:
        return _refuse(f"R={p.dims.R} over the kernel's {spec.max_rows} rows "
                       "(hslm_ptx.arrays.grad_weight splits such R)")
    return lambda: case_ours(cp, p, spec, load_function("gpu", ptx_path(spec.name), spec.name))


def builders(cp: Any, torch: Any, no_torch: str | None, p: Problem,
             spec: KernelSpec) -> dict[str, Callable[[], Case]]:
    """Every implementation of one problem, in table order."""
    def torch_case(make: Callable[[Any, Problem], Case]) -> Callable[[], Case]:
        return (lambda: make(torch, p)) if torch else _refuse(no_torch)

    return {"ours": _ours(cp, p, spec),
            "cublas_int8": lambda: case_cublas_int8(cp, p),
            "cublas_f16": lambda: case_cublas_f16(cp, p),
            "cublas_f32": lambda: case_cublas_f32(cp, p),
            "torch_int_mm": torch_case(case_torch_int_mm),
            "torch_bf16": torch_case(case_torch_bf16)}


def _progress(row: Row) -> str:
    t = f"{row.stream.median_us:9.2f} us" if row.stream else "     -      "
    return f"{row.kernel:15s} {row.shape:18s} {row.impl:13s} {t} {row.disposition}" + \
        (f": {row.error}" if row.error else "")


def _row_without_run(spec: KernelSpec, shape: Shape, impl: str, why: str, not_run: bool = True) -> Row:
    """A row that was not timed, with its reason; its GEMM is the host problem's (no device call)."""
    dims = Dims(shape.R, shape.K, shape.N)
    A, Bt = gemm_problem(spec, spec.make_inputs(dims, np.random.default_rng(0)), dims)
    return Row(kernel=spec.name, shape=shape.name, R=dims.R, K=dims.K, N=dims.N, impl=impl,
               gemm=(A.shape[0], A.shape[1], Bt.shape[0]), error=why, not_run=not_run)


class Job(NamedTuple):
    """One problem to bench: a kernel on a shape, and the implementations to time on it."""

    kernel: str
    shape: Shape
    impls: tuple[str, ...]


def plan_rows(names: tuple[str, ...], shapes: list[Shape]) -> list[Job]:
    """The rows of a run in the order they run: every kernel's "ours" on every shape, then
    each family's baselines on every shape, once, under the family's first kernel named
    (the configurations of a family compute the same int8 GEMM on a shape)."""
    ours = [Job(kernel, shape, ("ours",)) for kernel in names for shape in shapes]
    first = dict.fromkeys(KERNELS[kernel].family_name for kernel in names)
    heads = [next(k for k in names if KERNELS[k].family_name == family) for family in first]
    return ours + [Job(kernel, shape, BASELINES) for kernel in heads for shape in shapes]


def row_count(names: tuple[str, ...] = GEMM_KERNELS, shape_set: str = "hslm") -> int:
    """How many rows a run of ``names`` on ``shape_set`` records."""
    return sum(len(job.impls) for job in plan_rows(names, select_sets((shape_set,))[shape_set]))


class _Run:
    """One bench run's rows and record: rewritten after every row, so a run cut off by a
    time limit or a lost CUDA context leaves a valid record of what it finished."""

    def __init__(self, shape_set: str, paths: list[Path], device: Device, method: Method,
                 ptx: dict[str, str], rows: list[Row], created: str):
        self.shape_set, self.paths, self.device, self.method = shape_set, paths, device, method
        self.ptx, self.rows, self.created = ptx, rows, created
        self.done = {(r.kernel, r.shape, r.impl) for r in rows}

    def report(self, complete: bool, stopped: str | None = None) -> BenchReport:
        return BenchReport(shape_set=self.shape_set, created=self.created, device=self.device,
                           method=self.method, ptx_sha256=self.ptx, rows=self.rows,
                           summary=summarize(self.rows, self.device.peak_int8_tops),
                           complete=complete, stopped=stopped)

    def add(self, row: Row, quietly: bool = False) -> None:
        """One more row; the record is rewritten with it unless ``quietly`` (rows not run,
        added in bulk and written with the next row or the final record)."""
        row = row.model_copy(update={"family": KERNELS[row.kernel].family_name})
        self.rows.append(row)
        self.done.add((row.kernel, row.shape, row.impl))
        if not quietly:
            print(_progress(row), flush=True)
            self.write()

    def write(self) -> None:
        write_model(self.paths[0], self.report(complete=False))


def _check_same_ptx(resume: Path, earlier: BenchReport) -> None:
    """The partial record a fresh process carries on from must have timed the PTX here."""
    changed = [k for k, sha in earlier.ptx_sha256.items() if sha256_file(ptx_path(k)) != sha]
    if changed:
        raise UserError(f"{rel(resume)}: the PTX of {', '.join(changed)} changed since the record "
                        "was started; run the bench again without --resume")


def _fresh_process(resume: Path, model: Path | None, deadline: float | None, fresh: int) -> None:
    """Run ``python -m hslm_ptx.pipeline.bench.run --resume`` for the rows left and wait for it: this
    process's CUDA context is lost, a new process has a new one."""
    cmd = [sys.executable, "-m", "hslm_ptx.pipeline.bench.run", "--resume", str(resume.resolve()), "--fresh", str(fresh),
           "--ptx-dir", str(config.PTX_DIR.resolve())]
    if model:
        cmd += ["--model", str(Path(model).resolve())]
    if deadline is not None:
        cmd += ["--budget-s", f"{max(1.0, deadline - time.monotonic()):.1f}"]
    sys.stdout.flush()
    status = subprocess.run(cmd, cwd=ROOT).returncode
    if status != 0:
        raise UserError(f"the fresh bench process for the rows left exited {status}; "
                        f"{rel(resume)} holds the rows finished so far")


def run_bench(shape_set: str, method: Method = DEFAULT_METHOD, out_dir: Path = BENCH_DIR,
              kernels: tuple[str, ...] | None = None, ceiling_n: int = CEILING_N,
              model: Path | None = None, stem: str | None = None, budget_s: float | None = None,
              resume: Path | None = None, fresh: int = 0) -> list[Path]:
    """Bench every kernel on every shape of ``shape_set``; write JSON, markdown, CSV and PNG
    as ``out_dir``/``stem`` (default: the set's name) .json/.md/.csv/.png.

    ``model``: a prediction file (rows {kernel, shape, predicted_us}) whose figures fill
    the rows' ``model_us`` column. ``budget_s``: no row is started after that many
    seconds; the rest are recorded as not run. ``resume``: a partial record (this run's
    own, after a sticky CUDA error) whose set, method, kernels and finished rows are
    taken over; ``fresh`` counts the processes started so far."""
    deadline = time.monotonic() + budget_s if budget_s is not None else None
    predictions = load_predictions(model) if model else None
    cp = require_gpu()
    names = kernels or GEMM_KERNELS
    earlier = read_model(resume, BenchReport) if resume else None
    if earlier:
        shape_set, method, names = earlier.shape_set, earlier.method, tuple(earlier.ptx_sha256)
        out_dir, stem = resume.parent, resume.stem
    for kernel in names:
        if not ptx_path(kernel).exists():
            raise UserError(f"{rel(ptx_path(kernel))}: missing; run `doit emit` (doit bench does it first)")
    if earlier:
        _check_same_ptx(resume, earlier)
    shapes = select_sets((shape_set,))[shape_set]
    torch, no_torch = load_torch()
    l2 = int(cp.cuda.Device().attributes.get("L2CacheSize", 50 * 2**20))
    paths = output_paths(out_dir, stem or shape_set)
    if earlier:
        run = _Run(shape_set, paths, earlier.device, method, earlier.ptx_sha256, list(earlier.rows),
                   earlier.created)
        print(f"resuming {rel(resume)} in a fresh process: {len(run.rows)} rows done", flush=True)
    else:
        ceiling, ceiling_source = measure_ceiling(cp, method, l2, ceiling_n)
        print(f"int8 ceiling: {ceiling and round(ceiling)} TOPS ({ceiling_source})", flush=True)
        device = probe_device(cp, torch).model_copy(
            update={"ceiling_int8_tops": ceiling, "ceiling_source": ceiling_source})
        run = _Run(shape_set, paths, device, method, {k: sha256_file(ptx_path(k)) for k in names}, [],
                   datetime.now(timezone.utc).isoformat(timespec="seconds"))
    run.write()  # a valid record from the start: a run cut off at once still leaves one
    stopped, unrun = None, 0
    try:
        for job in plan_rows(names, shapes):
            spec, shape = KERNELS[job.kernel], job.shape
            todo = [impl for impl in job.impls if (job.kernel, shape.name, impl) not in run.done]
            if not todo:
                continue
            if stopped is None and deadline is not None and time.monotonic() > deadline:
                stopped = f"the time budget ({budget_s:g} s) ran out: the rows after it were not run"
            if stopped is None and fresh >= MAX_FRESH_PROCESSES:
                stopped = (f"the CUDA context was lost {fresh} times: no more fresh processes; "
                           "the rows after it were not run")
            if stopped:
                for impl in todo:
                    run.add(_row_without_run(spec, shape, impl, f"not run: {stopped}"), quietly=True)
                unrun += len(todo)
                continue
            try:
                p = make_problem(cp, spec, shape)
                made = builders(cp, torch, no_torch, p, spec)
            except Exception as exc:  # the reference's device product failed
                made, failure = None, exc
            for impl in todo:
                if made is None:
                    row = _row_without_run(spec, shape, impl, "the problem could not be made: "
                                           f"{row_error(failure)}", not_run=False)
                else:
                    row = bench_case(cp, torch, p, impl, made[impl], method, l2)
                run.add(row)
                if is_sticky(row.error):
                    print(f"sticky CUDA error in {row.kernel} {row.shape} {row.impl}: this process's "
                          "CUDA context is lost; the rows left run in a fresh process", flush=True)
                    _fresh_process(paths[0], model, deadline, fresh + 1)
                    return [path for path in paths if path.exists()]
    except KeyboardInterrupt:  # SIGTERM (a time limit) or Ctrl-C: keep what was measured
        stopped = f"interrupted after {len(run.rows)} rows"
        write_outputs(_with(run.report(complete=False, stopped=stopped), predictions), run.paths[0].parent,
                      run.paths[0].stem)
        print(f"{stopped}: wrote {rel(run.paths[0])} and its tables", flush=True)
        raise
    if unrun:
        print(f"{unrun} rows not run: {stopped}", flush=True)
    try:  # clocks read after the timed loops, while they are still up
        run.device = probe_device(cp, torch).model_copy(
            update={"ceiling_int8_tops": run.device.ceiling_int8_tops,
                    "ceiling_source": run.device.ceiling_source})
    except Exception as exc:  # the record keeps the device as read at the start
        print(f"device not read again after the loops ({row_error(exc)}); keeping the first reading")
    report = _with(run.report(complete=True, stopped=stopped), predictions)
    written = write_outputs(report, paths[0].parent, paths[0].stem)
    table = markdown(report)
    print(table[table.index("## summary"):])
    for path in written:
        print(f"wrote {rel(path)}")
    return written


def _with(report: BenchReport, predictions: list | None) -> BenchReport:
    return with_predictions(report, predictions) if predictions is not None else report


def parser() -> OneLineParser:
    p = OneLineParser(prog="python -m hslm_ptx.pipeline.bench.run",
                      description="Time every kernel on a shape set against cuBLAS and torch (GPU only); "
                                  "the record is rewritten after every row.")
    p.add_argument("set", nargs="?", default="hslm", help="the shape set (shapes.yaml; default hslm)")
    p.add_argument("predictions", nargs="?", type=Path, help="the same as --model")
    p.add_argument("--model", type=Path, help="a prediction file (`doit model` writes it): model_us per row")
    p.add_argument("--out", type=Path, default=BENCH_DIR, help=f"folder for the outputs (default {rel(BENCH_DIR)})")
    p.add_argument("--stem", help="the outputs' file name without suffix (default: the set's name)")
    p.add_argument("--ceiling", type=int, default=CEILING_N,
                   help=f"n of the n^3 cuBLAS int8 ceiling run, 0 skips it (default {CEILING_N})")
    p.add_argument("--budget-s", type=float, help="start no row after this many seconds; the rest are not run")
    p.add_argument("--kernels", help="comma-separated kernel names (default: every int8 GEMM kernel)")
    p.add_argument("--resume", type=Path, help="carry on from this partial record (what a fresh process "
                                               "after a sticky CUDA error is given)")
    p.add_argument("--ptx-dir", type=Path, help=f"read the kernels' PTX from here (default {rel(config.PTX_DIR)}; "
                                                "a cluster's bench job: the driver's PTX)")
    p.add_argument("--fresh", type=int, default=0, help=argparse.SUPPRESS)
    return p


def _main(args: list[str]) -> int:
    opts = parser().parse_args(args)
    if opts.ceiling < 0:
        raise UserError(f"--ceiling {opts.ceiling}: expected 0 (skip) or the n of the n^3 run, e.g. {CEILING_N}")
    if opts.budget_s is not None and opts.budget_s <= 0:
        raise UserError(f"--budget-s {opts.budget_s:g}: expected a number of seconds > 0")
    kernels = tuple(opts.kernels.split(",")) if opts.kernels else None
    unknown = [k for k in kernels or () if k not in GEMM_KERNELS]
    if unknown:
        raise UserError(f"--kernels: '{unknown[0]}' is not an int8 GEMM kernel; known: {', '.join(GEMM_KERNELS)}")
    if opts.ptx_dir is not None:
        if not opts.ptx_dir.is_dir():
            raise UserError(f"--ptx-dir {opts.ptx_dir}: no such folder")
        config.PTX_DIR = opts.ptx_dir  # this process is the bench's alone
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a time limit's TERM: keep what was measured
    try:
        run_bench(opts.set, out_dir=opts.out, kernels=kernels, ceiling_n=opts.ceiling,
                  model=opts.model or opts.predictions, stem=opts.stem, budget_s=opts.budget_s,
                  resume=opts.resume, fresh=opts.fresh)
    except KeyboardInterrupt:
        print("error: bench interrupted; the record holds the rows finished", file=sys.stderr)
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m hslm_ptx.pipeline.bench.run [SET] [--out DIR] [--budget-s S] ...``: the bench without doit."""
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
