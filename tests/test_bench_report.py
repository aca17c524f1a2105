"""The bench's CPU half: statistics, checks, peaks, summary, table, plot, sizing, GEMM forms,
and the one-line stop without a GPU.

tests/data/bench/sample_hslm.json is SYNTHETIC sample data (``synthetic: true``, device
"SYNTHETIC SAMPLE - no GPU ran this"): made-up times that exercise every branch of the
report (a planted wrong-but-fastest baseline, rows that did not run, a failed graph
capture). It is not a measurement and nothing here reads it as one.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from kernels.registry import KERNELS
from kernels.spec import Dims
from pipeline import bench
from pipeline.artifacts import ROOT, read_model
from pipeline.bench_report import (PEAKS, SYNTHETIC_BANNER, BenchReport, Check, Timing, gops,
                                   markdown, peak_for, percentiles, plot_png, summarize,
                                   write_outputs)

SAMPLE = Path(__file__).parent / "data" / "bench" / "sample_hslm.json"


@pytest.fixture(scope="module")
def sample() -> BenchReport:
    return read_model(SAMPLE, BenchReport)


# ---- statistics --------------------------------------------------------------------

def test_percentiles_by_hand():
    # 1..10: median 5.5; linear interpolation puts p10 at 1.9 and p90 at 9.1
    assert percentiles([float(x) for x in range(10, 0, -1)]) == pytest.approx((5.5, 1.9, 9.1))
    assert percentiles([7.0]) == (7.0, 7.0, 7.0)


def test_timing_recomputes_and_refuses_tampered_stats():
    t = Timing.of([3.0, 1.0, 2.0], calls_per_sample=4)
    assert (t.median_us, t.p10_us, t.p90_us) == pytest.approx((2.0, 1.2, 2.8))
    with pytest.raises(ValidationError, match="do not match"):
        Timing(**{**t.model_dump(), "median_us": 1.5})


@pytest.mark.parametrize("bad", [[1.0, float("nan")], [0.0, 1.0], [-2.0], [1.0, math.inf]])
def test_timing_refuses_impossible_samples(bad):
    with pytest.raises(ValueError, match="finite and > 0"):
        Timing.of(bad, 1)
    good = Timing.of([1.0, 2.0], 1)
    with pytest.raises(ValidationError, match="finite and > 0"):  # also when read from a file
        Timing(**{**good.model_dump(), "samples_us": bad})


def test_gops_counts_two_ops_per_mac():
    assert gops(1000, 1000, 1000, 1e-3) == pytest.approx(2000.0)
    assert gops(27, 243, 729, 1e-6) == pytest.approx(2 * 27 * 243 * 729 / 1e3)


# ---- output checks -----------------------------------------------------------------

def test_check_exact_and_tolerant():
    ref = np.arange(12, dtype=np.int64).reshape(3, 4) - 5
    assert Check.of(ref.copy(), ref, 0.0).passed
    off = ref.copy()
    off[2, 3] += 1
    bad = Check.of(off, ref, 0.0)
    assert not bad.passed and bad.max_abs_err == 1.0
    noisy = ref * (1 + 1e-4)
    assert Check.of(noisy, ref, 1e-3).passed
    assert not Check.of(noisy, ref, 1e-5).passed


def test_check_refuses_nan_inf_and_wrong_shape():
    ref = np.ones((2, 2))
    assert not Check.of(np.full((2, 2), np.nan), ref, 1e-2).passed
    assert not Check.of(np.array([[1, np.inf], [1, 1]]), ref, 1e-2).passed
    assert not Check.of(np.ones((2, 3)), ref, 1e-2).passed


# ---- peaks -------------------------------------------------------------------------

@pytest.mark.parametrize("name,tops", [
    ("NVIDIA H200", 1979.0), ("NVIDIA H200 NVL", 1670.5), ("NVIDIA H100 80GB HBM3", 1979.0),
    ("NVIDIA H100 PCIe", 1513.0), ("NVIDIA A100-SXM4-80GB", 624.0), ("NVIDIA L4", 242.5),
    ("NVIDIA L40S", 733.0),
])
def test_peak_table(name, tops):
    got, source = peak_for(name)
    assert got == tops
    assert "dense, no sparsity" in source and "datasheet" in source


def test_peak_unknown_device_is_none():
    assert peak_for("NVIDIA GeForce RTX 3090") == (None, None)
    # every entry is the dense figure: half of a sparse datasheet number, never above it
    assert all(0 < tops < 2000 for _, tops, _ in PEAKS)


# ---- the sample report -------------------------------------------------------------

def test_sample_is_marked_synthetic(sample):
    assert sample.synthetic and "SYNTHETIC" in sample.device.name
    text = markdown(sample)
    assert SYNTHETIC_BANNER in text
    assert text.index(SYNTHETIC_BANNER) < text.index("## hslm_fwd_s8")


def test_real_report_has_no_banner(sample):
    real = sample.model_copy(update={"synthetic": False})
    assert SYNTHETIC_BANNER not in markdown(real)


def test_summary_skips_a_wrong_baseline_however_fast(sample):
    rows = [r for r in sample.rows if (r.kernel, r.shape) == ("hslm_dx_s8", "attn_r27")]
    fastest = min((r for r in rows if r.stream and r.impl != "ours"), key=lambda r: r.stream.median_us)
    assert fastest.impl == "cublas_f16" and not fastest.check.passed
    s = next(s for s in sample.summary if (s.kernel, s.shape) == ("hslm_dx_s8", "attn_r27"))
    assert s.best_baseline == "cublas_int8"
    ours = next(r for r in rows if r.impl == "ours")
    best = next(r for r in rows if r.impl == "cublas_int8")
    assert s.ratio == pytest.approx(ours.stream.median_us / best.stream.median_us)
    # negative: were its check passed, it would win; so the exclusion is what decided
    fixed = [r.model_copy(update={"check": r.check.model_copy(update={"passed": True})})
             if r is fastest else r for r in rows]
    assert summarize(fixed, None)[0].best_baseline == "cublas_f16"


def test_summary_rates_and_peak_fraction(sample):
    s = sample.summary[0]
    row = next(r for r in sample.rows if (r.kernel, r.shape, r.impl) == (s.kernel, s.shape, "ours"))
    assert s.gops == pytest.approx(2 * row.R * row.K * row.N / (row.stream.median_us * 1e3))
    assert s.peak_fraction == pytest.approx(s.gops / (sample.device.peak_int8_tops * 1e3))
    assert summarize(sample.rows, None)[0].peak_fraction is None


def test_rows_not_run_never_count(sample):
    not_run = [r for r in sample.rows if r.error]
    assert not_run and not any(r.ok for r in not_run)
    assert all(s.best_baseline != "torch_int_mm" for s in sample.summary)
    assert "not run" in markdown(sample)


def test_report_refuses_a_summary_that_does_not_match_rows(sample):
    data = sample.model_dump()
    data["summary"][0]["ratio"] = 0.01
    with pytest.raises(ValidationError, match="summary does not match"):
        BenchReport.model_validate(data)


def test_markdown_shows_padding_graph_errors_and_wrong_rows(sample):
    text = markdown(sample)
    assert "inner 243->244 (cuBLAS int8 needs lda, ldb multiples of 4)" in text
    assert "graph: CUDARuntimeError" in text
    assert "WRONG rel 5.0e-01" in text
    assert "## summary: ours / best baseline" in text
    assert text.count("| hslm_dw_s8 |") == 2  # one summary line per shape


def test_outputs_written_and_json_round_trips(sample, tmp_path):
    paths = write_outputs(sample, tmp_path)
    assert [p.name for p in paths] == ["sample.json", "sample.md", "sample.png"]
    assert read_model(paths[0], BenchReport) == sample
    png = paths[2].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert paths[1].read_text() == markdown(sample)


def test_plot_draws_only_correct_rows(sample, monkeypatch):
    drawn: list[str] = []
    from matplotlib.axes import Axes

    real = Axes.errorbar
    monkeypatch.setattr(Axes, "errorbar", lambda self, *a, **k: drawn.append(k["label"]) or real(self, *a, **k))
    plot_png(sample)
    # 3 kernels x 4 implementations that ran; the torch rows did not run
    assert len(drawn) == 12 and "torch_int_mm" not in drawn and drawn.count("ours") == 3


# ---- sizing and the GEMM each kernel is ------------------------------------------

def test_sets_needed_exceeds_l2_up_to_the_cap():
    l2 = 50 * 2**20
    n = bench.sets_needed(2**20, l2, 2.0)
    assert n == 100 and n * 2**20 >= 2 * l2
    assert bench.sets_needed(1000, l2, 2.0) == bench.MAX_SETS
    assert bench.sets_needed(10 * l2, l2, 2.0) == 1


def test_calls_per_sample():
    assert bench.calls_per_sample(2.0, 1, 200.0) == 100
    assert bench.calls_per_sample(2.0, 256, 200.0) == 256  # every set visited
    assert bench.calls_per_sample(5000.0, 3, 200.0) == 3
    assert bench.calls_per_sample(0.0, 1, 200.0) == bench.MAX_CALLS


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_gemm_form_is_the_kernel(kernel):
    """Baselines compute A @ Bt.T; it must be exactly what the kernel's reference gives."""
    spec = KERNELS[kernel]
    dims = Dims(R=7, K=21, N=11)
    inputs = spec.make_inputs(dims, np.random.default_rng(5))
    A, Bt = bench.gemm_problem(kernel, inputs, dims)
    assert A.dtype == Bt.dtype == np.int8 and A.flags.c_contiguous and Bt.flags.c_contiguous
    got = A.astype(np.int64) @ Bt.T.astype(np.int64)
    want = spec.reference(dims, inputs)
    assert got.shape == want.shape and np.array_equal(got, want)


def test_gemm_form_check_catches_a_wrong_form(monkeypatch):
    """Negative: dX with W instead of W^T is not the kernel (the test above would fail)."""
    spec = KERNELS["hslm_dx_s8"]
    dims = Dims(R=5, K=13, N=13)
    inputs = spec.make_inputs(dims, np.random.default_rng(1))
    monkeypatch.setitem(bench.GEMM_FORMS, "hslm_dx_s8",
                        lambda i, d: (i["dy"], bench.unpack(i["w"], d.K).T))
    A, Bt = bench.gemm_problem("hslm_dx_s8", inputs, dims)
    assert not np.array_equal(A.astype(np.int64) @ Bt.T.astype(np.int64), spec.reference(dims, inputs))


def test_pad_note_names_only_changed_dims():
    assert bench._pad_note([("inner", 243, 244), ("out", 8, 8)], "why") == \
        "padded with zeros: inner 243->244 (why)"
    assert bench._pad_note([("inner", 8, 8)], "why") == ""


# ---- no GPU: one line, non-zero exit ------------------------------------------------

def test_require_gpu_without_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    with pytest.raises(bench.NoGpu) as exc:
        bench.require_gpu()
    msg = str(exc.value)
    assert "\n" not in msg and "import cupy" in msg and "doit verify" in msg


@pytest.mark.parametrize("count", [0, RuntimeError("cudaErrorNoDevice: no CUDA-capable device")])
def test_require_gpu_without_a_device(monkeypatch, count):
    def get_count():
        if isinstance(count, Exception):
            raise count
        return count

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(
        getDeviceCount=get_count)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    with pytest.raises(bench.NoGpu, match="getDeviceCount") as exc:
        bench.require_gpu()
    assert "\n" not in str(exc.value)


def test_require_gpu_with_a_device(monkeypatch):
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(
        getDeviceCount=lambda: 1)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert bench.require_gpu() is fake


def _no_gpu_env() -> dict[str, str]:
    # hide any GPU, so the stop is tested even on a machine that has one
    return {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


def test_doit_bench_without_gpu_stops_with_one_line(tmp_path):
    dodo = tmp_path / "bench_dodo.py"  # not "dodo": doit imports it by module name
    dodo.write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
        "from pipeline.tasks_build import task_emit  # noqa\n"
        "from pipeline.tasks_bench import task_bench  # noqa\n")
    res = subprocess.run([sys.executable, "-m", "doit", "-f", str(dodo), "-d", str(ROOT),
                          "--db-file", str(tmp_path / "db"), "bench"],
                         capture_output=True, text=True, env=_no_gpu_env(), timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "Traceback" not in out
    lines = [line for line in out.splitlines() if line.startswith("bench needs a CUDA GPU")]
    assert len(lines) == 1 and "doit verify" in lines[0]


def test_python_m_bench_without_gpu(tmp_path):
    res = subprocess.run([sys.executable, "-m", "pipeline.bench", "hslm"], cwd=ROOT,
                         capture_output=True, text=True, env=_no_gpu_env(), timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.startswith("error: bench needs a CUDA GPU") and res.stderr.count("\n") == 1


# ---- the whole GPU flow on a stand-in: numpy as "cupy", the emulator as its module loader ----

def fake_gpu(monkeypatch) -> None:
    """Just enough of cupy/cupyx for run_bench's plumbing, on numpy. No cuBLAS (so those
    rows must come out as errors, not crashes) and graphs that replay nothing: this checks
    the flow, the records and the error paths, never a timing."""
    import time
    from kernels.ptxemu import Module

    class Event:
        def record(self, stream=None):
            self.t = time.perf_counter()

        def synchronize(self):
            pass

    class Stream:
        def __init__(self, non_blocking=False):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def begin_capture(self):
            pass

        def end_capture(self):
            return types.SimpleNamespace(launch=lambda stream=None: None)

    class Device:
        id = 0
        attributes = {"L2CacheSize": 1024, "MultiProcessorCount": 2}

        def synchronize(self):
            pass

    def benchmark(func, n_repeat, n_warmup):
        for _ in range(n_warmup):
            func()
        times = []
        for _ in range(n_repeat):
            t0 = time.perf_counter()
            func()
            times.append(time.perf_counter() - t0 + 1e-9)
        return types.SimpleNamespace(gpu_times=np.array([times]))

    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1, driverGetVersion=lambda: 12040, runtimeGetVersion=lambda: 12040,
        getDeviceProperties=lambda i: {"name": b"FAKE numpy GPU", "major": 8, "minor": 0})
    class FunctionModule:  # cupy.cuda.function.Module: PTX bytes in, kernels out
        def load(self, image):
            self.module = Module(code=image.decode())

        def get_function(self, name):
            return self.module.get_function(name)

    cuda = types.ModuleType("cupy.cuda")
    cuda.__dict__.update(runtime=runtime, Event=Event, Stream=Stream, Device=Device,
                         function=types.SimpleNamespace(Module=FunctionModule),
                         get_elapsed_time=lambda a, b: max(b.t - a.t, 1e-6) * 1e3)
    cupy = types.ModuleType("cupy")
    cupy.__dict__.update(
        __version__="0-fake", cuda=cuda, int32=np.int32, float64=np.float64, ndarray=np.ndarray,
        asarray=lambda a, dtype=None: np.array(a, dtype=dtype), asnumpy=np.asarray, full=np.full,
        zeros=np.zeros, matmul=np.matmul, ascontiguousarray=np.ascontiguousarray)
    profiler = types.ModuleType("cupyx.profiler")
    profiler.benchmark = benchmark
    for name, mod in {"cupy": cupy, "cupy.cuda": cuda, "cupyx": types.ModuleType("cupyx"),
                      "cupyx.profiler": profiler}.items():
        monkeypatch.setitem(sys.modules, name, mod)


def test_bench_flow_on_a_stand_in_gpu(monkeypatch, tmp_path):
    from pipeline.bench_report import Method

    fake_gpu(monkeypatch)
    for kernel, spec in KERNELS.items():
        (tmp_path / f"{kernel}.ptx").write_text(spec.emit())
    monkeypatch.setattr(bench, "ptx_path", lambda k: tmp_path / f"{k}.ptx")
    method = Method(warmup=1, repeats=3, target_sample_us=1.0, l2_multiple=2.0)
    paths = bench.run_bench("smoke", method=method, out_dir=tmp_path / "out", ceiling_n=32)
    assert [p.name for p in paths] == ["smoke.json", "smoke.md", "smoke.png"]
    report = read_model(paths[0], BenchReport)
    shapes = 3  # smoke
    assert len(report.rows) == len(KERNELS) * shapes * 6
    by_impl = lambda impl: [r for r in report.rows if r.impl == impl]  # noqa: E731
    # our PTX ran (on the emulator, standing in for the GPU) and matched exactly
    assert all(r.ok and r.check.tolerance == 0 and r.stream and r.graph for r in by_impl("ours"))
    # the stand-in L2 is 1 KiB: the smallest sets are rotated (2 x L2), so rotation ran
    assert any(r.buffer_sets > 1 for r in report.rows if r.ok)
    # no cuBLAS in the stand-in: recorded as errors, never best
    assert all(r.error and "cublas" in r.error for r in by_impl("cublas_int8"))
    assert all(r.ok for r in by_impl("cublas_f32"))
    assert all(not r.ok and r.error for r in by_impl("torch_int_mm") + by_impl("torch_bf16"))
    assert all(s.best_baseline in ("cublas_f16", "cublas_f32") and s.ratio > 0 for s in report.summary)
    assert report.device.name == "FAKE numpy GPU" and not report.synthetic
    assert report.device.ceiling_int8_tops is None and "did not give a figure" in report.device.ceiling_source
    assert set(report.ptx_sha256) == set(KERNELS)
