"""A first-order performance model: lower bounds per kernel x shape on one GPU, the largest
taken as the predicted device time. MODEL figures, never measurements.

Inputs, all read from records (nothing typed in): the SASS counts per loop trip
(artifacts/sass, pipeline.sass), registers and shared memory per arch
(artifacts/ptxas), the launch geometry (``spec.geometry``), the emulator's memory
counts when a verify report or the emulator provides them, and the GPU assumptions in
pipeline/gpus.yaml (one source per number). Bounds, each on the busiest SM unless said:

- issue: warp instructions / (schedulers x clock);
- tensor: mma ops / (int8 dense peak per SM x the fraction mma.sync reaches);
- L1: wavefronts / (wavefronts per clock x clock): the emulator's when known (shared bank
  wavefronts, and one per 128-byte line of each global request), else the ideal from SASS
  (an LSU instruction moves width x 32 lanes, 128 B a wavefront) plus the output's ideal;
- latency: one dependent global load (L2 hit) plus, when the loop stages through shared
  memory, one shared round trip, per chunk when nothing is prefetched; with a copy ring
  of ``spec.stages`` chunks (stages - 1 in flight), one round trip to fill it and then
  one per stages - 1 chunks; per wave of resident CTAs;
- L2 (whole GPU): the emulator's global sectors x 32 B when known, else the bytes the
  SASS global loads request / L2 bandwidth;
- DRAM (whole GPU): every operand and the output moved once / DRAM bandwidth.

The reference class (a CUTLASS 2.x int8 GEMM, figures in gpus.yaml) gets the same bounds
on the problem padded to its tile, its L1 and L2 counted as ours are: global copies a
wavefront per 128-byte line, and the epilogue's int32 tile (through shared memory, out to
global) included. Its issue bound is its main loop's alone (a class figure per IMMA),
where ours counts every instruction outside the loop too.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal

import numpy as np
import yaml
from pydantic import ValidationError

from kernels.backends import load_ptx
from kernels.launch import launch
from kernels.staged_tile import CHUNK_K, output_wavefronts as staged_output_wavefronts
from kernels.ptxemu import LaunchStats
from kernels.registry import choose
from kernels.spec import Dims, KernelSpec
from pipeline.artifacts import rel, sha256_file
from pipeline.errors import UserError
from pipeline.models import MemoryAccess, PtxasArch, Record, Shape
from pipeline.sass import Body, SassArch, class_width, is_lsu

GPUS_FILE = Path(__file__).with_name("gpus.yaml")
IMMA_OPS = 2 * 16 * 8 * 32  # one m16n8k32 mma: multiply and add per product
FAST_SLACK_BYTES = 4  # a chunk runs the fast body while it and one word more lie inside every row
UNSIZED_LSU_BITS = 128  # LDGSTS and LDSM as the kernels' class uses them: 16 B a lane
BOUNDS = ("issue", "tensor", "l1", "latency", "l2", "dram")


# ---- assumptions ---------------------------------------------------------------------


class Assumption(Record):
    value: float
    source: str


class GpuModel(Record):
    name: str
    arch: str
    sms: Assumption
    clock_ghz: Assumption
    int8_dense_tops: Assumption
    mma_sync_fraction: Assumption
    l2_latency_cycles: Assumption
    dram_latency_cycles: Assumption
    shared_latency_cycles: Assumption
    l2_bandwidth_gbs: Assumption
    dram_bandwidth_gbs: Assumption
    launch_us: Assumption
    l1_wavefronts_per_clock: Assumption
    schedulers_per_sm: Assumption
    max_ctas_per_sm: Assumption
    max_warps_per_sm: Assumption
    registers_per_sm: Assumption
    shared_per_sm_bytes: Assumption

    @property
    def clock_hz(self) -> float:
        return self.clock_ghz.value * 1e9

    @property
    def peak_ops_per_sm_clock(self) -> float:
        return self.int8_dense_tops.value * 1e12 / (self.sms.value * self.clock_hz)


class ReferenceClass(Record):
    name: str
    tile_m: Assumption
    tile_n: Assumption
    tile_k: Assumption
    warps: Assumption
    sass_per_imma: Assumption
    ldsm_per_imma: Assumption
    wavefronts_per_ldsm: Assumption
    copy_lines_per_row: Assumption
    epilogue_passes: Assumption
    ctas_per_sm: Assumption
    exposed_latencies: Assumption


class Assumptions(Record):
    gpus: dict[str, GpuModel]
    reference: ReferenceClass


def first_problem(exc: ValidationError) -> str:
    """"field 'a.b': message" for the first thing pydantic refused."""
    error = exc.errors()[0]
    return f"field '{'.'.join(map(str, error['loc'])) or '(top level)'}': {error['msg']}"


def load_assumptions(path: Path = GPUS_FILE) -> Assumptions:
    """gpus.yaml, validated; a bad file is one :class:`UserError` line naming the field."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"{rel(path)}: missing; it holds the model's GPU assumptions") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{rel(path)}: not valid YAML ({str(exc).splitlines()[0]})") from None
    try:
        return Assumptions.model_validate(raw)
    except ValidationError as exc:
        raise UserError(f"{rel(path)}: {first_problem(exc)}; fix the entry") from None


def gpu(assumptions: Assumptions, name: str) -> GpuModel:
    if name not in assumptions.gpus:
        raise UserError(f"unknown gpu '{name}' (gpu=...); known in {rel(GPUS_FILE)}: {', '.join(assumptions.gpus)}")
    return assumptions.gpus[name]


# ---- the kernel's work, from its spec, SASS and ptxas records ------------------------


class Work(Record):
    """What one launch of a kernel on one shape does, per the records."""

    ctas: int
    warps_per_cta: int
    contraction: int
    fast_chunks: int  # chunks one CTA runs (its split of the contraction)
    tail_chunks: int
    stages: int  # copy ring depth (1: nothing prefetched)
    instructions_per_warp: float
    imma_per_warp: int
    lsu_wavefronts_per_warp: float  # ideal, from SASS
    global_bytes_per_warp: float  # requested by global loads, from SASS
    compulsory_bytes: int
    stages_through_shared: bool
    output_bytes_per_cta: float  # the int32 output one CTA writes (its share of rows x cols)
    splits: int  # CTAs along the contraction (split-K adds their sums)


def chunks(contraction: int, has_tail_body: bool = True) -> tuple[int, int]:
    """(fast, tail) chunk counts: fast while the chunk and its slack lie inside the rows;
    a loop with one body (tails by zero-filling copies) runs every chunk on it."""
    starts = range(0, contraction, CHUNK_K)
    if not has_tail_body:
        return len(starts), 0
    fast = sum(k0 + CHUNK_K + FAST_SLACK_BYTES <= contraction for k0 in starts)
    return fast, len(starts) - fast


def per_trip(sass: SassArch, name: str) -> Body | None:
    """The fast or tail body; a loop with one body stands in for the other."""
    return getattr(sass, name) or sass.fast or sass.tail


def wavefronts(classes: dict[str, int]) -> float:
    """Ideal L1 wavefronts of one warp's LSU instructions: width x 32 lanes / 128 B, at least 1."""
    return sum(n * max(1.0, (class_width(cls) or UNSIZED_LSU_BITS) / 32) for cls, n in classes.items() if is_lsu(cls))


def global_bytes(classes: dict[str, int]) -> float:
    """Bytes a warp's global loads and global->shared copies (LDGSTS) request, at least one
    32-B sector each."""
    return sum(n * max(32.0, (class_width(cls) or UNSIZED_LSU_BITS) / 8 * 32) for cls, n in classes.items()
               if cls.startswith("ldg"))


def work(spec: KernelSpec, dims: Dims, sass: SassArch) -> Work:
    geometry = spec.geometry(dims)
    rows, cols = spec.output.logical(dims)
    contraction = dims.R * dims.K * dims.N // (rows * cols)
    splits = geometry.grid[2]  # split-K: each CTA along z runs its share of the chunks
    span = -(-(-(-contraction // CHUNK_K)) // splits) * CHUNK_K
    fast, tail = chunks(min(span, contraction), has_tail_body=sass.tail is not None)
    fbody, tbody = per_trip(sass, "fast"), per_trip(sass, "tail")
    if fbody is None:
        raise UserError(f"{spec.name} {sass.arch}: the SASS record has no loop; run `doit sass`")
    loop = next(lp for lp in sass.loops if lp.start == sass.steady_loop)
    outside = sass.instructions - loop.instructions
    buffers = sum(math.prod((p.logical or p.shape)(dims)) * np.dtype(p.dtype).itemsize  # the caller's layout
                  for p in spec.params if p.shape)
    return Work(
        ctas=math.prod(geometry.grid), warps_per_cta=math.prod(geometry.block) // 32,
        contraction=contraction, fast_chunks=fast, tail_chunks=tail,
        instructions_per_warp=fast * fbody.instructions + tail * tbody.instructions + outside,
        imma_per_warp=fast * fbody.imma + tail * tbody.imma,
        lsu_wavefronts_per_warp=fast * wavefronts(fbody.classes) + tail * wavefronts(tbody.classes),
        global_bytes_per_warp=fast * global_bytes(fbody.classes) + tail * global_bytes(tbody.classes),
        compulsory_bytes=buffers, stages=spec.stages,
        stages_through_shared=any(c.startswith(("lds", "ldsm")) for c in fbody.classes),
        output_bytes_per_cta=4 * rows * cols / (geometry.grid[0] * geometry.grid[1]), splits=splits,
    )


def ctas_per_sm(g: GpuModel, warps_per_cta: int, ptxas: PtxasArch) -> int:
    """Resident CTAs per SM from registers (256 per warp granule), shared memory (+1 KB a
    CTA), warps and the CTA cap (CUDA C++ Programming Guide occupancy rules)."""
    regs_per_warp = math.ceil(ptxas.registers * 32 / 256) * 256
    limits = [int(g.max_ctas_per_sm.value), int(g.max_warps_per_sm.value) // warps_per_cta,
              int(g.registers_per_sm.value) // (regs_per_warp * warps_per_cta),
              int(g.shared_per_sm_bytes.value) // (ptxas.shared_bytes + 1024)]
    return max(0, min(limits))


# ---- emulator memory counts ----------------------------------------------------------


def memory_rows_from_report(path: Path) -> list[MemoryAccess] | None:
    """The ``launch_stats.memory`` rows of a verify report, when it has them."""
    if not Path(path).is_file():
        return None
    try:
        rows = (json.loads(Path(path).read_text()).get("launch_stats") or {}).get("memory")
        return None if rows is None else [MemoryAccess.model_validate(r) for r in rows]
    except (json.JSONDecodeError, ValidationError, AttributeError) as exc:
        raise UserError(f"{rel(path)}: launch_stats.memory unreadable ({str(exc).splitlines()[0]}); "
                        "delete the report and re-run `doit verify`") from None


MEMORY_SPACES = ("global", "shared")


def emulator_counts_memory() -> bool:
    """Whether this emulator's launch statistics carry memory rows."""
    return "memory" in LaunchStats._fields


def memory_rows_from_emulator(spec: KernelSpec, shape: Shape, ptx: str) -> list[MemoryAccess] | None:
    """Run the kernel once on the emulator and take its memory rows (None when the
    emulator does not count memory)."""
    if not emulator_counts_memory():
        return None
    dims = Dims(shape.R, shape.K, shape.N)
    fn = load_ptx("emulator", ptx, spec.name)
    launch(spec, fn, dims, spec.make_inputs(dims, np.random.default_rng(0)))
    return [MemoryAccess.model_validate(r if isinstance(r, dict) else r._asdict()) for r in fn.stats.memory]


# ---- bounds --------------------------------------------------------------------------


class Prediction(Record):
    """One implementation on one shape: its bounds (us) and the largest, the limiter."""

    bounds: dict[str, float]
    device_us: float
    per_call_us: float
    limiter: str
    pct_int8_peak: float


class ModelRow(Record):
    kind: Literal["MODEL"] = "MODEL"
    kernel: str
    shape: str
    R: int
    K: int
    N: int
    rule_pick: bool = False  # the configuration kernels.registry.choose runs on this shape
    ctas: int
    ctas_per_sm: int
    waves: int
    fast_chunks: int
    tail_chunks: int
    l1_source: str
    ours: Prediction
    reference: Prediction


class ModelReport(Record):
    kind: Literal["MODEL"] = "MODEL"
    note: str = "first-order model predictions, not measurements"
    shape_set: str
    gpu: str
    gpu_name: str
    arch: str
    assumptions_sha256: str
    sass_tools: dict[str, str]  # kernel -> "ptxas X / nvdisasm Y"
    rows: list[ModelRow]


def predict(g: GpuModel, bounds: dict[str, float], useful_ops: float) -> Prediction:
    device = max(bounds.values())
    limiter = max(bounds, key=bounds.get)
    pct = 100 * useful_ops / (device * 1e-6) / (g.int8_dense_tops.value * 1e12)
    return Prediction(bounds={k: round(v, 4) for k, v in bounds.items()}, device_us=round(device, 4),
                      per_call_us=round(device + g.launch_us.value, 4), limiter=limiter, pct_int8_peak=round(pct, 3))


def seconds_us(cycles: float, g: GpuModel) -> float:
    return cycles / g.clock_hz * 1e6


def exposed_round_trips(w: Work) -> float:
    """Global round trips a CTA waits out: one a chunk when nothing is prefetched; with a
    ring of ``stages`` chunks, one to fill it, then one per ``stages - 1`` chunks."""
    trips = w.fast_chunks + w.tail_chunks
    return trips if w.stages <= 1 else 1 + trips / (w.stages - 1)


def bounds_for(g: GpuModel, w: Work, resident: int, l1_wavefronts_per_cta: float,
               l2_bytes: float) -> tuple[dict[str, float], int]:
    """Our kernel's six bounds, and the waves of resident CTAs."""
    sms = int(g.sms.value)
    busiest = math.ceil(w.ctas / sms)  # CTAs the busiest SM runs in all
    waves = math.ceil(w.ctas / (sms * max(resident, 1)))
    warps = busiest * w.warps_per_cta
    latency = g.l2_latency_cycles.value + (g.shared_latency_cycles.value if w.stages_through_shared else 0)
    return {
        "issue": seconds_us(warps * w.instructions_per_warp / g.schedulers_per_sm.value, g),
        "tensor": seconds_us(warps * w.imma_per_warp * IMMA_OPS
                             / (g.peak_ops_per_sm_clock * g.mma_sync_fraction.value), g),
        "l1": seconds_us(busiest * l1_wavefronts_per_cta / g.l1_wavefronts_per_clock.value, g),
        "latency": seconds_us(waves * exposed_round_trips(w) * latency, g),
        "l2": l2_bytes / (g.l2_bandwidth_gbs.value * 1e3),
        "dram": w.compulsory_bytes / (g.dram_bandwidth_gbs.value * 1e3),
    }, waves


def reference_l1_per_cta(ref: ReferenceClass, k_tiles: int) -> float:
    """The reference CTA's L1 wavefronts, counted as ours are: its fragment loads
    (ldmatrix, 4 wavefronts each), its copies one wavefront per 128-byte line they touch
    (each k-tile row its own line), and its epilogue, which passes the int32 tile through
    shared memory to global (``epilogue_passes`` x the tile's bytes / 128)."""
    tm, tn, tk = (int(a.value) for a in (ref.tile_m, ref.tile_n, ref.tile_k))
    imma_per_tile = tm * tn * tk / (16 * 8 * 32)
    fragments = imma_per_tile * ref.ldsm_per_imma.value * ref.wavefronts_per_ldsm.value
    copies = (tm + tn) * ref.copy_lines_per_row.value
    return k_tiles * (fragments + copies) + ref.epilogue_passes.value * 4 * tm * tn / 128


def reference_bounds(g: GpuModel, ref: ReferenceClass, rows: int, cols: int, contraction: int,
                     compulsory_bytes: int) -> dict[str, float]:
    """The reference class on the problem padded to its tile."""
    tm, tn, tk = (int(a.value) for a in (ref.tile_m, ref.tile_n, ref.tile_k))
    mp, np_, kp = (-(-x // t) * t for x, t in ((rows, tm), (cols, tn), (contraction, tk)))
    ctas = (mp // tm) * (np_ // tn)
    sms = int(g.sms.value)
    busiest = math.ceil(ctas / sms)
    imma_per_cta = tm * tn * kp / (16 * 8 * 32)
    waves = math.ceil(ctas / (sms * ref.ctas_per_sm.value))
    latency = g.l2_latency_cycles.value + g.shared_latency_cycles.value
    return {
        "issue": seconds_us(busiest * imma_per_cta * ref.sass_per_imma.value / g.schedulers_per_sm.value, g),
        "tensor": seconds_us(busiest * imma_per_cta * IMMA_OPS
                             / (g.peak_ops_per_sm_clock * g.mma_sync_fraction.value), g),
        "l1": seconds_us(busiest * reference_l1_per_cta(ref, kp // tk) / g.l1_wavefronts_per_clock.value, g),
        "latency": seconds_us(waves * ref.exposed_latencies.value * latency, g),
        "l2": ctas * ((tm + tn) * kp + 4 * tm * tn) / (g.l2_bandwidth_gbs.value * 1e3),  # operands in, int32 tile out
        "dram": compulsory_bytes / (g.dram_bandwidth_gbs.value * 1e3),
    }


def l1_wavefronts(row: MemoryAccess) -> int:
    """L1 data wavefronts of one traced line: shared accesses as the emulator counts their
    bank wavefronts; a global access takes one per distinct 128-byte line a request touches
    (first order: L1TEX returns at most one 128-byte line per wavefront)."""
    return row.wavefronts if row.space == "shared" else row.lines


def output_wavefronts(w: Work) -> float:
    """The ideal L1 wavefronts of one CTA's output, by the epilogue's path
    (``kernels.staged_tile.output_wavefronts``)."""
    return staged_output_wavefronts(w.output_bytes_per_cta, w.splits)


def l1_per_cta(w: Work, memory: list[MemoryAccess] | None, source: str) -> tuple[float, str]:
    """Wavefronts per CTA: the emulator's when known (``source`` says whence), else the
    loop's SASS ideal plus the output's (the reference class's L1 counts its output too)."""
    if memory:
        return sum(l1_wavefronts(r) for r in memory if r.space in MEMORY_SPACES) / w.ctas, source
    return (w.lsu_wavefronts_per_warp * w.warps_per_cta + output_wavefronts(w),
            "SASS ideal loop + output (no emulator memory counts)")


def l2_bytes(w: Work, memory: list[MemoryAccess] | None) -> float:
    """Bytes through L2: the emulator's global sectors x 32 B when known, else what the
    SASS global loads request (one sector at least each)."""
    if memory:
        return 32.0 * sum(r.sectors for r in memory if r.space == "global")
    return w.ctas * w.warps_per_cta * w.global_bytes_per_warp


def model_row(spec: KernelSpec, shape: Shape, g: GpuModel, ref: ReferenceClass, sass: SassArch,
              ptxas: PtxasArch, memory: list[MemoryAccess] | None, memory_source: str) -> ModelRow:
    dims = Dims(shape.R, shape.K, shape.N)
    w = work(spec, dims, sass)
    resident = ctas_per_sm(g, w.warps_per_cta, ptxas)
    l1, l1_source = l1_per_cta(w, memory, memory_source)
    ours, waves = bounds_for(g, w, resident, l1, l2_bytes(w, memory))
    rows, cols = spec.output.logical(dims)
    dense_bytes = rows * w.contraction + w.contraction * cols + 4 * rows * cols  # int8 A, B; int32 C
    useful = 2.0 * dims.R * dims.K * dims.N
    return ModelRow(kernel=spec.name, shape=shape.name, R=shape.R, K=shape.K, N=shape.N,
                    rule_pick=choose(spec.family_name, dims).name == spec.name, ctas=w.ctas,
                    ctas_per_sm=resident, waves=waves, fast_chunks=w.fast_chunks, tail_chunks=w.tail_chunks,
                    l1_source=l1_source, ours=predict(g, ours, useful),
                    reference=predict(g, reference_bounds(g, ref, rows, cols, w.contraction, dense_bytes), useful))


def assumptions_sha256(path: Path = GPUS_FILE) -> str:
    return sha256_file(path)
