"""The bench record (hslm_ptx.pipeline.bench.record) and its renderings (hslm_ptx.pipeline.bench.report): statistics, checks, peaks, summary, dispositions,
table, CSV, plot, predictions, and `python -m hslm_ptx.pipeline.bench.report`.

tests/data/bench/sample_hslm.json is SYNTHETIC sample data (``synthetic: true``, device
"SYNTHETIC SAMPLE - no GPU ran this"): made-up times that exercise every branch of the
report (a planted wrong-but-fastest baseline, rows that did not run, a failed graph
capture). It is not a measurement and nothing here reads it as one.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from hslm_ptx.pipeline.core.artifacts import read_model
from hslm_ptx.pipeline.core.config import ROOT
from hslm_ptx.pipeline.core.errors import UserError
from hslm_ptx.pipeline.bench.record import (PEAKS, BenchReport, Check, Row, Timing, gops, load_predictions, peak_for,
                                            percentiles, summarize, with_predictions)
from hslm_ptx.pipeline.bench.report import (CSV_COLUMNS, SYNTHETIC_BANNER, bars, configuration_races, csv_text, main,
                                            markdown, plot_png, write_outputs)

SAMPLE = Path(__file__).parent / "data" / "bench" / "sample_hslm.json"


@pytest.fixture(scope="module")
def sample() -> BenchReport:
    return read_model(SAMPLE, BenchReport)


# ---- statistics --------------------------------------------------------------------

def test_percentiles_by_hand():
    # 1..10: median 5.5; linear interpolation puts p10 at 1.9 and p90 at 9.1
    assert percentiles([float(x) for x in range(10, 0, -1)]) == pytest.approx((5.5, 1.9, 9.1))
    assert percentiles([7.0]) == (7.0, 7.0, 7.0)


def test_timing_recomputes_and_refuses_tampered_stats():
    t = Timing.of([3.0, 1.0, 2.0], calls_per_sample=4)
    assert (t.median_us, t.p10_us, t.p90_us) == pytest.approx((2.0, 1.2, 2.8))
    with pytest.raises(ValidationError, match="do not match"):
        Timing(**{**t.model_dump(), "median_us": 1.5})


@pytest.mark.parametrize("bad", [[1.0, float("nan")], [0.0, 1.0], [-2.0], [1.0, math.inf]])
def test_timing_refuses_impossible_samples(bad):
    with pytest.raises(ValueError, match="finite and > 0"):
        Timing.of(bad, 1)
    good = Timing.of([1.0, 2.0], 1)
    with pytest.raises(ValidationError, match="finite and > 0"):  # also when read from a file
        Timing(**{**good.model_dump(), "samples_us": bad})


def test_gops_counts_two_ops_per_mac():
    assert gops(1000, 1000, 1000, 1e-3) == pytest.approx(2000.0)
    assert gops(27, 243, 729, 1e-6) == pytest.approx(2 * 27 * 243 * 729 / 1e3)


# ---- output checks -----------------------------------------------------------------

def test_check_exact_and_tolerant():
    ref = np.arange(12, dtype=np.int64).reshape(3, 4) - 5
    assert Check.of(ref.copy(), ref, 0.0).passed
    off = ref.copy()
    off[2, 3] += 1
    bad = Check.of(off, ref, 0.0)
    assert not bad.passed and bad.max_abs_err == 1.0
    noisy = ref * (1 + 1e-4)
    assert Check.of(noisy, ref, 1e-3).passed
    assert not Check.of(noisy, ref, 1e-5).passed


def test_check_refuses_nan_inf_and_wrong_shape():
    ref = np.ones((2, 2))
    assert not Check.of(np.full((2, 2), np.nan), ref, 1e-2).passed
    assert not Check.of(np.array([[1, np.inf], [1, 1]]), ref, 1e-2).passed
    assert not Check.of(np.ones((2, 3)), ref, 1e-2).passed


# ---- peaks -------------------------------------------------------------------------

@pytest.mark.parametrize("name,tops", [
    ("NVIDIA H200", 1979.0), ("NVIDIA H200 NVL", 1670.5), ("NVIDIA H100 80GB HBM3", 1979.0),
    ("NVIDIA H100 PCIe", 1513.0), ("NVIDIA A100-SXM4-80GB", 624.0), ("NVIDIA L4", 242.5),
    ("NVIDIA L40S", 733.0),
])
def test_peak_table(name, tops):
    got, source = peak_for(name)
    assert got == tops
    assert "dense, no sparsity" in source and "datasheet" in source


def test_peak_unknown_device_is_none():
    assert peak_for("NVIDIA GeForce RTX 3090") == (None, None)
    # every entry is the dense figure: half of a sparse datasheet number, never above it
    assert all(0 < tops < 2000 for _, tops, _ in PEAKS)


# ---- the sample report -------------------------------------------------------------

def test_sample_is_marked_synthetic(sample):
    assert sample.synthetic and "SYNTHETIC" in sample.device.name
    text = markdown(sample)
    assert SYNTHETIC_BANNER in text
    assert text.index(SYNTHETIC_BANNER) < text.index("## hslm_fwd_s8")


def test_real_report_has_no_banner(sample):
    real = sample.model_copy(update={"synthetic": False})
    assert SYNTHETIC_BANNER not in markdown(real)


def test_summary_skips_a_wrong_baseline_however_fast(sample):
    rows = [r for r in sample.rows if (r.kernel, r.shape) == ("hslm_dx_s8", "attn_r27")]
    fastest = min((r for r in rows if r.stream and r.impl != "ours"), key=lambda r: r.stream.median_us)
    assert fastest.impl == "cublas_f16" and not fastest.check.passed
    s = next(s for s in sample.summary if (s.kernel, s.shape) == ("hslm_dx_s8", "attn_r27"))
    assert s.best_baseline == "cublas_int8"
    ours = next(r for r in rows if r.impl == "ours")
    best = next(r for r in rows if r.impl == "cublas_int8")
    assert s.ratio == pytest.approx(ours.stream.median_us / best.stream.median_us)
    # negative: were its check passed, it would win; so the exclusion is what decided
    fixed = [r.model_copy(update={"check": r.check.model_copy(update={"passed": True})})
             if r is fastest else r for r in rows]
    assert summarize(fixed, None)[0].best_baseline == "cublas_f16"


def test_summary_rates_and_peak_fraction(sample):
    s = sample.summary[0]
    row = next(r for r in sample.rows if (r.kernel, r.shape, r.impl) == (s.kernel, s.shape, "ours"))
    assert s.gops == pytest.approx(2 * row.R * row.K * row.N / (row.stream.median_us * 1e3))
    assert s.peak_fraction == pytest.approx(s.gops / (sample.device.peak_int8_tops * 1e3))
    assert summarize(sample.rows, None)[0].peak_fraction is None


def test_rows_not_run_never_count(sample):
    not_run = [r for r in sample.rows if r.error]
    assert not_run and not any(r.ok for r in not_run)
    assert all(s.best_baseline != "torch_int_mm" for s in sample.summary)
    assert "not run" in markdown(sample)


def test_report_refuses_a_summary_that_does_not_match_rows(sample):
    data = sample.model_dump()
    data["summary"][0]["ratio"] = 0.01
    with pytest.raises(ValidationError, match="summary does not match"):
        BenchReport.model_validate(data)


def test_markdown_shows_padding_graph_errors_and_wrong_rows(sample):
    text = markdown(sample)
    assert ("inner 243->244, out 243->244 (cuBLAS int8 IMMA needs m, k and lda, ldb, ldc "
            "multiples of 4)") in text
    assert "graph: CUDARuntimeError" in text
    assert "WRONG rel 5.0e-01" in text
    assert "## summary: ours / best baseline" in text
    assert text.count("| hslm_dw_s8 |") == 2  # one summary line per shape


def test_outputs_written_and_json_round_trips(sample, tmp_path):
    paths = write_outputs(sample, tmp_path)
    assert [p.name for p in paths] == ["sample.json", "sample.md", "sample.csv", "sample.png"]
    assert read_model(paths[0], BenchReport) == sample
    png = paths[3].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert paths[1].read_text() == markdown(sample)
    assert paths[2].read_text() == csv_text(sample)


# ---- dispositions and the CSV -------------------------------------------------------

def test_dispositions_of_the_sample(sample):
    got = {(r.kernel, r.shape, r.impl): r.disposition for r in sample.rows}
    assert got[("hslm_fwd_s8", "attn_r27", "ours")] == "passed"
    assert got[("hslm_dx_s8", "attn_r27", "cublas_f16")] == "incorrect"  # the planted wrong one
    assert got[("hslm_dx_s8", "ffn_up_r1782", "cublas_f16")] == "failed"  # a library error
    assert got[("hslm_fwd_s8", "attn_r27", "torch_int_mm")] == "not_run"  # torch missing
    assert set(got.values()) == {"passed", "incorrect", "failed", "not_run"}


def test_not_run_needs_a_reason(sample):
    row = next(r for r in sample.rows if r.not_run).model_dump()
    with pytest.raises(ValidationError, match="not_run needs the reason"):
        Row.model_validate({**row, "error": None})


def test_csv_has_one_line_per_row_with_disposition_and_full_precision(sample):
    lines = list(csv.DictReader(io.StringIO(csv_text(sample))))
    assert tuple(lines[0]) == CSV_COLUMNS and len(lines) == len(sample.rows)
    for line, row in zip(lines, sample.rows):
        assert (line["kernel"], line["shape"], line["impl"]) == (row.kernel, row.shape, row.impl)
        assert line["disposition"] == row.disposition
        assert line["us"] == (repr(row.stream.median_us) if row.stream else "")
        assert line["model_us"] == ""
    wrong = next(x for x in lines if x["disposition"] == "incorrect")
    assert float(wrong["rel_err"]) == pytest.approx(0.5)
    padded = next(x for x in lines if x["impl"] == "cublas_int8")
    assert padded["gemm"] == "27x244x244" and "out 243->244" in padded["note"]
    assert "FAILED" in markdown(sample)  # the failed row is named as such in the table


# ---- the plot ------------------------------------------------------------------------

def test_plot_plan_marks_wrong_and_missing_rows_in_place(sample):
    plan = bars(sample)
    assert len(plan) == len(sample.rows)  # every row has its slot, drawn or labelled
    assert all("\n" in b.group and "x" in b.group.split("\n")[1] for b in plan)  # RxKxN label
    assert next(b for b in plan if b.disposition == "incorrect").us is not None  # drawn, marked
    assert all(b.us is None for b in plan if b.disposition in ("failed", "not_run"))
    ours = next(b for b in plan if b.impl == "ours")
    assert ours.graph_us is not None and ours.graph_us < ours.us  # graph replay shown


def test_plot_draws_one_bar_per_timed_row_and_labels_the_rest(sample, monkeypatch):
    from matplotlib.axes import Axes

    drawn, labels = [], []
    real_bar, real_text = Axes.bar, Axes.text
    monkeypatch.setattr(Axes, "bar", lambda self, *a, **k: drawn.append(k) or real_bar(self, *a, **k))
    monkeypatch.setattr(Axes, "text", lambda self, x, y, s, **k: labels.append(s) or real_text(self, x, y, s, **k))
    plot_png(sample)
    timed = [r for r in sample.rows if r.disposition in ("passed", "incorrect")]
    assert len(drawn) == len(timed)
    assert labels.count("WRONG") == 1 and labels.count("failed") == 1
    assert labels.count("not run") == sum(r.not_run for r in sample.rows)
    assert sum(k.get("hatch") == "xx" for k in drawn) == 1  # only the wrong bar is hatched


# ---- predictions: the model_us column -------------------------------------------------

def _predictions(tmp_path, rows) -> Path:
    path = tmp_path / "pred.json"
    path.write_text(json.dumps(rows))
    return path


def test_predictions_fill_model_us_of_our_rows_only(sample, tmp_path):
    path = _predictions(tmp_path, [
        {"kernel": "hslm_fwd_s8", "shape": "attn_r27", "predicted_us": 7.5},
        {"kernel": "hslm_fwd_s8", "shape": "not_in_report", "predicted_us": 1.0}])
    got = with_predictions(sample, load_predictions(path))
    filled = [r for r in got.rows if r.model_us is not None]
    assert [(r.kernel, r.shape, r.impl, r.model_us) for r in filled] == \
        [("hslm_fwd_s8", "attn_r27", "ours", 7.5)]
    assert got.summary[0].model_us == 7.5 and got.summary[1].model_us is None
    BenchReport.model_validate(got.model_dump())  # summary still matches the rows
    assert "| 7.50 |" in markdown(got)
    line = next(x for x in csv.DictReader(io.StringIO(csv_text(got))) if x["model_us"])
    assert float(line["model_us"]) == 7.5
    assert any(b.model_us == 7.5 for b in bars(got))


@pytest.mark.parametrize("content,fragment", [
    ("{not json", "unreadable JSON"),
    ('{"kernel": "a"}', "expected a JSON list"),
    ('[{"kernel": "a", "shape": "b"}]', "entry 1: field 'predicted_us': Field required"),
    ('[{"kernel": "a", "shape": "b", "predicted_us": -1}]', "entry 1: field 'predicted_us'"),
    ('[{"kernel": "a", "shape": "b", "predicted_us": 1}, {"kernel": "a", "shape": "b", "predicted_us": 2}]',
     "entry 2: a second prediction for a b"),
])
def test_bad_prediction_file_is_one_line(tmp_path, content, fragment):
    path = tmp_path / "pred.json"
    path.write_text(content)
    with pytest.raises(UserError) as exc:
        load_predictions(path)
    assert fragment in str(exc.value) and "\n" not in str(exc.value) and "pred.json" in str(exc.value)


# ---- python -m hslm_ptx.pipeline.bench.report ----------------------------------------------------

def test_cli_re_renders_beside_the_json(sample, tmp_path, capsys):
    path = tmp_path / "bench-hslm.json"
    path.write_text(SAMPLE.read_text())
    assert main([str(path)]) == 0
    for suffix in (".md", ".csv", ".png"):
        assert (tmp_path / f"bench-hslm{suffix}").is_file()
    assert (tmp_path / "bench-hslm.md").read_text() == markdown(sample)
    assert path.read_text() == SAMPLE.read_text()  # the record itself is left alone
    assert capsys.readouterr().out.count("wrote ") == 3


def test_cli_with_predictions_writes_them_into_the_record(sample, tmp_path):
    path = tmp_path / "r.json"
    path.write_text(SAMPLE.read_text())
    pred = _predictions(tmp_path, [{"kernel": "hslm_dw_s8", "shape": "attn_r27", "predicted_us": 3.25}])
    assert main([str(path), str(pred)]) == 0
    again = read_model(path, BenchReport)
    assert [r.model_us for r in again.rows if r.model_us] == [3.25]
    assert "3.25" in (tmp_path / "r.csv").read_text()


@pytest.mark.parametrize("content", ["{broken", '{"shape_set": "x"}', None])
def test_cli_bad_file_is_one_line_exit_2(tmp_path, content):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    res = subprocess.run([sys.executable, "-m", "hslm_ptx.pipeline.bench.report", str(path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1 and "bad.json" in res.stderr
    assert not (tmp_path / "bad.md").exists()


def test_cli_usage_exit_2(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "record" in err and "--help" in err and err.count("\n") == 1


def test_cli_help_is_help_not_a_file_name(tmp_path):
    """--help prints the usage and exits 0; it is never read as the record's name."""
    res = subprocess.run([sys.executable, "-m", "hslm_ptx.pipeline.bench.report", "--help"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0 and res.stderr == ""
    assert res.stdout.startswith("usage: python -m hslm_ptx.pipeline.bench.report") and "--out" in res.stdout
    assert list(tmp_path.iterdir()) == []


def test_cli_writes_where_it_is_told(sample, tmp_path, capsys):
    src, out = tmp_path / "in", tmp_path / "elsewhere"
    src.mkdir()
    path = src / "bench-hslm.json"
    path.write_text(SAMPLE.read_text())
    assert main([str(path), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["bench-hslm.csv", "bench-hslm.md", "bench-hslm.png"]
    assert [p.name for p in src.iterdir()] == ["bench-hslm.json"]  # nothing beside the input


@pytest.mark.parametrize("args, fragment", [
    (["{json}", "--bogus"], "unrecognized arguments: --bogus"),
    (["{json}", "--out"], "argument --out: expected one argument"),
    (["{json}", "--out", "{json}"], "--out {json}: not a folder"),  # the record itself, say
])
def test_cli_bad_argument_is_one_line_and_writes_nothing(tmp_path, capsys, args, fragment):
    path = tmp_path / "bench-hslm.json"
    path.write_text(SAMPLE.read_text())
    assert main([a.format(json=path) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and fragment.format(json=path) in err and err.count("\n") == 1
    assert [p.name for p in tmp_path.iterdir()] == ["bench-hslm.json"]
    assert path.read_text() == SAMPLE.read_text()


def test_png_is_left_out_with_one_line_without_matplotlib(sample, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    written = write_outputs(sample, tmp_path, "r")
    assert [p.name for p in written] == ["r.json", "r.md", "r.csv"]
    assert not (tmp_path / "r.png").exists()
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "r.png: not drawn, matplotlib is not importable" in out


def test_partial_record_says_so(sample):
    partial = sample.model_copy(update={"complete": False, "stopped": "interrupted after 3 rows"})
    assert "> **Partial record**" in markdown(partial) and "interrupted after 3 rows" in markdown(partial)
    assert "Partial record" not in markdown(sample)


def _raced(sample: BenchReport, small_us: float) -> BenchReport:
    """The sample with a second configuration of hslm_fwd_s8 timed on attn_r27."""
    ours = next(r for r in sample.rows if r.kernel == "hslm_fwd_s8" and r.shape == "attn_r27" and r.impl == "ours")
    stream = Timing.of([small_us] * 5, ours.stream.calls_per_sample)
    small = ours.model_copy(update={"kernel": "hslm_fwd_s8_m32n16", "stream": stream})
    return sample.model_copy(update={"rows": [*sample.rows, small]})


def test_configuration_race_names_the_fastest_and_the_rules_pick(sample):
    ours = next(r for r in sample.rows if r.kernel == "hslm_fwd_s8" and r.shape == "attn_r27" and r.impl == "ours")
    slower, faster = (_raced(sample, ours.stream.median_us * f) for f in (2.0, 0.5))
    assert configuration_races(sample) == []  # one configuration timed: no race
    (race,) = configuration_races(slower)
    assert race.chosen == "hslm_fwd_s8_m32n16" and race.fastest == "hslm_fwd_s8"  # the rule was wrong here
    assert "| hslm_fwd_s8 | attn_r27 |" in markdown(slower)
    assert "| hslm_fwd_s8 | hslm_fwd_s8_m32n16 | no |" in markdown(slower)
    assert configuration_races(faster)[0].fastest == "hslm_fwd_s8_m32n16"
    assert "| hslm_fwd_s8_m32n16 | hslm_fwd_s8_m32n16 | yes |" in markdown(faster)
