"""A run's verdicts as the artifacts on disk tell them: one :class:`CellResult` per cell.

Cells are ``ptxas`` per arch, ``verify`` per "set/shape" and ``tests`` per kernel; beside
them, each kernel's SASS figures per arch (hslm_ptx.pipeline.ratchet.sass_ratchet) of the current PTX.
Every stage records its evidence, a failure included (ptxas's error line per arch, a
verify report with its mismatches or launch error, the kernel tests' counts), so
collecting never runs a tool: it reads and classifies.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Iterable

from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.artifacts import read_present
from hslm_ptx.pipeline.core.files import rel, sha256_file
from hslm_ptx.pipeline.ratchet.dupbody import find_duplicates
from hslm_ptx.pipeline.core.schemas import drift
from hslm_ptx.pipeline.core.errors import ArtifactError
from hslm_ptx.pipeline.core.models import (CellKey, CellResult, EmitResult, KernelState, KernelTestRun, PtxasReport,
                                           RunSummary, SassLevel, SealedShape, SealEvidence, Shape, TestCounts, Verdict,
                                           VerifyReport)
from hslm_ptx.pipeline.stages.sass import SassReport
from hslm_ptx.pipeline.ratchet.sass_ratchet import current_figures
from hslm_ptx.pipeline.core.shapes import select_sets
from hslm_ptx.pipeline.core.sources import source_sha256
from hslm_ptx.pipeline.stages.verify import verdict as verify_line

# What a run can tell by itself from a check's first error line:
# (check, pattern, verdict, reason). Anything else is a plain fail whose reason a
# person writes into the ledger.
BLOCKERS: tuple[tuple[str, re.Pattern[str], Verdict, str], ...] = (
    ("ptxas", re.compile(r"Unsupported \.version|PTX ISA version", re.I), "blocked", "ptxas-version"),
    ("ptxas", re.compile(r"not (defined|supported) (for|on) .*sm_|unsupported (gpu|arch)", re.I), "blocked", "unsupported-arch"),
    ("ptxas", re.compile(r"spills|> budget", re.I), "fail", "over-budget"),
    ("verify", re.compile(r"ptxemu: unsupported\b"), "blocked", "emulator-gap"),
)


def cell(key: CellKey, verdict: Verdict, blocker: str | None = None, reason: str | None = None) -> CellResult:
    return CellResult(kernel=key[0], check=key[1], target=key[2], verdict=verdict, blocker=blocker, reason=reason)


def failed(key: CellKey, blocker: str) -> CellResult:
    """A not-passing cell, classified by :data:`BLOCKERS` (plain ``fail`` when none match)."""
    line = " ".join(blocker.split())
    for check, pattern, verdict, reason in BLOCKERS:
        if check == key[1] and pattern.search(line):
            return cell(key, verdict, line, reason)
    return cell(key, "fail", line)


def cells(kernels: Iterable[str], archs: Iterable[str],
          sets: dict[str, tuple[Shape, ...]]) -> list[CellKey]:
    """Every cell of the matrix, sorted: ptxas per arch, verify per set/shape, tests."""
    targets = [("ptxas", a) for a in archs]
    targets += [("verify", f"{s}/{shape.name}") for s, shapes in sets.items() for shape in shapes]
    targets.append(("tests", "tests"))
    return sorted((k, check, target) for k in kernels for check, target in targets)


def ptxas_results(kernel: str, archs: Iterable[str], emitted: EmitResult) -> list[CellResult]:
    """ptxas cells from artifacts/ptxas/<kernel>.json made from the current PTX."""
    path = config.ptxas_json(kernel)
    report = read_present(path, PtxasReport)
    current = report is not None and report.ptx_sha256 == emitted.ptx_sha256
    figures = {a.arch: a for a in report.archs} if current else {}
    errors = report.errors if current else {}
    results = []
    for arch in archs:
        key = (kernel, "ptxas", arch)
        if arch in errors:
            results.append(failed(key, errors[arch]))
        elif arch not in figures:
            results.append(failed(key, f"no ptxas figures for the current PTX on {arch} in {rel(path)}; "
                                       "run doit ptxas"))
        elif figures[arch].problems:
            results.append(failed(key, "; ".join(figures[arch].problems)))
        else:
            results.append(cell(key, "pass"))
    return results


def verify_results(kernel: str, sets: dict[str, tuple[Shape, ...]],
                   emitted: EmitResult) -> list[CellResult]:
    """verify cells from artifacts/verify/<kernel>/<set>/<shape>.json made from the current PTX."""
    results = []
    for shape_set, shapes in sets.items():
        for shape in shapes:
            key = (kernel, "verify", f"{shape_set}/{shape.name}")
            path = config.verify_json(kernel, shape_set, shape.name)
            report = read_present(path, VerifyReport)
            if report is None or report.ptx_sha256 != emitted.ptx_sha256:
                results.append(failed(key, f"no verify report for the current PTX in {rel(path)}; "
                                           f"run doit verify shape={shape_set}"))
            elif report.passed and (report.R, report.K, report.N) == (shape.R, shape.K, shape.N):
                results.append(cell(key, "pass"))
            else:
                results.append(failed(key, verify_line(report)))
    return results


def tests_result(kernel: str, run: KernelTestRun | None) -> CellResult:
    """The tests cell: fail on a failed test, blocked with no test run, pass_vacuous when
    one passed without asserting."""
    key = (kernel, "tests", "tests")
    counts = run.kernels.get(kernel) if run else None
    if run is None:
        return failed(key, "no kernel test run; run doit kernel_tests")
    if counts is None or counts.total == 0:
        return cell(key, "blocked", f"no test marked @pytest.mark.kernel('{kernel}')", "no-tests")
    if counts.failed:
        return failed(key, run.failures.get(kernel, f"{counts.failed} tests failed"))
    if counts.passed == 0:
        return cell(key, "blocked", f"all {counts.total} tests skipped", "not-run")
    if counts.vacuous:
        vacuous = run.vacuous_tests.get(kernel, [])
        return cell(key, "pass_vacuous", f"{counts.vacuous} vacuous: {', '.join(vacuous)}", "vacuous-test")
    return cell(key, "pass")


def collect(kernels: dict[str, str], archs: Iterable[str], sets: dict[str, tuple[Shape, ...]],
            tests: KernelTestRun | None) -> list[CellResult]:
    """Every cell's verdict from the artifacts on disk. ``kernels`` maps each kernel to
    its current source hash; a kernel whose emit result is missing or older than its
    source fails all its cells (its other artifacts say nothing about this source)."""
    archs = tuple(archs)
    results: list[CellResult] = []
    for kernel, source in kernels.items():
        emitted = read_present(config.emit_json(kernel), EmitResult)
        if emitted is None or emitted.source_sha256 != source:
            blocker = f"no emit result for the current source in {rel(config.emit_json(kernel))}; run doit emit"
            results += [failed(key, blocker) for key in cells([kernel], archs, sets) if key[1] != "tests"]
        else:
            results += ptxas_results(kernel, archs, emitted)
            results += verify_results(kernel, sets, emitted)
        results.append(tests_result(kernel, tests))
    return sorted(results, key=lambda r: r.key)


def imported_helpers(path: Path, folder: Path) -> set[Path]:
    """The modules of ``folder`` (tests/) that the file at ``path`` imports by name
    (``import kernelcases``, ``from kernelcases import ...``, ``from tests.kernelcases import ...``)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return set()  # an unreadable test file is its own (missing or changed) hash
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    found = set()
    for name in names:
        parts = name.split(".")
        parts = parts[1:] if parts[0] == folder.name else parts
        candidate = folder.joinpath(*parts).with_suffix(".py") if parts else None
        if candidate is not None and candidate.is_file():
            found.add(candidate)
    return found


def with_helpers(files: Iterable[str]) -> list[str]:
    """The test files and every file of tests/ they import, transitively, and tests/conftest.py
    (pytest loads it for every test there): what a test's verdict depends on besides the code
    under test."""
    folder = config.ROOT / "tests"
    todo = [config.ROOT / name for name in files]
    conftest = folder / "conftest.py"
    todo += [conftest] if conftest.is_file() and todo else []
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path not in seen:
            seen.add(path)
            todo.extend(imported_helpers(path, folder) - seen)
    return sorted(path.relative_to(config.ROOT).as_posix() for path in seen)


def hashes_of_test_files(files: Iterable[str]) -> dict[str, str]:
    """{path: sha256} of test files named relative to the project root and of the helpers they
    import (:func:`with_helpers`; "(missing)" for one that is gone): what a seal pins and
    the gate compares, so a helper edited after sealing (a check that always passes) is red."""
    return {name: sha256_file(config.ROOT / name) if (config.ROOT / name).is_file() else "(missing)"
            for name in with_helpers(files)}


def sealed_shapes(sets: dict[str, tuple[Shape, ...]]) -> list[SealedShape]:
    """The shapes of the sealed sets as shapes.yaml defines them now, in a seal's terms."""
    return [SealedShape(shape_set=s, shape=shape.name, R=shape.R, K=shape.K, N=shape.N, mismatches=0,
                        rows_checked=0) for s in config.VERIFY_SETS if s in sets for shape in sets[s]]


def one_gpu_arch(reports: Iterable[VerifyReport]) -> str | None:
    """The arch of a set of reports that one kind of GPU produced (None: the emulator's, or mixed)."""
    archs = {r.arch if r.backend == "gpu" else None for r in reports}
    return archs.pop() if len(archs) == 1 else None


def evidence_of(kernel: str, emitted: EmitResult, sets: dict[str, tuple[Shape, ...]], ran: Iterable[str],
                tests: KernelTestRun, sass: dict[str, SassLevel] | None) -> SealEvidence:
    """What this run shows of ``kernel`` (its emit result is of the current source), in a
    seal's terms: ptxas figures and verify reports of the current PTX (of the sealed sets
    among ``ran``), the sealed sets' shapes, test counts and test file hashes, SASS."""
    ptxas = read_present(config.ptxas_json(kernel), PtxasReport)
    current = ptxas is not None and ptxas.ptx_sha256 == emitted.ptx_sha256
    reports = [r for s in ran if s in config.VERIFY_SETS for shape in sets.get(s, ())
               if (r := read_present(config.verify_json(kernel, s, shape.name), VerifyReport)) is not None
               and r.ptx_sha256 == emitted.ptx_sha256]
    zero = TestCounts.model_validate(dict.fromkeys(TestCounts.model_fields, 0))
    return SealEvidence(
        ptx_bytes=emitted.ptx_bytes, ptxas_version=ptxas.ptxas_version if current else None,
        ptxas=ptxas.archs if current else None, defined=sealed_shapes(sets),
        verify=[SealedShape(shape_set=r.shape_set, shape=r.shape, R=r.R, K=r.K, N=r.N, mismatches=r.mismatches,
                            rows_checked=r.rows_checked) for r in reports],
        runs=sorted({(r.backend, r.device, r.driver) for r in reports}, key=str),
        arch=one_gpu_arch(reports),
        tests=tests.kernels.get(kernel, zero), test_files=hashes_of_test_files(tests.files.get(kernel, [])),
        sass=sass,
    )


def kernel_sources() -> dict[str, str]:
    """Each registered kernel and its current source hash."""
    return {name: source_sha256(spec) for name, spec in KERNELS.items()}


def summarize(sets: tuple[str, ...]) -> RunSummary:
    """The run as the artifacts on disk tell it: results for ``sets``, the cells of all
    sealed sets and ``sets``, the kernels' hashes, the duplicate bodies and schema drift."""
    sources = kernel_sources()
    tests = read_present(config.TESTS_JSON, KernelTestRun)
    if tests is None:
        raise ArtifactError(f"{rel(config.TESTS_JSON)}: missing; the kernels' tests did not run")
    if tests.errors:
        raise ArtifactError(f"{rel(config.TESTS_JSON)}: the kernels' tests could not be collected: {tests.errors[0]}")
    universe = select_sets(tuple(dict.fromkeys((*config.VERIFY_SETS, *sets))))
    results = collect(sources, config.ARCHS, {s: universe[s] for s in sets}, tests)
    states, counted, evidence = [], [], {}
    for kernel, source in sources.items():
        emitted = read_present(config.emit_json(kernel), EmitResult)
        current = emitted is not None and emitted.source_sha256 == source
        states.append(KernelState(kernel=kernel, source_sha256=source,
                                  ptx_sha256=emitted.ptx_sha256 if current else "(not emitted)"))
        report = read_present(config.sass_json(kernel), SassReport) if current else None
        if report is not None and report.ptx_sha256 == emitted.ptx_sha256:
            counted.append(report)
        if current:
            evidence[kernel] = evidence_of(kernel, emitted, universe, sets, tests,
                                           current_figures(counted).get(kernel))
    return RunSummary(cells=cells(sources, config.ARCHS, universe), results=results,
                      kernels=states, duplicates=find_duplicates(), schema_drift=drift(),
                      sass=current_figures(counted), evidence=evidence)
