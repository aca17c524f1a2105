"""`doit bench shape=<set> [model=PREDICTIONS.json] [ceiling=N]` (default hslm): the GPU
bench as one doit task.

It depends on the emitted PTX (doit runs `emit` first when a kernel changed), on
shapes.yaml, on the bench code and on the prediction file when one is given, and is up
to date while those and its parameters are unchanged and its four outputs exist. It
does not wait for verify: the bench checks every output it times against the exact
reference itself. Without a GPU it fails at its first step with one line (what was
looked for, what to do), no traceback. ``ceiling=0`` skips the 8192^3 cuBLAS run that
measures the device's int8 ceiling.
"""
from __future__ import annotations

from pathlib import Path

from doit.tools import config_changed

from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.files import remove_folder
from hslm_ptx.pipeline.bench.report import output_paths
from hslm_ptx.pipeline.core.errors import UserError
from hslm_ptx.pipeline.core.request import current, describe
from hslm_ptx.pipeline.stages.taskkit import failing_task, one_line_failure

DEFAULT_SET = "hslm"
BENCH_SOURCES = sorted(Path(__file__).resolve().parents[1].joinpath("bench").glob("*.py"))


@one_line_failure
def _bench(shape_set: str, ceiling_n: int, model: str) -> None:
    from hslm_ptx.pipeline.bench.run import run_bench  # the bench (CuPy, torch) loads only when it runs

    run_bench(shape_set, ceiling_n=ceiling_n, model=Path(model) if model else None)


def task_bench() -> dict:
    """Time every kernel on shape=<set> (default hslm) against cuBLAS and torch; GPU only."""
    request = current()
    model, ceiling = request.value("model"), request.value("ceiling")
    try:
        shape_set = request.one_set(DEFAULT_SET)
    except UserError as exc:
        return failing_task(str(exc))
    if not ceiling.isdigit():
        from hslm_ptx.pipeline.bench.run import CEILING_N

        return failing_task(f"ceiling={ceiling}: expected a whole number (the n of the n^3 "
                            f"cuBLAS int8 ceiling run, 0 to skip it), e.g. ceiling={CEILING_N}")
    if model and not Path(model).is_file():
        return failing_task(f"model={model}: no such prediction file (a JSON list of "
                            "{kernel, shape, predicted_us}, as `doit model` writes)")
    return {
        "actions": [(_bench, [shape_set, int(ceiling), model])],
        "file_dep": [str(config.ptx_path(k)) for k in KERNELS]
        + [str(config.SHAPES_FILE)] + [str(p) for p in BENCH_SOURCES] + ([model] if model else []),
        "targets": [str(p) for p in output_paths(config.BENCH_DIR, shape_set)],
        "clean": [(remove_folder, [config.BENCH_DIR])],
        "uptodate": [config_changed({"shape": shape_set, "ceiling": ceiling, "model": model})],
        "verbosity": 2,
    }


task_bench.__doc__ = (f"Time every kernel against cuBLAS and torch, GPU only: shape=<set> (default hslm), "
                      f"{describe('model', 'ceiling')}")
