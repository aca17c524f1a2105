"""Seals: built only from passing evidence of the current source/PTX, stale when either moves."""
from __future__ import annotations

import pytest
from artifactcases import SHAPES

from hslm_ptx.pipeline.core.errors import ArtifactError, SealRefused
from hslm_ptx.pipeline.core.models import KernelState, KernelTestRun, TestCounts
from hslm_ptx.pipeline.ratchet.seal import build_seal, read_seals, seal_path, stale, write_seal

COUNTS = TestCounts(passed=3, failed=0, skipped=1, total=4, vacuous=0, invariants=1)
TESTS = KernelTestRun(exitstatus=0, kernels={"k": COUNTS})


def test_seal_pins_hashes_ptxas_verify_and_test_counts(fake_artifacts, tmp_path):
    emitted = fake_artifacts.all_pass("k")
    seal = build_seal("k", "src", SHAPES, TESTS)
    assert (seal.source_sha256, seal.ptx_sha256, seal.ptx_bytes) == ("src", emitted.ptx_sha256, emitted.ptx_bytes)
    assert [a.arch for a in seal.ptxas] == ["sm_80", "sm_90"] and seal.ptxas_version == "12.9"
    assert seal.verify.backend == "emulator" and seal.verify.device == "cpu-emulator"
    assert [(s.shape_set, s.shape, s.mismatches, s.rows_checked) for s in seal.verify.shapes] == [
        ("smoke", "tiny", 0, 4), ("smoke", "tail", 0, 3)]
    assert seal.tests == COUNTS
    assert {a: (l.fast.sass_per_imma, l.fast.lsu_per_imma, l.tail.sass_per_imma, l.tail.lsu_per_imma)
            for a, l in seal.sass.items()} == {"sm_80": (10.5, 2.0, 21.0, 4.0), "sm_90": (10.5, 2.0, 21.0, 4.0)}
    folder = tmp_path / "seals"
    assert write_seal(seal, folder) is True
    again = build_seal("k", "src", SHAPES, TESTS).model_copy(update={"sealed_at": "later"})
    assert write_seal(again, folder) is False  # same evidence: the file (and its sealed_at) stay
    assert read_seals(folder) == {"k": seal}


@pytest.mark.parametrize("damage, message", [
    (lambda fa, e: fa.verify(e, "smoke", SHAPES["smoke"][1], mismatches=2), "verify smoke/tail did not pass: .*2 mismatches"),
    (lambda fa, e: fa.verify(e, "smoke", SHAPES["smoke"][0], error="EmulatorError: race"), "verify smoke/tiny did not pass: .*race"),
    (lambda fa, e: fa.verify(e, "smoke", SHAPES["smoke"][0], ptx_sha256="0" * 64), "smoke/tiny did not pass: no verify report for the current PTX"),
    (lambda fa, e: fa.ptxas(e.model_copy(update={"ptx_sha256": "0" * 64})), "is of other PTX; run doit ptxas"),
    (lambda fa, e: fa.sass(e, ptx_sha256="0" * 64), "k.json is of other PTX; run doit sass"),
    (lambda fa, e: fa.emit("k", source="older"), "older than the source; run doit emit"),
    (lambda fa, e: fa.verify(e, "smoke", SHAPES["smoke"][0], backend="gpu"), "mix backends"),
])
def test_seal_refuses_and_writes_nothing(fake_artifacts, tmp_path, damage, message):
    damage(fake_artifacts, fake_artifacts.all_pass("k"))
    with pytest.raises(SealRefused, match=message):
        build_seal("k", "src", SHAPES, TESTS)
    assert not seal_path("k", tmp_path / "seals").exists()


def test_gpu_evidence_is_kept_per_arch_and_dropped_with_the_ptx(fake_artifacts, tmp_path):
    emitted = fake_artifacts.all_pass("k")
    on_emulator = build_seal("k", "src", SHAPES, TESTS)
    assert on_emulator.gpu == {}
    fake_artifacts.verified(emitted, "gpu", "sm_90")
    h200 = build_seal("k", "src", SHAPES, TESTS, on_emulator)
    assert h200.verify == on_emulator.verify  # the emulator evidence CI re-checks stays
    assert sorted(h200.gpu) == ["sm_90"] and h200.gpu["sm_90"].device == "H200"
    assert h200.gpu["sm_90"].node == "node-sm_90" and [s.rows_checked for s in h200.gpu["sm_90"].shapes] == [4, 3]
    fake_artifacts.verified(emitted, "gpu", "sm_89")
    both = build_seal("k", "src", SHAPES, TESTS, h200)  # sealed on the sm_89 machine with the sm_90 seal checked out
    assert sorted(both.gpu) == ["sm_89", "sm_90"] and both.gpu["sm_90"] == h200.gpu["sm_90"]
    assert both.gpu["sm_89"].device == "RTX 4090" and both.verify == on_emulator.verify
    fake_artifacts.verified(emitted)  # back on the emulator: the GPU evidence of this PTX stays
    assert build_seal("k", "src", SHAPES, TESTS, both).gpu == both.gpu
    moved = fake_artifacts.all_pass("k", ptx="// other ptx\n")
    again = build_seal("k", "src", SHAPES, TESTS, both)
    assert again.ptx_sha256 == moved.ptx_sha256 and again.gpu == {}  # of other bytes: every arch's is gone
    fake_artifacts.verified(moved, "gpu", "sm_90")
    first = build_seal("k", "src", SHAPES, TESTS, both)  # GPU first on new PTX: its run is the seal's verify too
    assert first.verify.backend == "gpu" and sorted(first.gpu) == ["sm_90"]
    fake_artifacts.verify(moved, "smoke", SHAPES["smoke"][0], backend="gpu", arch=None)
    with pytest.raises(SealRefused, match="names no arch"):
        build_seal("k", "src", SHAPES, TESTS, both)


def test_seal_refuses_failed_or_uncollectable_tests(fake_artifacts):
    fake_artifacts.all_pass("k")
    failing = KernelTestRun(exitstatus=1, kernels={"k": COUNTS.model_copy(update={"failed": 1})},
                            failures={"k": "tests/test_k.py::test_x: assert 1 == 2"})
    with pytest.raises(SealRefused, match="test_x: assert 1 == 2"):
        build_seal("k", "src", SHAPES, failing)
    with pytest.raises(SealRefused, match="could not be collected"):
        build_seal("k", "src", SHAPES, KernelTestRun(exitstatus=2, kernels={}, errors=["tests/x.py: ImportError"]))


def test_stale_when_source_or_ptx_changes(fake_artifacts):
    fake_artifacts.all_pass("k")
    seal = build_seal("k", "src", SHAPES, TESTS)
    same = KernelState(kernel="k", source_sha256="src", ptx_sha256=seal.ptx_sha256)
    assert stale(seal, same) == []
    assert stale(seal, same.model_copy(update={"source_sha256": "edited"})) == ["source changed (src -> edited)"]
    assert stale(seal, same.model_copy(update={"ptx_sha256": "f" * 64}))[0].startswith("PTX changed")


def test_unreadable_seals(fake_artifacts, tmp_path):
    fake_artifacts.all_pass("k")
    folder = tmp_path / "seals"
    write_seal(build_seal("k", "src", SHAPES, TESTS), folder)
    (folder / "other.json").write_text((folder / "k.json").read_text())
    with pytest.raises(ArtifactError, match="'k' in the seal of 'other'"):
        read_seals(folder)
    (folder / "other.json").write_text("{ not json")
    with pytest.raises(ArtifactError, match="unreadable JSON"):
        read_seals(folder)
