"""hslm_ptx.pipeline.stages.table: one Stage declaration gives the doit tasks, the judge, the reporter's lines
and the gate's re-run command; hslm_ptx.pipeline.core.checker's per-run hash cache never hides an edit."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import typing
from pathlib import Path

import pytest

from hslm_ptx.pipeline.core import checker
from hslm_ptx.pipeline.stages import report
from hslm_ptx.pipeline.core.errors import ArtifactError, UserError
from hslm_ptx.pipeline.core.models import Check, EmitResult
from hslm_ptx.pipeline.stages.table import NOTHING_RAN, Stage, judge, stage_rerun, summary_lines
from hslm_ptx.pipeline.tasks.build import PTXAS, VERIFY
from hslm_ptx.pipeline.tasks.layer import LAYER

ROOT = Path(__file__).resolve().parent.parent


def toy(problems=None, cells=lambda: ["a", "b"], **extra) -> Stage:
    return Stage(name="toy", doc="a toy stage", cells=cells,
                 cell_task=lambda c: {"name": c, "actions": None, "task_dep": [f"up:{c}"]},
                 problems=problems, **extra)


def test_a_stage_makes_its_cells_and_its_judge():
    stage = toy(problems=lambda c: [], judge_after=("other:check",), judged=lambda c: [Path(f"{c}.json"), Path("all.json")])
    assert stage.create_doit_tasks.basename == "toy" and stage.create_doit_tasks.__doc__ == "a toy stage"
    *cells, check = list(stage.create_doit_tasks())
    assert [t["name"] for t in cells] == ["a", "b"]
    assert all(t["meta"]["stage"] is stage and t["meta"]["cell"] == t["name"] for t in cells)
    assert cells[0]["task_dep"] == ["up:a"]  # the cell's own fields are kept
    assert check["name"] == "check" and check["task_dep"] == ["toy:a", "toy:b", "other:check"]
    # the judge reads the cells' records: they, and the cells, decide whether it is up to date
    assert check["file_dep"] == ["a.json", "all.json", "b.json"] and check["meta"] == {"stage": stage, "judge": True}
    assert check["uptodate"][0].config == {"cells": ["'a'", "'b'"]}


def test_a_stage_without_problems_has_no_judge_and_a_bad_input_fails_it_alone():
    assert [t["name"] for t in toy().create_doit_tasks()] == ["a", "b"]

    def bad() -> list[str]:
        raise UserError("shape=nope: unknown")

    (error,) = list(toy(cells=bad).create_doit_tasks())
    assert error["name"] == "error" and error["actions"][0][1] == ["shape=nope: unknown"]


def test_the_judge_fails_with_the_first_line_and_counts_the_rest(capsys):
    lines = {"a": ["a: over budget", "a: spills"], "b": ["b: mismatch"]}
    failed = judge(toy(problems=lines.get), ["a", "b"])
    assert str(failed).strip().endswith("a: over budget (+2 more)") and capsys.readouterr().out == ""
    failed = judge(toy(problems=lines.get, list_failing=True), ["a", "b"])
    assert str(failed).strip().endswith("a: over budget (+2 more above)")
    assert capsys.readouterr().out == "a: spills\nb: mismatch\n"
    assert judge(toy(problems=lambda c: []), ["a"]) == {}


def test_a_passing_judge_keeps_the_line_a_run_with_nothing_to_do_prints():
    stage = toy(problems=lambda c: [], summary=lambda cells, ran: f"toy: {len(cells)} cells ({ran} ran)")
    assert judge(stage, ["a", "b"]) == {NOTHING_RAN: "toy: 2 cells (0 ran)"}


def test_an_unreadable_record_fails_the_judge_with_one_line():
    def unreadable(cell: str) -> list[str]:
        raise ArtifactError(f"{cell}.json: unreadable JSON")

    assert "a.json: unreadable JSON" in str(judge(toy(problems=unreadable), ["a"]))


def test_summary_lines_table_only_when_a_cell_ran():
    stage = toy(table=lambda cells: "TABLE", summary=lambda cells, ran: f"toy: {len(cells)} ({ran} ran)")
    assert summary_lines(stage, ["a", "b"], 0) == ["toy: 2 (0 ran)"]
    assert summary_lines(stage, ["a", "b"], 1) == ["TABLE", "toy: 2 (1 ran)"]
    assert summary_lines(toy(), ["a"], 1) == []


def test_the_gate_re_runs_a_cell_with_its_stage_command():
    assert stage_rerun("verify", "tails/k_tail") == "doit verify shape=tails backend=emulator"
    assert stage_rerun("ptxas", "sm_80") == "doit ptxas"
    with pytest.raises(KeyError):
        stage_rerun("layer", "hslm")


def test_the_ledgers_checks_are_the_judged_stages():
    """The ledger's ``Check`` (a committed schema) names the judged stages and the kernel tests."""
    assert set(typing.get_args(Check)) == {PTXAS.name, VERIFY.name, "tests"}
    assert PTXAS.problems and VERIFY.problems and LAYER.problems is None
    assert VERIFY.judge_after == (f"{PTXAS.name}:check",)


# ---- the per-run caches ------------------------------------------------------------------

def test_a_file_is_hashed_once_per_version(tmp_path, monkeypatch):
    path = tmp_path / "k.ptx"
    path.write_text("one")
    reads = []
    monkeypatch.setattr(checker, "sha256_file", lambda p: reads.append(p) or Path(p).read_text())
    later = time.time_ns() + 10 * checker.RACY_NS  # as if hashed long after the file was written
    monkeypatch.setattr(checker.time, "time_ns", lambda: later)
    assert checker.content_sha256(str(path)) == "one" and checker.content_sha256(str(path)) == "one"
    assert len(reads) == 1  # the second read came from the cache
    stat = path.stat()
    path.write_text("two")  # same size; the mtime put back: ctime still moves
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert checker.content_sha256(str(path)) == "two" and len(reads) == 2


def test_a_file_changed_just_before_it_was_hashed_is_never_taken_from_the_cache(tmp_path, monkeypatch):
    path = tmp_path / "k.ptx"
    path.write_text("one")
    reads = []
    monkeypatch.setattr(checker, "sha256_file", lambda p: reads.append(p) or Path(p).read_text())
    checker.content_sha256(str(path))
    checker.content_sha256(str(path))
    assert len(reads) == 2  # written within RACY_NS of being hashed: re-read


def test_a_record_rewritten_in_place_is_read_again(tmp_path):
    path = tmp_path / "k.emit.json"
    first = EmitResult(kernel="k", entry="k", ptx_path="k.ptx", ptx_bytes=1, ptx_sha256="a" * 64,
                       source_sha256="c" * 64)
    path.write_text(first.model_dump_json())
    assert report.cached_record(path, EmitResult) == first
    assert report.cached_record(path, EmitResult) is report.cached_record(path, EmitResult)
    second = first.model_copy(update={"ptx_sha256": "b" * 64})
    (tmp_path / "new").write_text(second.model_dump_json())
    os.replace(tmp_path / "new", path)  # what write_model does
    assert report.cached_record(path, EmitResult) == second
    assert report.cached_record(tmp_path / "gone.json", EmitResult) is None
    with pytest.raises(ArtifactError):
        report.cached_record(tmp_path / "gone.json", EmitResult, required=True)


# ---- a stage in doit: only stale cells re-run ------------------------------------------------

TOY_DODO = '''
from pathlib import Path
from hslm_ptx.pipeline.core.checker import ContentChecker, targets_intact
from hslm_ptx.pipeline.tasks.reporter import StageReporter
from hslm_ptx.pipeline.stages.table import Stage

def copy(name):
    Path(f"out/{name}").write_text(Path(f"in/{name}").read_text())

def cell_task(name):
    return {"name": name, "actions": [(copy, [name])], "file_dep": [f"in/{name}"],
            "targets": [f"out/{name}"], "uptodate": [targets_intact()]}

COPY = Stage(name="copy", doc="copy each input", cells=lambda: ["a", "b", "c"], cell_task=cell_task,
             problems=lambda name: [f"{name}: bad"] if Path(f"out/{name}").read_text() == "bad" else [],
             judged=lambda name: [Path(f"out/{name}")],
             table=lambda cells: "TABLE", summary=lambda cells, ran: f"copy: {len(cells)} cells ({ran} ran)")
DOIT_CONFIG = {"dep_file": "db", "backend": "sqlite3", "check_file_uptodate": ContentChecker,
               "reporter": StageReporter, "verbosity": 2}
'''


def run_toy(folder: Path) -> tuple[int, set[str], str]:
    done = subprocess.run([sys.executable, "-m", "doit", "-f", str(folder / "dodo.py"), "-d", str(folder), "copy"],
                          cwd=ROOT, capture_output=True, text=True)
    ran = {line[3:].strip() for line in done.stdout.splitlines() if line.startswith(".  ")}
    return done.returncode, ran, done.stdout


def test_a_stage_in_doit_reruns_only_its_stale_cells(tmp_path):
    (tmp_path / "dodo.py").write_text(textwrap.dedent(TOY_DODO))
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    for name in "abc":
        (tmp_path / "in" / name).write_text(name)
    rc, ran, out = run_toy(tmp_path)
    assert rc == 0 and ran == {"copy:a", "copy:b", "copy:c", "copy:check"} and "TABLE" in out
    rc, ran, out = run_toy(tmp_path)
    # nothing ran: the line is the one the judge kept when it passed
    assert rc == 0 and ran == set() and out.splitlines()[-1] == "copy: 3 cells (0 ran)" and "TABLE" not in out
    source = tmp_path / "in" / "b"
    stat = source.stat()
    source.write_text("B")  # same size, mtime put back: content decides
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    rc, ran, out = run_toy(tmp_path)
    assert rc == 0 and ran == {"copy:b", "copy:check"} and out.splitlines()[-1] == "copy: 3 cells (1 ran)"
    (tmp_path / "out" / "c").write_text("damaged")  # a target edited by hand: its cell re-runs, and
    assert run_toy(tmp_path)[1] == {"copy:c"}  # writes what the judge last read: the judge is up to date
    (tmp_path / "in" / "a").write_text("bad")  # the cell records it; the judge fails
    rc, ran, out = run_toy(tmp_path)
    assert rc == 1 and ran == {"copy:a", "copy:check"} and "a: bad" in out
    rc, ran, out = run_toy(tmp_path)
    assert rc == 1 and ran == {"copy:check"}  # the judge stays stale while the evidence fails
