"""The duplicate-body rule: copies found through renames and docstrings, small or
different bodies left alone, allowances matched and kept honest."""
from __future__ import annotations

import textwrap

import pytest

from hslm_ptx.pipeline.core.errors import ArtifactError
from hslm_ptx.pipeline.ratchet.dupbody import allowed_group, find_duplicates, main, read_allowed, stale_allowances
from hslm_ptx.pipeline.core.models import AllowedDuplicate, AllowedDuplicates

ORIGINAL = '''
def total(rows, scale):
    """Sum the rows, scaled."""
    acc = 0
    for row in rows:
        acc += row * scale
    return acc
'''


def tree(tmp_path, **files: str):
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return find_duplicates(tmp_path, ("hslm_ptx",))


def names(groups) -> list[list[str]]:
    return [[m.name for m in g.members] for g in groups]


def test_copy_with_renamed_locals_and_new_docstring_is_found(tmp_path):
    copy = '''
    class Acc:
        def summed(self_unused, xs, k):
            """Another docstring."""
            total_ = 0
            for x in xs:
                total_ += x * k
            return total_
    '''
    copy = copy.replace("self_unused, ", "")  # a plain function body inside a class: still a copy
    groups = tree(tmp_path, **{"hslm_ptx/a.py": ORIGINAL, "hslm_ptx/pipeline/sub/b.py": copy})
    assert names(groups) == [["hslm_ptx/a.py::total", "hslm_ptx/pipeline/sub/b.py::Acc.summed"]]
    assert groups[0].members[0].line == 2


@pytest.mark.parametrize("padding", [
    ("    acc = 0\n", "    acc = 0\n    pass\n"),  # an added pass
    ("    acc = 0\n", "    acc = 0\n    \"\"\"a bare string mid-body\"\"\"\n"),
    ("    acc = 0\n", "    acc = 0\n    ...\n    0\n"),  # bare constants
    ("        acc += row * scale\n", "        acc += row * scale\n        pass\n"),  # inside the loop
])
def test_a_copy_padded_with_statements_that_do_nothing_is_found(tmp_path, padding):
    copy = ORIGINAL.replace(*padding)
    assert copy != ORIGINAL
    groups = tree(tmp_path, **{"hslm_ptx/a.py": ORIGINAL, "hslm_ptx/pipeline/b.py": copy})
    assert names(groups) == [["hslm_ptx/a.py::total", "hslm_ptx/pipeline/b.py::total"]]


def test_a_small_body_padded_with_passes_stays_too_small(tmp_path):
    small = "def f(x):\n    y = x + 1\n    return y\n"
    padded = "def f(x):\n    pass\n    y = x + 1\n    pass\n    return y\n"
    assert tree(tmp_path, **{"hslm_ptx/a.py": small, "hslm_ptx/pipeline/b.py": padded}) == []


@pytest.mark.parametrize("other", [
    ORIGINAL.replace("row * scale", "row * scale + 1"),  # a different constant
    ORIGINAL.replace("def total(rows, scale)", "def total(scale, rows)"),  # arguments swapped
    ORIGINAL.replace("row * scale", "abs(row) * scale"),  # a different global call
    "def total(rows, scale):\n    acc = 0\n    return acc\n",  # too small to matter
])
def test_different_or_small_bodies_are_not_duplicates(tmp_path, other):
    assert tree(tmp_path, **{"hslm_ptx/a.py": ORIGINAL, "hslm_ptx/pipeline/b.py": other}) == []


def test_same_file_and_outside_scope_are_not_reported(tmp_path):
    twice = ORIGINAL + ORIGINAL.replace("def total", "def total2")
    assert tree(tmp_path, **{"hslm_ptx/a.py": twice, "tests/t.py": ORIGINAL}) == []


def test_a_copied_nested_function_is_reported_once(tmp_path):
    outer = "def outer(x):\n    y = x + 1\n" + textwrap.indent(ORIGINAL, "    ") + "    return total([y], 2)\n"
    groups = tree(tmp_path, **{"hslm_ptx/a.py": outer, "hslm_ptx/pipeline/b.py": outer})
    assert names(groups) == [["hslm_ptx/a.py::outer", "hslm_ptx/pipeline/b.py::outer"]]


def test_allowances_match_and_go_stale(tmp_path):
    groups = tree(tmp_path, **{"hslm_ptx/a.py": ORIGINAL, "hslm_ptx/pipeline/b.py": ORIGINAL})
    pair = ["hslm_ptx/a.py::total", "hslm_ptx/pipeline/b.py::total"]
    allowed = AllowedDuplicates(allowed=[AllowedDuplicate(functions=pair, reason="bench must not import kernels")])
    assert allowed_group(groups[0], allowed) and stale_allowances(groups, allowed) == []
    other = AllowedDuplicates(allowed=[AllowedDuplicate(functions=["hslm_ptx/a.py::total", "hslm_ptx/pipeline/c.py::f"], reason="x")])
    assert not allowed_group(groups[0], other)
    assert stale_allowances(groups, other) == [["hslm_ptx/a.py::total", "hslm_ptx/pipeline/c.py::f"]]


@pytest.mark.parametrize("text, message", [
    ("allowed:\n  - functions: [a.py::f, b.py::g]\n", "field 'allowed.0.reason': Field required"),
    ("allowed:\n  - functions: [a.py::f]\n    reason: why\n", "allowed.0.functions"),
    ("allowed: [\n", "not valid YAML"),
    ("allowed: []\nextra: 1\n", "field 'extra'"),
])
def test_bad_allowed_file_is_unreadable(tmp_path, text, message):
    (tmp_path / "allowed.yaml").write_text(text)
    with pytest.raises(ArtifactError, match=message):
        read_allowed(tmp_path / "allowed.yaml")


def test_unparsable_source_is_unreadable(tmp_path):
    with pytest.raises(ArtifactError, match="hslm_ptx/a.py:1: cannot parse"):
        tree(tmp_path, **{"hslm_ptx/a.py": "def broken(:\n"})


def test_the_repository_has_no_unallowed_duplicates():
    allowed = read_allowed()
    assert [g for g in find_duplicates() if not allowed_group(g, allowed)] == []


# ---- python -m hslm_ptx.pipeline.ratchet.dupbody ---------------------------------------------------------

def test_cli_help_is_help(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m hslm_ptx.pipeline.ratchet.dupbody") and "--root" in out


@pytest.mark.parametrize("args, fragment", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--root"], "argument --root: expected one argument"),
    (["--root", "{tmp}/nowhere"], "has no hslm_ptx/ folder"),
    (["--root", "{tmp}", "--allowed", "{tmp}/none.yaml"], "--allowed {tmp}/none.yaml: no such file"),
])
def test_cli_bad_argument_is_one_line_exit_2(tmp_path, capsys, args, fragment):
    (tmp_path / "hslm_ptx").mkdir()
    assert main([a.format(tmp=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and fragment.format(tmp=tmp_path) in err and err.count("\n") == 1


def test_cli_exits_1_on_a_duplicate_the_list_does_not_allow(tmp_path, capsys):
    tree(tmp_path, **{"hslm_ptx/a.py": ORIGINAL, "hslm_ptx/pipeline/b.py": ORIGINAL})
    assert main(["--root", str(tmp_path)]) == 1
    assert capsys.readouterr().out == "hslm_ptx/a.py::total:2 == hslm_ptx/pipeline/b.py::total:2\n"
    allowed = tmp_path / "ledger" / "allowed_duplicates.yaml"
    allowed.parent.mkdir()
    allowed.write_text("allowed:\n  - functions: [hslm_ptx/a.py::total, hslm_ptx/pipeline/b.py::total]\n    reason: why\n")
    assert main(["--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out.endswith("(allowed)\n")
    (tmp_path / "hslm_ptx" / "pipeline" / "b.py").write_text("x = 1\n")
    assert main(["--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("no function body repeated")
