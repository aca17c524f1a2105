"""The GPU session's plan: each step of tools/on-device.sh with its expected time and its
cap, worked out from counts (kernels, cells, bench rows, CUDA test cases) and per-unit
costs, in one place.

    python3 tools/device_plan.py show      (the plan and each step's arithmetic)
    python3 tools/device_plan.py write     (tools/device-plan.txt and the plan's part of docs/gpu-run.md)
    python3 tools/device_plan.py check     (exit 1 when either is not what `write` would make)
    python3 tools/device_plan.py measure   (re-measure the host costs into tools/device_costs.json)

Two kinds of cost. The host's share of a launch program (each kernel's inputs, its PTX
emission and its reference, what tools/one_launch.py does around every launch) is
measured here on the CPU machine (``measure``, CPU seconds) and read from
tools/device_costs.json: the device machine's CPU does the same work. The device's share
(a driver JIT, a sanitizer's launch, an ncu replay, a bench row) has never been measured
(no GPU has run these kernels): those are the assumptions of :data:`DEVICE`, each named
where it is used. The verify step's figure is tools/gpu_verify.py's own time model.

A step's cap is its expected time, plus the tail the step keeps for its records, plus a
share of the session's slack: what :data:`SESSION_S` (8 minutes, the machine's start on
top) leaves after every step's expected time and tail, the checkpoints after each step
and packaging. The slack is shared in proportion to expected x (margin - 1), the margin
:data:`MARGIN`, or :data:`WIDE_MARGIN` for the steps whose device figures are least
known (racecheck, counters, torch-tests: the bench's shared baselines pay for it), so
the caps add up to the session and no more.
tools/on-device.sh reads the plan from tools/device-plan.txt (written here, so the GPU
machine needs no import to know it), and docs/gpu-run.md's figures are written from the
same :func:`plan`.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

from hslm_ptx.pipeline.core.cli import OneLineParser, run_cli  # noqa: E402
from hslm_ptx.pipeline.core.errors import UserError  # noqa: E402

COSTS_FILE = ROOT / "tools" / "device_costs.json"
PLAN_FILE = ROOT / "tools" / "device-plan.txt"
DOC = ROOT / "docs" / "gpu-run.md"
DOC_BEGIN, DOC_END = "<!-- plan: written by python3 tools/device_plan.py write -->", "<!-- plan: end -->"

SESSION_S = 480  # the steps' caps, their checkpoints and packaging: 8 minutes
PACKAGE_S = 15  # the last packaging (tools/on-device.sh's PACKAGE_S)
MARGIN = 1.4  # cap / expected for a step whose device figures are of a kind already seen
WIDE_MARGIN = 3.0  # racecheck, counters, torch-tests: the least known (the bench's saved rows pay for it)
# the shapes of the launch programs (tools/on-device.sh's defaults)
WARM_SHAPE, SANITIZE_SHAPE, COUNTERS_SHAPE = "tiny", "300x330x270", "ffn_up_r1782"
COUNTER_KERNELS = ("hslm_fwd_s8,hslm_fwd_s8_m32,hslm_fwd_s8_m32n16,hslm_dx_s8,hslm_dw_s8,hslm_dw_s8_m16n16,"
                   "hslm_dw_s8_m256,hslm_fwd_bf16,hslm_fwd_splitk_bf16,hslm_dx_bf16,hslm_dx_splitk_bf16,"
                   "hslm_dw_bf16,hslm_dw_splitk_bf16,hslm_wsum_bf16,hslm_fwdw_bf16_bf16,hslm_bwd_bf16_bf16"
                   ).split(",")  # the step at the HSLM shapes: wsum, the fused forward hslm_fwdw, hslm_bwd
COUNTER_BATCH = 8  # kernels per ncu run (on-device.sh's default): two runs, a run cut off loses its 8
TORCH_TESTS = ("tests/test_layer_step.py", "tests/test_torch_linear.py", "tests/test_torch_compile.py")
CARRIED = ("doit", "pydantic", "pydantic_core", "annotated_types", "typing_inspection")  # what the image lacks
WHEELS = 15  # prepare-wheels.sh's download: the five above, pyyaml, pytest, hypothesis and their dependencies

# The device's share, in seconds: assumptions (no GPU has run these kernels), the figures
# of the first desk-check of this session
DEVICE = {
    "import_probe": 0.3,  # python3 -c 'import NAME' per carried wheel, before it goes on the path
    "wheel_install": 0.3,  # pip install --no-index of one wheel
    "python_start": 3.0,  # a launch program's imports and CUDA context
    "first_jit": 0.3,  # the driver's JIT of one PTX module, cold; later loads hit its cache
    "cached_load": 0.01,  # a module load from the driver's cache
    "cupy_compiles": 20,  # CuPy's NVRTC compiles on the launch path, cold (cached on disk after)
    "cupy_compile": 0.5,
    "queries": 10.0,  # nvidia-smi and the version queries (cupy and torch imports ~3 s each)
    "tool_start": 2.0,  # compute-sanitizer or ncu attaching
    "memcheck_launch": 0.1, "racecheck_launch": 0.25, "synccheck_launch": 0.1, "initcheck_launch": 0.05,
    "ncu_run": 3.0,  # one ncu run's start
    "ncu_replay": 1.0,  # one kernel's replay passes for the metrics asked
    "emulator_launch": 1.3,  # the CPU emulator counting one launch on COUNTERS_SHAPE (measured here, one process)
    "calibration_jobs": 8,
    "bench_row": 0.3,  # 100 samples of >= 200 us, warm-up, graph replay, the exactness check
    "bench_start": 10.0,  # the 8192^3 cuBLAS ceiling and the PTX emission
    "layer": 25.0,  # 14 layer rows: torch's CUDA start and 6 module loads ~6 s, R=8192 rows ~1 s each
    "torch_start": 8.0,  # torch import and pytest's collection
    "torch_compile": 20.0,  # test_torch_compile's cold torch.compile(mode="reduce-overhead")
    "torch_case": 1.0,  # any other CUDA test case
    "checkpoint": 3,  # summary.md and rest.tgz after a step (on-device.sh's CHECKPOINT_S): 0.75 CPU s measured here
}
TAILS = {"verify": 8, "bench": 20, "layer": 12, "counters": 12}  # of a cap: kept for the step's records


class Step(NamedTuple):
    name: str
    expected_s: float
    cap_s: int
    why: str  # the arithmetic, in words


class Plan(NamedTuple):
    steps: list[Step]
    bench_rows: int
    torch_cases: int
    checkpoints_s: float

    @property
    def caps_s(self) -> int:
        return sum(s.cap_s for s in self.steps)

    @property
    def total_s(self) -> float:
        """The session's bound: every cap, every checkpoint, the last packaging."""
        return self.caps_s + self.checkpoints_s + PACKAGE_S

    @property
    def expected_s(self) -> float:
        return sum(s.expected_s for s in self.steps) + self.checkpoints_s + PACKAGE_S / 3


def read_costs(path: Path = COSTS_FILE) -> dict[str, float]:
    """The measured host seconds by program (``measure`` writes them)."""
    try:
        data = json.loads(path.read_text())
        costs = data["host_s"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: host_s: cannot be read ({type(exc).__name__}); "
                        "run python3 tools/device_plan.py measure") from None
    for key, value in costs.items():
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise UserError(f"{path}: host_s.{key}: {value!r} is not a finite number of seconds >= 0; "
                            "run python3 tools/device_plan.py measure")
    return costs


def _program(kernels: list[str], shape: str) -> str:
    return f"{shape}/{'all' if len(kernels) > len(COUNTER_KERNELS) else 'counters'}"


def measure(kernels: list[str], shape_text: str) -> float:
    """CPU seconds of tools/one_launch.py's host work for ``kernels`` on a shape, in a
    process of its own: its imports, then each kernel's inputs, PTX and reference."""
    import numpy as np

    from hslm_ptx.catalog.registry import KERNELS
    from hslm_ptx.kernel.spec import Dims
    from hslm_ptx.pipeline.stages.verify import seed

    sys.path.insert(0, str(ROOT / "tools"))
    from one_launch import find_shape

    shape = find_shape(shape_text)
    dims = Dims(shape.R, shape.K, shape.N)
    for name in kernels:
        spec = KERNELS[name]
        inputs = spec.make_inputs(dims, np.random.default_rng(seed(name, shape)))
        spec.emit()
        spec.expected(dims, inputs)
    return time.process_time()  # since the process started: the imports are the device's too


def cuda_test_cases(files: tuple[str, ...] = TORCH_TESTS) -> int:
    """The CUDA test cases of ``files`` (parametrized cases each), as pytest collects them."""
    sys.path.insert(0, str(ROOT / "tools"))
    from cuda_tests import cuda_tests

    ids = [node for f in files for node in cuda_tests(ROOT / f)]
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-o", "addopts=", "-p", "no:randomly",
                          "-p", "no:cacheprovider", *ids], cwd=ROOT, capture_output=True, text=True)
    found = re.search(r"(\d+) tests? collected", res.stdout)
    if not found:
        raise UserError(f"{' '.join(files)}: pytest collected no CUDA test ({res.stdout.strip()[-200:]})")
    return int(found.group(1))


def plan(costs: dict[str, float], bench_rows: int, verify_s: float, kernels: int, torch_cases: int,
         sanitized: int | None = None) -> Plan:
    """Every step of the default session, from the counts and the costs."""
    d = DEVICE
    wanted: list[tuple[str, float, str, float]] = []  # name, expected, arithmetic, margin

    def add(name: str, expected: float, why: str, margin: float = MARGIN) -> None:
        wanted.append((name, expected, why, margin))

    add("wheels", WHEELS * d["import_probe"] + len(CARRIED) * d["wheel_install"],
        f"{WHEELS} import probes x {d['import_probe']} s + {len(CARRIED)} wheels the image lacks x {d['wheel_install']} s")
    warm_host = costs[f"{WARM_SHAPE}/all"]
    add("warm-up", d["python_start"] + kernels * d["first_jit"] + d["cupy_compiles"] * d["cupy_compile"] + warm_host,
        f"start {d['python_start']} s + {kernels} first JITs x {d['first_jit']} s + {d['cupy_compiles']} CuPy "
        f"compiles x {d['cupy_compile']} s + host {warm_host:.1f} s (measured)")
    probe = d["tool_start"] + d["python_start"] + 1 * d["cached_load"]
    add("facts", d["queries"] + 2 * probe, f"queries {d['queries']} s + 2 probes x {probe:.1f} s (warm caches)")
    add("verify", verify_s, "tools/gpu_verify.py's time model on 8 processes")
    add("bench", d["bench_start"] + bench_rows * d["bench_row"],
        f"start {d['bench_start']} s + {bench_rows} rows x {d['bench_row']} s")
    add("layer", d["layer"], "14 rows, eager and graph-replayed")
    add("torch-tests", d["torch_start"] + d["torch_compile"] + (torch_cases - 1) * d["torch_case"],
        f"start {d['torch_start']} s + one cold torch.compile {d['torch_compile']} s + {torch_cases - 1} cases "
        f"x {d['torch_case']} s", margin=WIDE_MARGIN)
    sanitize_host = costs[f"{SANITIZE_SHAPE}/all"]  # every kernel's host work: at most what is launched
    launched = kernels if sanitized is None else sanitized  # one launch each of tools/one_launch.py's representatives
    for tool in ("memcheck", "racecheck", "synccheck", "initcheck"):
        per = d[f"{tool}_launch"] + d["cached_load"]
        add(f"sanitize-{tool}", d["tool_start"] + d["python_start"] + launched * per + sanitize_host,
            f"start {d['tool_start'] + d['python_start']} s + {launched} launches x {per:.2f} s + host "
            f"{sanitize_host:.1f} s (measured: inputs, PTX, references)",
            margin=WIDE_MARGIN if tool == "racecheck" else MARGIN)
    batches = -(-len(COUNTER_KERNELS) // COUNTER_BATCH)
    counters_host = costs[f"{COUNTERS_SHAPE}/counters"]
    emulator = len(COUNTER_KERNELS) * d["emulator_launch"] / d["calibration_jobs"]
    add("counters", batches * (d["ncu_run"] + d["python_start"]) + len(COUNTER_KERNELS) * d["ncu_replay"]
        + counters_host,
        f"{batches} ncu runs x {d['ncu_run'] + d['python_start']} s + {len(COUNTER_KERNELS)} replays x "
        f"{d['ncu_replay']} s + host {counters_host:.1f} s (measured); the emulator's {emulator:.1f} s alongside",
        margin=WIDE_MARGIN)
    checkpoints = len(wanted) * d["checkpoint"]
    slack = SESSION_S - PACKAGE_S - checkpoints - sum(e + TAILS.get(n, 0) for n, e, _, _ in wanted)
    if slack < 0:
        raise UserError(f"the steps' expected times leave no room in {SESSION_S} s (short by {-slack:.0f} s); "
                        "drop a step or cut what one does")
    weights = {n: e * (m - 1) for n, e, _, m in wanted}
    steps = []
    for name, expected, why, margin in wanted:
        share = slack * weights[name] / sum(weights.values())
        tail = f" + {TAILS[name]} s tail" if name in TAILS else ""
        steps.append(Step(name, round(expected, 1), math.floor(expected + TAILS.get(name, 0) + share),
                          f"{why} = {expected:.1f} s{tail}; slack +{share:.0f} s"))
    return Plan(steps, bench_rows, torch_cases, checkpoints)


def default_plan(costs: dict[str, float] | None = None, torch_cases: int | None = None) -> Plan:
    """The plan of tools/on-device.sh's defaults."""
    from hslm_ptx.catalog.registry import KERNELS
    from hslm_ptx.pipeline.bench.run import row_count
    from hslm_ptx.pipeline.core.config import VERIFY_SETS
    from hslm_ptx.pipeline.core.shapes import select_sets

    sys.path.insert(0, str(ROOT / "tools"))
    import gpu_verify

    cells = gpu_verify.cells_of(select_sets(tuple(VERIFY_SETS)), list(KERNELS.values()))
    from one_launch import representatives

    return plan(costs or read_costs(), row_count(), gpu_verify.estimate_s(cells, 8), len(KERNELS),
                torch_cases if torch_cases is not None else cuda_test_cases(), len(representatives()))


def plan_text(p: Plan) -> str:
    """tools/device-plan.txt: ``name:cap_s:expected_s`` a line (what on-device.sh's PLAN
    takes), each step's arithmetic after a '#'."""
    lines = ["# written by python3 tools/device_plan.py write: name:cap_s:expected_s  # the arithmetic"]
    lines += [f"{s.name}:{s.cap_s}:{math.ceil(s.expected_s)}  # {s.why}" for s in p.steps]
    lines.append(f"# total: caps {p.caps_s} s + checkpoints {p.checkpoints_s:g} s + packaging {PACKAGE_S} s = "
                 f"{p.total_s:g} s of {SESSION_S} s; expected ~{p.expected_s:.0f} s")
    return "\n".join(lines) + "\n"


def doc_text(p: Plan) -> str:
    """The plan's part of docs/gpu-run.md."""
    lines = [DOC_BEGIN, "",
             f"The default session: {p.bench_rows} bench rows, {p.torch_cases} CUDA test cases; expected "
             f"~{p.expected_s:.0f} s ({p.expected_s / 60:.1f} min), bounded by {p.total_s:g} s "
             f"({p.total_s / 60:.1f} min: caps {p.caps_s} s, a {DEVICE['checkpoint']:g} s checkpoint after each "
             f"step, {PACKAGE_S} s packaging), the machine's start on top.", "",
             "| step | cap s | expected s | arithmetic |", "| --- | ---: | ---: | --- |"]
    lines += [f"| {s.name} | {s.cap_s} | {math.ceil(s.expected_s)} | {s.why} |" for s in p.steps]
    lines += ["", DOC_END]
    return "\n".join(lines)


def with_doc(text: str, p: Plan) -> str:
    if DOC_BEGIN not in text or DOC_END not in text:
        raise UserError(f"{DOC}: the plan's markers ({DOC_BEGIN} ... {DOC_END}) are missing; put them back")
    head, rest = text.split(DOC_BEGIN, 1)
    return head + doc_text(p) + rest.split(DOC_END, 1)[1]


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main(argv: list[str]) -> int:
    p = OneLineParser(prog="python3 tools/device_plan.py", description="The GPU session's plan.")
    p.add_argument("command", choices=("show", "write", "check", "measure", "host"))
    p.add_argument("program", nargs="*", help=argparse.SUPPRESS)  # host: KERNELS SHAPE
    opts = p.parse_args(argv)
    if opts.command == "host":  # one program's host seconds, in a fresh process as on the device
        from hslm_ptx.catalog.registry import KERNELS  # noqa: F401 (imported inside measure's clock, too)

        kernels, shape = opts.program
        print(measure(list(KERNELS) if kernels == "all" else kernels.split(","), shape))  # noqa: T201
        return 0
    if opts.command == "measure":
        def fresh(kernels: str, shape: str) -> float:
            out = subprocess.run([sys.executable, __file__, "host", kernels, shape], capture_output=True,
                                 text=True, check=True).stdout
            return float(out.split()[-1])

        host = {f"{WARM_SHAPE}/all": fresh("all", WARM_SHAPE), f"{SANITIZE_SHAPE}/all": fresh("all", SANITIZE_SHAPE),
                f"{COUNTERS_SHAPE}/counters": fresh(",".join(COUNTER_KERNELS), COUNTERS_SHAPE)}
        _write(COSTS_FILE, json.dumps({"measured": "CPU seconds (time.process_time) on the CPU machine",
                                       "host_s": {k: round(v, 2) for k, v in host.items()}}, indent=2) + "\n")
        print(json.dumps(host))
        return 0
    made = default_plan()
    if opts.command == "show":
        print(plan_text(made), end="")
        return 0
    doc = with_doc(DOC.read_text(), made)
    if opts.command == "write":
        _write(PLAN_FILE, plan_text(made))
        _write(DOC, doc)
        return 0
    stale = [str(f.relative_to(ROOT)) for f, want in ((PLAN_FILE, plan_text(made)), (DOC, doc))
             if not f.is_file() or f.read_text() != want]
    for name in stale:
        print(f"error: {name}: not the plan's figures; run python3 tools/device_plan.py write", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
