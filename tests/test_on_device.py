"""tools/on-device.sh against a stand-in GPU, so the one GPU call is known to parse,
install, sequence and package before any device time is spent.

The stand-in (tests/data/bench/standin): fake nvidia-smi, ncu and compute-sanitizer
executables first on PATH, a numpy `cupy` whose kernels run on the CPU PTX emulator,
a `torch` that will not import; the script runs in a copy of the project with small
shape sets. The stand-in racecheck plants a failure: the steps after it must still run.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kernels.registry import KERNELS
from pipeline.artifacts import read_model
from pipeline.config import ROOT
from pipeline.bench_counters import derive, parse_ncu_csv
from pipeline.bench_land import LandedRun, land, main, read_steps
from pipeline.bench_record import BenchReport

STANDIN = Path(__file__).parent / "data" / "bench" / "standin"
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


def run_on_device(tmp: Path, wheels: bool, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    project = project_copy(tmp)
    (project / ".whl").mkdir()
    if wheels:
        tiny_wheel(project / ".whl")
    out = tmp / "out"
    full_env = {
        "PATH": os.pathsep.join([str(STANDIN / "bin"), str(Path(sys.executable).parent),
                                 "/usr/bin", "/bin"]),
        "HOME": str(tmp), "PYTHONPATH": str(STANDIN), "OUT": str(out), "SITE": str(tmp / "site"),
        "VERIFY_SETS": "smoke", "BENCH_SET": "smoke", "BENCH_CEILING": "0",
        "SANITIZE_SHAPE": "tiny", "COUNTERS_SHAPE": "small", "TOTAL_S": "400", **env}
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


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    return run_on_device(tmp_path_factory.mktemp("ondevice"), wheels=True)


def test_every_step_runs_in_order_and_a_failure_does_not_stop_the_rest(full_run):
    res, out = full_run
    log = (out / "device.log").read_text()
    ran = steps(log)
    assert list(ran) == ["wheels", "facts", "verify", "bench", "sanitize-memcheck",
                         "sanitize-racecheck", "sanitize-synccheck", "sanitize-initcheck",
                         "counters"], log[-3000:]
    assert ran["sanitize-racecheck"] == "1"  # the planted failure
    assert all(rc == "0" for name, rc in ran.items() if name != "sanitize-racecheck"), ran
    assert res.returncode == 1  # one step failed: the run says so
    assert "=== done: exit 1" in log


def test_what_comes_back_fits_the_tool(full_run):
    _, out = full_run
    files = returned(out)
    names = sorted(p.name for p in files)
    assert len(files) <= MAX_FILES
    assert all(len(p.relative_to(out).parts) - 1 <= MAX_DEPTH for p in files)
    assert names == sorted(["device.log", "facts.txt", "ncu.csv", "rest.tgz", "bench-smoke.json",
                            "bench-smoke.md", "bench-smoke.csv", "bench-smoke.png"])


def test_steps_did_their_work(full_run, tmp_path):
    res, out = full_run
    log = (out / "device.log").read_text()
    assert "standin_pkg" in log  # the carried wheel was installed
    assert f"{3 * len(KERNELS)} cells on gpu: all exact" in log  # smoke x every kernel, through the stand-in cupy
    report = read_model(out / "bench-smoke.json", BenchReport)
    assert {r.disposition for r in report.rows if r.impl == "ours"} == {"passed"}
    assert all(r.disposition == "not_run" for r in report.rows if r.impl.startswith("torch"))
    facts = (out / "facts.txt").read_text()
    assert "nvidia_smi: STAND-IN numpy GPU, 999.99" in facts and "ncu: " in facts
    assert log.count("tiny R=16 K=32 N=8: exact") == 4 * len(KERNELS)  # 4 sanitizer tools x every kernel
    counters = parse_ncu_csv((out / "ncu.csv").read_text())
    assert set(counters) == {"hslm_fwd_s8", "hslm_dx_s8", "hslm_dw_s8"}
    # the stand-in ncu lists only some names: the filter passed those and no others
    assert "dram__bytes_read.sum" not in counters["hslm_fwd_s8"]
    assert derive(counters)["hslm_dx_s8"]["global load sectors per request"] == 16.0
    subprocess.run(["tar", "xzf", str(out / "rest.tgz"), "-C", str(tmp_path)], check=True)
    assert (tmp_path / "artifacts" / "verify" / "hslm_fwd_s8" / "smoke" / "tiny.json").is_file()
    assert (tmp_path / "sanitize-racecheck.log").is_file()


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
