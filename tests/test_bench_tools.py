"""The device tools' own inputs: counter names and ncu's CSV, the one-launch runner and
the GPU verify entry refusing bad input in one line, and the CuPy extras per CUDA major."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.registry import KERNELS
from pipeline.config import ROOT
from pipeline.errors import UserError
from pipeline.bench_counters import CORE, METRICS, available, derive, main, parse_ncu_csv
from pipeline.bench_device import CUPY_BUILDS

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
