"""The judging half of a SASS ratchet: sealed per-IMMA figures against the current records.

A seal pins, per kernel and arch, the steady-state (fast body) figures of
:mod:`pipeline.sass`: SASS instructions per IMMA and LSU instructions per IMMA. A rise
is a finding of kind ``SLOWER`` (the gate's to turn red); a drop is ``FASTER``, for
information, and for ``doit bless`` to record as the new figure; a sealed kernel or arch
with no current figure is ``MISSING``. Seal, ledger and gate wiring live elsewhere.
"""
from __future__ import annotations

from typing import Iterable, Literal, Mapping

from pipeline.models import Record
from pipeline.sass import SassReport

Figures = tuple[float, float]  # (sass_per_imma, lsu_per_imma)
FIGURE_NAMES = ("SASS/IMMA", "LSU/IMMA")
EPSILON = 1e-6  # the figures are ratios rounded to 4 places


class SassFinding(Record):
    kind: Literal["SLOWER", "FASTER", "MISSING"]
    kernel: str
    arch: str
    figure: str  # "SASS/IMMA", "LSU/IMMA", or "-" when MISSING
    sealed: float | None
    current: float | None
    line: str


def current_figures(reports: Iterable[SassReport]) -> dict[str, dict[str, Figures]]:
    """{kernel: {arch: (sass_per_imma, lsu_per_imma)}} of each steady-state body: the seal's record."""
    out: dict[str, dict[str, Figures]] = {}
    for report in reports:
        for arch in report.archs:
            body = arch.fast or arch.tail
            if body is not None and body.per_imma is not None:
                out.setdefault(report.kernel, {})[arch.arch] = (body.per_imma, body.lsu_per_imma)
    return out


def judge_sass(sealed: Mapping[str, Mapping[str, Figures]], reports: Iterable[SassReport]) -> list[SassFinding]:
    """Findings for every sealed figure that moved (or vanished), in sealed order."""
    now = current_figures(reports)
    findings = []
    for kernel, archs in sealed.items():
        for arch, figures in archs.items():
            current = now.get(kernel, {}).get(arch)
            if current is None:
                findings.append(SassFinding(
                    kind="MISSING", kernel=kernel, arch=arch, figure="-", sealed=None, current=None,
                    line=f"MISSING {kernel} {arch}: sealed SASS figures but no current count; run `doit sass`"))
                continue
            for name, was, is_ in zip(FIGURE_NAMES, figures, current):
                if abs(is_ - was) <= EPSILON:
                    continue
                kind = "SLOWER" if is_ > was else "FASTER"
                then = ("the steady-state body issues more; find what the change added to the loop"
                        if kind == "SLOWER" else "record it with `doit bless`")
                findings.append(SassFinding(
                    kind=kind, kernel=kernel, arch=arch, figure=name, sealed=was, current=is_,
                    line=f"{kind} {kernel} {arch}: {name} {was:g} sealed -> {is_:g} now; {then}"))
    return findings
