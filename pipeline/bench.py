"""`doit bench shape=<set>`: our kernels against cuBLAS and torch on the same problems.

GPU only. :func:`require_gpu` looks for what the bench needs (``import cupy`` and a
device count >= 1) and stops with one line saying which was missing and what to do.

Per kernel and shape, every implementation is a :class:`Case`: a way to allocate one
buffer set (inputs + an output filled with poison), a launch on a set, and a way to read
the set's output back in the reference's units. The generic code then
1. launches once on set 0 and checks the output against the exact integer reference
   (float baselines within a tolerance, :data:`pipeline.bench_report.TOLERANCE`), so a
   wrong implementation is never counted as a fast one;
2. allocates enough further sets that the rotated working set exceeds ``l2_multiple``
   times L2 (up to :data:`MAX_SETS`), so large shapes are not timed out of L2;
3. times back-to-back launches on one stream (CUDA events, cupyx.profiler.benchmark,
   after warm-up, each sample long enough to dwarf the events' resolution);
4. times the same launches replayed from one CUDA graph, which removes the CPU launch
   cost: the gap between 3 and 4 is launch overhead.

Baselines compute the same GEMM out = A @ B with the dense int8 operands (W unpacked,
transposes done) prepared outside the timed region; whatever padding a library needs
is applied there too and named in the row's note.
"""
from __future__ import annotations

import itertools
import math
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

import numpy as np

from kernels.launch import kernel_args
from kernels.registry import KERNELS
from kernels.spec import Dims, KernelSpec
from kernels.ternary import unpack
from pipeline.artifacts import ARTIFACTS, UserError, rel, sha256_file
from pipeline.bench_report import (TOLERANCE, BenchReport, Check, Device, Method, Row, Timing,
                                   markdown, peak_for, summarize, write_outputs)
from pipeline.config import ptx_path
from pipeline.models import Shape
from pipeline.verify import seed  # the verify cell's inputs: same data, same seed

BENCH_DIR = ARTIFACTS / "bench"
MAX_SETS = 256  # rotation cap: tiny shapes stay L2-resident, as they would in a trainer
MAX_CALLS = 20000
INT_POISON = -0x2A2A2A2B  # written into every int output before the checked launch
DEFAULT_METHOD = Method(warmup=10, repeats=100, target_sample_us=200.0, l2_multiple=2.0)

# Each kernel as the GEMM out = A @ Bt.T in its output's layout (A: M x inner, Bt: out x inner).
GEMM_FORMS: dict[str, Callable[[dict[str, np.ndarray], Dims], tuple[np.ndarray, np.ndarray]]] = {
    "hslm_fwd_s8": lambda i, d: (i["x"], unpack(i["w"], d.K).T),  # Y = X W
    "hslm_dx_s8": lambda i, d: (i["dy"], unpack(i["w"], d.K)),  # dX = dY W^T
    "hslm_dw_s8": lambda i, d: (i["dy"].T, i["x"].T),  # dW = dY^T X (N x K)
}


class NoGpu(UserError):
    """The bench cannot run here: no CuPy or no CUDA device."""


def require_gpu() -> Any:
    """CuPy, once it has imported and sees a device; else :class:`NoGpu` in one line."""
    todo = ("run it on a GPU machine (see tools/on-device.sh); "
            "`doit verify` checks the kernels on the CPU emulator")
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install raising on import
        raise NoGpu(f"bench needs a CUDA GPU: looked for `import cupy` and it failed "
                    f"({type(exc).__name__}: {exc}); install cupy-cuda12x "
                    f"(pip install -e '.[gpu]') and {todo}") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
        why = ""
    except Exception as exc:  # CUDARuntimeError: no driver, no device
        count, why = 0, f" ({type(exc).__name__}: {exc})"
    if count < 1:
        raise NoGpu(f"bench needs a CUDA GPU: cupy imported but "
                    f"cupy.cuda.runtime.getDeviceCount() found no device{why}; {todo}")
    return cupy


# ---------------------------------------------------------------- sizing (pure, CPU-tested)

def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def sets_needed(set_bytes: int, l2_bytes: int, l2_multiple: float, cap: int = MAX_SETS) -> int:
    """Buffer sets to rotate so that sets * set_bytes >= l2_multiple * L2 (at most ``cap``)."""
    return max(1, min(cap, math.ceil(l2_multiple * l2_bytes / max(1, set_bytes))))


def calls_per_sample(est_us: float, sets: int, target_us: float, cap: int = MAX_CALLS) -> int:
    """Launches per timed sample: a sample spans >= target_us and visits every set once."""
    need = math.ceil(target_us / est_us) if est_us > 0 else cap
    return max(sets, min(cap, need))


def gemm_problem(kernel: str, inputs: dict[str, np.ndarray], dims: Dims) -> tuple[np.ndarray, np.ndarray]:
    """Contiguous int8 (A, Bt) with the kernel's output == A @ Bt.T."""
    a, bt = GEMM_FORMS[kernel](inputs, dims)
    return np.ascontiguousarray(a, dtype=np.int8), np.ascontiguousarray(bt, dtype=np.int8)


# ---------------------------------------------------------------- cases

@dataclass
class Problem:
    kernel: str
    shape: Shape
    dims: Dims
    inputs: dict[str, np.ndarray]  # the kernel's own inputs (host)
    A: np.ndarray  # int8 M x inner
    Bt: np.ndarray  # int8 out x inner
    ref: np.ndarray  # int64 M x out, exact

    @property
    def gemm(self) -> tuple[int, int, int]:
        return (self.A.shape[0], self.A.shape[1], self.Bt.shape[0])


@dataclass
class Case:
    make_set: Callable[[], dict[str, Any]]  # one buffer set; "out" holds poison
    launch: Callable[[dict[str, Any]], None]
    result: Callable[[dict[str, Any]], np.ndarray]  # out, unpadded, in the reference's units
    gemm: tuple[int, int, int]
    note: str = ""
    tolerance: float = 0.0
    capture: str = "cupy"  # graph API: "cupy" (stream capture) or "torch" (CUDAGraph)
    sets: list[dict[str, Any]] = field(default_factory=list)


def _pad(host: np.ndarray, rows: int, cols: int) -> np.ndarray:
    out = np.zeros((rows, cols), dtype=host.dtype)
    out[: host.shape[0], : host.shape[1]] = host
    return out


def _pad_note(what: list[tuple[str, int, int]], why: str) -> str:
    changed = [f"{name} {a}->{b}" for name, a, b in what if a != b]
    return f"padded with zeros: {', '.join(changed)} ({why})" if changed else ""


def case_ours(cp: Any, p: Problem, spec: KernelSpec, fn: Callable[..., Any]) -> Case:
    geo = spec.geometry(p.dims)
    out_shape = spec.output.shape(p.dims)
    split = geo.grid[2] > 1  # split-K adds into the output: it starts at 0, zeroed in every call

    def make_set() -> dict[str, Any]:
        bufs = {prm.name: cp.asarray(p.inputs[prm.name]) for prm in spec.params[1:]
                if prm.shape is not None}
        bufs["out"] = cp.full(out_shape, 0 if split else INT_POISON, dtype=spec.output.dtype)
        bufs["args"] = kernel_args(spec, p.dims, bufs["out"], bufs)
        return bufs

    def launch(s: dict[str, Any]) -> None:
        if split:
            s["out"].fill(0)
        fn(geo.grid, geo.block, s["args"], shared_mem=geo.shared_mem)

    return Case(make_set=make_set, launch=launch,
                result=lambda s: cp.asnumpy(s["out"]), gemm=p.gemm,
                note=f"grid {geo.grid} block {geo.block}")


def case_cublas_int8(cp: Any, p: Problem) -> Case:
    """cublasGemmEx int8 x int8 -> int32 (CUBLAS_COMPUTE_32I), TN layout.

    Row-major out (M x n) = A Bt^T is column-major out^T = op_T(Bt) op_N(A): cuBLAS
    sees m=n_out, n=M, k=inner with lda = ldb = inner, which it needs a multiple of 4.
    """
    from cupy.cuda import cublas, runtime

    M, inner, n_out = p.gemm
    kp = round_up(inner, 4)
    handle = cp.cuda.device.get_cublas_handle()
    one, zero = np.array(1, np.int32), np.array(0, np.int32)  # host scalars, kept alive

    def make_set() -> dict[str, Any]:
        return {"a": cp.asarray(_pad(p.A, M, kp)), "bt": cp.asarray(_pad(p.Bt, n_out, kp)),
                "out": cp.full((M, n_out), INT_POISON, dtype=cp.int32)}

    def run(s: dict[str, Any]) -> None:
        cublas.gemmEx(handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, n_out, M, kp,
                      one.ctypes.data, s["bt"].data.ptr, runtime.CUDA_R_8I, kp,
                      s["a"].data.ptr, runtime.CUDA_R_8I, kp,
                      zero.ctypes.data, s["out"].data.ptr, runtime.CUDA_R_32I, n_out,
                      cublas.CUBLAS_COMPUTE_32I, cublas.CUBLAS_GEMM_DEFAULT)

    return Case(make_set=make_set, launch=run, result=lambda s: cp.asnumpy(s["out"]),
                gemm=(M, kp, n_out),
                note=_pad_note([("inner", inner, kp)], "cuBLAS int8 needs lda, ldb multiples of 4"))


def _case_cupy_float(cp: Any, p: Problem, dtype: Any, impl: str) -> Case:
    """cupy.matmul (cuBLAS) on operands / 128, exact in f16 and f32."""
    M, inner, n_out = p.gemm

    def make_set() -> dict[str, Any]:
        return {"a": cp.asarray(p.A, dtype=dtype) / dtype(128),
                "b": cp.ascontiguousarray(cp.asarray(p.Bt.T, dtype=dtype)) / dtype(128),
                "out": cp.full((M, n_out), np.nan, dtype=dtype)}

    return Case(make_set=make_set, launch=lambda s: cp.matmul(s["a"], s["b"], out=s["out"]),
                result=lambda s: cp.asnumpy(s["out"]).astype(np.float64) * 128 * 128,
                gemm=p.gemm, tolerance=TOLERANCE[impl])


def case_cublas_f16(cp: Any, p: Problem) -> Case:
    return _case_cupy_float(cp, p, np.float16, "cublas_f16")


def case_cublas_f32(cp: Any, p: Problem) -> Case:
    return _case_cupy_float(cp, p, np.float32, "cublas_f32")


def case_torch_int_mm(torch: Any, p: Problem) -> Case:
    """torch._int_mm: needs M > 16 and inner, out multiples of 8; B passed column-major."""
    M, inner, n_out = p.gemm
    mp, kp, np_ = max(M, 17), round_up(inner, 8), round_up(n_out, 8)

    def make_set() -> dict[str, Any]:
        dev = lambda h: torch.from_numpy(h).cuda()  # noqa: E731
        return {"a": dev(_pad(p.A, mp, kp)), "bt": dev(_pad(p.Bt, np_, kp)),
                "out": torch.full((mp, np_), INT_POISON, dtype=torch.int32, device="cuda")}

    return Case(make_set=make_set,
                launch=lambda s: torch._int_mm(s["a"], s["bt"].t(), out=s["out"]),
                result=lambda s: s["out"][:M, :n_out].cpu().numpy(), gemm=(mp, kp, np_),
                note=_pad_note([("M", M, mp), ("inner", inner, kp), ("out", n_out, np_)],
                               "torch._int_mm needs M > 16, K and N multiples of 8"),
                capture="torch")


def case_torch_bf16(torch: Any, p: Problem) -> Case:
    """torch.matmul in bf16 on operands / 128 (exact in bf16), B passed column-major."""
    M, _, n_out = p.gemm

    def make_set() -> dict[str, Any]:
        dev = lambda h: (torch.from_numpy(h).cuda().to(torch.bfloat16) / 128)  # noqa: E731
        return {"a": dev(p.A), "bt": dev(p.Bt),
                "out": torch.full((M, n_out), float("nan"), dtype=torch.bfloat16, device="cuda")}

    return Case(make_set=make_set,
                launch=lambda s: torch.matmul(s["a"], s["bt"].t(), out=s["out"]),
                result=lambda s: s["out"].float().cpu().numpy().astype(np.float64) * 128 * 128,
                gemm=p.gemm, tolerance=TOLERANCE["torch_bf16"], capture="torch")


# ---------------------------------------------------------------- timing (GPU)

def _time(cp: Any, batch: Callable[[], None], calls: int, m: Method) -> Timing:
    from cupyx.profiler import benchmark

    res = benchmark(batch, n_repeat=m.repeats, n_warmup=m.warmup)
    return Timing.of([float(t) * 1e6 / calls for t in res.gpu_times[0]], calls)


def _estimate_us(cp: Any, case: Case) -> float:
    """Per-call time of one pass over all sets (after a first pass that warms up)."""
    start, end = cp.cuda.Event(), cp.cuda.Event()
    for s in case.sets:
        case.launch(s)
    start.record()
    for s in case.sets:
        case.launch(s)
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) * 1e3 / len(case.sets)


def time_stream(cp: Any, case: Case, calls: int, m: Method) -> Timing:
    order = itertools.cycle(case.sets)

    def batch() -> None:
        for _ in range(calls):
            case.launch(next(order))

    return _time(cp, batch, calls, m)


def time_graph(cp: Any, torch: Any, case: Case, calls: int, m: Method) -> Timing:
    """The same ``calls`` launches captured once and replayed: launch overhead removed."""
    launches = [case.sets[c % len(case.sets)] for c in range(calls)]
    if case.capture == "torch":
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # torch's rule: warm up on a side stream first
            for s in case.sets:
                case.launch(s)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            for s in launches:
                case.launch(s)
        torch.cuda.synchronize()
        return _time(cp, graph.replay, calls, m)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            for s in launches:
                case.launch(s)
        finally:
            graph = stream.end_capture()
        return _time(cp, lambda: graph.launch(stream), calls, m)


class NotRun(Exception):
    """An implementation that cannot run here (torch missing, R over a kernel's bound)."""


def _one_line(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, NotRun) else f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def bench_case(cp: Any, torch: Any, p: Problem, impl: str, build: Callable[[], Case],
               m: Method, l2_bytes: int) -> Row:
    """Check, then time one implementation; any failure becomes the row's error, not a crash."""
    base = dict(kernel=p.kernel, shape=p.shape.name, R=p.dims.R, K=p.dims.K, N=p.dims.N,
                impl=impl, gemm=p.gemm)
    try:
        case = build()
        case.sets = [case.make_set()]
        case.launch(case.sets[0])  # the checked launch: its output started as poison
        cp.cuda.Device().synchronize()
        tol = case.tolerance
        check = Check.of(case.result(case.sets[0]), p.ref.astype(np.float64 if tol else np.int64), tol)
        set_bytes = sum(v.nbytes for v in case.sets[0].values() if hasattr(v, "nbytes"))
        n_sets = sets_needed(set_bytes, l2_bytes, m.l2_multiple)
        case.sets += [case.make_set() for _ in range(n_sets - 1)]
        calls = calls_per_sample(_estimate_us(cp, case), n_sets, m.target_sample_us)
        stream = time_stream(cp, case, calls, m)
    except Exception as exc:  # a library refusing a shape is a result, not a crash
        return Row(**base, error=_one_line(exc))
    graph, graph_error = None, None
    try:
        graph = time_graph(cp, torch, case, calls, m)
    except Exception as exc:
        graph_error = _one_line(exc)
    return Row(**{**base, "gemm": case.gemm}, note=case.note, buffer_sets=n_sets, stream=stream,
               graph=graph, graph_error=graph_error, check=check)


def exact_product(cp: Any, A: np.ndarray, Bt: np.ndarray) -> np.ndarray:
    """A @ Bt.T as int64, computed in f64 on the device: exact, |sums| <= 128^2 inner << 2^53."""
    return cp.asnumpy(cp.asarray(A, dtype=cp.float64) @ cp.asarray(Bt, dtype=cp.float64).T).astype(np.int64)


def make_problem(cp: Any, spec: KernelSpec, shape: Shape) -> Problem:
    dims = Dims(shape.R, shape.K, shape.N)
    inputs = spec.make_inputs(dims, np.random.default_rng(seed(spec.name, shape)))
    A, Bt = gemm_problem(spec.name, inputs, dims)
    return Problem(spec.name, shape, dims, inputs, A, Bt, exact_product(cp, A, Bt))


CEILING_N = 8192


def measure_ceiling(cp: Any, m: Method, l2_bytes: int, n: int = CEILING_N) -> tuple[float | None, str]:
    """The device's int8 rate as cuBLAS reaches it on a large random n^3 GEMM, in TOPS.

    Run first, so it also brings the clocks up before the kernels are timed.
    """
    rng = np.random.default_rng(0)
    A, Bt = (rng.integers(-127, 128, size=(n, n), dtype=np.int8) for _ in range(2))
    p = Problem("ceiling", Shape(name=f"sq{n}", R=n, K=n, N=n), Dims(n, n, n), {}, A, Bt,
                exact_product(cp, A, Bt))
    row = bench_case(cp, None, p, "cublas_int8", lambda: case_cublas_int8(cp, p), m, l2_bytes)
    if not row.ok:
        return None, f"cuBLAS int8 {n}^3 did not give a figure: {row.error or 'wrong result'}"
    return row.gops() / 1e3, (f"measured in this run: cuBLAS int8 gemmEx {n}x{n}x{n} on random "
                              f"data, median of {m.repeats}, output checked exact")


# ---------------------------------------------------------------- device record

SMI_FIELDS = ("name", "driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm",
              "clocks.max.mem", "temperature.gpu", "power.draw")
SMI_CLOCKS = {"sm_mhz": "clocks.sm", "mem_mhz": "clocks.mem", "sm_max_mhz": "clocks.max.sm",
              "mem_max_mhz": "clocks.max.mem", "temp_c": "temperature.gpu", "power_w": "power.draw"}


def nvidia_smi() -> dict[str, str] | None:
    """One GPU's fields from nvidia-smi (read-only query), or None when it cannot be run."""
    try:
        res = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}",
                              "--format=csv,noheader,nounits", "--id=0"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0 or not res.stdout.strip():
        return None
    return dict(zip(SMI_FIELDS, (v.strip() for v in res.stdout.splitlines()[0].split(","))))


def probe_device(cp: Any, torch: Any) -> Device:
    """Name, driver, clocks (read after the timed loops, while the clocks are up), L2, peak."""
    from kernels.backends import device_info

    name, cuda_driver = device_info("gpu")
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    attrs = dev.attributes
    smi = nvidia_smi()
    if smi:
        clocks = {key: smi[field] for key, field in SMI_CLOCKS.items()}
        source, driver = "nvidia-smi, read after the timed loops", smi["driver_version"]
    else:
        clocks = {key: str(attrs[a] // 1000) for key, a in (("sm_max_mhz", "ClockRate"),
                                                            ("mem_max_mhz", "MemoryClockRate"))
                  if a in attrs}
        source, driver = "cupy device attributes (nvidia-smi not available)", None
    libs = {"cupy": cp.__version__}
    try:
        libs["cublas"] = str(cp.cuda.cublas.getVersion(cp.cuda.device.get_cublas_handle()))
    except Exception:  # an old cupy without getVersion: the version is optional
        pass
    if torch is not None:
        libs["torch"] = torch.__version__
    peak, peak_source = peak_for(name)
    return Device(
        name=name, driver=driver or f"CUDA driver {cuda_driver}",
        cuda_runtime=str(cp.cuda.runtime.runtimeGetVersion()),
        compute_capability=f"{props['major']}.{props['minor']}",
        sm_count=attrs.get("MultiProcessorCount"), l2_bytes=attrs.get("L2CacheSize"),
        clocks=clocks, clocks_source=source, libraries=libs,
        peak_int8_tops=peak, peak_source=peak_source)


# ---------------------------------------------------------------- the run

def _torch() -> tuple[Any, str | None]:
    try:
        import torch

        if not torch.cuda.is_available():
            return None, "torch imports but sees no CUDA device"
        return torch, None
    except Exception as exc:
        return None, f"torch not importable ({_one_line(exc)})"


def _load_ours(kernel: str) -> Callable[..., Any]:
    from kernels.backends import load_function

    path = ptx_path(kernel)
    if not path.exists():
        raise UserError(f"{rel(path)}: missing; run `doit emit` (doit bench does it first)")
    return load_function("gpu", path, kernel)


def run_bench(shape_set: str, method: Method = DEFAULT_METHOD, out_dir=BENCH_DIR,
              kernels: tuple[str, ...] | None = None, ceiling_n: int = CEILING_N) -> list:
    """Bench every kernel on every shape of ``shape_set``; write JSON, markdown and PNG."""
    cp = require_gpu()
    from pipeline.shapes import select_sets

    shapes = select_sets((shape_set,))[shape_set]
    torch, no_torch = _torch()
    l2 = int(cp.cuda.Device().attributes.get("L2CacheSize", 50 * 2**20))
    names = kernels or tuple(KERNELS)
    ceiling, ceiling_source = measure_ceiling(cp, method, l2, ceiling_n)
    print(f"int8 ceiling: {ceiling and round(ceiling)} TOPS ({ceiling_source})", flush=True)
    rows: list[Row] = []
    for kernel in names:
        spec = KERNELS[kernel]
        fn = _load_ours(kernel)
        for shape in shapes:
            p = make_problem(cp, spec, shape)
            builders: dict[str, Callable[[], Case]] = {
                "ours": lambda: case_ours(cp, p, spec, fn),
                "cublas_int8": lambda: case_cublas_int8(cp, p),
                "cublas_f16": lambda: case_cublas_f16(cp, p),
                "cublas_f32": lambda: case_cublas_f32(cp, p),
            }
            if spec.max_rows is not None and p.dims.R > spec.max_rows:
                builders["ours"] = _refuse(f"R={p.dims.R} over the kernel's {spec.max_rows} rows "
                                           "(kernels.ops.grad_weight splits such R)")
            for impl in ("torch_int_mm", "torch_bf16"):
                build = case_torch_int_mm if impl == "torch_int_mm" else case_torch_bf16
                builders[impl] = (lambda b=build: b(torch, p)) if torch else _refuse(no_torch)
            for impl, build in builders.items():
                row = bench_case(cp, torch, p, impl, build, method, l2)
                rows.append(row)
                t = f"{row.stream.median_us:9.2f} us" if row.stream else "     -      "
                print(f"{kernel:15s} {shape.name:18s} {impl:13s} {t} "
                      f"{'ok' if row.ok else 'FAILED: ' + (row.error or 'wrong result')}",
                      flush=True)
    device = probe_device(cp, torch).model_copy(
        update={"ceiling_int8_tops": ceiling, "ceiling_source": ceiling_source})
    report = BenchReport(
        shape_set=shape_set, created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        device=device, method=method,
        ptx_sha256={k: sha256_file(ptx_path(k)) for k in names},
        rows=rows, summary=summarize(rows, device.peak_int8_tops))
    paths = write_outputs(report, out_dir)
    table = markdown(report)
    print(table[table.index("## summary"):])
    for path in paths:
        print(f"wrote {rel(path)}")
    return paths


def _refuse(reason: str | None) -> Callable[[], Case]:
    def build() -> Case:
        raise NotRun(reason or "not available")

    return build


def main(argv: list[str] | None = None) -> int:
    """``python -m pipeline.bench [set]``: the bench without doit; one line on failure."""
    args = sys.argv[1:] if argv is None else argv
    try:
        run_bench(args[0] if args else "hslm")
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
