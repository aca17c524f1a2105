"""The gate's rule for a kernel it has never seen: one line that says what to run.

A kernel just added to hslm_ptx/catalog/registry.py has no seal and no ledger entry, so every
one of its cells is UNLISTED, its seal UNSEALED and each of its SASS figures MISSING:
dozens of red lines that all mean "this kernel is new". :func:`fold_new_kernels`
replaces them with one red NEW KERNEL line per such kernel, saying how its cells ran
and the commands that record it (``doit seal`` pins what was verified, ``doit bless
accept_new=1`` adds its cells to the ledger). A kernel that has a seal or any ledger
entry is not new: its findings are left as they are.

"""
from __future__ import annotations

from typing import Sequence, TypeVar

from hslm_ptx.pipeline.core.files import rel
from hslm_ptx.pipeline.ratchet.findings import Finding, Inputs
from hslm_ptx.pipeline.ratchet.seal import seal_path

F = TypeVar("F", bound="Finding")

KIND = "NEW KERNEL"
# the findings a new kernel raises only because nothing about it was recorded yet
FOLDED = frozenset({"UNLISTED", "UNSEALED", "MISSING"})


def new_kernels(i: Inputs) -> list[str]:
    """The run's kernels with neither a seal nor a ledger entry (cell or SASS level), in
    the run's order."""
    recorded = {e.kernel for e in i.ledger.entries} | {e.kernel for e in i.ledger.sass} | set(i.seals)
    return [state.kernel for state in i.run.kernels if state.kernel not in recorded]


def subject_kernel(finding: Finding) -> str:
    """The kernel a finding is about: a cell's or a SASS figure's first word, or the
    kernel whose seal file it names."""
    first = finding.subject.split(" ", 1)[0]
    if first.endswith(".json"):
        return first.rsplit("/", 1)[-1].removesuffix(".json")
    return first


def summary(kernel: str, i: Inputs) -> tuple[str, str]:
    """What the NEW KERNEL line says about ``kernel`` and the command it points to."""
    cells = [key for key in i.run.cells if key[0] == kernel]
    ran = [r for r in i.run.results if r.kernel == kernel]
    passed = sum(r.verdict == "pass" for r in ran)
    what = (f"{len(cells)} cells ({passed} pass, {len(ran) - passed} not passing, {len(cells) - len(ran)} not run), "
            f"no seal in {rel(seal_path(kernel))}, no entry in the ledger")
    if passed < len(ran):
        failing = next(r for r in ran if r.verdict != "pass")
        fix = (f"make {failing.check} {failing.target} pass ({failing.blocker or failing.verdict}), "
               f"then doit seal:{kernel} && doit bless accept_new=1")
    else:
        fix = f"doit seal:{kernel} && doit bless accept_new=1"
    return what, fix


def fold_new_kernels(findings: Sequence[F], i: Inputs) -> list[F]:
    """``findings`` with each new kernel's UNLISTED / UNSEALED / MISSING lines replaced by
    one NEW KERNEL line, where its first such line was; every other finding kept."""
    new = set(new_kernels(i))
    out: list[F] = []
    done: set[str] = set()
    for finding in findings:
        kernel = subject_kernel(finding)
        if kernel not in new or finding.kind not in FOLDED:
            out.append(finding)
        elif kernel not in done:
            done.add(kernel)
            what, fix = summary(kernel, i)
            out.append(finding._replace(kind=KIND, subject=kernel, what=what, fix=fix))
    return out
