"""The gate's rule for the committed loop counts: hslm_ptx/cost/loop_counts.json must describe the
loops `doit sass` counted now.

The cost model and the tile rule read each GEMM's loop from hslm_ptx/cost/loop_counts.json
(``hslm_ptx.cost.model.loop_counts``), which ``doit model:counts`` writes from the cubins. A
kernel edit that changes its loop, or a hand edit of the file, leaves figures that no
longer describe the code: the tile rule would rank configurations on them and the model
would print them. :func:`counts_findings` compares the file with the SASS records
(``hslm_ptx.pipeline.stages.perf_model.counts_disagreements``: the PTX each kernel was counted from, each
body's instructions, IMMA and requested global bytes) and the occupancy it holds for the tile
rule with the ptxas records (``occupancy_disagreements``), and gives one STALE line per
disagreement, naming the file and the kernel, with the command that rewrites it.

Findings are plain (kind, subject, what, fix) tuples, so this module imports nothing of
hslm_ptx.pipeline.ratchet.gate and hslm_ptx.pipeline.ratchet.gate can call it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, NamedTuple

from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.pipeline.core.artifacts import read_json, read_model
from hslm_ptx.pipeline.core.files import rel
from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.config import sass_json
from hslm_ptx.pipeline.core.models import PtxasReport
from hslm_ptx.pipeline.stages.perf_model import counts_disagreements, occupancy_disagreements, scored_kernels
from hslm_ptx.pipeline.stages.sass import SassReport

FIX = "doit model:counts"


class CountsFinding(NamedTuple):
    kind: str
    subject: str
    what: str
    fix: str


def counted_kernels() -> list[str]:
    """The kernels whose loops the file must hold: the registry's int8 GEMMs."""
    return [name for name, spec in KERNELS.items() if spec.is_gemm]


def counts_findings(counts_file: Path, required: bool = True, kernels: list[str] | None = None,
                    report_path: Callable[[str], Path] | None = None) -> list[CountsFinding]:
    """The loop counts in ``counts_file`` (the package's ``loop_counts.json``) against each
    kernel's SASS record (``report_path(kernel)``, artifacts/sass by default). A missing counts
    file is a finding, unless ``required`` is False (a world that need not hold them: a
    test's). A missing SASS record is one too (`doit sass` writes it). ArtifactError when
    a file cannot be read (not UTF-8 JSON, a key twice)."""
    path = Path(counts_file)
    if not path.is_file():
        return [CountsFinding("MISSING", rel(path), "no loop counts (the cost model and the tile rule read them)",
                              FIX)] if required else []
    counts = read_json(path)
    report_path = report_path or sass_json
    reports, findings = {}, []
    for name in counted_kernels() if kernels is None else kernels:
        if report_path(name).is_file():
            reports[name] = read_model(report_path(name), SassReport)
        else:
            findings.append(CountsFinding("MISSING", rel(report_path(name)), f"no SASS record of {name} to check "
                                          f"{rel(path)} against", f"doit sass:{name}"))
    occupancy, missing = {}, []
    for name in scored_kernels() if kernels is None else []:
        if config.ptxas_json(name).is_file():
            occupancy[name] = read_model(config.ptxas_json(name), PtxasReport)
        else:
            missing.append(CountsFinding("MISSING", rel(config.ptxas_json(name)), f"no ptxas record of {name} to "
                                         f"check {rel(path)}'s occupancy against", f"doit ptxas:{name}"))
    disagree = counts_disagreements(counts, reports) + occupancy_disagreements(counts, occupancy)
    return findings + missing + [CountsFinding("STALE", rel(path), what, FIX) for what in disagree]
