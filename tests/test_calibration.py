"""The cost model against published measurements (hslm_ptx/cost/calibration.yaml): the table,
its closing line, the targets, and that a bad point or file is refused in one line."""
from __future__ import annotations

import statistics

import pytest
import yaml

from hslm_ptx.pipeline.stages import perf_model
from hslm_ptx.pipeline.tasks import perf as tasks_perf
from hslm_ptx.pipeline.core.errors import UserError

CALIBRATION = perf_model.load_calibration()
DEVICES = perf_model.load_assumptions().devices
ROWS = perf_model.calibration_rows(CALIBRATION, DEVICES)
COUNTED = [r for r in ROWS if not r.fit]


def test_every_point_has_an_attributable_source_and_says_why_it_is_fit_or_held_out():
    assert {p.device for p in CALIBRATION.points} >= {"h100", "a100", "rtx4090", "a800_pcie"}
    for point in CALIBRATION.points:
        assert "github.com/" in point.source or "arxiv" in point.source.lower(), point.name
        assert "fate-oracle" not in point.source and "'" in point.source  # the exact line is quoted
        assert point.why.startswith("held out" if not point.fit else ("in the calibration", "sets "))


def test_the_held_out_set_is_large_and_in_the_hslm_regime():
    held = [r for r in ROWS if not r.fit]
    assert len(held) >= 30 and sum(r.int8_small_m for r in held) >= 15


def test_every_held_out_figure_is_in_its_quoted_line():
    held = [p for p in CALIBRATION.points if not p.fit]
    assert held and all(perf_model.figure_quoted(p) for p in held)
    # negative: a figure changed while its line still says the old one
    changed = held[0].model_copy(update={"published": held[0].published * 1.01})
    assert not perf_model.figure_quoted(changed)


def test_the_fit_set_holds_its_targets_and_every_fit_miss_says_why():
    errors = [abs(r.error_pct) for r in ROWS if r.fit]
    assert statistics.median(errors) <= 25 and max(errors) <= 60
    assert all(r.note for r in ROWS if r.fit and abs(r.error_pct) > 25)


def test_the_closing_lines_held_out_first():
    held = sorted(abs(r.error_pct) for r in ROWS if not r.fit)
    lines = perf_model.calibration_summary(ROWS)
    assert lines[0] == (f"held-out: {len(held)} points, median |error| {statistics.median(held):.1f}%, "
                        f"max {held[-1]:.1f}%")
    assert lines[1].startswith("held-out int8 M <= 512: ") and lines[2].startswith("fit: ")
    # negative: marking every point fit leaves no held-out point
    assert perf_model.calibration_summary([r.model_copy(update={"fit": True}) for r in ROWS])[0] == \
        "held-out: 0 points"


def test_a_data_parallel_library_point_is_scored_without_split_k():
    point = next(p for p in CALIBRATION.points if p.configs == "data-parallel" and p.M == 1)
    row, = perf_model.calibration_rows(perf_model.Calibration(points=[point]), DEVICES)
    free, = perf_model.calibration_rows(perf_model.Calibration(points=[point.model_copy(update={"configs": "any"})]),
                                        DEVICES)
    assert "split-K" not in row.config and "stream-K" not in row.config
    assert free.predicted >= row.predicted  # the whole class can only be as fast or faster


def test_a_wrong_published_figure_shows_as_an_error():
    point = CALIBRATION.points[1]
    doubled = perf_model.Calibration(points=[point.model_copy(update={"published": 2 * point.published})])
    row, = perf_model.calibration_rows(doubled, DEVICES)
    honest, = perf_model.calibration_rows(perf_model.Calibration(points=[point]), DEVICES)
    assert row.error_pct == pytest.approx(100 * ((1 + honest.error_pct / 100) / 2 - 1), abs=0.2)
    assert row.error_pct < -40


def test_the_committed_doc_is_the_generated_one():
    assert tasks_perf.CALIBRATION_DOC.read_text() == tasks_perf.calibration_markdown(ROWS)


def test_a_bad_point_is_one_line_naming_the_field(tmp_path):
    raw = yaml.safe_load(perf_model.CALIBRATION_FILE.read_text())
    raw["points"][0]["published"] = -1
    bad = tmp_path / "calibration.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(UserError, match=r"field 'points\.0\.published': Input should be greater than 0"):
        perf_model.load_calibration(bad)
    raw["points"][0]["published"] = 1.0
    raw["points"][0]["device"] = "v100"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(UserError, match="point 'h100-bf16-1024': unknown device 'v100'"):
        perf_model.calibration_rows(perf_model.load_calibration(bad), DEVICES)
    bad.write_text("points:\n  - name: a\n    name: b\n")
    with pytest.raises(UserError, match="duplicate key"):
        perf_model.load_calibration(bad)


def test_a_gemm_point_without_its_shape_is_refused():
    point = CALIBRATION.points[0].model_copy(update={"K": 0})
    with pytest.raises(UserError, match="a gemm needs M, N and K"):
        perf_model.calibration_rows(perf_model.Calibration(points=[point]), DEVICES)
