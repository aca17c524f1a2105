"""The gate cannot be fooled: every forgery of a seal or the ledger that used to leave it
green is planted here and seen red (or refused as unreadable input, exit 2).

Each case starts from a committed seal and the run that produced it (the seal's own
figures, in :class:`hslm_ptx.pipeline.core.models.SealEvidence` form), so the green control is the
real thing, then edits one side as a forger would.
"""
from __future__ import annotations

import os
import subprocess
import textwrap

import pytest

from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.ratchet import gate
from hslm_ptx.pipeline.core.artifacts import write_model
from hslm_ptx.pipeline.core.errors import ArtifactError, BlessRefused
from hslm_ptx.pipeline.ratchet.ledger import bless, dump_ledger, loosenings, make_ledger, read_ledger
from hslm_ptx.pipeline.core.models import (AllowedDuplicates, CellResult, KernelState, RunSummary, SassEntry,
                                           SassFigures, SassLevel, Seal, SealEvidence, TestCounts)
from hslm_ptx.pipeline.ratchet.results import sealed_shapes, hashes_of_test_files
from hslm_ptx.pipeline.ratchet.sass_ratchet import bless_sass
from hslm_ptx.pipeline.ratchet.seal import mismatches, read_seals
from hslm_ptx.pipeline.core.shapes import select_sets

SEALED = read_seals()
FWD, DX = "hslm_fwd_s8", "hslm_dx_s8"
TEST_FILES = {f"tests/test_{n}.py": f"{n:0>64}" for n in ("a", "b", "c", "d", "e")}


def sealed(kernel: str = FWD) -> Seal:
    """A committed seal, with the five test files a real one lists."""
    return SEALED[kernel].model_copy(update={"test_files": TEST_FILES})


def run_of(seal: Seal) -> SealEvidence:
    """What a run that produced exactly ``seal`` shows."""
    return SealEvidence(ptx_bytes=seal.ptx_bytes, ptxas_version=seal.ptxas_version, ptxas=seal.ptxas,
                        defined=seal.verify.shapes, verify=seal.verify.shapes,
                        runs=[(seal.verify.backend, seal.verify.device, seal.verify.driver)],
                        tests=seal.tests, test_files=seal.test_files, sass=seal.sass)


def fields(seal: Seal, now: SealEvidence) -> list[str]:
    return [field for field, _, _ in mismatches(seal, now)]


def test_a_seal_matches_the_run_that_made_it():
    assert {FWD, DX} <= set(SEALED)
    for seal in SEALED.values():
        assert mismatches(seal, run_of(seal)) == []


def shrink_attn(seal: Seal) -> tuple[Seal, SealEvidence]:
    """shapes.yaml: attn_r1782 edited to R: 2, K: 16, N: 8 under the same name (verify passes on it)."""
    now = run_of(seal)
    small = [s.model_copy(update={"R": 2, "K": 16, "N": 8}) if s.shape == "attn_r1782" else s for s in now.defined]
    return seal, now.model_copy(update={"defined": small, "verify": small})


def delete_four_test_files(seal: Seal) -> tuple[Seal, SealEvidence]:
    """Four of the kernel's five test files deleted: 15 tests pass where the seal says more."""
    now = run_of(seal)
    kept = dict(list(TEST_FILES.items())[:1])
    counts = TestCounts(passed=15, failed=0, skipped=0, total=15, vacuous=0, invariants=0)
    return seal, now.model_copy(update={"tests": counts, "test_files": kept})


def edited_seal(**update):
    def plant(seal: Seal) -> tuple[Seal, SealEvidence]:
        return seal.model_copy(update={k: v(seal) for k, v in update.items()}), run_of(seal)
    return plant


def tiny_everywhere(seal: Seal) -> object:
    return seal.verify.model_copy(update={"shapes": [
        s.model_copy(update={"R": 1, "K": 1, "N": 1, "rows_checked": 1}) for s in seal.verify.shapes]})


def half_a_sass(seal: Seal) -> dict:
    half = SassFigures(sass_per_imma=0.5, lsu_per_imma=0.1)
    return {arch: level.model_copy(update={"fast": half}) for arch, level in seal.sass.items()}


def copied_from_dx(seal: Seal) -> tuple[Seal, SealEvidence]:
    """dX's seal copied over forward's, its kernel name and hashes set to forward's."""
    forged = sealed(DX).model_copy(update={k: getattr(seal, k) for k in ("kernel", "source_sha256", "ptx_sha256")})
    return forged, run_of(seal)


FORGERIES = {
    "attn_r1782 shrunk to 2x16x8": (shrink_attn, "shape hslm/attn_r1782 R"),
    "four test files deleted": (delete_four_test_files, "tests passed"),
    "seal says 32 registers": (edited_seal(ptxas=lambda s: [a.model_copy(update={"registers": 32}) for a in s.ptxas]),
                               "ptxas sm_80 registers"),
    "seal says 9999 tests": (edited_seal(tests=lambda s: s.tests.model_copy(update={"passed": 9999, "total": 9999})),
                             "tests passed"),
    "seal says 0.5 SASS per IMMA": (edited_seal(sass=half_a_sass), "sass sm_80 fast SASS/IMMA"),
    "seal says a GPU ran it": (edited_seal(verify=lambda s: s.verify.model_copy(update={
        "backend": "gpu", "device": "NVIDIA H200", "driver": "570.1"})), "verify backend"),
    "seal says R = K = N = 1 everywhere": (edited_seal(verify=tiny_everywhere), "shape smoke/tiny R"),
    "seal says another PTX size": (edited_seal(ptx_bytes=lambda s: s.ptx_bytes + 1), "ptx_bytes"),
    "a test file edited after sealing": (edited_seal(test_files=lambda s: {**s.test_files,
                                                                           "tests/test_a.py": "f" * 64}),
                                         "test file tests/test_a.py"),
    "another kernel's seal copied over": (copied_from_dx, "ptx_bytes"),
}


@pytest.mark.parametrize("case", FORGERIES)
def test_each_forged_seal_is_a_mismatch(case):
    plant, field = FORGERIES[case]
    seal, now = plant(sealed())
    found = fields(seal, now)
    assert any(f.startswith(field) for f in found), found


@pytest.mark.parametrize("case", FORGERIES)
def test_each_forged_seal_makes_the_gate_red(case):
    seal, now = FORGERIES[case][0](sealed())
    state = KernelState(kernel=FWD, source_sha256=seal.source_sha256, ptx_sha256=seal.ptx_sha256)
    run = RunSummary(cells=[], results=[], kernels=[state], duplicates=[], evidence={FWD: now})
    found = list(gate.sealed_against_run(gate.Inputs(run, make_ledger([], 0), {FWD: seal}, AllowedDuplicates())))
    assert found and all(f.red and f.kind == "SEAL MISMATCH" for f in found)
    assert len(found) <= gate.SHOWN_MISMATCHES + 1
    assert str(found[0]).startswith(f"SEAL MISMATCH  {FWD}: ") and " sealed " in str(found[0])
    assert "doit seal:hslm_fwd_s8 && doit bless" in str(found[0])


def test_a_mismatch_line_says_sealed_and_now():
    seal, now = FORGERIES["seal says 32 registers"][0](sealed())
    first = mismatches(seal, now)[0]
    real = next(a.registers for a in sealed().ptxas if a.arch == "sm_80")
    assert first == ("ptxas sm_80 registers", "32", str(real)) and real != 32


def test_the_sealed_shapes_are_shapes_yaml_now_and_test_files_are_hashed(tmp_path):
    sets = select_sets(config.VERIFY_SETS)
    defined = sealed_shapes(sets)
    assert len(defined) == sum(len(sets[s]) for s in config.VERIFY_SETS)
    assert {(s.shape_set, s.shape, s.R, s.K, s.N) for s in defined} == {
        (s.shape_set, s.shape, s.R, s.K, s.N) for s in SEALED[FWD].verify.shapes}
    hashes = hashes_of_test_files(["tests/test_gate_forgery.py", "tests/no_such_file.py"])
    assert hashes["tests/no_such_file.py"] == "(missing)" and len(hashes["tests/test_gate_forgery.py"]) == 64


def test_the_test_run_names_the_files_each_kernel_is_tested_in(tmp_path):
    """assertcount records the files; a seal pins their hashes (hslm_ptx.pipeline.ratchet.seal.build_seal)."""
    from hslm_ptx.pipeline.ratchet.kernel_tests import run_kernel_tests

    test_file = tmp_path / "test_marked.py"
    test_file.write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.kernel("k1")
        def test_one():
            assert 1 + 1 == 2
    """))
    run = run_kernel_tests(tmp_path / "counts.json", str(test_file), "--rootdir", str(tmp_path))
    assert run.files == {"k1": ["test_marked.py"]} and run.kernels["k1"].passed == 1


# --- seals that are not regular files of the project -------------------------------------

def write_seals(folder) -> None:
    for kernel, seal in SEALED.items():
        write_model(folder / f"{kernel}.json", seal)


def test_a_regular_seal_folder_reads(tmp_path):
    write_seals(tmp_path)
    assert set(read_seals(tmp_path)) == set(SEALED)


@pytest.mark.parametrize("plant", ["link outside", "link inside", "folder"])
def test_a_seal_that_is_not_a_regular_file_is_refused(tmp_path, plant):
    seals = tmp_path / "seals"
    write_seals(seals)
    target = seals / f"{FWD}.json"
    if plant == "folder":
        target.unlink()
        target.mkdir()
    else:
        edited = (tmp_path / "elsewhere.json") if plant == "link outside" else (seals / "copy.txt")
        edited.write_text(target.read_text().replace('"registers": ', '"registers": 1'))
        target.unlink()
        os.symlink(edited, target)
    with pytest.raises(ArtifactError, match=rf"seals/{FWD}.json: not a regular file inside the project"):
        read_seals(seals)


# --- the ledger loosened by hand ----------------------------------------------------------

def entry(key, verdict="pass", reason=None, blocker=None) -> CellResult:
    return CellResult(kernel=key[0], check=key[1], target=key[2], verdict=verdict, reason=reason, blocker=blocker)


CELLS = [("k", "ptxas", "sm_80"), ("k", "tests", "tests"), ("k", "verify", "smoke/a")]
LEVEL = SassLevel(fast=SassFigures(sass_per_imma=10.0, lsu_per_imma=2.0))
RAISED = SassLevel(fast=SassFigures(sass_per_imma=99.0, lsu_per_imma=99.0))


def test_a_key_given_twice_in_the_ledger_is_refused(tmp_path):
    path = tmp_path / "ledger.json"
    text = dump_ledger(make_ledger([entry(c) for c in CELLS], 0))
    path.write_text(text.replace('"max_not_pass": 0,', '"max_not_pass": 0,\n  "max_not_pass": 99,'))
    with pytest.raises(ArtifactError, match=r"ledger.json: duplicate key 'max_not_pass'"):
        read_ledger(path)


def test_a_cap_raised_by_hand_is_red_and_buys_bless_nothing():
    ledger = make_ledger([entry(c) for c in CELLS[:2]], 99)
    found = list(gate.loose_cap(gate.Inputs(RunSummary(cells=[], results=[], kernels=[], duplicates=[]), ledger, {},
                                            AllowedDuplicates())))
    assert [(f.kind, f.red) for f in found] == [("LOOSENED", True)] and "max_not_pass 99" in found[0].what
    failing = [entry(CELLS[0]), entry(CELLS[1]), entry(CELLS[2], "fail", "known-bug", "wrong")]
    with pytest.raises(BlessRefused, match=r"over the cap 0 \(new: k verify smoke/a\).*accept_new=1"):
        bless(ledger, CELLS, failing)  # without accept_new=1, the hand-raised cap is not a cap
    blessed, _ = bless(ledger, CELLS, failing, accept_new=True)
    assert blessed.max_not_pass == 1 == blessed.not_pass


def test_every_sass_level_raised_by_hand_is_red():
    seal = sealed()
    state = KernelState(kernel=FWD, source_sha256=seal.source_sha256, ptx_sha256=seal.ptx_sha256)
    run = RunSummary(cells=[], results=[], kernels=[state], duplicates=[], sass={FWD: seal.sass})
    levels = [SassEntry(kernel=FWD, arch=a, level=RAISED) for a in sorted(seal.sass)]
    found = list(gate.loose_sass(gate.Inputs(run, make_ledger([], 0, levels), {FWD: seal}, AllowedDuplicates())))
    assert len(found) >= len(levels) and all(f.kind == "LOOSENED" and f.red for f in found)
    assert "99 in the ledger, above the sealed" in found[0].what


def test_a_trade_off_reason_on_a_cell_is_a_bad_reason():
    forged = entry(CELLS[0], "fail", "trade-off", "ptxas fatal")
    ledger = make_ledger([forged, entry(CELLS[1]), entry(CELLS[2])], 1)
    found = list(gate.bad_reasons(gate.Inputs(RunSummary(cells=[], results=[], kernels=[], duplicates=[]), ledger,
                                              {}, AllowedDuplicates())))
    assert [f.kind for f in found] == ["BAD REASON"]


BASE = make_ledger([entry(c) for c in CELLS], 0, [SassEntry(kernel="k", arch="sm_80", level=LEVEL)])


def loosened(now, base=BASE) -> list[tuple[str, bool]]:
    return [(found.subject, found.reason is not None) for found in loosenings(base, now)]


def test_against_the_base_a_hand_raised_cap_is_red():
    assert loosened(make_ledger(BASE.entries, 5, BASE.sass)) == [("max_not_pass", False)]


def test_against_the_base_a_blessed_new_entry_carries_its_reason():
    base = make_ledger([entry(c) for c in CELLS[1:]], 0, BASE.sass)  # before the ptxas cell existed
    results = [entry(CELLS[0], "blocked", "no-gpu", "needs a GPU"), entry(CELLS[1]), entry(CELLS[2])]
    now, _ = bless(base, CELLS, results, accept_new=True, sass={"k": {"sm_80": LEVEL}})
    assert loosened(now, base) == [("max_not_pass", True), ("k ptxas sm_80", True)]
    unreasoned = make_ledger([entry(CELLS[0], "blocked", None, "needs a GPU"), *results[1:]], 1, BASE.sass)
    assert loosened(unreasoned, base) == [("max_not_pass", False), ("k ptxas sm_80", False)]


def test_against_the_base_a_fail_where_it_passed_is_red_whatever_its_reason():
    now = make_ledger([entry(CELLS[0], "fail", "known-bug", "wrong"), *BASE.entries[1:]], 1, BASE.sass)
    assert ("k ptxas sm_80", False) in loosened(now)


def test_against_the_base_a_sass_rise_is_accepted_only_as_bless_records_it():
    blessed, _ = bless_sass(BASE.sass, {"k": {"sm_80": RAISED}}, {("k", "sm_80")}, accept_slower="trade-off")
    assert loosened(make_ledger(BASE.entries, 0, blessed)) == [("sass k sm_80", True)]
    forged = SassEntry(kernel="k", arch="sm_80", level=RAISED, reason="trade-off", rose_from=RAISED)
    assert loosened(make_ledger(BASE.entries, 0, [forged])) == [("sass k sm_80", False)]
    bare = SassEntry(kernel="k", arch="sm_80", level=RAISED)
    assert loosened(make_ledger(BASE.entries, 0, [bare])) == [("sass k sm_80", False)]
    no_rise = SassEntry(kernel="k", arch="sm_80", level=LEVEL, reason="trade-off", rose_from=LEVEL)
    assert loosened(make_ledger(BASE.entries, 0, [no_rise])) == [("sass k sm_80", False)]
    assert loosened(BASE) == []


def test_against_the_base_the_gate_prints_each_loosening_on_its_own_line():
    now = make_ledger(BASE.entries, 3, [SassEntry(kernel="k", arch="sm_80", level=RAISED)])
    inputs = gate.Inputs(RunSummary(cells=[], results=[], kernels=[], duplicates=[]), now, {}, AllowedDuplicates(),
                         BASE, "HEAD~1")
    lines = [str(f) for f in gate.against_base(inputs)]
    assert len(lines) == 2 and all(line.startswith("LOOSENED  ") and "(against HEAD~1)" in line for line in lines)


# --- base=REF read from git --------------------------------------------------------------

@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git repository holding BASE as ledger/ledger.json in one commit; the gate reads it there."""
    (tmp_path / "ledger").mkdir()
    (tmp_path / "ledger" / "ledger.json").write_text(dump_ledger(BASE))
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q"], ["add", "ledger"], ["commit", "-q", "-m", "base"]):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, env=env, capture_output=True)
    monkeypatch.setattr(config, "ROOT", tmp_path)
    return tmp_path


def test_the_base_ledger_is_read_from_git(repo):
    base, snapshot = gate.read_base("HEAD")
    assert base == BASE and snapshot.where == "HEAD" and snapshot.texts["ledger/ledger.json"] is not None


@pytest.mark.parametrize("ref, says", [
    ("no-such-ref", "base=no-such-ref: not a commit"), ("--output=/tmp/x", "is not a git ref"),
    ("HEAD~5", "base=HEAD~5: not a commit"), ("HEAD~l", "base=HEAD~l: not a commit"),
    ("HEAD@{2099-01-01}", "base=HEAD@{2099-01-01}: a reflog selector"), ("HEAD@{1}", "a reflog selector"),
])
def test_a_base_that_cannot_be_read_is_one_line(repo, ref, says):
    with pytest.raises(ArtifactError) as info:
        gate.read_base(ref)
    assert says in str(info.value) and "\n" not in str(info.value)


def commit_all(repo, message: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["add", "-A"], ["commit", "-q", "--allow-empty", "-m", message]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


def test_a_base_with_a_key_twice_is_one_line(repo):
    path = repo / "ledger" / "ledger.json"
    path.write_text(path.read_text().replace('"max_not_pass": 0,', '"max_not_pass": 0, "max_not_pass": 0,'))
    commit_all(repo, "twice")
    with pytest.raises(ArtifactError, match="duplicate key 'max_not_pass'"):
        gate.read_base("HEAD")


def test_a_base_with_no_ledger_is_one_line(repo):
    (repo / "ledger" / "ledger.json").unlink()
    commit_all(repo, "no ledger")
    with pytest.raises(ArtifactError, match=r"base=HEAD: has no ledger/ledger.json"):
        gate.read_base("HEAD")
    assert gate.read_base("HEAD~1")[0] == BASE


@pytest.mark.parametrize("ref", ["HEAD~l", "HEAD@{2099-01-01}", "no-such-ref"])
def test_the_gate_with_a_base_it_cannot_read_exits_2_with_one_line(repo, tmp_path, monkeypatch, capsys, ref):
    """An unreadable base gives no verdict (it used to print a line and judge without it: exit 0)."""
    ledger = make_ledger([], 0)
    (tmp_path / "ledger.json").write_text(dump_ledger(ledger))
    (tmp_path / "seals").mkdir()
    monkeypatch.setattr(gate, "LEDGER_FILE", tmp_path / "ledger.json")
    monkeypatch.setattr(gate, "SEALS_DIR", tmp_path / "seals")
    monkeypatch.setattr(gate, "ALLOWED_FILE", tmp_path / "allowed.yaml")
    monkeypatch.setattr(gate, "GATE_DIR", tmp_path / "gate")
    monkeypatch.setattr(gate, "summarize", lambda sets: RunSummary(cells=[], results=[], kernels=[], duplicates=[]))
    assert gate.main([]) == 0  # the control: the same world without a base is green
    capsys.readouterr()
    assert gate.main(["--base", ref]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"gate: cannot read base={ref}") and err.count("\n") == 1


def test_duplicate_keys_in_allowed_duplicates_are_exit_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "allowed.yaml").write_text("allowed: []\nallowed: []\n")
    monkeypatch.setattr(gate, "ALLOWED_FILE", tmp_path / "allowed.yaml")
    assert gate.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gate: cannot read ") and "duplicate key 'allowed'" in err and err.count("\n") == 1


def test_a_rule_list_a_new_ratchet_extends():
    """The gate's rules are plain functions in one tuple: a new one is appended, nothing else changes."""
    def always(i):
        yield gate.Finding("MISSING", "x", "planted", "nothing")

    run = RunSummary(cells=[], results=[], kernels=[], duplicates=[])
    assert gate.compare(run, make_ledger([], 0), {}, AllowedDuplicates(), gate.RULES + (always,))[-1].what == "planted"
    names = [r.__name__ for r in gate.RULES]
    assert {"sealed_against_run", "loose_cap", "loose_sass", "against_base"} <= set(names) and names[-1] == "not_run"
