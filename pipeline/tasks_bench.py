"""`doit bench shape=<set>` (default hslm): the GPU bench as one doit task.

It depends on the emitted PTX (doit runs `emit` first when a kernel changed), on
shapes.yaml and on the bench code, and is up to date while those and the shape set are
unchanged and its three outputs exist. It does not wait for verify: the bench checks
every output it times against the exact reference itself. Without a GPU it fails at
its first step with one line (what was looked for, what to do), no traceback.
"""
from __future__ import annotations

from pathlib import Path

from doit.tools import config_changed

from kernels.registry import KERNELS
from pipeline import config
from pipeline.bench import BENCH_DIR, run_bench
from pipeline.cmdline import var
from pipeline.tasks_build import one_line_failure

DEFAULT_SET = "hslm"
BENCH_SOURCES = [Path(__file__).parent / name for name in ("bench.py", "bench_report.py")]


@one_line_failure
def _bench(shape_set: str) -> None:
    run_bench(shape_set)


def task_bench() -> dict:
    """Time every kernel on shape=<set> (default hslm) against cuBLAS and torch; GPU only."""
    shape_set = var("shape", DEFAULT_SET)
    return {
        "actions": [(_bench, [shape_set])],
        "file_dep": [str(config.ptx_path(k)) for k in KERNELS]
        + [str(config.SHAPES_FILE)] + [str(p) for p in BENCH_SOURCES],
        "targets": [str(BENCH_DIR / f"{shape_set}{ext}") for ext in (".json", ".md", ".png")],
        "uptodate": [config_changed({"shape": shape_set})],
        "verbosity": 2,
    }
