"""One page on what a tools/on-device.sh run did: summary.md, among the files that come back.

    python3 tools/device_summary.py OUT WORK

OUT is the run's $OUT (device.log, facts.txt, bench-*.json, bench-layer.json), WORK its
scratch folder (each step's log, verify.json from tools/gpu_verify.py, the counters'
calibration.json from tools/counter_calibration.py). It writes OUT/summary.md
(atomically): each step's cap, expected and actual time and exit, the verify cells by
outcome and the kernels no exact cell covers, each sanitizer's error summary and how many
launches it watched, the CUDA tests' count, the layer rows and their ratios, the bench
record's rows, and the ncu counters beside the emulator's. A part whose evidence is
missing or unreadable says so in its own line; the page is written whatever is missing.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tools beside this file

from counter_calibration import Calibration, table  # noqa: E402
from gpu_verify import VerifySummary  # noqa: E402
from hslm_ptx.pipeline.core.artifacts import read_model
from hslm_ptx.pipeline.core.files import write_atomic  # noqa: E402
from hslm_ptx.pipeline.bench.land import read_steps  # noqa: E402
from hslm_ptx.pipeline.bench.record import BenchReport  # noqa: E402
from hslm_ptx.pipeline.core.errors import one_line  # noqa: E402
from hslm_ptx.pipeline.core.layer_records import LayerBenchReport  # noqa: E402

PLAN_LINE = re.compile(r"^=== plan: (\S+)\s+cap\s+(\d+) s, expected ~(\S+) s")
SANITIZERS = ("memcheck", "racecheck", "synccheck", "initcheck")


def plan_of(log: str) -> dict[str, tuple[str, str]]:
    return {m.group(1): (m.group(2), m.group(3)) for line in log.splitlines() if (m := PLAN_LINE.match(line))}


def steps_part(log: str) -> list[str]:
    plan = plan_of(log)
    lines = ["| step | cap s | expected s | exit | seconds | note |", "| --- | ---: | ---: | ---: | ---: | --- |"]
    ran = {s.name: s for s in read_steps(log)}
    for name in dict.fromkeys([*plan, *ran]):
        cap, expected = plan.get(name, ("-", "-"))
        s = ran.get(name)
        lines.append(f"| {name} | {cap} | {expected} | {'-' if s is None or s.exit is None else s.exit} | "
                     f"{'-' if s is None or s.seconds is None else s.seconds} | {s.note if s else 'not reached'} |")
    ended = re.search(r"^=== packaging after (\d+) s", log, flags=re.M)
    lines.append("")
    lines.append(f"steps ended after {ended.group(1)} s; the run's exit: {os.environ.get('ON_DEVICE_RC', '?')}"
                 if ended else "steps: no '=== packaging' line yet")
    return lines


def verify_part(work: Path) -> list[str]:
    path = work / "verify.json"
    if not path.is_file():
        log = (work / "verify.log").read_text(errors="replace") if (work / "verify.log").is_file() else ""
        exact, failed = len(re.findall(r": ok, \d+ rows exact", log)), len(re.findall(r"^FAILED ", log, flags=re.M))
        return [f"no verify.json (the step did not finish); its log shows {exact} exact and {failed} FAILED cells"]
    s = read_model(path, VerifySummary)
    lines = [f"{s.cells} cells ({s.kernels} kernels x sets {', '.join(s.sets)}) on {s.backend}: {s.exact} exact, "
             f"{len(s.failed)} failed, {s.not_run} not run; {s.seconds:g} s (estimate {s.estimate_s:g} s)"]
    if s.not_run_by_set:
        lines.append("not run, by set: " + ", ".join(f"{k} {v}" for k, v in s.not_run_by_set.items()))
    lines.append("kernels with no exact cell: " + (", ".join(s.kernels_not_covered) or "none"))
    lines += [f"- {f}" for f in s.failed[:20]] + ([f"- ... {len(s.failed) - 20} more"] if len(s.failed) > 20 else [])
    return lines


def sanitizer_part(work: Path) -> list[str]:
    lines = []
    for tool in SANITIZERS:
        path = work / f"sanitize-{tool}.log"
        if not path.is_file():
            lines.append(f"- {tool}: not run")
            continue
        text = path.read_text(errors="replace")
        summary = re.findall(r"ERROR SUMMARY: \d+ errors?", text)
        exact = len(re.findall(r" R=\d+ K=\d+ N=\d+: exact", text))
        other = len(re.findall(r" R=\d+ K=\d+ N=\d+: (?:MISMATCH|error)", text))
        lines.append(f"- {tool}: {summary[-1] if summary else 'no ERROR SUMMARY (cut off?)'}; "
                     f"{exact} launches exact, {other} not")
    return lines


def torch_part(work: Path) -> list[str]:
    path = work / "torch-tests.log"
    if not path.is_file():
        return ["not run"]
    found = re.findall(r"^(?:\d+ CUDA tests: |no test in ).*$", path.read_text(errors="replace"), flags=re.M)
    return [found[-1] if found else "no count line (cut off?)"]


def layer_part(out: Path) -> list[str]:
    path = out / "bench-layer.json"
    if not path.is_file():
        return ["no bench-layer.json"]
    r = read_model(path, LayerBenchReport)
    timed = [row for row in r.rows if row.eager and row.graph]
    lines = [f"{len(r.rows)} rows on {r.device} (torch {r.torch_version}), {len(timed)} timed", "",
             "| shape | TernaryLinear / nn.Linear eager | graph |", "| --- | ---: | ---: |"]
    lines += [f"| {q.shape} | {q.eager} | {q.graph} |" for q in r.ratios]
    lines += [f"- {row.shape} {row.implementation}: {row.error}" for row in r.rows if row.error][:20]
    return lines


def bench_part(out: Path) -> list[str]:
    records = sorted(p for p in out.glob("bench-*.json") if p.name != "bench-layer.json")
    if not records:
        return ["no bench record"]
    lines = []
    for path in records:
        r = read_model(path, BenchReport)
        lines.append(f"{path.name}: {len(r.rows)} rows, {sum(not row.not_run for row in r.rows)} run, "
                     f"{'complete' if r.complete else 'partial'}" + (f"; {r.stopped}" if r.stopped else ""))
    return lines


def counters_part(work: Path) -> list[str]:
    path = work / "calibration.json"
    if not path.is_file():
        return ["no calibration.json (counters not run, or cut off)"]
    return table(read_model(path, Calibration)).splitlines()


def part(title: str, body: Callable[[], list[str]]) -> list[str]:
    try:
        lines = body()
    except Exception as exc:  # a part's unreadable evidence is its own line; the page is still written
        lines = [f"could not be read: {one_line(exc, 300)}"]
    return ["", f"## {title}", "", *lines]


def summary(out: Path, work: Path) -> str:
    log = (out / "device.log").read_text(errors="replace") if (out / "device.log").is_file() else ""
    facts = (out / "facts.txt").read_text(errors="replace") if (out / "facts.txt").is_file() else ""
    device = next((line.split(": ", 1)[1] for line in facts.splitlines() if line.startswith("nvidia_smi: ")), "?")
    lines = ["# tools/on-device.sh: summary", "", f"device (nvidia-smi): {device}"]
    lines += part("steps", lambda: steps_part(log))
    lines += part("verify on the GPU (tools/gpu_verify.py)", lambda: verify_part(work))
    lines += part("compute-sanitizer, one launch of each kernel", lambda: sanitizer_part(work))
    lines += part("torch CUDA tests (tools/cuda_tests.py)", lambda: torch_part(work))
    lines += part("layer step rows (bench-layer.json)", lambda: layer_part(out))
    lines += part("kernel bench", lambda: bench_part(out))
    lines += part("Nsight Compute beside the emulator", lambda: counters_part(work))
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not Path(argv[0]).is_dir():
        print("error: usage: python3 tools/device_summary.py OUT WORK (OUT: the run's output folder)",
              file=sys.stderr)
        return 2
    out, work = Path(argv[0]), Path(argv[1])
    write_atomic(out / "summary.md", summary(out, work))
    print(f"wrote {out / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
