"""What the cluster tests share: ray itself, a cluster on this machine, and cells that fail
the way machines do (a worker killed, a slow cell a node can leave under).

ray is the optional extra ``cluster``. Where it is not installed, importing this module
skips the test module that imports it; in CI (.ci/run installs ``.[dev,cluster]`` and sets
CI) a missing ray is an error instead, so a broken install cannot pass as a skip.

The functions below run on Ray's workers, which import them by name: the cluster's
processes get this folder on PYTHONPATH (:func:`cluster_environment`).
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

try:
    import ray
    from ray.cluster_utils import Cluster
except ImportError:  # never a silent skip in CI, where .[dev,cluster] installs ray
    if os.environ.get("CI"):
        raise
    pytest.skip("ray is not installed: pip install -e '.[cluster]'", allow_module_level=True)

from hslm_ptx.pipeline.stages.verify import run_cell

MARKS = "HSLM_TEST_MARKS"  # the folder each attempt of a cell leaves a file in
SLOW_S = "HSLM_TEST_SLOW_S"  # how long each cell sleeps before it runs


def cluster_environment(marks: Path, slow_s: float) -> None:
    """What the cluster's processes inherit from this one (set before they start)."""
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    os.environ[MARKS] = str(marks)
    os.environ[SLOW_S] = str(slow_s)


def attempt(kernel: str, shape_set: str, shape) -> int:
    """Leave a mark for this attempt of the cell; how many attempts it has had, this one included."""
    folder = Path(os.environ[MARKS])
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{kernel}.{shape_set}.{shape.name}"
    n = len(list(folder.glob(f"{stem}.*"))) + 1
    (folder / f"{stem}.{n}.{ray.get_runtime_context().get_node_id()}").write_text("")
    return n


def killed_first_time(kernel, shape_set, shape, *rest):
    """run_cell, but the first attempt of each cell kills its own worker process (SIGKILL)."""
    if attempt(kernel, shape_set, shape) == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return run_cell(kernel, shape_set, shape, *rest)


def slowly(kernel, shape_set, shape, *rest):
    """run_cell after a sleep of $HSLM_TEST_SLOW_S: a node can be removed while it runs."""
    attempt(kernel, shape_set, shape)
    time.sleep(float(os.environ.get(SLOW_S, "0")))
    return run_cell(kernel, shape_set, shape, *rest)


def attempts(marks: Path) -> dict[str, int]:
    """cell ("kernel.set.shape") -> attempts marked (each mark: <cell>.<attempt>.<node id>)."""
    found: dict[str, int] = {}
    for mark in marks.glob("*") if marks.is_dir() else ():
        cell = mark.name.rsplit(".", 2)[0]
        found[cell] = found.get(cell, 0) + 1
    return found


def start_cluster() -> Cluster:
    """A head with no CPU (the driver's) and two one-CPU worker nodes, each standing in for
    one GPU kind: a fake GPU and the custom resource naming its arch."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for arch in ("sm_89", "sm_90"):
        cluster.add_node(num_cpus=1, num_gpus=1, resources={arch: 1})
    cluster.wait_for_nodes()
    return cluster


def assigned_arch() -> str | None:
    """The arch resource this Ray task was given (its node's GPU kind)."""
    return next((name for name in ray.get_runtime_context().get_assigned_resources() if name.startswith("sm_")), None)


def fake_bench(shape_set: str, ceiling_n: int, ptx: dict[str, str], predictions: str | None):
    """bench_on_node without a GPU: a synthetic record naming where it ran, each kernel's
    first shape a row not run."""
    import hashlib

    from hslm_ptx.catalog.registry import KERNELS
    from hslm_ptx.pipeline.bench.record import BenchReport, Device, summarize
    from hslm_ptx.pipeline.bench.run import DEFAULT_METHOD, _row_without_run
    from hslm_ptx.pipeline.core.shapes import select_sets
    from hslm_ptx.runtime.backends import node_name

    arch = assigned_arch()
    first = select_sets((shape_set,))[shape_set][0]
    rows = [_row_without_run(KERNELS[k], first, "ours", f"not run: a fake bench on {arch}").model_copy(
        update={"family": KERNELS[k].family_name}) for k in ptx]
    return BenchReport(shape_set=shape_set, created="2026-01-01T00:00:00+00:00", synthetic=True,
                       device=Device(name=f"fake {arch}", driver="fake 1.0", arch=arch, node=node_name()),
                       method=DEFAULT_METHOD, rows=rows, summary=summarize(rows, None),
                       ptx_sha256={k: hashlib.sha256(text.encode()).hexdigest() for k, text in ptx.items()})


def fake_bench_failing_on_sm_89(*args):
    """fake_bench, but the sm_89 node's bench fails as a GPU that is gone would."""
    if assigned_arch() == "sm_89":
        raise RuntimeError("cudaErrorNoDevice on the sm_89 node")
    return fake_bench(*args)
