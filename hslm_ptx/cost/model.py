"""The one cost model: device facts, loop counts, and the time of a kernel on a shape.

Both the tile rule (``hslm_ptx.tile.rule.phase_cost``, called by
``hslm_ptx.catalog.registry.choose``) and ``doit model`` (``hslm_ptx.pipeline.stages.perf_model``) call it on the
same launch (``hslm_ptx.tile.rule.staged_work``), so the configuration a caller gets is the
one the model predicts fastest, from the same numbers.
Only numpy and the standard library: the kernel side must import without hslm_ptx.pipeline.

Inputs, all read from files, never typed into a kernel module:

- ``hslm_ptx/cost/devices.json``: the device facts, one source per number;
- ``hslm_ptx/cost/loop_counts.json``: per kernel entry and arch, the steady loop's fast and tail
  bodies as ptxas compiled them (instructions, IMMA and the sum of ptxas's stall counts
  over the body, read from the control bits of each instruction) and the instructions
  outside the chunk loops with their stall clocks, on the longest path (split-K's
  epilogue) and on the path of a launch with one split, and the ptxas occupancy of every kernel the tile rule scores (its
  residency without the artifacts: :func:`occupancy`). ``doit model:counts`` writes it from
  the cubin and the ptxas records;
  ``hslm_ptx.pipeline.stages.perf_model.counts_problems`` checks its instruction counts against what
  ``doit sass`` counted (tests/test_cost.py runs that check).

The time of a kernel at the low occupancy HSLM runs at (1-3 warps per scheduler, 1-12
chunks per CTA) is a sum of serial phases per CTA, overlapped only as far as the warps
per scheduler allow (:func:`staged_phases`):

    prologue (the first copies' DRAM round trip) + chunks x the per-chunk chain
    + the instructions outside the loop on the launch's path (:func:`issue_cycles`)
    + the epilogue's output + the drain,

where the per-chunk chain is the largest of: ptxas's stall clocks of one trip (the
clocks one warp needs when nothing else issues on its scheduler), the trip's
instructions x the warps sharing a scheduler, the trip's tensor work on the SM, an
operand's L2 round trip where the body loads it straight into registers one chunk ahead
(``LoopFigures.direct_loads``, read from the SASS; no staged loop does now), and the ring's
round trip spread over the ``stages - 1`` chunks in flight. The whole-GPU bounds (L2
bytes, DRAM bytes at the reachable fraction, split-K reds at the atomic rate) cap it
from below; a fixed device cost per kernel is added, and the host's launch cost is
kept apart (``per_call_us``).

The reference class (:func:`best_dense`) is what a user would get from a library: the
best of several CUTLASS/cuBLAS-like configurations on the same phase model (64x64,
128x64 and 128x128 tiles, split-K with a reduction kernel, a stream-K-like even split),
each charged outside its loop what its own structure runs (:func:`library_outside_instructions`),
and :func:`torch_linear_step` is bf16 ``nn.Linear``'s layer step: its three GEMMs and,
with a bias, the bias gradient's reduction.
A kernel that is not a GEMM is timed as a memory-bound pass (:func:`stream_phases`); a
step of launches is timed eagerly (:func:`eager_us`) or replayed from a CUDA graph
(:func:`graph_us`).
"""
from __future__ import annotations

import json
import math
import random
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple, TypeVar

DEVICES_FILE = Path(__file__).with_name("devices.json")
COUNTS_FILE = Path(__file__).with_name("loop_counts.json")  # written by `doit model:counts`, shipped with the package
RULE_DEVICE = "h200"  # the GPU the tile rule scores for (132 SMs)
RULE_ARCH = "sm_90"
IMMA_OPS = 2 * 16 * 8 * 32  # one m16n8k32 mma: a multiply and an add per product
K_TILE_BYTES = 64  # bytes of k per main-loop step of every configuration here
ACCUMULATORS_PER_MMA_LANE = 4  # m16n8 C/D fragment: four .s32 a lane (PTX ISA, mma.m16n8k32 fragments)
L1_BYTES_PER_WAVEFRONT = 128


# ---- device facts --------------------------------------------------------------------


class Device(NamedTuple):
    """The figures of one GPU in devices.json (values only; the sources stay in the file)."""

    name: str
    arch: str
    sms: int
    clock_ghz: float
    int8_dense_tops: float
    bf16_dense_tflops: float
    mma_sync_fraction: float
    library_tensor_fraction: float
    l2_latency_cycles: float
    dram_latency_cycles: float
    shared_latency_cycles: float
    l2_bandwidth_gbs: float
    dram_bandwidth_gbs: float
    dram_efficiency: float
    red_gbs: float
    launch_us: float
    kernel_fixed_us: float
    l1_wavefronts_per_clock: float
    schedulers_per_sm: int
    max_ctas_per_sm: int
    max_warps_per_sm: int
    registers_per_sm: int
    shared_per_sm_bytes: int
    # the reference's instructions outside its main loop, from a library kernel's structure
    library_prologue_instructions: float
    library_epilogue_instructions: float  # per accumulator a lane holds
    library_clocks_per_instruction: float

    @property
    def clock_hz(self) -> float:
        return self.clock_ghz * 1e9

    def peak_ops_per_sm_clock(self, dtype: str = "int8") -> float:
        """Dense tensor ops (a multiply and an add each) per SM per clock at the datasheet peak."""
        peak = self.int8_dense_tops if dtype == "int8" else self.bf16_dense_tflops
        return peak * 1e12 / (self.sms * self.clock_hz)

    def us(self, cycles: float) -> float:
        return cycles / self.clock_hz * 1e6


INT_FIELDS = ("sms", "schedulers_per_sm", "max_ctas_per_sm", "max_warps_per_sm", "registers_per_sm",
              "shared_per_sm_bytes")


class CostInputError(ValueError):
    """A devices or counts file the cost model cannot use; the message is one line."""


class NotCounted(CostInputError):
    """A sound counts file without an entry for this kernel (a configuration not counted
    yet): the tile rule never picks it; a file it cannot read is a :class:`CostInputError`."""


FRACTION_FIELDS = ("mma_sync_fraction", "library_tensor_fraction", "dram_efficiency")


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a figure")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"key {next(k for k in keys if keys.count(k) > 1)!r} given twice")
    return dict(pairs)


def read_json_file(path: Path, what: str) -> dict:
    """A JSON object from ``path``: UTF-8, no NaN or Infinity, each key once, an object at
    the top; anything else is one :class:`CostInputError` line naming the file."""
    try:
        raw = json.loads(Path(path).read_bytes().decode("utf-8"), parse_constant=_no_constant,
                         object_pairs_hook=_unique_keys)
    except FileNotFoundError:
        raise CostInputError(f"{path}: missing; it holds {what}") from None
    except OSError as exc:
        raise CostInputError(f"{path}: not a readable file ({exc.strerror or exc}); it holds {what}") from None
    except UnicodeDecodeError as exc:
        raise CostInputError(f"{path}: byte 0x{exc.object[exc.start]:02x} at offset {exc.start} is not UTF-8; "
                             "fix or restore it") from None
    except (ValueError, RecursionError) as exc:
        raise CostInputError(f"{path}: not strict JSON ({str(exc).splitlines()[0]}); fix or restore it") from None
    if not isinstance(raw, dict):
        raise CostInputError(f"{path}: field '(top level)': expected an object, found a {type(raw).__name__}; "
                             "restore the file")
    return raw


def shown(value: object) -> str:
    """``value`` as a message quotes it, cut to 40 characters (a 400-digit figure is still one line)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def finite_positive(value: object) -> bool:
    """A number (not a bool) that is finite and above 0 (an int too large for a float is not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value)) and value > 0
    except OverflowError:
        return False


def figure(entry: object, field: str, where: str, path: Path) -> float:
    """One ``{value, source[, range]}`` figure of a device: the value finite and above 0
    (whole for a count, at most 1 for a fraction), the source non-empty, a range (the
    estimate's low and high) around the value."""
    if not (isinstance(entry, dict) and isinstance(entry.get("source"), str) and entry["source"].strip()
            and "value" in entry):
        raise CostInputError(f"{path}: field '{where}': expected {{value: number, source: text}}; add it with "
                             "its source")
    value = entry["value"]
    if not finite_positive(value):
        raise CostInputError(f"{path}: field '{where}.value': {shown(value)} is not a finite number above 0; give the "
                             "figure its source states")
    if field in INT_FIELDS and float(value) != int(value):
        raise CostInputError(f"{path}: field '{where}.value': {value!r} is not a whole number; give the count")
    if field in FRACTION_FIELDS and value > 1:
        raise CostInputError(f"{path}: field '{where}.value': {value!r} is above 1; a fraction is at most 1")
    if entry.get("range") is not None:
        low_high = entry["range"]
        if not (isinstance(low_high, (list, tuple)) and len(low_high) == 2 and all(map(finite_positive, low_high))
                and low_high[0] <= value <= low_high[1] and (field not in FRACTION_FIELDS or low_high[1] <= 1)):
            raise CostInputError(f"{path}: field '{where}.range': {shown(low_high)} is not [low, high] of finite "
                                 "numbers above 0 around the value; give the estimate's range")
    return float(value)


def devices_from(raw: dict, path: Path) -> dict[str, Device]:
    """Every device of a devices.json document; a missing or unsourced figure names its field."""
    if not isinstance(raw, dict):
        raise CostInputError(f"{path}: field '(top level)': expected an object; restore the file")
    entries = raw.get("devices")
    if not isinstance(entries, dict) or not entries:
        raise CostInputError(f"{path}: field 'devices': expected an object of devices; add one")
    out = {}
    for name, entry in entries.items():
        if not isinstance(entry, dict):
            raise CostInputError(f"{path}: field 'devices.{name}': expected an object of figures; restore it")
        values: dict[str, object] = {}
        for field in Device._fields:
            item = entry.get(field)
            if field in ("name", "arch"):
                if not isinstance(item, str):
                    raise CostInputError(f"{path}: field 'devices.{name}.{field}': expected a string")
                values[field] = item
                continue
            value = figure(item, field, f"devices.{name}.{field}", path)
            values[field] = int(value) if field in INT_FIELDS else value
        out[name] = Device(**values)
    return out


def device_ranges(raw: dict, name: str) -> dict[str, tuple[float, float]]:
    """The estimates of device ``name``: field -> (low, high), for every figure whose
    entry carries a ``range`` (a datasheet figure has none)."""
    entry = raw["devices"][name]
    return {field: (float(item["range"][0]), float(item["range"][1])) for field, item in entry.items()
            if isinstance(item, dict) and item.get("range") is not None}


@lru_cache(maxsize=4)
def load_devices(path: Path | None = None) -> dict[str, Device]:
    """hslm_ptx/cost/devices.json (or ``path``), validated (:func:`devices_from`)."""
    path = Path(path or DEVICES_FILE)
    return devices_from(read_json_file(path, "the cost model's device facts"), path)


def device(name: str, path: Path | None = None) -> Device:
    known = load_devices(path)
    if name not in known:
        raise CostInputError(f"unknown device '{name}'; known in {Path(path or DEVICES_FILE).name}: "
                             f"{', '.join(known)}")
    return known[name]


@lru_cache(maxsize=4)
def load_ranges(path: Path | None = None) -> dict[str, dict[str, tuple[float, float]]]:
    """Per device, the (low, high) of every figure that is not a datasheet figure."""
    path = Path(path or DEVICES_FILE)
    raw = read_json_file(path, "the cost model's device facts")
    devices_from(raw, path)
    return {name: device_ranges(raw, name) for name in raw["devices"]}


SWEEP_DRAWS = 24  # joint draws of every ranged figure, besides each at its low and high alone
SWEEP_SEED = 41


def device_sweep(dev: Device, ranges: dict[str, tuple[float, float]]) -> list[Device]:
    """The devices an interval is taken over: ``dev`` itself, each ranged figure at its
    low and at its high with the others nominal, and :data:`SWEEP_DRAWS` draws of all of
    them at once, uniform in their ranges (seeded: the same list every run). A prediction's
    interval is its lowest and highest over these."""
    out = [dev]
    for field, (low, high) in sorted(ranges.items()):
        out += [dev._replace(**{field: low}), dev._replace(**{field: high})]
    draw = random.Random(SWEEP_SEED)
    for _ in range(SWEEP_DRAWS):
        out.append(dev._replace(**{f: draw.uniform(lo, hi) for f, (lo, hi) in sorted(ranges.items())}))
    return out


class Interval(NamedTuple):
    """A prediction as the lowest, nominal and highest value over :func:`device_sweep`."""

    low: float
    nominal: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> "Interval":
        return cls(min(values), values[0], max(values))

    def verdict(self, bound: float = 1.0) -> str:
        """'ahead' when the whole interval is at or below ``bound``, 'behind' when all of it
        is above, else 'level'."""
        return "ahead" if self.high <= bound else "behind" if self.low > bound else "level"

    def __str__(self) -> str:
        return f"{self.nominal:.3f} [{self.low:.3f}-{self.high:.3f}]"


# ---- loop counts ---------------------------------------------------------------------


class LoopFigures(NamedTuple):
    """One body of the steady loop, per warp per trip."""

    instructions: int  # NOPs left out, as `doit sass` counts
    imma: int
    issue_clocks: int  # ptxas's stall counts summed over the body, NOPs included
    direct_loads: bool  # the body loads an operand from global straight into registers
    global_bytes: float = 0.0  # what the body's global loads and copies request, per warp (32-B sectors at least)


class KernelCounts(NamedTuple):
    fast: LoopFigures
    tail: LoopFigures | None
    outside_instructions: int  # the longest path's instructions outside the chunk loops (split-K's epilogue)
    outside_unsplit_instructions: int | None = None  # the same for a launch with one split (None: not counted)
    outside_issue_clocks: int | None = None  # ptxas's stall counts summed over the longest path
    outside_unsplit_issue_clocks: int | None = None  # and over the unsplit one

    @property
    def clocks_per_instruction(self) -> float:
        return self.fast.issue_clocks / self.fast.instructions

    def outside_path(self, splits: int) -> tuple[int, int | None]:
        """(instructions, stall clocks) of the path a launch with ``splits`` splits runs
        outside the loop (:func:`launch_path`)."""
        unsplit = None if self.outside_unsplit_instructions is None else (
            self.outside_unsplit_instructions, self.outside_unsplit_issue_clocks)
        return launch_path(splits, (self.outside_instructions, self.outside_issue_clocks), unsplit)

    def outside(self, splits: int) -> int:
        """Instructions a warp of a launch with ``splits`` splits runs outside the loop."""
        return self.outside_path(splits)[0]

    def outside_clocks_per_instruction(self, splits: int) -> float:
        """ptxas's stall clocks per instruction on that path (the loop's where not counted)."""
        instructions, clocks = self.outside_path(splits)
        return self.clocks_per_instruction if clocks is None else clocks / max(1, instructions)

    @property
    def accumulators_per_lane(self) -> float:
        """Accumulators each lane holds: the fast body's IMMA cover the warp's tile once per
        32 bytes of k in the chunk, and an m16n8 tile is 4 accumulators a lane."""
        return self.fast.imma * ACCUMULATORS_PER_MMA_LANE / (K_TILE_BYTES // 32)


Figure = TypeVar("Figure")


def launch_path(splits: int, longest: Figure, unsplit: Figure | None) -> Figure:
    """The figure of the path outside the loop that a launch with ``splits`` splits runs:
    with one split the unsplit path's, where it was counted (the epilogue stores from
    registers and skips split-K's staging and reds), else the longest path's."""
    return unsplit if splits == 1 and unsplit is not None else longest


def count_of(record: object, field: str, where: str, path: Path, optional: bool = False) -> int | None:
    """A whole, finite, non-negative count of a loop-counts record (None where ``optional``
    and absent); anything else names the field and the command that rewrites it."""
    value = record.get(field) if isinstance(record, dict) else None
    if value is None and optional:
        return None
    if not (finite_positive(value) or value == 0) or isinstance(value, bool) or float(value) != int(value):
        raise CostInputError(f"{path}: field '{where}.{field}': {shown(value)} is not a whole count of 0 or more; "
                             "restore the file (git checkout) or run `doit -a model:counts`")
    return int(value)


def figures_of(entry: object, where: str, path: Path) -> LoopFigures:
    if not isinstance(entry, dict) or not isinstance(entry.get("direct_loads"), bool):
        raise CostInputError(f"{path}: field '{where}': expected a counted body; restore the file (git checkout) or run `doit -a model:counts`")
    nbytes = entry.get("global_bytes", 0.0)
    if not (finite_positive(nbytes) or nbytes == 0) or isinstance(nbytes, bool):
        raise CostInputError(f"{path}: field '{where}.global_bytes': {shown(nbytes)} is not a finite byte count; "
                             "restore the file (git checkout) or run `doit -a model:counts`")
    return LoopFigures(*(count_of(entry, f, where, path) for f in ("instructions", "imma", "issue_clocks")),
                       entry["direct_loads"], float(nbytes))


class Occupancy(NamedTuple):
    """What ptxas gave one kernel on one arch that decides how many CTAs an SM holds."""

    registers: int  # per thread
    shared_bytes: int  # static shared memory per CTA


@lru_cache(maxsize=4)
def read_counts_file(path: Path | None = None) -> dict:
    """hslm_ptx/cost/loop_counts.json (or ``path``): strict JSON with its two objects."""
    path = Path(path or COUNTS_FILE)
    raw = read_json_file(path, "the loop counts `doit model:counts` writes")
    for field in ("kernels", "occupancy"):
        if not isinstance(raw.get(field), dict):
            raise CostInputError(f"{path}: field '{field}': expected an object; run `doit model:counts`")
    for entry, record in raw["kernels"].items():  # every figure, not only those a command reads
        for arch in (record.get("archs") or {}) if isinstance(record, dict) else ():
            counts_of(raw["kernels"], entry, arch, path)
    for kernel, archs in raw["occupancy"].items():
        for arch in archs if isinstance(archs, dict) else ():
            occupancy_of(raw["occupancy"], kernel, arch, path)
    return raw


def load_counts(path: Path | None = None) -> dict:
    return read_counts_file(path)["kernels"]


def loop_counts(entry: str, arch: str = RULE_ARCH, path: Path | None = None) -> KernelCounts:
    """The counted loop of PTX entry ``entry`` on ``arch``; a count that is not a whole
    finite number names its field."""
    path = Path(path or COUNTS_FILE)
    return counts_of(load_counts(path), entry, arch, path)


def counts_of(kernels: dict, entry: str, arch: str, path: Path) -> KernelCounts:
    """:func:`loop_counts` of the file's ``kernels`` object, read from ``path``."""
    record = (kernels.get(entry) or {}).get("archs") if isinstance(kernels.get(entry), dict) else None
    record = record.get(arch) if isinstance(record, dict) else None
    if not isinstance(record, dict):
        raise NotCounted(f"{path}: no {arch} loop counts for '{entry}'; run `doit sass` then "
                         "`doit model:counts`")
    where = f"kernels.{entry}.archs.{arch}"
    optional = [count_of(record, f, where, path, optional=True)
                for f in ("outside_unsplit_instructions", "outside_issue_clocks", "outside_unsplit_issue_clocks")]
    tail = figures_of(record["tail"], f"{where}.tail", path) if record.get("tail") else None
    return KernelCounts(figures_of(record.get("fast"), f"{where}.fast", path), tail,
                        count_of(record, "outside_instructions", where, path), *optional)


def occupancy(kernel: str, arch: str = RULE_ARCH, path: Path | None = None) -> Occupancy:
    """ptxas's registers and shared memory of ``kernel`` on ``arch``, as `doit model:counts`
    copied them from the ptxas records (the file's ``occupancy``), so the tile rule knows a
    configuration's residency without the artifacts."""
    path = Path(path or COUNTS_FILE)
    return occupancy_of(read_counts_file(path)["occupancy"], kernel, arch, path)


def occupancy_of(held: dict, kernel: str, arch: str, path: Path) -> Occupancy:
    """:func:`occupancy` of the file's ``occupancy`` object, read from ``path``."""
    record = held.get(kernel)
    record = record.get(arch) if isinstance(record, dict) else None
    if not isinstance(record, dict):
        raise NotCounted(f"{path}: no {arch} occupancy for '{kernel}'; run `doit ptxas` then "
                         "`doit model:counts`")
    where = f"occupancy.{kernel}.{arch}"
    return Occupancy(count_of(record, "registers", where, path), count_of(record, "shared_bytes", where, path))


def resident_ctas(dev: Device, warps_per_cta: int, occ: Occupancy) -> int:
    """CTAs an SM holds at once: registers (allocated 256 a warp at a time), shared memory
    (+1 KB a CTA the runtime reserves), warps and the CTA cap (CUDA C++ Programming Guide,
    occupancy: the hardware limits per compute capability)."""
    regs_per_warp = math.ceil(occ.registers * 32 / 256) * 256
    limits = [dev.max_ctas_per_sm, dev.max_warps_per_sm // warps_per_cta,
              dev.registers_per_sm // (regs_per_warp * warps_per_cta),
              dev.shared_per_sm_bytes // (occ.shared_bytes + 1024)]
    return max(0, min(limits))


# ---- serial phases of a staged kernel ------------------------------------------------


class StagedWork(NamedTuple):
    """What one launch of a staged kernel does, as :func:`staged_phases` needs it."""

    ctas: int
    warps_per_cta: int
    resident: int  # CTAs an SM holds at once (registers, shared memory, warps)
    fast_chunks: int  # chunks one CTA runs on the fast body
    tail_chunks: int
    stages: int  # the copy ring's depth (1: nothing prefetched)
    counts: KernelCounts
    epilogue_wavefronts: float  # L1 wavefronts of one CTA's output
    output_bytes_per_cta: float
    splits: int
    l2_bytes: float  # through L2, whole launch
    dram_bytes: float  # every operand and the output once
    l1_wavefronts_per_cta: float = 0.0  # shared memory and global lines, when counted
    # L2 round trips a split's last CTA waits for after its reds before it writes: the arrival
    # ticket's atomic and the read-back of the summed tile (a split-K rescaled output)
    settle_round_trips: int = 0
    first_touch: float = 0.0  # the share of the copied bytes no other CTA read before (:func:`first_touch_share`)


class Phases(NamedTuple):
    """A kernel's predicted time, us: the serial phases of its busiest SM, the
    whole-GPU bounds, the fixed device cost, and the host's launch cost apart."""

    prologue: float
    chunks: float
    outside: float
    epilogue: float
    drain: float
    serial: float  # waves x the phases above
    l1: float  # the busiest SM's L1 wavefronts, when counted
    l2: float
    dram: float
    reds: float
    fixed: float
    device_us: float  # fixed + the largest of serial, l2, dram, reds
    launch_us: float
    limiter: str

    @property
    def per_call_us(self) -> float:
        return self.device_us + self.launch_us

    def pct_peak(self, useful_ops: float, peak_tops: float) -> float:
        return 100 * useful_ops / (self.device_us * 1e-6) / (peak_tops * 1e12)


def warps_per_scheduler(dev: Device, resident: int, warps_per_cta: int) -> float:
    return max(1.0, resident * warps_per_cta / dev.schedulers_per_sm)


def trip_cycles(dev: Device, body: LoopFigures, w: StagedWork, active: int) -> float:
    """One chunk of one CTA on its SM: the largest of ptxas's stall clocks of the body,
    the body's issue when ``active`` CTAs share the schedulers, the SM's tensor work, an
    operand's L2 round trip (loaded straight into registers one chunk ahead) and the
    ring's (stages - 1 ahead)."""
    sharing = warps_per_scheduler(dev, active, w.warps_per_cta)
    issue = sharing * body.instructions
    tensor = active * w.warps_per_cta * body.imma * IMMA_OPS / (dev.peak_ops_per_sm_clock("int8")
                                                                 * dev.mma_sync_fraction)
    w_latency = dev.l2_latency_cycles if body.direct_loads else 0.0
    ring = (copy_latency(dev, w.first_touch) + dev.shared_latency_cycles) / max(1, w.stages - 1)
    return max(body.issue_clocks, issue, tensor, w_latency, ring)


def copy_latency(dev: Device, first_touch: float) -> float:
    """The round trip of a main-loop copy: an L2 hit, but a copy of a byte no other CTA
    read before misses to DRAM, so with ``first_touch`` of the copied bytes first touches
    the copies wait the L2 latency plus that share of DRAM's extra latency. A short batch
    (M within one tile row) reads every weight byte once: its loop waits mostly on DRAM,
    not L2 (operands left in L2 by an earlier launch make it shorter: the range of
    ``dram_latency_cycles`` covers that)."""
    return dev.l2_latency_cycles + min(1.0, first_touch) * max(0.0, dev.dram_latency_cycles - dev.l2_latency_cycles)


def first_touch_share(tiles_m: int, tiles_n: int) -> float:
    """The share of a staged launch's copied bytes that are first touches: a chunk's A rows
    are copied by each of the ``tiles_n`` CTAs along its output row, B's share by each of
    the ``tiles_m`` along its column, taken as half A and half B (the ring's stage holds
    both; their split differs by tile and operand packing, within this first order)."""
    return (1 / max(1, tiles_n) + 1 / max(1, tiles_m)) / 2


def staged_phases(dev: Device, w: StagedWork) -> Phases:
    """The serial phases of a staged kernel's busiest SM (module docstring) and the
    whole-GPU bounds."""
    slots = dev.sms * max(1, w.resident)
    waves = math.ceil(w.ctas / slots)
    active = min(max(1, w.resident), math.ceil(w.ctas / dev.sms))  # CTAs sharing an SM at once
    counts = w.counts
    tail = counts.tail or counts.fast
    prologue = dev.dram_latency_cycles + dev.shared_latency_cycles  # the first copies come from DRAM
    chunks = w.fast_chunks * trip_cycles(dev, counts.fast, w, active) + w.tail_chunks * trip_cycles(dev, tail, w, active)
    outside = issue_cycles(counts.outside(w.splits), counts.outside_clocks_per_instruction(w.splits),
                           warps_per_scheduler(dev, active, w.warps_per_cta))
    epilogue = active * w.epilogue_wavefronts / dev.l1_wavefronts_per_clock
    drain = (1 + w.settle_round_trips) * dev.l2_latency_cycles  # the last stores or reds land before it retires
    serial = waves * dev.us(prologue + chunks + outside + epilogue + drain)
    reds = (w.ctas * w.output_bytes_per_cta / (dev.red_gbs * 1e3)) if w.splits > 1 else 0.0
    l1 = dev.us(math.ceil(w.ctas / dev.sms) * w.l1_wavefronts_per_cta / dev.l1_wavefronts_per_clock)
    return finish(dev, prologue, chunks, outside, epilogue, drain, serial, w.l2_bytes, w.dram_bytes, reds, waves,
                  l1=l1)


def finish(dev: Device, prologue: float, chunks: float, outside: float, epilogue: float, drain: float,
           serial: float, l2_bytes: float, dram_bytes: float, reds: float, waves: int,
           extra_device_us: float = 0.0, launches: int = 1, l1: float = 0.0) -> Phases:
    """The phases (cycles of one CTA) as us over ``waves``, the largest bound as the limiter."""
    bounds = {"serial": serial, "l1": l1, "l2": l2_bytes / (dev.l2_bandwidth_gbs * 1e3),
              "dram": dram_bytes / (dev.dram_bandwidth_gbs * dev.dram_efficiency * 1e3), "reds": reds}
    limiter = max(bounds, key=bounds.get)
    per_phase = [waves * dev.us(c) for c in (prologue, chunks, outside, epilogue, drain)]
    return Phases(*per_phase, serial=serial, l1=l1, l2=bounds["l2"], dram=bounds["dram"], reds=reds,
                  fixed=dev.kernel_fixed_us * launches,
                  device_us=dev.kernel_fixed_us * launches + bounds[limiter] + extra_device_us,
                  launch_us=dev.launch_us * launches, limiter=limiter)


# ---- the reference class: library-like dense GEMMs -----------------------------------


class DenseConfig(NamedTuple):
    """A CUTLASS/cuBLAS-like configuration: a tile_m x tile_n CTA tile of ``warps`` warps
    with a ``stages``-deep cp.async ring, ``resident`` CTAs an SM; ``split`` > 1: split-K
    into that many parts with a separate reduction kernel; ``stream_k``: the k-tiles of
    all output tiles dealt out evenly over one CTA per resident slot, partial tiles fixed
    up through a workspace in L2."""

    label: str
    tile_m: int
    tile_n: int
    warps: int
    stages: int
    resident: int
    split: int = 1
    stream_k: bool = False
    multicast: int = 1  # CTAs of a cluster along M that share one load of the B tile


# The int8 mma.sync tiles libraries ship (label, tile_m, tile_n, warps, stages of 64 B of k,
# resident CTAs an SM, multicast):
# - sgl-kernel's sm80/sm89 dispatch for short batches (csrc/gemm/int8_gemm_kernel.cu,
#   sm80_dispatch_shape: GemmShape<16, 64, 128> and <32, 64, 128>, warps <16, 64, 64> and
#   <32, 64, 64> (2 warps), 6 stages of 128 B of k = 12 of 64 B) for M <= 16 and M <= 32;
# - CUTLASS's generator, SM80 int8 16832 TN (python/cutlass_library/generator.py):
#   TileDescription([64, 64, 64], 10, [2, 2, 1]), ([128, 64, 64], 6), ([64, 128, 64], 6),
#   ([128, 128, 64], 5, [2, 2, 1]), ([128, 256, 64], 3, [2, 4, 1]), ([256, 128, 64], 3, [4, 2, 1]).
# Resident CTAs: the shared memory each needs (stages x (tile_m + tile_n) x 64 B: 61-80 KB,
# two in 164-228 KB; 72 KB and about 230 registers a thread for the 8-warp tiles: one).
TILES = (("16x64", 16, 64, 2, 12, 2, 1), ("32x64", 32, 64, 2, 12, 2, 1), ("64x64", 64, 64, 4, 10, 2, 1),
         ("128x64", 128, 64, 4, 6, 2, 1), ("64x128", 64, 128, 4, 6, 2, 1), ("128x128", 128, 128, 4, 5, 2, 1),
         ("128x256", 128, 256, 8, 3, 1, 1), ("256x128", 256, 128, 8, 3, 1, 1))
# Hopper's libraries add wide tiles whose B tile one TMA multicast serves to a 2-CTA
# cluster (CUTLASS 3.x sm90 kernels, ClusterShape 2x1x1; PTX ISA 9.7.9.25
# cp.async.bulk.tensor .multicast::cluster)
HOPPER_TILES = (("128x256 cluster 2x1", 128, 256, 8, 3, 1, 2),)
SPLITS = (2, 4, 8)


def dense_configs(arch: str = "sm_80") -> list[DenseConfig]:
    """Every configuration of the reference class on ``arch``: each tile alone, split-K
    by 2, 4 and 8, and stream-K."""
    out = []
    for label, tm, tn, warps, stages, resident, multicast in TILES + (HOPPER_TILES if arch == "sm_90" else ()):
        base = DenseConfig(label, tm, tn, warps, stages, resident, multicast=multicast)
        out.append(base)
        out += [base._replace(label=f"{label} split-K {s}", split=s) for s in SPLITS]
        out.append(base._replace(label=f"{label} stream-K", stream_k=True))
    return out


def library_outside_instructions(dev: Device, accumulators: float) -> float:
    """A library kernel's instructions outside its main loop, a warp, from its own
    structure (devices.json's estimates, with their ranges): the prologue's (tile
    iterators, predicates, the first stages' copies) and, per accumulator a lane holds,
    the epilogue's (through shared memory, the output operator, the stores)."""
    return dev.library_prologue_instructions + dev.library_epilogue_instructions * accumulators


def issue_cycles(instructions: float, clocks_per_instruction: float, sharing: float) -> float:
    """Clocks a warp's straight-line ``instructions`` take with ``sharing`` warps on its
    scheduler: ptxas's stall clocks between them (the warp alone), or one issue slot a
    clock for every sharing warp's instruction, whichever is longer; the other warps
    issue in a warp's stalls (as :func:`trip_cycles` has it for a loop trip)."""
    return instructions * max(clocks_per_instruction, sharing)


def element_bytes(dtype: str) -> int:
    return 1 if dtype == "int8" else 2


def output_bytes(dtype: str) -> int:
    return 4 if dtype == "int8" else 2  # int32 sums; bf16/fp16 out


def dense_phases(dev: Device, rows: int, cols: int, contraction: int, dtype: str, cfg: DenseConfig) -> Phases:
    """One configuration on an M x N x K GEMM: per CTA, the DRAM round trip of the first
    k-tile, k-tiles x the larger of the SM's tensor work and the ring's round trip over
    stages - 1 tiles, the instructions outside the loop (:func:`library_outside_instructions`,
    at :func:`issue_cycles`), the epilogue's output through shared memory (three
    passes) and the drain; split-K adds the reduction kernel (its own fixed cost and
    launch), stream-K one fix-up of a partial tile per CTA through L2."""
    eb, ob = element_bytes(dtype), output_bytes(dtype)
    tiles = math.ceil(rows / cfg.tile_m) * math.ceil(cols / cfg.tile_n)
    k_tiles = math.ceil(contraction * eb / K_TILE_BYTES)
    if cfg.stream_k:
        ctas = min(dev.sms * cfg.resident, tiles * k_tiles)
        per_cta = math.ceil(tiles * k_tiles / ctas)
    else:
        splits = min(cfg.split, k_tiles)
        ctas = tiles * splits
        per_cta = math.ceil(k_tiles / splits)
    waves = math.ceil(ctas / (dev.sms * cfg.resident))
    active = min(cfg.resident, math.ceil(ctas / dev.sms))
    ops_per_tile = 2 * cfg.tile_m * cfg.tile_n * K_TILE_BYTES / eb
    tensor = active * ops_per_tile / (dev.peak_ops_per_sm_clock(dtype) * dev.library_tensor_fraction)
    compulsory = (rows * contraction + contraction * cols) * eb + rows * cols * ob
    copied = ctas * (cfg.tile_m + cfg.tile_n / cfg.multicast) * per_cta * K_TILE_BYTES
    first = (compulsory - rows * cols * ob) / copied  # each operand byte once of what the CTAs copy
    ring = (copy_latency(dev, first) + dev.shared_latency_cycles) / max(1, cfg.stages - 1)
    prologue = dev.dram_latency_cycles + dev.shared_latency_cycles
    chunks = per_cta * max(tensor, ring)
    accumulators = cfg.tile_m * cfg.tile_n / (32 * cfg.warps)
    outside = issue_cycles(library_outside_instructions(dev, accumulators), dev.library_clocks_per_instruction,
                           warps_per_scheduler(dev, active, cfg.warps))
    partial = 4 if (cfg.split > 1 or cfg.stream_k) else ob  # partial sums stay 32-bit
    epilogue = active * 3 * cfg.tile_m * cfg.tile_n * partial / L1_BYTES_PER_WAVEFRONT / dev.l1_wavefronts_per_clock
    drain = dev.l2_latency_cycles
    fixup = (2 * dev.l2_latency_cycles) if cfg.stream_k else 0.0  # wait for and read a neighbour's partial
    serial = waves * dev.us(prologue + chunks + outside + epilogue + drain + fixup)
    l2_bytes = copied + rows * cols * ob
    extra, launches = 0.0, 1
    if cfg.split > 1 and not cfg.stream_k:  # the partials out, then a reduction kernel reads them
        workspace = splits * rows * cols * 4
        l2_bytes += workspace
        extra = dev.kernel_fixed_us + (workspace + rows * cols * ob) / (dev.l2_bandwidth_gbs * 1e3)
        launches = 2
    if cfg.stream_k:
        l2_bytes += 2 * ctas * cfg.tile_m * cfg.tile_n * 4
    phases = finish(dev, prologue, chunks, outside, epilogue, drain + fixup, serial, l2_bytes, compulsory, 0.0, waves,
                    extra_device_us=extra, launches=1)
    return phases._replace(launch_us=dev.launch_us * launches)


def best_dense(dev: Device, rows: int, cols: int, contraction: int, dtype: str = "int8",
               per_call: bool = True, data_parallel: bool = False) -> tuple[DenseConfig, Phases]:
    """The configuration a library's heuristic would pick with perfect knowledge: the
    lowest per-call time (device + launches) of :func:`dense_configs`, or the lowest
    device time with ``per_call=False``; ``data_parallel``: of those that run one CTA an
    output tile (a library without split-K or stream-K for the type)."""
    scored = [(cfg, dense_phases(dev, rows, cols, contraction, dtype, cfg)) for cfg in dense_configs(dev.arch)
              if not data_parallel or (cfg.split == 1 and not cfg.stream_k)]
    return min(scored, key=lambda cp: cp[1].per_call_us if per_call else cp[1].device_us)


def torch_linear_gemms(dev: Device, rows: int, in_features: int, out_features: int) -> list[Phases]:
    """bf16 ``nn.Linear``'s three GEMMs of a layer step: forward (R x K -> N), the input
    gradient (R x N -> K) and the weight gradient (N x R -> K), each the best dense
    configuration per call (what a library's heuristic picks), each its own launch(es)."""
    gemms = ((rows, out_features, in_features), (rows, in_features, out_features), (out_features, in_features, rows))
    return [best_dense(dev, m, n, k, "bf16")[1] for m, n, k in gemms]


BF16_BYTES = 2


def torch_linear_launches(dev: Device, rows: int, in_features: int, out_features: int,
                          bias: bool = True) -> list[Phases]:
    """bf16 ``nn.Linear``'s layer step, launch by launch: its three GEMMs
    (:func:`torch_linear_gemms`) and, with a bias, the bias gradient: autograd's
    AddmmBackward0 sums the output gradient over its rows to the bias's shape, an
    ``aten::sum`` of its own (torch.profiler on bf16 ``nn.Linear(243, 729)``, forward and
    backward on a CPU, lists aten::addmm, aten::mm twice and aten::sum once, besides
    views), a memory-bound pass that reads dY (R x N) and writes N (:func:`stream_phases`).
    The CPU's addmm also copies the bias into its output first; that copy is not counted
    (on a GPU a bias epilogue can fold it), which keeps the reference on torch's side."""
    launches = torch_linear_gemms(dev, rows, in_features, out_features)
    if bias:
        launches.append(stream_phases(dev, (rows + 1) * out_features * BF16_BYTES))
    return launches


def torch_linear_step(dev: Device, rows: int, in_features: int, out_features: int, bias: bool = True) -> float:
    """Per-call us of bf16 ``nn.Linear``'s layer step launched eagerly: every launch's
    device time and host cost (:func:`torch_linear_launches`)."""
    return eager_us(torch_linear_launches(dev, rows, in_features, out_features, bias))


def eager_us(launches: list[Phases]) -> float:
    """A step of launches issued one by one from the host: each pays its device time and
    its host launch cost (the per-call figure of every row, summed)."""
    return sum(p.per_call_us for p in launches)


def graph_us(dev: Device, launches: list[Phases]) -> float:
    """The same step replayed from a captured CUDA graph: the host launches once, every
    kernel still pays its device time and fixed cost (CUDA C++ Programming Guide, CUDA
    Graphs: a graph is launched as one operation)."""
    return sum(p.device_us for p in launches) + dev.launch_us


def stream_phases(dev: Device, nbytes: float, resident: str = "dram") -> Phases:
    """A memory-bound kernel (an elementwise pass, a quantizer, a reduction) that reads
    and writes ``nbytes`` once: the fixed device cost plus those bytes at DRAM's reachable
    rate (``resident="l2"``: at L2's, data kept there between launches); the host's launch
    kept apart, as for every kernel."""
    on_chip = resident == "l2"
    return finish(dev, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, nbytes if on_chip else 0.0, 0.0 if on_chip else nbytes, 0.0, 1)


def host_loop_us(phases: Phases) -> float:
    """A back-to-back loop of launches from the host runs at the slower of the device
    time and the host's launch cost (launches queue while the GPU runs)."""
    return max(phases.device_us, phases.launch_us)
