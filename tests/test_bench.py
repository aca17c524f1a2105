"""The bench's GPU half without a GPU: sizing, the GEMM each kernel is, the cuBLAS int8
call desk-checked against a column-major model of cublasGemmEx, the one-line stop
without a GPU, and the whole run on a stand-in GPU (tests/data/bench/standin: numpy as
CuPy, the CPU PTX emulator as the driver, no cuBLAS, no torch).
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from hslm_ptx.runtime.backends import gpu_available
from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.kernel.spec import Dims, GemmForm, Operand
from hslm_ptx.pipeline.bench import run as bench
from hslm_ptx.pipeline.bench import baselines as bench_baselines
from hslm_ptx.pipeline.bench import device as bench_device
from hslm_ptx.pipeline.bench import timing as bench_timing
from hslm_ptx.pipeline.core.artifacts import read_model, write_model
from hslm_ptx.pipeline.core.errors import UserError
from hslm_ptx.pipeline.core.config import ROOT
from hslm_ptx.pipeline.bench.record import BenchReport, Check, Method, Row, Timing
from hslm_ptx.pipeline.core.shapes import select_sets
from hslm_ptx.pipeline.core.models import Shape

STANDIN = Path(__file__).parent / "data" / "bench" / "standin"


# ---- sizing --------------------------------------------------------------------------

def test_sets_needed_exceeds_l2_up_to_the_cap():
    l2 = 50 * 2**20
    n = bench_timing.sets_needed(2**20, l2, 2.0)
    assert n == 100 and n * 2**20 >= 2 * l2
    assert bench_timing.sets_needed(1000, l2, 2.0) == bench_timing.MAX_SETS
    assert bench_timing.sets_needed(10 * l2, l2, 2.0) == 1


def test_calls_per_sample():
    assert bench_timing.calls_per_sample(2.0, 1, 200.0) == 100
    assert bench_timing.calls_per_sample(2.0, 256, 200.0) == 256  # every set visited
    assert bench_timing.calls_per_sample(5000.0, 3, 200.0) == 3
    assert bench_timing.calls_per_sample(0.0, 1, 200.0) == bench_timing.MAX_CALLS


# ---- the GEMM each kernel is ----------------------------------------------------------

@pytest.mark.parametrize("kernel", bench.GEMM_KERNELS)
def test_gemm_form_is_the_kernel(kernel):
    """Baselines compute A @ Bt.T; it must be exactly what the kernel's reference gives."""
    spec = KERNELS[kernel]
    dims = Dims(R=7, K=21, N=11)
    inputs = spec.make_inputs(dims, np.random.default_rng(5))
    A, Bt = bench_baselines.gemm_problem(spec, inputs, dims)
    assert A.dtype == Bt.dtype == np.int8 and A.flags.c_contiguous and Bt.flags.c_contiguous
    got = A.astype(np.int64) @ Bt.T.astype(np.int64)
    want = spec.reference(dims, inputs)
    assert got.shape == want.shape and np.array_equal(got, want)


def test_gemm_form_check_catches_a_wrong_form(monkeypatch):
    """Negative: dX with W instead of W^T is not the kernel (the test above would fail)."""
    spec = KERNELS["hslm_dx_s8"]
    dims = Dims(R=5, K=13, N=13)
    inputs = spec.make_inputs(dims, np.random.default_rng(1))
    wrong = dataclasses.replace(spec, gemm_form=GemmForm(a=Operand("dy"), bt=Operand("w", transposed=True)))
    A, Bt = bench_baselines.gemm_problem(wrong, inputs, dims)
    assert not np.array_equal(A.astype(np.int64) @ Bt.T.astype(np.int64), spec.reference(dims, inputs))


def test_pad_note_names_only_changed_dims():
    assert bench_baselines._pad_note([("inner", 243, 244), ("out", 8, 8)], "why") == \
        "padded with zeros: inner 243->244 (why)"
    assert bench_baselines._pad_note([("inner", 8, 8)], "why") == ""


# ---- cuBLAS int8, desk-checked -------------------------------------------------------

def test_cuda_enum_falls_back_to_the_header_value():
    cupy14 = types.SimpleNamespace(CUDA_R_8I=3)  # CuPy 14.2: no CUDA_R_32I
    assert bench_baselines.cuda_enum(cupy14, "CUDA_R_32I") == 10  # library_types.h
    assert bench_baselines.cuda_enum(cupy14, "CUDA_R_8I") == 3
    assert bench_baselines.cuda_enum(types.SimpleNamespace(CUDA_R_32I=99), "CUDA_R_32I") == 99


class DevArray(np.ndarray):
    """A numpy array with CuPy's ``.data.ptr``."""

    @property
    def data(self):  # noqa: D401 - CuPy's MemoryPointer stand-in
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])


def fake_cublas_cupy(monkeypatch) -> list[dict]:
    """cupy + cupy.cuda.cublas where gemmEx is a column-major model of cublasGemmEx that
    refuses, as the IMMA path would, m, k or a leading dimension not a multiple of 4."""
    calls: list[dict] = []
    buffers: dict[int, np.ndarray] = {}

    def dev(a):
        arr = np.ascontiguousarray(a).view(DevArray)
        buffers[arr.data.ptr] = arr
        return arr

    def gemmEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C,
               Ctype, ldc, compute, algo):
        calls.append(dict(m=m, n=n, k=k, lda=lda, ldb=ldb, ldc=ldc, types=(Atype, Btype, Ctype),
                          compute=compute, ops=(transa, transb)))
        if any(v % 4 for v in (m, k, lda, ldb, ldc)):
            raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED (model: IMMA wants multiples of 4)")
        assert (transa, transb) == (1, 0) and (Atype, Btype, Ctype) == (3, 3, 10) and compute == 72
        a, b, c = (buffers[p].reshape(-1) for p in (A, B, C))
        op_a = np.lib.stride_tricks.as_strided(a, (m, k), (lda, 1))  # op_T of a k x m matrix
        op_b = np.lib.stride_tricks.as_strided(b, (k, n), (1, ldb))  # op_N of a k x n matrix
        out = np.lib.stride_tricks.as_strided(c, (m, n), (4, 4 * ldc))
        out[...] = op_a.astype(np.int32) @ op_b.astype(np.int32)

    cublas = types.SimpleNamespace(gemmEx=gemmEx, CUBLAS_OP_N=0, CUBLAS_OP_T=1,
                                   CUBLAS_COMPUTE_32I=72, CUBLAS_GEMM_DEFAULT=-1)
    runtime = types.SimpleNamespace(CUDA_R_8I=3)  # as CuPy 14.2: no CUDA_R_32I
    cuda = types.ModuleType("cupy.cuda")
    cuda.__dict__.update(cublas=cublas, runtime=runtime,
                         device=types.SimpleNamespace(get_cublas_handle=lambda: 0))
    cupy = types.ModuleType("cupy")
    cupy.__dict__.update(cuda=cuda, int32=np.int32, asarray=dev, asnumpy=np.asarray,
                         full=lambda shape, v, dtype: dev(np.full(shape, v, dtype)))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    return calls


def _problem(kernel: str, R: int, K: int, N: int) -> bench_baselines.Problem:
    spec = KERNELS[kernel]
    dims = Dims(R, K, N)
    inputs = spec.make_inputs(dims, np.random.default_rng(3))
    A, Bt = bench_baselines.gemm_problem(spec, inputs, dims)
    return bench_baselines.Problem(kernel, Shape(name="s", R=R, K=K, N=N), dims, inputs, A, Bt,
                                   spec.reference(dims, inputs))


@pytest.mark.parametrize("kernel,R,K,N", [("hslm_fwd_s8", 27, 243, 729), ("hslm_dx_s8", 27, 729, 243),
                                          ("hslm_dw_s8", 27, 243, 243)])
def test_cublas_int8_pads_to_the_imma_shape_and_is_exact(monkeypatch, kernel, R, K, N):
    calls = fake_cublas_cupy(monkeypatch)
    p = _problem(kernel, R, K, N)
    case = bench_baselines.case_cublas_int8(sys.modules["cupy"], p)
    s = case.make_set()
    case.launch(s)
    assert np.array_equal(case.result(s).astype(np.int64), p.ref)
    call = calls[-1]
    assert all(call[d] % 4 == 0 for d in ("m", "k", "lda", "ldb", "ldc"))
    M, inner, out = p.gemm
    assert case.gemm == (M, -(-inner // 4) * 4, -(-out // 4) * 4)
    assert f"out {out}->{case.gemm[2]}" in case.note and "ldc" in case.note


def test_cublas_int8_without_padding_the_output_is_refused(monkeypatch):
    """Negative: inner already a multiple of 4 and no padding applied: the IMMA model
    refuses m = ldc = 243, so the padding above is what makes the call valid."""
    fake_cublas_cupy(monkeypatch)
    p = _problem("hslm_fwd_s8", 27, 244, 243)
    monkeypatch.setattr(bench_baselines, "round_up", lambda n, m: n)
    case = bench_baselines.case_cublas_int8(sys.modules["cupy"], p)
    with pytest.raises(RuntimeError, match="NOT_SUPPORTED"):
        case.launch(case.make_set())


# ---- no GPU: one line, non-zero exit ------------------------------------------------

def test_require_gpu_without_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    with pytest.raises(bench_device.NoGpu) as exc:
        bench_device.require_gpu()
    msg = str(exc.value)
    assert "\n" not in msg and "import cupy" in msg and "doit verify" in msg
    assert "cupy-cuda12x" in msg and "cupy-cuda13x" in msg  # which CuPy builds work


@pytest.mark.parametrize("count", [0, RuntimeError("cudaErrorNoDevice: no CUDA-capable device")])
def test_require_gpu_without_a_device(monkeypatch, count):
    def get_count():
        if isinstance(count, Exception):
            raise count
        return count

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(
        getDeviceCount=get_count)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    with pytest.raises(bench_device.NoGpu, match="getDeviceCount") as exc:
        bench_device.require_gpu()
    assert "\n" not in str(exc.value)


def test_require_gpu_with_a_device(monkeypatch):
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(
        getDeviceCount=lambda: 1)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert bench_device.require_gpu() is fake


def _no_gpu_env() -> dict[str, str]:
    # hide any GPU, so the stop is tested even on a machine that has one
    return {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


def _doit_bench(tmp_path, *args: str) -> subprocess.CompletedProcess:
    dodo = tmp_path / "bench_dodo.py"  # not "dodo": doit imports it by module name
    dodo.write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
        "from hslm_ptx.pipeline.tasks.build import task_emit  # noqa\n"
        "from hslm_ptx.pipeline.tasks.bench import task_bench  # noqa\n")
    return subprocess.run([sys.executable, "-m", "doit", "-f", str(dodo), "-d", str(ROOT),
                           "--db-file", str(tmp_path / "db"), "bench", *args],
                          capture_output=True, text=True, env=_no_gpu_env(), timeout=120)


def test_doit_bench_without_gpu_stops_with_one_line(tmp_path):
    res = _doit_bench(tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "Traceback" not in out
    lines = [line for line in out.splitlines() if line.startswith("bench needs a CUDA GPU")]
    assert len(lines) == 1 and "doit verify" in lines[0]


@pytest.mark.parametrize("arg,fragment", [("ceiling=big", "ceiling=big: expected a whole number"),
                                          ("model=nope.json", "model=nope.json: no such prediction file")])
def test_doit_bench_bad_parameter_is_one_line(tmp_path, arg, fragment):
    res = _doit_bench(tmp_path, arg)
    assert res.returncode == 1 and "Traceback" not in res.stdout + res.stderr
    assert f"TaskFailed - taskid:bench\n{fragment}" in res.stdout


def test_python_m_bench_without_gpu(tmp_path):
    res = subprocess.run([sys.executable, "-m", "hslm_ptx.pipeline.bench.run", "hslm"], cwd=ROOT,
                         capture_output=True, text=True, env=_no_gpu_env(), timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.startswith("error: bench needs a CUDA GPU") and res.stderr.count("\n") == 1


# ---- the whole GPU flow on the stand-in ------------------------------------------------

FAKED = ("cupy", "cupyx", "torch")


@pytest.fixture
def standin_gpu(monkeypatch):
    """The stand-in CuPy importable, torch hidden (real torch would work on a GPU machine
    and the torch rows would not fail); everything put back afterwards."""
    def ours(name: str) -> bool:
        return name.split(".")[0] in FAKED

    saved = {k: v for k, v in sys.modules.items() if ours(k)}
    for k in saved:
        del sys.modules[k]
    monkeypatch.syspath_prepend(str(STANDIN))
    sys.modules["torch"] = None  # import torch -> ImportError, whatever is installed
    gpu_available.cache_clear()
    yield
    for k in [k for k in sys.modules if ours(k)]:
        del sys.modules[k]
    sys.modules.update(saved)
    gpu_available.cache_clear()


def test_bench_flow_on_a_stand_in_gpu(standin_gpu, monkeypatch, tmp_path):
    monkeypatch.setenv("STANDIN_JIT_REFUSE", "hslm_dx_s8")  # the driver refuses one kernel's PTX
    for kernel in bench.GEMM_KERNELS:  # what the bench loads
        (tmp_path / f"{kernel}.ptx").write_text(KERNELS[kernel].emit())
    monkeypatch.setattr(bench, "ptx_path", lambda k: tmp_path / f"{k}.ptx")
    # sets rotated past 1 x L2, not the default's 2 x: the smallest shapes still rotate (below),
    # each timed over half as many sets, so half as many emulated launches
    method = Method(warmup=1, repeats=3, target_sample_us=1.0, l2_multiple=1.0)
    pred = tmp_path / "pred.json"
    pred.write_text('[{"kernel": "hslm_fwd_s8", "shape": "tiny", "predicted_us": 2.5}]')
    paths = bench.run_bench("smoke", method=method, out_dir=tmp_path / "out", ceiling_n=32, model=pred)
    assert [p.name for p in paths] == ["smoke.json", "smoke.md", "smoke.csv", "smoke.png"]
    report = read_model(paths[0], BenchReport)
    # smoke has 3 shapes: every kernel's own row on each, then each family's 5 baselines on each
    families = len({KERNELS[k].family_name for k in bench.GEMM_KERNELS})
    assert len(report.rows) == bench.row_count(bench.GEMM_KERNELS, "smoke") == (len(bench.GEMM_KERNELS) + 5 * families) * 3
    impls = [r.impl for r in report.rows]
    assert impls == sorted(impls, key=lambda impl: impl != "ours")  # every "ours" row before any baseline
    rows = lambda impl, kernel=None: [r for r in report.rows  # noqa: E731
                                      if r.impl == impl and kernel in (None, r.kernel)]
    # our PTX ran (on the emulator, standing in for the GPU) and matched exactly ...
    for kernel in ("hslm_fwd_s8", "hslm_dw_s8"):
        assert all(r.ok and r.check.tolerance == 0 and r.stream and r.graph for r in rows("ours", kernel))
    # ... except where the driver refused the PTX: that row's error, and the run went on
    refused = rows("ours", "hslm_dx_s8")
    assert all(r.disposition == "failed" and "CUDADriverError" in r.error for r in refused)
    assert all(r.ok for r in rows("cublas_f32", "hslm_dx_s8"))
    # the stand-in L2 is 4 KiB: the smallest sets are rotated (1 x L2), so rotation ran
    assert any(r.buffer_sets > 1 for r in report.rows if r.ok)
    # no cuBLAS in the stand-in: recorded as failures, never best
    assert all(r.disposition == "failed" and "cublas" in r.error for r in rows("cublas_int8"))
    # torch hidden: not run, with the reason
    assert all(r.disposition == "not_run" and "torch" in r.error
               for r in rows("torch_int_mm") + rows("torch_bf16"))
    assert all(s.best_baseline in ("cublas_f16", "cublas_f32") for s in report.summary)
    assert report.device.name == "STAND-IN numpy GPU" and not report.synthetic
    assert report.device.ceiling_int8_tops is None and "did not give a figure" in report.device.ceiling_source
    assert set(report.ptx_sha256) == set(bench.GEMM_KERNELS)
    assert [r.model_us for r in report.rows if r.model_us] == [2.5]


def test_baselines_are_timed_once_per_family_and_shape_after_every_ours_row():
    shapes = select_sets(("hslm",))["hslm"]
    jobs = bench.plan_rows(bench.GEMM_KERNELS, shapes)
    ours = [(j.kernel, j.shape.name) for j in jobs if j.impls == ("ours",)]
    baselines = [(KERNELS[j.kernel].family_name, j.shape.name) for j in jobs if j.impls != ("ours",)]
    assert ours == [(k, s.name) for k in bench.GEMM_KERNELS for s in shapes]
    assert len(baselines) == len(set(baselines)) == 3 * len(shapes)  # forward, dX, dW: once a shape
    assert jobs[: len(ours)] == [j for j in jobs if j.impls == ("ours",)]
    assert bench.row_count() == len(ours) + 5 * len(baselines) <= 170


def test_a_configuration_is_compared_with_its_familys_shared_baselines():
    def row(kernel, impl, us, family="hslm_fwd_s8"):
        return Row(kernel=kernel, family=family, shape="s", R=32, K=64, N=64, impl=impl, gemm=(32, 64, 64),
                   stream=Timing(samples_us=[us], median_us=us, p10_us=us, p90_us=us, calls_per_sample=1),
                   check=Check(passed=True, max_abs_err=0.0, rel_err=0.0, tolerance=0.0))
    rows = [row("hslm_fwd_s8", "ours", 2.0), row("hslm_fwd_s8_m32", "ours", 1.0),
            row("hslm_fwd_s8", "cublas_f16", 4.0), row("hslm_dx_s8", "cublas_f16", 0.5, family="hslm_dx_s8")]
    ratios = {s.kernel: s.ratio for s in bench.summarize(rows, None)}
    assert ratios == {"hslm_fwd_s8": 0.5, "hslm_fwd_s8_m32": 0.25}  # dX's baseline is not forward's
    unshared = [r.model_copy(update={"family": ""}) for r in rows]  # a record without families: its own
    assert {s.kernel: s.ratio for s in bench.summarize(unshared, None)} == {"hslm_fwd_s8": 0.5,
                                                                             "hslm_fwd_s8_m32": None}


def test_bench_resumes_only_the_ptx_it_started_with(standin_gpu, monkeypatch, tmp_path):
    """A fresh process carries on from the partial record; PTX changed since is refused in one line."""
    for kernel in bench.GEMM_KERNELS:
        (tmp_path / f"{kernel}.ptx").write_text(KERNELS[kernel].emit())
    monkeypatch.setattr(bench, "ptx_path", lambda k: tmp_path / f"{k}.ptx")
    method = Method(warmup=1, repeats=3, target_sample_us=1.0, l2_multiple=2.0)
    paths = bench.run_bench("smoke", method=method, out_dir=tmp_path / "out", ceiling_n=0,
                            kernels=("hslm_fwd_s8",), budget_s=1e-9)  # out of budget at once
    report = read_model(paths[0], BenchReport)
    assert report.complete and "time budget" in report.stopped
    assert len(report.rows) == 3 * 6 and all(r.not_run for r in report.rows)
    partial = report.model_copy(update={"rows": report.rows[:1], "complete": False, "stopped": None,
                                        "summary": bench.summarize(report.rows[:1], None)})
    write_model(paths[0], partial)
    again = read_model(bench.run_bench("smoke", resume=paths[0])[0], BenchReport)
    assert again.rows[:1] == partial.rows and len(again.rows) == 3 * 6 and again.complete
    assert sum(r.ok for r in again.rows if r.impl == "ours") == 2  # the two shapes it still had to run
    (tmp_path / "hslm_fwd_s8.ptx").write_text(KERNELS["hslm_fwd_s8"].emit() + "\n// changed\n")
    with pytest.raises(UserError, match="the PTX of hslm_fwd_s8 changed since the record was started"):
        bench.run_bench("smoke", resume=paths[0])


@pytest.mark.parametrize("args,fragment", [(["--ceiling", "-1"], "--ceiling -1: expected 0"),
                                           (["--budget-s", "0"], "--budget-s 0: expected"),
                                           (["--kernels", "hslm_fwd_f32"], "not an int8 GEMM kernel"),
                                           (["--nope"], "unrecognized arguments: --nope")])
def test_python_m_bench_bad_arguments_are_one_line(args, fragment, capsys):
    assert bench.main(["smoke", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and fragment in err and err.count("\n") == 1


@pytest.mark.skipif(gpu_available(), reason="the no-GPU line; a GPU machine runs the bench instead")
def test_a_cluster_bench_job_without_a_gpu_is_one_line_and_no_record():
    from hslm_ptx.pipeline.bench.remote import bench_on_node

    with pytest.raises(UserError, match=r"bench on .*: exit 2, no record; error: bench needs a CUDA GPU"):
        bench_on_node("smoke", 0, {"hslm_fwd_s8": "// ptx\n"}, None)


def test_the_bench_refuses_a_ptx_folder_that_is_not_there(capsys):
    assert bench.main(["smoke", "--ptx-dir", "/nonexistent/ptx"]) == 2
    assert capsys.readouterr().err.strip() == "error: --ptx-dir /nonexistent/ptx: no such folder"
