"""hslm_ptx.pipeline.core.treememo and the checker's kept hashes: a value is kept exactly while the
files it came from are unchanged, and an edit is seen whatever it did to the mtime."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from hslm_ptx.pipeline.core import checker, treememo


@pytest.fixture
def tree(tmp_path, monkeypatch) -> Path:
    (tmp_path / "src" / "__pycache__").mkdir(parents=True)
    (tmp_path / "src" / "a.py").write_text("a = 1\n")
    (tmp_path / "src" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "shapes.yaml").write_text("smoke: []\n")
    monkeypatch.setattr(treememo, "RACY_NS", 0)  # the files above were written just now
    return tmp_path


def recall(tree: Path, key: dict | None = None) -> tuple[object, list[int]]:
    calls: list[int] = []

    def compute() -> dict:
        calls.append(1)
        return {"files": sorted(p.name for p in (tree / "src").iterdir()), "pair": (1, 2)}

    value = treememo.remembered(tree / "memo.json", key or {"shape": None}, [tree / "src"], [tree / "shapes.yaml"],
                                compute)
    return value, calls


def test_a_value_is_kept_until_a_file_changes(tree):
    first, calls = recall(tree)
    assert calls == [1] and first == {"files": ["__pycache__", "a.py"], "pair": [1, 2]}  # JSON both ways
    again, calls = recall(tree)
    assert calls == [] and again == first
    source = tree / "src" / "a.py"
    st = source.stat()
    source.write_text("a = 2\n")  # same size, mtime put back: the ctime still moved
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert recall(tree)[1] == [1]
    (tree / "src" / "b.py").write_text("")  # a new file under the folder
    assert recall(tree)[1] == [1] and recall(tree)[1] == []
    (tree / "shapes.yaml").unlink()  # a named file gone
    assert recall(tree)[1] == [1] and recall(tree)[1] == []


def test_a_bytecode_cache_is_not_part_of_the_stamp(tree):
    recall(tree)
    (tree / "src" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\1\2")
    assert recall(tree)[1] == []


def test_another_key_computes_again(tree):
    recall(tree)
    assert recall(tree, {"shape": "smoke"})[1] == [1]


@pytest.mark.parametrize("damage", ["{", "[]", '{"format": 1}', ""])
def test_an_unreadable_memo_is_a_miss(tree, damage):
    recall(tree)
    (tree / "memo.json").write_text(damage)
    assert recall(tree)[1] == [1] and recall(tree)[1] == []


def test_a_value_from_files_changed_just_before_is_not_kept(tree, monkeypatch):
    monkeypatch.setattr(treememo, "RACY_NS", 10**18)  # every file is "just changed"
    assert recall(tree)[1] == [1] and not (tree / "memo.json").exists()
    assert recall(tree)[1] == [1]


def test_a_file_changed_while_computing_keeps_nothing(tree):
    def compute() -> int:
        (tree / "src" / "a.py").write_text("edited meanwhile\n")
        return 1

    assert treememo.remembered(tree / "memo.json", {}, [tree / "src"], [], compute) == 1
    assert not (tree / "memo.json").exists()


# ---- the checker's hashes, kept between runs ----------------------------------------------

@pytest.fixture
def fresh_checker(monkeypatch):
    monkeypatch.setattr(checker, "_hashes", {})
    monkeypatch.setattr(checker, "_new", set())
    monkeypatch.setattr(checker, "_kept", [])
    monkeypatch.setattr(checker.atexit, "register", lambda f: None)  # written by hand below


def test_a_kept_hash_is_trusted_by_the_next_run_and_an_edit_is_not(tmp_path, fresh_checker, monkeypatch):
    path, memo = tmp_path / "k.ptx", tmp_path / "hashes.json"
    path.write_text("one")
    reads: list[str] = []
    monkeypatch.setattr(checker, "sha256_file", lambda p: reads.append(p) or Path(p).read_text())
    later = time.time_ns() + 10 * checker.RACY_NS  # hashed long after the file was written
    monkeypatch.setattr(checker.time, "time_ns", lambda: later)
    checker.keep_hashes(memo)
    assert checker.content_sha256(str(path)) == "one" and len(reads) == 1
    checker._write_kept()
    assert json.loads(memo.read_text())[0][0] == str(path)
    checker._hashes.clear()  # the next run
    checker._new.clear()
    checker.keep_hashes(memo)
    assert checker.content_sha256(str(path)) == "one" and len(reads) == 1  # from the memo
    st = path.stat()
    path.write_text("two")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert checker.content_sha256(str(path)) == "two" and len(reads) == 2
    checker._write_kept()
    assert [row[5] for row in json.loads(memo.read_text())] == ["two"]  # the old version is dropped


def test_a_damaged_hash_memo_is_a_miss_and_clean_writes_none(tmp_path, fresh_checker):
    path, memo = tmp_path / "k.ptx", tmp_path / "hashes.json"
    path.write_text("one")
    memo.write_text('[["k.ptx", 1, 2]]')
    checker.keep_hashes(memo)
    assert checker._hashes == {}
    checker.content_sha256(str(path))
    checker.drop_kept_hashes()  # what `doit clean` does
    memo.unlink()
    checker._write_kept()
    assert not memo.exists()
