"""`doit report` ends with a summary of its tables: what they add up to, what is missing."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from hslm_ptx.pipeline.stages import report


def ptxas(kernel: str, ok: bool) -> SimpleNamespace:
    return SimpleNamespace(kernel=kernel, ok=ok)


def cell(shape: str, passed: bool) -> SimpleNamespace:
    return SimpleNamespace(kernel="k", shape_set="smoke", shape=shape, passed=passed, backend="emulator")


ASKED = (["k", "b"], [("k", "smoke", "small"), ("k", "smoke", "tiny")])


def test_a_partial_run_says_what_has_no_report():
    text = report.summary(*ASKED, [ptxas("k", True)], [cell("small", True)], [])
    assert text.splitlines()[0] == "summary"
    assert "ptxas: 1 of 2 kernels reported; all within budget" in text
    assert "verify: 1 of 2 cells reported, on emulator; all exact" in text
    assert "2 asked for have no report" in text


def test_a_bad_kernel_and_a_wrong_cell_are_counted_and_named():
    text = report.summary(*ASKED, [ptxas("k", True), ptxas("b", False)], [cell("small", True), cell("tiny", False)],
                          [Path("hslm.md")])
    assert "1 over budget, spilling or refused (first: b)" in text
    assert "1 not exact (first: k smoke/tiny)" in text
    assert "bench: 1 table" in text and "no report" not in text


def test_nothing_on_disk_is_nothing_to_judge():
    text = report.summary(*ASKED, [], [], [])
    assert text.count("nothing to judge") == 2 and "4 asked for have no report" in text
