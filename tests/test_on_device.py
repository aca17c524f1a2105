"""tools/on-device.sh against a stand-in GPU, so the one GPU call is known to parse,
install, sequence and package before any device time is spent.

The stand-in (tests/data/bench/standin): fake nvidia-smi, ncu and compute-sanitizer
executables first on PATH, which check their options as the real ones do (ncu refuses an
unlisted metric and profiles no more launches than --launch-count), a numpy `cupy` whose
kernels run on the CPU PTX emulator and which can fault a kernel with a sticky error, a
`torch` that will not import; the script runs in a copy of the project with small shape
sets. The stand-in racecheck plants a failure: the steps after it must still run.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest

from kernels.registry import KERNELS
from pipeline.artifacts import read_model
from pipeline.config import ROOT
from pipeline.bench import GEMM_KERNELS
from pipeline.bench_counters import derive, parse_ncu_csv
from pipeline.bench_land import LandedRun, land, main, read_steps
from pipeline.bench_record import BenchReport

STANDIN = Path(__file__).parent / "data" / "bench" / "standin"
# the kernels launched under the stand-in sanitizers and ncu: more than the 3 launches the
# profiler once stopped at, fewer than all, so the emulator's time stays small
LAUNCHED = ("hslm_fwd_s8", "hslm_fwd_s8_m32", "hslm_dx_s8", "hslm_dw_s8")
# the emulator is slow on a loaded machine: caps that no healthy stand-in step reaches
ROOMY_PLAN = " ".join(f"{name}:300:1" for name in (
    "wheels", "facts", "verify", "bench", "layer", "torch-tests", "sanitize-memcheck", "sanitize-racecheck",
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
        "VERIFY_SETS": "smoke", "BENCH_SET": "smoke", "BENCH_CEILING": "0",
        "SANITIZE_SHAPE": "tiny", "COUNTERS_SHAPE": "small", "LAUNCH_KERNELS": ",".join(LAUNCHED),
        "PLAN": ROOMY_PLAN, "TOTAL_S": "4000", **env}
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
LAYER_PRESENT = (ROOT / "pipeline" / "bench_layer.py").is_file()


TORCH_CHECK = "tests/data/bench/standin_torch_check.py"  # stands in for the torch layer's CUDA tests


def carry_predictions(project: Path) -> None:
    """The model's predictions where tools/on-device.sh looks for them by default."""
    model = project / "artifacts" / "model" / "smoke-h200.predictions.json"
    model.parent.mkdir(parents=True)
    model.write_text(f'[{{"kernel": "hslm_fwd_s8", "shape": "tiny", "predicted_us": {PREDICTED_US}}}]')


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    return run_on_device(tmp_path_factory.mktemp("ondevice"), wheels=True, prepare=carry_predictions,
                         TORCH_TESTS=f"{TORCH_CHECK} tests/no_such_test.py")


def test_every_step_runs_in_order_and_a_failure_does_not_stop_the_rest(full_run):
    res, out = full_run
    log = (out / "device.log").read_text()
    ran = steps(log)
    assert list(ran) == ["wheels", "facts", "verify", "bench", *(["layer"] if LAYER_PRESENT else []),
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
    assert names == sorted(["device.log", "facts.txt", "ncu.csv", "rest.tgz", "bench-smoke.json",
                            "bench-smoke.md", "bench-smoke.png"])
    assert (unpacked(out, tmp_path) / "out" / "bench-smoke.csv").is_file()  # the CSV travels in rest.tgz


def test_steps_did_their_work(full_run, tmp_path):
    res, out = full_run
    log = (out / "device.log").read_text()
    assert "standin_pkg" in log  # the carried wheel was installed
    assert f"{3 * len(KERNELS)} cells on gpu: all exact" in log  # smoke x every kernel, through the stand-in cupy
    report = read_model(out / "bench-smoke.json", BenchReport)
    assert report.complete and report.stopped is None
    assert {r.disposition for r in report.rows if r.impl == "ours"} == {"passed"}
    assert all(r.disposition == "not_run" for r in report.rows if r.impl.startswith("torch"))
    facts = (out / "facts.txt").read_text()
    assert "nvidia_smi: STAND-IN numpy GPU, 999.99" in facts and "ncu: " in facts
    assert "ncu_probe: ok" in facts and "compute_sanitizer_probe: ok" in facts
    assert "1 passed" in log.split("=== step torch-tests")[1]  # pytest ran the test files present
    assert log.count("tiny R=16 K=32 N=8: exact") == 4 * len(LAUNCHED)  # 4 sanitizer tools x each kernel
    unpacked(out, tmp_path)
    assert (tmp_path / "artifacts" / "verify" / "hslm_fwd_s8" / "smoke" / "tiny.json").is_file()
    assert (tmp_path / "sanitize-racecheck.log").is_file()


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
    assert set(counters) == set(LAUNCHED)  # ncu's --launch-count covers one launch of each kernel
    assert f"profiling {len(LAUNCHED)} launches, one per kernel" in log
    # the stand-in ncu lists only some names: the filter passed those, and said which it left out
    assert "dram__bytes_read.sum" not in counters["hslm_fwd_s8"]
    left_out = next(line for line in log.splitlines() if line.startswith("ncu does not list "))
    assert "dram__bytes_read.sum" in left_out and "smsp__inst_executed_op_ldgsts.sum" not in left_out
    ratios = derive(counters)["hslm_dx_s8"]
    assert ratios["global load sectors per request"] == 16.0
    assert ratios["cp.async sectors per request"] == 32.0  # LDGSTS sectors: counters of their own
    assert ratios["cp.async instructions per mma"] == 1.0 and ratios["ldmatrix wavefronts per instruction"] == 1.0


def test_the_plan_fits_the_whole_and_says_each_steps_time(tmp_path):
    res, out = run_on_device(tmp_path, wheels=True, TOTAL_S="450", PLAN_ONLY="1", PLAN="")
    assert res.returncode == 0, res.stdout + res.stderr
    log = (out / "device.log").read_text()
    plan = [line for line in log.splitlines() if line.startswith("=== plan: ") and " cap " in line]
    caps = {line.split()[2]: int(line.split(" cap ")[1].split()[0]) for line in plan}
    assert list(caps) == ["wheels", "facts", "verify", "bench", "layer", "torch-tests", "sanitize-memcheck",
                          "sanitize-racecheck", "sanitize-synccheck", "sanitize-initcheck", "counters"]
    assert all("expected ~" in line for line in plan)
    assert sum(caps.values()) + 15 <= 450  # the steps' caps and the packaging fit 7.5 minutes
    assert "=== step " not in log  # a plan only: nothing ran


def test_caps_over_the_whole_are_scaled_to_fit(tmp_path):
    res, out = run_on_device(tmp_path, wheels=True, TOTAL_S="115", PLAN_ONLY="1",
                             PLAN="wheels:100:1 facts:100:1")
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
    res, out = run_on_device(tmp_path, wheels=True, STEPS="wheels facts", TOTAL_S="24")
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


def test_a_cut_off_bench_still_returns_a_valid_partial_record(tmp_path):
    """The bench killed at its cap (no budget of its own here): the record written after
    each row is what comes back, and the tables are rendered from it when packaging."""
    res, out = run_on_device(tmp_path, wheels=True, STEPS="bench", BENCH_SET="hslm", TOTAL_S="100",
                             PLAN="bench:45:10", BENCH_TAIL_S="-1000")  # hslm's R=1782 rows: minutes
    log = (out / "device.log").read_text()
    assert steps(log)["bench"] == "124"  # timeout's status: it was cut off
    report = read_model(out / "bench-hslm.json", BenchReport)
    assert not report.complete and len(report.rows) >= 1, log[-2000:]
    assert "> **Partial record**" in (out / "bench-hslm.md").read_text()
    assert (out / "bench-hslm.png").is_file() and len(returned(out)) <= MAX_FILES


def test_a_bench_out_of_budget_records_the_rest_as_not_run(tmp_path):
    res, out = run_on_device(tmp_path, wheels=True, STEPS="bench", BENCH_SET="tails", TOTAL_S="200",
                             PLAN="bench:150:30", BENCH_TAIL_S="142")
    log = (out / "device.log").read_text()
    assert steps(log)["bench"] == "0", log[-2000:]
    report = read_model(out / "bench-tails.json", BenchReport)
    assert report.complete and "time budget (8 s) ran out" in report.stopped
    unrun = [r for r in report.rows if r.not_run and "time budget" in r.error]
    assert unrun and len(report.rows) == 6 * 12 * len(GEMM_KERNELS)  # every row is there, run or not


def test_layer_and_torch_tests_are_skipped_in_one_line_when_absent(tmp_path):
    def without_layer(project: Path) -> None:
        (project / "pipeline" / "bench_layer.py").unlink(missing_ok=True)

    res, out = run_on_device(tmp_path, wheels=True, prepare=without_layer, STEPS="layer torch-tests",
                             TORCH_TESTS="tests/no_such_test.py")
    why = skipped((out / "device.log").read_text())
    assert why == {"layer": "pipeline/bench_layer.py is not in this tree",
                   "torch-tests": "none of tests/no_such_test.py is in this tree"}
    assert res.returncode == 0  # nothing it should have run was left out


def test_only_eight_files_come_back(tmp_path):
    """Anything a step leaves under $OUT besides the eight files travels in rest.tgz."""
    stray = tmp_path / "out"
    stray.mkdir()
    (stray / "stray.txt").write_text("left by a step\n")
    res, out = run_on_device(tmp_path, wheels=True, STEPS="wheels")
    assert sorted(p.name for p in returned(out)) == ["device.log", "rest.tgz"]
    assert (unpacked(out, tmp_path / "x") / "out" / "stray.txt").read_text() == "left by a step\n"


# ---- a sticky CUDA error: the rest runs in a fresh process ----------------------------

def _standin(project: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(STANDIN), **env}
    return subprocess.run([sys.executable, *args], cwd=project, env=full_env, capture_output=True,
                          text=True, timeout=600)


def test_gpu_verify_after_a_kernel_fault_runs_the_rest_in_a_fresh_process(tmp_path):
    project = project_copy(tmp_path)
    res = _standin(project, "tools/gpu_verify.py", "smoke", STANDIN_FAULT="hslm_dx_s8")
    lines = res.stdout.splitlines()
    failed = [line for line in lines if line.startswith("FAILED ")]
    assert len(failed) == 3 and all("hslm_dx_s8 smoke/" in f and "cudaErrorIllegalAddress" in f for f in failed)
    assert sum("cells left run in a fresh process" in line for line in lines) == 3
    assert sum(": ok, " in line for line in lines) == 3 * len(KERNELS) - 3  # every other cell exact
    assert lines[-1] == f"{3 * len(KERNELS)} cells on gpu: 3 FAILED" and res.returncode == 1


def test_bench_after_a_kernel_fault_runs_the_rest_in_a_fresh_process(tmp_path):
    project = project_copy(tmp_path)
    assert _standin(project, "tools/gpu_verify.py", "--emit-only").returncode == 0
    res = _standin(project, "-m", "pipeline.bench", "smoke", "--out", str(tmp_path / "b"), "--ceiling", "0",
                   STANDIN_FAULT="hslm_dx_s8")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("the rows left run in a fresh process") == 3
    report = read_model(tmp_path / "b" / "smoke.json", BenchReport)
    assert report.complete and len(report.rows) == 6 * 3 * len(GEMM_KERNELS)
    faulted = [r for r in report.rows if r.error and "cudaErrorIllegalAddress" in r.error]
    assert {(r.kernel, r.impl) for r in faulted} == {("hslm_dx_s8", "ours")} and len(faulted) == 3
    # the kernels benched after the fault ran in a working context
    assert all(r.ok for r in report.rows if r.impl == "ours" and r.kernel != "hslm_dx_s8")


def test_no_source_file_warns_at_compile_time():
    """An invalid escape ('\\-' in a docstring) is a SyntaxWarning on Python 3.12 that fills
    the device log; every module the device imports compiles without one."""
    sources = [ROOT / "dodo.py", *sorted((ROOT / "pipeline").glob("*.py")), *sorted((ROOT / "tools").glob("*.py")),
               *sorted((ROOT / "kernels").rglob("*.py")), *sorted((ROOT / "tests").glob("*.py"))]
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
    assert run.verify_cells == 3 * len(KERNELS) and run.verify_failed == []
    assert run.counters["hslm_fwd_s8"]["global load sectors per request"] == 16.0
    for name in ("bench-smoke.json", "bench-smoke.png", "ncu.csv", "device.log", "facts.txt",
                 "verify/hslm_dw_s8/smoke/k_tail.json", "logs/bench.log"):
        assert name in run.files and (dest / name).is_file()
    text = (dest / "README.md").read_text()
    assert "# GPU results: STAND-IN numpy GPU" in text and "| sanitize-racecheck | 1 |" in text
    assert f"{3 * len(KERNELS)} cells, all exact." in text and "| hslm_dx_s8 | tiny |" in text  # bench summary
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
