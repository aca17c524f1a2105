"""The ledger: the file format and bless's rules."""
from __future__ import annotations

import json
import stat

import pytest
from pydantic import ValidationError

from hslm_ptx.pipeline.core.errors import ArtifactError, BlessRefused
from hslm_ptx.pipeline.ratchet.ledger import bless, bless_file, dump_ledger, make_ledger, read_ledger
from hslm_ptx.pipeline.core.models import CellResult, RunSummary


# --- the file ------------------------------------------------------------------------------

def entry(kernel: str, target: str, verdict: str = "pass", reason: str | None = None, check: str = "verify") -> CellResult:
    blocker = None if verdict == "pass" else f"{target} broke"
    return CellResult(kernel=kernel, check=check, target=target, verdict=verdict, blocker=blocker, reason=reason)


def test_dump_is_one_sorted_entry_per_line_and_round_trips(tmp_path):
    ledger = make_ledger([entry("b", "smoke/x"), entry("a", "smoke/y", "blocked", "no-gpu"), entry("a", "smoke/x")], 1)
    text = dump_ledger(ledger)
    lines = [line for line in text.splitlines() if line.strip().startswith('{"kernel"')]
    assert len(lines) == 3 and [json.loads(line.rstrip(","))["kernel"] for line in lines] == ["a", "a", "b"]
    (tmp_path / "ledger.json").write_text(text)
    assert read_ledger(tmp_path / "ledger.json") == ledger
    assert ledger.counts == {"pass": 2, "pass_vacuous": 0, "blocked": 1, "fail": 0}


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["counts"].update(blocked=0), "do not add up"),
    (lambda d: d["entries"].append(d["entries"][0]), "listed twice"),
    (lambda d: d["entries"].reverse(), "not sorted"),
    (lambda d: d["entries"][0].update(verdict="maybe"), "verdict"),
])
def test_inconsistent_ledger_is_unreadable(tmp_path, edit, message):
    data = json.loads(dump_ledger(make_ledger([entry("a", "smoke/x"), entry("a", "smoke/y", "blocked", "no-gpu")], 1)))
    edit(data)
    (tmp_path / "ledger.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=message):
        read_ledger(tmp_path / "ledger.json")
    with pytest.raises(ValidationError):
        type(make_ledger([], 0)).model_validate(data)


# --- bless ---------------------------------------------------------------------------------

UNIVERSE = [("a", "verify", "smoke/x"), ("a", "verify", "smoke/y"), ("a", "verify", "smoke/z")]


def result(key, verdict="pass", blocker=None, reason=None) -> CellResult:
    kernel, check, target = key
    blocker = blocker or (None if verdict == "pass" else f"{target} broke")
    return CellResult(kernel=kernel, check=check, target=target, verdict=verdict, blocker=blocker, reason=reason)


def test_bless_keeps_hand_written_reasons_and_tightens_the_cap():
    old = make_ledger([entry("a", "smoke/x"), entry("a", "smoke/y", "blocked", "known-bug"),
                       entry("a", "smoke/z", "fail", "known-bug")], 2)
    results = [result(UNIVERSE[0]), result(UNIVERSE[1], "blocked", "new first line"), result(UNIVERSE[2])]
    new, notes = bless(old, UNIVERSE, results)
    y = next(e for e in new.entries if e.target == "smoke/y")
    assert (y.reason, y.blocker) == ("known-bug", "new first line")
    assert new.max_not_pass == 1 and new.not_pass == 1
    assert "cap: 2 -> 1" in notes[0]


def test_bless_refuses_a_fail_where_the_ledger_says_pass():
    old = make_ledger([entry("a", "smoke/x"), entry("a", "smoke/y"), entry("a", "smoke/z", "blocked", "no-gpu")], 5)
    with pytest.raises(BlessRefused, match="a verify smoke/x failed where the ledger says pass"):
        bless(old, UNIVERSE, [result(UNIVERSE[0], "fail"), result(UNIVERSE[1])])
    with pytest.raises(BlessRefused, match="failed where the ledger says pass"):
        bless(old, UNIVERSE, [result(UNIVERSE[0], "fail")], accept_new=True)


def test_bless_never_raises_the_cap_by_itself():
    old = make_ledger([entry("a", "smoke/x"), entry("a", "smoke/y")], 0)
    with pytest.raises(BlessRefused, match=r"over the cap 0 \(new: a verify smoke/z\).*accept_new=1"):
        bless(old, UNIVERSE, [result(k) for k in UNIVERSE[:2]] + [result(UNIVERSE[2], "blocked", reason="no-gpu")])
    # a regression pass -> blocked is not new: accept_new does not cover it
    with pytest.raises(BlessRefused, match="over the cap 0 .*not new"):
        bless(old, UNIVERSE, [result(UNIVERSE[0], "blocked"), result(UNIVERSE[1]), result(UNIVERSE[2])], accept_new=True)


def test_accept_new_raises_the_cap_by_exactly_the_new_entries():
    old = make_ledger([entry("a", "smoke/x", "blocked", "no-gpu")], 1)
    universe = UNIVERSE + [("b", "tests", "tests")]
    results = [result(UNIVERSE[0], "blocked"), result(UNIVERSE[1], "fail"),
               result(UNIVERSE[2]), result(universe[3], "pass_vacuous", reason="vacuous-test")]
    new, notes = bless(old, universe, results, accept_new=True)
    assert new.max_not_pass == 3 == new.not_pass
    assert notes[0].startswith("cap: old 1 + 2 new not-passing (a verify smoke/y, b tests tests) = new cap 3")
    # the new fail has no reason the run could tell: bless says so (the gate calls it BAD REASON)
    assert "give a reason" in notes[-1] and "a verify smoke/y" in notes[-1]


def test_first_bless_and_stale_entries_dropped():
    with pytest.raises(BlessRefused, match="over the cap 0"):
        bless(None, UNIVERSE, [result(UNIVERSE[0], "blocked", reason="no-gpu")])
    new, _ = bless(None, UNIVERSE, [result(UNIVERSE[0], "blocked", reason="no-gpu")], accept_new=True)
    assert [e.key for e in new.entries] == UNIVERSE[:1] and new.max_not_pass == 1
    old = make_ledger([entry("a", "smoke/x"), entry("gone", "smoke/x", "blocked", "no-gpu")], 1)
    new, notes = bless(old, UNIVERSE, [result(UNIVERSE[0])])
    assert [e.kernel for e in new.entries] == ["a"] and new.max_not_pass == 0
    assert any("dropped 1 stale" in n for n in notes)


def test_refused_bless_writes_nothing(tmp_path):
    path = tmp_path / "ledger.json"
    path.write_text(dump_ledger(make_ledger([entry("a", "smoke/x")], 0)))
    before = path.read_bytes()
    with pytest.raises(BlessRefused):
        bless_file(UNIVERSE, [result(UNIVERSE[0], "fail")], path=path)
    with pytest.raises(BlessRefused):
        bless_file(UNIVERSE, [result(UNIVERSE[0]), result(UNIVERSE[1], "blocked")], path=path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["ledger.json"]
    bless_file(UNIVERSE, [result(k) for k in UNIVERSE], path=path)
    assert read_ledger(path).counts["pass"] == 3


def test_bless_keeps_the_ledger_mode(tmp_path):
    path = tmp_path / "ledger.json"
    path.write_text(dump_ledger(make_ledger([entry("a", "smoke/x")], 0)))
    path.chmod(0o664)
    bless_file(UNIVERSE, [result(k) for k in UNIVERSE], path=path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o664 and read_ledger(path).counts["pass"] == 3


def test_doit_bless_refuses_in_one_line_and_accept_new_prints_the_accounting(tmp_path, tmp_doit):
    ledger = tmp_path / "ledger.json"
    ledger.write_text(dump_ledger(make_ledger([entry("a", "smoke/x")], 0)))
    dodo = """
        import functools, pathlib
        from hslm_ptx.pipeline.ratchet import ledger
        from hslm_ptx.pipeline.tasks import ratchet as tasks_ratchet
        from hslm_ptx.pipeline.core.models import RunSummary
        tasks_ratchet.summarize = lambda sets: RunSummary.model_validate_json(pathlib.Path("run.json").read_text())
        tasks_ratchet.bless_file = functools.partial(ledger.bless_file, path=pathlib.Path("ledger.json").resolve())
        from hslm_ptx.pipeline.tasks.ratchet import task_bless
    """

    def bless_run(results, *args):
        run = RunSummary(cells=UNIVERSE[:2], results=results, kernels=[], duplicates=[])
        (tmp_path / "run.json").write_text(run.model_dump_json())
        return tmp_doit(dodo, "bless", *args)

    before = ledger.read_bytes()
    refused = bless_run([result(UNIVERSE[0], "fail", blocker="3 mismatches")])
    assert refused.returncode == 1 and "Traceback" not in refused.stdout + refused.stderr
    assert "bless refused: a verify smoke/x failed where the ledger says pass" in refused.stdout
    assert ledger.read_bytes() == before
    accepted = bless_run([result(UNIVERSE[0]), result(UNIVERSE[1], "blocked", reason="no-gpu")], "accept_new=1")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "cap: old 0 + 1 new not-passing (a verify smoke/y) = new cap 1" in accepted.stdout
    assert read_ledger(ledger).max_not_pass == 1
