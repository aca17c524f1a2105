"""The layer rows of the bench: one TernaryLinear step against torch's nn.Linear, on a GPU.

    python -m hslm_ptx.pipeline.bench.layer --out PATH [--budget-s S] [--shape SET]

A step is forward + backward (dX and dW, with bias) of one layer in bf16, x of R x K with
its gradient asked for, dY of R x N; the implementations are ``hslm_ptx.nn.linear
.TernaryLinear`` (the int8 kernels) and ``torch.nn.Linear`` (torch's bf16 GEMMs), both
``bias=True``, on every shape of ``--shape`` (default hslm) and one large layer
(R = 8192, K = N = 4096). Each is timed two ways: eager (the step's kernels launched from
Python) and replayed from a CUDA graph captured once (``torch.cuda.CUDAGraph``, warmed up
on a side stream first as torch's documentation asks), which leaves the GPU time alone.
Times are device time from CUDA events around a batch of steps (at least
:data:`SAMPLE_US` a sample), median and p10 / p90 over the samples, after warm-up steps
that are not timed. Parameter gradients accumulate across steps, as in gradient
accumulation; that add is part of both implementations' step.

The JSON (hslm_ptx.pipeline.core.layer_records.LayerBenchReport) is written atomically. A row that
cannot run (an error, or the ``--budget-s`` spent) carries one line saying why. Without
a CUDA device it stops with one line and exit status 2, writing nothing.
"""
from __future__ import annotations

import argparse
import datetime
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from hslm_ptx.pipeline.core.artifacts import write_model
from hslm_ptx.pipeline.core.errors import UserError, one_line
from hslm_ptx.pipeline.core.layer_records import LayerBenchRatio, LayerBenchReport, LayerBenchRow, LayerTiming
from hslm_ptx.pipeline.core.models import Shape
from hslm_ptx.pipeline.core.shapes import select_sets

LARGE_LAYER = Shape(name="large_r8192", R=8192, K=4096, N=4096)
DEFAULT_SET = "hslm"
DEFAULT_BUDGET_S = 120.0
SAMPLES = 30
WARMUP_STEPS = 3
SAMPLE_US = 200.0  # a sample spans at least this much device time, so event resolution does not matter
MAX_STEPS_PER_SAMPLE = 1000
IMPLEMENTATIONS = ("TernaryLinear", "nn.Linear")


class Refused(Exception):
    """The bench cannot run as asked; str() is the one line to print (exit 2)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a bad argument reported in one line (exit 2) rather than usage + error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        usage = " ".join(self.format_usage().split()).removeprefix("usage: ")
        raise Refused(f"{self.prog}: {message}; usage: {usage}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m hslm_ptx.pipeline.bench.layer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="where the JSON goes (written atomically)")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help=f"wall seconds for all rows (default {DEFAULT_BUDGET_S:g}); rows past it are not run")
    parser.add_argument("--shape", default=DEFAULT_SET, help=f"shape set of shapes.yaml (default {DEFAULT_SET})")
    args = parser.parse_args(argv)
    if not math.isfinite(args.budget_s) or args.budget_s <= 0:
        parser.error(f"--budget-s {args.budget_s:g}: expected a number of seconds > 0")
    if args.out.is_dir():
        parser.error(f"--out {args.out}: is a folder; give a file path, e.g. {args.out / 'layer.json'}")
    return args


def require_cuda() -> Any:
    """torch, once it sees a CUDA device; else :class:`Refused` in one line."""
    todo = "run it on a GPU machine (tools/on-device.sh); on this one, `doit layer` counts the step without a GPU"
    try:
        import torch
    except Exception as exc:
        raise Refused(f"bench_layer needs torch with CUDA: import torch failed ({one_line(exc, 200)}); {todo}") from None
    if not torch.cuda.is_available():
        raise Refused(f"bench_layer needs a CUDA GPU: torch {torch.__version__} sees none "
                      f"(torch.cuda.is_available() is False); {todo}")
    return torch


def summarize(per_step_us: Sequence[float]) -> LayerTiming:
    """Median and p10 / p90 of per-step times."""
    values = np.asarray(per_step_us, dtype=np.float64)
    p10, median, p90 = np.percentile(values, [10, 50, 90])
    return LayerTiming(median_us=float(median), p10_us=float(p10), p90_us=float(p90), samples=len(values))


def steps_per_sample(estimate_us: float) -> int:
    """Steps in one timed sample: enough to span :data:`SAMPLE_US`."""
    if estimate_us <= 0:
        return MAX_STEPS_PER_SAMPLE
    return max(1, min(MAX_STEPS_PER_SAMPLE, math.ceil(SAMPLE_US / estimate_us)))


def time_device(torch: Any, run: Callable[[], None], samples: int = SAMPLES) -> LayerTiming:
    """Per-step device time of ``run`` (one step), from CUDA events around batches of steps."""
    for _ in range(WARMUP_STEPS):
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(WARMUP_STEPS):
        run()
    end.record()
    end.synchronize()
    calls = steps_per_sample(start.elapsed_time(end) * 1e3 / WARMUP_STEPS)
    times = []
    for _ in range(samples):
        start.record()
        for _ in range(calls):
            run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return summarize(times)


def make_layer(torch: Any, implementation: str, K: int, N: int) -> Any:
    dtype = torch.bfloat16
    if implementation == "nn.Linear":
        return torch.nn.Linear(K, N, bias=True, device="cuda", dtype=dtype)
    from hslm_ptx.nn.linear import TernaryLinear

    return TernaryLinear(K, N, bias=True, device="cuda", dtype=dtype)


def graph_of(torch: Any, step: Callable[[], None]) -> Callable[[], None]:
    """``step`` captured once in a CUDA graph (after warm-up on a side stream); its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_STEPS):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    torch.cuda.synchronize()
    return graph.replay


def bench_row(torch: Any, shape: Shape, implementation: str) -> LayerBenchRow:
    """Eager and graph-replayed step times of one implementation on one shape."""
    row = dict(shape=shape.name, R=shape.R, K=shape.K, N=shape.N, implementation=implementation, dtype="bfloat16")
    try:
        layer = make_layer(torch, implementation, shape.K, shape.N)
        x = torch.randn(shape.R, shape.K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(shape.R, shape.N, device="cuda", dtype=torch.bfloat16)

        def step() -> None:
            layer(x).backward(dy)

        eager = time_device(torch, step)
        graph = time_device(torch, graph_of(torch, step))
        return LayerBenchRow(**row, eager=eager, graph=graph)
    except Exception as exc:  # one row's failure is that row's evidence; the others still run
        return LayerBenchRow(**row, error=one_line(exc, 400))


def run(torch: Any, shapes: Sequence[Shape], budget_s: float, clock: Callable[[], float] = time.monotonic,
        bench: Callable[[Any, Shape, str], LayerBenchRow] = bench_row,
        on_row: Callable[[list[LayerBenchRow]], None] | None = None) -> list[LayerBenchRow]:
    """Every (shape, implementation) row; none starts after ``budget_s`` (those are recorded
    as not run). ``on_row`` sees the rows so far after each one."""
    deadline = clock() + budget_s
    rows: list[LayerBenchRow] = []
    for shape in shapes:
        for implementation in IMPLEMENTATIONS:
            if clock() > deadline:
                rows.append(LayerBenchRow(shape=shape.name, R=shape.R, K=shape.K, N=shape.N,
                                          implementation=implementation, dtype="bfloat16",
                                          error=f"not run: the --budget-s {budget_s:g} was spent"))
            else:
                rows.append(bench(torch, shape, implementation))
            if on_row:
                on_row(rows)
    return rows


def run_rows(torch: Any, shapes: Sequence[Shape], budget_s: float, out: Path, device: str,
             bench_row: Callable[[Any, Shape, str], LayerBenchRow] = bench_row,
             clock: Callable[[], float] = time.monotonic) -> LayerBenchReport:
    """:func:`run`, with the report rewritten (atomically) at ``out`` after every row, so a
    run killed at its time cap still leaves the rows it finished."""
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    reports: list[LayerBenchReport] = []

    def write(rows: list[LayerBenchRow]) -> None:
        report = LayerBenchReport(created=created, device=device, torch_version=str(torch.__version__),
                                  budget_s=budget_s, rows=list(rows), ratios=ratios(rows))
        write_model(out, report)
        reports.append(report)
        row = rows[-1]
        times = (f"eager {row.eager.median_us:.1f} us, graph {row.graph.median_us:.1f} us"
                 if row.eager and row.graph else row.error)
        print(f"{row.shape} {row.implementation}: {times}", flush=True)

    run(torch, shapes, budget_s, clock, bench_row, write)
    return reports[-1]


def ratios(rows: Sequence[LayerBenchRow]) -> list[LayerBenchRatio]:
    """Per shape, TernaryLinear's median over nn.Linear's, eager and graph-replayed (None
    where either row has no time)."""
    by_key = {(r.shape, r.implementation): r for r in rows}
    out = []
    for shape in dict.fromkeys(r.shape for r in rows):
        ours, torch_row = by_key.get((shape, "TernaryLinear")), by_key.get((shape, "nn.Linear"))

        def ratio(mode: str) -> float | None:
            a, b = (getattr(r, mode) if r else None for r in (ours, torch_row))
            return round(a.median_us / b.median_us, 3) if a and b and b.median_us > 0 else None

        out.append(LayerBenchRatio(shape=shape, eager=ratio("eager"), graph=ratio("graph")))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        shapes = [*select_sets((args.shape,))[args.shape], LARGE_LAYER]
        torch = require_cuda()
    except (Refused, UserError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = run_rows(torch, shapes, args.budget_s, args.out, torch.cuda.get_device_name())
    for q in report.ratios:
        print(f"{q.shape}: TernaryLinear / nn.Linear eager {q.eager}, graph {q.graph}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
