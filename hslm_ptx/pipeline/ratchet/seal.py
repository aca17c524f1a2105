"""Seals: ledger/seals/<kernel>.json pins what was verified, by content.

A seal records the kernel's source hash (its module and the hslm_ptx modules it
imports: hslm_ptx.pipeline.core.sources), its PTX
sha256 and size, ptxas figures per arch, the SASS per IMMA and LSU per IMMA of its loop
bodies per arch (hslm_ptx.pipeline.ratchet.sass_ratchet), the verify evidence of every shape of the
sealed sets, the counts of the kernel's own tests and the sha256 of each test file they
are in. It is stale as soon as the current source or PTX hash differs, so nothing
verified can change silently; :func:`mismatches` compares every other sealed figure with
what the gate's run produced (hslm_ptx.pipeline.ratchet.results.evidence_of), so a seal edited by hand,
copied from another kernel, or of other shapes or tests is red too. :func:`read_seals`
refuses a seal that is a link or a folder.

Sealing refuses, and writes nothing, unless every shape of the sealed sets passed
verify on the current PTX, the ptxas and SASS reports are of the current PTX, and none of the
kernel's tests failed. ``sealed_at`` is information: a re-seal of unchanged evidence
leaves the file as it was.
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from hslm_ptx.pipeline.core.artifacts import check_artifact, read_committed, read_model, write_model

from hslm_ptx.pipeline.core.files import rel
from hslm_ptx.pipeline.core.config import SEALS_DIR, emit_json, ptx_path, ptxas_json, sass_json, verify_json
from hslm_ptx.pipeline.core.errors import ArtifactError, SealRefused
from hslm_ptx.pipeline.ratchet.results import hashes_of_test_files, verify_results
from hslm_ptx.pipeline.stages.sass import SassReport
from hslm_ptx.pipeline.ratchet.sass_ratchet import current_figures, flat
from hslm_ptx.pipeline.core.models import (EmitResult, KernelState, KernelTestRun, PtxasReport, Seal, SealEvidence,
                                           SealedShape, SealedVerify, Shape, TestCounts, VerifyReport)

def seal_path(kernel: str, folder: Path = SEALS_DIR) -> Path:
    return Path(folder) / f"{kernel}.json"


def build_seal(kernel: str, source_sha256: str, sets: dict[str, tuple[Shape, ...]],
               tests: KernelTestRun, previous: Seal | None = None) -> Seal:
    """The seal of ``kernel`` from the artifacts of its current source; raises
    :class:`SealRefused` naming the first thing that is missing or did not pass.

    GPU evidence is kept per arch: verify reports from a GPU go in ``gpu[<arch>]`` beside
    what ``previous`` (the seal on disk) holds for the other archs of the same PTX, and
    ``verify`` stays the previous seal's when it is of this PTX; so an sm_90 run and an
    sm_89 run, sealed one after the other on their own machines, are both in the seal,
    and the emulator's evidence CI re-checks is not replaced by either. A new PTX drops
    every arch's evidence: it was of other bytes."""
    emitted = read_model(emit_json(kernel), EmitResult)
    if emitted.source_sha256 != source_sha256:
        raise SealRefused(f"seal {kernel}: {rel(emit_json(kernel))} is older than the source; run doit emit")
    check_artifact(ptx_path(kernel), emitted.ptx_sha256)
    ptxas = read_model(ptxas_json(kernel), PtxasReport)
    if ptxas.ptx_sha256 != emitted.ptx_sha256:
        raise SealRefused(f"seal {kernel}: {rel(ptxas_json(kernel))} is of other PTX; run doit ptxas")
    counted = read_model(sass_json(kernel), SassReport)
    if counted.ptx_sha256 != emitted.ptx_sha256:
        raise SealRefused(f"seal {kernel}: {rel(sass_json(kernel))} is of other PTX; run doit sass")
    for cell in verify_results(kernel, sets, emitted):
        if cell.verdict != "pass":
            raise SealRefused(f"seal {kernel}: verify {cell.target} did not pass: {cell.blocker}")
    reports = [read_model(verify_json(kernel, s, shape.name), VerifyReport)
               for s, shapes in sets.items() for shape in shapes]
    runs = sorted({(r.backend, r.device, r.driver or "") for r in reports})
    if len(runs) > 1:
        raise SealRefused(f"seal {kernel}: verify reports mix backends/devices {runs}; "
                          f"re-run doit verify on one backend")
    if tests.errors:
        raise SealRefused(f"seal {kernel}: kernel tests could not be collected: {tests.errors[0]}")
    counts = tests.kernels.get(kernel)
    if counts is not None and counts.failed:
        raise SealRefused(f"seal {kernel}: {tests.failures.get(kernel, f'{counts.failed} tests failed')}")
    first = reports[0] if reports else None
    same_ptx = previous is not None and previous.ptx_sha256 == emitted.ptx_sha256
    ran = SealedVerify(
        backend=first.backend if first else "emulator", device=first.device if first else "none",
        driver=first.driver if first else None, node=first.node if first and first.backend == "gpu" else "",
        shapes=[SealedShape(shape_set=r.shape_set, shape=r.shape, R=r.R, K=r.K, N=r.N,
                            mismatches=r.mismatches, rows_checked=r.rows_checked) for r in reports],
    )
    gpu = dict(previous.gpu) if same_ptx else {}
    if first is not None and first.backend == "gpu":
        if not first.arch:
            raise SealRefused(f"seal {kernel}: {rel(verify_json(kernel, first.shape_set, first.shape))} "
                              "names no arch; re-run doit verify backend=gpu")
        gpu[first.arch] = ran
        if same_ptx:
            ran = previous.verify
    return Seal(
        kernel=kernel, source_sha256=source_sha256, ptx_sha256=emitted.ptx_sha256,
        ptx_bytes=emitted.ptx_bytes, ptxas_version=ptxas.ptxas_version, ptxas=ptxas.archs, verify=ran,
        tests=counts or TestCounts.model_validate(dict.fromkeys(TestCounts.model_fields, 0)),
        test_files=hashes_of_test_files(tests.files.get(kernel, [])),
        sass=current_figures([counted]).get(kernel, {}), gpu=dict(sorted(gpu.items())),
        sealed_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def write_seal(seal: Seal, folder: Path = SEALS_DIR) -> bool:
    """Write ``seal`` unless the file already holds the same evidence; True when written."""
    path = seal_path(seal.kernel, folder)
    old = read_model(path, Seal) if path.exists() else None
    if old is not None and old.model_dump(exclude={"sealed_at"}) == seal.model_dump(exclude={"sealed_at"}):
        return False
    write_model(path, seal)
    return True


def read_seals(folder: Path = SEALS_DIR) -> dict[str, Seal]:
    """Every seal in ``folder`` by kernel; :class:`ArtifactError` when one is unreadable,
    is not a regular file inside the project (a link, a folder), or names another kernel
    than its file."""
    seals = {}
    folder = Path(folder)
    if folder.is_symlink():
        raise ArtifactError(f"{rel(folder)}: a link; the seals are committed files in the project: git checkout it")
    for path in sorted(folder.glob("*.json")):
        if path.is_symlink() or not path.is_file() or not path.resolve().is_relative_to(folder.resolve()):
            raise ArtifactError(f"{rel(path)}: not a regular file inside the project (a link or a folder); "
                                f"a seal is the file doit seal writes: remove it and run doit seal, or git checkout it")
        seal = read_committed(path, Seal)
        if seal.kernel != path.stem:
            raise ArtifactError(f"{rel(path)}: field 'kernel': '{seal.kernel}' in the seal of '{path.stem}'")
        seals[seal.kernel] = seal
    return seals


def stale(seal: Seal, state: KernelState) -> list[str]:
    """What differs between a seal and the kernel now (empty: the seal holds)."""
    return [f"{what} changed ({getattr(seal, field)[:12]} -> {getattr(state, field)[:12]})"
            for what, field in (("source", "source_sha256"), ("PTX", "ptx_sha256"))
            if getattr(seal, field) != getattr(state, field)]


# --- the sealed evidence against the gate's own run ---------------------------------------

Mismatch = tuple[str, str, str]  # (field, sealed, now)
PTXAS_FIGURES = ("registers", "spill_stores", "spill_loads", "shared_bytes", "stack_bytes")
SHAPE_FIGURES = ("R", "K", "N")
ROW_FIGURES = ("mismatches", "rows_checked")


def _shown(value: object) -> str:
    if isinstance(value, str) and len(value) == 64:  # a sha256
        return value[:12]
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _keyed(field: str, sealed: dict, now: dict) -> list[Mismatch]:
    """One mismatch per key of two flat dicts whose value differs or that one lacks."""
    return [(f"{field} {key}", _shown(sealed.get(key, "(absent)")), _shown(now.get(key, "(absent)")))
            for key in sorted(set(sealed) | set(now), key=str) if sealed.get(key) != now.get(key)]


def _shape_rows(shapes: list[SealedShape], figures: tuple[str, ...]) -> dict[str, object]:
    return {f"{s.shape_set}/{s.shape} {f}": getattr(s, f) for s in shapes for f in figures}


def _sass_rows(levels: dict) -> dict[str, float]:
    return {f"{arch} {name}": value for arch, level in levels.items() for name, value in flat(level).items()}


def mismatches(seal: Seal, now: SealEvidence) -> list[Mismatch]:
    """Every sealed figure that differs from what the gate's run produced, field by field:
    the PTX size and ptxas version, ptxas figures per arch, the sealed sets' shapes (name,
    R, K, N) against shapes.yaml, mismatches and rows checked of every verify report the
    run read, the verify backend, the test counts, the hash of every test file, the SASS
    figures. Empty: the seal is of what just ran."""
    found: list[Mismatch] = []
    if now.ptx_bytes is not None and now.ptx_bytes != seal.ptx_bytes:
        found.append(("ptx_bytes", str(seal.ptx_bytes), str(now.ptx_bytes)))
    if now.ptxas_version is not None and now.ptxas_version != seal.ptxas_version:
        found.append(("ptxas_version", seal.ptxas_version, now.ptxas_version))
    if now.ptxas is not None:
        found += _keyed("ptxas", {f"{a.arch} {f}": getattr(a, f) for a in seal.ptxas for f in PTXAS_FIGURES},
                        {f"{a.arch} {f}": getattr(a, f) for a in now.ptxas for f in PTXAS_FIGURES})
    if now.defined:
        found += _keyed("shape", _shape_rows(seal.verify.shapes, SHAPE_FIGURES), _shape_rows(now.defined, SHAPE_FIGURES))
    against = seal.gpu.get(now.arch, seal.verify) if now.arch else seal.verify  # a GPU run: its arch's evidence
    if now.verify:
        ran = {f"{s.shape_set}/{s.shape}" for s in now.verify}
        sealed = [s for s in against.shapes if f"{s.shape_set}/{s.shape}" in ran]
        found += _keyed("verify", _shape_rows(sealed, ROW_FIGURES), _shape_rows(now.verify, ROW_FIGURES))
    if now.runs:
        sealed_run = (against.backend, against.device, against.driver)
        if [tuple(r) for r in now.runs] != [sealed_run]:
            found.append(("verify backend", "/".join(map(_shown, sealed_run)),
                          ", ".join("/".join(map(_shown, r)) for r in now.runs)))
    if now.tests is not None:
        found += _keyed("tests", seal.tests.model_dump(), now.tests.model_dump())
    if now.test_files is not None:
        found += _keyed("test file", seal.test_files, now.test_files)
    if now.sass is not None:
        found += _keyed("sass", _sass_rows(seal.sass), _sass_rows(now.sass))
    return found
