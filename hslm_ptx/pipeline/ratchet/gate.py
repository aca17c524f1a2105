"""The gate CI runs: judge the evidence the graph produced against the ledger, the seals
and the duplicate-body rule.

``doit gate`` first brings emit, ptxas, the SASS counts, verify (the sealed sets,
config.VERIFY_SETS) and the kernel tests up to date through the same graph and database as every other
command (a failing cell is evidence, not an error: hslm_ptx.pipeline.stages.build_steps); then
``python -m hslm_ptx.pipeline.ratchet.gate`` judges what is on disk and prints one line per finding::

    KIND  cell-or-file: what  -> the command that fixes it

Exit 0 green, 1 red, 2 when the ledger, a seal, the allowed-duplicates list, a committed
store or the run's own results cannot be read (no verdict is given on unread input): a
key given twice, a byte that is not UTF-8, a seal that is a link or a folder. So is a
``base=REF`` that cannot be read (not a commit, a reflog selector, no ledger there): a
comparison that did not happen is no pass.

:func:`hslm_ptx.pipeline.ratchet.results.summarize` turns the artifacts into a :class:`RunSummary`,
:func:`gather` runs the judges that count afresh, hslm_ptx.pipeline.ratchet.stores reads the
committed stores (now and at the base); :func:`compare` is a pure function of those
(:class:`Inputs`) built from the small rules in :data:`RULES`, the one list every
finding comes from.

Findings (all red but NOT RUN, FASTER, ACCEPTED SLOWER, ACCEPTED LOOSENING and NO GPU
EVIDENCE, which are informational):

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
  hslm_ptx.pipeline.ratchet.ledger.REASONS, or a passing entry with either.
- STALE SEAL: a seal whose source or PTX hash is not the kernel's now, or of a kernel
  that no longer exists. UNSEALED: a kernel without a seal.
- BAD SEAL: a seal whose own evidence does not pass: an arch missing, spilling or over
  budget, a sealed shape with mismatches or rows_checked != R, a verify cell the seal
  lacks, a failed or vacuous test, or no passing test.
- SEAL MISMATCH: a current seal whose figures are not what this run produced, one line per
  field (``SEAL MISMATCH <kernel>: <field> sealed X, now Y``): the PTX size and ptxas
  version, ptxas registers, spills, shared and stack bytes per arch, the sealed sets' shapes
  (name, R, K, N) against shapes.yaml, mismatches and rows checked of each verify report
  read, the verify backend, the test counts, the sha256 of each test file, the SASS figures
  (hslm_ptx.pipeline.ratchet.seal.mismatches). Only ``doit seal`` and ``doit bless`` clear it.
- LOOSENED: a ledger looser than bless writes it: ``max_not_pass`` above the entries not
  passing, a SASS level above the current seal's figure; with ``base=REF`` (``--base``),
  every loosening against the ledger committed at REF (hslm_ptx.pipeline.ratchet.ledger.loosenings) that
  does not carry what bless records for it. ACCEPTED LOOSENING (informational): one that
  does, shown on its own line so a review sees it.
- DUPLICATE BODY: see hslm_ptx.pipeline.ratchet.dupbody.
- SCHEMA DRIFT: a committed schemas/<Record>.json that is not the export of its model
  (hslm_ptx.pipeline.core.schemas).
- SLOWER: a kernel's SASS per IMMA or LSU per IMMA (fast or tail body, per arch) rose
  above the ledger's level (hslm_ptx.pipeline.ratchet.sass_ratchet). MISSING: a figure the ledger holds
  that was not counted now, or one counted now that the ledger does not hold.
- The layer step's counts (hslm_ptx.pipeline.ratchet.layer_ratchet, ledger/layer.json, counted afresh here): a
  rise is SLOWER, a fall FASTER, a level or count without the other MISSING, levels sealed on
  another step source STALE SEAL, counts with no levels UNSEALED.
- hslm_ptx/cost/loop_counts.json against the SASS records (hslm_ptx.pipeline.ratchet.gate_counts) and
  docs/model-tables.md against a fresh render of the MODEL (hslm_ptx.pipeline.stages.model_doc): a
  file that no longer says what the code does is STALE, with the command that rewrites it.
- The committed stores (hslm_ptx.pipeline.ratchet.stores): a store or test file not as ``doit bless``
  pinned it in ledger/stores.json is STALE SEAL (no pins: UNSEALED; a test file bless did
  not pin: UNLISTED); with ``base=REF``, every loosening of ledger/layer.json,
  hslm_ptx/cost/loop_counts.json, the calibration points, the shapes and the test files against
  REF is LOOSENED, or ACCEPTED LOOSENING where bless recorded it; a calibration point whose
  ``published`` figure is not one of its quoted source line is UNSOURCED.
- FASTER (informational): a figure fell below the ledger's level; ``doit seal && doit
  bless`` records it as the new level.
- ACCEPTED SLOWER (informational): a rise the ledger accepted with a reason from
  hslm_ptx.pipeline.ratchet.ledger.REASONS (``doit bless accept_slower=<reason>``), shown on every run
  until the figures are back at the level before it. A ``rose_from`` without such a
  reason, or a reason without ``rose_from``, is BAD REASON.
- NOT RUN (informational): ledger cells this gate has no verdict for (the verify sets
  CI does not run, e.g. ``hslm``), one line per check and set, so a green gate never
  reads as more than it checked. NO GPU EVIDENCE (informational): per arch of
  config.GPU_EVIDENCE_ARCHS, the current seals with no verify run on a GPU of that arch
  (a seal keeps its GPU evidence per arch: hslm_ptx.pipeline.ratchet.seal.build_seal); a
  seal's GPU evidence that does not pass is BAD SEAL like its own.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Callable, Iterable

from pydantic import ValidationError

from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.artifacts import field_error, parse_json, read_yaml, write_model
from hslm_ptx.pipeline.core.files import rel
from hslm_ptx.pipeline.core.config import ALLOWED_FILE, GATE_DIR, LEDGER_FILE, SEALS_DIR
from hslm_ptx.cost.model import COUNTS_FILE
from hslm_ptx.pipeline.ratchet.dupbody import allowed_group, read_allowed, stale_allowances
from hslm_ptx.pipeline.core.errors import ArtifactError, UserError
from hslm_ptx.pipeline.ratchet.findings import SHOWN_MISMATCHES, Finding, Inputs
from hslm_ptx.pipeline.ratchet.gate_new_kernel import fold_new_kernels
from hslm_ptx.pipeline.ratchet.gate_counts import counts_findings
from hslm_ptx.pipeline.stages.model_doc import doc_findings

PACKAGE_COUNTS = COUNTS_FILE  # the file the package ships; a test may point COUNTS_FILE at its own
from hslm_ptx.pipeline.ratchet.layer_ratchet import LAYER_LEDGER, gate_findings as layer_findings
from hslm_ptx.pipeline.ratchet.ledger import CELL_REASONS, RANK, REASONS, cell_name, loosenings, read_ledger
from hslm_ptx.pipeline.core.models import AllowedDuplicates, Ledger, RunSummary, Seal
from hslm_ptx.pipeline.ratchet.results import summarize
from hslm_ptx.pipeline.ratchet.sass_ratchet import EPSILON, changes, flat, judge_sass, ledger_levels
from hslm_ptx.pipeline.ratchet.seal import mismatches, read_seals, seal_path, stale
from hslm_ptx.pipeline.ratchet.stores import (LEDGER as LEDGER_PATH, Snapshot, at_commit, calibration_findings,
                                              pin_findings)
from hslm_ptx.pipeline.ratchet.stores import loosenings as store_loosenings, working_tree
from hslm_ptx.pipeline.stages.table import stage_rerun

Rule = Callable[[Inputs], Iterable[Finding]]
LEDGER = rel(LEDGER_FILE)


def rerun(check: str, target: str) -> str:
    """The command that re-runs one cell's check: the stage's own (hslm_ptx.pipeline.stages.table)."""
    if check == "tests":
        return "doit kernel_tests"
    return stage_rerun(check, target)


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
        elif e.verdict != "pass" and (e.reason not in CELL_REASONS or not e.blocker):
            yield Finding("BAD REASON", cell_name(e.key), f"{e.verdict} with reason {e.reason!r}, blocker {e.blocker!r}",
                          f"edit {LEDGER}: give it its first error line and a reason from {', '.join(CELL_REASONS)}")


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


def seal_problems(seal: Seal, verify_targets: Iterable[str]) -> list[str]:
    """What in a seal's own evidence does not pass (empty: it holds up)."""
    limit = config.budget(seal.kernel)
    problems = []
    archs = {a.arch: a for a in seal.ptxas}
    for arch in config.ARCHS:
        a = archs.get(arch)
        if a is None:
            problems.append(f"no ptxas figures for {arch}")
        elif a.spill_stores or a.spill_loads or a.problems:
            problems.append(f"{arch} spills {a.spill_stores}/{a.spill_loads} bytes" + (f" ({'; '.join(a.problems)})" if a.problems else ""))
        elif a.registers > limit.max_registers or a.shared_bytes > limit.max_shared_bytes:
            problems.append(f"{arch} over budget: {a.registers} registers, {a.shared_bytes} bytes shared")
    problems += [f"no SASS figures for {arch}" for arch in config.ARCHS if arch not in seal.sass]
    verify_targets = list(verify_targets)
    for where, evidence in (("verify", seal.verify), *((f"gpu {arch} verify", e) for arch, e in seal.gpu.items())):
        sealed = {f"{s.shape_set}/{s.shape}": s for s in evidence.shapes}
        for s in evidence.shapes:
            if s.mismatches or s.rows_checked != s.R:
                problems.append(f"{where} {s.shape_set}/{s.shape}: {s.mismatches} mismatches, "
                                f"{s.rows_checked} of {s.R} rows checked")
        problems += [f"{where} {t}: not in the seal" for t in verify_targets if t not in sealed]
    t = seal.tests
    if t.failed or t.vacuous or t.passed == 0:
        problems.append(f"tests {t.passed} passed, {t.failed} failed, {t.vacuous} vacuous")
    return problems


def sealed_evidence(i: Inputs) -> Iterable[Finding]:
    """Each seal's evidence passes by itself: what it pins is what was verified."""
    for kernel, seal in sorted(i.seals.items()):
        targets = [target for k, check, target in i.run.cells if k == kernel and check == "verify"]
        if problems := seal_problems(seal, targets):
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            yield Finding("BAD SEAL", rel(seal_path(kernel)), problems[0] + more,
                          f"fix it, then doit seal:{kernel}")


def sealed_against_run(i: Inputs) -> Iterable[Finding]:
    """Each current seal against what this run produced, field by field (hslm_ptx.pipeline.ratchet.seal.mismatches):
    a seal edited by hand, copied from another kernel, or of other shapes, tests or
    figures is red until doit seal and doit bless are run again."""
    current = {s.kernel: s for s in i.run.kernels}
    for kernel, seal in sorted(i.seals.items()):
        state, now = current.get(kernel), i.run.evidence.get(kernel)
        if state is None or now is None or stale(seal, state):
            continue  # STALE SEAL / UNSEALED say it already
        found = mismatches(seal, now)
        fix = f"doit seal:{kernel} && doit bless (a seal pins what was run; it is never edited)"
        for field, sealed, got in found[:SHOWN_MISMATCHES]:
            yield Finding("SEAL MISMATCH", kernel, f"{field} sealed {sealed}, now {got}", fix)
        if len(found) > SHOWN_MISMATCHES:
            yield Finding("SEAL MISMATCH", kernel, f"{len(found) - SHOWN_MISMATCHES} more fields differ", fix)


def loose_cap(i: Inputs) -> Iterable[Finding]:
    """bless sets max_not_pass to the number of entries not passing; a cap above it is a hand edit
    that would let the next bless record new failures."""
    if i.ledger.max_not_pass > i.ledger.not_pass:
        yield Finding("LOOSENED", LEDGER, f"max_not_pass {i.ledger.max_not_pass} with {i.ledger.not_pass} entries "
                      "not passing (bless writes their number)", "doit bless (sets the cap to the entries not passing)")


def loose_sass(i: Inputs) -> Iterable[Finding]:
    """A ledger SASS level above the figures of the kernel's current seal: bless records a fall as the
    new level, so only a hand edit leaves a level above what was sealed."""
    current = {s.kernel: s for s in i.run.kernels}
    for e in i.ledger.sass:
        seal, state = i.seals.get(e.kernel), current.get(e.kernel)
        if seal is None or state is None or stale(seal, state) or e.arch not in seal.sass:
            continue
        sealed = flat(seal.sass[e.arch])
        for name, level in flat(e.level).items():
            if name in sealed and level > sealed[name] + EPSILON:
                yield Finding("LOOSENED", f"sass {e.kernel} {e.arch}",
                              f"{name} {level:g} in the ledger, above the sealed {sealed[name]:g}",
                              "doit bless (records the sealed level)")


def against_base(i: Inputs) -> Iterable[Finding]:
    """Every loosening of the ledger against ``base=REF``, one line each (hslm_ptx.pipeline.ratchet.ledger.loosenings):
    informational when it carries what doit bless writes for it, red otherwise."""
    if i.base is None:
        return
    for loosening in loosenings(i.base, i.ledger):
        where = f"{loosening.subject} (against {i.base_ref})"
        if loosening.reason is None:
            yield Finding("LOOSENED", where, loosening.what, f"undo the edit; {loosening.fix}")
        else:
            yield Finding("ACCEPTED LOOSENING", where, f"{loosening.what}, reason {loosening.reason}",
                          "review it: the reason is what doit bless recorded")


def committed_stores(i: Inputs) -> Iterable[Finding]:
    """The stores and test files against bless's pins, and each calibration point's figure
    against its quoted source line (hslm_ptx.pipeline.ratchet.stores)."""
    if i.stores is not None:
        for finding in pin_findings(i.stores) + calibration_findings(i.stores):
            yield Finding(*finding)


def stores_against_base(i: Inputs) -> Iterable[Finding]:
    """Every loosening of the stores against ``base=REF``, item by item (hslm_ptx.pipeline.ratchet.stores):
    informational when bless recorded it, red otherwise."""
    if i.base_stores is None or i.stores is None:
        return
    for loosening in store_loosenings(i.base_stores, i.stores, REASONS):
        where = f"{loosening.subject} (against {i.base_ref})"
        if loosening.reason is None:
            yield Finding("LOOSENED", where, loosening.what, loosening.fix)
        else:
            yield Finding("ACCEPTED LOOSENING", where, f"{loosening.what}, {loosening.reason}",
                          "review it: doit bless recorded it")


def counted_afresh(i: Inputs) -> Iterable[Finding]:
    """The findings of the judges that count or render afresh (:func:`gather`): the layer
    step's counts against ledger/layer.json, hslm_ptx/cost/loop_counts.json against the SASS
    records, docs/model-tables.md against the model."""
    for finding in i.counted:
        yield Finding(*finding)


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


def schemas(i: Inputs) -> Iterable[Finding]:
    """The committed schemas/ are the models' export: a format change is exported with it."""
    for line in i.run.schema_drift:
        subject, what = line.split(": ", 1)
        yield Finding("SCHEMA DRIFT", subject, what, "python -m hslm_ptx.pipeline.core.schemas, then commit schemas/")


SASS_FIX = {
    "SLOWER": "find what the change added to the loop (doit sass:summary, artifacts/sass/), "
              "or doit bless accept_slower=<reason>",
    "FASTER": "doit seal && doit bless (records the new level)",
    "MISSING": "doit sass, then doit seal && doit bless",
}


def sass_levels(i: Inputs) -> Iterable[Finding]:
    """The SASS ratchet: the current figures against the ledger's levels, and the rises the
    ledger accepted with a reason."""
    for f in judge_sass(ledger_levels(i.ledger.sass), i.run.sass):
        yield Finding(f.kind, f"{f.kernel} {f.arch}", f.what, SASS_FIX[f.kind])
    for e in i.ledger.sass:
        if e.reason in REASONS and e.rose_from is not None:
            yield Finding("ACCEPTED SLOWER", f"{e.kernel} {e.arch}",
                          f"{', '.join(changes(e.rose_from, e.level))} accepted: {e.reason}",
                          "bring it back down, then doit seal && doit bless (clears the reason)")
        elif e.reason is not None or e.rose_from is not None:
            yield Finding("BAD REASON", f"sass {e.kernel} {e.arch}",
                          f"reason {e.reason!r}, rose_from {'set' if e.rose_from else 'missing'}",
                          f"edit {LEDGER}: both set (reason from {', '.join(REASONS)}) or both null")


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


def gpu_evidence(i: Inputs) -> Iterable[Finding]:
    """Which GPU kinds (config.GPU_EVIDENCE_ARCHS) the current seals have no verify
    evidence from, one line per arch: information, since no GPU runs in CI, so that a
    green gate never reads as GPU-verified."""
    current = {s.kernel: s for s in i.run.kernels}
    held = [seal for kernel, seal in i.seals.items() if kernel in current and not stale(seal, current[kernel])]
    for arch in config.GPU_EVIDENCE_ARCHS:
        lacking = sorted(seal.kernel for seal in held if arch not in seal.gpu)
        if lacking:
            named = ", ".join(lacking[:3]) + (f" and {len(lacking) - 3} more" if len(lacking) > 3 else "")
            yield Finding("NO GPU EVIDENCE", arch, f"{len(lacking)} of {len(held)} current seals have no verify "
                          f"run on an {arch} GPU ({named})",
                          f"on an {arch} machine: doit verify backend=gpu && doit seal, commit ledger/seals/")


# The gate's rules, in the order their findings print; a new ratchet adds its rule here.
RULES: tuple[Rule, ...] = (verdicts, unlisted, stale_entries, over_cap, loose_cap, bad_reasons, seals,
                           sealed_evidence, sealed_against_run, duplicates, schemas, sass_levels, loose_sass,
                           counted_afresh, committed_stores, against_base, stores_against_base, gpu_evidence,
                           not_run)


def compare(run: RunSummary, ledger: Ledger, sealed: dict[str, Seal], allowed: AllowedDuplicates,
            rules: tuple[Rule, ...] = RULES, base: Ledger | None = None, base_ref: str = "",
            **more) -> list[Finding]:
    """Every finding of ``rules`` on these inputs (pure: reads nothing); ``more``: the other
    fields of :class:`Inputs`."""
    inputs = Inputs(run, ledger, sealed, allowed, base, base_ref, **more)
    return fold_new_kernels([finding for rule in rules for finding in rule(inputs)], inputs)


GIT_REF = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./~^@{}+-]*")


def read_base(ref: str) -> tuple[Ledger, Snapshot]:
    """The ledger and the stores as committed at git ``ref``; :class:`ArtifactError` with the
    one line that says why not (not a ref, not a commit, no ledger there, unreadable):
    a base the gate cannot read gives no verdict."""
    if not GIT_REF.fullmatch(ref) or ".." in ref:
        raise ArtifactError(f"base={ref!r} is not a git ref (a commit, branch or tag, e.g. HEAD~1)")
    snapshot = at_commit(ref)
    source = Path(f"{ref}:{LEDGER}")
    try:
        return Ledger.model_validate(parse_json(source, snapshot.texts[LEDGER_PATH] or "")), snapshot
    except ArtifactError as exc:
        raise ArtifactError(f"base={ref}: {exc}") from None
    except ValidationError as exc:
        raise ArtifactError(f"base={ref}: {field_error(source, exc)}") from None


def gather(project: bool) -> tuple[tuple[str, str, str, str], ...]:
    """Run the judges that count or render afresh (they read the artifacts and the committed
    files themselves): the layer step's counts, the loop counts, the model's tables. A ledger
    folder other than the project's (a test's) need not hold layer levels; the loop counts
    ship in the package, so they are judged in the project and in a world that brought its
    own (``COUNTS_FILE`` pointed elsewhere), not in one that merely reads the package's."""
    found = layer_findings(REASONS, LEDGER_FILE.with_name(LAYER_LEDGER.name), required=project)
    if project or COUNTS_FILE != PACKAGE_COUNTS:
        found += counts_findings(COUNTS_FILE, required=project)
    if project:  # the project's documentation quotes the model's tables
        found += doc_findings()
    return tuple(tuple(f) for f in found)


# --- the CLI -------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """Judge the artifacts on disk (``doit gate`` brings them up to date first)."""
    parser = argparse.ArgumentParser(prog="python -m hslm_ptx.pipeline.ratchet.gate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default=",".join(config.VERIFY_SETS), help="verify sets to judge")
    parser.add_argument("--base", default="", help="a git ref: every loosening of the ledger against it")
    args = parser.parse_args(argv)
    sets = tuple(s for s in args.sets.split(",") if s)
    project = LEDGER_FILE == config.LEDGER_FILE
    try:
        base, base_stores = read_base(args.base) if args.base else (None, None)
        if ALLOWED_FILE.exists() or ALLOWED_FILE.is_symlink():
            read_yaml(ALLOWED_FILE)  # not UTF-8, a key twice, not a file: one line before it is parsed
        ledger, sealed, allowed = read_ledger(LEDGER_FILE), read_seals(SEALS_DIR), read_allowed(ALLOWED_FILE)
        stores = working_tree() if project or base_stores is not None else None
        run = summarize(sets)
        counted = gather(project)
    except (ArtifactError, UserError, ImportError) as exc:
        print(f"gate: cannot read {exc}; no verdict", file=sys.stderr)
        return 2
    write_model(GATE_DIR / "run.json", run)
    findings = compare(run, ledger, sealed, allowed, base=base, base_ref=args.base,
                       stores=stores, base_stores=base_stores, counted=counted)
    for finding in findings:
        print(finding)
    red = sum(f.red for f in findings)
    print(f"gate: {'RED' if red else 'green'}: {len(run.results)} of {len(run.cells)} cells checked, "
          f"{red} red finding{'s' * (red != 1)}, {len(findings) - red} informational")
    return 1 if red else 0


if __name__ == "__main__":
    sys.exit(main())
