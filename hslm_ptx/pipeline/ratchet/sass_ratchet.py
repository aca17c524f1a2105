"""The SASS ratchet: each kernel's per-arch issue cost may fall but never silently rise.

The figures are those of :mod:`hslm_ptx.pipeline.stages.sass`: SASS instructions per IMMA and LSU
instructions per IMMA, of the steady-state (fast) body and of the predicated tail body.
Seals record them for the sealed PTX; the ledger holds, per kernel x arch, the level
the gate judges the current counts against (:class:`hslm_ptx.pipeline.core.models.SassEntry`).

- :func:`judge_sass`: a rise is ``SLOWER`` (the gate's to turn red); a drop is
  ``FASTER``, for information and for ``doit bless`` to record as the new level; a
  figure held but not counted now, or counted but not held, is ``MISSING``.
- :func:`bless_sass`: the next ledger levels. A drop (or no change) becomes the level; a
  rise is refused unless accepted with a reason, and then the level before it is kept
  in ``rose_from`` until the figures are back at it.
"""
from __future__ import annotations

from typing import Iterable, Literal, Mapping

from hslm_ptx.pipeline.core.errors import BlessRefused
from hslm_ptx.pipeline.core.models import Record, SassEntry, SassFigures, SassLevel
from hslm_ptx.pipeline.stages.sass import Body, SassReport

Levels = Mapping[str, Mapping[str, SassLevel]]  # kernel -> arch -> level
BODIES = ("fast", "tail")
FIGURES = (("SASS/IMMA", "sass_per_imma"), ("LSU/IMMA", "lsu_per_imma"))
EPSILON = 1e-6  # the figures are ratios rounded to 4 places


class SassFinding(Record):
    kind: Literal["SLOWER", "FASTER", "MISSING"]
    kernel: str
    arch: str
    what: str  # "fast SASS/IMMA 10.5 in the ledger -> 11 now"


def figures_of(body: Body | None) -> SassFigures | None:
    if body is None or body.per_imma is None or body.lsu_per_imma is None:
        return None
    return SassFigures(sass_per_imma=body.per_imma, lsu_per_imma=body.lsu_per_imma)


def current_figures(reports: Iterable[SassReport]) -> dict[str, dict[str, SassLevel]]:
    """{kernel: {arch: level}} of each report: what a seal records and the gate judges."""
    return {report.kernel: {a.arch: SassLevel(fast=figures_of(a.fast), tail=figures_of(a.tail))
                            for a in report.archs}
            for report in reports}


def flat(level: SassLevel) -> dict[str, float]:
    """{"fast SASS/IMMA": 10.5, ...} for each body the level has."""
    out = {}
    for body in BODIES:
        figures = getattr(level, body)
        if figures is not None:
            out.update((f"{body} {name}", getattr(figures, field)) for name, field in FIGURES)
    return out


def moved(held: SassLevel, now: SassLevel) -> list[tuple[str, float, float]]:
    """(figure, held, now) for each figure both levels have and that differs."""
    was, is_ = flat(held), flat(now)
    return [(name, was[name], is_[name]) for name in was
            if name in is_ and abs(is_[name] - was[name]) > EPSILON]


def changes(held: SassLevel, now: SassLevel, only_rises: bool = False) -> list[str]:
    """The figures that moved ("fast SASS/IMMA 10.5 -> 11"), or only those that rose."""
    return [f"{name} {a:g} -> {b:g}" for name, a, b in moved(held, now) if b > a or not only_rises]


def rises(held: SassLevel, now: SassLevel) -> list[str]:
    return changes(held, now, only_rises=True)


def label(names: list[str]) -> str:
    """"fast+tail SASS/IMMA, LSU/IMMA" when whole bodies are named, else the names."""
    bodies = list(dict.fromkeys(name.split()[0] for name in names))
    if len(names) == len(bodies) * len(FIGURES):
        return f"{'+'.join(bodies)} {', '.join(name for name, _ in FIGURES)}"
    return ", ".join(names)


def judge_sass(held: Levels, now: Levels) -> list[SassFinding]:
    """Every figure that moved, in held order; then one MISSING per kernel x arch for
    the figures held but not counted now, or counted but not held."""
    findings, missing = [], []
    keys = [(k, a) for k, archs in held.items() for a in archs]
    keys += [(k, a) for k, archs in now.items() for a in archs if (k, a) not in keys]
    for kernel, arch in keys:
        was = held.get(kernel, {}).get(arch, SassLevel())
        is_ = now.get(kernel, {}).get(arch, SassLevel())
        for name, a, b in moved(was, is_):
            findings.append(SassFinding(kind="SLOWER" if b > a else "FASTER", kernel=kernel, arch=arch,
                                        what=f"{name} {a:g} in the ledger -> {b:g} now"))
        for names, where in (([n for n in flat(was) if n not in flat(is_)], "in the ledger, not counted now"),
                             ([n for n in flat(is_) if n not in flat(was)], "counted now, not in the ledger")):
            if names:
                missing.append(SassFinding(kind="MISSING", kernel=kernel, arch=arch, what=f"{label(names)} {where}"))
    return findings + missing


def ledger_levels(entries: Iterable[SassEntry]) -> dict[str, dict[str, SassLevel]]:
    out: dict[str, dict[str, SassLevel]] = {}
    for e in entries:
        out.setdefault(e.kernel, {})[e.arch] = e.level
    return out


def bless_sass(old: Iterable[SassEntry], now: Levels, exists: set[tuple[str, str]],
               accept_slower: str | None = None) -> tuple[list[SassEntry], list[str]]:
    """The next ledger levels and the lines that account for them.

    ``exists``: every (kernel, arch) there is; old entries outside it are dropped, and
    those without a current count are kept as they are. Raises :class:`BlessRefused`
    on a rise unless ``accept_slower`` names the reason (checked by the caller).
    """
    entries = {e.key: e for e in old if e.key in exists}
    notes, rose = [], []
    for kernel, archs in now.items():
        for arch, level in archs.items():
            if (kernel, arch) not in exists:
                continue
            before = entries.get((kernel, arch))
            if before is None:
                entries[(kernel, arch)] = SassEntry(kernel=kernel, arch=arch, level=level)
                continue
            if up := rises(before.level, level):
                rose.append(f"{kernel} {arch} {', '.join(up)}")
                best = before.rose_from or before.level
                entries[(kernel, arch)] = SassEntry(kernel=kernel, arch=arch, level=level,
                                                    reason=accept_slower, rose_from=best)
            elif flat(before.level) != flat(level):
                back = before.rose_from is None or not rises(before.rose_from, level)
                notes.append(f"sass {kernel} {arch}: {', '.join(changes(before.level, level)) or 'bodies changed'}"
                             + (" (back at its level before the accepted rise)" if back and before.rose_from else ""))
                cleared = {"reason": None, "rose_from": None} if back else {}
                entries[(kernel, arch)] = before.model_copy(update={"level": level, **cleared})
    if rose and accept_slower is None:
        raise BlessRefused(f"bless refused: SASS per IMMA rose: {'; '.join(rose)}; find what the change added "
                           f"to the loop (doit sass:summary), or accept it with doit bless accept_slower=<reason>")
    notes += [f"sass {r}: accepted, reason {accept_slower}" for r in rose]
    dropped = sorted(e.key for e in old if e.key not in exists)
    if dropped:
        notes.append(f"dropped {len(dropped)} stale sass entries: {', '.join(' '.join(k) for k in dropped)}")
    return sorted(entries.values(), key=lambda e: e.key), notes
