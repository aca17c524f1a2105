"""The gate's green world (tests/test_gate.py and the modules that run gate.main on it):
two invented kernels whose every cell is as the ledger says (one blocked, inside the
cap), each sealed at its current hashes, the SASS figures at the ledger's levels, the
one duplicate allowed; and :func:`green_world`, that world written to files gate.main
reads (the ``world`` fixture of tests/conftest.py).

Here rather than in tests/test_gate.py, so the modules that need the world import no
test module."""
from __future__ import annotations

from pathlib import Path

import pytest

from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.ratchet import gate
from hslm_ptx.pipeline.core.artifacts import write_model
from hslm_ptx.pipeline.ratchet.ledger import dump_ledger, make_ledger
from hslm_ptx.pipeline.core.models import (AllowedDuplicate, AllowedDuplicates, CellResult, DuplicateGroup, FunctionRef,
                                           KernelState, PtxasArch, RunSummary, SassEntry, SassFigures, SassLevel, Seal,
                                           SealedShape, SealedVerify, SealEvidence, Shape, TestCounts)
from hslm_ptx.pipeline.ratchet.results import cells
from hslm_ptx.pipeline.ratchet import stores
from hslm_ptx.pipeline.ratchet.layer_ratchet import dump_layer_ledger
from hslm_ptx.pipeline.core.layer_records import LayerCounts, LayerLedger, LayerLevel

KERNELS = ("kern_a", "kern_b")
UNIVERSE = cells(KERNELS, ("sm_80", "sm_90"), {"smoke": (Shape(name="tiny", R=1, K=1, N=1),)})
BLOCKED = ("kern_b", "ptxas", "sm_90")
TINY = ("kern_a", "verify", "smoke/tiny")
ARCHS = ("sm_80", "sm_90")
LEVEL = SassLevel(fast=SassFigures(sass_per_imma=10.0, lsu_per_imma=2.0),
                  tail=SassFigures(sass_per_imma=21.5, lsu_per_imma=4.75))
SLOWER = LEVEL.model_copy(update={"fast": SassFigures(sass_per_imma=11.0, lsu_per_imma=2.0)})
FASTER = LEVEL.model_copy(update={"tail": SassFigures(sass_per_imma=21.5, lsu_per_imma=4.5)})


def ref(path: str, qualname: str, line: int = 1) -> FunctionRef:
    return FunctionRef(path=path, qualname=qualname, line=line)


ALLOWED_PAIR = DuplicateGroup(members=[ref("hslm_ptx/x.py", "f"), ref("hslm_ptx/pipeline/y.py", "g")])
COPY = DuplicateGroup(members=[ref("hslm_ptx/arrays.py", "scale", 10), ref("hslm_ptx/pipeline/bench/run.py", "scale", 20)])


def result(key, verdict="pass") -> CellResult:
    blocked = verdict != "pass"
    return CellResult(kernel=key[0], check=key[1], target=key[2], verdict=verdict,
                      blocker="ptxas fatal : Unsupported .version 9.0" if blocked else None,
                      reason="ptxas-version" if blocked else None)


def seal(kernel: str, ptx: str = "p") -> Seal:
    return Seal(
        kernel=kernel, source_sha256=f"s-{kernel}", ptx_sha256=f"{ptx}-{kernel}", ptx_bytes=10, ptxas_version="12.9",
        ptxas=[PtxasArch(arch=a, registers=40, spill_stores=0, spill_loads=0, shared_bytes=0, stack_bytes=0)
               for a in config.ARCHS],
        verify=SealedVerify(backend="emulator", device="cpu-emulator", shapes=[
            SealedShape(shape_set="smoke", shape="tiny", R=1, K=1, N=1, mismatches=0, rows_checked=1)]),
        tests=TestCounts(passed=2, failed=0, skipped=0, total=2, vacuous=0, invariants=1),
        sass={a: LEVEL for a in config.ARCHS}, gpu={a: gpu_verify(a) for a in config.GPU_EVIDENCE_ARCHS},
        sealed_at="2025-01-01")


def gpu_verify(arch: str, **shape) -> SealedVerify:
    """The sealed set verified on a GPU of ``arch`` (``shape``: a change to its one shape's row)."""
    return SealedVerify(backend="gpu", device=f"GPU {arch}", driver="12.8", node=f"node-{arch}", shapes=[
        SealedShape(shape_set="smoke", shape="tiny", R=1, K=1, N=1, mismatches=0, rows_checked=1).model_copy(
            update=shape)])


def green() -> gate.Inputs:
    """A consistent world: every cell as the ledger says (one blocked, inside the cap),
    every kernel sealed at its current hashes, the SASS figures at the ledger's levels,
    the one duplicate allowed."""
    results = [result(k, "blocked" if k == BLOCKED else "pass") for k in UNIVERSE]
    run = RunSummary(cells=UNIVERSE, results=results, duplicates=[ALLOWED_PAIR],
                     kernels=[KernelState(kernel=k, source_sha256=f"s-{k}", ptx_sha256=f"p-{k}") for k in KERNELS],
                     sass={k: dict.fromkeys(ARCHS, LEVEL) for k in KERNELS})
    ledger = make_ledger(results, max_not_pass=1,
                         sass=[SassEntry(kernel=k, arch=a, level=LEVEL) for k in KERNELS for a in ARCHS])
    allowed = AllowedDuplicates(allowed=[AllowedDuplicate(functions=[m.name for m in ALLOWED_PAIR.members],
                                                          reason="kept apart on purpose")])
    seals = {k: seal(k) for k in KERNELS}
    run = run.model_copy(update={"evidence": {k: evidence_of(s) for k, s in seals.items()}})
    return gate.Inputs(run, ledger, seals, allowed)


def evidence_of(s: Seal) -> SealEvidence:
    """What a run that produced exactly this seal shows (the gate compares the two)."""
    return SealEvidence(ptx_bytes=s.ptx_bytes, ptxas_version=s.ptxas_version, ptxas=s.ptxas,
                        defined=s.verify.shapes, verify=s.verify.shapes,
                        runs=[(s.verify.backend, s.verify.device, s.verify.driver)], tests=s.tests,
                        test_files=s.test_files, sass=s.sass)


def green_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """gate.main() pointed at files in tmp_path holding the green world (the ``world``
    fixture of tests/conftest.py); returns their paths."""
    i = green()
    paths = {"ledger": tmp_path / "ledger.json", "seals": tmp_path / "seals", "allowed": tmp_path / "allowed.yaml",
             "counts": tmp_path / "loop_counts.json"}
    paths["ledger"].write_text(dump_ledger(i.ledger))
    for kernel, s in i.seals.items():
        write_model(paths["seals"] / f"{kernel}.json", s)
    paths["allowed"].write_text("allowed:\n  - functions: [hslm_ptx/x.py::f, hslm_ptx/pipeline/y.py::g]\n    reason: on purpose\n")
    for name, attr in (("ledger", "LEDGER_FILE"), ("seals", "SEALS_DIR"), ("allowed", "ALLOWED_FILE"), ("counts", "COUNTS_FILE")):
        monkeypatch.setattr(gate, attr, paths[name])
    monkeypatch.setattr(gate, "GATE_DIR", tmp_path / "gate")
    monkeypatch.setattr(gate, "summarize", lambda sets: i.run)
    return paths


# --- the committed stores (hslm_ptx.pipeline.ratchet.stores) -----------------------------------------

SHAPES_TEXT = "smoke:\n  - {name: tiny, R: 16, K: 32, N: 8}\n  - {name: wide, R: 64, K: 64, N: 64}\n"
CALIBRATION_TEXT = """points:
  - name: bf16-1024
    kind: gemm
    M: 1024
    N: 1024
    K: 1024
    published: 176.62
    source: "a thread: 'BF16: 1024x1024: 176.62 TFLOPS'"
  - name: int8-2048
    kind: gemm
    M: 2048
    N: 4096
    K: 8192
    published: 1320.31
    fit: true
    source: "sgl-kernel column: '8         2048.0    1.320993e+06          1.321196e+06'"
"""
STEP = LayerCounts(launches=6, host_syncs=0, h2d_copies=0, foreign_allocations=0, bytes_moved=1000)


def layer_text(level: LayerCounts = STEP, **extra) -> str:
    return dump_layer_ledger(LayerLedger(source_sha256="a" * 64, levels=[
        LayerLevel(shape_set="smoke", shape="tiny", level=level, **extra)]))


def snapshot(where: str = "", texts: dict | None = None, tests: tuple[str, ...] = ("tests/test_a.py",),
             pinned: bool = True) -> stores.Snapshot:
    """The stores at one point: the texts above unless ``texts`` replaces some, pinned as bless
    would pin them (``pinned``) or with the pins of the texts above (the store edited since)."""
    clean = {stores.SHAPES: SHAPES_TEXT, stores.CALIBRATION: CALIBRATION_TEXT, stores.COUNTS: None,
             stores.DEVICES: None, stores.LAYER: layer_text(), stores.PINS: None, stores.LEDGER: None}
    now = {**clean, **(texts or {})}
    pins = stores.StorePins(files={p: stores.digest(t) for p, t in (now if pinned else clean).items()
                                   if p in stores.PINNED and t is not None}, test_files=list(tests))
    return stores.Snapshot(where, now, tuple(tests), pins)
