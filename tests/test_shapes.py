"""shapes.yaml: the committed sets are what verify/bench need, and every bad entry is one line."""
from __future__ import annotations

import pytest

from hslm_ptx.pipeline.core.config import VERIFY_SETS
from hslm_ptx.pipeline.core.errors import UserError
from hslm_ptx.pipeline.core.shapes import load_set, load_shape_sets, parse_set_names, select_sets

GOOD = "tails:\n  - {name: a, R: 1, K: 17, N: 3}\n"


def dims(shapes):
    return {(s.R, s.K, s.N) for s in shapes}


def test_committed_sets():
    sets = load_shape_sets()
    assert list(sets)[:4] == ["smoke", "tails", "hslm", "large"]
    assert set(VERIFY_SETS) <= set(sets) and "large" not in VERIFY_SETS
    assert any(s.K % 16 for s in sets["smoke"])
    assert max(s.R * s.K * s.N for s in sets["smoke"]) <= 64 * 64 * 64
    assert {(1, 17, 3), (27, 243, 729), (5, 1, 1), (33, 31, 9)} <= dims(sets["tails"])
    hslm = {s.name: (s.R, s.K, s.N) for s in sets["hslm"]}
    for R in (27, 1782):
        assert hslm[f"attn_r{R}"] == (R, 243, 243)
        assert hslm[f"ffn_up_r{R}"] == (R, 243, 729)
        assert hslm[f"ffn_down_r{R}"] == (R, 729, 243)
    assert any(s.R >= 8192 and s.K >= 4096 and s.N >= 4096 for s in sets["large"])


def bad(tmp_path, text: str) -> str:
    path = tmp_path / "shapes.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as info:
        load_shape_sets(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}:")
    return message[len(str(path)):]


@pytest.mark.parametrize("text, expected", [
    ("tails:\n  - {name: a, R: 1, K: 2, N: 3}\n  - {name: odd, R: 1, K: 0, N: 3}\n",
     ": set 'tails' entry 2 ('odd'): field 'K': Input should be greater than or equal to 1"),
    ("tails:\n  - {name: a, R: 1, K: 2}\n",
     ": set 'tails' entry 1 ('a'): field 'N': Field required"),
    ("tails:\n  - {name: a, R: 1, K: 2, N: 3, M: 4}\n",
     ": set 'tails' entry 1 ('a'): field 'M': Extra inputs are not permitted"),
    ("tails:\n  - {R: x, K: 2, N: -1}\n",
     ": set 'tails' entry 1: field 'name': Field required; field 'R': Input should be a valid "
     "integer; field 'N': Input should be greater than or equal to 1"),
    # sizes are strict integers: no booleans, strings or floats
    ("tails:\n  - {name: a, R: 1, K: true, N: 3}\n", ": set 'tails' entry 1 ('a'): field 'K': Input should be a valid integer"),
    ("tails:\n  - {name: a, R: '32', K: 2, N: 3}\n", ": set 'tails' entry 1 ('a'): field 'R': Input should be a valid integer"),
    ("tails:\n  - {name: a, R: 1, K: 2, N: 32.0}\n", ": set 'tails' entry 1 ('a'): field 'N': Input should be a valid integer"),
    ("tails:\n  - {name: '..', R: 1, K: 2, N: 3}\n",
     ": set 'tails' entry 1 ('..'): field 'name': Value error, '..' is not a safe name: use letters, digits, "
     "'_', '.', '-', not only dots, at most 100 characters"),
    ("tails:\n  - {name: 'a b', R: 1, K: 2, N: 3}\n",
     ": set 'tails' entry 1 ('a b'): field 'name': Value error, 'a b' is not a safe name: use letters, "
     "digits, '_', '.', '-', not only dots, at most 100 characters"),
    ("tails:\n  - {name: a, R: 1, K: 2, N: 3}\n  - {name: a, R: 2, K: 2, N: 3}\n",
     ": set 'tails' entry 2 ('a'): field 'name': duplicate name in set 'tails'"),
    ("tails:\n  - 5\n", ": set 'tails' entry 1: Input should be a valid dictionary or instance of Shape"),
    ("tails: {name: a}\n", ": set 'tails' must be a non-empty list of shapes"),
    ("tails: []\n", ": set 'tails' must be a non-empty list of shapes"),
    ("- {name: a, R: 1, K: 1, N: 1}\n", ": expected a mapping of set name -> list of shapes"),
    ("'bad set':\n  - {name: a, R: 1, K: 1, N: 1}\n",
     ": set name 'bad set' is not a safe name: use letters, digits, '_', '.', '-', not only dots, at most 100 characters"),
    ("'..':\n  - {name: a, R: 1, K: 1, N: 1}\n",
     ": set name '..' is not a safe name: use letters, digits, '_', '.', '-', not only dots, at most 100 characters"),
    ("7:\n  - {name: a, R: 1, K: 1, N: 1}\n",
     ": set name 7 is not a safe name: use letters, digits, '_', '.', '-', not only dots, at most 100 characters"),
    ("tails:\n  - {name: a, R: 1\n", ": line 3: not valid YAML (expected ',' or '}', but got '<stream end>'); fix it (or git checkout it to start again)"),
])
def test_bad_entry_is_one_line(tmp_path, text, expected):
    assert bad(tmp_path, text) == expected


def test_good_file_and_missing_file(tmp_path):
    (tmp_path / "shapes.yaml").write_text(GOOD)
    assert dims(load_shape_sets(tmp_path / "shapes.yaml")["tails"]) == {(1, 17, 3)}
    (tmp_path / "shapes.yaml").unlink()
    with pytest.raises(UserError, match=r"shapes\.yaml: missing; it lists the shape sets"):
        load_shape_sets(tmp_path / "shapes.yaml")


def test_unknown_set_lists_known(tmp_path):
    path = tmp_path / "shapes.yaml"
    path.write_text(GOOD + "smoke:\n  - {name: t, R: 1, K: 1, N: 1}\n")
    assert list(select_sets(("smoke",), path)) == ["smoke"]
    assert [s.name for s in load_set("smoke", path)] == ["t"]
    with pytest.raises(UserError) as info:
        select_sets(("smoke", "x"), path)
    assert str(info.value) == f"unknown shape set 'x' in {path}; known: tails, smoke"


def test_parse_set_names():
    assert parse_set_names("smoke") == ("smoke",)
    assert parse_set_names(" smoke, tails,smoke ,") == ("smoke", "tails")
    with pytest.raises(UserError, match="give a set name or a comma list"):
        parse_set_names(" , ")
