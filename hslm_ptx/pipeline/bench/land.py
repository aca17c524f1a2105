"""Land what one GPU session brought back (tools/on-device.sh's files) in bench/results/<gpu>/.

    python -m hslm_ptx.pipeline.bench.land FOLDER [RESULTS_DIR]      (default RESULTS_DIR: bench/results; --help)

FOLDER holds the files the device run wrote under $OUT: facts.txt and device.log
(required), bench-<set>.{json,md,csv,png}, ncu.csv, rest.tgz. They are copied to
RESULTS_DIR/<gpu>/ (<gpu>: the device name in lower case, e.g. nvidia-h200), the
verify reports and per-step logs are taken out of rest.tgz, and two files are written
there: results.json (:class:`LandedRun`: device, driver, clocks, tool versions, each
step's exit and time, the verify verdicts, the sanitizers' error counts, the counter
ratios) and README.md, the same for a reader.
"""
from __future__ import annotations

import re
import sys
import tarfile
from pathlib import Path

from hslm_ptx.pipeline.core.artifacts import read_model, write_model

from hslm_ptx.pipeline.core.files import rel, write_atomic
from hslm_ptx.pipeline.core.config import ROOT
from hslm_ptx.pipeline.core.errors import UserError
from hslm_ptx.pipeline.core.cli import OneLineParser, run_cli
from hslm_ptx.pipeline.bench.counters import derive, parse_ncu_csv, ratio_table
from hslm_ptx.pipeline.bench.record import BenchReport
from hslm_ptx.pipeline.core.models import Record, VerifyReport

RESULTS_DIR = ROOT / "bench" / "results"
COPIED = ("facts.txt", "device.log", "ncu.csv", "summary.md")
# what the run packs in rest.tgz under out/ (over the device tool's 8-file limit), landed beside them
PACKED = re.compile(r"out/(bench-[\w.-]+\.(csv|png)|calibration\.json|verify\.json)")
TOOLS = ("ptxas", "ncu", "compute_sanitizer", "python", "cupy", "torch", "doit", "pydantic")
SMI_CLOCKS = {"sm_mhz": "clocks.sm", "mem_mhz": "clocks.mem", "sm_max_mhz": "clocks.max.sm",
              "mem_max_mhz": "clocks.max.mem", "temp_c": "temperature.gpu", "power_w": "power.draw"}


class StepResult(Record):
    name: str
    exit: int | None  # None: skipped (out of time) or cut off before it ended
    seconds: int | None = None
    note: str = ""  # e.g. "skipped, out of time", "ERROR SUMMARY: 1 error"


class LandedRun(Record):
    """One device session, as landed: what ran where, and what each step found."""

    gpu: str
    driver: str
    compute_capability: str
    clocks: dict[str, str]  # nvidia-smi, read before the steps (idle clocks)
    tools: dict[str, str]  # ptxas, ncu, compute-sanitizer, python, cupy, torch, doit, pydantic
    date: str
    steps: list[StepResult]
    verify_cells: int
    verify_failed: list[str]  # "kernel set/shape: why" for each cell not exact
    counters: dict[str, dict[str, float]]  # kernel -> ratio name -> value (bench_counters.RATIOS)
    files: list[str]  # what is in the folder, besides results.json and README.md


def read_facts(path: Path) -> dict[str, str]:
    """facts.txt's "key: value" lines."""
    if not path.is_file():
        raise UserError(f"{rel(path)}: missing; it is what tools/on-device.sh writes first under $OUT")
    facts = {}
    for line in path.read_text(errors="replace").splitlines():
        key, sep, value = line.partition(": ")
        if sep:
            facts[key.strip()] = value.strip()
    return facts


def device_fields(facts: dict[str, str], path: Path) -> dict[str, str]:
    """nvidia-smi's fields by name, from the facts' nvidia_smi_fields and nvidia_smi lines."""
    names = facts.get("nvidia_smi_fields", "").split(",")
    values = [v.strip() for v in facts.get("nvidia_smi", "").split(",")]
    if len(names) < 2 or len(names) != len(values) or "name" not in names:
        raise UserError(f"{rel(path)}: field 'nvidia_smi': expected {len(names)} values for "
                        f"{','.join(names) or 'nvidia_smi_fields'}, got {facts.get('nvidia_smi')!r}; "
                        "nvidia-smi did not answer on the device")
    return dict(zip(names, values))


STEP_END = re.compile(r"^=== step (\S+): exit (\d+) after (\d+) s")
STEP_SKIP = re.compile(r"^=== step (\S+): skipped, (.*)$")
STEP_START = re.compile(r"^=== step (\S+) \(limit")
ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?")


def read_steps(log: str) -> list[StepResult]:
    """Each step's exit and time from device.log; a step that started and never ended
    (the run was cut off) has exit None."""
    steps: dict[str, StepResult] = {}
    current = None
    for line in log.splitlines():
        if m := STEP_START.match(line):
            current = m.group(1)
            steps[current] = StepResult(name=current, exit=None, note="did not finish")
        elif m := STEP_END.match(line):
            note = steps[m.group(1)].note if m.group(1) in steps else ""
            steps[m.group(1)] = StepResult(name=m.group(1), exit=int(m.group(2)),
                                           seconds=int(m.group(3)),
                                           note="" if note == "did not finish" else note)
            current = None
        elif m := STEP_SKIP.match(line):
            steps[m.group(1)] = StepResult(name=m.group(1), exit=None, note=f"skipped, {m.group(2)}")
        elif current and (m := ERROR_SUMMARY.search(line)):
            steps[current] = steps[current].model_copy(update={"note": f"ERROR SUMMARY: {m.group(1)} errors"})
    return list(steps.values())


def member_problem(member: tarfile.TarInfo) -> str | None:
    """Why a member of rest.tgz may not be unpacked (None: a plain file or folder with a
    relative path that stays inside the landing folder). Names are checked, never trusted:
    an absolute part, a '..', a doubled or empty part ('artifacts/verify//tmp/x' joins to
    /tmp/x), a link or a device is refused (Python's tarfile 'data' filter rules)."""
    name = member.name.removeprefix("./")
    if name in ("", ".") and member.isdir():
        return None  # the archive's own top folder ("tar -C out ." writes it)
    parts = name.split("/")
    if name.startswith("/") or "\\" in name:
        return "an absolute path"
    if any(part in ("", ".", "..") for part in parts[:-1]) or parts[-1] in (".", ".."):
        return "a path that leaves the landing folder ('..', '.', or an empty part)"
    if member.issym() or member.islnk():
        return f"a link (to {member.linkname!r})"
    if not (member.isfile() or member.isdir()):
        return "not a plain file or folder"
    return None


def unpack_rest(tgz: Path, dest: Path) -> None:
    """The verify reports (artifacts/verify/...) and per-step logs out of rest.tgz; a
    :class:`UserError` naming the member, before anything is written, when any member's
    path could leave ``dest`` (:func:`member_problem`)."""
    try:
        with tarfile.open(tgz) as tar:
            members = tar.getmembers()
            for member in members:
                if problem := member_problem(member):
                    raise UserError(f"{tgz}: member {member.name!r} is {problem}; refused, nothing unpacked: "
                                    "rest.tgz holds only relative paths of plain files (tools/on-device.sh)")
            root = Path(dest).resolve()
            for member in members:
                name = member.name.removeprefix("./")
                if not member.isfile():
                    continue
                if name.startswith("artifacts/verify/") and name.endswith(".json"):
                    target = dest / "verify" / name.removeprefix("artifacts/verify/")
                elif "/" not in name and name.endswith(".log"):
                    target = dest / "logs" / name
                elif PACKED.fullmatch(name):
                    target = dest / name.removeprefix("out/")
                else:
                    continue
                if not target.resolve().is_relative_to(root):  # a folder of dest that is a link
                    raise UserError(f"{tgz}: member {member.name!r} would land outside {dest}; refused")
                target.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(target, tar.extractfile(member).read())
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise UserError(f"{tgz}: not a readable tar.gz ({' '.join(str(exc).split())}); "
                        "copy rest.tgz again from the device run") from None


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown-gpu"


def land(folder: Path, results_dir: Path = RESULTS_DIR) -> Path:
    """Copy and summarise one session's files; returns the results folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: not a folder; give the folder the device run's files came back in")
    facts = read_facts(folder / "facts.txt")
    smi = device_fields(facts, folder / "facts.txt")
    dest = Path(results_dir) / slug(smi["name"])
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # RESULTS_DIR, or a folder above it, is a file
        raise UserError(f"{results_dir}: cannot hold the results folder {dest.name}/ ({exc.strerror}); "
                        "give a folder, or a path that does not exist yet") from None
    for path in sorted(folder.iterdir()):
        if path.name in COPIED or re.fullmatch(r"bench-[\w.-]+\.(json|md|csv|png)", path.name):
            write_atomic(dest / path.name, path.read_bytes())  # a copy cut short leaves no half file
    if (folder / "rest.tgz").is_file():
        unpack_rest(folder / "rest.tgz", dest)
    verify = sorted((dest / "verify").rglob("*.json")) if (dest / "verify").is_dir() else []
    reports = [read_model(p, VerifyReport) for p in verify]
    log = (folder / "device.log").read_text(errors="replace") if (folder / "device.log").is_file() else ""
    ncu = folder / "ncu.csv"
    counters = derive(parse_ncu_csv(ncu.read_text(errors="replace"))) if ncu.is_file() else {}
    run = LandedRun(
        gpu=smi["name"], driver=smi.get("driver_version", "?"),
        compute_capability=smi.get("compute_cap", "?"),
        clocks={key: smi[field] for key, field in SMI_CLOCKS.items() if field in smi},
        tools={t: facts.get(t, "not recorded") for t in TOOLS}, date=facts.get("date", "?"),
        steps=read_steps(log), verify_cells=len(reports),
        verify_failed=[f"{r.kernel} {r.shape_set}/{r.shape}: {r.error or f'{r.mismatches} mismatches'}"
                       for r in reports if not r.passed],
        counters=counters,
        files=sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()
                     and p.name not in ("results.json", "README.md")))
    write_model(dest / "results.json", run)
    write_atomic(dest / "README.md", readme(run, dest))
    return dest


def readme(run: LandedRun, dest: Path) -> str:
    """The landed run for a reader: where it ran, each step, and what the steps found."""
    lines = [f"# GPU results: {run.gpu}", "",
             f"- run {run.date}; driver {run.driver}; compute capability {run.compute_capability}",
             "- clocks before the steps (nvidia-smi, MHz / C / W): "
             + (", ".join(f"{k} {v}" for k, v in run.clocks.items()) or "not read"), ""]
    lines += ["| tool | version |", "| --- | --- |"] + [f"| {k} | {v} |" for k, v in run.tools.items()]
    lines += ["", "## steps (tools/on-device.sh)", "", "| step | exit | seconds | note |",
              "| --- | ---: | ---: | --- |"]
    lines += [f"| {s.name} | {'-' if s.exit is None else s.exit} | "
              f"{'-' if s.seconds is None else s.seconds} | {s.note} |" for s in run.steps]
    failed = run.verify_failed
    lines += ["", "## verify on the GPU", "",
              f"{run.verify_cells} cells, " + (f"{len(failed)} not exact:" if failed else "all exact.")]
    lines += [f"- {f}" for f in failed]
    for bench_md in sorted(dest.glob("bench-*.md")):
        report_json = bench_md.with_suffix(".json")
        if report_json.is_file():
            read_model(report_json, BenchReport)  # refuse a record that does not hold together
        text = bench_md.read_text()
        if "## summary" in text:
            lines += ["", f"## bench ({bench_md.name}; full tables there)", "",
                      text[text.index("## summary"):].split("\n", 2)[2].strip()]
    if run.counters:
        lines += ["", "## Nsight Compute counters, one launch each (ncu.csv)", "",
                  ratio_table(run.counters)]
    return "\n".join(lines).rstrip() + "\n"


def parser() -> OneLineParser:
    p = OneLineParser(prog="python -m hslm_ptx.pipeline.bench.land",
                      description="Land what one GPU session brought back (tools/on-device.sh's files) "
                                  "in RESULTS_DIR/<gpu>/: the files copied, results.json and README.md written.")
    p.add_argument("folder", type=Path, metavar="FOLDER",
                   help="the folder the device run's files came back in (facts.txt, device.log, bench-*, rest.tgz)")
    p.add_argument("results_dir", nargs="?", type=Path, default=RESULTS_DIR, metavar="RESULTS_DIR",
                   help=f"where <gpu>/ is created or updated (default: {rel(RESULTS_DIR)} in this checkout)")
    return p


def _main(args: list[str]) -> int:
    opts = parser().parse_args(args)
    dest = land(opts.folder, opts.results_dir)
    print(f"landed in {rel(dest)}: results.json, README.md")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
