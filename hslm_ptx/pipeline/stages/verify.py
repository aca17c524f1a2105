"""verify: run one kernel's PTX on one shape and compare with its integer CPU reference.

Inputs are seeded from the kernel and shape names (crc32, stable across runs and
machines), so a report is reproducible and a failure can be replayed. Every output is
compared element by element, exactly: integer results have no tolerance, float results
must have the same bits (any NaN equals any NaN: payloads are not promised), and an
element still holding the launch's poison is a mismatch whatever the reference says.
Mismatches are counted per output. A launch
that fails (emulator error, refused shape, driver error) is recorded in the report's
``error`` as one line rather than raised, so the report always says what happened.

On the emulator a cell over :data:`hslm_ptx.pipeline.core.config.EMULATOR_WORK_BUDGET` multiply-adds
is refused before it starts (with its estimated time and how to force it). A cell is
:func:`run_cell`, which an executor runs anywhere (hslm_ptx.pipeline.stages.executor) and which
returns its report; :func:`verify_cell` runs one here and writes it, printing a progress
line every :data:`HEARTBEAT_SECONDS` for a cell expected to take long (``doit verify``
has its live line instead: hslm_ptx.pipeline.stages.progress).
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from hslm_ptx.runtime import backends
from hslm_ptx.runtime.backends import GPU_HINT, gpu_available
from hslm_ptx.formats.floats import same_values, to_f32
from hslm_ptx.kernel.spec import BufferSpec, Dims, KernelSpec
from hslm_ptx.pipeline.core.artifacts import check_artifact, read_model, write_model
from hslm_ptx.pipeline.core.files import sha256_bytes
from hslm_ptx.pipeline.core.config import (BACKENDS, EMULATOR_MACS_PER_SECOND, EMULATOR_WORK_BUDGET, emit_json,
                                           ptx_path, verify_json)
from hslm_ptx.pipeline.core.errors import UserError, one_line
from hslm_ptx.pipeline.core.shapes import seed
from hslm_ptx.pipeline.core.models import EmitResult, LaunchStats, MemoryAccess, Mismatch, Shape, VerifyReport

HEARTBEAT_SECONDS = 15.0


def resolve_backend(name: str) -> str:
    """'auto' -> 'gpu' when a device is usable, else 'emulator'; 'gpu' without one is refused."""
    if name not in BACKENDS:
        raise UserError(f"unknown backend '{name}'; known: {', '.join(BACKENDS)}")
    if name == "auto":
        return "gpu" if gpu_available() else "emulator"
    if name == "gpu" and not gpu_available():
        raise UserError(f"backend=gpu: CuPy sees no CUDA device; {GPU_HINT}")
    return name


def backend_hash(backend: str) -> str:
    """sha256 of the emulator's source when it is the backend: an emulator fix re-runs
    the cells it judged. A GPU verdict depends on the device, recorded in the report."""
    if backend != "emulator":
        return ""
    emulator = importlib.util.find_spec("hslm_ptx.emu")  # found, not imported: task creation stays light
    sources = sorted(Path(emulator.origin).parent.glob("*.py"))
    return sha256_bytes(b"".join(p.read_bytes() for p in sources))


def work(shape: Shape) -> int:
    """Multiply-adds of one cell (the emulator's cost grows with this)."""
    return shape.R * shape.K * shape.N


def check_work(kernel: str, shape_set: str, shape: Shape, backend: str, force: bool) -> None:
    """Refuse an emulator cell over the work budget, unless forced."""
    if backend != "emulator" or force or work(shape) <= EMULATOR_WORK_BUDGET:
        return
    raise UserError(
        f"verify {kernel} {shape_set}/{shape.name} on the emulator: R*K*N = {work(shape):.2g} multiply-adds, "
        f"about {work(shape) / EMULATOR_MACS_PER_SECOND:.0f} s, over the emulator budget "
        f"{EMULATOR_WORK_BUDGET:.2g}; run it with backend=gpu, or force it with force=1")


@contextlib.contextmanager
def heartbeat(label: str, expected_s: float, every: float = HEARTBEAT_SECONDS) -> Iterator[None]:
    """Print '<label>: N s of about M s' every ``every`` seconds while the body runs."""
    if expected_s < every:
        yield
        return
    done, start = threading.Event(), time.perf_counter()

    def beat() -> None:
        while not done.wait(every):
            print(f"{label}: {time.perf_counter() - start:.0f} s of about {expected_s:.0f} s", flush=True)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def compare(got: np.ndarray, want: np.ndarray) -> tuple[int, int, Mismatch | None]:
    """(mismatch count, max |got - want|, first mismatch in row-major order)."""
    if got.shape != want.shape:
        raise ValueError(f"output shape {got.shape} != reference shape {want.shape}")
    diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
    bad = np.argwhere(diff != 0)
    first = None
    if len(bad):
        row, col = (int(v) for v in bad[0])
        first = Mismatch(row=row, col=col, got=int(got[row, col]), want=int(want[row, col]))
    return len(bad), int(diff.max(initial=0)), first


def _ordered(bits: np.ndarray, width: int) -> np.ndarray:
    """Float bit patterns as integers in the floats' order (adjacent floats differ by 1)."""
    bits = bits.astype(np.int64)
    sign = 1 << (width - 1)
    return np.where(bits & sign, -(bits & (sign - 1)), bits)


def compare_output(param: BufferSpec, got: np.ndarray, want: np.ndarray) -> tuple[int, int, Mismatch | None]:
    """(mismatch count, max difference, first mismatch in row-major order) of one output:
    integers by value, floats by bits (:func:`hslm_ptx.formats.floats.same_values`) with the
    difference in units in the last place between non-NaN values, and the poison bit
    pattern a mismatch in either."""
    from hslm_ptx.runtime.launch import POISON  # the launch code loads with the first comparison, not with doit
    if got.shape != want.shape:
        raise ValueError(f"output '{param.name}' shape {got.shape} != reference shape {want.shape}")
    if not param.is_float:
        count, max_abs, first = compare(got.reshape(got.shape[0], -1), want.reshape(want.shape[0], -1))
        return count, max_abs, first and first.model_copy(update={"output": param.name})
    width = 8 * np.dtype(param.storage).itemsize
    gbits, wbits = (np.ascontiguousarray(a).view(f"uint{width}") for a in (got, want))
    bad = ~same_values(got, want, param.dtype) | (gbits == POISON[param.dtype])
    numbers = ~np.isnan(to_f32(got, param.dtype)) & ~np.isnan(to_f32(want, param.dtype))
    ulps = np.abs(_ordered(gbits, width) - _ordered(wbits, width))
    max_ulps = int(ulps[bad & numbers].max(initial=0))
    where = np.argwhere(bad.reshape(bad.shape[0], -1)) if bad.ndim else np.argwhere(bad[None, None])
    first = None
    if len(where):
        row, col = (int(v) for v in where[0])
        flat_g, flat_w = gbits.reshape(gbits.shape[0], -1), wbits.reshape(wbits.shape[0], -1)
        first = Mismatch(row=row, col=col, got=int(flat_g[row, col]), want=int(flat_w[row, col]), output=param.name)
    return int(bad.sum()), max_ulps, first


def compare_outputs(spec: KernelSpec, got: dict[str, np.ndarray], want: dict[str, np.ndarray]
                    ) -> tuple[dict[str, int], int, Mismatch | None]:
    """Per-output mismatch counts, the largest difference and the first mismatch (outputs
    in parameter order) of a launch against the reference."""
    counts: dict[str, int] = {}
    max_abs, first = 0, None
    for param in spec.output_params:
        count, diff, where = compare_output(param, np.asarray(got[param.name]), np.asarray(want[param.name]))
        counts[param.name] = count
        max_abs = max(max_abs, diff)
        first = first or where
    if first is not None and len(counts) == 1:
        first = first.model_copy(update={"output": ""})  # the only output needs no name
    return counts, max_abs, first


def launch_stats(fn: Any) -> LaunchStats | None:
    """The emulator's counts of its last launch (None for a GPU function)."""
    stats = getattr(fn, "stats", None)
    if stats is None:
        return None
    memory = [MemoryAccess(**row._asdict()) for row in getattr(stats, "memory", ())]
    return LaunchStats(warp_instructions=stats.warp_instructions, by_opcode=dict(stats.by_opcode), memory=memory)


def verify_cell(spec: KernelSpec, shape_set: str, shape: Shape, backend: str, force: bool = False) -> VerifyReport:
    """Run ``spec``'s emitted PTX on ``shape`` with ``backend`` ('gpu' or 'emulator'),
    write artifacts/verify/<kernel>/<set>/<shape>.json and return the report."""
    check_work(spec.name, shape_set, shape, backend, force)
    emitted = read_model(emit_json(spec.name), EmitResult)
    ptx = ptx_path(spec.name)
    check_artifact(ptx, emitted.ptx_sha256)
    expected_s = work(shape) / EMULATOR_MACS_PER_SECOND if backend == "emulator" else 0.0
    with heartbeat(f"{spec.name} {shape_set}/{shape.name}", expected_s):
        report = run_cell(spec.name, shape_set, shape, backend, force, ptx.read_text(), emitted)
    write_model(verify_json(spec.name, shape_set, shape.name), report)
    return report


def run_cell(kernel: str, shape_set: str, shape: Shape, backend: str, force: bool, ptx: str,
             emitted: EmitResult, inputs: str = "") -> VerifyReport:
    """One cell, where an executor runs it (hslm_ptx.pipeline.stages.executor): the PTX comes as text
    and the report goes back as the return value, so a worker on another machine reads
    and writes no file of the checkout; the driver checks the PTX and writes the report.
    ``inputs``: the driver's hash of what the verdict depends on besides the PTX (the
    reference, the emulator, the launch); a worker whose own code hashes otherwise is
    refused, so a node left on another commit cannot record under this one's hash."""
    from hslm_ptx.runtime.launch import launch_outputs  # with the emulator behind it: loaded when a cell runs
    from hslm_ptx.catalog.registry import KERNELS
    from hslm_ptx.runtime.backends import node_name

    spec = KERNELS[kernel]
    check_work(kernel, shape_set, shape, backend, force)
    if inputs:
        if cell_inputs(kernel, shape, backend) != inputs:
            raise UserError(f"verify {kernel} {shape_set}/{shape.name} on {node_name()}: this worker's reference, "
                            "emulator or launch code differs from the driver's; install the driver's commit there")
    dims = Dims(shape.R, shape.K, shape.N)
    inputs = spec.make_inputs(dims, np.random.default_rng(seed(kernel, shape)))
    want = spec.expected(dims, inputs)
    device, driver, arch = backends.device_info(backend)
    xp = backends.array_module(backend)
    mismatches = max_abs = rows = 0
    first = error = stats = None
    per_output: dict[str, int] = {}
    start = time.perf_counter()
    try:
        fn = backends.load_ptx(backend, ptx, emitted.entry)
        got = launch_outputs(spec, fn, dims, {k: xp.asarray(v) for k, v in inputs.items()}, xp)
        got = {name: backends.to_host(value) for name, value in got.items()}
        stats = launch_stats(fn) if backend == "emulator" else None
    except Exception as exc:  # recorded, not raised: the report says what failed
        error = one_line(exc)
    seconds = time.perf_counter() - start
    if error is None:
        per_output, max_abs, first = compare_outputs(spec, got, want)
        mismatches = sum(per_output.values())
        rows = dims.R  # the whole output was compared: every problem row contributed
    return VerifyReport(
        kernel=kernel, shape_set=shape_set, shape=shape.name, R=shape.R, K=shape.K, N=shape.N,
        backend=backend, device=device, driver=driver, arch=arch, node=node_name(), mismatches=mismatches, rows_checked=rows,
        max_abs_diff=max_abs, first_mismatch=first, seconds=round(seconds, 4),
        output_mismatches=per_output if len(spec.output_params) > 1 else {},
        ptx_sha256=emitted.ptx_sha256, error=error, launch_stats=stats,
    )


def verdict(report: VerifyReport) -> str:
    """One line for the progress log and the failure message."""
    where = f"{report.kernel} {report.shape_set}/{report.shape} R={report.R} K={report.K} N={report.N}"
    if report.error:
        return f"{where}: {report.backend} error: {report.error}"
    if report.mismatches:
        m = report.first_mismatch
        per = ", ".join(f"{name} {n}" for name, n in report.output_mismatches.items() if n)
        return (f"{where}: {report.mismatches} mismatches{f' ({per})' if per else ''} (max |diff| {report.max_abs_diff}); "
                f"first at {f'{m.output} ' if m.output else ''}(row {m.row}, col {m.col}): got {m.got}, want {m.want}")
    return f"{where}: ok, {report.rows_checked} rows exact on {report.backend} ({report.seconds:.2f}s)"


# ---- what a cell's verdict depends on ----------------------------------------------------

def launch_config(spec: KernelSpec, shape: Shape) -> str:
    """The cell's launch as data: grid, block, shared bytes and the scalar arguments. A
    change to a tile or split-K rule that leaves the PTX bytes alone still changes how
    the cell runs, so the cell re-runs; a comment edit changes none of it."""
    dims = Dims(shape.R, shape.K, shape.N)
    scalars = [p.value(dims) for p in spec.params if p.is_scalar]
    return repr((tuple(spec.geometry(dims)), scalars))


@functools.lru_cache(maxsize=None)
def _check_hash(kernel: str) -> str:
    from hslm_ptx.catalog.registry import KERNELS
    from hslm_ptx.pipeline.core.sources import check_hash

    return check_hash(KERNELS[kernel])  # one kernel's reference hash serves all its cells


@functools.lru_cache(maxsize=None)
def _backend_hash(backend: str) -> str:
    return backend_hash(backend)


def cell_inputs(kernel: str, shape: Shape, backend: str) -> str:
    """sha256 of what a cell's verdict depends on besides the PTX: its shape, input seed,
    launch, the reference's code and, on the emulator, the emulator's."""
    from hslm_ptx.catalog.registry import KERNELS

    params = {"R": shape.R, "K": shape.K, "N": shape.N, "backend": backend, "seed": seed(kernel, shape),
              "reference": _check_hash(kernel), "emulator": _backend_hash(backend),
              "launch": launch_config(KERNELS[kernel], shape)}
    return sha256_bytes(json.dumps(params, sort_keys=True).encode())
