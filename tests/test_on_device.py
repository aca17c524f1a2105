"""tools/on-device.sh against a stand-in GPU, so the one GPU call is known to parse,
install, sequence and package before any device time is spent.

The stand-in (tests/data/bench/standin): fake nvidia-smi, ncu and compute-sanitizer
executables first on PATH, which check their options as the real ones do (ncu refuses an
unlisted metric and profiles no more launches than --launch-count), a numpy `cupy` whose
kernels run on the CPU PTX emulator and which can fault a kernel with a sticky error, a
`torch` that will not import; the script runs in a copy of the project with small shape
sets and a few kernels (the plan's own tests check that the defaults cover every kernel).
The stand-in racecheck plants a failure: the steps after it must still run. The tools the
script calls (tools/cuda_tests.py, counter_calibration.py, device_summary.py, hslm_ptx.pipeline.bench.layer)
are also tested on their own, in process, where the stand-in cannot reach what they do.
"""
from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
import zipfile
from pathlib import Path

import pytest

from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.pipeline.core.artifacts import read_model
from hslm_ptx.pipeline.core.config import ROOT
from hslm_ptx.pipeline.bench.counters import derive, parse_ncu_csv
from hslm_ptx.pipeline.bench.land import LandedRun, land, main, read_steps
from hslm_ptx.pipeline.bench.record import BenchReport
from hslm_ptx.pipeline.bench import layer as bench_layer
from hslm_ptx.pipeline.core.layer_records import LayerBenchReport, LayerBenchRow, LayerTiming
from hslm_ptx.pipeline.core.models import LaunchStats, MemoryAccess, Shape
from hslm_ptx.pipeline.core.errors import UserError
from hslm_ptx.pipeline.core.shapes import select_sets
from hslm_ptx.pipeline.bench.run import row_count as bench_rows

sys.path.insert(0, str(ROOT / "tools"))
import counter_calibration  # noqa: E402
import device_plan  # noqa: E402
import wheel_imports  # noqa: E402
import cuda_tests  # noqa: E402
import device_summary  # noqa: E402
import gpu_verify  # noqa: E402

STANDIN = Path(__file__).parent / "data" / "bench" / "standin"
# the kernels launched under the stand-in sanitizers and ncu: more than the 3 launches the
# profiler once stopped at, fewer than all, so the emulator's time stays small
LAUNCHED = ("hslm_fwd_s8", "hslm_fwd_s8_m32", "hslm_dx_s8", "hslm_dw_s8")
# what the stand-in verifies and benches: an int8 GEMM of each product and a step kernel
# (the emulator runs every cell; all 54 kernels x smoke would be most of the test's time)
VERIFIED = ("hslm_fwd_s8", "hslm_dx_s8", "hslm_dw_s8", "hslm_qrows_bf16")
BENCHED = "hslm_fwd_s8,hslm_dx_s8"
# the emulator is slow on a loaded machine: caps that no healthy stand-in step reaches
ROOMY_PLAN = " ".join(f"{name}:300:1" for name in (
    "wheels", "warm-up", "facts", "verify", "bench", "layer", "torch-tests", "sanitize-memcheck", "sanitize-racecheck",
    "sanitize-synccheck", "sanitize-initcheck", "counters"))
MAX_FILES, MAX_DEPTH = 8, 2  # what the device tool brings back from $OUT

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils timeout")


def tiny_wheel(folder: Path) -> Path:
    """A minimal valid wheel: one empty package."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "standin_pkg-0.1-py3-none-any.whl"
    info = "standin_pkg-0.1.dist-info"
    files = {"standin_pkg/__init__.py": "",
             f"{info}/METADATA": "Metadata-Version: 2.1\nName: standin-pkg\nVersion: 0.1\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in {**files, f"{info}/RECORD": record}.items():
            zf.writestr(name, text)
    return path


def project_copy(tmp: Path) -> Path:
    dest = tmp / "project"
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
        ".git", ".venv", "artifacts", ".doit.db*", "__pycache__", ".hypothesis", "*.egg-info",
        ".whl", ".pytest_cache"))
    return dest


def run_on_device(tmp: Path, wheels: bool, prepare=None, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    """tools/on-device.sh in a copy of the project on the stand-in GPU; ``prepare(project)``
    runs on the copy first (to carry a file along, or take one away)."""
    project = project_copy(tmp)
    (project / ".whl").mkdir()
    if wheels:
        tiny_wheel(project / ".whl")
    if prepare:
        prepare(project)
    out = tmp / "out"
    full_env = {
        "PATH": os.pathsep.join([str(STANDIN / "bin"), str(Path(sys.executable).parent),
                                 "/usr/bin", "/bin"]),
        "HOME": str(tmp), "PYTHONPATH": str(STANDIN), "OUT": str(out), "SITE": str(tmp / "site"),
        "VERIFY_SETS": "smoke", "VERIFY_KERNELS": ",".join(VERIFIED), "VERIFY_JOBS": "2",
        "BENCH_SET": "smoke", "BENCH_CEILING": "0", "BENCH_KERNELS": BENCHED,
        "SANITIZE_SHAPE": "tiny", "COUNTERS_SHAPE": "small", "LAUNCH_KERNELS": ",".join(LAUNCHED),
        "COUNTER_KERNELS": ",".join(LAUNCHED), "COUNTER_BATCH": "3", "CALIBRATION_JOBS": "1",
        "PLAN": ROOMY_PLAN, "TOTAL_S": "4000", "PACKAGE_TOOL_S": "120", "CHECKPOINT_S": "30", **env}
    res = subprocess.run(["bash", "tools/on-device.sh"], cwd=project, env=full_env,
                         capture_output=True, text=True, timeout=600)
    return res, out


def returned(out: Path) -> list[Path]:
    return [p for p in out.rglob("*") if p.is_file()]


def steps(log: str) -> dict[str, str]:
    """step name -> its 'exit N' from the log's '=== step NAME: exit N after ...' lines."""
    found = {}
    for line in log.splitlines():
        if line.startswith("=== step ") and ": exit " in line:
            name, rest = line[len("=== step "):].split(": exit ", 1)
            found[name] = rest.split()[0]
    return found


def skipped(log: str) -> dict[str, str]:
    """step name -> why, from the log's '=== step NAME: skipped, WHY' lines."""
    found = {}
    for line in log.splitlines():
        if line.startswith("=== step ") and ": skipped, " in line:
            name, why = line[len("=== step "):].split(": skipped, ", 1)
            found[name] = why
    return found


def unpacked(out: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "xzf", str(out / "rest.tgz"), "-C", str(dest)], check=True)
    return dest


PREDICTED_US = 2.5
LAYER_PRESENT = (ROOT / "hslm_ptx" / "pipeline" / "bench" / "layer.py").is_file()


CUDA_CHECK = "tests/data/bench/standin_cuda_tests.py"  # written in the copy: stands in for the CUDA tests
CUDA_CHECK_TEXT = '''"""Stand-in CUDA tests: one that skips without CUDA, one CPU test that must not be picked."""
import os
import types

import pytest

torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
    is_available=lambda: os.environ.get("STANDIN_CUDA_TESTS") != "skip"))


def cuda_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("GPU check: torch sees no CUDA device")


def test_on_cuda():
    cuda_or_skip()
    assert torch.cuda.is_available()


def test_on_the_cpu():
    assert False, "a test that runs without CUDA was picked"
'''


def carry_predictions(project: Path) -> None:
    """The model's predictions where tools/on-device.sh looks for them by default, and the
    stand-in CUDA tests."""
    model = project / "artifacts" / "model" / "smoke-h200.predictions.json"
    model.parent.mkdir(parents=True)
    model.write_text(f'[{{"kernel": "hslm_fwd_s8", "shape": "tiny", "predicted_us": {PREDICTED_US}}}]')
    (project / CUDA_CHECK).write_text(CUDA_CHECK_TEXT)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    return run_on_device(tmp_path_factory.mktemp("ondevice"), wheels=True, prepare=carry_predictions,
                         TORCH_TESTS=f"{CUDA_CHECK} tests/no_such_test.py")


def test_every_step_runs_in_order_and_a_failure_does_not_stop_the_rest(full_run):
    res, out = full_run
    log = (out / "device.log").read_text()
    ran = steps(log)
    assert list(ran) == ["wheels", "warm-up", "facts", "verify", "bench", *(["layer"] if LAYER_PRESENT else []),
                         "torch-tests", "sanitize-memcheck", "sanitize-racecheck", "sanitize-synccheck",
                         "sanitize-initcheck", "counters"], log[-3000:]
    assert ran["sanitize-racecheck"] == "1"  # the planted failure
    if LAYER_PRESENT:  # the stand-in has no torch: the layer bench refuses in one line
        assert ran["layer"] == "2" and "bench_layer needs torch with CUDA" in log
    assert all(rc == "0" for name, rc in ran.items() if name not in ("sanitize-racecheck", "layer")), ran
    assert res.returncode == 1  # one step failed: the run says so
    assert "=== done: exit 1" in log


def test_what_comes_back_fits_the_tool(full_run, tmp_path):
    _, out = full_run
    files = returned(out)
    names = sorted(p.name for p in files)
    assert len(files) <= MAX_FILES
    assert all(len(p.relative_to(out).parts) - 1 <= MAX_DEPTH for p in files)
    assert names == sorted(["device.log", "facts.txt", "summary.md", "ncu.csv", "rest.tgz", "bench-smoke.json",
                            "bench-smoke.md"])
    rest = unpacked(out, tmp_path)
    assert (rest / "out" / "bench-smoke.csv").is_file() and (rest / "out" / "bench-smoke.png").is_file()


def test_steps_did_their_work(full_run, tmp_path):
    res, out = full_run
    log = (out / "device.log").read_text()
    assert "installed: standin_pkg-0.1-py3-none-any.whl" in log  # the image cannot import it: carried
    # the warm-up launched every kernel once, the first result on each, before the probes
    warm = log.split("=== step warm-up")[1].split("=== step facts")[0]
    assert all(f"{k} tiny R=16 K=32 N=8: exact" in warm for k in LAUNCHED)
    assert f"{3 * len(VERIFIED)} cells on gpu: all exact" in log  # smoke x each kernel, through the stand-in cupy
    assert "on 2 process(es)" in log
    report = read_model(out / "bench-smoke.json", BenchReport)
    assert report.complete and report.stopped is None
    assert {r.disposition for r in report.rows if r.impl == "ours"} == {"passed"}
    assert all(r.disposition == "not_run" for r in report.rows if r.impl.startswith("torch"))
    facts = (out / "facts.txt").read_text()
    assert "nvidia_smi: STAND-IN numpy GPU, 999.99" in facts and "ncu: " in facts
    assert "ncu_probe: ok" in facts and "compute_sanitizer_probe: ok" in facts
    # the CUDA test of the file present, and not its CPU test
    assert "1 CUDA tests: 1 passed, 0 failed, 0 skipped" in log.split("=== step torch-tests")[1]
    assert log.count("tiny R=16 K=32 N=8: exact") == 5 * len(LAUNCHED)  # the warm-up, 4 sanitizer tools x each kernel
    unpacked(out, tmp_path)
    assert (tmp_path / "artifacts" / "verify" / "hslm_fwd_s8" / "smoke" / "tiny.json").is_file()
    assert (tmp_path / "sanitize-racecheck.log").is_file()
    summary = read_model(tmp_path / "verify.json", gpu_verify.VerifySummary)
    assert (summary.cells, summary.exact, summary.not_run, summary.kernels_not_covered) == (12, 12, 0, [])


def test_the_summary_says_what_each_step_found(full_run):
    _, out = full_run
    text = (out / "summary.md").read_text()
    assert "| sanitize-racecheck | 300 | 1 | 1 |" in text and "| counters | 300 | 1 | 0 |" in text
    assert "12 cells (4 kernels x sets smoke) on gpu: 12 exact, 0 failed, 0 not run" in text
    assert "- racecheck: ERROR SUMMARY: 1 error; 4 launches exact, 0 not" in text
    assert "1 CUDA tests: 1 passed, 0 failed, 0 skipped" in text
    assert "bench-smoke.json: 36 rows" in text and "complete" in text
    assert "| hslm_dx_s8 | l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum | cp.async sectors | 3200 |" in text


def test_the_carried_model_file_fills_the_model_column(full_run):
    """MODEL_FILE reaches the bench (it runs in a child shell: the setting must be exported)."""
    _, out = full_run
    report = read_model(out / "bench-smoke.json", BenchReport)
    assert [(r.kernel, r.shape, r.model_us) for r in report.rows if r.model_us] == \
        [("hslm_fwd_s8", "tiny", PREDICTED_US)]


def test_counters_cover_every_kernel_and_the_staged_loads(full_run):
    _, out = full_run
    log = (out / "device.log").read_text()
    counters = parse_ncu_csv((out / "ncu.csv").read_text())
    assert set(counters) == set(LAUNCHED)  # each batch's --launch-count covers one launch of each kernel
    assert f"profiling {len(LAUNCHED)} launches, one per kernel, 3 per ncu run, on small" in log
    assert (out / "ncu.csv").read_text().count('"ID"') == 1  # the two batches' CSVs as one
    # calibration.json rewritten after each batch, so a cut-off step keeps the batches it finished
    assert "calibration.json: batches 0-0" in log and "calibration.json: batches 0-1" in log
    # the stand-in ncu lists only some names: the filter passed those, and said which it left out
    assert "dram__bytes_read.sum" not in counters["hslm_fwd_s8"]
    left_out = next(line for line in log.splitlines() if line.startswith("ncu does not list "))
    assert "dram__bytes_read.sum" in left_out and "smsp__inst_executed_op_ldgsts.sum" not in left_out
    ratios = derive(counters)["hslm_dx_s8"]
    assert ratios["global load sectors per request"] == 16.0
    assert ratios["cp.async sectors per request"] == 32.0  # LDGSTS sectors: counters of their own
    assert ratios["cp.async instructions per mma"] == 1.0 and ratios["ldmatrix wavefronts per instruction"] == 1.0


def test_the_counters_come_back_beside_the_emulators_figures(full_run, tmp_path):
    _, out = full_run
    cal = read_model(unpacked(out, tmp_path) / "calibration.json", counter_calibration.Calibration)
    rows = {(r.kernel, r.metric): r for r in cal.rows}
    assert cal.shape == "small" and {r.kernel for r in cal.rows} == set(LAUNCHED)
    sectors = rows[("hslm_dx_s8", "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum")]
    assert sectors.ncu == 3200 and sectors.emulator > 0 and sectors.ratio == round(3200 / sectors.emulator, 4)
    _, mine = counter_calibration.emulate_one("hslm_fwd_s8", "small")  # the same launch, in this process
    mma = rows[("hslm_fwd_s8", "sm__inst_executed_pipe_tensor_op_imma.sum")]
    assert mma.emulator == mine["sm__inst_executed_pipe_tensor_op_imma.sum"] > 0 and mma.ncu == 100


def test_the_plan_fits_the_whole_and_says_each_steps_time(tmp_path):
    """PLAN_ONLY=1 with the defaults: tools/device-plan.txt's caps, the whole within 8 minutes."""
    res, out = run_on_device(tmp_path, wheels=True, PLAN_ONLY="1", PLAN="", TOTAL_S="480",
                             CHECKPOINT_S=str(device_plan.DEVICE["checkpoint"]))
    assert res.returncode == 0, res.stdout + res.stderr
    log = (out / "device.log").read_text()
    plan = [line for line in log.splitlines() if line.startswith("=== plan: ") and " cap " in line]
    caps = {line.split()[2]: int(line.split(" cap ")[1].split()[0]) for line in plan}
    assert list(caps) == ["wheels", "warm-up", "facts", "verify", "bench", "layer", "torch-tests", "sanitize-memcheck",
                          "sanitize-racecheck", "sanitize-synccheck", "sanitize-initcheck", "counters"]
    assert caps == {s.name: s.cap_s for s in planned().steps}
    assert all("expected ~" in line and " = " in line for line in plan)  # each with its arithmetic
    assert sum(caps.values()) + len(caps) * device_plan.DEVICE["checkpoint"] + 15 <= 480
    assert f"=== plan: total: caps {planned().caps_s} s" in log and "scaled" not in log
    assert "=== step " not in log  # a plan only: nothing ran


def test_caps_over_the_whole_are_scaled_to_fit(tmp_path):
    res, out = run_on_device(tmp_path, wheels=True, TOTAL_S="119", PLAN_ONLY="1", CHECKPOINT_S="2",
                             PLAN="wheels:100:1 facts:100:1")  # 119 - 15 packaging - 2 x 2 checkpoints = 100
    log = (out / "device.log").read_text()
    caps = [int(line.split(" cap ")[1].split()[0]) for line in log.splitlines()
            if line.startswith("=== plan: ") and " cap " in line]
    assert "scaled to the 100 s" in log and caps == [50, 50]


def test_the_plan_must_leave_time_to_package(tmp_path):
    res, out = run_on_device(tmp_path, wheels=True, TOTAL_S="10", PLAN_ONLY="1")
    assert res.returncode == 2 and "leaves no time after PACKAGE_S" in (out / "device.log").read_text()


def test_no_wheels_is_one_line_and_the_next_step_still_runs(tmp_path):
    res, out = run_on_device(tmp_path, wheels=False, STEPS="wheels facts")
    log = (out / "device.log").read_text()
    assert steps(log) == {"wheels": "3", "facts": "0"}
    assert "no wheels in .whl/: run tools/prepare-wheels.sh" in log
    assert res.returncode == 1


def test_a_step_out_of_time_is_skipped_and_packaging_still_happens(tmp_path):
    # 21 s less 15 s packaging less a 2 s checkpoint: 4 s, under the 5 s a step needs, from the start
    res, out = run_on_device(tmp_path, wheels=True, STEPS="wheels facts", TOTAL_S="21", CHECKPOINT_S="2")
    log = (out / "device.log").read_text()
    assert "skipped, out of time" in log and (out / "rest.tgz").is_file()
    assert res.returncode == 1


def test_tools_that_cannot_run_are_probed_once_and_their_steps_skipped(tmp_path):
    res, out = run_on_device(tmp_path, wheels=True, STEPS="wheels facts sanitize counters",
                             STANDIN_NCU_BROKEN="1", STANDIN_SANITIZER_BROKEN="1")
    log = (out / "device.log").read_text()
    facts = (out / "facts.txt").read_text()
    assert "ncu_probe: cannot run here (exit 1): ==ERROR== Failed to profile: LibraryNotLoaded" in facts
    assert "compute_sanitizer_probe: cannot run here (exit 1): ========= Error: Device not supported" in facts
    why = skipped(log)
    assert set(why) == {"sanitize-memcheck", "sanitize-racecheck", "sanitize-synccheck",
                        "sanitize-initcheck", "counters"}
    assert why["counters"].startswith("ncu cannot run here") and "LibraryNotLoaded" in why["counters"]
    assert all("Device not supported" in w for n, w in why.items() if n != "counters")
    assert list(steps(log)) == ["wheels", "facts"]  # no time spent on retries
    assert res.returncode == 1  # the run did not do all it was asked to


def test_a_probe_out_of_time_is_slow_and_its_steps_are_tried_anyway(tmp_path):
    """Each tool waits 3 s before it starts, the probes have 1 s: timed out on any machine."""
    res, out = run_on_device(tmp_path, wheels=True, STEPS="wheels facts sanitize-memcheck counters",
                             PROBE_S="1", STANDIN_TOOL_SLOW_S="3")
    log = (out / "device.log").read_text()
    facts = (out / "facts.txt").read_text()
    assert "ncu_probe: slow (no answer in PROBE_S 1 s), tried anyway" in facts
    assert "compute_sanitizer_probe: slow (no answer in PROBE_S 1 s), tried anyway" in facts
    assert skipped(log) == {} and steps(log) == {"wheels": "0", "facts": "0", "sanitize-memcheck": "0",
                                                  "counters": "0"}, log[-2000:]


def test_a_killed_run_still_leaves_the_summary_and_each_finished_steps_records(tmp_path):
    """The device kills the whole command (SIGKILL to its group: no trap, no packaging) once
    the bench has started: what the checkpoints after wheels, facts and verify wrote is there."""
    project = project_copy(tmp_path)
    (project / ".whl").mkdir()
    tiny_wheel(project / ".whl")
    out = tmp_path / "out"
    env = {"PATH": os.pathsep.join([str(STANDIN / "bin"), str(Path(sys.executable).parent), "/usr/bin", "/bin"]),
           "HOME": str(tmp_path), "PYTHONPATH": str(STANDIN), "OUT": str(out), "SITE": str(tmp_path / "site"),
           "STEPS": "wheels facts verify bench", "VERIFY_SETS": "smoke", "VERIFY_KERNELS": "hslm_fwd_s8",
           "VERIFY_JOBS": "1", "BENCH_SET": "hslm", "BENCH_CEILING": "0", "BENCH_KERNELS": BENCHED,
           "PLAN": ROOMY_PLAN, "TOTAL_S": "4000", "CHECKPOINT_S": "120"}
    run = subprocess.Popen(["bash", "tools/on-device.sh"], cwd=project, env=env, start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        log = out / "device.log"
        for _ in range(6000):  # until the bench step starts (at most 10 minutes)
            if log.is_file() and "=== step bench (" in log.read_text():
                break
            assert run.poll() is None, log.read_text()[-2000:]
            time.sleep(0.1)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    text = (out / "summary.md").read_text()
    assert "3 cells (1 kernels x sets smoke) on gpu: 3 exact" in text and "=== done" not in log.read_text()
    rest = unpacked(out, tmp_path / "rest")
    assert (rest / "verify.json").is_file() and (rest / "facts.log").is_file() and (rest / "verify.log").is_file()
    assert (out / "facts.txt").is_file() and len(returned(out)) <= MAX_FILES


def _wheel_of(folder: Path, module: str) -> Path:
    """A wheel whose one top-level module is ``module``."""
    path = tiny_wheel(folder)
    with zipfile.ZipFile(path) as zf:
        files = {n: zf.read(n) for n in zf.namelist()}
    renamed = folder / f"{module}_carried-0.1-py3-none-any.whl"
    with zipfile.ZipFile(renamed, "w") as zf:
        for name, data in files.items():
            zf.writestr(name.replace("standin_pkg/", f"{module}/"), data)
    path.unlink()
    return renamed


@pytest.mark.parametrize("module, status", [("json", 0), ("standin_pkg", 1)])
def test_a_wheel_is_carried_only_when_the_image_cannot_import_it(tmp_path, module, status, capsys):
    assert wheel_imports.top_level(_wheel_of(tmp_path, module)) == [module]
    assert wheel_imports.main([str(_wheel_of(tmp_path, module))]) == status
    assert ("the image imports json" if status == 0 else "the image cannot import standin_pkg") in capsys.readouterr().out


def test_a_broken_wheel_is_one_line(tmp_path):
    (tmp_path / "x.whl").write_text("not a zip")
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "wheel_imports.py"), str(tmp_path / "x.whl")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    err = res.stderr
    assert err.startswith("error: ") and "not a readable wheel" in err and err.count("\n") == 1


def test_the_cuda_tests_run_in_the_order_of_their_files(tmp_path):
    """tests/conftest.py sorts the project's files longest first; the step's order wins."""
    (tmp_path / "conftest.py").write_text("def pytest_collection_modifyitems(items):\n    items.reverse()\n")
    files = []
    for name in ("test_b_first.py", "test_a_second.py"):
        (tmp_path / name).write_text(CUDA_CHECK_TEXT.split("def test_on_the_cpu")[0])
        files.append(tmp_path / name)
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "cuda_tests.py"), "run", *map(str, files)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    order = [line.split("::")[0].rsplit("/", 1)[-1] for line in res.stdout.splitlines() if "PASSED" in line]
    assert res.returncode == 0 and order == ["test_b_first.py", "test_a_second.py"], res.stdout[-2000:]


def test_a_cut_off_bench_still_returns_a_valid_partial_record(tmp_path):
    """The bench killed at its cap: the record written after each row is what comes back,
    and the tables are rendered from it. The cap is the stand-in timeout's clock, counted
    in rows (tests/data/bench/standin/bin/timeout): the step is cut off once the record
    holds 3 rows, however fast the machine runs them (hslm's whole set would take minutes)."""
    out = tmp_path / "out"
    res, out = run_on_device(tmp_path, wheels=True, STEPS="bench", BENCH_SET="hslm", TOTAL_S="4000",
                             PLAN="bench:3000:5", BENCH_TAIL_S="-1000", STANDIN_CUT_STEP="bench",
                             STANDIN_CUT_ROWS="3", STANDIN_CUT_RECORD=str(out / "bench-hslm.json"))
    log = (out / "device.log").read_text()
    assert steps(log)["bench"] == "124", log[-2000:]  # timeout's status: it was cut off
    report = read_model(out / "bench-hslm.json", BenchReport)
    assert not report.complete and len(report.rows) >= 3, log[-2000:]
    assert "> **Partial record**" in (out / "bench-hslm.md").read_text()
    assert (unpacked(out, tmp_path / "rest") / "out" / "bench-hslm.png").is_file()
    assert len(returned(out)) <= MAX_FILES


def test_the_row_clock_cuts_only_the_step_it_names(tmp_path):
    """The stand-in timeout is the real one for every other command: a step it does not
    name runs to its end, and a command past its limit in seconds still exits 124."""
    timeout = str(STANDIN / "bin" / "timeout")
    env = {**os.environ, "STANDIN_CUT_STEP": "bench", "STANDIN_CUT_ROWS": "0",
           "STANDIN_CUT_RECORD": str(tmp_path / "none.json")}
    other = subprocess.run([timeout, "-k", "1", "30", "bash", "-c", '"$@"', "layer", "true"], env=env)
    cut = subprocess.run([timeout, "-k", "1", "30", "bash", "-c", '"$@"', "bench", "sleep", "30"], env=env)
    slow = subprocess.run([timeout, "0.2", "sleep", "30"], env=env)
    assert (other.returncode, cut.returncode, slow.returncode) == (0, 124, 124)


def test_a_bench_out_of_budget_records_the_rest_as_not_run(tmp_path):
    """The bench's cap less BENCH_TAIL_S leaves it 1 s, and MIN_BUDGET_S (5 s by default) lets
    it have that: the first shape's rows, then the budget has run out. On tails, whose first
    shape (R=1 K=17 N=3) rotates 49 buffer sets through the stand-in's 4 KiB L2: seconds of
    emulated launches before the budget is first looked at, on any machine (smoke's whole
    run, 4 sets a shape, can finish inside 1 s on a fast one)."""
    res, out = run_on_device(tmp_path, wheels=True, STEPS="bench", BENCH_SET="tails", TOTAL_S="200",
                             PLAN="bench:90:10", BENCH_TAIL_S="89", MIN_BUDGET_S="1")
    log = (out / "device.log").read_text()
    assert steps(log)["bench"] == "0", log[-2000:]
    report = read_model(out / "bench-tails.json", BenchReport)
    assert report.complete and "time budget (1 s) ran out" in report.stopped
    unrun = [r for r in report.rows if r.not_run and "time budget" in r.error]
    shapes = len(select_sets(("tails",))["tails"])
    assert unrun and len(report.rows) == 6 * shapes * len(BENCHED.split(","))  # every row is there, run or not


def test_layer_and_torch_tests_are_skipped_in_one_line_when_absent(tmp_path):
    def without_layer(project: Path) -> None:
        (project / "hslm_ptx" / "pipeline" / "bench" / "layer.py").unlink(missing_ok=True)

    res, out = run_on_device(tmp_path, wheels=True, prepare=without_layer, STEPS="layer torch-tests",
                             TORCH_TESTS="tests/no_such_test.py")
    why = skipped((out / "device.log").read_text())
    assert why == {"layer": "hslm_ptx/pipeline/bench/layer.py is not in this tree",
                   "torch-tests": "none of tests/no_such_test.py is in this tree"}
    assert res.returncode == 0  # nothing it should have run was left out


def test_only_eight_files_come_back(tmp_path):
    """Anything a step leaves under $OUT besides the eight files travels in rest.tgz."""
    stray = tmp_path / "out"
    stray.mkdir()
    (stray / "stray.txt").write_text("left by a step\n")
    res, out = run_on_device(tmp_path, wheels=True, STEPS="wheels")
    assert sorted(p.name for p in returned(out)) == ["device.log", "rest.tgz", "summary.md"]
    assert (unpacked(out, tmp_path / "x") / "out" / "stray.txt").read_text() == "left by a step\n"


# ---- a sticky CUDA error: the rest runs in a fresh process ----------------------------

def _standin(project: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(STANDIN), **env}
    return subprocess.run([sys.executable, *args], cwd=project, env=full_env, capture_output=True,
                          text=True, timeout=600)


def test_gpu_verify_after_a_kernel_fault_runs_the_rest_in_a_fresh_process(tmp_path):
    project = project_copy(tmp_path)
    res = _standin(project, "tools/gpu_verify.py", "smoke", "--kernels", "hslm_fwd_s8,hslm_dx_s8,hslm_dw_s8",
                   "--summary", str(tmp_path / "verify.json"), STANDIN_FAULT="hslm_dx_s8")
    lines = res.stdout.splitlines()
    failed = [line for line in lines if line.startswith("FAILED ")]
    assert len(failed) == 3 and all("hslm_dx_s8 smoke/" in f and "cudaErrorIllegalAddress" in f for f in failed)
    assert sum("cells left run in a fresh process" in line for line in lines) == 3
    assert sum(": ok, " in line for line in lines) == 6  # every other cell exact
    assert lines[-1] == "9 cells on gpu: 3 FAILED" and res.returncode == 1
    summary = read_model(tmp_path / "verify.json", gpu_verify.VerifySummary)
    assert summary.kernels_not_covered == ["hslm_dx_s8"] and len(summary.failed) == 3 and summary.exact == 6


def test_bench_after_a_kernel_fault_runs_the_rest_in_a_fresh_process(tmp_path):
    project = project_copy(tmp_path)
    assert _standin(project, "tools/gpu_verify.py", "--emit-only").returncode == 0
    res = _standin(project, "-m", "hslm_ptx.pipeline.bench.run", "smoke", "--out", str(tmp_path / "b"), "--ceiling", "0",
                   "--kernels", "hslm_fwd_s8,hslm_dx_s8,hslm_dw_s8", STANDIN_FAULT="hslm_dx_s8")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("the rows left run in a fresh process") == 3
    report = read_model(tmp_path / "b" / "smoke.json", BenchReport)
    assert report.complete and len(report.rows) == 6 * 3 * 3
    faulted = [r for r in report.rows if r.error and "cudaErrorIllegalAddress" in r.error]
    assert {(r.kernel, r.impl) for r in faulted} == {("hslm_dx_s8", "ours")} and len(faulted) == 3
    # the kernels benched after the fault ran in a working context
    assert all(r.ok for r in report.rows if r.impl == "ours" and r.kernel != "hslm_dx_s8")


def test_no_source_file_warns_at_compile_time():
    """An invalid escape ('\\-' in a docstring) is a SyntaxWarning on Python 3.12 that fills
    the device log; every module the device imports compiles without one."""
    sources = [ROOT / "dodo.py", *sorted((ROOT / "tools").glob("*.py")),
               *sorted((ROOT / "hslm_ptx").rglob("*.py")), *sorted((ROOT / "tests").glob("*.py"))]
    noisy = []
    for path in sources:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                compile(path.read_text(), str(path), "exec")
            except (SyntaxError, Warning) as exc:
                noisy.append(f"{path.relative_to(ROOT)}: {exc}")
    assert noisy == []


def test_the_compile_check_catches_an_invalid_escape():
    with warnings.catch_warnings(), pytest.raises((SyntaxError, Warning)):
        warnings.simplefilter("error")
        compile('"""a \\- b"""\n', "doc.py", "exec")


# ---- landing what came back ------------------------------------------------------------

def test_land_copies_and_summarises(full_run, tmp_path):
    _, out = full_run
    dest = land(out, tmp_path / "results")
    assert dest == tmp_path / "results" / "stand-in-numpy-gpu"
    run = read_model(dest / "results.json", LandedRun)
    assert (run.gpu, run.driver, run.compute_capability) == ("STAND-IN numpy GPU", "999.99", "9.0")
    assert run.clocks["sm_mhz"] == "1" and "Version 0.0.0 (stand-in)" in run.tools["ncu"]
    assert run.tools["cupy"].startswith("0-standin")
    steps = {s.name: s for s in run.steps}
    assert steps["sanitize-racecheck"].exit == 1 and "1 errors" in steps["sanitize-racecheck"].note
    assert steps["sanitize-memcheck"].note == "ERROR SUMMARY: 0 errors"
    assert steps["counters"].exit == 0 and steps["bench"].seconds is not None
    assert run.verify_cells == 3 * len(VERIFIED) and run.verify_failed == []
    assert run.counters["hslm_fwd_s8"]["global load sectors per request"] == 16.0
    for name in ("bench-smoke.json", "bench-smoke.md", "ncu.csv", "device.log", "facts.txt", "summary.md",
                 "verify/hslm_dw_s8/smoke/k_tail.json", "logs/bench.log"):
        assert name in run.files and (dest / name).is_file()
    text = (dest / "README.md").read_text()
    assert "# GPU results: STAND-IN numpy GPU" in text and "| sanitize-racecheck | 1 |" in text
    assert f"{3 * len(VERIFIED)} cells, all exact." in text and "| hslm_dx_s8 | tiny |" in text  # bench summary
    assert "global load sectors per request" in text


def test_land_reads_a_cut_off_run(full_run, tmp_path):
    """A run killed mid-step: the step that never ended is recorded as such, not dropped."""
    _, out = full_run
    log = (out / "device.log").read_text()
    cut = log[:log.index("=== step bench: exit")]
    steps = {s.name: s for s in read_steps(cut)}
    assert steps["verify"].exit == 0 and steps["bench"].exit is None
    assert steps["bench"].note == "did not finish"


@pytest.mark.parametrize("setup,fragment", [
    (lambda d: None, "not a folder"),
    (lambda d: d.mkdir(), "facts.txt: missing"),
    (lambda d: (d.mkdir(), (d / "facts.txt").write_text("nvidia_smi_fields: name,driver_version\n"
                                                        "nvidia_smi: Failed to initialize NVML\n")),
     "field 'nvidia_smi': expected 2 values"),
])
def test_land_bad_input_is_one_line(tmp_path, capsys, setup, fragment):
    folder = tmp_path / "back"
    setup(folder)
    assert main([str(folder), str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and fragment in err and err.count("\n") == 1
    assert not (tmp_path / "results").exists()


# ---- the plan's defaults: every kernel, within the caps ----------------------------------

@functools.lru_cache(maxsize=None)
def planned() -> device_plan.Plan:
    """The default plan (its CUDA test cases counted by a pytest collection: made once, when asked)."""
    return device_plan.default_plan()


VERIFY_TAIL_S, VERIFY_JOBS = 8, 8  # tools/on-device.sh's defaults


def test_the_plan_file_and_the_docs_figures_are_the_codes():
    """tools/device-plan.txt (what on-device.sh reads) and docs/gpu-run.md (what a reader
    sees) say what tools/device_plan.py computes: rows, cases, caps, minutes."""
    assert device_plan.PLAN_FILE.read_text() == device_plan.plan_text(planned())
    doc = device_plan.DOC.read_text()
    assert device_plan.with_doc(doc, planned()) == doc
    assert f"{planned().bench_rows} bench rows, {planned().torch_cases} CUDA test cases" in doc
    assert planned().total_s <= device_plan.SESSION_S == 480
    assert planned().bench_rows == bench_rows() <= 170
    # the check can fail: another figure in the doc, or another cost, is seen
    tampered = doc.replace(f"{planned().bench_rows} bench rows", "396 bench rows")
    assert tampered != doc and device_plan.with_doc(tampered, planned()) != tampered
    costs = device_plan.read_costs()
    dearer = device_plan.default_plan({k: v * 3 for k, v in costs.items()}, planned().torch_cases)
    assert device_plan.plan_text(dearer) != device_plan.PLAN_FILE.read_text()


def test_a_plan_that_cannot_fit_the_session_is_refused():
    costs = device_plan.read_costs()
    with pytest.raises(UserError, match="leave no room in 480 s"):
        device_plan.plan(costs, bench_rows=432 * 3, verify_s=16, kernels=108, torch_cases=8)


def test_the_measured_costs_are_validated(tmp_path):
    bad = tmp_path / "costs.json"
    bad.write_text('{"host_s": {"tiny/all": -1}}')
    with pytest.raises(UserError, match="host_s.tiny/all: -1 is not a finite number"):
        device_plan.read_costs(bad)
    bad.write_text("[]")
    with pytest.raises(UserError, match="host_s: cannot be read"):
        device_plan.read_costs(bad)


def test_the_stated_default_plan_is_the_scripts():
    text = (ROOT / "tools" / "on-device.sh").read_text()
    assert "PLAN_FILE=tools/device-plan.txt" in text and "TOTAL_S:-480}" in text
    assert f"CHECKPOINT_S:-{device_plan.DEVICE['checkpoint']}}}" in text
    assert f"VERIFY_TAIL_S:-{VERIFY_TAIL_S}}}" in text and f"VERIFY_JOBS:-{VERIFY_JOBS}}}" in text
    assert "VERIFY_SETS:-smoke tails hslm}" in text and "VERIFY_KERNELS:-all}" in text
    assert "LAUNCH_KERNELS:-all}" in text  # every kernel under the sanitizers
    assert "MIN_BUDGET_S:-5}" in text  # a tool is given 5 s at least (a test gives less, to wait less)
    assert f"TORCH_TESTS:-{' '.join(device_plan.TORCH_TESTS)}}}" in text
    # the counters the plan costs are the ones the script profiles, in batches of the same size
    assert f"COUNTER_KERNELS:-{','.join(device_plan.COUNTER_KERNELS)}}}" in text
    assert f"COUNTER_BATCH:-{device_plan.COUNTER_BATCH}}}" in text
    assert all(name in KERNELS for name in device_plan.COUNTER_KERNELS)
    for name, tail in device_plan.TAILS.items():
        knob = {"verify": "VERIFY_TAIL_S", "bench": "BENCH_TAIL_S", "layer": "LAYER_TAIL_S",
                "counters": "COUNTER_TAIL_S"}[name]
        assert f"{knob}:-{tail}}}" in text


def test_the_default_verify_covers_every_kernel_on_every_set_within_its_cap():
    res = subprocess.run([sys.executable, "tools/gpu_verify.py", "--plan", "--jobs", str(VERIFY_JOBS)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[:3] == [f"smoke: 3 shapes x {len(KERNELS)} kernels = {3 * len(KERNELS)} cells",
                                           f"tails: 12 shapes x {len(KERNELS)} kernels = {12 * len(KERNELS)} cells",
                                           f"hslm: 6 shapes x {len(KERNELS)} kernels = {6 * len(KERNELS)} cells"]
    cells = gpu_verify.cells_of(gpu_verify.select_sets(("smoke", "tails", "hslm")), list(KERNELS.values()))
    assert len(cells) == 21 * len(KERNELS)
    assert gpu_verify.estimate_s(cells, VERIFY_JOBS) <= {s.name: s.cap_s for s in planned().steps}["verify"] - VERIFY_TAIL_S
    # the check can fail: one process would not fit the cap, which is why the default is 8
    assert gpu_verify.estimate_s(cells, 1) > {s.name: s.cap_s for s in planned().steps}["verify"] - VERIFY_TAIL_S


def test_cells_run_set_by_set_so_a_cut_short_run_has_covered_every_kernel():
    sets = gpu_verify.select_sets(("smoke", "hslm"))
    kernels = [KERNELS[k] for k in VERIFIED]
    cells = gpu_verify.cells_of(sets, kernels)
    first = cells[:3 * len(kernels)]
    assert {(spec.name, shape_set) for spec, shape_set, _ in first} == {(k, "smoke") for k in VERIFIED}
    assert all(shape_set == "hslm" for _, shape_set, _ in cells[3 * len(kernels):])


def test_verify_out_of_budget_records_the_cells_left_as_not_run(tmp_path):
    project = project_copy(tmp_path)
    res = _standin(project, "tools/gpu_verify.py", "smoke", "hslm", "--kernels", "hslm_qrows_bf16", "--jobs", "2",
                   "--budget-s", "0.01", "--summary", str(tmp_path / "verify.json"))
    assert res.returncode == 1, res.stdout + res.stderr
    summary = read_model(tmp_path / "verify.json", gpu_verify.VerifySummary)
    assert summary.cells == 9 and summary.not_run + summary.exact == 9 and summary.not_run >= 1
    assert res.stdout.splitlines()[-1].endswith("not run (the time budget ran out)")


def test_summarize_counts_a_cell_with_no_verdict_as_not_run():
    cells = gpu_verify.cells_of(gpu_verify.select_sets(("smoke",)), [KERNELS["hslm_fwd_s8"]])
    one = gpu_verify.CellVerdict(kernel="hslm_fwd_s8", shape_set="smoke", shape="tiny", status="exact", line="ok")
    summary = gpu_verify.summarize([one], cells, ["smoke"], "gpu", 1.0, 2.0)
    assert (summary.exact, summary.not_run, summary.kernels_not_covered) == (1, 2, [])
    assert gpu_verify.conclusion(summary) == "3 cells on gpu: 2 not run (the time budget ran out)"
    none = gpu_verify.summarize([], cells, ["smoke"], "gpu", 1.0, 2.0)
    assert none.kernels_not_covered == ["hslm_fwd_s8"] and none.not_run == 3


# ---- the CUDA tests: found in their files, and a skip is no evidence ----------------------

def test_the_cuda_tests_are_found_and_the_cpu_tests_left_out():
    files = [ROOT / "tests" / f for f in ("test_torch_linear.py", "test_torch_compile.py", "test_layer_step.py")]
    found = {node.split("::")[1] for f in files for node in cuda_tests.cuda_tests(f)}
    assert found == {"test_cuda_tensors_give_the_cpu_backends_bits", "test_a_cuda_graph_replays_a_training_step",
                     "test_compiled_on_cuda_with_cuda_graphs_equals_eager",
                     "test_the_cuda_runtime_gives_the_emulators_bits",
                     "test_a_cuda_step_is_captured_in_a_graph_and_replays_its_bits"}


def test_a_cuda_guard_imported_from_a_helper_module_is_followed(tmp_path):
    (tmp_path / "gpucases.py").write_text(CUDA_CHECK_TEXT.split("def test_on_cuda")[0])
    (tmp_path / "test_uses_helper.py").write_text(
        "from gpucases import cuda_or_skip as needs_cuda\n\n\ndef test_on_cuda():\n    needs_cuda()\n\n\n"
        "def test_on_the_cpu():\n    assert True\n")
    assert cuda_tests.cuda_tests(tmp_path / "test_uses_helper.py") == [f"{tmp_path / 'test_uses_helper.py'}::test_on_cuda"]


@pytest.mark.parametrize("env,status,line", [
    ({}, 0, "1 CUDA tests: 1 passed, 0 failed, 0 skipped"),
    ({"STANDIN_CUDA_TESTS": "skip"}, 1, "1 CUDA tests: 0 passed, 0 failed, 1 skipped (a CUDA test skipped"),
])
def test_a_cuda_test_that_skips_fails_the_step(tmp_path, env, status, line):
    test_file = tmp_path / "test_standin_cuda.py"
    test_file.write_text(CUDA_CHECK_TEXT)
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "cuda_tests.py"), "run", str(test_file)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert res.returncode == status and res.stdout.splitlines()[-1].startswith(line), res.stdout[-2000:]


def test_files_with_no_cuda_test_are_one_line(tmp_path):
    plain = tmp_path / "test_plain.py"
    plain.write_text("def test_cpu():\n    assert 'cuda' in 'torch.cuda'\n")
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "cuda_tests.py"), "run", str(plain)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stdout.startswith("no test in ") and res.stdout.count("\n") == 1


# ---- the layer rows: the record after every row ---------------------------------------

def test_layer_rows_rewrite_the_record_after_every_row_and_stop_at_the_budget(tmp_path):
    out = tmp_path / "bench-layer.json"
    shapes = [Shape(name="a", R=2, K=3, N=4), Shape(name="b", R=5, K=6, N=7)]
    seen, now = [], [0.0]
    timing = LayerTiming(median_us=10.0, p10_us=9.0, p90_us=11.0, samples=3)

    def bench_row(torch, shape, implementation):
        seen.append(len(read_model(out, LayerBenchReport).rows) if out.is_file() else 0)
        now[0] += 4.0  # each row takes 4 s of the 10 s budget
        return LayerBenchRow(shape=shape.name, R=shape.R, K=shape.K, N=shape.N, implementation=implementation,
                             dtype="bfloat16", eager=timing, graph=timing)

    torch = type("torch", (), {"__version__": "0-test"})
    report = bench_layer.run_rows(torch, shapes, 10.0, out, "test", bench_row=bench_row, clock=lambda: now[0])
    assert seen == [0, 1, 2]  # each row found the rows before it already written
    assert read_model(out, LayerBenchReport) == report and len(report.rows) == 4
    assert [r.error for r in report.rows] == [None, None, None, "not run: the --budget-s 10 was spent"]
    assert [(q.shape, q.eager) for q in report.ratios] == [("a", 1.0), ("b", None)]


# ---- the calibration figures and the summary page -----------------------------------------

def _access(opcode: str, space: str, **counts: int) -> MemoryAccess:
    fields = dict(requests=0, bytes_used=0, sectors=0, lines=0, wavefronts=0, ideal_wavefronts=0)
    return MemoryAccess(line=1, opcode=opcode, space=space, in_loop=True, **{**fields, **counts})


def test_the_emulators_figures_are_summed_under_ncus_names():
    stats = LaunchStats(warp_instructions=1000, by_opcode={"mma": 64}, memory=[
        _access("ld.global.nc.v4.u32", "global", requests=4, sectors=16),
        _access("ld.global.u32", "global", requests=2, sectors=2),
        _access("cp.async.cg.shared.global", "global", requests=8, sectors=32),
        _access("ld.shared.v4.u32", "shared", requests=10, wavefronts=30, ideal_wavefronts=20),
        _access("ldmatrix.sync.aligned.m8n8.x4.shared.b16", "shared", requests=5, wavefronts=20, ideal_wavefronts=20)])
    got = counter_calibration.emulated_figures(stats)
    assert got["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"] == 18
    assert got["l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"] == 6
    assert got["l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum"] == 32
    assert got["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"] == 10  # 30 wavefronts, 20 needed
    assert got["smsp__sass_inst_executed_op_ldsm.sum"] == 5
    assert got["l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"] == 10
    cal = counter_calibration.compare({"k": {"l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": 36.0}}, {"k": got}, "s")
    rows = {r.metric: r for r in cal.rows}
    assert rows["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"].ratio == 2.0
    assert rows["smsp__inst_executed.sum"].ncu is None and rows["smsp__inst_executed.sum"].ratio is None


def test_the_summary_is_written_whatever_evidence_is_missing(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    (out / "bench-layer.json").write_text("{not json")
    (work / "verify.log").write_text("a: ok, 3 rows exact on gpu (0.1s)\nFAILED b: 1 mismatches\n")
    assert device_summary.main([str(out), str(work)]) == 0
    text = (out / "summary.md").read_text()
    assert "no verify.json (the step did not finish); its log shows 1 exact and 1 FAILED cells" in text
    assert "## layer step rows (bench-layer.json)\n\ncould not be read: " in text
    assert "- memcheck: not run" in text and "no calibration.json" in text
    assert device_summary.main([str(tmp_path / "nowhere"), str(work)]) == 2
