"""The bench record: one row per implementation x kernel x shape, and the figures derived
from it (statistics, GOP/s, peaks, the summary), plus the performance model's predictions.

hslm_ptx/pipeline/bench/run.py measures on a GPU and builds a :class:`BenchReport`;
hslm_ptx/pipeline/bench/report.py renders it. Every figure is derived from the raw samples
stored in the record: a Timing's median/p10/p90 must equal the statistics of its
samples, and a report's summary must equal what its rows give, or the record is
refused (a hand-edited or stale file is caught, not rendered).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, ValidationError, model_validator

from hslm_ptx.pipeline.core.artifacts import read_json

from hslm_ptx.pipeline.core.files import rel
from hslm_ptx.pipeline.core.errors import ArtifactError, UserError
from hslm_ptx.pipeline.core.models import Record


Impl = Literal["ours", "cublas_int8", "cublas_f16", "cublas_f32", "torch_int_mm", "torch_bf16"]
IMPLS: tuple[str, ...] = Impl.__args__  # table / plot order
Disposition = Literal["passed", "incorrect", "failed", "not_run"]
BASELINES: tuple[str, ...] = IMPLS[1:]

# Device int8 tensor-core peaks, DENSE (no 2:4 sparsity), at boost clock, in TOPS.
# NVIDIA datasheets print the sparse figure with an asterisk; dense is half of it.
# First match (case-insensitive substring of the device name) wins: specific names first.
PEAKS: tuple[tuple[str, float, str], ...] = (
    ("H200 NVL", 1670.5, "NVIDIA H200 NVL datasheet: INT8 Tensor Core 3,341 TOPS with sparsity; dense, no sparsity = half"),
    ("H200", 1979.0, "NVIDIA H200 SXM datasheet: INT8 Tensor Core 3,958 TOPS with sparsity; dense, no sparsity = half"),
    ("H100 NVL", 1670.5, "NVIDIA H100 NVL datasheet: INT8 Tensor Core 3,341 TOPS with sparsity; dense, no sparsity = half"),
    ("H100 PCIe", 1513.0, "NVIDIA H100 PCIe datasheet: INT8 Tensor Core 3,026 TOPS with sparsity; dense, no sparsity = half"),
    ("H100", 1979.0, "NVIDIA H100 SXM datasheet: INT8 Tensor Core 3,958 TOPS with sparsity; dense, no sparsity = half"),
    ("A100", 624.0, "NVIDIA A100 datasheet: INT8 Tensor Core 1,248 TOPS with sparsity; dense, no sparsity = 624"),
    ("L40S", 733.0, "NVIDIA L40S datasheet: INT8 Tensor Core 1,466 TOPS with sparsity; dense, no sparsity = half"),
    ("L4", 242.5, "NVIDIA L4 datasheet: INT8 Tensor Core 485 TOPS with sparsity; dense, no sparsity = half"),
)

# Relative-error tolerances (||out - ref|| / ||ref||) for the float baselines. Their
# operands are int8 values / 128, exact in f16, bf16 and f32, so only accumulation and
# output rounding count: f16 output rounding is 2^-11, bf16 2^-8 (the unit roundoff of each format).
# f16 gets the bf16 margin in case cuBLAS accumulates in f16; a wrong layout or a
# missing scale is off by O(1), far above any of these.
TOLERANCE: dict[str, float] = {"cublas_f32": 1e-4, "cublas_f16": 1e-2, "torch_bf16": 1e-2}


def peak_for(device_name: str) -> tuple[float, str] | tuple[None, None]:
    """(dense int8 TOPS, source) for a device name, or (None, None) when not in PEAKS."""
    for key, tops, source in PEAKS:
        if key.lower() in device_name.lower():
            return tops, source
    return None, None


def percentiles(samples: list[float]) -> tuple[float, float, float]:
    """(median, p10, p90) with numpy's linear interpolation: the one definition used.

    Times are finite and positive; anything else is a broken measurement (ValueError).
    """
    arr = np.asarray(samples, dtype=np.float64)
    if arr.size == 0 or not (np.isfinite(arr).all() and (arr > 0).all()):
        raise ValueError(f"timing samples must be finite and > 0, got {samples[:5]}...")
    p10, median, p90 = np.percentile(arr, [10, 50, 90])
    return float(median), float(p10), float(p90)


def gops(R: int, K: int, N: int, seconds: float) -> float:
    """Throughput counted as 2*R*K*N operations (one multiply + one add per MAC)."""
    return 2.0 * R * K * N / seconds / 1e9


class Timing(Record):
    """Device time per call over repeats, in microseconds, with the samples it came from.

    One sample times ``calls_per_sample`` back-to-back launches between two CUDA events
    and divides by that count, so microsecond kernels are timed well above the events'
    resolution.
    """

    samples_us: list[float] = Field(min_length=1)
    calls_per_sample: int = Field(ge=1)
    median_us: float
    p10_us: float
    p90_us: float

    @classmethod
    def of(cls, samples_us: list[float], calls_per_sample: int) -> "Timing":
        median, p10, p90 = percentiles(samples_us)
        return cls(samples_us=list(samples_us), calls_per_sample=calls_per_sample,
                   median_us=median, p10_us=p10, p90_us=p90)

    @model_validator(mode="after")
    def _stats_match_samples(self) -> "Timing":
        want = percentiles(self.samples_us)
        got = (self.median_us, self.p10_us, self.p90_us)
        if not np.allclose(got, want, rtol=1e-9, atol=0):
            raise ValueError(f"median/p10/p90 {got} do not match the samples' {want}")
        return self


class Check(Record):
    """The output compared with the exact integer reference (scaled for float paths)."""

    max_abs_err: float
    rel_err: float  # ||out - ref|| / ||ref||
    tolerance: float  # 0: must be exact
    passed: bool

    @classmethod
    def of(cls, out: np.ndarray, ref: np.ndarray, tolerance: float) -> "Check":
        out = np.asarray(out, dtype=np.float64)
        ref = np.asarray(ref, dtype=np.float64)
        if out.shape != ref.shape:
            return cls(max_abs_err=math.inf, rel_err=math.inf, tolerance=tolerance, passed=False)
        diff = out - ref
        finite = bool(np.isfinite(out).all())
        max_abs = float(np.abs(diff).max()) if finite else math.inf
        norm = float(np.linalg.norm(ref))
        rel = (float(np.linalg.norm(diff)) / norm if norm else max_abs) if finite else math.inf
        passed = finite and (max_abs == 0 if tolerance == 0 else rel <= tolerance)
        return cls(max_abs_err=max_abs, rel_err=rel, tolerance=tolerance, passed=passed)


class Row(Record):
    """One implementation on one (kernel, shape): its timings, check, and what it ran."""

    kernel: str  # a baseline's: the first kernel of the family it is shared by
    shape: str
    R: int
    K: int
    N: int
    impl: Impl
    family: str = ""  # the product (kernels' family) whose baselines this row's compare with
    gemm: tuple[int, int, int]  # (M, inner, out) as run, after any padding
    note: str = ""  # padding and layout the row needed, in words
    buffer_sets: int = 1  # input sets rotated so the working set exceeds L2
    stream: Timing | None = None  # back-to-back launches on one stream
    graph: Timing | None = None  # the same launches replayed from one CUDA graph
    graph_error: str | None = None
    check: Check | None = None
    error: str | None = None  # why it did not run (torch missing, a cuBLAS error, ...)
    not_run: bool = False  # error is a reason it was not attempted (torch missing, R over bound)
    model_us: float | None = Field(default=None, gt=0)  # the performance model's prediction

    @model_validator(mode="after")
    def _not_run_has_a_reason(self) -> "Row":
        if self.not_run and not self.error:
            raise ValueError("not_run needs the reason in 'error'")
        return self

    @property
    def ok(self) -> bool:
        """Ran and computed the right answer: only such a row may count as a baseline."""
        return self.error is None and self.stream is not None and self.check is not None \
            and self.check.passed

    @property
    def disposition(self) -> Disposition:
        """passed / incorrect / failed / not_run, as a GEMM profiler reports a run."""
        if self.error:
            return "not_run" if self.not_run else "failed"
        if self.check is not None and not self.check.passed:
            return "incorrect"
        return "passed" if self.ok else "failed"

    def gops(self) -> float | None:
        return gops(self.R, self.K, self.N, self.stream.median_us * 1e-6) if self.stream else None


class Device(Record):
    name: str
    driver: str | None = None
    cuda_runtime: str | None = None
    compute_capability: str | None = None
    arch: str | None = None  # "sm_90": the bench evidence is kept per arch
    node: str = ""  # the machine that ran it (and its Ray node id on a cluster)
    sm_count: int | None = None
    l2_bytes: int | None = None
    clocks: dict[str, str] = {}  # e.g. {"sm_mhz": "1980", "mem_mhz": "3201", ...}
    clocks_source: str = ""  # "nvidia-smi" or "cupy device attributes"
    libraries: dict[str, str] = {}  # cupy, torch, cublas versions
    peak_int8_tops: float | None = None  # datasheet, dense, no sparsity
    peak_source: str | None = None
    ceiling_int8_tops: float | None = None  # measured in the same run (a large cuBLAS int8 GEMM)
    ceiling_source: str | None = None


class Method(Record):
    """How the numbers were taken, so a reader can judge them."""

    warmup: int
    repeats: int
    target_sample_us: float  # a sample spans at least this much device time
    l2_multiple: float  # rotated working set >= this many times L2
    timer: str = "cupyx.profiler.benchmark (CUDA events), per-call = sample / calls_per_sample"
    baseline_operands: str = (
        "baselines get the dense int8 GEMM operands pre-laid-out (W unpacked, transposes "
        "done) outside the timed region; float baselines get them / 128 (exact in f16/bf16/f32)"
    )


class Summary(Record):
    """Ours against the fastest correct baseline on one (kernel, shape)."""

    kernel: str
    shape: str
    ours_us: float | None
    best_baseline: str | None
    best_us: float | None
    ratio: float | None  # ours / best (time): < 1 means ours is faster
    ours_graph_us: float | None = None
    best_graph_baseline: str | None = None
    best_graph_us: float | None = None
    graph_ratio: float | None = None
    gops: float | None = None
    peak_fraction: float | None = None  # of the dense int8 peak
    model_us: float | None = None  # the performance model's prediction for ours


def summarize(rows: list[Row], peak_tops: float | None) -> list[Summary]:
    """One Summary per (kernel, shape) with an "ours" row, in row order. A kernel is compared with the
    baselines of its family on the shape (timed once, shared by the family's
    configurations; a record without families: its own). Failed or wrong baselines never win."""
    keys = list(dict.fromkeys((r.kernel, r.shape) for r in rows if r.impl == "ours"))
    family = {r.kernel: r.family or r.kernel for r in rows}
    out = []
    for kernel, shape in keys:
        group = [r for r in rows if (r.kernel, r.shape) == (kernel, shape)]
        ours = next((r for r in group if r.impl == "ours" and r.ok), None)
        model = next((r.model_us for r in group if r.impl == "ours"), None)
        base = [r for r in rows if r.impl != "ours" and r.ok and r.shape == shape
                and (r.family or r.kernel) == family[kernel]]
        best = min(base, key=lambda r: r.stream.median_us, default=None)
        gbase = [r for r in base if r.graph is not None]
        gbest = min(gbase, key=lambda r: r.graph.median_us, default=None)
        ours_us = ours.stream.median_us if ours else None
        ours_g = ours.graph.median_us if ours and ours.graph else None
        rate = ours.gops() if ours else None
        out.append(Summary(
            kernel=kernel, shape=shape, ours_us=ours_us,
            best_baseline=best.impl if best else None,
            best_us=best.stream.median_us if best else None,
            ratio=ours_us / best.stream.median_us if ours_us and best else None,
            ours_graph_us=ours_g,
            best_graph_baseline=gbest.impl if gbest else None,
            best_graph_us=gbest.graph.median_us if gbest else None,
            graph_ratio=ours_g / gbest.graph.median_us if ours_g and gbest else None,
            gops=rate,
            peak_fraction=rate / (peak_tops * 1e3) if rate and peak_tops else None,
            model_us=model,
        ))
    return out


class BenchReport(Record):
    """``doit bench shape=<set>``: every kernel x shape x implementation of one run."""

    shape_set: str
    created: str  # ISO 8601, UTC
    synthetic: bool = False  # True only for made-up sample data (tests); never a measurement
    # False while the run is still going (the record is rewritten after every row, so a
    # run cut off by a time limit leaves the rows it finished) or after an interruption
    complete: bool = True
    stopped: str | None = None  # why rows were left unrun (the time budget, an interruption)
    device: Device
    method: Method
    ptx_sha256: dict[str, str]  # kernel -> the PTX that was timed
    rows: list[Row]
    summary: list[Summary]

    @model_validator(mode="after")
    def _summary_matches_rows(self) -> "BenchReport":
        if self.summary != summarize(self.rows, self.device.peak_int8_tops):
            raise ValueError("summary does not match the rows; rebuild it with summarize()")
        return self


# ---------------------------------------------------------------- predictions

class Prediction(Record):
    """One figure of the performance model: our kernel's predicted time on one shape.

    Written by ``doit model`` (a MODEL figure, never a measurement), read by the bench to
    put the prediction beside the measured row."""

    kernel: str
    shape: str
    predicted_us: float = Field(gt=0)  # device time
    per_call_us: float | None = Field(default=None, gt=0)  # device time + launch cost
    kind: Literal["MODEL"] = "MODEL"


def load_predictions(path: Path) -> list[Prediction]:
    """A JSON list of {kernel, shape, predicted_us}; anything else is one :class:`UserError` line."""
    name = rel(Path(path))
    if not Path(path).exists():
        raise UserError(f"{name}: prediction file missing")
    try:
        raw = read_json(Path(path))  # strict: refuses duplicate keys and non-UTF-8 bytes
    except ArtifactError as exc:
        raise UserError(str(exc)) from None
    if not isinstance(raw, list):
        raise UserError(f"{name}: expected a JSON list of {{kernel, shape, predicted_us}}, "
                        f"got {type(raw).__name__}")
    preds, seen = [], set()
    for number, entry in enumerate(raw, start=1):
        try:
            pred = Prediction.model_validate(entry)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "(entry)"
            raise UserError(f"{name}: entry {number}: field '{field}': {err['msg']}; "
                            "expected {kernel, shape, predicted_us > 0}") from None
        if (pred.kernel, pred.shape) in seen:
            raise UserError(f"{name}: entry {number}: a second prediction for "
                            f"{pred.kernel} {pred.shape}; keep one")
        seen.add((pred.kernel, pred.shape))
        preds.append(pred)
    return preds


def with_predictions(report: BenchReport, preds: list[Prediction]) -> BenchReport:
    """The report with each ``ours`` row's model_us set from ``preds`` (None where none);
    predictions for shapes the report does not have are left out."""
    by_cell = {(p.kernel, p.shape): p.predicted_us for p in preds}
    rows = [r.model_copy(update={"model_us": by_cell.get((r.kernel, r.shape)) if r.impl == "ours"
                                 else None}) for r in report.rows]
    return report.model_copy(update={"rows": rows,
                                      "summary": summarize(rows, report.device.peak_int8_tops)})
