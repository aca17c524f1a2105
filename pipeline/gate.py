"""The gate CI runs: do what this machine can, then hold the result against the ledger,
the seals and the duplicate-body rule.

``python -m pipeline.gate`` (and ``doit gate``) runs emit, ptxas and emulator verify of
the CI sets (config.GATE_SETS) through doit, the kernels' tests under the assertcount
plugin, and the duplicate-body scan; it then prints one line per finding::

    KIND  cell-or-file: what  -> the command that fixes it

Exit 0 green, 1 red, 2 when the ledger, a seal, the allowed-duplicates list or the
run's own results cannot be read (no verdict is given on unread input).

The work is split so it can be tested without the slow part: :func:`summarize` turns
the artifacts into a :class:`RunSummary`; :func:`compare` is a pure function of
(run, ledger, seals, allowed duplicates) built from the small rules in :data:`RULES`.

Findings (all red but NOT RUN, which is informational):

- UNEXPECTED FAILURE: a cell ran worse than its ledger verdict (pass < pass_vacuous <
  blocked < fail).
- UNEXPECTED PASS: a cell ran better than its ledger verdict. Red too: the ledger is a
  ratchet, and an improvement that is not blessed would let the cap stay loose;
  ``doit bless`` records it and lowers the cap.
- UNLISTED: a cell that exists (kernel x arch, kernel x shape of the sealed and CI
  sets, kernel tests) has no ledger entry.
- STALE: a ledger entry whose cell no longer exists, or an allowed duplicate whose
  functions no longer share a body.
- OVER CAP: the ledger lists more not-passing entries than its ``max_not_pass``.
- BAD REASON: a not-passing entry without a blocker or with a reason outside
  pipeline.ledger.REASONS, or a passing entry with either.
- STALE SEAL: a seal whose source or PTX hash is not the kernel's now, or of a kernel
  that no longer exists. UNSEALED: a kernel without a seal.
- DUPLICATE BODY: see pipeline.dupbody.
- NOT RUN (informational): ledger cells this gate has no verdict for (the verify sets
  CI does not run, e.g. ``hslm``), one line per check and set, so a green gate never
  reads as more than it checked.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Literal, NamedTuple

from pipeline import config
from pipeline.artifacts import (
    ARTIFACTS, ROOT, ArtifactError, UserError, read_model, rel, write_atomic, write_model,
)
from pipeline.dupbody import (
    ALLOWED_FILE, allowed_group, find_duplicates, read_allowed, stale_allowances,
)
from pipeline.ledger import (
    LEDGER_FILE, RANK, REASONS, cell_name, cells, collect, read_ledger, read_present,
)
from pipeline.models import (
    AllowedDuplicates, EmitResult, KernelState, KernelTestRun, Ledger, RunSummary, Seal,
)
from pipeline.seal import SEALS_DIR, read_seals, seal_path, stale
from pipeline.shapes import select_sets

GATE_DIR = ARTIFACTS / "gate"
Kind = Literal["UNEXPECTED FAILURE", "UNEXPECTED PASS", "UNLISTED", "STALE", "OVER CAP",
               "BAD REASON", "STALE SEAL", "UNSEALED", "DUPLICATE BODY", "NOT RUN"]
INFORMATIONAL: frozenset[str] = frozenset({"NOT RUN"})


class Finding(NamedTuple):
    kind: Kind
    subject: str  # the cell or the file
    what: str
    fix: str  # the command (or edit) that clears it

    @property
    def red(self) -> bool:
        return self.kind not in INFORMATIONAL

    def __str__(self) -> str:
        return f"{'' if self.red else 'INFO '}{self.kind}  {self.subject}: {self.what}  -> {self.fix}"


class Inputs(NamedTuple):
    run: RunSummary
    ledger: Ledger
    seals: dict[str, Seal]
    allowed: AllowedDuplicates


Rule = Callable[[Inputs], Iterable[Finding]]
LEDGER = rel(LEDGER_FILE)


def rerun(check: str, target: str) -> str:
    """The command that re-runs one cell's check."""
    return {"ptxas": "doit ptxas", "tests": "pytest -m kernel",
            "verify": f"doit verify shape={target.split('/')[0]} backend=emulator"}[check]


def verdicts(i: Inputs) -> Iterable[Finding]:
    """A run verdict other than the ledger's: worse is a failure, better an unexpected pass."""
    expected = {e.key: e for e in i.ledger.entries}
    for result in i.run.results:
        entry = expected.get(result.key)
        if entry is None or RANK[result.verdict] == RANK[entry.verdict]:
            continue
        what = f"ledger {entry.verdict}, now {result.verdict}" + (f": {result.blocker}" if result.blocker else "")
        if RANK[result.verdict] > RANK[entry.verdict]:
            yield Finding("UNEXPECTED FAILURE", cell_name(result.key), what,
                          f"fix it ({rerun(result.check, result.target)})")
        else:
            yield Finding("UNEXPECTED PASS", cell_name(result.key), what, "doit bless (records it, lowers the cap)")


def unlisted(i: Inputs) -> Iterable[Finding]:
    """Every cell that exists has a ledger entry."""
    listed = {e.key for e in i.ledger.entries}
    for key in i.run.cells:
        if key not in listed:
            yield Finding("UNLISTED", cell_name(key), f"no entry in {LEDGER}",
                          "doit bless (doit bless accept_new=1 when it does not pass)")


def stale_entries(i: Inputs) -> Iterable[Finding]:
    """Every ledger entry is a cell that exists."""
    exists = set(i.run.cells)
    for entry in i.ledger.entries:
        if entry.key not in exists:
            yield Finding("STALE", cell_name(entry.key), f"in {LEDGER} but the cell no longer exists",
                          "doit bless (drops it)")


def over_cap(i: Inputs) -> Iterable[Finding]:
    if i.ledger.not_pass > i.ledger.max_not_pass:
        yield Finding("OVER CAP", LEDGER, f"{i.ledger.not_pass} entries not passing > max_not_pass "
                      f"{i.ledger.max_not_pass}", "make cells pass and doit bless (only accept_new=1 raises the cap)")


def bad_reasons(i: Inputs) -> Iterable[Finding]:
    """Non-pass entries carry a blocker and a reason from the fixed list; pass entries neither."""
    for e in i.ledger.entries:
        if e.verdict == "pass" and (e.reason or e.blocker):
            yield Finding("BAD REASON", cell_name(e.key), "a passing entry has a blocker/reason",
                          f"edit {LEDGER}: set both to null")
        elif e.verdict != "pass" and (e.reason not in REASONS or not e.blocker):
            yield Finding("BAD REASON", cell_name(e.key), f"{e.verdict} with reason {e.reason!r}, blocker {e.blocker!r}",
                          f"edit {LEDGER}: give it its first error line and a reason from {', '.join(REASONS)}")


def seals(i: Inputs) -> Iterable[Finding]:
    """Every kernel has a seal of its current source and PTX; no seal outlives its kernel."""
    for state in i.run.kernels:
        seal = i.seals.get(state.kernel)
        path = rel(seal_path(state.kernel))
        if seal is None:
            yield Finding("UNSEALED", path, f"kernel {state.kernel} has no seal", f"doit seal:{state.kernel}")
        elif changed := stale(seal, state):
            yield Finding("STALE SEAL", path, "; ".join(changed), f"doit seal:{state.kernel}")
    for kernel in sorted(set(i.seals) - {s.kernel for s in i.run.kernels}):
        yield Finding("STALE SEAL", rel(seal_path(kernel)), f"kernel {kernel} no longer exists",
                      f"git rm {rel(seal_path(kernel))}")


def duplicates(i: Inputs) -> Iterable[Finding]:
    """No function body in two files unless allowed; no allowance outlives its duplicate."""
    for group in i.run.duplicates:
        if not allowed_group(group, i.allowed):
            first, *rest = group.members
            yield Finding("DUPLICATE BODY", f"{first.name}:{first.line}",
                          "same body as " + ", ".join(f"{m.name}:{m.line}" for m in rest),
                          f"import one from the other (or list them with a reason in {rel(ALLOWED_FILE)})")
    for functions in stale_allowances(i.run.duplicates, i.allowed):
        yield Finding("STALE", rel(ALLOWED_FILE), f"{', '.join(functions)} no longer share a body",
                      f"remove the entry from {rel(ALLOWED_FILE)}")


def not_run(i: Inputs) -> Iterable[Finding]:
    """Which existing cells this run gave no verdict for, grouped by check and set."""
    judged = {r.key for r in i.run.results}
    groups: dict[tuple[str, str], int] = {}
    for key in i.run.cells:
        if key not in judged:
            _, check, target = key
            group = (check, target.split("/")[0])
            groups[group] = groups.get(group, 0) + 1
    for (check, target), count in sorted(groups.items()):
        yield Finding("NOT RUN", f"{check} {target}", f"{count} cells have no verdict from this run",
                      rerun(check, target))


RULES: tuple[Rule, ...] = (verdicts, unlisted, stale_entries, over_cap, bad_reasons, seals, duplicates,
                           not_run)


def compare(run: RunSummary, ledger: Ledger, sealed: dict[str, Seal], allowed: AllowedDuplicates,
            rules: tuple[Rule, ...] = RULES) -> list[Finding]:
    """Every finding of ``rules`` on these inputs (pure: reads nothing)."""
    inputs = Inputs(run, ledger, sealed, allowed)
    return [finding for rule in rules for finding in rule(inputs)]


# --- the run --------------------------------------------------------------------------

TESTS_JSON = ARTIFACTS / "tests" / "kernel_tests.json"


def run_kernel_tests(out: Path = TESTS_JSON, *args: str) -> KernelTestRun:
    """The kernel-marked tests in a fresh pytest process under pipeline.assertcount, with a
    pycache of their own (see that module) and a fixed hypothesis seed (a gate verdict must
    not depend on the examples drawn); :class:`ArtifactError` when pytest wrote no counts
    (it crashed or was misused)."""
    out = Path(out)
    out.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(ARTIFACTS / "tests" / "pycache")}
    cmd = [sys.executable, "-m", "pytest", "-m", "kernel", "-p", "pipeline.assertcount",
           "-o", "enable_assertion_pass_hook=true", f"--test-counts={out}", "-q",
           "-p", "no:cacheprovider", "--hypothesis-seed=0", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if not out.exists():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
        raise ArtifactError(f"pytest -m kernel wrote no {rel(out)} (exit {proc.returncode}): {tail[0]}")
    return read_model(out, KernelTestRun)


def kernel_sources() -> dict[str, str]:
    """Each registered kernel and its current source hash (imported here, so a kernel
    module that does not import is the gate's exit 2, not a traceback)."""
    from kernels.registry import KERNELS
    from pipeline.emit import source_sha256

    return {name: source_sha256(spec) for name, spec in KERNELS.items()}


def run_stages(sets: tuple[str, ...]) -> None:
    """emit, ptxas and emulator verify of ``sets`` through doit (its own dependency file, so a
    gate inside ``doit gate`` does not share the outer run's), then the kernels' tests.
    A task that fails is a verdict read from the artifacts later, not an error here."""
    stages = ["emit", "ptxas", "verify", f"shape={','.join(sets)}", "backend=emulator"]
    cmd = [sys.executable, "-m", "doit", "--db-file", str(GATE_DIR / "doit.db"), "--continue", *stages]
    GATE_DIR.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    write_atomic(GATE_DIR / "stages.log", proc.stdout + proc.stderr)
    if proc.returncode not in (0, 1, 2):  # 3: doit itself could not run (dodo.py, command line)
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
        raise ArtifactError(f"doit {' '.join(stages)} could not run (exit {proc.returncode}): {tail[0]}")
    print(f"gate: ran doit {' '.join(stages)} in {time.perf_counter() - start:.1f}s "
          f"(exit {proc.returncode}; log {rel(GATE_DIR / 'stages.log')})")
    start = time.perf_counter()
    tests = run_kernel_tests(TESTS_JSON)
    print(f"gate: ran the kernels' tests in {time.perf_counter() - start:.1f}s ("
          + ", ".join(f"{k} {c.passed}/{c.total} passed" for k, c in tests.kernels.items()) + ")")


def summarize(sets: tuple[str, ...]) -> RunSummary:
    """The run as the artifacts on disk tell it: results for ``sets``, the cells of all
    sealed and CI sets, the kernels' hashes and the duplicate bodies."""
    sources = kernel_sources()
    tests = read_present(TESTS_JSON, KernelTestRun)
    if tests is None:
        raise ArtifactError(f"{rel(TESTS_JSON)}: missing; the kernels' tests did not run")
    if tests.errors:
        raise ArtifactError(f"{rel(TESTS_JSON)}: the kernels' tests could not be collected: {tests.errors[0]}")
    universe = select_sets(tuple(dict.fromkeys((*config.VERIFY_SETS, *sets))))
    results = collect(sources, config.ARCHS, {s: universe[s] for s in sets}, tests)
    states = []
    for kernel, source in sources.items():
        emitted = read_present(config.emit_json(kernel), EmitResult)
        current = emitted is not None and emitted.source_sha256 == source
        states.append(KernelState(kernel=kernel, source_sha256=source,
                                  ptx_sha256=emitted.ptx_sha256 if current else "(not emitted)"))
    return RunSummary(cells=cells(sources, config.ARCHS, universe), results=results,
                      kernels=states, duplicates=find_duplicates())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.gate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-run", action="store_true",
                        help="judge the artifacts as they are (skip emit/ptxas/verify/tests)")
    parser.add_argument("--sets", default=",".join(config.GATE_SETS), help="verify sets to run and judge")
    args = parser.parse_args(argv)
    sets = tuple(s for s in args.sets.split(",") if s)
    try:
        ledger, sealed, allowed = read_ledger(LEDGER_FILE), read_seals(SEALS_DIR), read_allowed(ALLOWED_FILE)
        if not args.no_run:
            run_stages(sets)
        run = summarize(sets)
    except (ArtifactError, UserError, ImportError) as exc:
        print(f"gate: cannot read {exc}; no verdict", file=sys.stderr)
        return 2
    write_model(GATE_DIR / "run.json", run)
    findings = compare(run, ledger, sealed, allowed)
    for finding in findings:
        print(finding)
    red = sum(f.red for f in findings)
    print(f"gate: {'RED' if red else 'green'}: {len(run.results)} of {len(run.cells)} cells checked, "
          f"{red} red finding{'s' * (red != 1)}, {len(findings) - red} informational")
    return 1 if red else 0


if __name__ == "__main__":
    sys.exit(main())
