"""``doit model``'s side of the one cost model (hslm_ptx/cost/model.py): validated device facts,
the committed loop counts, each kernel x shape's serial phases beside the reference
class, every launch of a layer step (:func:`layer_step_row`), and the calibration against
published measurements. MODEL figures, never measurements.

Inputs, all read from records (nothing typed in): the SASS counts per loop trip
(artifacts/sass, hslm_ptx.pipeline.stages.sass) and ptxas's stall counts of the same bodies
(hslm_ptx/cost/loop_counts.json, written by :func:`build_counts` from the cubin's control
bits), registers and shared memory per arch (artifacts/ptxas), the launch geometry
(``spec.geometry``), the emulator's memory counts when a verify report or the emulator
provides them, and hslm_ptx/cost/devices.json (one source per number).

Control bits (Volta and later, one 128-bit word an instruction): bits 105-108 hold the
stall count, the clocks the scheduler waits before this warp's next instruction (the
fixed-latency dependencies ptxas resolved); variable-latency results (loads, shared
memory) are waited on through scoreboards, which the cost model's latency terms count.
The layout is the one documented by Jia et al., "Dissecting the NVIDIA Volta GPU
Architecture via Microbenchmarking" (arXiv 1804.06826, chapter 2, control information), and used by
public assemblers for sm_70-sm_90 (e.g. CuAssembler).
"""
from __future__ import annotations

import math
import re
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, TypeVar

import numpy as np
from pydantic import Field, ValidationError, model_validator

from hslm_ptx.cost import model as cost
from hslm_ptx.tile import grouped
from hslm_ptx.runtime.backends import load_ptx
from hslm_ptx.runtime.launch import launch
from hslm_ptx.catalog.registry import KERNELS, choose
from hslm_ptx.kernel.spec import Dims, KernelSpec
from hslm_ptx.tile.geometry import CHUNK_K
from hslm_ptx.tile import rule as tile_rule
from hslm_ptx.tile.rule import output_wavefronts as staged_output_wavefronts
from hslm_ptx.pipeline.core.artifacts import read_json, read_yaml
from hslm_ptx.pipeline.core.files import rel, sha256_file
from hslm_ptx.pipeline.core.errors import ArtifactError, UserError
from hslm_ptx.pipeline.core.layer_records import LayerLaunch, LayerShape
from hslm_ptx.pipeline.core.models import MemoryAccess, PtxasArch, PtxasReport, Record, Shape
from hslm_ptx.pipeline.stages.ptxas import PtxasError
from hslm_ptx.pipeline.stages.sass import Body, SassArch, SassReport, class_width, cubin, find_cuobjdump

M = TypeVar("M", bound=Record)  # the record a loader validates

DEVICES_FILE = cost.DEVICES_FILE
COUNTS_FILE = cost.COUNTS_FILE
CALIBRATION_FILE = Path(cost.__file__).with_name("calibration.yaml")
BOUNDS = ("serial", "l1", "l2", "dram", "reds")
PHASES = ("prologue", "chunks", "outside", "epilogue", "drain")


# ---- assumptions ---------------------------------------------------------------------


Figure = Annotated[float, Field(gt=0, allow_inf_nan=False)]  # a device figure: finite, above 0


class Assumption(Record):
    """One device figure with its source; an estimate (no datasheet line) also carries
    ``range``, the low and high its source or reasoning allows, which the model's
    intervals sweep (``hslm_ptx.cost.model.device_ranges``)."""

    value: Figure
    source: str = Field(min_length=20)
    range: tuple[Figure, Figure] | None = None

    @model_validator(mode="after")
    def _range_holds_the_value(self) -> "Assumption":
        if self.range is not None and not self.range[0] <= self.value <= self.range[1]:
            raise ValueError(f"range {list(self.range)} does not hold the value {self.value}")
        return self


class GpuModel(Record):
    name: str
    arch: str
    sms: Assumption
    clock_ghz: Assumption
    int8_dense_tops: Assumption
    bf16_dense_tflops: Assumption
    mma_sync_fraction: Assumption
    library_tensor_fraction: Assumption
    l2_latency_cycles: Assumption
    dram_latency_cycles: Assumption
    shared_latency_cycles: Assumption
    l2_bandwidth_gbs: Assumption
    dram_bandwidth_gbs: Assumption
    dram_efficiency: Assumption
    red_gbs: Assumption
    launch_us: Assumption
    kernel_fixed_us: Assumption
    l1_wavefronts_per_clock: Assumption
    schedulers_per_sm: Assumption
    max_ctas_per_sm: Assumption
    max_warps_per_sm: Assumption
    registers_per_sm: Assumption
    shared_per_sm_bytes: Assumption
    library_prologue_instructions: Assumption
    library_epilogue_instructions: Assumption
    library_clocks_per_instruction: Assumption

    @property
    def clock_hz(self) -> float:
        return self.clock_ghz.value * 1e9

    @property
    def peak_ops_per_sm_clock(self) -> float:
        return self.int8_dense_tops.value * 1e12 / (self.sms.value * self.clock_hz)


class Assumptions(Record):
    note: str
    devices: dict[str, GpuModel]

    @property
    def gpus(self) -> dict[str, GpuModel]:
        return self.devices


def first_problem(exc: ValidationError) -> str:
    """"field 'a.b': message" for the first thing pydantic refused."""
    error = exc.errors()[0]
    return f"field '{'.'.join(map(str, error['loc'])) or '(top level)'}': {error['msg']}"


def _validated(path: Path, read: Callable[[Path], Any], model: type[M], holds: str) -> M:
    """``read`` (strict JSON or YAML) then validate as ``model``; either failure is one
    :class:`UserError` line naming the file and what it holds, or the field."""
    try:
        raw = read(path)
    except ArtifactError as exc:
        raise UserError(f"{exc}; it holds {holds}") from None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise UserError(f"{rel(path)}: {first_problem(exc)}; fix the entry") from None


def load_assumptions(path: Path | None = None) -> Assumptions:
    """devices.json, read strictly (UTF-8, no duplicate key) and validated; a bad file is
    one :class:`UserError` line naming the field."""
    return _validated(Path(path or cost.DEVICES_FILE), read_json, Assumptions, "the cost model's device facts")


def gpu(assumptions: Assumptions, name: str) -> GpuModel:
    if name not in assumptions.devices:
        raise UserError(f"unknown gpu '{name}' (gpu=...); known in {rel(DEVICES_FILE)}: "
                        f"{', '.join(assumptions.devices)}")
    return assumptions.devices[name]


def as_device(g: GpuModel) -> cost.Device:
    """The validated entry as the cost module's values-only record."""
    dumped = g.model_dump()
    return cost.devices_from({"devices": {"x": dumped}}, DEVICES_FILE)["x"]


# ---- loop counts from the cubin's control bits ---------------------------------------

CUOBJDUMP_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/[^;]*;\s*/\*\s*0x[0-9a-f]{16}\s*\*/")
CONTROL_WORD = re.compile(r"^\s*/\*\s*(0x[0-9a-f]{16})\s*\*/\s*$")
STALL_SHIFT, STALL_MASK = 41, 0xF  # bits 105-108 of the instruction = bits 41-44 of its upper word


def stall_count(control: int) -> int:
    """The stall count in the upper 64-bit word of an instruction."""
    return (control >> STALL_SHIFT) & STALL_MASK


def control_stalls(listing: str, function: str) -> dict[int, int]:
    """Address -> stall count of every instruction of ``function`` in a ``cuobjdump -sass``
    listing (each instruction's line carries the lower word, the next line the upper)."""
    stalls: dict[int, int] = {}
    lines = listing.splitlines()
    inside = False
    for i, line in enumerate(lines):
        if "Function :" in line:
            inside = line.split("Function :", 1)[1].strip() == function
            continue
        if not inside or not (m := CUOBJDUMP_LINE.search(line)) or i + 1 >= len(lines):
            continue
        if upper := CONTROL_WORD.match(lines[i + 1]):
            stalls[int(m.group(1), 16)] = stall_count(int(upper.group(1), 16))
    if not stalls:
        raise ArtifactError(f"cuobjdump listing: no instructions with control words for '{function}'")
    return stalls


def run_addresses(runs: list[str]) -> list[int]:
    """The instruction addresses of 'first-last' address ranges (16 bytes an instruction)."""
    out = []
    for run in runs:
        first, last = (int(x, 16) for x in run.split("-"))
        out += range(first, last + 16, 16)
    return out


def stall_sum(runs: list[str], stalls: dict[int, int], what: str) -> int:
    """ptxas's stall counts summed over a path (its address ranges in the SASS record)."""
    missing = [a for a in run_addresses(runs) if a not in stalls]
    if missing:
        raise ArtifactError(f"the SASS record's {what} runs {runs} are not in the cubin's listing "
                            f"(first missing {missing[0]:#x}); run `doit sass` again")
    return sum(stalls[a] for a in run_addresses(runs))


def body_counts(body: Body, stalls: dict[int, int]) -> dict:
    return {"instructions": body.instructions, "imma": body.imma,
            "issue_clocks": stall_sum(body.runs, stalls, "body"),
            "direct_loads": any(c.startswith("ldg") and not c.startswith("ldgsts") for c in body.classes),
            "global_bytes": global_bytes(body.classes)}


def outside_instructions(arch: SassArch) -> int:
    """Instructions one warp runs outside the steady loop at most: the longest path's
    (``sass.longest_path_outside``; the split-K epilogue's, on these kernels)."""
    if arch.outside_path is None:
        raise UserError(f"{arch.arch}: the SASS record has no outside path; run `doit sass`")
    return arch.outside_path


def arch_counts(arch: SassArch, stalls: dict[int, int]) -> dict:
    return {"fast": body_counts(arch.fast, stalls), "tail": body_counts(arch.tail, stalls) if arch.tail else None,
            "outside_instructions": outside_instructions(arch),
            "outside_unsplit_instructions": arch.outside_path_unsplit,
            "outside_issue_clocks": stall_sum(arch.outside_runs, stalls, "outside path")
            if arch.outside_runs else None,
            "outside_unsplit_issue_clocks": stall_sum(arch.outside_unsplit_runs, stalls, "unsplit path")
            if arch.outside_unsplit_runs else None}


def cuobjdump_listing(ptx: Path, arch: str) -> str:
    """``cuobjdump -sass`` of ``ptx`` assembled for ``arch`` by the same ptxas call `doit
    sass` makes: nvdisasm's listing leaves the control words out, cuobjdump prints them."""
    with tempfile.TemporaryDirectory(prefix="counts-") as tmp:
        binary = cubin(ptx, arch, Path(tmp) / f"{arch}.cubin")
        proc = subprocess.run([str(find_cuobjdump()), "-sass", str(binary)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise PtxasError(f"cuobjdump {rel(ptx)} ({arch}): {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout


def kernel_counts(report: SassReport, ptx: Path, entry: str) -> dict:
    """One kernel's record for hslm_ptx/cost/loop_counts.json, from its SASS report and cubins."""
    if report.ptx_sha256 != sha256_file(ptx):
        raise UserError(f"{report.kernel}: the SASS record is older than {rel(ptx)}; run `doit sass`")
    archs = {}
    for a in report.archs:
        if a.fast is None:
            raise UserError(f"{report.kernel} {a.arch}: the SASS record has no loop; run `doit sass`")
        archs[a.arch] = arch_counts(a, control_stalls(cuobjdump_listing(ptx, a.arch), entry))
    return {"ptx_sha256": report.ptx_sha256, "archs": archs}


COUNTS_NOTE = ("Per warp per trip of each GEMM kernel's steady loop, as ptxas compiled it: instructions and IMMA "
               "(the counts `doit sass` makes), issue_clocks = ptxas's stall counts summed over the body (control "
               "bits 105-108), direct_loads = the body loads an operand from global into registers, global_bytes = "
               "what its global loads and copies request (32-B sectors at least); and the instructions on the "
               "longest path outside the chunk loops, of any launch and of a launch with one split "
               "(outside_unsplit: no split-K epilogue), with ptxas's stall counts summed over each "
               "(outside_issue_clocks). occupancy: ptxas's registers and static shared bytes of every kernel the "
               "tile rule scores, per arch. Written by `doit model:counts`; the gate checks it against artifacts/sass "
               "and artifacts/ptxas.")


def scored_kernels() -> list[str]:
    """The kernels the tile rule scores (``KernelSpec.cost``): hslm_ptx/cost/loop_counts.json holds
    their occupancy."""
    return [name for name, spec in KERNELS.items() if spec.cost is not None]


def occupancy_record(report: PtxasReport) -> dict:
    """One kernel's ``occupancy`` entry: its ptxas registers and shared bytes per arch."""
    return {a.arch: {"registers": a.registers, "shared_bytes": a.shared_bytes} for a in report.archs}


def counts_disagreements(counts: dict, reports: dict[str, SassReport]) -> list[str]:
    """What differs, naming the kernel (and arch and body), wherever the counts disagree
    with what `doit sass` counted: a kernel missing, a PTX it was not counted from, a
    body's instructions or IMMA."""
    found: list[str] = []
    kernels = counts.get("kernels") if isinstance(counts, dict) else None
    if not isinstance(kernels, dict):
        return ["field 'kernels': expected an object of kernel entries"]
    for name, report in reports.items():
        entry = kernels.get(name)
        if not isinstance(entry, dict):
            found.append(f"no counts for {name}")
            continue
        if entry.get("ptx_sha256") != report.ptx_sha256:
            found.append(f"{name} was counted from other PTX")
            continue
        for a in report.archs:
            have = (entry.get("archs") or {}).get(a.arch)
            held = have.get("outside_instructions") if isinstance(have, dict) else None
            if a.outside_path is not None and held != a.outside_path:
                found.append(f"{name} {a.arch}: outside_instructions {held}, the SASS's longest path {a.outside_path}")
            unsplit = have.get("outside_unsplit_instructions") if isinstance(have, dict) else None
            if a.outside_path is not None and unsplit != a.outside_path_unsplit:
                found.append(f"{name} {a.arch}: outside_unsplit_instructions {unsplit}, the SASS's unsplit "
                             f"path {a.outside_path_unsplit}")
            for part in ("fast", "tail"):
                body = getattr(a, part)
                got = (have or {}).get(part) if isinstance(have, dict) else None
                want = None if body is None else (body.instructions, body.imma, global_bytes(body.classes))
                seen = None if not isinstance(got, dict) else (got.get("instructions"), got.get("imma"),
                                                                got.get("global_bytes"))
                if want != seen:
                    found.append(f"{name} {a.arch} {part}: (instructions, imma, global_bytes) {seen}, the SASS {want}")
    return found


def occupancy_disagreements(counts: dict, reports: dict[str, PtxasReport]) -> list[str]:
    """Where the file's ``occupancy`` is not what ptxas gave each kernel now, naming it."""
    held = counts.get("occupancy") if isinstance(counts, dict) else None
    if not reports:
        return []
    if not isinstance(held, dict):
        return ["field 'occupancy': expected an object of kernel entries"]
    return [f"{name}: occupancy {held.get(name)}, ptxas {occupancy_record(report)}"
            for name, report in reports.items() if held.get(name) != occupancy_record(report)]


def counts_problems(counts: dict, reports: dict[str, SassReport]) -> list[str]:
    """Where the committed counts disagree with what `doit sass` counted, one line each
    naming the file, the kernel and the command (:func:`counts_disagreements`)."""
    return [f"{rel(COUNTS_FILE)}: {what}; run `doit model:counts`" for what in counts_disagreements(counts, reports)]


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
    compulsory_bytes: int
    output_bytes_per_cta: float  # the int32 output one CTA writes (its share of rows x cols)
    splits: int  # CTAs along the contraction (split-K adds their sums)
    global_bytes_per_warp: float  # requested by the loop's global loads, from SASS


def per_trip(sass: SassArch, name: str) -> Body | None:
    """The fast or tail body; a loop with one body stands in for the other."""
    return getattr(sass, name) or sass.fast or sass.tail


def global_bytes(classes: dict[str, int]) -> float:
    """Bytes a warp's global loads and global->shared copies (LDGSTS) request, at least
    one 32-B sector each, by their access width."""
    return sum(n * max(32.0, (class_width(cls) or 128) / 8 * 32) for cls, n in classes.items()
               if cls.startswith("ldg"))


def outside_path(sass: SassArch, splits: int) -> int:
    """The instructions a warp of a launch with ``splits`` splits runs outside the steady
    loop: the unsplit path's with one split, else the longest path's (the whole function
    less the loop where the record has neither)."""
    longest = sass.outside_path if sass.outside_path is not None else (
        sass.instructions - next(lp for lp in sass.loops if lp.start == sass.steady_loop).instructions)
    return cost.launch_path(splits, longest, sass.outside_path_unsplit)


def work(spec: KernelSpec, dims: Dims, sass: SassArch) -> Work:
    geometry = spec.geometry(dims)
    rows, cols = spec.output.layout.logical(dims)  # the caller's rows x width, not the pitched rows
    contraction = dims.R * dims.K * dims.N // (rows * cols)
    splits = geometry.grid[2]  # split-K: each CTA along z runs its share of the chunks
    span = -(-(-(-contraction // CHUNK_K)) // splits) * CHUNK_K
    fast, tail = tile_rule.chunks(min(span, contraction), has_tail_body=sass.tail is not None)
    fbody, tbody = per_trip(sass, "fast"), per_trip(sass, "tail")
    if fbody is None:
        raise UserError(f"{spec.name} {sass.arch}: the SASS record has no loop; run `doit sass`")
    return Work(
        ctas=math.prod(geometry.grid), warps_per_cta=math.prod(geometry.block) // 32,
        contraction=contraction, fast_chunks=fast, tail_chunks=tail, stages=spec.stages,
        instructions_per_warp=fast * fbody.instructions + tail * tbody.instructions + outside_path(sass, splits),
        imma_per_warp=fast * fbody.imma + tail * tbody.imma, compulsory_bytes=spec.buffer_bytes(dims, splits),
        output_bytes_per_cta=4 * rows * cols / (geometry.grid[0] * geometry.grid[1]), splits=splits,
        global_bytes_per_warp=fast * global_bytes(fbody.classes) + tail * global_bytes(tbody.classes),
    )


def ctas_per_sm(g: GpuModel, warps_per_cta: int, ptxas: PtxasArch) -> int:
    """Resident CTAs per SM of a kernel with these ptxas figures (``cost.resident_ctas``)."""
    return cost.resident_ctas(as_device(g), warps_per_cta, cost.Occupancy(ptxas.registers, ptxas.shared_bytes))


# ---- emulator memory counts ----------------------------------------------------------


def memory_rows_from_report(path: Path) -> list[MemoryAccess] | None:
    """The ``launch_stats.memory`` rows of a verify report, when it has them."""
    if not Path(path).is_file():
        return None
    try:
        raw = read_json(Path(path))
        rows = ((raw.get("launch_stats") if isinstance(raw, dict) else None) or {}).get("memory")
        return None if rows is None else [MemoryAccess.model_validate(r) for r in rows]
    except (ArtifactError, ValidationError, AttributeError) as exc:
        raise UserError(f"{rel(path)}: launch_stats.memory unreadable ({str(exc).splitlines()[0]}); "
                        "delete the report and re-run `doit verify`") from None


MEMORY_SPACES = ("global", "shared")


def memory_rows_from_emulator(spec: KernelSpec, shape: Shape, ptx: str) -> list[MemoryAccess]:
    """Run the kernel once on the emulator and take its memory rows (its launch statistics
    carry one per PTX line with global or shared requests, ``hslm_ptx.emu.LaunchCounts``)."""
    dims = Dims(shape.R, shape.K, shape.N)
    fn = load_ptx("emulator", ptx, spec.name)
    launch(spec, fn, dims, spec.make_inputs(dims, np.random.default_rng(0)))
    return [MemoryAccess.model_validate(r if isinstance(r, dict) else r._asdict()) for r in fn.stats.memory]


def l1_wavefronts(row: MemoryAccess) -> int:
    """L1 data wavefronts of one traced line: shared accesses as the emulator counts their
    bank wavefronts; a global access takes one per distinct 128-byte line a request touches
    (first order: L1TEX returns at most one 128-byte line per wavefront)."""
    return row.wavefronts if row.space == "shared" else row.lines


def l1_per_cta(w: Work, memory: list[MemoryAccess] | None, source: str) -> tuple[float, str]:
    """Wavefronts per CTA from the emulator when known (``source`` says whence); without
    them the loop's share stays in the per-chunk chain and only the output is counted."""
    if memory:
        return sum(l1_wavefronts(r) for r in memory if r.space in MEMORY_SPACES) / w.ctas, source
    return staged_output_wavefronts(w.output_bytes_per_cta, w.splits), "output only (no emulator memory counts)"


def l2_bytes(memory: list[MemoryAccess]) -> float:
    """Bytes through L2 as the emulator counted them: its global sectors x 32 B (without
    them, the rule's figure stands: what the loop's global loads request and the output,
    ``hslm_ptx.tile.rule.staged_work``)."""
    return 32.0 * sum(r.sectors for r in memory if r.space == "global")


# ---- rows ----------------------------------------------------------------------------


class ConfigPrediction(Record):
    """One implementation on one shape: its phases and bounds (us), the device time
    (the fixed cost + the largest bound), per call (+ the host's launch cost)."""

    config: str
    phases: dict[str, float]
    bounds: dict[str, float]
    fixed_us: float
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
    rule_pick: bool = False  # the configuration hslm_ptx.catalog.registry.choose runs on this shape
    ctas: int
    ctas_per_sm: int
    waves: int
    fast_chunks: int
    tail_chunks: int
    clocks_per_instruction: float  # ptxas's stall clocks per instruction of the fast body
    l1_source: str
    ours: ConfigPrediction
    reference: ConfigPrediction
    # ours / the best reference (each chosen on that time), over the device's ranges
    # (``cost.device_sweep``): (low, nominal, high); the verdict of the device-time interval
    device_ratio: tuple[float, float, float] | None = None
    per_call_ratio: tuple[float, float, float] | None = None
    verdict: Literal["ahead", "level", "behind", ""] = ""


class LayerLaunchRow(Record):
    """One launch of a layer step as the model times it: a GEMM on the phase model of the
    int32 GEMM whose counted loop it runs (``loop``), any other kernel as a memory-bound
    pass over the bytes its buffers hold (``bytes``, from the recorded launch)."""

    kernel: str
    model: Literal["gemm", "memory"]
    loop: str  # the counted int32 GEMM entry; "" for a memory-bound kernel
    bytes: int
    device_us: float
    limiter: str


class LayerStepRow(Record):
    """Every launch of one TernaryLinear step (as ``doit layer`` records it) beside torch
    bf16 nn.Linear's (three GEMMs and the bias gradient's reduction), launched eagerly (the host's launch cost per kernel) and
    replayed from a CUDA graph (once)."""

    kind: Literal["MODEL"] = "MODEL"
    target: Literal["hslm", "large", ""]  # the target line that judges it ("": none)
    shape: str
    R: int
    K: int
    N: int
    launches: list[LayerLaunchRow]
    gemm_device_us: float
    other_device_us: float
    eager_us: float
    graph_us: float
    torch_eager_us: float
    torch_graph_us: float
    # ours / torch over the device's ranges (``cost.device_sweep``): (low, nominal, high)
    eager_interval: tuple[float, float, float]
    graph_interval: tuple[float, float, float]

    @property
    def eager_ratio(self) -> float:
        return self.eager_us / self.torch_eager_us

    @property
    def graph_ratio(self) -> float:
        return self.graph_us / self.torch_graph_us


class ModelReport(Record):
    kind: Literal["MODEL"] = "MODEL"
    note: str = "cost-model predictions, not measurements"
    shape_set: str
    gpu: str
    gpu_name: str
    arch: str
    assumptions_sha256: str
    counts_sha256: str
    sass_tools: dict[str, str]  # kernel -> "ptxas X / nvdisasm Y"
    rows: list[ModelRow]
    layer_steps: list[LayerStepRow] = []


def prediction(dev: cost.Device, config: str, p: cost.Phases, useful_ops: float) -> ConfigPrediction:
    return ConfigPrediction(config=config, phases={k: round(getattr(p, k), 4) for k in PHASES},
                      bounds={k: round(getattr(p, k), 4) for k in BOUNDS}, fixed_us=round(p.fixed, 4),
                      device_us=round(p.device_us, 4), per_call_us=round(p.per_call_us, 4), limiter=p.limiter,
                      pct_int8_peak=round(p.pct_peak(useful_ops, dev.int8_dense_tops), 3))


def staged_work(spec: KernelSpec, dims: Dims, g: GpuModel, sass: SassArch, counts: cost.KernelCounts,
                ptxas: PtxasArch, memory: list[MemoryAccess] | None = None,
                memory_source: str = "") -> tuple[Work, cost.StagedWork, str]:
    """One launch of ``spec`` on ``dims`` as the cost module's :class:`cost.StagedWork`
    (with the records' :class:`Work` and where its L1 wavefronts came from): the tile
    rule's own :func:`hslm_ptx.tile.rule.staged_work`, so the rule and the model time the
    same launch, with the emulator's L2 sectors and L1 wavefronts where they are known."""
    w = work(spec, dims, sass)
    l1, l1_source = l1_per_cta(w, memory, memory_source)
    rows, cols = spec.output.layout.logical(dims)
    staged = tile_rule.staged_work(spec.geometry(dims), rows, cols, w.contraction, spec.stages, spec.chunk_bytes, counts,
                                   ctas_per_sm(g, w.warps_per_cta, ptxas), spec.buffer_bytes(dims, w.splits),
                                   spec.split_rescale)
    staged = staged._replace(l1_wavefronts_per_cta=l1)
    return w, staged._replace(l2_bytes=l2_bytes(memory)) if memory else staged, l1_source


def sweep(dev: cost.Device) -> list[cost.Device]:
    """``dev`` over the ranges devices.json gives its estimates (``cost.device_sweep``)."""
    name = next((n for n, d in cost.load_devices().items() if d == dev), None)
    return cost.device_sweep(dev, cost.load_ranges().get(name, {}) if name else {})


def ratio_intervals(dev: cost.Device, staged: cost.StagedWork, rows: int, cols: int,
                    contraction: int) -> tuple[cost.Interval, cost.Interval]:
    """Ours over the best reference, on device time and per call, each reference chosen on
    that time, as intervals over :func:`sweep` (the launch itself is fixed: what the rule
    runs)."""
    device, per_call = [], []
    for d in sweep(dev):
        ours = cost.staged_phases(d, staged)
        device.append(ours.device_us / cost.best_dense(d, rows, cols, contraction, per_call=False)[1].device_us)
        per_call.append(ours.per_call_us / cost.best_dense(d, rows, cols, contraction)[1].per_call_us)
    return cost.Interval.of(device), cost.Interval.of(per_call)


def model_row(spec: KernelSpec, shape: Shape, g: GpuModel, sass: SassArch, counts: cost.KernelCounts,
              ptxas: PtxasArch, memory: list[MemoryAccess] | None, memory_source: str) -> ModelRow:
    dev = as_device(g)
    dims = Dims(shape.R, shape.K, shape.N)
    w, staged, l1_source = staged_work(spec, dims, g, sass, counts, ptxas, memory, memory_source)
    resident = staged.resident
    ours = cost.staged_phases(dev, staged)
    rows, cols = spec.output.layout.logical(dims)
    ref_cfg, ref = cost.best_dense(dev, rows, cols, w.contraction, "int8")
    useful = 2.0 * dims.R * dims.K * dims.N
    pick = choose(spec.family_name, dims).name == spec.name
    device_ratio = per_call_ratio = None
    if pick:  # the interval of what the rule runs
        device_ratio, per_call_ratio = ratio_intervals(dev, staged, rows, cols, w.contraction)
    return ModelRow(kernel=spec.name, shape=shape.name, R=shape.R, K=shape.K, N=shape.N,
                    device_ratio=device_ratio and tuple(round(x, 4) for x in device_ratio),
                    per_call_ratio=per_call_ratio and tuple(round(x, 4) for x in per_call_ratio),
                    verdict=cost.Interval(device_ratio[0], device_ratio[1], device_ratio[2]).verdict()
                    if device_ratio else "",
                    rule_pick=pick, ctas=w.ctas,
                    ctas_per_sm=resident, waves=math.ceil(w.ctas / (dev.sms * max(1, resident))),
                    fast_chunks=w.fast_chunks, tail_chunks=w.tail_chunks,
                    clocks_per_instruction=round(counts.clocks_per_instruction, 3), l1_source=l1_source,
                    ours=prediction(dev, spec.tile or spec.name, ours, useful),
                    reference=prediction(dev, ref_cfg.label, ref, useful))


LAYER_FAMILIES = ("hslm_fwd_s8", "hslm_dx_s8", "hslm_dw_s8")
# a product that quantizes its own A runs its int32 family's loop: the forward's scales pass
# over float x is not in the model (docs/performance-model.md: what only a GPU can settle);
# the backward's products (hslm_bwd) count dY's floats read twice a chunk in their L2 bytes
SAME_LOOP = {"hslm_fwdq_": "hslm_fwd_s8", "hslm_fwdc_": "hslm_fwd_s8", "hslm_dxq_": "hslm_dx_s8", "hslm_dwq_": "hslm_dw_s8"}
# the layer step's targets against torch bf16 nn.Linear: the HSLM shapes within this
# ratio of its time, the large layer at least this many times faster
HSLM_STEP_MAX_RATIO = 1.5
LARGE_STEP_MIN_SPEEDUP = 1.3
# (counted loop entry, launched kernel) -> the loop entry's SASS and loop counts, the launched kernel's ptxas
GemmRecords = Callable[[str, str], tuple[SassArch, cost.KernelCounts, PtxasArch]]


def loop_entry(spec: KernelSpec) -> str | None:
    """The counted int32 GEMM whose main loop ``spec`` runs: itself for an int32 GEMM; for
    a fused (rescaled, possibly split-K) forward, dX or dW, the int32 family's entry on
    the same tile (the fused kernels share its loop and differ in the epilogue); None for
    a kernel that is not a GEMM."""
    if spec.is_gemm:
        return spec.name
    family = next((f for f in LAYER_FAMILIES if spec.family_name.startswith(f.removesuffix("s8"))), None)
    family = next((f for prefix, f in SAME_LOOP.items() if spec.family_name.startswith(prefix)), family)
    if not spec.tile or family is None:
        return None
    return next((name for name, other in KERNELS.items()
                 if other.is_gemm and other.family_name == family and other.tile == spec.tile), None)


def launch_phases(layer: LayerShape, recorded: LayerLaunch, g: GpuModel,
                  records: GemmRecords, dev: cost.Device | None = None) -> tuple[str, cost.Phases]:
    """(the counted loop entry or "", the phases) of one recorded launch of the step, on
    ``dev`` (default: the entry's own figures)."""
    dev = dev or as_device(g)
    spec = KERNELS.get(recorded.kernel)
    if spec is None:
        raise UserError(f"layer step {layer.name}: it launches '{recorded.kernel}', which hslm_ptx/catalog/registry.py does "
                        "not hold; register the kernel or fix hslm_ptx/step/launches.py")
    entry, members = loop_entry(spec), grouped.members_of(spec)
    if entry is None and not members:
        return "", cost.stream_phases(dev, recorded.bytes)
    dims = Dims(layer.R, layer.K, layer.N)
    if tuple(spec.geometry(dims).grid) != tuple(recorded.grid):
        raise UserError(f"layer step {layer.name}: {spec.name} was launched on grid {tuple(recorded.grid)}, its spec "
                        f"gives {tuple(spec.geometry(dims).grid)} for R={layer.R} K={layer.K} N={layer.N}; the "
                        "step and the spec disagree, fix hslm_ptx/step/launches.py")
    if members:
        return grouped_phases(layer, recorded, members, g, records, dev)
    sass, counts, ptxas = records(entry, spec.name)
    return entry, cost.staged_phases(dev, staged_work(spec, dims, g, sass, counts, ptxas)[1])


def grouped_phases(layer: LayerShape, recorded: LayerLaunch, members: tuple[KernelSpec, ...], g: GpuModel,
                   records: GemmRecords, dev: cost.Device) -> tuple[str, cost.Phases]:
    """A grouped launch (hslm_ptx.tile.grouped) timed as its members one after another, each with
    its own fixed cost: no overlap of one member's tail with the next is credited, so this
    is the slower side of what the grid can do. A member that is a GEMM is timed on its own
    loop entry's phases; any other member as a pass over the whole launch's bytes (which
    the GEMM members also count: an over-count, on the same side)."""
    dims = Dims(layer.R, layer.K, layer.N)
    entries, parts = [], []
    for member in members:
        entry = loop_entry(member)
        if entry is None:
            parts.append(cost.stream_phases(dev, recorded.bytes))
            continue
        # a member that is a kernel of its own has its own ptxas record; one built only as a
        # part (hslm_bwd's products) runs at the registers of the entry that holds it
        sass, counts, ptxas = records(entry, member.name if member.name in KERNELS else recorded.kernel)
        entries.append(entry)
        parts.append(cost.staged_phases(dev, staged_work(member, dims, g, sass, counts, ptxas)[1]))
    slowest = max(parts, key=lambda p: p.device_us)
    return "+".join(entries), slowest._replace(fixed=sum(p.fixed for p in parts),
                                               device_us=sum(p.device_us for p in parts))


def step_intervals(layer: LayerShape, g: GpuModel, records: GemmRecords) -> tuple[cost.Interval, cost.Interval]:
    """Ours over torch's step, eager and graph-replayed, as intervals over :func:`sweep`."""
    eager, graph = [], []
    for d in sweep(as_device(g)):
        ours = [launch_phases(layer, recorded, g, records, d)[1] for recorded in layer.launch_list]
        torch = cost.torch_linear_launches(d, layer.R, layer.K, layer.N, layer.bias)
        eager.append(cost.eager_us(ours) / cost.eager_us(torch))
        graph.append(cost.graph_us(d, ours) / cost.graph_us(d, torch))
    return cost.Interval.of(eager), cost.Interval.of(graph)


def layer_step_row(layer: LayerShape, g: GpuModel, records: GemmRecords, target: str) -> LayerStepRow:
    """Every recorded launch of ``layer``'s step timed (:func:`launch_phases`), eager and
    graph-replayed, beside torch bf16 nn.Linear's step (three GEMMs and, with a bias, the
    bias gradient's reduction: ``cost.torch_linear_launches``) timed the same two ways."""
    dev = as_device(g)
    launches, phases = [], []
    for recorded in layer.launch_list:
        entry, p = launch_phases(layer, recorded, g, records)
        phases.append(p)
        launches.append(LayerLaunchRow(kernel=recorded.kernel, model="gemm" if entry else "memory", loop=entry,
                                       bytes=recorded.bytes, device_us=round(p.device_us, 4), limiter=p.limiter))
    torch = cost.torch_linear_launches(dev, layer.R, layer.K, layer.N, layer.bias)
    eager, graph = step_intervals(layer, g, records)
    return LayerStepRow(eager_interval=tuple(round(x, 4) for x in eager),
                        graph_interval=tuple(round(x, 4) for x in graph),
        target=target, shape=layer.name, R=layer.R, K=layer.K, N=layer.N, launches=launches,
        gemm_device_us=round(sum(p.device_us for p, x in zip(phases, launches) if x.model == "gemm"), 3),
        other_device_us=round(sum(p.device_us for p, x in zip(phases, launches) if x.model == "memory"), 3),
        eager_us=round(cost.eager_us(phases), 3), graph_us=round(cost.graph_us(dev, phases), 3),
        torch_eager_us=round(cost.eager_us(torch), 3), torch_graph_us=round(cost.graph_us(dev, torch), 3))


def layer_targets(steps: list[LayerStepRow]) -> list[str]:
    """One line per target: the HSLM steps, graph-replayed, within :data:`HSLM_STEP_MAX_RATIO`
    of torch (as the target is stated; the eager figures are printed beside them), the
    large layer at least :data:`LARGE_STEP_MIN_SPEEDUP` x faster both ways. A target is met
    only where the whole interval over the device's ranges meets it; 'level' where the
    interval straddles it."""
    lines = []
    hslm = [s for s in steps if s.target == "hslm"]
    if hslm:
        parts = []
        for how in ("graph", "eager"):
            spans = [getattr(s, f"{how}_interval") for s in hslm]
            parts.append(f"{how} {sum(high <= HSLM_STEP_MAX_RATIO for _, _, high in spans)} of {len(spans)} shapes "
                         f"over the whole interval (ours/torch {min(lo for lo, _, _ in spans):.2f}-"
                         f"{max(hi for _, _, hi in spans):.2f})")
        met = "met" if max(s.graph_interval[2] for s in hslm) <= HSLM_STEP_MAX_RATIO else (
            "NOT met" if max(s.graph_interval[0] for s in hslm) > HSLM_STEP_MAX_RATIO else "level")
        lines.append(f"MODEL target: HSLM step, graph-replayed, within {HSLM_STEP_MAX_RATIO}x of torch bf16 "
                     f"nn.Linear: {parts[0]} (eager, not the target: {parts[1]}): {met}")
    for s in (s for s in steps if s.target == "large"):
        eager = cost.Interval(*(1 / x for x in reversed(s.eager_interval)))
        graph = cost.Interval(*(1 / x for x in reversed(s.graph_interval)))
        met = "met" if min(eager.low, graph.low) >= LARGE_STEP_MIN_SPEEDUP else (
            "NOT met" if min(eager.high, graph.high) < LARGE_STEP_MIN_SPEEDUP else "level")
        lines.append(f"MODEL target: large step {s.shape} (R={s.R}, K={s.K}, N={s.N}) at least "
                     f"{LARGE_STEP_MIN_SPEEDUP}x faster than torch bf16 nn.Linear: torch/ours eager {eager}, "
                     f"graph {graph}: {met}")
    return lines


def assumptions_sha256(path: Path = DEVICES_FILE) -> str:
    return sha256_file(path)


# ---- calibration against published measurements --------------------------------------


MAX_EXTENT = 2**31 - 1  # a GEMM extent a CUDA launch can index (int32)
MAX_BYTES = 2**48  # far above any GPU's memory


class CalibrationPoint(Record):
    """One published measurement: what was timed, on which device, at which shape, its
    source, and the figure."""

    name: str
    device: str  # a key of hslm_ptx/cost/devices.json
    kind: Literal["gemm", "stream"]  # a GEMM's throughput, or a streaming kernel's bandwidth
    dtype: Literal["int8", "bf16", "fp16", "fp32"]
    M: int = Field(default=0, ge=0, le=MAX_EXTENT)
    N: int = Field(default=0, ge=0, le=MAX_EXTENT)
    K: int = Field(default=0, ge=0, le=MAX_EXTENT)
    bytes: int = Field(default=0, ge=0, le=MAX_BYTES)  # a stream's bytes moved (read + written)
    resident: Literal["dram", "l2"] = "dram"  # where a stream's data lives between launches
    timed: Literal["kernel", "host_loop"]  # device time, or a host loop of back-to-back launches
    # TFLOPS, GB/s (a stream's), us, or the figure sgl-kernel's bench_int8_gemm.py prints
    # (:data:`BENCH_INT8_GEMM`)
    metric: Literal["TFLOPS", "GB/s", "us", "bench_int8_gemm GB/s"]
    published: float = Field(gt=0, allow_inf_nan=False)
    library: str
    # the configurations the library runs: any of the reference class, or one CTA an output
    # tile (no split-K, no stream-K)
    configs: Literal["any", "data-parallel"] = "any"
    source: str = Field(min_length=20)  # URL + table / figure + the exact line
    fit: bool  # true: the model was built against it (its error seen); false: held out
    why: str = Field(min_length=10)  # why it is fit or held out
    note: str = ""  # why a point misses, or how it was read


class Calibration(Record):
    points: list[CalibrationPoint] = Field(min_length=1)


class CalibrationRow(Record):
    kind: Literal["MODEL"] = "MODEL"
    name: str
    device: str
    what: str
    metric: str
    published: float
    predicted: float
    error_pct: float  # 100 x (predicted / published - 1)
    config: str
    limiter: str
    fit: bool
    int8_small_m: bool  # an int8 GEMM with M <= 512, the regime the HSLM shapes live in
    source: str
    note: str


def load_calibration(path: Path | None = None) -> Calibration:
    return _validated(Path(path or CALIBRATION_FILE), read_yaml, Calibration, "the published points the model is calibrated against")


NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def figure_quoted(point: CalibrationPoint) -> bool:
    """Whether the point's published figure is one of the numbers of its quoted source
    line (the text between the last pair of single quotes), to the digits printed there."""
    quoted = point.source.rsplit("'", 2)[-2] if point.source.count("'") >= 2 else ""
    return any(math.isclose(float(n), point.published, rel_tol=1e-9) for n in NUMBER.findall(quoted))


def bench_int8_gemm_bytes(m: int, n: int, k: int) -> float:
    """What sgl-kernel's benchmark/bench_int8_gemm.py divides by the time for its column
    headed GB/s: (2MNK - MN) x 1 B + 3MN x 4 B (its ops counted as bytes, plus the scales
    and output), so its figure is ``this / seconds / 1e9``."""
    return (2 * m * n * k - m * n) + 3 * m * n * 4


def predict_point(point: CalibrationPoint, dev: cost.Device) -> tuple[float, str, str]:
    """(the model's figure in the point's metric, the configuration, the limiter)."""
    if point.kind == "gemm":
        if not (point.M and point.N and point.K):
            raise UserError(f"{rel(CALIBRATION_FILE)}: point '{point.name}': a gemm needs M, N and K")
        dtype = "int8" if point.dtype == "int8" else "bf16"
        cfg, p = cost.best_dense(dev, point.M, point.N, point.K, dtype, per_call=False,
                                 data_parallel=point.configs == "data-parallel")
        seconds = (cost.host_loop_us(p) if point.timed == "host_loop" else p.device_us) * 1e-6
        ops = 2.0 * point.M * point.N * point.K
        label, limiter = cfg.label, p.limiter
    else:
        if not point.bytes:
            raise UserError(f"{rel(CALIBRATION_FILE)}: point '{point.name}': a stream needs bytes")
        p = cost.stream_phases(dev, point.bytes, point.resident)
        seconds = (cost.host_loop_us(p) if point.timed == "host_loop" else p.device_us) * 1e-6
        ops, label, limiter = 0.0, "elementwise", point.resident
    if point.metric == "TFLOPS":
        return ops / seconds / 1e12, label, limiter
    if point.metric == "GB/s":
        return point.bytes / seconds / 1e9, label, limiter
    if point.metric == "bench_int8_gemm GB/s":
        return bench_int8_gemm_bytes(point.M, point.N, point.K) / seconds / 1e9, label, limiter
    return seconds * 1e6, label, limiter


def calibration_rows(calibration: Calibration, devices: dict[str, GpuModel]) -> list[CalibrationRow]:
    rows = []
    for point in calibration.points:
        if point.device not in devices:
            raise UserError(f"{rel(CALIBRATION_FILE)}: point '{point.name}': unknown device '{point.device}'; "
                            f"known in {rel(DEVICES_FILE)}: {', '.join(devices)}")
        predicted, config, limiter = predict_point(point, as_device(devices[point.device]))
        shape = f"{point.M}x{point.N}x{point.K}" if point.kind == "gemm" else f"{point.bytes} B"
        rows.append(CalibrationRow(
            name=point.name, device=point.device, what=f"{point.library} {point.dtype} {point.kind} {shape} "
            f"({point.timed})", metric=point.metric, published=point.published, predicted=round(predicted, 3),
            error_pct=round(100 * (predicted / point.published - 1), 1), config=config, limiter=limiter,
            fit=point.fit, int8_small_m=point.kind == "gemm" and point.dtype == "int8" and point.M <= 512,
            source=point.source, note=point.note))
    return rows


def error_line(label: str, rows: list[CalibrationRow]) -> str:
    """``<label>: <n> points, median |error| <x>%, max <y>%`` over ``rows``."""
    errors = [abs(r.error_pct) for r in rows]
    if not errors:
        return f"{label}: 0 points"
    return f"{label}: {len(errors)} points, median |error| {statistics.median(errors):.1f}%, max {max(errors):.1f}%"


def calibration_summary(rows: list[CalibrationRow]) -> list[str]:
    """The closing lines, held-out first: the held-out points, those of them that are int8
    GEMMs with M <= 512, and the fit points (which the model was built against)."""
    held = [r for r in rows if not r.fit]
    return [error_line("held-out", held), error_line("held-out int8 M <= 512", [r for r in held if r.int8_small_m]),
            error_line("fit", [r for r in rows if r.fit])]
