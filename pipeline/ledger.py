"""The ledger: the expected verdict of every cell kernel x check x target, and bless.

Cells are ``ptxas`` per arch, ``verify`` per "set/shape" and ``tests`` per kernel.
:func:`collect` turns the artifacts of the last run into one :class:`CellResult` per
cell; :func:`bless` turns those into the next ledger under the ratchet's rules:

- hand-written reasons are kept while a cell stays non-pass;
- a cell the ledger says passes may not come back as ``fail`` (fix it instead);
- the cap ``max_not_pass`` is never raised by bless alone: without ``accept_new`` the
  not-passing entries must fit the old cap, and the cap is tightened to their number;
  with ``accept_new`` it is raised by exactly the not-passing entries new to the ledger.

ledger.json holds one entry per line (see :func:`dump_ledger`) so a diff is one line
per cell that changed.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Iterable, get_args

from pipeline.artifacts import M, ROOT, ArtifactError, UserError, read_model, rel, write_atomic
from pipeline.config import budget, emit_json, ptxas_json, verify_json
from pipeline.models import (
    CellKey, CellResult, EmitResult, KernelTestRun, Ledger, LedgerEntry, PtxasArch, PtxasReport,
    Shape, Verdict, VerifyReport,
)

LEDGER_FILE = ROOT / "ledger" / "ledger.json"

# The fixed list of reasons a cell may be non-pass, and what each means.
REASONS: dict[str, str] = {
    "no-gpu": "needs a GPU and none ran it",
    "ptxas-version": "the ptxas at hand cannot assemble this PTX version",
    "unsupported-arch": "the kernel does not support this arch",
    "over-budget": "ptxas figures spill or are over the register/shared budget",
    "emulator-gap": "the CPU emulator lacks an instruction or form the kernel uses",
    "known-bug": "a known kernel bug, named in the blocker",
    "vacuous-test": "a test passes without a single passing assert",
    "no-tests": "no test is marked for this kernel",
    "not-run": "the cell has no result yet",
}

# What a run can tell by itself from a check's first error line:
# (check, pattern, verdict, reason). Anything else is a plain fail whose reason a
# person writes into the ledger.
BLOCKERS: tuple[tuple[str, re.Pattern[str], Verdict, str], ...] = (
    ("ptxas", re.compile(r"Unsupported \.version|PTX ISA version", re.I), "blocked", "ptxas-version"),
    ("ptxas", re.compile(r"not (defined|supported) (for|on) .*sm_|unsupported (gpu|arch)", re.I), "blocked", "unsupported-arch"),
    ("ptxas", re.compile(r"spills|> budget", re.I), "fail", "over-budget"),
    ("verify", re.compile(r"ptxemu: unsupported\b"), "blocked", "emulator-gap"),
)

Reassemble = Callable[[EmitResult, str], PtxasArch]

# worse verdicts rank higher; the gate compares ranks
RANK: dict[str, int] = {v: i for i, v in enumerate(get_args(Verdict))}


class BlessRefused(UserError):
    """bless would break a rule; nothing was written."""


def cell_name(key: CellKey) -> str:
    """'hslm_dx_s8 verify smoke/tiny'."""
    return " ".join(key)


def failed(key: CellKey, blocker: str) -> CellResult:
    """A not-passing cell, classified by :data:`BLOCKERS` (plain ``fail`` when none match)."""
    line = " ".join(blocker.split())
    for check, pattern, verdict, reason in BLOCKERS:
        if check == key[1] and pattern.search(line):
            return CellResult(kernel=key[0], check=key[1], target=key[2], verdict=verdict,
                              blocker=line, reason=reason)
    return CellResult(kernel=key[0], check=key[1], target=key[2], verdict="fail", blocker=line)


def passed(key: CellKey) -> CellResult:
    return CellResult(kernel=key[0], check=key[1], target=key[2], verdict="pass")


def cells(kernels: Iterable[str], archs: Iterable[str],
          sets: dict[str, tuple[Shape, ...]]) -> list[CellKey]:
    """Every cell of the matrix, sorted: ptxas per arch, verify per set/shape, tests."""
    targets = [("ptxas", a) for a in archs]
    targets += [("verify", f"{s}/{shape.name}") for s, shapes in sets.items() for shape in shapes]
    targets.append(("tests", "tests"))
    return sorted((k, check, target) for k in kernels for check, target in targets)


# --- reading a run's artifacts -------------------------------------------------------

def read_present(path: Path, model: type):
    """The model in ``path``, or None when there is no such file (a missing result is a
    verdict; a present but unreadable one is an :class:`ArtifactError`)."""
    return read_model(path, model) if Path(path).exists() else None


def assemble_one(emitted: EmitResult, arch: str) -> PtxasArch:
    """ptxas on the emitted PTX for one arch; raises with ptxas's first error line."""
    from pipeline.ptxas import assemble

    return assemble(emitted.kernel, emitted.entry, ROOT / emitted.ptx_path, (arch,),
                    budget(emitted.kernel)).archs[0]


def ptxas_results(kernel: str, archs: Iterable[str], emitted: EmitResult,
                  reassemble: Reassemble) -> list[CellResult]:
    """ptxas cells from artifacts/ptxas/<kernel>.json. When it is missing or was made
    from other PTX (the ptxas task stops at its first failing arch and writes nothing),
    ``reassemble`` runs ptxas on the current PTX per arch, so a blocker is the tool's
    real error line."""
    report = read_present(ptxas_json(kernel), PtxasReport)
    figures = {a.arch: a for a in report.archs} if report and report.ptx_sha256 == emitted.ptx_sha256 else {}
    results = []
    for arch in archs:
        key = (kernel, "ptxas", arch)
        try:
            found = figures.get(arch) or reassemble(emitted, arch)
        except Exception as exc:  # the tool's error line is the blocker
            results.append(failed(key, str(exc)))
            continue
        results.append(failed(key, "; ".join(found.problems)) if found.problems else passed(key))
    return results


def verify_results(kernel: str, sets: dict[str, tuple[Shape, ...]],
                   emitted: EmitResult) -> list[CellResult]:
    """verify cells from artifacts/verify/<kernel>/<set>/<shape>.json made from the current PTX."""
    from pipeline.verify import verdict  # the one-line wording of a verify result

    results = []
    for shape_set, shapes in sets.items():
        for shape in shapes:
            key = (kernel, "verify", f"{shape_set}/{shape.name}")
            path = verify_json(kernel, shape_set, shape.name)
            report = read_present(path, VerifyReport)
            if report is None or report.ptx_sha256 != emitted.ptx_sha256:
                results.append(failed(key, f"no verify report for the current PTX in {rel(path)}; "
                                           f"run doit verify shape={shape_set}"))
            elif report.passed and (report.R, report.K, report.N) == (shape.R, shape.K, shape.N):
                results.append(passed(key))
            else:
                results.append(failed(key, verdict(report)))
    return results


def tests_result(kernel: str, run: KernelTestRun | None) -> CellResult:
    """The tests cell: fail on a failed test, blocked with no test run, pass_vacuous when
    one passed without asserting."""
    key = (kernel, "tests", "tests")
    counts = run.kernels.get(kernel) if run else None
    if run is None:
        return failed(key, "no kernel test run; run doit kernel_tests")
    if counts is None or counts.total == 0:
        return CellResult(kernel=kernel, check="tests", target="tests", verdict="blocked",
                          blocker=f"no test marked @pytest.mark.kernel('{kernel}')", reason="no-tests")
    if counts.failed:
        return failed(key, run.failures.get(kernel, f"{counts.failed} tests failed"))
    if counts.passed == 0:
        return CellResult(kernel=kernel, check="tests", target="tests", verdict="blocked",
                          blocker=f"all {counts.total} tests skipped", reason="not-run")
    if counts.vacuous:
        vacuous = run.vacuous_tests.get(kernel, [])
        return CellResult(kernel=kernel, check="tests", target="tests", verdict="pass_vacuous",
                          blocker=f"{counts.vacuous} vacuous: {', '.join(vacuous)}", reason="vacuous-test")
    return passed(key)


def collect(kernels: dict[str, str], archs: Iterable[str], sets: dict[str, tuple[Shape, ...]],
            tests: KernelTestRun | None, reassemble: Reassemble = assemble_one) -> list[CellResult]:
    """Every cell's verdict from the artifacts on disk. ``kernels`` maps each kernel to
    its current source hash; a kernel whose emit result is missing or older than its
    source fails all its cells (its other artifacts say nothing about this source)."""
    archs = tuple(archs)
    results: list[CellResult] = []
    for kernel, source_sha256 in kernels.items():
        emitted = read_present(emit_json(kernel), EmitResult)
        if emitted is None or emitted.source_sha256 != source_sha256:
            blocker = f"no emit result for the current source in {rel(emit_json(kernel))}; run doit emit"
            results += [failed(key, blocker) for key in cells([kernel], archs, sets) if key[1] != "tests"]
        else:
            results += ptxas_results(kernel, archs, emitted, reassemble)
            results += verify_results(kernel, sets, emitted)
        results.append(tests_result(kernel, tests))
    return sorted(results, key=lambda r: r.key)


# --- the ledger file ---------------------------------------------------------------------

def make_ledger(entries: Iterable[LedgerEntry], max_not_pass: int) -> Ledger:
    """A ledger with sorted entries and their tally."""
    entries = sorted(entries, key=lambda e: e.key)
    counts = {v: sum(1 for e in entries if e.verdict == v) for v in get_args(Verdict)}
    return Ledger(max_not_pass=max_not_pass, counts=counts, entries=entries)


def dump_ledger(ledger: Ledger) -> str:
    """JSON with one compact entry per line, so a diff shows one line per changed cell."""
    lines = [json.dumps(e.model_dump(mode="json"), separators=(", ", ": ")) for e in ledger.entries]
    head = (f'{{\n  "max_not_pass": {ledger.max_not_pass},\n'
            f'  "counts": {json.dumps(ledger.counts)},\n  "entries": [\n')
    return head + ",\n".join(f"    {line}" for line in lines) + ("\n" if lines else "") + "  ]\n}\n"


def read_committed(path: Path, model: type[M]) -> M:
    """:func:`read_model` for a committed file (ledger, seal): one fixes or restores it, never
    deletes it, so the hint says so."""
    try:
        return read_model(path, model)
    except ArtifactError as exc:
        text = str(exc).removesuffix("; delete it and re-run").removesuffix("; run the stage that writes it")
        raise ArtifactError(f"{text}; fix it by hand or git checkout it") from None


def read_ledger(path: Path = LEDGER_FILE) -> Ledger:
    """The ledger; :class:`ArtifactError` (gate exit 2) when it is missing or unreadable."""
    return read_committed(path, Ledger)


def write_ledger(ledger: Ledger, path: Path = LEDGER_FILE) -> None:
    write_atomic(path, dump_ledger(ledger))


# --- bless -----------------------------------------------------------------------------

def listing(keys: list[CellKey], limit: int = 4) -> str:
    shown = ", ".join(cell_name(k) for k in keys[:limit])
    return shown + (f" (+{len(keys) - limit} more)" if len(keys) > limit else "")


def bless(old: Ledger | None, universe: list[CellKey], results: list[CellResult],
          accept_new: bool = False) -> tuple[Ledger, list[str]]:
    """The next ledger from a run, and the lines that account for it.

    ``universe`` is every cell that exists: old entries outside it are dropped (stale);
    cells of it without a result keep their old entry. Raises :class:`BlessRefused`
    (and the caller writes nothing) on a fail where the ledger said pass, or when the
    not-passing entries would not fit the cap this bless may set.
    """
    old_entries = {e.key: e for e in (old.entries if old else [])}
    old_cap = old.max_not_pass if old else 0
    exists = set(universe)
    new: dict[CellKey, LedgerEntry] = {k: e for k, e in old_entries.items() if k in exists}
    for result in results:
        if result.key not in exists:
            continue
        before = old_entries.get(result.key)
        reason = None
        if result.verdict != "pass":
            kept = before.reason if before is not None and before.verdict != "pass" else None
            reason = kept or result.reason
        new[result.key] = LedgerEntry(**result.model_dump(exclude={"reason"}), reason=reason)
    regressed = [k for k, e in new.items() if e.verdict == "fail"
                 and k in old_entries and old_entries[k].verdict in ("pass", "pass_vacuous")]
    if regressed:
        raise BlessRefused(f"bless refused: {listing(sorted(regressed))} failed where the ledger "
                           f"says pass; fix it (bless never records a new failure of a passing cell)")
    not_pass = sorted(k for k, e in new.items() if e.verdict != "pass")
    added = [k for k in not_pass if k not in old_entries]
    cap = old_cap + len(added) if accept_new else old_cap
    if len(not_pass) > cap:
        hint = ("; the rest are not new, fix them" if accept_new
                else f"; if the {len(added)} new ones are expected, run doit bless accept_new=1" if added
                else "; fix them")
        raise BlessRefused(f"bless refused: {len(not_pass)} entries not passing, over the cap {cap} "
                           f"(new: {listing(added) or 'none'}){hint}")
    ledger = make_ledger(new.values(), cap if accept_new else len(not_pass))
    notes = []
    if accept_new:
        notes.append(f"cap: old {old_cap} + {len(added)} new not-passing "
                     f"({listing(added, 20) or 'none'}) = new cap {cap}; {len(not_pass)} not passing now")
    else:
        notes.append(f"cap: {old_cap} -> {ledger.max_not_pass} ({len(not_pass)} not passing)")
    dropped = sorted(set(old_entries) - exists)
    if dropped:
        notes.append(f"dropped {len(dropped)} stale entries: {listing(dropped)}")
    unreasoned = [e.key for e in ledger.entries if e.verdict != "pass" and e.reason not in REASONS]
    if unreasoned:
        notes.append(f"give a reason ({', '.join(REASONS)}) in {rel(LEDGER_FILE)} to: {listing(unreasoned, 20)}")
    return ledger, notes


def bless_file(universe: list[CellKey], results: list[CellResult], accept_new: bool = False,
               path: Path = LEDGER_FILE) -> tuple[Ledger, list[str]]:
    """:func:`bless` the ledger at ``path`` and write it; a refusal raises before any write."""
    ledger, notes = bless(read_committed(path, Ledger) if path.exists() else None, universe, results, accept_new)
    write_ledger(ledger, path)
    return ledger, notes
