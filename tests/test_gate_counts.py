"""The gate's loop-counts rule (hslm_ptx.pipeline.ratchet.gate_counts): hslm_ptx/cost/loop_counts.json against the
SASS records, on a small invented kernel, and through gate.main."""
from __future__ import annotations

import json

from hslm_ptx.pipeline.ratchet import gate
from hslm_ptx.pipeline.ratchet import gate_counts
from hslm_ptx.pipeline.stages import sass
from hslm_ptx.pipeline.core.artifacts import write_model

BODY = sass.Body(runs=["0x0-0x0"], instructions=80, nops=0, imma=8, lsu=2, classes={"tensor": 8, "ldg32": 2},
                 per_imma=10.0, lsu_per_imma=0.25, guarded_global_loads=0)
LOOP = sass.LoopCounts(start="0x100", end="0x900", instructions=80, classes={}, paths=1)
ARCH = sass.SassArch(arch="sm_90", instructions=300, loops=[LOOP], steady_loop="0x100", fast=BODY, tail=None)
REPORT = sass.SassReport(kernel="k", ptx_sha256="ab", ptxas_version="1", nvdisasm_version="1", archs=[ARCH])
AGREEING = {"kernels": {"k": {"ptx_sha256": "ab", "archs": {"sm_90": {
    "fast": {"instructions": 80, "imma": 8, "issue_clocks": 200, "direct_loads": True, "global_bytes": 256.0},
    "tail": None,
    "outside_instructions": 220}}}}, "occupancy": {}}


def plant(folder, counts: dict | None) -> dict:
    """A folder holding ``counts`` as loop_counts.json and k's SASS record beside it."""
    if counts is not None:
        (folder / "loop_counts.json").write_text(json.dumps(counts))
    write_model(folder / "k.sass.json", REPORT)
    return {"counts_file": folder / "loop_counts.json", "kernels": ["k"], "report_path": lambda k: folder / f"{k}.sass.json"}


def forged() -> dict:
    counts = json.loads(json.dumps(AGREEING))
    counts["kernels"]["k"]["archs"]["sm_90"]["fast"]["imma"] = 9  # one IMMA added by hand
    return counts


def test_agreeing_counts_give_no_finding(tmp_path):
    assert gate_counts.counts_findings(**plant(tmp_path, AGREEING)) == []


def test_a_forged_count_is_one_line_naming_the_file_the_kernel_and_the_command(tmp_path):
    found = gate_counts.counts_findings(**plant(tmp_path, forged()))
    assert len(found) == 1
    line = str(gate.Finding(*found[0]))
    assert line.count("\n") == 0 and "loop_counts.json" in line and "k sm_90 fast" in line
    assert "(instructions, imma, global_bytes) (80, 9, 256.0), the SASS (80, 8, 256.0)" in line and line.endswith("-> doit model:counts")
    assert found[0].kind == "STALE" and gate.Finding(*found[0]).red


def test_counts_from_other_ptx_or_without_the_kernel_are_found(tmp_path):
    other = json.loads(json.dumps(AGREEING))
    other["kernels"]["k"]["ptx_sha256"] = "cd"
    assert [f.what for f in gate_counts.counts_findings(**plant(tmp_path, other))] == [
        "k was counted from other PTX"]
    assert [f.what for f in gate_counts.counts_findings(**plant(tmp_path, {"kernels": {}}))] == ["no counts for k"]
    assert [f.what for f in gate_counts.counts_findings(**plant(tmp_path, {"note": "x"}))] == [
        "field 'kernels': expected an object of kernel entries"]


def test_a_missing_counts_file_or_sass_record_says_what_to_run(tmp_path):
    args = plant(tmp_path, None)
    (missing,) = gate_counts.counts_findings(**args)
    assert (missing.kind, missing.fix) == ("MISSING", "doit model:counts") and "loop_counts.json" in missing.subject
    assert gate_counts.counts_findings(**args, required=False) == []
    (tmp_path / "loop_counts.json").write_text(json.dumps(AGREEING))
    (tmp_path / "k.sass.json").unlink()
    (no_sass,) = gate_counts.counts_findings(**args)
    assert no_sass.kind == "MISSING" and no_sass.fix == "doit sass:k" and "k.sass.json" in no_sass.subject


def test_the_gate_turns_red_on_forged_counts_beside_its_ledger(world, monkeypatch, capsys):
    """``world``: tests/conftest.py's green world for gate.main, its ledger in tmp_path."""
    args = plant(world["ledger"].parent, AGREEING)
    monkeypatch.setattr(gate_counts, "counted_kernels", lambda: args["kernels"])
    monkeypatch.setattr(gate_counts, "sass_json", args["report_path"])
    monkeypatch.setattr(gate_counts, "scored_kernels", lambda: [])  # no occupancy to check in this world
    assert gate.main([]) == 0
    capsys.readouterr()
    (world["ledger"].parent / "loop_counts.json").write_text(json.dumps(forged()))
    assert gate.main([]) == 1
    out = capsys.readouterr().out
    stale = [line for line in out.splitlines() if line.startswith("STALE")]
    assert len(stale) == 1 and "k sm_90 fast" in stale[0] and stale[0].endswith("-> doit model:counts")


def test_an_occupancy_that_is_not_ptxas_s_is_found():
    """The tile rule reads each configuration's registers and shared bytes from the file;
    one that differs from the ptxas record (forged, or counted before a kernel edit) is a
    disagreement naming the kernel, and a file without the field is one too."""
    from hslm_ptx.pipeline.core.models import PtxasArch, PtxasReport
    from hslm_ptx.pipeline.stages.perf_model import occupancy_disagreements, occupancy_record

    arch = PtxasArch(arch="sm_90", registers=76, spill_stores=0, spill_loads=0, shared_bytes=32768, stack_bytes=0)
    report = PtxasReport.model_construct(kernel="k", archs=[arch])
    held = {"occupancy": {"k": occupancy_record(report)}}
    assert held["occupancy"]["k"] == {"sm_90": {"registers": 76, "shared_bytes": 32768}}
    assert occupancy_disagreements(held, {"k": report}) == []
    held["occupancy"]["k"]["sm_90"]["registers"] = 64
    (line,) = occupancy_disagreements(held, {"k": report})
    assert line.startswith("k: occupancy") and "'registers': 76" in line
    assert occupancy_disagreements({}, {"k": report}) == ["field 'occupancy': expected an object of kernel entries"]


def test_a_forged_unsplit_path_is_found(tmp_path):
    counted = REPORT.model_copy(update={"archs": [ARCH.model_copy(update={"outside_path": 220,
                                                                         "outside_path_unsplit": 90})]})
    agreeing = json.loads(json.dumps(AGREEING))
    agreeing["kernels"]["k"]["archs"]["sm_90"]["outside_unsplit_instructions"] = 90
    where = plant(tmp_path, agreeing)
    write_model(tmp_path / "k.sass.json", counted)
    assert gate_counts.counts_findings(**where) == []
    agreeing["kernels"]["k"]["archs"]["sm_90"]["outside_unsplit_instructions"] = 60  # a cheaper epilogue by hand
    (tmp_path / "loop_counts.json").write_text(json.dumps(agreeing))
    found = gate_counts.counts_findings(**where)
    assert [f.what for f in found] == ["k sm_90: outside_unsplit_instructions 60, the SASS's unsplit path 90"]
    assert found[0].kind == "STALE"
