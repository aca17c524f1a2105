"""The layer step's bench rows on the GPU machine, the record rewritten after every row.

    python3 tools/layer_rows.py --out PATH [--budget-s S] [--shape SET]

The same rows, arguments and record as ``python -m pipeline.bench.layer`` (TernaryLinear
forward + backward, eager and replayed from a CUDA graph, against torch's bf16
nn.Linear, on the shape set and R=8192, K=N=4096; its ``bench_row`` times each), but the
LayerBenchReport is written (atomically) after each row rather than once at the end, so
a step killed at its time cap still returns the rows it finished. No row starts after
``--budget-s``; those left are recorded as not run. Without a CUDA device: one line,
exit 2, nothing written.
"""
from __future__ import annotations

import datetime
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from pipeline.bench import layer as bench_layer  # noqa: E402
from pipeline.core.artifacts import write_model  # noqa: E402
from pipeline.core.errors import UserError  # noqa: E402
from pipeline.core.layer_records import LayerBenchReport, LayerBenchRow  # noqa: E402
from pipeline.core.models import Shape  # noqa: E402
from pipeline.core.shapes import select_sets  # noqa: E402


def run_rows(torch: Any, shapes: Sequence[Shape], budget_s: float, out: Path, device: str,
             bench_row: Callable[[Any, Shape, str], LayerBenchRow] = bench_layer.bench_row,
             clock: Callable[[], float] = time.monotonic) -> LayerBenchReport:
    """Every (shape, implementation) row, the report rewritten at ``out`` after each."""
    deadline = clock() + budget_s
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    rows: list[LayerBenchRow] = []
    report = None
    for shape in shapes:
        for implementation in bench_layer.IMPLEMENTATIONS:
            if clock() > deadline:
                row = LayerBenchRow(shape=shape.name, R=shape.R, K=shape.K, N=shape.N, implementation=implementation,
                                    dtype="bfloat16", error=f"not run: the --budget-s {budget_s:g} was spent")
            else:
                row = bench_row(torch, shape, implementation)
            rows.append(row)
            report = LayerBenchReport(created=created, device=device, torch_version=str(torch.__version__),
                                      budget_s=budget_s, rows=rows, ratios=bench_layer.ratios(rows))
            write_model(out, report)
            times = (f"eager {row.eager.median_us:.1f} us, graph {row.graph.median_us:.1f} us"
                     if row.eager and row.graph else row.error)
            print(f"{row.shape} {row.implementation}: {times}", flush=True)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = bench_layer.parse_args(argv)
        shapes = [*select_sets((args.shape,))[args.shape], bench_layer.LARGE_LAYER]
        torch = bench_layer.require_cuda()
    except (bench_layer.Refused, UserError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = run_rows(torch, shapes, args.budget_s, args.out, torch.cuda.get_device_name())
    for q in report.ratios:
        print(f"{q.shape}: TernaryLinear / nn.Linear eager {q.eager}, graph {q.graph}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
