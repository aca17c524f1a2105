"""`doit bench shape=<set>`: our kernels against cuBLAS and torch on the same problems.

GPU only (pipeline.bench_device.require_gpu stops with one line without one). Per
kernel and shape, every implementation (pipeline.bench_baselines) is
1. launched once on a buffer set whose output holds poison, and checked against the
   exact integer reference (float baselines within
   :data:`pipeline.bench_record.TOLERANCE`), so a wrong implementation is never
   counted as a fast one;
2. sized and timed (pipeline.bench_timing): rotated buffer sets past L2, back-to-back
   launches on one stream, then the same launches replayed from a CUDA graph.
Whatever fails on the way (a library refusing a shape, the driver refusing our PTX,
a failed graph capture) becomes that row's error; the run goes on.
"""
from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np

from kernels.backends import load_function
from kernels.registry import KERNELS
from kernels.spec import Dims, KernelSpec
from pipeline.artifacts import rel, sha256_file
from pipeline.errors import UserError
from pipeline.bench_baselines import (Case, Problem, case_cublas_f16, case_cublas_f32,
                                      case_cublas_int8, case_ours, case_torch_bf16,
                                      case_torch_int_mm, exact_product, make_problem)
from pipeline.bench_cli import run_cli
from pipeline.bench_device import load_torch, probe_device, require_gpu
from pipeline.bench_record import (BenchReport, Check, Method, Row, load_predictions, summarize,
                                   with_predictions)
from pipeline.bench_report import markdown, write_outputs
from pipeline.bench_timing import calls_per_sample, estimate_us, sets_needed, time_graph, time_stream
from pipeline.config import BENCH_DIR, ptx_path
from pipeline.models import Shape
from pipeline.shapes import select_sets
from pipeline.verify import one_line

DEFAULT_METHOD = Method(warmup=10, repeats=100, target_sample_us=200.0, l2_multiple=2.0)
CEILING_N = 8192


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
                       "(kernels.ops.grad_weight splits such R)")
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


def run_bench(shape_set: str, method: Method = DEFAULT_METHOD, out_dir: Path = BENCH_DIR,
              kernels: tuple[str, ...] | None = None, ceiling_n: int = CEILING_N,
              model: Path | None = None) -> list[Path]:
    """Bench every kernel on every shape of ``shape_set``; write JSON, markdown, CSV and PNG.

    ``model``: a prediction file (rows {kernel, shape, predicted_us}) whose figures fill
    the rows' ``model_us`` column."""
    predictions = load_predictions(model) if model else None
    cp = require_gpu()
    names = kernels or tuple(KERNELS)
    for kernel in names:
        if not ptx_path(kernel).exists():
            raise UserError(f"{rel(ptx_path(kernel))}: missing; run `doit emit` (doit bench does it first)")
    shapes = select_sets((shape_set,))[shape_set]
    torch, no_torch = load_torch()
    l2 = int(cp.cuda.Device().attributes.get("L2CacheSize", 50 * 2**20))
    ceiling, ceiling_source = measure_ceiling(cp, method, l2, ceiling_n)
    print(f"int8 ceiling: {ceiling and round(ceiling)} TOPS ({ceiling_source})", flush=True)
    rows: list[Row] = []
    for kernel in names:
        spec = KERNELS[kernel]
        for shape in shapes:
            p = make_problem(cp, spec, shape)
            for impl, build in builders(cp, torch, no_torch, p, spec).items():
                rows.append(bench_case(cp, torch, p, impl, build, method, l2))
                print(_progress(rows[-1]), flush=True)
    device = probe_device(cp, torch).model_copy(
        update={"ceiling_int8_tops": ceiling, "ceiling_source": ceiling_source})
    report = BenchReport(
        shape_set=shape_set, created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        device=device, method=method,
        ptx_sha256={k: sha256_file(ptx_path(k)) for k in names},
        rows=rows, summary=summarize(rows, device.peak_int8_tops))
    if predictions is not None:
        report = with_predictions(report, predictions)
    paths = write_outputs(report, out_dir)
    table = markdown(report)
    print(table[table.index("## summary"):])
    for path in paths:
        print(f"wrote {rel(path)}")
    return paths


def _main(args: list[str]) -> int:
    run_bench(args[0] if args else "hslm", model=Path(args[1]) if len(args) > 1 else None)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m pipeline.bench [set [predictions.json]]``: the bench without doit."""
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
