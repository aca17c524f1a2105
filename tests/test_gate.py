"""The gate as a ratchet's own suite: a green control, every finding planted once and
found exactly, each rule shown necessary (remove it and its planted case passes),
unreadable input -> exit 2, and doit passing the exit status through."""
from __future__ import annotations

import pytest

from gatecases import (ALLOWED_PAIR, BLOCKED, CALIBRATION_TEXT, COPY, FASTER, LEVEL, SHAPES_TEXT, SLOWER, STEP, TINY,
                       evidence_of, gpu_verify, green, layer_text, result, seal, snapshot)

from hslm_ptx.pipeline.ratchet import gate, stores
from hslm_ptx.pipeline.ratchet.findings import Kind
from hslm_ptx.pipeline.core.artifacts import write_model
from hslm_ptx.pipeline.core.errors import ArtifactError
from hslm_ptx.pipeline.ratchet.ledger import dump_ledger, make_ledger
from hslm_ptx.pipeline.core.models import CellResult, SassEntry, SassFigures, SassLevel


def with_evidence(i: gate.Inputs, kernel: str = "kern_a", **update) -> gate.Inputs:
    """The world with what the run shows of ``kernel`` changed (the seal stays as it was)."""
    now = i.run.evidence[kernel].model_copy(update=update)
    return i._replace(run=i.run.model_copy(update={"evidence": {**i.run.evidence, kernel: now}}))


def base_where_blocked_passed(i: gate.Inputs) -> gate.Inputs:
    """A base ledger in which the blocked cell still passed: the blocked entry is a loosening
    since then, with the reason and blocker bless recorded."""
    base = make_ledger([result(e.key) for e in i.ledger.entries], i.ledger.max_not_pass, i.ledger.sass)
    return i._replace(base=base, base_ref="HEAD~1")


def with_seal(i: gate.Inputs, kernel: str = "kern_a", forged: bool = False, **update) -> gate.Inputs:
    """The world with one seal's evidence changed (``update`` applies to the seal's parts): as
    the run showed it, or ``forged`` (the run showed what the seal had before)."""
    s = i.seals[kernel]
    parts = {"ptxas": [a.model_copy(update=update.get("ptxas", {})) if a.arch == "sm_90" else a for a in s.ptxas],
             "verify": s.verify.model_copy(update={"shapes": [
                 sh.model_copy(update=update.get("shape", {})) for sh in s.verify.shapes]}),
             "tests": s.tests.model_copy(update=update.get("tests", {}))}
    changed = s.model_copy(update=parts)
    if not forged:
        i = i._replace(run=i.run.model_copy(update={"evidence": {**i.run.evidence, kernel: evidence_of(changed)}}))
    return i._replace(seals={**i.seals, kernel: changed})


def resealed(i: gate.Inputs, kernel: str = "kern_a", **fields) -> gate.Inputs:
    """The world with fields of one seal replaced, as a run that showed them would seal them."""
    changed = i.seals[kernel].model_copy(update=fields)
    run = i.run.model_copy(update={"evidence": {**i.run.evidence, kernel: evidence_of(changed)}})
    return i._replace(run=run, seals={**i.seals, kernel: changed})


def with_gpu(i: gate.Inputs, kernel: str = "kern_a", **gpu) -> gate.Inputs:
    """The world with one seal's GPU evidence replaced (arch -> SealedVerify; None drops the arch)."""
    s = i.seals[kernel]
    kept = {a: v for a, v in {**s.gpu, **gpu}.items() if v is not None}
    return i._replace(seals={**i.seals, kernel: s.model_copy(update={"gpu": kept})})


def gpu_run(i: gate.Inputs, arch: str, kernel: str = "kern_a", **shape) -> gate.Inputs:
    """The world in which this run verified ``kernel`` on a GPU of ``arch`` (its rows changed by ``shape``)."""
    ran = gpu_verify(arch, **shape)
    return with_evidence(i, kernel, verify=ran.shapes, runs=[(ran.backend, ran.device, ran.driver)], arch=arch)


def with_result(i: gate.Inputs, key, verdict: str) -> gate.Inputs:
    results = [result(key, verdict) if r.key == key else r for r in i.run.results]
    return i._replace(run=i.run.model_copy(update={"results": results}))


def with_entries(i: gate.Inputs, entries, cap=None) -> gate.Inputs:
    return i._replace(ledger=make_ledger(entries, i.ledger.max_not_pass if cap is None else cap, i.ledger.sass))


def with_counted(i: gate.Inputs, level: SassLevel | None, kernel="kern_a", arch="sm_90") -> gate.Inputs:
    """The world with one kernel x arch counted at ``level`` now (None: not counted)."""
    archs = {a: v for a, v in i.run.sass[kernel].items() if a != arch} | ({arch: level} if level else {})
    return i._replace(run=i.run.model_copy(update={"sass": {**i.run.sass, kernel: archs}}))


def with_sass_entry(i: gate.Inputs, entry: SassEntry | None, kernel="kern_a", arch="sm_90") -> gate.Inputs:
    """The world with the ledger's SASS entry for one kernel x arch replaced (None: removed)."""
    entries = [e for e in i.ledger.sass if e.key != (kernel, arch)] + ([entry] if entry else [])
    return i._replace(ledger=make_ledger(i.ledger.entries, i.ledger.max_not_pass, entries))


def accepted(i: gate.Inputs, reason="known-bug") -> gate.Inputs:
    """A rise to SLOWER on kern_a sm_90 that the ledger accepted with ``reason``."""
    entry = SassEntry(kernel="kern_a", arch="sm_90", level=SLOWER, reason=reason, rose_from=LEVEL)
    i = resealed(i, sass={**i.seals["kern_a"].sass, "sm_90": SLOWER})
    return with_counted(with_sass_entry(i, entry), SLOWER)


def replace_entry(i: gate.Inputs, key, **update) -> gate.Inputs:
    return with_entries(i, [e.model_copy(update=update) if e.key == key else e for e in i.ledger.entries])


# name -> (plant, the kind it must produce, the rule that must find it)
PLANTED = {
    "unexpected failure": (lambda i: with_result(i, TINY, "fail"), "UNEXPECTED FAILURE", gate.verdicts),
    "unexpected pass": (lambda i: with_result(i, BLOCKED, "pass"), "UNEXPECTED PASS", gate.verdicts),
    "no verdict": (lambda i: i._replace(run=i.run.model_copy(update={"results": i.run.results[1:]})),
                   "NOT RUN", gate.not_run),
    "unlisted": (lambda i: with_entries(i, [e for e in i.ledger.entries if e.key != TINY]), "UNLISTED", gate.unlisted),
    "stale entry": (lambda i: with_entries(i, [*i.ledger.entries, CellResult(
        kernel="kern_a", check="ptxas", target="sm_70", verdict="pass")]), "STALE", gate.stale_entries),
    "over cap": (lambda i: with_entries(i, i.ledger.entries, cap=0), "OVER CAP", gate.over_cap),
    "bad reason": (lambda i: replace_entry(i, BLOCKED, reason="flaky"), "BAD REASON", gate.bad_reasons),
    "missing blocker": (lambda i: replace_entry(i, BLOCKED, blocker=None), "BAD REASON", gate.bad_reasons),
    "reason on a pass": (lambda i: replace_entry(i, TINY, reason="no-gpu"), "BAD REASON", gate.bad_reasons),
    "stale seal": (lambda i: i._replace(seals={**i.seals, "kern_a": seal("kern_a", ptx="old")}), "STALE SEAL", gate.seals),
    "seal of a gone kernel": (lambda i: i._replace(seals={**i.seals, "gone": seal("gone")}), "STALE SEAL", gate.seals),
    "unsealed": (lambda i: i._replace(seals={"kern_b": i.seals["kern_b"]}), "UNSEALED", gate.seals),
    "seal claims spills": (lambda i: with_seal(i, ptxas={"spill_stores": 8, "spill_loads": 8}), "BAD SEAL",
                           gate.sealed_evidence),
    "seal over budget": (lambda i: with_seal(i, ptxas={"registers": 255}), "BAD SEAL", gate.sealed_evidence),
    "seal lacks an arch": (lambda i: resealed(i, ptxas=i.seals["kern_a"].ptxas[:1]), "BAD SEAL",
                           gate.sealed_evidence),
    "seal with 7 mismatches": (lambda i: with_seal(i, shape={"mismatches": 7}), "BAD SEAL", gate.sealed_evidence),
    "seal with 0 rows checked": (lambda i: with_seal(i, shape={"rows_checked": 0}), "BAD SEAL", gate.sealed_evidence),
    "seal lacks a verify cell": (lambda i: resealed(i, verify=i.seals["kern_a"].verify.model_copy(
        update={"shapes": []})), "BAD SEAL", gate.sealed_evidence),
    "seal with 5 failed tests": (lambda i: with_seal(i, tests={"failed": 5, "total": 7}), "BAD SEAL", gate.sealed_evidence),
    "seal with a vacuous test": (lambda i: with_seal(i, tests={"vacuous": 1}), "BAD SEAL", gate.sealed_evidence),
    "seal with no passing test": (lambda i: with_seal(i, tests={"passed": 0, "skipped": 2}), "BAD SEAL",
                                  gate.sealed_evidence),
    "schema drift": (lambda i: i._replace(run=i.run.model_copy(update={
        "schema_drift": ["schemas/Seal.json: differs from hslm_ptx.pipeline.core.models.Seal"]})), "SCHEMA DRIFT", gate.schemas),
    "duplicate body": (lambda i: i._replace(run=i.run.model_copy(update={"duplicates": [ALLOWED_PAIR, COPY]})),
                       "DUPLICATE BODY", gate.duplicates),
    "stale allowance": (lambda i: i._replace(run=i.run.model_copy(update={"duplicates": []})), "STALE", gate.duplicates),
    "seal lacks SASS figures": (lambda i: resealed(i, sass={}), "BAD SEAL", gate.sealed_evidence),
    "sass slower": (lambda i: with_counted(i, SLOWER), "SLOWER", gate.sass_levels),
    "sass faster": (lambda i: with_counted(i, FASTER), "FASTER", gate.sass_levels),
    "sass not counted": (lambda i: with_counted(i, None), "MISSING", gate.sass_levels),
    "sass not in the ledger": (lambda i: with_sass_entry(i, None), "MISSING", gate.sass_levels),
    "sass rise accepted with a reason": (accepted, "ACCEPTED SLOWER", gate.sass_levels),
    "sass rise with a bad reason": (lambda i: accepted(i, reason="flaky"), "BAD REASON", gate.sass_levels),
    "sass reason without rose_from": (lambda i: with_sass_entry(i, SassEntry(
        kernel="kern_a", arch="sm_90", level=LEVEL, reason="known-bug")), "BAD REASON", gate.sass_levels),
    "seal lacks an arch's GPU evidence": (lambda i: with_gpu(i, sm_89=None), "NO GPU EVIDENCE", gate.gpu_evidence),
    "seal's GPU evidence has mismatches": (lambda i: with_gpu(i, sm_90=gpu_verify("sm_90", mismatches=3)), "BAD SEAL",
                                          gate.sealed_evidence),
    "seal's GPU evidence lacks a cell": (lambda i: with_gpu(i, sm_80=gpu_verify("sm_80").model_copy(
        update={"shapes": []})), "BAD SEAL", gate.sealed_evidence),
    "a GPU run not as its arch sealed it": (lambda i: gpu_run(i, "sm_89", rows_checked=0), "SEAL MISMATCH",
                                            gate.sealed_against_run),
    "seal says 32 registers": (lambda i: with_seal(i, forged=True, ptxas={"registers": 32}), "SEAL MISMATCH",
                               gate.sealed_against_run),
    "shape shrunk under its name": (lambda i: with_evidence(i, defined=[
        sh.model_copy(update={"R": 2}) for sh in i.run.evidence["kern_a"].defined]), "SEAL MISMATCH",
                                    gate.sealed_against_run),
    "cap raised by hand": (lambda i: with_entries(i, i.ledger.entries, cap=99), "LOOSENED", gate.loose_cap),
    "sass level above the seal": (lambda i: with_sass_entry(with_counted(i, SLOWER), SassEntry(
        kernel="kern_a", arch="sm_90", level=SLOWER)), "LOOSENED", gate.loose_sass),
    "blocked since the base": (base_where_blocked_passed, "ACCEPTED LOOSENING", gate.against_base),
    "a count judged afresh rose": (lambda i: i._replace(counted=(
        ("SLOWER", "layer smoke/tiny", "launches 6 in the ledger -> 7 now", "doit bless accept_slower=<reason>"),)),
        "SLOWER", gate.counted_afresh),
    "a store edited since bless": (lambda i: i._replace(stores=snapshot(
        texts={stores.SHAPES: SHAPES_TEXT.replace("R: 16", "R: 17")}, pinned=False)), "STALE SEAL",
        gate.committed_stores),
    "a published figure not in its source": (lambda i: i._replace(stores=snapshot(
        texts={stores.CALIBRATION: CALIBRATION_TEXT.replace("published: 176.62", "published: 150.0")})),
        "UNSOURCED", gate.committed_stores),
    "a layer level raised since the base": (lambda i: i._replace(
        base_ref="HEAD~1", base_stores=snapshot("HEAD~1"),
        stores=snapshot(texts={stores.LAYER: layer_text(STEP.model_copy(update={"launches": 60}))})),
        "LOOSENED", gate.stores_against_base),
}


def findings(i: gate.Inputs, rules=gate.RULES) -> list[gate.Finding]:
    return gate.compare(i.run, i.ledger, i.seals, i.allowed, rules, base=i.base, base_ref=i.base_ref,
                        stores=i.stores, base_stores=i.base_stores, counted=i.counted)


def test_green_control():
    assert findings(green()) == []


@pytest.mark.parametrize("case", PLANTED)
def test_each_planted_finding_is_found_exactly(case):
    plant, kind, _ = PLANTED[case]
    found = findings(plant(green()))
    assert [f.kind for f in found] == [kind]
    assert "->" in str(found[0]) and found[0].fix


@pytest.mark.parametrize("rule", gate.RULES, ids=lambda r: r.__name__)
def test_a_gate_without_one_rule_misses_its_planted_cases(rule):
    cases = [name for name, (_, _, owner) in PLANTED.items() if owner is rule]
    assert cases, f"no planted case for rule {rule.__name__}"
    for name in cases:
        planted = PLANTED[name][0](green())
        assert findings(planted) != []
        assert findings(planted, tuple(r for r in gate.RULES if r is not rule)) == []


def test_only_not_run_faster_no_gpu_evidence_and_the_accepted_ones_are_informational():
    assert {k for k in Kind.__args__ if not gate.Finding(k, "", "", "").red} == {
        "NOT RUN", "FASTER", "ACCEPTED SLOWER", "ACCEPTED LOOSENING", "NO GPU EVIDENCE"}
    line = str(findings(PLANTED["unexpected pass"][0](green()))[0])
    assert line.startswith("UNEXPECTED PASS  kern_b ptxas sm_90: ledger blocked, now pass  -> doit bless")


def test_a_gpu_run_is_judged_against_its_own_arch_and_a_missing_arch_is_named():
    i = green()
    assert findings(gpu_run(i, "sm_89")) == []  # the sm_89 run is what the seal holds for sm_89
    short = findings(gpu_run(with_gpu(i, sm_89=gpu_verify("sm_89", rows_checked=0)), "sm_89", rows_checked=0))
    assert [(f.kind, f.subject, f.what) for f in short] == [  # sealed as it ran: not a mismatch, a bad seal
        ("BAD SEAL", "ledger/seals/kern_a.json", "gpu sm_89 verify smoke/tiny: 0 mismatches, 0 of 1 rows checked")]
    lacking = findings(with_gpu(with_gpu(i, sm_89=None), "kern_b", sm_89=None, sm_80=None))
    assert [(f.kind, f.subject, f.red) for f in lacking] == [("NO GPU EVIDENCE", "sm_80", False),
                                                             ("NO GPU EVIDENCE", "sm_89", False)]
    assert lacking[1].what.startswith("2 of 2 current seals have no verify run on an sm_89 GPU (kern_a, kern_b)")
    assert "doit verify backend=gpu && doit seal" in lacking[0].fix
    stale_only = i._replace(seals={**with_gpu(i, sm_89=None).seals, "kern_a": with_gpu(i, sm_89=None).seals[
        "kern_a"].model_copy(update={"ptx_sha256": "old"})})
    assert "NO GPU EVIDENCE" not in {f.kind for f in findings(stale_only)}  # a stale seal is its own finding


def test_cells_without_a_verdict_are_reported_not_failed():
    i = green()
    unjudged = [r for r in i.run.results if r.check == "verify"]
    i = i._replace(run=i.run.model_copy(update={"results": [r for r in i.run.results if r not in unjudged]}))
    found = findings(i)
    assert found and all(f.kind == "NOT RUN" and not f.red for f in found)
    assert sum(int(f.what.split()[0]) for f in found) == len(unjudged)
    assert str(found[0]).startswith("INFO NOT RUN  verify smoke: ")


def test_finding_lines_name_the_cell_or_file_and_the_fix():
    lines = [str(f) for name in ("unexpected failure", "stale seal", "duplicate body")
             for f in findings(PLANTED[name][0](green()))]
    assert lines[0] == ("UNEXPECTED FAILURE  kern_a verify smoke/tiny: ledger pass, now fail: ptxas fatal : "
                        "Unsupported .version 9.0  -> fix it (doit verify shape=smoke backend=emulator)")
    assert lines[1].startswith("STALE SEAL  ledger/seals/kern_a.json: PTX changed (old-kern_a -> p-kern_a)  -> doit seal:kern_a")
    assert lines[2].startswith("DUPLICATE BODY  hslm_ptx/arrays.py::scale:10: same body as hslm_ptx/pipeline/bench/run.py::scale:20  -> import")


def test_sass_lines_name_kernel_arch_ledger_vs_now_and_the_command():
    lines = [str(f) for name in ("sass slower", "sass faster", "sass not counted", "sass not in the ledger",
                                 "sass rise accepted with a reason")
             for f in findings(PLANTED[name][0](green()))]
    assert lines == [
        "SLOWER  kern_a sm_90: fast SASS/IMMA 10 in the ledger -> 11 now  -> find what the change added to the "
        "loop (doit sass:summary, artifacts/sass/), or doit bless accept_slower=<reason>",
        "INFO FASTER  kern_a sm_90: tail LSU/IMMA 4.75 in the ledger -> 4.5 now  -> doit seal && doit bless "
        "(records the new level)",
        "MISSING  kern_a sm_90: fast+tail SASS/IMMA, LSU/IMMA in the ledger, not counted now"
        "  -> doit sass, then doit seal && doit bless",
        "MISSING  kern_a sm_90: fast+tail SASS/IMMA, LSU/IMMA counted now, "
        "not in the ledger  -> doit sass, then doit seal && doit bless",
        "INFO ACCEPTED SLOWER  kern_a sm_90: fast SASS/IMMA 10 -> 11 accepted: known-bug  -> bring it back down, "
        "then doit seal && doit bless (clears the reason)",
    ]


def test_a_further_rise_past_an_accepted_one_is_red():
    further = SLOWER.model_copy(update={"fast": SassFigures(sass_per_imma=12.0, lsu_per_imma=2.0)})
    found = findings(with_counted(accepted(green()), further))
    assert [(f.kind, f.red) for f in found] == [("SLOWER", True), ("ACCEPTED SLOWER", False)]


# --- main: exit status ---------------------------------------------------------------------

def test_main_green_red_and_informational(world, capsys):
    assert gate.main([]) == 0
    assert "gate: green" in capsys.readouterr().out
    write_model(world["seals"] / "kern_a.json", seal("kern_a", ptx="old"))
    assert gate.main([]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("STALE SEAL  ledger/seals/kern_a.json") and "gate: RED" in out


@pytest.mark.parametrize("plant, code", [("sass slower", 1), ("sass rise accepted with a reason", 0),
                                         ("sass faster", 0)])
def test_main_reads_the_ledgers_sass_levels(world, monkeypatch, capsys, plant, code):
    """The levels go through ledger.json and back: a rise is red, an accepted one or a drop is not."""
    planted = PLANTED[plant][0](green())
    world["ledger"].write_text(dump_ledger(planted.ledger))
    for kernel, s in planted.seals.items():
        write_model(world["seals"] / f"{kernel}.json", s)
    monkeypatch.setattr(gate, "summarize", lambda sets: planted.run)
    assert gate.main([]) == code
    assert PLANTED[plant][1] in capsys.readouterr().out


@pytest.mark.parametrize("damage", [
    lambda p: p["ledger"].write_text("{ not json"),
    lambda p: p["ledger"].unlink(),
    lambda p: p["ledger"].write_text(p["ledger"].read_text().replace('"blocked": 1', '"blocked": 0')),
    lambda p: (p["seals"] / "kern_a.json").write_text('{"kernel": "kern_a"}'),
    lambda p: p["allowed"].write_text("allowed: [{functions: [a, b]}]\n"),
    lambda p: p["ledger"].write_text(p["ledger"].read_text().replace('"arch": "sm_80"', '"arch": "sm_90"')),
], ids=["ledger-json", "ledger-missing", "ledger-counts", "seal", "allowed", "ledger-sass-twice"])
def test_unreadable_input_exits_2_with_no_verdict(world, capsys, damage):
    damage(world)
    assert gate.main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("gate: cannot read ") and err.count("\n") == 1


def test_unreadable_run_exits_2(world, monkeypatch, capsys):
    def broken(sets):
        raise ArtifactError("artifacts/verify/k/smoke/tiny.json: unreadable JSON; delete it and re-run")

    monkeypatch.setattr(gate, "summarize", broken)
    assert gate.main([]) == 2
    assert "tiny.json: unreadable JSON" in capsys.readouterr().err


def test_doit_gate_passes_the_exit_status_through(tmp_path, tmp_doit):
    """`doit gate` is a python-action raising SystemExit(code): doit must not flatten 2 into 1."""
    dodo = """
        from hslm_ptx.pipeline.ratchet import gate
        from hslm_ptx.pipeline.stages.build_plan import VerifyPlan
        from hslm_ptx.pipeline.tasks import ratchet as tasks_ratchet
        gate.main = lambda argv: int(open("code").read())
        tasks_ratchet.KERNELS, tasks_ratchet.verify_plan = {}, lambda request: VerifyPlan([], "emulator", False)
        from hslm_ptx.pipeline.tasks.ratchet import task_gate

        def task_kernel_tests():  # the gate's one dependency left: a no-op here
            return {"actions": []}
    """
    codes = []
    for code in (0, 1, 2):
        (tmp_path / "code").write_text(str(code))
        codes.append(tmp_doit(dodo, "gate").returncode)
    assert codes == [0, 1, 2]
