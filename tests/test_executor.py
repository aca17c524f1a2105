"""The executor verify's cells go through (hslm_ptx.pipeline.stages.executor) and the live progress
line (hslm_ptx.pipeline.stages.progress), without a cluster: tests/test_cluster.py runs Ray."""
from __future__ import annotations

import io
import os
import signal
import sys

import pytest

from hslm_ptx.pipeline.core.errors import UserError
from hslm_ptx.pipeline.stages import executor as ex
from hslm_ptx.pipeline.stages.executor import Job, LocalExecutor, RayExecutor, executor, parse_devices
from hslm_ptx.pipeline.stages.progress import CLEAR, LineGuard, Progress, attach, duration


def square(x: int) -> int:
    if x < 0:
        raise ValueError(f"negative {x}")
    return x * x


@pytest.mark.parametrize("workers", [1, 2])
def test_local_executor_returns_every_result_once_with_its_index(workers):
    jobs = [Job(square, (x,)) for x in (3, -1, 4, 5, -2)]
    results = dict(LocalExecutor(workers).run(jobs))
    assert sorted(results) == list(range(len(jobs)))
    assert [results[i] for i in (0, 2, 3)] == [9, 16, 25]
    # a job that raises is that job's result, never the run's end
    assert [str(results[i]) for i in (1, 4)] == ["negative -1", "negative -2"]
    assert isinstance(results[1], ValueError)


def killed(x: int) -> int:
    os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would
    return x


def test_a_killed_local_worker_is_its_jobs_result_and_the_next_batch_gets_a_fresh_pool():
    from concurrent.futures.process import BrokenProcessPool

    pool = LocalExecutor(workers=2)
    try:
        results = dict(pool.run([Job(killed, (1,)), Job(killed, (2,))]))
        assert sorted(results) == [0, 1] and all(isinstance(r, BrokenProcessPool) for r in results.values())
        assert dict(pool.run([Job(square, (3,)), Job(square, (4,))])) == {0: 9, 1: 16}
    finally:
        pool.close()


def test_local_executor_uses_this_machines_cores():
    assert LocalExecutor().workers == ex.cores() >= 1
    assert executor("local") is executor("local")  # one per process: the run's kernel tasks share its pool


def test_ray_options_ask_a_cpu_or_a_gpu_of_an_arch():
    options = RayExecutor.options
    assert options(None, Job(square, (1,))) == {"num_cpus": 1}
    assert options(None, Job(square, (1,), gpu=True)) == {"num_cpus": 1, "num_gpus": 1}
    assert options(None, Job(square, (1,), gpu=True, arch="sm_90")) == {"num_cpus": 1, "num_gpus": 1,
                                                                       "resources": {"sm_90": 1}}


def test_bad_executor_and_devices_are_one_line(monkeypatch):
    with pytest.raises(UserError, match="executor=spark: expected one of local, ray"):
        executor("spark")
    monkeypatch.setitem(sys.modules, "ray", None)  # an import of ray fails as where it is not installed
    with pytest.raises(UserError, match=r"the ray package is not installed; pip install -e \"\.\[cluster\]\""):
        RayExecutor("auto")
    monkeypatch.delitem(sys.modules, "ray")
    with pytest.raises(UserError, match=r"address=127\.0\.0\.1:1: nothing answers there .*ray start --head"):
        ex.check_reachable("127.0.0.1:1")
    ex.check_reachable("auto")  # ray.init finds the cluster `ray start` left here, or says there is none
    assert parse_devices("sm_89, sm_90,") == ("sm_89", "sm_90") and parse_devices("sm_90a") == ("sm_90a",)
    with pytest.raises(UserError, match="devices=h100: 'h100' is not an arch"):
        parse_devices("h100")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_counts_cells_and_estimates_the_time_left(monkeypatch):
    clock = iter([0.0, 0.0, 10.0, 10.0, 10.0])
    monkeypatch.setattr("hslm_ptx.pipeline.stages.progress.time.perf_counter", lambda: next(clock))
    progress = Progress()
    progress.expect(10)
    progress.skip(4)  # up to date: done, but not part of the rate
    assert progress.line() == "4/10 cells done"
    progress.start()
    progress.advance(2)  # 2 cells in 10 s: the 4 left take 20 s
    assert progress.line() == "6/10 cells done, about 20 s left"
    assert duration(75) == "1 min 15 s" and duration(9.6) == "10 s"


def test_the_live_line_never_shares_a_line_with_output():
    out, err = Terminal(), Terminal()
    stdout = attach(3, out, err)
    assert isinstance(stdout, LineGuard)
    from hslm_ptx.pipeline.stages.progress import PROGRESS
    PROGRESS.draw(force=True)
    assert err.getvalue() == CLEAR + "0/3 cells done"
    stdout.write("hslm_fwd_s8 smoke/tiny: 1 mismatches\n")
    assert out.getvalue() == "hslm_fwd_s8 smoke/tiny: 1 mismatches\n"
    # the line was taken away before the output, and drawn again after it
    assert err.getvalue() == CLEAR + "0/3 cells done" + CLEAR + CLEAR + "0/3 cells done"
    PROGRESS.finish()
    assert err.getvalue().endswith(CLEAR) and not PROGRESS.shown


def test_no_live_line_off_a_terminal():
    out, err = io.StringIO(), io.StringIO()
    assert attach(3, out, err) is out  # a log keeps plain lines
    from hslm_ptx.pipeline.stages.progress import PROGRESS
    PROGRESS.advance()  # within LOG_EVERY_S of the start: no line yet
    assert err.getvalue() == ""
    PROGRESS.draw(force=True)
    assert CLEAR not in err.getvalue() and err.getvalue().startswith("1/3 cells done, about ")
    assert err.getvalue().endswith(" left\n") and err.getvalue().count("\n") == 1
    PROGRESS.finish()


def test_a_sass_cell_error_names_the_kernels_ptx_not_the_workers_copy(tmp_path):
    from hslm_ptx.pipeline.stages import sass
    from hslm_ptx.pipeline.stages.ptxas import PtxasError

    ptx = tmp_path / "broken.ptx"
    ptx.write_text(".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry broken() { bogus.instr; }\n")
    with pytest.raises(PtxasError) as caught:
        sass.sass_report("broken", "broken", ptx, ("sm_80", "sm_90"))  # two archs: two cells on the pool
    message = str(caught.value)
    assert message.startswith(f"{ptx} (sm_80): ") and "line 4" in message and "sass-" not in message


def test_a_sass_cell_on_a_worker_with_other_tools_is_refused():
    from hslm_ptx.pipeline.stages import sass
    from hslm_ptx.pipeline.stages.ptxas import find_ptxas, ptxas_version

    ptx = ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry empty() { ret; }\n"
    here = (ptxas_version(find_ptxas()), sass.disassembler_version(sass.find_nvdisasm()))
    listing, counted = sass.sass_arch("empty", ptx, "sm_80", False, "empty.ptx", here)  # the driver's tools: counted
    assert counted.arch == "sm_80" and "empty" in listing
    with pytest.raises(UserError, match=r"sass empty sm_80 on .*: this worker has ptxas .*; the driver has 0\.0\.0, 0\.0\.0"):
        sass.sass_arch("empty", ptx, "sm_80", False, "empty.ptx", ("0.0.0", "0.0.0"))
