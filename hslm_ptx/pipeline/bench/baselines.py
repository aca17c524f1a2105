"""Every implementation the bench times, as a :class:`Case` on one :class:`Problem`.

A Case is a way to allocate one buffer set (inputs + an output filled with poison), a
launch on a set, and a way to read the set's output back in the reference's units.
Baselines compute the same GEMM out = A @ Bt.T with the dense int8 operands (W
unpacked, transposes done) prepared outside the timed region; whatever padding a
library needs is applied there too and named in the row's note.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from hslm_ptx.runtime.launch import OUTPUT_POISON, kernel_args
from hslm_ptx.kernel.spec import Dims, KernelSpec
from hslm_ptx.pipeline.bench.record import TOLERANCE
from hslm_ptx.pipeline.core.models import Shape
from hslm_ptx.pipeline.core.shapes import seed  # the verify cell's inputs: same data, same seed


# Each kernel as the GEMM out = A @ Bt.T in its output's layout (A: M x inner, Bt: out x inner).
# cudaDataType_t and cuBLAS enums by name, with their values from CUDA's headers
# (library_types.h, cublas_api.h) for a CuPy that does not export one (CuPy 14 has
# CUDA_R_8I but no CUDA_R_32I).
CUDA_ENUMS: dict[str, int] = {"CUDA_R_8I": 3, "CUDA_R_32I": 10, "CUBLAS_OP_N": 0,
                              "CUBLAS_OP_T": 1, "CUBLAS_COMPUTE_32I": 72,
                              "CUBLAS_GEMM_DEFAULT": -1}


def cuda_enum(module: Any, name: str) -> int:
    """``module.name`` when CuPy defines it, else the header value in :data:`CUDA_ENUMS`."""
    return int(getattr(module, name, CUDA_ENUMS[name]))


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def gemm_problem(spec: KernelSpec, inputs: dict[str, np.ndarray],
                 dims: Dims) -> tuple[np.ndarray, np.ndarray]:
    """Contiguous int8 (A, Bt) with the kernel's output == A @ Bt.T."""
    a, bt = spec.gemm_operands(inputs, dims)
    return np.ascontiguousarray(a, dtype=np.int8), np.ascontiguousarray(bt, dtype=np.int8)


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


def exact_product(cp: Any, A: np.ndarray, Bt: np.ndarray) -> np.ndarray:
    """A @ Bt.T as int64, computed in f64 on the device: exact, |sums| <= 128^2 inner << 2^53."""
    return cp.asnumpy(cp.asarray(A, dtype=cp.float64) @ cp.asarray(Bt, dtype=cp.float64).T).astype(np.int64)


def make_problem(cp: Any, spec: KernelSpec, shape: Shape) -> Problem:
    dims = Dims(shape.R, shape.K, shape.N)
    inputs = spec.make_inputs(dims, np.random.default_rng(seed(spec.name, shape)))
    A, Bt = gemm_problem(spec, inputs, dims)
    return Problem(spec.name, shape, dims, inputs, A, Bt, exact_product(cp, A, Bt))


def _pad(host: np.ndarray, rows: int, cols: int) -> np.ndarray:
    out = np.zeros((rows, cols), dtype=host.dtype)
    out[: host.shape[0], : host.shape[1]] = host
    return out


def _pad_note(what: list[tuple[str, int, int]], why: str) -> str:
    changed = [f"{name} {a}->{b}" for name, a, b in what if a != b]
    return f"padded with zeros: {', '.join(changed)} ({why})" if changed else ""


def case_ours(cp: Any, p: Problem, spec: KernelSpec, fn: Callable[..., Any]) -> Case:
    geo = spec.geometry(p.dims)
    out_shape = spec.output.layout.shape(p.dims)
    split = geo.grid[2] > 1  # split-K adds into the output: it starts at 0, zeroed in every call

    def make_set() -> dict[str, Any]:
        bufs = {prm.name: cp.asarray(p.inputs[prm.name]) for prm in spec.params[1:]
                if not prm.is_scalar}
        bufs["out"] = cp.full(out_shape, 0 if split else OUTPUT_POISON, dtype=spec.output.dtype)
        bufs["args"] = kernel_args(spec, p.dims, bufs["out"], bufs)
        return bufs

    def launch(s: dict[str, Any]) -> None:
        if split:
            s["out"].fill(0)
        fn(geo.grid, geo.block, s["args"], shared_mem=geo.shared_mem)

    return Case(make_set=make_set, launch=launch,
                result=lambda s: cp.asnumpy(spec.output.layout.view(s["out"], p.dims)), gemm=p.gemm,
                note=f"grid {geo.grid} block {geo.block}")


def case_cublas_int8(cp: Any, p: Problem) -> Case:
    """cublasGemmEx int8 x int8 -> int32 (CUBLAS_COMPUTE_32I), TN layout.

    Row-major out (M x out) = A Bt^T is column-major out^T = op_T(Bt) op_N(A): cuBLAS
    sees m = out, n = M, k = inner, lda = ldb = inner, ldc = out. Its int8 tensor-core
    (IMMA) kernels want m, k and every leading dimension a multiple of 4, so inner and
    out are zero-padded to one (the padded columns are sliced off before the check).
    CuPy refuses cuBLAS calls during stream capture, so this row has no graph time
    (its graph_error says so); torch._int_mm is the int8 library GEMM under graph replay.
    """
    from cupy.cuda import cublas, runtime  # optional: only a GPU machine has CuPy

    M, inner, n_out = p.gemm
    kp, op = round_up(inner, 4), round_up(n_out, 4)
    r8, r32 = cuda_enum(runtime, "CUDA_R_8I"), cuda_enum(runtime, "CUDA_R_32I")
    handle = cp.cuda.device.get_cublas_handle()
    one, zero = np.array(1, np.int32), np.array(0, np.int32)  # host scalars, kept alive

    def make_set() -> dict[str, Any]:
        return {"a": cp.asarray(_pad(p.A, M, kp)), "bt": cp.asarray(_pad(p.Bt, op, kp)),
                "out": cp.full((M, op), OUTPUT_POISON, dtype=cp.int32)}

    def run(s: dict[str, Any]) -> None:
        cublas.gemmEx(handle, cuda_enum(cublas, "CUBLAS_OP_T"), cuda_enum(cublas, "CUBLAS_OP_N"),
                      op, M, kp, one.ctypes.data, s["bt"].data.ptr, r8, kp,
                      s["a"].data.ptr, r8, kp, zero.ctypes.data, s["out"].data.ptr, r32, op,
                      cuda_enum(cublas, "CUBLAS_COMPUTE_32I"), cuda_enum(cublas, "CUBLAS_GEMM_DEFAULT"))

    return Case(make_set=make_set, launch=run, result=lambda s: cp.asnumpy(s["out"][:, :n_out]),
                gemm=(M, kp, op),
                note=_pad_note([("inner", inner, kp), ("out", n_out, op)],
                               "cuBLAS int8 IMMA needs m, k and lda, ldb, ldc multiples of 4"))


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
                "out": torch.full((mp, np_), OUTPUT_POISON, dtype=torch.int32, device="cuda")}

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
