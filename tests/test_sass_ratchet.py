"""The SASS ratchet (hslm_ptx.pipeline.ratchet.sass_ratchet): the figures a seal and the ledger record,
judging a rise, a drop and a gap, and bless following drops but refusing a rise
unless it is accepted with a reason."""
from __future__ import annotations

import json

import pytest

from hslm_ptx.pipeline.core.errors import ArtifactError, BlessRefused
from hslm_ptx.pipeline.ratchet.ledger import bless, bless_file, dump_ledger, make_ledger, read_ledger
from hslm_ptx.pipeline.core.models import RunSummary, SassEntry, SassFigures, SassLevel
from hslm_ptx.pipeline.stages.sass import Body, SassArch, SassReport
from hslm_ptx.pipeline.ratchet.sass_ratchet import bless_sass, current_figures, judge_sass, ledger_levels


def body(instructions: int, lsu: int, imma: int = 8) -> Body:
    return Body(runs=["0x0-0x0"], instructions=instructions, nops=0, imma=imma, lsu=lsu, classes={"tensor": imma},
                per_imma=round(instructions / imma, 4), lsu_per_imma=round(lsu / imma, 4), guarded_global_loads=0)


def level(fast: float, fast_lsu: float = 2.0, tail: float | None = 21.0, tail_lsu: float = 4.0) -> SassLevel:
    return SassLevel(fast=SassFigures(sass_per_imma=fast, lsu_per_imma=fast_lsu),
                     tail=None if tail is None else SassFigures(sass_per_imma=tail, lsu_per_imma=tail_lsu))


def held(**archs: SassLevel) -> dict[str, dict[str, SassLevel]]:
    return {"k": archs}


EXISTS = {("k", "sm_80"), ("k", "sm_90")}


# --- the figures ---------------------------------------------------------------------------

def test_current_figures_take_both_bodies_of_every_arch():
    arch = SassArch(arch="sm_90", instructions=300, loops=[], steady_loop="0x100",
                    fast=body(84, 16), tail=body(168, 32))
    no_tail = arch.model_copy(update={"arch": "sm_80", "tail": None})
    report = SassReport(kernel="k", ptx_sha256="0" * 64, ptxas_version="12.9", nvdisasm_version="13.0",
                        archs=[arch, no_tail])
    assert current_figures([report]) == held(sm_90=level(10.5, 2.0, 21.0, 4.0), sm_80=level(10.5, 2.0, None))


# --- judging -------------------------------------------------------------------------------

def test_unchanged_is_silent():
    assert judge_sass(held(sm_90=level(10.5)), held(sm_90=level(10.5))) == []


def test_a_planted_rise_is_slower_per_figure():
    found = judge_sass(held(sm_90=level(10.5)), held(sm_90=level(11.0, 2.125)))
    assert [(f.kind, f.what) for f in found] == [
        ("SLOWER", "fast SASS/IMMA 10.5 in the ledger -> 11 now"),
        ("SLOWER", "fast LSU/IMMA 2 in the ledger -> 2.125 now")]


def test_a_drop_is_faster_and_a_gap_is_one_missing_per_kernel_arch():
    found = judge_sass(held(sm_90=level(10.5), sm_80=level(10.5)), held(sm_90=level(10.5, tail=20.0), sm_86=level(9.0)))
    assert [(f.kind, f.arch, f.what) for f in found] == [
        ("FASTER", "sm_90", "tail SASS/IMMA 21 in the ledger -> 20 now"),
        ("MISSING", "sm_80", "fast+tail SASS/IMMA, LSU/IMMA in the ledger, "
                             "not counted now"),
        ("MISSING", "sm_86", "fast+tail SASS/IMMA, LSU/IMMA counted now, "
                             "not in the ledger")]


def test_a_vanished_body_is_missing():
    found = judge_sass(held(sm_90=level(10.5)), held(sm_90=level(10.5, tail=None)))
    assert [(f.kind, f.what) for f in found] == [
        ("MISSING", "tail SASS/IMMA, LSU/IMMA in the ledger, not counted now")]


# --- bless ---------------------------------------------------------------------------------

def entries(**archs: SassLevel) -> list[SassEntry]:
    return [SassEntry(kernel="k", arch=a, level=v) for a, v in sorted(archs.items())]


def test_bless_records_new_figures_and_a_drop_as_the_new_level():
    first, notes = bless_sass([], held(sm_80=level(10.5), sm_90=level(10.5)), EXISTS)
    assert ledger_levels(first) == held(sm_80=level(10.5), sm_90=level(10.5)) and notes == []
    dropped, notes = bless_sass(first, held(sm_90=level(10.0)), EXISTS)
    assert ledger_levels(dropped) == held(sm_80=level(10.5), sm_90=level(10.0))  # sm_80 not counted: kept
    assert notes == ["sass k sm_90: fast SASS/IMMA 10.5 -> 10"]


def test_bless_refuses_a_rise_and_records_it_only_with_a_reason():
    old = entries(sm_90=level(10.5))
    with pytest.raises(BlessRefused, match=r"SASS per IMMA rose: k sm_90 fast SASS/IMMA 10.5 -> 11; .*"
                                           r"accept_slower=<reason>"):
        bless_sass(old, held(sm_90=level(11.0)), EXISTS)
    new, notes = bless_sass(old, held(sm_90=level(11.0)), EXISTS, accept_slower="known-bug")
    assert new == [SassEntry(kernel="k", arch="sm_90", level=level(11.0), reason="known-bug", rose_from=level(10.5))]
    assert notes == ["sass k sm_90 fast SASS/IMMA 10.5 -> 11: accepted, reason known-bug"]


def test_an_accepted_rise_keeps_its_best_level_until_the_figures_are_back():
    old = [SassEntry(kernel="k", arch="sm_90", level=level(11.0), reason="known-bug", rose_from=level(10.5))]
    with pytest.raises(BlessRefused, match="11 -> 12"):  # a further rise needs its own acceptance
        bless_sass(old, held(sm_90=level(12.0)), EXISTS)
    further, _ = bless_sass(old, held(sm_90=level(12.0)), EXISTS, accept_slower="ptxas-version")
    assert further[0].rose_from == level(10.5) and further[0].reason == "ptxas-version"
    partway, _ = bless_sass(old, held(sm_90=level(10.75)), EXISTS)
    assert (partway[0].level, partway[0].reason, partway[0].rose_from) == (level(10.75), "known-bug", level(10.5))
    back, notes = bless_sass(old, held(sm_90=level(10.5)), EXISTS)
    assert back == entries(sm_90=level(10.5))
    assert notes == ["sass k sm_90: fast SASS/IMMA 11 -> 10.5 (back at its level before the accepted rise)"]


def test_bless_drops_entries_of_archs_that_no_longer_exist():
    new, notes = bless_sass(entries(sm_70=level(9.0), sm_90=level(10.5)), {}, EXISTS)
    assert new == entries(sm_90=level(10.5)) and notes == ["dropped 1 stale sass entries: k sm_70"]


# --- through the ledger --------------------------------------------------------------------

UNIVERSE = [("k", "ptxas", "sm_80"), ("k", "ptxas", "sm_90")]


def test_the_ledger_file_holds_one_sass_entry_per_line_and_round_trips(tmp_path):
    ledger = make_ledger([], 0, entries(sm_90=level(10.5), sm_80=level(10.5, tail=None)))
    text = dump_ledger(ledger)
    lines = [line for line in text.splitlines() if line.strip().startswith('{"kernel"')]
    assert [json.loads(line.rstrip(","))["arch"] for line in lines] == ["sm_80", "sm_90"]
    (tmp_path / "ledger.json").write_text(text)
    assert read_ledger(tmp_path / "ledger.json") == ledger
    data = json.loads(text)
    data["sass"].reverse()
    (tmp_path / "ledger.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="sass entries are not unique and sorted"):
        read_ledger(tmp_path / "ledger.json")


def test_bless_refuses_an_unknown_reason_and_a_refused_rise_writes_nothing(tmp_path):
    path = tmp_path / "ledger.json"
    path.write_text(dump_ledger(make_ledger([], 0, entries(sm_90=level(10.5)))))
    before = path.read_bytes()
    with pytest.raises(BlessRefused, match="accept_slower='flaky' is not a reason; use one of no-gpu, "):
        bless(read_ledger(path), UNIVERSE, [], sass=held(sm_90=level(11.0)), accept_slower="flaky")
    with pytest.raises(BlessRefused, match="rose"):
        bless_file(UNIVERSE, [], path=path, sass=held(sm_90=level(11.0)))
    assert path.read_bytes() == before
    _, notes = bless_file(UNIVERSE, [], path=path, sass=held(sm_90=level(10.0)))
    assert ledger_levels(read_ledger(path).sass) == held(sm_90=level(10.0)) and "fast SASS/IMMA 10.5 -> 10" in notes[-1]


def test_doit_bless_refuses_a_rise_in_one_line_and_accept_slower_records_it(tmp_path, tmp_doit):
    ledger = tmp_path / "ledger.json"
    ledger.write_text(dump_ledger(make_ledger([], 0, entries(sm_90=level(10.5)))))
    (tmp_path / "run.json").write_text(RunSummary(cells=UNIVERSE, results=[], kernels=[], duplicates=[],
                                                  sass=held(sm_90=level(11.0))).model_dump_json())
    dodo = """
        import functools, pathlib
        from hslm_ptx.pipeline.ratchet import ledger
        from hslm_ptx.pipeline.tasks import ratchet as tasks_ratchet
        from hslm_ptx.pipeline.core.models import RunSummary
        tasks_ratchet.summarize = lambda sets: RunSummary.model_validate_json(pathlib.Path("run.json").read_text())
        tasks_ratchet.bless_file = functools.partial(ledger.bless_file, path=pathlib.Path("ledger.json").resolve())
        from hslm_ptx.pipeline.tasks.ratchet import task_bless
    """
    before = ledger.read_bytes()
    refused = tmp_doit(dodo, "bless")
    assert refused.returncode == 1 and "Traceback" not in refused.stdout + refused.stderr
    assert "bless refused: SASS per IMMA rose: k sm_90 fast SASS/IMMA 10.5 -> 11" in refused.stdout
    assert ledger.read_bytes() == before
    accepted = tmp_doit(dodo, "bless", "accept_slower=known-bug")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "sass k sm_90 fast SASS/IMMA 10.5 -> 11: accepted, reason known-bug" in accepted.stdout
    assert read_ledger(ledger).sass[0].reason == "known-bug"
