"""The ledger: the expected verdict of every cell kernel x check x target, its file
format, and bless.

:func:`bless` turns a run's verdicts (hslm_ptx.pipeline.ratchet.results) into the next ledger under
the ratchet's rules:

- hand-written reasons are kept while a cell stays non-pass;
- a cell the ledger says passes may not come back as ``fail`` (fix it instead);
- the cap ``max_not_pass`` is never raised by bless alone: without ``accept_new`` the
  not-passing entries must fit the old cap (never more than the old ledger's not-passing
  entries, so a cap raised by hand buys nothing); with ``accept_new`` it may grow by
  exactly the not-passing entries new to the ledger; either way it is written as the
  number not passing;
- the SASS levels (``sass``, per kernel x arch) follow drops and refuse a rise unless
  ``accept_slower`` gives its reason (hslm_ptx.pipeline.ratchet.sass_ratchet.bless_sass); so do the layer
  step's counts, in ledger/layer.json beside it (hslm_ptx.pipeline.ratchet.layer_ratchet, :func:`bless_file`);
- the committed stores bless does not write (loop counts, calibration points, shapes, device
  figures) and the set of test files are pinned as they are, in ledger/stores.json
  (hslm_ptx.pipeline.ratchet.stores): the gate holds every later edit red until bless pins it again.

:func:`loosenings` lists every way a ledger is looser than an earlier one (the gate's
``base=REF``), each with what bless recorded for it, if anything.

ledger.json holds one entry per line (see :func:`dump_ledger`) so a diff is one line
per cell that changed.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, get_args

from hslm_ptx.pipeline.core.artifacts import read_committed

from hslm_ptx.pipeline.core.files import rel, write_atomic
from hslm_ptx.pipeline.core.config import LEDGER_FILE
from hslm_ptx.pipeline.core.errors import BlessRefused
from hslm_ptx.pipeline.ratchet.layer_ratchet import LAYER_LEDGER, planned_bless, write_layer_ledger
from hslm_ptx.pipeline.core.models import CellKey, CellResult, Ledger, SassEntry, Verdict
from hslm_ptx.pipeline.ratchet.sass_ratchet import Levels, bless_sass, rises
from hslm_ptx.pipeline.ratchet.stores import PINS, planned_pins, write_pins

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
    "trade-off": "a SASS rise on some arch accepted for a larger fall elsewhere in the same change",
}

# A cell's non-pass entry takes these; "trade-off" is for a SASS level only.
CELL_REASONS: dict[str, str] = {k: v for k, v in REASONS.items() if k != "trade-off"}

# worse verdicts rank higher; the gate compares ranks
RANK: dict[str, int] = {v: i for i, v in enumerate(get_args(Verdict))}


def cell_name(key: CellKey) -> str:
    """'hslm_dx_s8 verify smoke/tiny'."""
    return " ".join(key)


# --- the ledger file ---------------------------------------------------------------------

def make_ledger(entries: Iterable[CellResult], max_not_pass: int, sass: Iterable[SassEntry] = ()) -> Ledger:
    """A ledger with sorted entries and their tally."""
    entries = sorted(entries, key=lambda e: e.key)
    counts = {v: sum(1 for e in entries if e.verdict == v) for v in get_args(Verdict)}
    return Ledger(max_not_pass=max_not_pass, counts=counts, entries=entries,
                  sass=sorted(sass, key=lambda e: e.key))


def dump_ledger(ledger: Ledger) -> str:
    """JSON with one compact entry per line, so a diff shows one line per changed cell."""
    def rows(records) -> str:
        lines = [f"    {json.dumps(r.model_dump(mode='json'), separators=(', ', ': '))}" for r in records]
        return ",\n".join(lines) + ("\n" if lines else "")

    head = (f'{{\n  "schema_version": {ledger.schema_version},\n  "max_not_pass": {ledger.max_not_pass},\n'
            f'  "counts": {json.dumps(ledger.counts)},\n  "entries": [\n')
    return head + rows(ledger.entries) + '  ],\n  "sass": [\n' + rows(ledger.sass) + "  ]\n}\n"


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
          accept_new: bool = False, sass: Levels | None = None,
          accept_slower: str | None = None) -> tuple[Ledger, list[str]]:
    """The next ledger from a run, and the lines that account for it.

    ``universe`` is every cell that exists: old entries outside it are dropped (stale);
    cells of it without a result keep their old entry. Raises :class:`BlessRefused`
    (and the caller writes nothing) on a fail where the ledger said pass, when the
    not-passing entries would not fit the cap this bless may set, or on a SASS rise
    (``sass``: the current levels) that ``accept_slower`` does not give a reason for.
    """
    if accept_slower is not None and accept_slower not in REASONS:
        raise BlessRefused(f"bless refused: accept_slower={accept_slower!r} is not a reason; "
                           f"use one of {', '.join(REASONS)}")
    archs = {(kernel, target) for kernel, check, target in universe if check == "ptxas"}
    sass_entries, sass_notes = bless_sass(old.sass if old else [], sass or {}, archs, accept_slower)
    old_entries = {e.key: e for e in (old.entries if old else [])}
    # bless writes the cap as the number not passing, so a cap above it is a hand edit: it buys nothing
    old_cap = min(old.max_not_pass, old.not_pass) if old else 0
    exists = set(universe)
    new: dict[CellKey, CellResult] = {k: e for k, e in old_entries.items() if k in exists}
    for result in results:
        if result.key not in exists:
            continue
        before = old_entries.get(result.key)
        reason = None
        if result.verdict != "pass":
            kept = before.reason if before is not None and before.verdict != "pass" else None
            reason = kept or result.reason
        new[result.key] = result.model_copy(update={"reason": reason})
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
    ledger = make_ledger(new.values(), len(not_pass), sass_entries)
    notes = []
    if accept_new:
        notes.append(f"cap: old {old_cap} + {len(added)} new not-passing "
                     f"({listing(added, 20) or 'none'}) = new cap {len(not_pass)}; {len(not_pass)} not passing now"
                     + (f" ({cap - len(not_pass)} fewer than it allows: the cap is their number)"
                        if cap > len(not_pass) else ""))
    else:
        notes.append(f"cap: {old_cap} -> {ledger.max_not_pass} ({len(not_pass)} not passing)")
    dropped = sorted(set(old_entries) - exists)
    if dropped:
        notes.append(f"dropped {len(dropped)} stale entries: {listing(dropped)}")
    unreasoned = [e.key for e in ledger.entries if e.verdict != "pass" and e.reason not in REASONS]
    if unreasoned:
        notes.append(f"give a reason ({', '.join(REASONS)}) in {rel(LEDGER_FILE)} to: {listing(unreasoned, 20)}")
    return ledger, notes + sass_notes


# --- loosenings against an earlier ledger (doit gate base=REF) ----------------------------

class Loosening(NamedTuple):
    """One way a ledger is looser than an earlier one. ``reason``: what doit bless recorded for
    it, from the fixed list; None when the ledger does not carry one (a hand edit)."""

    subject: str
    what: str
    reason: str | None
    fix: str


def newly_not_passing(base: Ledger, now: Ledger) -> list[CellResult]:
    """Entries of ``now`` that do not pass and ranked better (or were absent) in ``base``."""
    before = {e.key: e for e in base.entries}
    return [e for e in now.entries if e.verdict != "pass"
            and (e.key not in before or RANK[e.verdict] > RANK[before[e.key].verdict])]


def _carried(entry: CellResult) -> str | None:
    return entry.reason if entry.reason in CELL_REASONS and entry.blocker else None


def cap_loosenings(base: Ledger, now: Ledger) -> Iterable[Loosening]:
    """A cap above the earlier one: bless raises it (accept_new=1) by at most the entries new to the
    ledger, each with its reason, and writes it as the number not passing."""
    if now.max_not_pass <= base.max_not_pass:
        return
    new = newly_not_passing(base, now)
    reasons = [_carried(e) for e in new]
    fits = now.max_not_pass - base.max_not_pass <= len(new) and now.max_not_pass == now.not_pass
    yield Loosening("max_not_pass", f"{base.max_not_pass} -> {now.max_not_pass}",
                    f"accept_new=1 for {', '.join(sorted(set(reasons)))}" if fits and new and None not in reasons
                    else None, "only doit bless accept_new=1 raises it, by the entries new to the ledger")


def entry_loosenings(base: Ledger, now: Ledger) -> Iterable[Loosening]:
    """Each entry that does not pass and did (or was absent) before: bless records the run's blocker
    and a reason, and never a fail where the earlier ledger said pass."""
    before = {e.key: e for e in base.entries}
    for e in newly_not_passing(base, now):
        was = before.get(e.key)
        refused = was is not None and was.verdict in ("pass", "pass_vacuous") and e.verdict == "fail"
        yield Loosening(cell_name(e.key), f"{was.verdict if was else 'no entry'} -> {e.verdict}",
                        None if refused else _carried(e),
                        "fix the cell (bless never records a fail where the ledger said pass)" if refused
                        else f"doit bless accept_new=1, with a reason from {', '.join(CELL_REASONS)}")


def sass_loosenings(base: Ledger, now: Ledger) -> Iterable[Loosening]:
    """A SASS level above the earlier one: bless records it only with accept_slower=<reason>, keeping
    the earlier level in rose_from; a rose_from or reason set without a rise is a hand edit."""
    before = {e.key: e for e in base.sass}
    for e in now.sass:
        was = before.get(e.key)
        if was is None:
            continue  # a kernel or arch new to the ledger starts at its level
        up = rises(was.level, e.level)
        if up:
            accepted = e.reason in REASONS and e.rose_from == (was.rose_from or was.level)
            yield Loosening(f"sass {e.kernel} {e.arch}", ", ".join(up), e.reason if accepted else None,
                            "doit bless accept_slower=<reason> records a rise (with the level before it)")
        elif (e.reason, e.rose_from) != (was.reason, was.rose_from) and e.rose_from is not None:
            yield Loosening(f"sass {e.kernel} {e.arch}", f"reason {e.reason!r} and rose_from set without a rise",
                            None, "only doit bless sets them, on a rise")


# Each kind of loosening, in the order the gate prints them; a new ratchet adds its function.
LOOSENINGS: tuple[Callable[[Ledger, Ledger], Iterable[Loosening]], ...] = (
    cap_loosenings, entry_loosenings, sass_loosenings)


def loosenings(base: Ledger, now: Ledger) -> list[Loosening]:
    """Every way ``now`` is looser than ``base``."""
    return [found for kind in LOOSENINGS for found in kind(base, now)]


def bless_file(universe: list[CellKey], results: list[CellResult], accept_new: bool = False,
               path: Path = LEDGER_FILE, sass: Levels | None = None,
               accept_slower: str | None = None) -> tuple[Ledger, list[str]]:
    """:func:`bless` the ledger at ``path`` and write it; a refusal raises before any write."""
    ledger, notes = bless(read_committed(path, Ledger) if path.exists() else None, universe, results, accept_new,
                          sass, accept_slower)
    # the layer step's levels (ledger/layer.json) and the pins of the other stores (ledger/stores.json),
    # beside the project's ledger only (not a test's)
    layer_path = path.with_name(LAYER_LEDGER.name)
    layer, layer_notes = planned_bless(accept_slower, layer_path) if path == LEDGER_FILE else (None, [])
    pins_path = path.with_name(Path(PINS).name)
    pins, pin_notes = planned_pins(pins_path) if path == LEDGER_FILE else (None, [])
    write_ledger(ledger, path)
    write_layer_ledger(layer, layer_path)
    if pins is not None:
        write_pins(pins_path, pins=pins)
    return ledger, notes + layer_notes + pin_notes
