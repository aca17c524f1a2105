"""A run's verdicts from the artifacts on disk: every cell, each stage's evidence classified."""
from __future__ import annotations

import pytest
from artifactcases import SHAPES

from hslm_ptx.pipeline.core.models import CellResult, KernelTestRun, TestCounts
from hslm_ptx.pipeline.ratchet.results import cells, collect

ARCHS = ("sm_80", "sm_90")


def counts(**kw: int) -> TestCounts:
    base = dict(passed=2, failed=0, skipped=0, total=2, vacuous=0, invariants=1)
    return TestCounts(**{**base, **kw})


def run_of(**per_kernel: TestCounts) -> KernelTestRun:
    return KernelTestRun(exitstatus=0, kernels=per_kernel)


def by_key(results: list[CellResult]) -> dict[tuple[str, str, str], CellResult]:
    return {r.key: r for r in results}


# --- collect -----------------------------------------------------------------------------

def test_collect_all_pass(fake_artifacts):
    fake_artifacts.all_pass("k")
    results = collect({"k": "src"}, ARCHS, SHAPES, run_of(k=counts()))
    assert [r.key for r in results] == cells(["k"], ARCHS, SHAPES)
    assert {r.verdict for r in results} == {"pass"}


def test_collect_verify_mismatch_error_and_stale_report(fake_artifacts):
    emitted = fake_artifacts.all_pass("k")
    tiny, tail = SHAPES["smoke"]
    fake_artifacts.verify(emitted, "smoke", tiny, mismatches=3)
    fake_artifacts.verify(emitted, "smoke", tail, error="EmulatorError: ptxemu: unsupported at line 9 `ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1}, [%r2];`")
    got = by_key(collect({"k": "src"}, ARCHS, SHAPES, run_of(k=counts())))
    assert got[("k", "verify", "smoke/tiny")].verdict == "fail"
    assert "3 mismatches" in got[("k", "verify", "smoke/tiny")].blocker
    assert (got[("k", "verify", "smoke/tail")].verdict, got[("k", "verify", "smoke/tail")].reason) == ("blocked", "emulator-gap")
    fake_artifacts.verify(emitted, "smoke", tiny, ptx_sha256="0" * 64)  # made from other PTX
    got = by_key(collect({"k": "src"}, ARCHS, SHAPES, run_of(k=counts())))
    assert got[("k", "verify", "smoke/tiny")].verdict == "fail"
    assert "no verify report for the current PTX" in got[("k", "verify", "smoke/tiny")].blocker


def test_collect_ptxas_problems_and_missing_report(fake_artifacts):
    emitted = fake_artifacts.all_pass("k")
    fake_artifacts.ptxas(emitted, problems={"sm_90": ["spills 8 bytes stores / 8 bytes loads"]})
    got = by_key(collect({"k": "src"}, ARCHS, SHAPES, run_of(k=counts())))
    assert got[("k", "ptxas", "sm_80")].verdict == "pass"
    assert (got[("k", "ptxas", "sm_90")].verdict, got[("k", "ptxas", "sm_90")].reason) == ("fail", "over-budget")

    fake_artifacts.ptxas(emitted, errors={"sm_90": "k.ptx (sm_90): ptxas fatal : Unsupported .version 9.9; current version is '8.8'"})
    got = by_key(collect({"k": "src"}, ARCHS, SHAPES, run_of(k=counts())))
    assert got[("k", "ptxas", "sm_80")].verdict == "pass"
    assert (got[("k", "ptxas", "sm_90")].verdict, got[("k", "ptxas", "sm_90")].reason) == ("blocked", "ptxas-version")
    assert got[("k", "ptxas", "sm_90")].blocker.endswith("current version is '8.8'")
    fake_artifacts.emit("k", ptx="// changed\n")  # the PTX moved on: the report is of the old one
    got = by_key(collect({"k": "src"}, ARCHS, SHAPES, run_of(k=counts())))
    assert {got[("k", "ptxas", a)].verdict for a in ARCHS} == {"fail"}
    assert "no ptxas figures for the current PTX" in got[("k", "ptxas", "sm_80")].blocker


def test_collect_source_newer_than_emit_fails_every_stage_cell(fake_artifacts):
    fake_artifacts.all_pass("k", source="old")
    got = collect({"k": "new"}, ARCHS, SHAPES, run_of(k=counts()))
    assert {r.verdict for r in got if r.check != "tests"} == {"fail"}
    assert all("run doit emit" in r.blocker for r in got if r.check != "tests")


@pytest.mark.parametrize("run, verdict, reason", [
    (run_of(k=counts()), "pass", None),
    (run_of(k=counts(vacuous=1)), "pass_vacuous", "vacuous-test"),
    (run_of(k=counts(passed=1, failed=1)), "fail", None),
    (run_of(k=counts(passed=0, skipped=2)), "blocked", "not-run"),
    (run_of(), "blocked", "no-tests"),
    (None, "fail", None),
])
def test_tests_cell(fake_artifacts, run, verdict, reason):
    fake_artifacts.all_pass("k")
    got = by_key(collect({"k": "src"}, ARCHS, SHAPES, run))[("k", "tests", "tests")]
    assert (got.verdict, got.reason) == (verdict, reason)
    assert (got.blocker is None) == (verdict == "pass")


# --- the gate's evidence, in a seal's terms ------------------------------------------------

def test_a_fresh_seal_matches_the_evidence_of_the_same_artifacts(fake_artifacts, monkeypatch):
    """build_seal and the gate's evidence_of read the same artifacts: no field differs, until one does."""
    from hslm_ptx.pipeline.core import config
    from hslm_ptx.pipeline.core.artifacts import read_model
    from hslm_ptx.pipeline.ratchet.results import evidence_of
    from hslm_ptx.pipeline.stages.sass import SassReport
    from hslm_ptx.pipeline.ratchet.sass_ratchet import current_figures
    from hslm_ptx.pipeline.ratchet.seal import build_seal, mismatches

    monkeypatch.setattr(config, "VERIFY_SETS", ("smoke",))
    emitted = fake_artifacts.all_pass("k")
    tests = KernelTestRun(exitstatus=0, kernels={"k": counts()}, files={"k": ["tests/test_results.py"]})
    seal = build_seal("k", "src", SHAPES, tests)
    assert seal.test_files["tests/test_results.py"] != "(missing)"

    def now(sets=SHAPES):
        figures = current_figures([read_model(config.sass_json("k"), SassReport)])["k"]
        return evidence_of("k", emitted, sets, ("smoke",), tests, figures)

    assert mismatches(seal, now()) == []
    tiny, tail = SHAPES["smoke"]
    fake_artifacts.verify(emitted, "smoke", tiny, mismatches=2)
    assert [f for f, _, _ in mismatches(seal, now())] == ["verify smoke/tiny mismatches"]
    fake_artifacts.verify(emitted, "smoke", tiny)
    shrunk = {"smoke": (tiny.model_copy(update={"R": 2}), tail)}
    assert [f for f, _, _ in mismatches(seal, now(shrunk))] == ["shape smoke/tiny R"]
    fake_artifacts.ptxas(emitted, archs=("sm_80",))
    assert {f for f, _, _ in mismatches(seal, now())} >= {"ptxas sm_90 registers"}
