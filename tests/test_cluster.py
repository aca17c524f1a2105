"""verify, sass and bench on a real Ray cluster on this machine (ray.cluster_utils.Cluster:
a head and two one-CPU nodes, their custom resources standing in for two GPU kinds): the
same records as the local executor, a killed worker's cells retried and each recorded
once, a node removed mid-run, a GPU cell routed by its arch, a killed driver's next run
re-running only the cells with no record; the SASS counts of a kernel's archs as the
local executor gives them; one bench per arch, each on its arch's node, its record
written on the driver. The cells are one small kernel's on tiny shapes."""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from clustercases import (attempts, cluster_environment, fake_bench, fake_bench_failing_on_sm_89, killed_first_time,
                          ray, slowly, start_cluster)

from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.artifacts import read_model
from hslm_ptx.pipeline.core.models import VerifyIndex, VerifyReport
from hslm_ptx.pipeline.bench import run as bench_run
from hslm_ptx.pipeline.bench.record import BenchReport
from hslm_ptx.pipeline.core.errors import UserError
from hslm_ptx.pipeline.core.files import sha256_file
from hslm_ptx.pipeline.core.request import Request
from hslm_ptx.pipeline.stages import sass
from hslm_ptx.pipeline.tasks import bench as bench_task
from hslm_ptx.pipeline.core.shapes import select_sets
from hslm_ptx.pipeline.stages import build_steps
from hslm_ptx.pipeline.stages.verify import cell_inputs
from hslm_ptx.pipeline.stages.build_plan import KernelCells
from hslm_ptx.pipeline.stages.emit import emit
from hslm_ptx.pipeline.stages.executor import Job, LocalExecutor, RayExecutor, node_name

KERNEL = "hslm_fwd_s8"
SHAPES = (("smoke", "tiny"), ("smoke", "small"), ("smoke", "k_tail"), ("tails", "r1_k17_n3"), ("tails", "k1_n1"),
          ("tails", "unit"), ("tails", "odd"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    marks = tmp_path_factory.mktemp("marks")
    cluster_environment(marks, slow_s=1.0)
    found = start_cluster()
    ray.init(address=found.address)
    yield found, marks
    ray.shutdown()
    found.shutdown()


@pytest.fixture
def artifacts(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "PTX_DIR", tmp_path / "ptx")
    monkeypatch.setattr(config, "VERIFY_DIR", tmp_path / "verify")
    emit(KERNELS[KERNEL])
    return tmp_path


def cells() -> KernelCells:
    sets = select_sets(("smoke", "tails"))
    shapes = {(s, shape.name): shape for s, found in sets.items() for shape in found}
    return KernelCells(KERNEL, SHAPES, tuple(cell_inputs(KERNEL, shapes[key], "emulator") for key in SHAPES),
                       "emulator", False)


def verify(monkeypatch, executor, cell_fn=None) -> dict:
    monkeypatch.setattr(build_steps, "run_executor", lambda request: executor)
    if cell_fn is not None:
        monkeypatch.setattr(build_steps, "run_cell", cell_fn)
    return build_steps.run_verify(cells(), Request())


def reports() -> dict[str, VerifyReport]:
    return {f"{s}/{n}": read_model(config.verify_json(KERNEL, s, n), VerifyReport)
            for s, n in SHAPES if config.verify_json(KERNEL, s, n).is_file()}


def recorded(report: VerifyReport) -> dict:
    """A report but for what differs between runs: its time and the node that ran it."""
    return report.model_dump(exclude={"seconds", "node"})


def test_ray_records_are_the_local_ones(cluster, artifacts, monkeypatch):
    assert verify(monkeypatch, LocalExecutor(workers=2)) == {"ran": len(SHAPES)}
    local = reports()
    for path in config.VERIFY_DIR.rglob("*.json"):
        path.unlink()
    assert verify(monkeypatch, RayExecutor(cluster[0].address)) == {"ran": len(SHAPES)}
    remote = reports()
    assert len(local) == len(remote) == len(SHAPES) and all(r.passed for r in remote.values())
    assert {k: recorded(r) for k, r in remote.items()} == {k: recorded(r) for k, r in local.items()}
    assert all(" ray:" in r.node for r in remote.values()) and all(" ray:" not in r.node for r in local.values())
    # the negative: a report that differs in what it found is not "the same but for timings"
    changed = remote["smoke/tiny"].model_copy(update={"mismatches": 1})
    assert recorded(changed) != recorded(local["smoke/tiny"])


def cleared(marks: Path) -> Path:
    for mark in marks.iterdir():
        mark.unlink()
    return marks


def test_a_killed_worker_is_retried_and_each_cell_recorded_once(cluster, artifacts, monkeypatch):
    marks = cleared(cluster[1])
    assert verify(monkeypatch, RayExecutor(cluster[0].address), killed_first_time) == {"ran": len(SHAPES)}
    tries = attempts(marks)
    assert {cell: n for cell, n in tries.items() if cell.startswith(f"{KERNEL}.")} == \
        {f"{KERNEL}.{s}.{n}": 2 for s, n in SHAPES}  # every cell's first worker died, the retry ran it
    index = read_model(config.verify_index(KERNEL), VerifyIndex)
    assert sorted(index.cells) == sorted(f"{s}/{n}" for s, n in SHAPES) and all(e.passed for e in index.cells.values())
    assert len(reports()) == len(SHAPES)


def test_a_gpu_cell_runs_on_a_node_of_its_arch(cluster):
    found, _ = cluster
    nodes = {node["Resources"].get("sm_89") and "sm_89" or node["Resources"].get("sm_90") and "sm_90": node["NodeID"]
             for node in ray.nodes() if node["Alive"] and node["Resources"].get("CPU")}
    executor = RayExecutor(found.address)
    for arch in ("sm_89", "sm_90"):
        ran_on = {result for _, result in executor.run([Job(node_name, (), gpu=True, arch=arch)] * 4)}
        assert ran_on == {f"{node_name().split()[0]} ray:{nodes[arch][:12]}"}, (arch, ran_on)
    assert executor.options(Job(node_name, ())) == {"num_cpus": 1}  # a CPU cell asks for no GPU


def arch_nodes() -> dict[str, str]:
    """arch -> the id of the live node that declares it."""
    return {arch: node["NodeID"] for node in ray.nodes() if node["Alive"]
            for arch in ("sm_89", "sm_90") if node["Resources"].get(arch)}


def test_sass_on_ray_counts_what_the_local_executor_counts(cluster, artifacts):
    ptx = config.ptx_path(KERNEL)
    local = sass.sass_report(KERNEL, KERNEL, ptx, config.ARCHS, bodies=True, runner=LocalExecutor(workers=2))
    remote = sass.sass_report(KERNEL, KERNEL, ptx, config.ARCHS, bodies=True, runner=RayExecutor(cluster[0].address))
    assert [a.arch for a in remote.archs] == list(config.ARCHS) and remote == local
    assert remote.archs[0].fast is not None and remote.archs[0].fast.imma > 0  # a GEMM's loop body was found


def bench_on_cluster(*args, job=fake_bench):
    """The bench task's action itself (not its one-line wrapper, which turns a failure into doit's TaskFailed)."""
    return bench_task._bench_on_cluster.__wrapped__(*args, job=job)


def test_a_bench_runs_once_per_arch_on_its_node_and_is_written_here(cluster, artifacts, monkeypatch):
    monkeypatch.setattr(config, "BENCH_DIR", artifacts / "bench")
    monkeypatch.setattr(bench_run, "GEMM_KERNELS", (KERNEL,))
    request = Request((("executor", "ray"), ("address", cluster[0].address), ("devices", "sm_89,sm_90")))
    bench_on_cluster("hslm", 0, "", request)
    nodes, host = arch_nodes(), node_name().split()[0]
    for arch in ("sm_89", "sm_90"):
        record = read_model(artifacts / "bench" / f"hslm.{arch}.json", BenchReport)
        assert (record.device.arch, record.device.name) == (arch, f"fake {arch}")
        assert record.device.node == f"{host} ray:{nodes[arch][:12]}"  # on the node that declares the arch
        assert record.ptx_sha256 == {KERNEL: sha256_file(config.ptx_path(KERNEL))}  # the driver's PTX was timed
        assert (artifacts / "bench" / f"hslm.{arch}.md").is_file()
    # one arch's bench failing is that arch's line; the other's record is still written
    for path in (artifacts / "bench").iterdir():
        path.unlink()
    with pytest.raises(UserError, match=r"1 of 2 archs gave no record \(sm_89: .*cudaErrorNoDevice on the sm_89 node"):
        bench_on_cluster("hslm", 0, "", request, job=fake_bench_failing_on_sm_89)
    assert sorted(p.name for p in (artifacts / "bench").glob("*.json")) == ["hslm.sm_90.json"]


def test_a_node_removed_mid_run_costs_only_its_running_cells(cluster, artifacts, monkeypatch):
    found, marks = cluster[0], cleared(cluster[1])
    victim = next(node for node in found.worker_nodes if node.node_id)
    removed = threading.Event()

    def remove_when_busy() -> None:  # once a cell is running on the victim node and not yet recorded
        deadline = time.time() + 60
        while time.time() < deadline and not removed.is_set():
            if any(mark.name.endswith(victim.node_id) for mark in marks.glob(f"{KERNEL}.*")):
                found.remove_node(victim, allow_graceful=False)
                removed.set()
            time.sleep(0.05)

    thread = threading.Thread(target=remove_when_busy)
    thread.start()
    try:
        assert verify(monkeypatch, RayExecutor(found.address), slowly) == {"ran": len(SHAPES)}
    finally:
        removed.set()
        thread.join()
        arch = "sm_89" if victim.node_id in {n["NodeID"] for n in ray.nodes() if n["Resources"].get("sm_89")} else "sm_90"
        found.add_node(num_cpus=1, num_gpus=1, resources={arch: 1})  # the next test's cluster as it was
        found.wait_for_nodes()
    tries = attempts(marks)
    assert len(reports()) == len(SHAPES) and sum(tries.values()) > len(SHAPES)  # a cell was lost with the node, rerun
    assert sorted(read_model(config.verify_index(KERNEL), VerifyIndex).cells) == sorted(f"{s}/{n}" for s, n in SHAPES)


DRIVER = """
import sys
from pathlib import Path
import clustercases, ray
from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.request import Request
from hslm_ptx.pipeline.stages import build_steps
from hslm_ptx.pipeline.stages.executor import RayExecutor
import test_cluster
config.PTX_DIR, config.VERIFY_DIR = Path(sys.argv[2]) / "ptx", Path(sys.argv[2]) / "verify"
executor = RayExecutor(sys.argv[1])
build_steps.run_executor = lambda request: executor
build_steps.run_cell = clustercases.slowly
print(build_steps.run_verify(test_cluster.cells(), Request()), flush=True)
"""


def test_a_killed_driver_leaves_only_the_unrecorded_cells_to_run(cluster, artifacts, monkeypatch):
    found = cluster[0]
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, found.address, str(artifacts)],
                              cwd=Path(__file__).parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not reports() and time.time() < deadline and driver.poll() is None:
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    out, err = driver.communicate(timeout=30)
    first = reports()
    assert 0 < len(first) < len(SHAPES), out + err
    again = verify(monkeypatch, RayExecutor(found.address), slowly)
    assert again == {"ran": len(SHAPES) - len(first)}  # only the cells with no record
    # the recorded ones were not run again: their reports are as the killed driver wrote them, time and node too
    assert len(reports()) == len(SHAPES) and all(reports()[key] == report for key, report in first.items())

