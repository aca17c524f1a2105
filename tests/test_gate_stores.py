"""The gate judges every committed store as it judges the ledger: each flattering hand edit
below, committed in a scratch copy of the project's stores, is red (against bless's pins
and against base=REF), and green only once bless records it, where it then shows as an
ACCEPTED LOOSENING line for review.

Each case starts from the committed files themselves (ledger/layer.json,
hslm_ptx/cost/loop_counts.json, hslm_ptx/cost/calibration.yaml, shapes.yaml, hslm_ptx/cost/devices.json),
pinned as bless pins them, in a git repository of its own; the control (no edit) is green.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
from hypothesis import given, settings, strategies as st

from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.errors import ArtifactError
from hslm_ptx.pipeline.core.layer_records import LayerLedger
from hslm_ptx.pipeline.core.models import AllowedDuplicates, RunSummary
from hslm_ptx.pipeline.ratchet import gate, layer_ratchet, stores
from hslm_ptx.pipeline.ratchet.layer_ratchet import dump_layer_ledger, read_layer_ledger
from hslm_ptx.pipeline.ratchet import ledger as ledger_module
from hslm_ptx.pipeline.ratchet.ledger import REASONS, dump_ledger, make_ledger
from hslm_ptx.pipeline.ratchet.results import hashes_of_test_files
from hslm_ptx.pipeline.ratchet.seal import mismatches, read_seals

from gatecases import evidence_of

SEALED = read_seals()["hslm_fwd_s8"]  # a committed seal

COPIED = (stores.LAYER, stores.COUNTS, stores.CALIBRATION, stores.SHAPES, stores.DEVICES)
HELPER = "def exact(got, want):\n    return (got == want).all()\n"
TEST = "from xcases import exact\n\n\ndef test_x():\n    assert exact(1, 1)\n"
ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@t"}


def commit(root, message: str) -> None:
    for args in (["add", "-A"], ["commit", "-q", "--allow-empty", "-m", message]):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, env=ENV)


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A git repository holding copies of the committed stores, a ledger, two test files,
    and the pins bless writes for them, in one commit; config.ROOT points at it."""
    for path in COPIED:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(config.ROOT / path, tmp_path / path)
    (tmp_path / stores.LEDGER).write_text(dump_ledger(make_ledger([], 0)))
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(TEST)
    (tmp_path / "tests" / "xcases.py").write_text(HELPER)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, capture_output=True)
    stores.write_pins(root=tmp_path)
    commit(tmp_path, "base")
    monkeypatch.setattr(config, "ROOT", tmp_path)
    return tmp_path


def judged(root, base: str = "HEAD~1") -> list[gate.Finding]:
    """The store rules' findings on the working tree, against ``base``."""
    ledger, base_stores = gate.read_base(base)
    empty = RunSummary(cells=[], results=[], kernels=[], duplicates=[])
    return gate.compare(empty, ledger, {}, AllowedDuplicates(), base=ledger, base_ref=base,
                        stores=stores.working_tree(root), base_stores=base_stores)


def red(found) -> list[tuple[str, str]]:
    return [(f.kind, f.subject) for f in found if f.red]


def edit(root, path: str, change) -> None:
    file = root / path
    file.write_text(change(file.read_text()))


def bless(root, message: str = "blessed") -> list[str]:
    notes = stores.write_pins(root=root)
    commit(root, message)
    return notes


def test_the_control_is_green_against_its_base(project):
    commit(project, "nothing")
    assert judged(project) == []


# --- ledger/layer.json ---------------------------------------------------------------------

def layer(root) -> LayerLedger:
    return read_layer_ledger(root / stores.LAYER)


def write_layer(root, held: LayerLedger) -> None:
    (root / stores.LAYER).write_text(dump_layer_ledger(held))


def plain(held: LayerLedger) -> int:
    """The index of the first level bless holds without an accepted rise."""
    return next(n for n, level in enumerate(held.levels) if level.reason is None)


def raised(held: LayerLedger, by: int, **extra) -> LayerLedger:
    n = plain(held)
    first = held.levels[n]
    up = first.model_copy(update={"level": first.level.model_copy(update={"launches": first.level.launches + by}),
                                  **extra})
    return held.model_copy(update={"levels": [*held.levels[:n], up, *held.levels[n + 1:]]})


def name(held: LayerLedger) -> str:
    level = held.levels[plain(held)]
    return f"{level.shape_set}/{level.shape}"


def counted_afresh(root, subject: str) -> list[tuple[str, bool]]:
    """The layer judge of the gate (no base: the step counted now against the levels)."""
    return [(f.kind, f.red) for f in layer_ratchet.gate_findings(REASONS, root / stores.LAYER)
            if f.subject == f"layer {subject}"]


def test_the_layer_control_counts_green(project):
    assert counted_afresh(project, name(layer(project))) == []


def test_a_launch_level_raised_by_hand_is_red_with_and_without_a_base(project):
    held = layer(project)
    launches = held.levels[plain(held)].level.launches
    write_layer(project, raised(held, 9 * launches))
    commit(project, "launches x10")
    assert red(judged(project)) == [("LOOSENED", f"layer {name(held)} (against HEAD~1)")]
    assert counted_afresh(project, name(held)) == [("LOOSENED", True)]


def test_a_hand_written_trade_off_with_rose_from_is_red(project):
    """What bless writes for a rise it counted, written by hand over a count that did not rise:
    against the base it reads as bless's record, so the judge that counts afresh is what sees it."""
    held = layer(project)
    write_layer(project, raised(held, 4, reason="trade-off", rose_from=held.levels[plain(held)].level))
    commit(project, "trade-off by hand")
    assert counted_afresh(project, name(held)) == [("LOOSENED", True)]
    write_layer(project, raised(held, 0, reason="trade-off", rose_from=held.levels[plain(held)].level))
    commit(project, "reason without a rise")
    assert red(judged(project, "HEAD~2")) == [("LOOSENED", f"layer {name(held)} (against HEAD~2)")]
    assert counted_afresh(project, name(held)) == [("BAD REASON", True)]


# --- hslm_ptx/cost/loop_counts.json ----------------------------------------------------------------

def every(text: str, field: str, value: object) -> str:
    counts = json.loads(text)
    for entry in counts["kernels"].values():
        for arch in entry["archs"].values():
            for body in (arch["fast"], arch["tail"]):
                if body is not None:
                    body[field] = value
    return json.dumps(counts, indent=1)


@pytest.mark.parametrize("field, value", [("issue_clocks", 1), ("direct_loads", True), ("global_bytes", 32.0)])
def test_loop_counts_edited_on_the_same_ptx_are_red(project, field, value):
    edit(project, stores.COUNTS, lambda t: every(t, field, value))
    commit(project, f"every {field} {value}")
    found = red(judged(project))
    assert ("STALE SEAL", stores.COUNTS) in found
    assert any(kind == "LOOSENED" and subject.startswith(f"{stores.COUNTS} ") for kind, subject in found)
    line = next(str(f) for f in judged(project) if f.kind == "LOOSENED")
    assert "same PTX, other counts" in line and field in line


def test_an_outside_count_edited_is_red(project):
    def lower(text):
        counts = json.loads(text)
        first = next(iter(counts["kernels"].values()))
        for arch in first["archs"].values():
            arch["outside_issue_clocks"] = 1
        return json.dumps(counts)

    edit(project, stores.COUNTS, lower)
    commit(project, "outside 1")
    assert [k for k, s in red(judged(project)) if s.startswith(stores.COUNTS)].count("LOOSENED") == 1


# --- hslm_ptx/cost/calibration.yaml --------------------------------------------------------------

def point_names(root) -> list[str]:
    return [p["name"] for p in stores.points(stores.working_tree(root)).values()]


def flag_fit(text: str, names: list[str]) -> str:
    """``fit: true`` on the named held-out points (their own ``fit: false`` line flipped)."""
    for name in names:
        text = re.sub(rf"(  - name: {re.escape(name)}\n(?:    .*\n)*?)    fit: false\n", r"\1    fit: true\n",
                      text, count=1)
    return text


def test_points_marked_fit_by_hand_are_red(project):
    unfit = [n for n, p in stores.points(stores.working_tree(project)).items() if not p.get("fit")][:5]
    edit(project, stores.CALIBRATION, lambda t: flag_fit(t, unfit))
    commit(project, "five points fit")
    found = red(judged(project))
    assert sorted(s for k, s in found if k == "LOOSENED") == sorted(
        f"{stores.CALIBRATION} {n} (against HEAD~1)" for n in unfit)
    assert ("STALE SEAL", stores.CALIBRATION) in found


def test_a_published_figure_changed_is_red_and_not_in_its_source(project):
    edit(project, stores.CALIBRATION, lambda t: t.replace("published: 676.59", "published: 700.00", 1))
    commit(project, "a rounder figure")
    found = red(judged(project))
    name = next(n for n, p in stores.points(stores.working_tree(project)).items() if p["published"] == 700.0)
    assert ("UNSOURCED", f"{stores.CALIBRATION} {name}") in found
    assert ("LOOSENED", f"{stores.CALIBRATION} {name} (against HEAD~1)") in found


def test_every_committed_point_states_a_figure_of_its_quoted_line():
    assert stores.calibration_findings(stores.working_tree(config.ROOT)) == []


def test_a_published_figure_with_its_quoted_line_changed_too_is_still_red(project):
    """The quoted line changed with the figure reads as sourced, but not against the base."""
    edit(project, stores.CALIBRATION, lambda t: t.replace("676.59", "700.00"))
    commit(project, "figure and line")
    found = red(judged(project))
    assert [k for k, s in found if "(against" in s] == ["LOOSENED"]
    assert not any(k == "UNSOURCED" for k, _ in found)


def test_a_point_removed_is_red_and_new_fields_and_points_are_not(project):
    first = point_names(project)[0]
    edit(project, stores.CALIBRATION, lambda t: re.sub(rf"(  - name: {re.escape(first)}\n(?:    .*\n)*?)    why: .*\n",
                                                       r"\1    why: a reason of its own\n", t, count=1))
    bless(project, "a why: reworded")
    assert red(judged(project)) == []
    text = (project / stores.CALIBRATION).read_text()
    start = text.index(f"  - name: {first}\n")
    end = text.index("  - name: ", start + 1)
    (project / stores.CALIBRATION).write_text(text[:start] + text[end:])
    commit(project, "point removed")
    assert ("LOOSENED", f"{stores.CALIBRATION} {first} (against HEAD~1)") in red(judged(project))


# --- shapes.yaml -----------------------------------------------------------------------------

def test_a_shape_shrunk_under_its_name_is_red(project):
    edit(project, stores.SHAPES, lambda t: t.replace("{name: r8192,    R: 8192,", "{name: r8192,    R: 64,"))
    commit(project, "r8192 at R = 64")
    assert red(judged(project)) == [("STALE SEAL", stores.SHAPES),
                                    ("LOOSENED", f"{stores.SHAPES} large/r8192 (against HEAD~1)")]


def test_a_shape_grown_or_added_is_no_loosening(project):
    edit(project, stores.SHAPES, lambda t: t.replace("{name: r8192,    R: 8192,", "{name: r8192,    R: 9000,"))
    bless(project)
    assert judged(project) == []


# --- bless records it ------------------------------------------------------------------------

def test_once_bless_pins_an_edit_it_is_an_accepted_loosening_to_review(project):
    edit(project, stores.SHAPES, lambda t: t.replace("{name: r8192,    R: 8192,", "{name: r8192,    R: 64,"))
    notes = bless(project, "shrunk and blessed")
    assert notes == [f"stores: pinned {stores.SHAPES} (changed)"]
    found = judged(project)
    assert red(found) == [] and [(f.kind, f.red) for f in found] == [("ACCEPTED LOOSENING", False)]
    assert "R 8192 -> 64" in str(found[0])
    assert judged(project, "HEAD") == []  # against the blessed commit itself: nothing looser


def test_doit_bless_writes_the_pins_beside_the_projects_ledger(project, monkeypatch):
    path = project / stores.LEDGER
    (project / stores.PINS).unlink()
    ledger_module.bless_file([], [], path=path)
    assert not (project / stores.PINS).exists()  # not the project's ledger: no pins
    monkeypatch.setattr(ledger_module, "LEDGER_FILE", path)
    monkeypatch.setattr(ledger_module, "planned_bless", lambda *a: (None, []))  # the layer levels: test_layer_stage
    _, notes = ledger_module.bless_file([], [], path=path)
    assert f"stores: pinned {stores.SHAPES} (new)" in notes
    assert stores.pin_findings(stores.working_tree(project)) == []


# --- the test files --------------------------------------------------------------------------

def test_a_deleted_test_file_or_helper_is_red(project):
    (project / "tests" / "test_x.py").unlink()
    (project / "tests" / "xcases.py").unlink()
    commit(project, "tests deleted")
    found = red(judged(project))
    assert ("STALE SEAL", "tests/test_x.py") in found and ("STALE SEAL", "tests/xcases.py") in found
    assert ("LOOSENED", "tests/test_x.py (against HEAD~1)") in found
    assert ("LOOSENED", "tests/xcases.py (against HEAD~1)") in found
    bless(project, "removal recorded")
    assert red(judged(project, "HEAD~2")) == []


def test_a_new_test_file_is_unlisted_until_bless(project):
    (project / "tests" / "test_y.py").write_text(TEST)
    commit(project, "a new test")
    assert red(judged(project)) == [("UNLISTED", "tests/test_y.py")]
    bless(project)
    assert red(judged(project)) == []


def test_seals_pin_the_helpers_a_test_imports(project):
    hashes = hashes_of_test_files(["tests/test_x.py"])
    assert sorted(hashes) == ["tests/test_x.py", "tests/xcases.py"]
    (project / "tests" / "conftest.py").write_text("import xcases\n")
    assert sorted(hashes_of_test_files(["tests/test_x.py"])) == ["tests/conftest.py", "tests/test_x.py",
                                                                 "tests/xcases.py"]


def test_a_helper_made_to_always_pass_is_a_seal_mismatch(project):
    """tests/kernelcases.py's exact() made to return True, in small: the seal pins the helper."""
    sealed = SEALED.model_copy(update={"test_files": hashes_of_test_files(["tests/test_x.py"])})
    assert mismatches(sealed, evidence_of(sealed)) == []
    edit(project, "tests/xcases.py", lambda t: t.replace("return (got == want).all()", "return True"))
    now = evidence_of(sealed).model_copy(update={"test_files": hashes_of_test_files(["tests/test_x.py"])})
    assert [f for f, _, _ in mismatches(sealed, now)] == ["test file tests/xcases.py"]


# --- the gate's command line -------------------------------------------------------------------

def test_the_gate_exits_1_on_a_store_loosened_since_its_base(project, monkeypatch, capsys):
    monkeypatch.setattr(gate, "LEDGER_FILE", project / stores.LEDGER)
    monkeypatch.setattr(gate, "SEALS_DIR", project / "ledger" / "seals")
    monkeypatch.setattr(gate, "ALLOWED_FILE", project / "ledger" / "allowed.yaml")
    monkeypatch.setattr(gate, "GATE_DIR", project / "gate")
    monkeypatch.setattr(gate, "summarize", lambda sets: RunSummary(cells=[], results=[], kernels=[], duplicates=[]))
    monkeypatch.setattr(gate, "gather", lambda project: ())
    commit(project, "nothing")
    assert gate.main(["--base", "HEAD~1"]) == 0
    edit(project, stores.SHAPES, lambda t: t.replace("{name: r8192,    R: 8192,", "{name: r8192,    R: 64,"))
    commit(project, "shrunk")
    capsys.readouterr()
    assert gate.main(["--base", "HEAD~1"]) == 1
    out = capsys.readouterr().out
    assert "LOOSENED  shapes.yaml large/r8192 (against HEAD~1): shrunk under its name: R 8192 -> 64" in out


def test_an_unreadable_store_at_the_base_is_exit_2(project, monkeypatch, capsys):
    good = (project / stores.SHAPES).read_text()
    edit(project, stores.SHAPES, lambda t: t + "smoke: []\n")  # a key twice
    commit(project, "a key twice")
    (project / stores.SHAPES).write_text(good)
    commit(project, "fixed")
    with pytest.raises(ArtifactError, match=r"base=HEAD~1: shapes.yaml: .*duplicate key 'smoke'"):
        gate.read_base("HEAD~1")
    monkeypatch.setattr(gate, "LEDGER_FILE", project / stores.LEDGER)
    monkeypatch.setattr(gate, "SEALS_DIR", project / "ledger" / "seals")
    monkeypatch.setattr(gate, "ALLOWED_FILE", project / "ledger" / "allowed.yaml")
    monkeypatch.setattr(gate, "summarize", lambda sets: RunSummary(cells=[], results=[], kernels=[], duplicates=[]))
    assert gate.main(["--base", "HEAD~1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "duplicate key 'smoke'" in err


def test_a_store_with_a_byte_that_is_not_utf8_at_the_base_is_one_line(project):
    (project / stores.CALIBRATION).write_bytes((project / stores.CALIBRATION).read_bytes() + b"# \xff\n")
    commit(project, "a stray byte")
    with pytest.raises(ArtifactError, match=r"base=HEAD: hslm_ptx/cost/calibration.yaml: not UTF-8 \(byte 0xff"):
        gate.read_base("HEAD")


@pytest.mark.parametrize("text, says", [("[1, 2]", "field 'kernels': expected an object"),
                                        ('{"kernels": {}} {', "unreadable JSON")])
def test_loop_counts_that_are_not_an_object_at_the_base_are_one_line(project, text, says):
    (project / stores.COUNTS).write_text(text)
    commit(project, "counts replaced")
    with pytest.raises(ArtifactError, match=rf"base=HEAD: hslm_ptx/cost/loop_counts.json: .*{re.escape(says)}"):
        gate.read_base("HEAD")


@given(st.tuples(*[st.integers(1, 10_000)] * 3), st.tuples(*[st.integers(1, 10_000)] * 3))
@settings(max_examples=60, deadline=None)
def test_a_shape_is_a_loosening_exactly_when_a_dimension_shrank(was, now):
    def sets(dims):
        R, K, N = dims
        return stores.Snapshot("", {stores.SHAPES: f"s:\n  - {{name: a, R: {R}, K: {K}, N: {N}}}\n"}, (), None)

    found = list(stores.shape_loosenings(sets(was), sets(now)))
    assert bool(found) == any(b < a for a, b in zip(was, now))
    assert all(f.reason is None for f in found)  # nothing pinned: none is accepted


@given(st.integers(1, 10**7), st.integers(1, 10**4))
@settings(max_examples=60, deadline=None)
def test_a_published_figure_is_sourced_exactly_when_its_quoted_line_states_it(hundredths, off):
    figure = hundredths / 100

    def findings(published):
        text = (f"points:\n  - name: p\n    kind: stream\n    published: {published}\n"
                f"    source: \"a page: 'GB/s {figure:.2f}'\"\n")
        return stores.calibration_findings(stores.Snapshot("", {stores.CALIBRATION: text}, (), None))

    assert findings(f"{figure:.2f}") == []
    assert [f[0] for f in findings(f"{(hundredths + off) / 100:.2f}")] == ["UNSOURCED"]
