"""Every ```python block in the README and docs/ runs as written: a page's blocks in order,
in one namespace (as a reader types them into one session), from the checkout's root. A
block that quotes a file instead of showing what to type is fenced ```python excerpt and
is only parsed."""
from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python( excerpt)?\n(.*?)^```$", re.S | re.M)


def blocks(page: Path) -> list[tuple[bool, str]]:
    """(runs, code) for each python block of ``page``, in order."""
    return [(not excerpt, code) for excerpt, code in FENCE.findall(page.read_text())]


def test_the_pages_hold_python_blocks_to_run():
    runnable = [page.name for page in PAGES if any(runs for runs, _ in blocks(page))]
    assert "README.md" in runnable and "pytorch.md" in runnable


def test_a_block_that_does_not_run_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n```python\ny = x + 1\n```\n")
    (runs, code), = blocks(page)
    assert runs
    with pytest.raises(NameError):
        exec(compile(code, str(page), "exec"), {})


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)], ids=lambda p: p.name)
def test_every_python_block_runs_as_written(page, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    for runs, code in blocks(page):
        ast.parse(textwrap.dedent(code))  # an excerpt is still Python
        if runs:
            exec(compile(code, str(page), "exec"), namespace)
