"""`doit bench shape=<set> [model=PREDICTIONS.json] [ceiling=N]` (default hslm): the GPU
bench as one doit task.

It depends on the emitted PTX (doit runs `emit` first when a kernel changed), on
shapes.yaml, on the bench code and on the prediction file when one is given, and is up
to date while those and its parameters are unchanged and its four outputs exist. It
does not wait for verify: the bench checks every output it times against the exact
reference itself. Without a GPU it fails at its first step with one line (what was
looked for, what to do), no traceback. ``ceiling=0`` skips the 8192^3 cuBLAS run that
measures the device's int8 ceiling.

``executor=ray devices=sm_89,sm_90``: one bench per arch on a Ray cluster, each a task
that asks for one GPU and that arch's resource (hslm_ptx.pipeline.bench.remote runs it on
the node); each record comes back to this machine as ``artifacts/bench/<set>.<arch>.json``
with its tables, naming the device, driver and node it ran on. An arch whose bench fails
is one line; the others' records are written.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from doit.tools import config_changed

from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.files import remove_folder
from hslm_ptx.pipeline.bench.record import BenchReport
from hslm_ptx.pipeline.bench.report import output_paths, write_outputs
from hslm_ptx.pipeline.core.errors import UserError, one_line
from hslm_ptx.pipeline.core.files import rel
from hslm_ptx.pipeline.core.request import Request, current, describe
from hslm_ptx.pipeline.stages.build_steps import run_executor
from hslm_ptx.pipeline.stages.executor import Job, parse_devices
from hslm_ptx.pipeline.stages.taskkit import failing_task, one_line_failure

DEFAULT_SET = "hslm"
BENCH_SOURCES = sorted(Path(__file__).resolve().parents[1].joinpath("bench").glob("*.py"))


def bench_stem(shape_set: str, arch: str) -> str:
    """A cluster bench's outputs are kept per arch: <set>.<arch>.json and its tables."""
    return f"{shape_set}.{arch}"


@one_line_failure
def _bench_on_cluster(shape_set: str, ceiling_n: int, model: str, request: Request,
                      job: Callable[..., BenchReport] | None = None) -> None:
    """One bench per arch of ``devices=`` (none given: one, on any GPU) on the run's
    executor; each record is written here as it arrives. ``job``: what each runs
    (default hslm_ptx.pipeline.bench.remote.bench_on_node)."""
    from hslm_ptx.pipeline.bench.remote import bench_on_node
    from hslm_ptx.pipeline.bench.run import GEMM_KERNELS

    archs = parse_devices(request.value("devices")) or (None,)
    ptx = {kernel: config.ptx_path(kernel).read_text() for kernel in GEMM_KERNELS}
    predictions = Path(model).read_text() if model else None
    jobs = [Job(job or bench_on_node, (shape_set, ceiling_n, ptx, predictions), gpu=True, arch=arch) for arch in archs]
    failed = []
    for index, found in run_executor(request).run(jobs):
        wanted = archs[index] or "any GPU"
        if isinstance(found, BaseException):
            failed.append(f"{wanted}: {one_line(found)}")
            print(f"bench {shape_set} on {wanted}: {one_line(found)}", flush=True)
            continue
        arch = found.device.arch or wanted
        for path in write_outputs(found, config.BENCH_DIR, bench_stem(shape_set, arch)):
            print(f"bench {shape_set} on {arch} ({found.device.name}, {found.device.node}): wrote {rel(path)}", flush=True)
    if failed:
        raise UserError(f"bench {shape_set}: {len(failed)} of {len(jobs)} archs gave no record ({'; '.join(failed)})")


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
    if request.value("executor") == "ray":
        try:
            archs = parse_devices(request.value("devices"))
        except UserError as exc:
            return failing_task(str(exc))
        action = (_bench_on_cluster, [shape_set, int(ceiling), model, request])
        targets = [str(p) for arch in archs for p in output_paths(config.BENCH_DIR, bench_stem(shape_set, arch))]
    else:
        action = (_bench, [shape_set, int(ceiling), model])
        targets = [str(p) for p in output_paths(config.BENCH_DIR, shape_set)]
    return {
        "actions": [action],
        "file_dep": [str(config.ptx_path(k)) for k in KERNELS]
        + [str(config.SHAPES_FILE)] + [str(p) for p in BENCH_SOURCES] + ([model] if model else []),
        "targets": targets,
        "clean": [(remove_folder, [config.BENCH_DIR])],
        "uptodate": [config_changed({"shape": shape_set, "ceiling": ceiling, "model": model,
                                     "executor": request.value("executor"), "devices": request.value("devices")})],
        "verbosity": 2,
    }


task_bench.__doc__ = (f"Time every kernel against cuBLAS and torch, GPU only: shape=<set> (default hslm), "
                      f"{describe('model', 'ceiling', 'executor', 'devices')}")
