"""The layer-step ratchet: what one TernaryLinear step launches, synchronizes, copies,
allocates and moves may fall but never silently rise.

The counts are those ``doit layer`` writes (hslm_ptx.pipeline.tasks.layer, artifacts/layer/<set>.json),
which the gate and bless take afresh (hslm_ptx.pipeline.stages.layer_count, milliseconds); the committed
ledger/layer.json holds, per set and shape, the level each count is held to
(hslm_ptx.pipeline.core.layer_records.COUNTS), and seals the step source those levels were counted from
(hslm_ptx/step/launches.py and the hslm_ptx modules it imports, the step kernels' specs
among them).

- :func:`judge_layer` (the gate's): a count above its level is ``SLOWER`` (red), below it
  ``FASTER`` (information; ``doit bless`` records it) when the step source changed since the
  levels were sealed, and ``LOOSENED`` (red) when it did not: bless writes the count it made
  as the level, so on the same source only a hand edit leaves a level above the count.
  A ``reason`` and ``rose_from`` are bless's record of a rise: a ``rose_from`` that is not
  below the level, or either one alone, is ``BAD REASON``. A level with no count now, or a count
  with no level, is ``MISSING``; a ledger sealed on another step source than the current
  one is ``STALE SEAL``, and a report counted from another one is ``MISSING`` (re-run
  ``doit layer``); counts with no ledger file are ``UNSEALED``. A rise accepted with a reason shows
  as ``ACCEPTED SLOWER`` until the counts are back.
- :func:`bless_layer`: the next levels. A fall (or no change) becomes the level; a rise is
  refused unless accepted with a reason, and then the level before it is kept in
  ``rose_from``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Literal, Mapping, NamedTuple

from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.artifacts import read_committed, read_model
from hslm_ptx.pipeline.core.files import rel, write_atomic
from hslm_ptx.validate import LaunchError
from hslm_ptx.pipeline.core.errors import BlessRefused
from hslm_ptx.pipeline.stages.layer_count import build_report
from hslm_ptx.pipeline.core.layer_records import COUNTS, LayerCounts, LayerLedger, LayerLevel, LayerReport
from hslm_ptx.pipeline.core.shapes import load_shape_sets
from hslm_ptx.pipeline.core.sources import closure, closure_bytes_sha256

STEP_MODULE = "hslm_ptx.step.launches"
LAYER_DIR = config.ARTIFACTS / "layer"
LAYER_LEDGER = config.LEDGER_DIR / "layer.json"

Kind = Literal["SLOWER", "FASTER", "MISSING", "STALE SEAL", "UNSEALED", "ACCEPTED SLOWER", "BAD REASON", "LOOSENED"]
INFORMATIONAL = frozenset({"FASTER", "ACCEPTED SLOWER"})


class LayerFinding(NamedTuple):
    """One finding, in the gate's shape (kind, subject, what, fix): ``Finding(*f)``."""

    kind: Kind
    subject: str
    what: str
    fix: str

    @property
    def red(self) -> bool:
        return self.kind not in INFORMATIONAL


def report_path(shape_set: str, folder: Path = LAYER_DIR) -> Path:
    return Path(folder) / f"{shape_set}.json"


def step_source_files() -> tuple[Path, ...]:
    """The files that decide what a step launches: the step module and what it imports."""
    return closure(STEP_MODULE)


def step_source_sha256() -> str:
    """One hash over the step's source files (relative path + content each)."""
    return closure_bytes_sha256(step_source_files())


def rises(held: LayerCounts, now: LayerCounts) -> list[str]:
    return [f"{name} {getattr(held, name)} -> {getattr(now, name)}" for name in COUNTS
            if getattr(now, name) > getattr(held, name)]


def moves(held: LayerCounts, now: LayerCounts) -> list[tuple[str, int, int]]:
    return [(name, getattr(held, name), getattr(now, name)) for name in COUNTS
            if getattr(now, name) != getattr(held, name)]


def _run_layer(shape_set: str) -> str:
    return f"doit layer shape={shape_set}"


def judge_layer(held: LayerLedger | None, reports: Mapping[str, LayerReport], source_sha256: str,
                reasons: Iterable[str]) -> list[LayerFinding]:
    """Every finding of the current reports against the ledger's levels (pure)."""
    ledger = rel(LAYER_LEDGER)
    if held is None:  # nothing held and nothing counted: there is no layer step to judge
        return [LayerFinding("UNSEALED", ledger, f"no layer-step levels for the counts in "
                             f"{', '.join(rel(report_path(s)) for s in sorted(reports))}",
                             f"{_run_layer(','.join(sorted(reports)))} && doit bless")] if reports else []
    findings: list[LayerFinding] = []
    if held.source_sha256 != source_sha256:
        findings.append(LayerFinding("STALE SEAL", ledger, f"step source changed ({held.source_sha256[:12]} -> "
                                     f"{source_sha256[:12]})", "doit bless (counts the step again and seals it)"))
    stale_reports = sorted(s for s, r in reports.items() if r.source_sha256 != source_sha256)
    for shape_set in stale_reports:
        findings.append(LayerFinding("MISSING", rel(report_path(shape_set)), "counted from another step source "
                                     "than the current one", _run_layer(shape_set)))
    now = {(s, shape.name): shape.counts for s, r in reports.items() if s not in stale_reports for shape in r.shapes}
    missing = []
    for level in held.levels:
        subject = f"layer {level.shape_set}/{level.shape}"
        current = now.get(level.key)
        if current is None:
            if level.shape_set not in stale_reports:
                missing.append(LayerFinding("MISSING", subject, "in the ledger, not counted now",
                                            _run_layer(level.shape_set)))
        else:
            for name, was, is_ in moves(level.level, current):
                kind = "SLOWER" if is_ > was else "FASTER" if held.source_sha256 != source_sha256 else "LOOSENED"
                fix = {"SLOWER": "find what the step added (artifacts/layer/, its launch list), or doit bless "
                                 "accept_slower=<reason>",
                       "FASTER": "doit bless (records the new level)",
                       "LOOSENED": "doit bless (records the count; bless writes the count it made as the level)"}[kind]
                findings.append(LayerFinding(kind, subject, f"{name} {was} in the ledger -> {is_} now", fix))
        rose = level.rose_from is not None and bool(rises(level.rose_from, level.level))
        counted_rise = current is None or level.rose_from is None or bool(rises(level.rose_from, current))
        if level.reason is not None and rose and level.reason in reasons:
            if counted_rise:  # else a rise the step does not make now: LOOSENED above says so
                findings.append(LayerFinding("ACCEPTED SLOWER", subject,
                                             f"{', '.join(rises(level.rose_from, level.level))} accepted: "
                                             f"{level.reason}",
                                             "bring it back down, then doit bless (clears the reason)"))
        elif level.reason is not None or level.rose_from is not None:
            findings.append(LayerFinding("BAD REASON", subject,
                                         f"reason {level.reason!r}, rose_from " + ("missing" if level.rose_from is None
                                                                                   else "set" if rose else
                                                                                   "not below the level"),
                                         f"edit {ledger}: both set (a reason of hslm_ptx.pipeline.ratchet.ledger.REASONS) or both null"))
    listed = {level.key for level in held.levels}
    for shape_set, name in sorted(k for k in now if k not in listed):
        missing.append(LayerFinding("MISSING", f"layer {shape_set}/{name}", "counted now, not in the ledger",
                                    "doit bless"))
    return findings + missing


def bless_layer(old: LayerLedger | None, reports: Mapping[str, LayerReport], source_sha256: str,
                accept_slower: str | None = None, gone: Iterable[str] = ()) -> tuple[LayerLedger, list[str]]:
    """The next ledger from the current reports, and the lines that account for it.

    Sets with a report now get its shapes (a shape gone from such a set is dropped); levels
    of the sets in ``gone`` (no longer in shapes.yaml) are dropped; levels of other sets are
    kept as they are. Raises :class:`BlessRefused`, before anything is
    written, on a report counted from another step source, or on a rise that
    ``accept_slower`` (checked by the caller against hslm_ptx.pipeline.ratchet.ledger.REASONS) does not
    give a reason for."""
    stale = sorted(s for s, r in reports.items() if r.source_sha256 != source_sha256)
    if stale:
        raise BlessRefused(f"bless refused: {', '.join(rel(report_path(s)) for s in stale)} counted from another "
                           f"step source; run {_run_layer(','.join(stale))} first")
    before = {level.key: level for level in (old.levels if old else [])}
    gone = set(gone)
    levels = {k: v for k, v in before.items() if k[0] not in reports and k[0] not in gone}
    notes, rose = [], []
    for shape_set, report in reports.items():
        for shape in report.shapes:
            key, now = (shape_set, shape.name), shape.counts
            was = before.get(key)
            if was is None:
                levels[key] = LayerLevel(shape_set=shape_set, shape=shape.name, level=now)
                notes.append(f"layer {shape_set}/{shape.name}: new level {_brief(now)}")
            elif up := rises(was.level, now):
                rose.append(f"{shape_set}/{shape.name} {', '.join(up)}")
                levels[key] = LayerLevel(shape_set=shape_set, shape=shape.name, level=now, reason=accept_slower,
                                         rose_from=was.rose_from or was.level)
            else:
                back = was.rose_from is None or not rises(was.rose_from, now)
                if moves(was.level, now):
                    notes.append(f"layer {shape_set}/{shape.name}: "
                                 + ", ".join(f"{n} {a} -> {b}" for n, a, b in moves(was.level, now)))
                cleared = {"reason": None, "rose_from": None} if back else {}
                levels[key] = was.model_copy(update={"level": now, **cleared})
    if rose and accept_slower is None:
        raise BlessRefused(f"bless refused: the layer step's counts rose: {'; '.join(rose)}; find what the step "
                           "added (artifacts/layer/), or accept it with doit bless accept_slower=<reason>")
    notes += [f"layer {r}: accepted, reason {accept_slower}" for r in rose]
    dropped = sorted(k for k in before if (k[0] in reports or k[0] in gone) and k not in levels)
    if dropped:
        notes.append(f"dropped {len(dropped)} layer levels: {', '.join('/'.join(k) for k in dropped)}")
    return LayerLedger(source_sha256=source_sha256, levels=[levels[k] for k in sorted(levels)]), notes


def _brief(counts: LayerCounts) -> str:
    return ", ".join(f"{name} {getattr(counts, name)}" for name in COUNTS)


# ---- files ------------------------------------------------------------------------------

def read_reports(folder: Path = LAYER_DIR) -> dict[str, LayerReport]:
    """Every artifacts/layer/<set>.json by set; an unreadable one is an ArtifactError."""
    reports = {}
    for path in sorted(Path(folder).glob("*.json")):
        report = read_model(path, LayerReport)
        reports[report.shape_set] = report
    return reports


def read_layer_ledger(path: Path = LAYER_LEDGER) -> LayerLedger | None:
    """The committed levels, None when there is no such file (an unreadable one raises)."""
    return read_committed(path, LayerLedger) if Path(path).exists() else None


def dump_layer_ledger(ledger: LayerLedger) -> str:
    """One level per line, so a diff shows one line per shape that moved."""
    rows = ",\n".join(f"    {level.model_dump_json()}" for level in ledger.levels)
    return (f'{{\n  "schema_version": {ledger.schema_version},\n  "source_sha256": "{ledger.source_sha256}",\n'
            f'  "levels": [\n' + (rows + "\n" if rows else "") + "  ]\n}\n")


def count_sets(names: Iterable[str], source_sha256: str,
               shapes_file: Path = config.SHAPES_FILE) -> tuple[dict[str, LayerReport], dict[str, str]]:
    """The named sets counted now (hslm_ptx.pipeline.stages.layer_count: milliseconds), and for each set that
    could not be, why (not in shapes.yaml, or a step that cannot run); a shapes.yaml that
    cannot be read is the UserError of hslm_ptx.pipeline.core.shapes."""
    known = load_shape_sets(shapes_file)
    reports, failed = {}, {}
    for name in dict.fromkeys(names):
        if name not in known:
            failed[name] = f"set '{name}' is not in {rel(shapes_file)}"
            continue
        try:
            reports[name] = build_report(name, known[name], source_sha256)
        except LaunchError as exc:
            failed[name] = str(exc)
    return reports, failed


def gate_findings(reasons: Iterable[str], ledger_path: Path | None = None, required: bool = True,
                  folder: Path | None = None) -> list[LayerFinding]:
    """What the gate reports for the layer step: the ledger's sets counted afresh and judged
    (so the gate needs no ``doit layer`` run first). Without a ledger file, the sets of the
    reports in ``folder`` are counted and UNSEALED, or, when none, the default set, unless
    ``required`` is False (a ledger folder that need not hold layer levels: a test's).
    ArtifactError when a file is unreadable. Paths default to :data:`LAYER_LEDGER` and
    :data:`LAYER_DIR`."""
    ledger_path, folder = ledger_path or LAYER_LEDGER, folder or LAYER_DIR
    held, source = read_layer_ledger(ledger_path), step_source_sha256()
    if held is None and not required:
        return []
    names = sorted({level.shape_set for level in held.levels}) if held else sorted(read_reports(folder)) or ["hslm"]
    reports, failed = count_sets(names, source)
    findings = [LayerFinding("MISSING", f"layer {name}", f"cannot count: {why}", "fix it, then doit layer")
                for name, why in failed.items()]
    return findings + [f for f in judge_layer(held, reports, source, set(reasons))
                       if not (f.kind == "MISSING" and f.subject.split()[-1].split("/")[0] in failed)]


def planned_bless(accept_slower: str | None = None, ledger_path: Path | None = None,
                  folder: Path | None = None) -> tuple[LayerLedger | None, list[str]]:
    """The next layer ledger and its notes, written by nobody yet (None: nothing counted,
    nothing held: nothing to write), so a bless can refuse before writing anything. It
    counts afresh the sets the ledger holds and those ``doit layer`` wrote reports for; a
    set gone from shapes.yaml loses its levels; a set that cannot be counted refuses. Paths
    default to :data:`LAYER_LEDGER` and :data:`LAYER_DIR`."""
    old = read_layer_ledger(ledger_path or LAYER_LEDGER)
    folder = folder or LAYER_DIR
    names = sorted({level.shape_set for level in (old.levels if old else [])} | set(read_reports(folder)))
    if not names:
        return None, ["layer: no artifacts/layer/ reports and no ledger/layer.json; doit layer counts a step"]
    reports, failed = count_sets(names, step_source_sha256())
    stuck = {name: why for name, why in failed.items() if "is not in" not in why}
    if stuck:
        raise BlessRefused(f"bless refused: the layer step cannot be counted: {'; '.join(stuck.values())}")
    return bless_layer(old, reports, step_source_sha256(), accept_slower, gone=set(failed))


def write_layer_ledger(ledger: LayerLedger | None, path: Path | None = None) -> None:
    """Write the levels (at :data:`LAYER_LEDGER` by default); None writes nothing."""
    if ledger is not None:
        write_atomic(path or LAYER_LEDGER, dump_layer_ledger(ledger))
