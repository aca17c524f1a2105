"""docs/model-tables.md is generated (hslm_ptx.pipeline.stages.model_doc): the render is what the
reports say, and the gate's comparison finds a copy that differs, names its line, and
finds a missing file."""
from __future__ import annotations

from hslm_ptx.pipeline.stages import model_doc
from hslm_ptx.pipeline.stages.perf_model import LayerStepRow, ModelReport, ModelRow


def prediction(config: str, device_us: float) -> dict:
    return {"config": config, "phases": {p: 0.25 for p in ("prologue", "chunks", "outside", "epilogue", "drain")},
            "bounds": {b: 0.5 for b in ("serial", "l1", "l2", "dram", "reds")}, "fixed_us": 2.0,
            "device_us": device_us, "per_call_us": device_us + 5.0, "limiter": "serial", "pct_int8_peak": 1.5}


def report(gpu: str, ours_us: float = 3.0) -> ModelReport:
    row = {"kernel": "hslm_fwd_s8_m32", "shape": "attn_r27", "R": 27, "K": 243, "N": 243, "rule_pick": True,
           "ctas": 4, "ctas_per_sm": 2, "waves": 1, "fast_chunks": 3, "tail_chunks": 1,
           "clocks_per_instruction": 2.5, "l1_source": "emulator", "ours": prediction("32x128", ours_us),
           "reference": prediction("64x64", 4.0), "device_ratio": (0.6, ours_us / 4.0, 1.1),
           "per_call_ratio": (0.7, (ours_us + 5) / 9.0, 0.95), "verdict": "level"}
    unpicked = dict(row, kernel="hslm_fwd_s8", rule_pick=False, ours=prediction("128x128", 9.0))
    launch = {"kernel": "hslm_fwd_bf16_m32", "model": "gemm", "loop": "hslm_fwd_s8_m32", "bytes": 100,
              "device_us": ours_us, "limiter": "serial"}
    step = {"target": "hslm", "shape": "attn_r27", "R": 27, "K": 243, "N": 243, "launches": [launch],
            "gemm_device_us": ours_us, "other_device_us": 0.0, "eager_us": ours_us + 5, "graph_us": ours_us + 5,
            "torch_eager_us": 10.0, "torch_graph_us": 7.0, "eager_interval": (0.7, 0.8, 0.9),
            "graph_interval": (1.0, 8 / 7, 1.3)}
    return ModelReport(shape_set="hslm", gpu=gpu, gpu_name=f"GPU {gpu}", arch="sm_90", assumptions_sha256="0",
                       counts_sha256="0", sass_tools={}, rows=[ModelRow(**row), ModelRow(**unpicked)],
                       layer_steps=[LayerStepRow(**step)])


def build(ours_us: float = 3.0):
    return lambda shape_set, gpu: report(gpu, ours_us)


def test_the_render_lists_the_picks_their_ratio_and_the_steps():
    text = model_doc.markdown(model_doc.build_reports(build()))
    assert text.count("## GPU ") == len(model_doc.DOC_MODELS)
    assert ("| hslm_fwd_s8_m32 | attn_r27 | 4 | 2.500 | 0.25 | 0.25 | 3.00 | 8.00 | serial | 1.5 | 64x64 | 4.00 | "
            "9.00 | 0.750 [0.600-1.100] | 0.889 [0.700-0.950] | level |") in text
    assert "| hslm_fwd_s8 |" not in text  # only the rule's picks
    assert ("0 of 1 picked cells at or below the best reference over the whole interval (ahead), 1 level (the "
            "interval holds 1), 0 behind; per call: 1 ahead, 0 level, 0 behind.") in text
    assert ("| attn_r27 (R=27, K=243, N=243) | 1 | 3.00 | 0.00 | 8.00 | 10.00 | 0.800 [0.700-0.900] | 8.00 | 7.00 "
            "| 1.143 [1.000-1.300] |") in text
    assert "MODEL target: HSLM step, graph-replayed, within 1.5x" in text


def test_a_current_file_has_no_finding(tmp_path):
    path = tmp_path / "model-tables.md"
    path.write_text(model_doc.markdown(model_doc.build_reports(build())))
    assert model_doc.doc_findings(path, build()) == []


def test_a_figure_the_model_no_longer_predicts_is_stale_and_names_its_line(tmp_path):
    path = tmp_path / "model-tables.md"
    path.write_text(model_doc.markdown(model_doc.build_reports(build(3.0))))
    (finding,) = model_doc.doc_findings(path, build(3.5))
    assert finding.kind == "STALE" and finding.fix == "doit model:docs"
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "| hslm_fwd_s8_m32 |" in text)
    assert finding.what.startswith(f"line {line} differs")
    assert "3.50" in finding.what


def test_a_hand_edit_or_a_truncation_is_stale(tmp_path):
    path = tmp_path / "model-tables.md"
    text = model_doc.markdown(model_doc.build_reports(build()))
    path.write_text(text + "a note typed by hand\n")
    assert [f.kind for f in model_doc.doc_findings(path, build())] == ["STALE"]
    path.write_text(text.rsplit("\n", 3)[0] + "\n")
    assert [f.kind for f in model_doc.doc_findings(path, build())] == ["STALE"]


def test_no_file_is_missing(tmp_path):
    (finding,) = model_doc.doc_findings(tmp_path / "model-tables.md", build())
    assert finding.kind == "MISSING" and finding.fix == "doit model:docs"
