"""The cost model against published measurements (kernels/calibration.yaml): the table,
its closing line, the targets, and that a bad point or file is refused in one line."""
from __future__ import annotations

import statistics

import pytest
import yaml

from pipeline.stages import perf_model
from pipeline.stages import tasks_perf
from pipeline.core.errors import UserError

CALIBRATION = perf_model.load_calibration()
DEVICES = perf_model.load_assumptions().devices
ROWS = perf_model.calibration_rows(CALIBRATION, DEVICES)
COUNTED = [r for r in ROWS if not r.fit]


def test_at_least_twelve_points_each_with_an_attributable_source():
    assert len(COUNTED) >= 12
    assert {p.device for p in CALIBRATION.points} >= {"h100", "rtx4090", "a800_pcie"}
    for point in CALIBRATION.points:
        assert "github.com/" in point.source or "arxiv" in point.source.lower(), point.name
        assert "fate-oracle" not in point.source and "'" in point.source  # the exact line is quoted


def test_the_targets_hold_and_every_miss_says_why():
    errors = [abs(r.error_pct) for r in COUNTED]
    assert statistics.median(errors) <= 25 and max(errors) <= 60
    assert all(r.note for r in COUNTED if abs(r.error_pct) > 25)


def test_the_closing_line():
    errors = sorted(abs(r.error_pct) for r in COUNTED)
    assert perf_model.calibration_summary(ROWS) == (
        f"calibration: {len(errors)} points, median |error| {statistics.median(errors):.1f}%, max {errors[-1]:.1f}%")
    # fit points are shown but not counted
    assert perf_model.calibration_summary([r.model_copy(update={"fit": True}) for r in ROWS]) == "calibration: 0 points"


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
