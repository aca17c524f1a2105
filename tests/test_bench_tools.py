"""The device tools' own inputs: counter names (the staged loads' too) and ncu's CSV, the
one-launch runner and the GPU verify entry refusing bad input in one line and carrying on
past a failing cell or a sticky CUDA error, the stand-in tools checking their options as
the real ones do, --help on every entry point, and the CuPy extras per CUDA major."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.pipeline.core.config import ROOT
from hslm_ptx.pipeline.core.errors import UserError
from hslm_ptx.pipeline.bench.counters import CORE, METRICS, available, derive, left_out, main, parse_ncu_csv
from hslm_ptx.pipeline.bench.device import CUPY_BUILDS, is_sticky

STANDIN = Path(__file__).parent / "data" / "bench" / "standin"

NCU_CSV = '''==PROF== Connected to process 123 (/usr/bin/python3)
==PROF== Profiling "hslm_fwd_s8": 0%....50%....100% - 9 passes
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Section Name","Metric Name","Metric Unit","Metric Value"
"0","123","python3","127.0.0.1","hslm_fwd_s8","1","7","Command line profiler metrics","smsp__inst_executed.sum","inst","1,234,000"
"0","123","python3","127.0.0.1","hslm_fwd_s8","1","7","Command line profiler metrics","sm__inst_executed_pipe_tensor_op_imma.sum","inst","100,000"
"0","123","python3","127.0.0.1","hslm_fwd_s8","1","7","Command line profiler metrics","l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum","request","0"
"0","123","python3","127.0.0.1","hslm_fwd_s8","1","7","Command line profiler metrics","l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum","sector","n/a"
'''


def test_available_keeps_only_listed_names():
    query = "Device GH100\n---\nMetric Name   Description\nsmsp__inst_executed   Counter  ...\n" \
            "sm__warps_active   Counter ...\n"
    assert available(query) == ["smsp__inst_executed.sum",
                                "sm__warps_active.avg.pct_of_peak_sustained_active"]
    assert available("ncu: command failed") == list(METRICS)  # unreadable: ask for all
    assert set(CORE) <= set(METRICS)


def test_parse_and_derive_skip_what_cannot_be_divided():
    counters = parse_ncu_csv(NCU_CSV)
    assert counters == {"hslm_fwd_s8": {"smsp__inst_executed.sum": 1234000.0,
                                        "sm__inst_executed_pipe_tensor_op_imma.sum": 100000.0,
                                        "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": 0.0}}
    ratios = derive(counters)["hslm_fwd_s8"]
    assert ratios == {"warp instructions per mma": pytest.approx(12.34)}  # zero requests: no ratio


def test_ncu_csv_without_header_is_one_line(tmp_path, capsys):
    with pytest.raises(UserError, match="no header"):
        parse_ncu_csv("==ERROR== Failed to find metric foo\n")
    bad = tmp_path / "ncu.csv"
    bad.write_text("==ERROR== Failed to find metric foo\n")
    assert main(["table", str(bad)]) == 2
    assert main(["table", str(tmp_path / "none.csv")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "no header" in err[0] and "missing" in err[1]


def test_counters_cli(tmp_path, capsys):
    path = tmp_path / "ncu.csv"
    path.write_text(NCU_CSV)
    assert main(["table", str(path)]) == 0
    assert "| hslm_fwd_s8 | 12.34 |" in capsys.readouterr().out
    assert main(["core"]) == 0 and capsys.readouterr().out.strip() == ",".join(CORE)
    assert main(["nope"]) == 2


def _tool(script: str, *args: str, gpu: bool = True, **env: str) -> subprocess.CompletedProcess:
    """A device tool on the stand-in CuPy, with one device or none (the same on any machine)."""
    env = {**os.environ, "PYTHONPATH": str(STANDIN), "STANDIN_DEVICES": "1" if gpu else "0", **env}
    return subprocess.run([sys.executable, f"tools/{script}", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("script,args,gpu,fragment", [
    ("one_launch.py", ("all", "tiny"), False, "backend=gpu: CuPy sees no CUDA device"),
    ("one_launch.py", ("nope", "tiny"), True, "kernel 'nope': unknown"),
    ("one_launch.py", ("all", "no_such_shape"), True, "shape 'no_such_shape': not in shapes.yaml"),
    ("gpu_verify.py", ("smoke",), False, "backend=gpu: CuPy sees no CUDA device"),
    ("gpu_verify.py", ("nope",), True, "unknown shape set 'nope'"),
])
def test_device_tools_refuse_bad_input_in_one_line(script, args, gpu, fragment):
    res = _tool(script, *args, gpu=gpu)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: ") and fragment in res.stderr and res.stderr.count("\n") == 1


def test_one_launch_runs_each_kernel_once_and_checks_it():
    res = _tool("one_launch.py", "hslm_fwd_s8,hslm_dw_s8", "5x17x3")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["hslm_fwd_s8 5x17x3 R=5 K=17 N=3: exact",
                                       "hslm_dw_s8 5x17x3 R=5 K=17 N=3: exact"]


def test_one_launch_reports_a_driver_refusal_and_fails():
    res = _tool("one_launch.py", "all", "tails/unit", STANDIN_JIT_REFUSE="hslm_dx_s8")
    assert res.returncode == 1
    lines = dict(line.split(" ", 1) for line in res.stdout.splitlines())
    assert list(lines) == list(KERNELS)  # it went on past the refusal
    assert "error: CUDADriverError" in lines["hslm_dx_s8"]
    assert all(v.endswith(": exact") for k, v in lines.items() if k != "hslm_dx_s8")


def test_gpu_extras_one_per_cuda_major():
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("cupy-cuda12x") for d in extras["gpu-cuda12"])
    assert any(d.startswith("cupy-cuda13x") for d in extras["gpu-cuda13"])
    assert extras["gpu"] in (["hslm-ptx[gpu-cuda12]"], ["hslm-ptx[gpu-cuda13]"])
    for name in ("cupy-cuda12x", "cupy-cuda13x", "gpu-cuda12", "gpu-cuda13"):
        assert name in CUPY_BUILDS


# ---- the staged loads' counters, and what the filter leaves out ------------------------

def test_staged_load_counters_are_asked_for_and_divided():
    """cp.async (LDGSTS) and ldmatrix (LDSM) have counters of their own on sm_80 and later."""
    for name in ("smsp__inst_executed_op_ldgsts.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum",
                 "l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum",
                 "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum",
                 "smsp__sass_inst_executed_op_ldsm.sum",
                 "sm__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum"):
        assert name in METRICS
    found = {"hslm_dw_s8": {"smsp__inst_executed_op_ldgsts.sum": 40.0,
                            "sm__inst_executed_pipe_tensor_op_imma.sum": 20.0,
                            "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum": 160.0,
                            "l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum": 40.0}}
    assert derive(found)["hslm_dw_s8"] == {"cp.async instructions per mma": 2.0, "cp.async sectors per request": 4.0}


def test_names_the_listing_lacks_are_said_on_stderr(tmp_path, capsys):
    query = tmp_path / "query.txt"
    query.write_text("Metric Name   Description\nsmsp__inst_executed   Counter\ngpu__time_duration  Counter\n")
    assert main(["metrics", str(query)]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == "gpu__time_duration.sum,smsp__inst_executed.sum"
    assert captured.err.count("\n") == 1
    assert captured.err.startswith(f"ncu does not list {len(METRICS) - 2} of the {len(METRICS)} metrics, left out: ")
    assert "smsp__inst_executed_op_ldgsts.sum" in captured.err and "gpu__time_duration.sum" not in captured.err


def test_an_unreadable_listing_is_said_too(tmp_path, capsys):
    query = tmp_path / "query.txt"
    query.write_text("==ERROR== LibraryNotLoaded\n")
    assert main(["metrics", str(query)]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == ",".join(METRICS) and "listed no metric names" in captured.err
    assert main(["metrics", str(tmp_path / "none.txt")]) == 0
    assert "none.txt: missing; asking for every metric, unchecked" in capsys.readouterr().err


def test_nothing_left_out_is_silent():
    listing = "\n".join(m.split(".")[0] + "  Counter" for m in METRICS)
    assert left_out(listing) is None and available(listing) == list(METRICS)


def test_counters_table_writes_where_it_is_told(tmp_path, capsys):
    path = tmp_path / "ncu.csv"
    path.write_text(NCU_CSV)
    assert main(["table", str(path), "--out", str(tmp_path / "t" / "ratios.md")]) == 0
    assert "| hslm_fwd_s8 | 12.34 |" in (tmp_path / "t" / "ratios.md").read_text()
    assert capsys.readouterr().out.startswith("wrote ")


# ---- the stand-in tools check their command lines as the real ones do -------------------

def _standin_tool(*args: str, **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(STANDIN), **env}
    return subprocess.run([str(STANDIN / "bin" / args[0]), *args[1:]], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def _profile(tmp_path, *flags: str) -> subprocess.CompletedProcess:
    return _standin_tool("ncu", "--clock-control", "none", "--kernel-name", "regex:^hslm_", *flags,
                         "--csv", "--log-file", str(tmp_path / "ncu.csv"), sys.executable,
                         "tools/one_launch.py", "hslm_fwd_s8,hslm_dx_s8,hslm_dw_s8", "tiny")


def test_standin_ncu_profiles_no_more_than_the_launch_count(tmp_path):
    res = _profile(tmp_path, "--launch-count", "2", "--metrics", "smsp__inst_executed.sum")
    assert res.returncode == 0, res.stderr
    assert list(parse_ncu_csv((tmp_path / "ncu.csv").read_text())) == ["hslm_fwd_s8", "hslm_dx_s8"]
    res = _profile(tmp_path, "--metrics", "smsp__inst_executed.sum")  # no count: every launch
    assert list(parse_ncu_csv((tmp_path / "ncu.csv").read_text())) == ["hslm_fwd_s8", "hslm_dx_s8", "hslm_dw_s8"]


@pytest.mark.parametrize("flags,fragment", [
    (("--metrics", "smsp__inst_executed.sum,dram__bytes_read.sum"), "Failed to find metric dram__bytes_read.sum"),
    (("--launch-count", "three", "--metrics", "smsp__inst_executed.sum"), "invalid --launch-count 'three'"),
    (("--no-such-option", "1"), "unrecognised option '--no-such-option'"),
])
def test_standin_ncu_refuses_what_the_real_one_refuses(tmp_path, flags, fragment):
    res = _profile(tmp_path, *flags)
    assert res.returncode == 1 and fragment in res.stderr
    assert not (tmp_path / "ncu.csv").exists()  # nothing profiled


def test_standin_sanitizer_refuses_an_unknown_tool_or_option():
    for args, fragment in ((("--tool", "nocheck"), "invalid tool 'nocheck'"), (("--bogus", "1"), "unrecognized option")):
        res = _standin_tool("compute-sanitizer", *args, "true")
        assert res.returncode == 1 and fragment in res.stderr


# ---- a per-cell failure of gpu_verify is that cell's error -----------------------------

def _gpu_verify_module():
    spec = importlib.util.spec_from_file_location("gpu_verify_under_test", ROOT / "tools" / "gpu_verify.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the records' annotations through it
    spec.loader.exec_module(module)
    return module


def test_gpu_verify_turns_any_error_of_a_cell_into_that_cells_failure(monkeypatch, capsys):
    """A RuntimeError outside the launch's own handling (a CUDA runtime error, say) fails
    its cell; every other cell still runs."""
    gv = _gpu_verify_module()

    def cell(spec, shape_set, shape, backend):
        if spec.name == "hslm_dx_s8" and shape.name == "small":
            raise RuntimeError("cudaErrorInvalidValue: invalid argument")
        return types.SimpleNamespace(passed=True, error=None, kernel=spec.name)

    monkeypatch.setattr(gv, "resolve_backend", lambda name: "gpu")
    monkeypatch.setattr(gv, "emit", lambda spec: types.SimpleNamespace(ptx_path=spec.name, ptx_sha256="0" * 12))
    monkeypatch.setattr(gv, "verify_cell", cell)
    monkeypatch.setattr(gv, "verdict", lambda report: f"{report.kernel}: ok")
    assert gv.main(["smoke"]) == 1
    lines = capsys.readouterr().out.splitlines()
    failed = [line for line in lines if line.startswith("FAILED")]
    assert failed == ["FAILED hslm_dx_s8 smoke/small: RuntimeError: cudaErrorInvalidValue: invalid argument"]
    assert sum(line.endswith(": ok") for line in lines) == 3 * len(KERNELS) - 1
    assert lines[-1] == f"{3 * len(KERNELS)} cells on gpu: 1 FAILED"
    assert not any("fresh process" in line for line in lines)  # not a sticky error: same process


def test_sticky_errors_are_told_from_the_others():
    for text in ("CUDARuntimeError: cudaErrorIllegalAddress: an illegal memory access was encountered",
                 "CUDADriverError: CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure",
                 "RuntimeError: CUDA error: device-side assert triggered"):
        assert is_sticky(text) and is_sticky(RuntimeError(text))
    for text in ("CUDADriverError: CUDA_ERROR_INVALID_PTX: a PTX JIT compilation failed",
                 "CUDARuntimeError: cudaErrorMemoryAllocation: out of memory", None):
        assert not is_sticky(text)


# ---- --help is help -------------------------------------------------------------------

ENTRY_POINTS = [("-m", "hslm_ptx.pipeline.bench.run"), ("-m", "hslm_ptx.pipeline.bench.counters"), ("-m", "hslm_ptx.pipeline.bench.report"),
                ("-m", "hslm_ptx.pipeline.bench.land"), ("-m", "hslm_ptx.pipeline.bench.layer"), ("-m", "hslm_ptx.pipeline.core.schemas"),
                ("-m", "hslm_ptx.pipeline.ratchet.dupbody"), ("tools/gpu_verify.py",), ("tools/one_launch.py",),
                ("tools/device_plan.py",), ("tools/wheel_imports.py",),
                ("bench/emulator_bench.py",), ("bench/validate_bench.py",), ("bench/layer_cpu_bench.py",)]


def _entry_point(command: tuple[str, ...], *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``command`` run from ``cwd`` (not the checkout: a relative default would land there)."""
    script = [str(ROOT / c) if c.endswith(".py") else c for c in command]
    return subprocess.run([sys.executable, *script, *args], cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", ENTRY_POINTS, ids=lambda c: c[-1])
def test_every_entry_point_answers_help(command, tmp_path):
    res = _entry_point(command, "--help", cwd=tmp_path)
    assert res.returncode == 0 and res.stderr == "" and res.stdout.startswith("usage: ")
    assert list(tmp_path.iterdir()) == []  # --help wrote nothing


@pytest.mark.parametrize("command", ENTRY_POINTS, ids=lambda c: c[-1])
def test_every_entry_point_refuses_an_unknown_option_in_one_line(command, tmp_path):
    res = _entry_point(command, "--no-such-option", cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert list(tmp_path.iterdir()) == []


def test_schemas_help_leaves_the_committed_schemas_alone(tmp_path):
    """``python -m hslm_ptx.pipeline.core.schemas`` writes the checkout's schemas/ by default (whatever the
    working folder), so --help must be parsed before anything is written."""
    before = {p.name: p.stat().st_mtime_ns for p in (ROOT / "schemas").iterdir()}
    assert _entry_point(("-m", "hslm_ptx.pipeline.core.schemas"), "--help", cwd=tmp_path).returncode == 0
    assert {p.name: p.stat().st_mtime_ns for p in (ROOT / "schemas").iterdir()} == before


def test_land_refuses_a_results_dir_that_is_a_file_in_one_line(tmp_path, capsys):
    from hslm_ptx.pipeline.bench.land import main as land_main

    back = tmp_path / "back"
    back.mkdir()
    (back / "facts.txt").write_text("nvidia_smi_fields: name,driver_version\nnvidia_smi: NVIDIA H200, 570.1\n")
    (tmp_path / "results").write_text("")
    assert land_main([str(back), str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "cannot hold the results folder nvidia-h200/" in err and err.count("\n") == 1
    assert land_main([str(back), str(tmp_path / "landed")]) == 0  # a folder is taken
    assert (tmp_path / "landed" / "nvidia-h200" / "results.json").is_file()


def test_one_launch_lists_the_kernels_a_profiler_should_expect():
    res = _tool("one_launch.py", "--list", "all")
    assert res.returncode == 0 and res.stdout.split() == list(KERNELS)
    res = _tool("one_launch.py", "--list", "hslm_dx_s8,hslm_dw_s8")
    assert res.stdout.split() == ["hslm_dx_s8", "hslm_dw_s8"]


def test_one_launch_after_a_kernel_fault_runs_the_rest_in_a_fresh_process():
    res = _tool("one_launch.py", "hslm_fwd_s8,hslm_dx_s8,hslm_dw_s8", "tiny", STANDIN_FAULT="hslm_dx_s8")
    assert res.returncode == 1
    lines = res.stdout.splitlines()
    assert lines[0] == "hslm_fwd_s8 tiny R=16 K=32 N=8: exact"
    assert lines[1].startswith("hslm_dx_s8 tiny R=16 K=32 N=8: error: CUDARuntimeError: cudaErrorIllegalAddress")
    assert lines[2:] == ["sticky CUDA error: the 1 kernels left run in a fresh process",
                         "hslm_dw_s8 tiny R=16 K=32 N=8: exact"]  # a new context: it ran
