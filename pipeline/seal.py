"""Seals: ledger/seals/<kernel>.json pins what was verified, by content.

A seal records the kernel's source hash (its module and the kernels/ modules it
imports: pipeline.sources), its PTX
sha256 and size, ptxas figures per arch, the SASS per IMMA and LSU per IMMA of its loop
bodies per arch (pipeline.sass_ratchet), the verify evidence of every shape of the
sealed sets, and the counts of the kernel's own tests. It is stale as soon as the
current source or PTX hash differs, so nothing verified can change silently.

Sealing refuses, and writes nothing, unless every shape of the sealed sets passed
verify on the current PTX, the ptxas and SASS reports are of the current PTX, and none of the
kernel's tests failed. ``sealed_at`` is information: a re-seal of unchanged evidence
leaves the file as it was.
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from pipeline.artifacts import check_artifact, read_committed, read_model, rel, write_model
from pipeline.config import SEALS_DIR, emit_json, ptx_path, ptxas_json, sass_json, verify_json
from pipeline.errors import ArtifactError, SealRefused
from pipeline.results import verify_results
from pipeline.sass import SassReport
from pipeline.sass_ratchet import current_figures
from pipeline.models import (
    EmitResult, KernelState, KernelTestRun, PtxasReport, Seal, SealedShape, SealedVerify, Shape,
    TestCounts, VerifyReport,
)

def seal_path(kernel: str, folder: Path = SEALS_DIR) -> Path:
    return Path(folder) / f"{kernel}.json"


def build_seal(kernel: str, source_sha256: str, sets: dict[str, tuple[Shape, ...]],
               tests: KernelTestRun) -> Seal:
    """The seal of ``kernel`` from the artifacts of its current source; raises
    :class:`SealRefused` naming the first thing that is missing or did not pass."""
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
    return Seal(
        kernel=kernel, source_sha256=source_sha256, ptx_sha256=emitted.ptx_sha256,
        ptx_bytes=emitted.ptx_bytes, ptxas_version=ptxas.ptxas_version, ptxas=ptxas.archs,
        verify=SealedVerify(
            backend=first.backend if first else "emulator", device=first.device if first else "none",
            driver=first.driver if first else None,
            shapes=[SealedShape(shape_set=r.shape_set, shape=r.shape, R=r.R, K=r.K, N=r.N,
                                mismatches=r.mismatches, rows_checked=r.rows_checked) for r in reports],
        ),
        tests=counts or TestCounts.model_validate(dict.fromkeys(TestCounts.model_fields, 0)),
        sass=current_figures([counted]).get(kernel, {}),
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
    """Every seal in ``folder`` by kernel; :class:`ArtifactError` when one is unreadable
    or names another kernel than its file."""
    seals = {}
    for path in sorted(Path(folder).glob("*.json")):
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
