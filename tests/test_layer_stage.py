"""`doit layer` (hslm_ptx.pipeline.tasks.layer), its ratchet (hslm_ptx.pipeline.ratchet.layer_ratchet) and the bench's
layer rows (hslm_ptx.pipeline.bench.layer, whose GPU part can only be refused here)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from doit.exceptions import TaskFailed

from hslm_ptx.pipeline.core.request import parse
from hslm_ptx.pipeline.bench import layer as bench_layer
from hslm_ptx.pipeline.stages import layer_count
from hslm_ptx.pipeline.ratchet import layer_ratchet
from hslm_ptx.pipeline.tasks import layer as tasks_layer
from hslm_ptx.pipeline.core.artifacts import read_model, write_model
from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.config import ROOT
from hslm_ptx.pipeline.core.errors import BlessRefused
from hslm_ptx.pipeline.ratchet.layer_ratchet import (bless_layer, dump_layer_ledger, gate_findings, judge_layer,
                                                     planned_bless, read_layer_ledger, write_layer_ledger)
from hslm_ptx.pipeline.core.layer_records import LayerCounts, LayerLedger, LayerLevel, LayerReport
from hslm_ptx.pipeline.core.models import Shape
from stepcases import HSLM, install_standins

from hslm_ptx.step import launches as layer_step
from hslm_ptx.catalog import registry

REASONS = {"trade-off", "no-gpu"}
SOURCE = "a" * 64


@pytest.fixture
def standins(monkeypatch):
    install_standins(monkeypatch)


def shape(name="attn_r27", R=27, K=243, N=243) -> Shape:
    return Shape(name=name, R=R, K=K, N=N)


# ---- the stage ------------------------------------------------------------------------------

def test_hslm_report_meets_the_targets_and_round_trips(standins, tmp_path):
    shapes = tuple(shape(n, *HSLM[n]) for n in HSLM)
    report = layer_count.build_report("hslm", shapes, SOURCE)
    assert [s.name for s in report.shapes] == list(HSLM)
    for s in report.shapes:
        assert tasks_layer.missed_targets(s) == []
        assert (s.launches, s.host_syncs, s.h2d_copies, s.foreign_allocations) == (3, 0, 0, 0)
        assert len(s.launch_list) == 3 and sum(x.bytes for x in s.launch_list) == s.bytes_moved
        assert (s.kept_weight_launches, s.inference_launches) == (2, 1)  # wsum, fwdw, bwd; fwdx, bwd; fwdq
    write_model(tmp_path / "hslm.json", report)
    assert read_model(tmp_path / "hslm.json", LayerReport) == report
    text = tasks_layer.layer_table(report)
    assert "ffn_down_r1782" in text and text.count(" met") == 6


def test_a_planted_launch_in_the_inference_forward_is_counted(standins, monkeypatch):
    real = layer_step._quantizing_product

    def twice(*args):
        real(*args)
        return real(*args)

    monkeypatch.setattr(layer_step, "_quantizing_product", twice)
    counted = layer_count.count_step(shape("attn_r27", *HSLM["attn_r27"]))
    assert (counted.launches, counted.kept_weight_launches, counted.inference_launches) == (3, 2, 2)


def test_a_planted_sync_misses_the_target(standins, monkeypatch):
    real = layer_step.prepare_and_forward

    def peeking(rt, *args):
        prepared, y, saved = real(rt, *args)
        float(prepared.beta[0])  # float(beta): the host waits
        return prepared, y, saved

    monkeypatch.setattr(layer_step, "prepare_and_forward", peeking)
    counted = layer_count.count_step(shape())
    assert counted.host_syncs == 1 and counted.sync_sites[0].startswith(__file__)
    assert tasks_layer.missed_targets(counted) == ["host syncs 1 > 0"]


def test_missed_targets_name_each():
    rec = LayerReport.model_validate({"shape_set": "s", "source_sha256": SOURCE, "shapes": [{
        "name": "a", "R": 1, "K": 1, "N": 1, "dtype": "bfloat16", "weight_dtype": "bfloat16", "bias": True,
        "launches": 11, "host_syncs": 0, "h2d_copies": 2, "foreign_allocations": 0, "bytes_moved": 31,
        "bytes_minimum": 10, "first_step_launches": 11, "launch_list": [], "kept_weight_launches": 3}]})
    assert tasks_layer.missed_targets(rec.shapes[0]) == ["launches 11 > 3", "kept weight launches 3 > 2",
                                                         "h2d copies 2 > 0", "bytes moved > 2.5 x minimum"]


def test_a_missing_kernel_fails_the_stage_in_one_line(monkeypatch, tmp_path):
    monkeypatch.delitem(registry.FAMILIES, "hslm_fwdw_bf16_bf16", raising=False)
    monkeypatch.setattr(tasks_layer, "report_path", lambda s: tmp_path / f"{s}.json")
    result = tasks_layer._layer("smoke")
    assert isinstance(result, TaskFailed)
    assert result.message.startswith("layer smoke/tiny: layer step: unknown kernel family 'hslm_fwdw_bf16_bf16'")
    assert "\n" not in result.message and not (tmp_path / "smoke.json").exists()


def test_the_stage_writes_its_report(standins, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(tasks_layer, "report_path", lambda s: tmp_path / f"{s}.json")
    assert tasks_layer._layer("smoke") is None
    report = read_model(tmp_path / "smoke.json", LayerReport)
    assert [s.name for s in report.shapes] == ["tiny", "small", "k_tail"]
    assert report.source_sha256 == layer_ratchet.step_source_sha256()
    assert "layer step (smoke)" in capsys.readouterr().out


def test_task_creator(monkeypatch):
    monkeypatch.setattr(tasks_layer, "current", lambda: parse(["doit", "layer", "shape=smoke,hslm"]))
    tasks = list(tasks_layer.task_layer())
    assert [t["name"] for t in tasks] == ["smoke", "hslm"]
    assert str(ROOT / "hslm_ptx" / "step" / "launches.py") in tasks[0]["file_dep"]
    assert tasks[1]["targets"] == [str(layer_ratchet.report_path("hslm"))]
    monkeypatch.setattr(tasks_layer, "current", lambda: parse(["doit", "layer", "shape=nope"]))
    (bad,) = list(tasks_layer.task_layer())
    assert bad["name"] == "error" and "unknown shape set 'nope'" in str(bad["actions"][0][1][0])


# ---- the ratchet ---------------------------------------------------------------------------------

def counts(**changes) -> LayerCounts:
    base = dict(launches=9, host_syncs=0, h2d_copies=0, foreign_allocations=0, bytes_moved=1000)
    return LayerCounts(**{**base, **changes})


def report(source=SOURCE, **by_shape) -> LayerReport:
    shapes = [{"name": name, "R": 1, "K": 1, "N": 1, "dtype": "bfloat16", "weight_dtype": "bfloat16", "bias": True,
               "bytes_minimum": 500, "first_step_launches": 9, "launch_list": [], **c.model_dump()} for name, c in by_shape.items()]
    return LayerReport.model_validate({"shape_set": "hslm", "source_sha256": source, "shapes": shapes})


def ledger(source=SOURCE, **by_shape) -> LayerLedger:
    return LayerLedger(source_sha256=source, levels=[
        level if isinstance(level, LayerLevel) else LayerLevel(shape_set="hslm", shape=name, level=level)
        for name, level in by_shape.items()])


def kinds(findings) -> list[tuple[str, str, bool]]:
    return [(f.kind, f.what, f.red) for f in findings]


def test_same_counts_are_green():
    assert judge_layer(ledger(a=counts()), {"hslm": report(a=counts())}, SOURCE, REASONS) == []


def test_a_rise_is_red_and_a_fall_is_information_on_a_new_source():
    moved = {"hslm": report(a=counts(launches=10, bytes_moved=900))}
    found = judge_layer(ledger(source="b" * 64, a=counts()), moved, SOURCE, REASONS)
    assert kinds(found)[1:] == [("SLOWER", "launches 9 in the ledger -> 10 now", True),
                                ("FASTER", "bytes_moved 1000 in the ledger -> 900 now", False)]
    assert found[1].subject == "layer hslm/a"
    # on the source the levels were sealed on, a count below its level is a hand-raised level
    found = judge_layer(ledger(a=counts()), moved, SOURCE, REASONS)
    assert kinds(found) == [("SLOWER", "launches 9 in the ledger -> 10 now", True),
                            ("LOOSENED", "bytes_moved 1000 in the ledger -> 900 now", True)]


def test_missing_both_ways():
    found = judge_layer(ledger(a=counts()), {"hslm": report(b=counts())}, SOURCE, REASONS)
    assert sorted(kinds(found)) == [("MISSING", "counted now, not in the ledger", True),
                                    ("MISSING", "in the ledger, not counted now", True)]


def test_a_stale_seal_and_a_stale_report():
    found = judge_layer(ledger(source="b" * 64, a=counts()), {"hslm": report(source="c" * 64, a=counts())},
                        SOURCE, REASONS)
    assert [f.kind for f in found] == ["STALE SEAL", "MISSING"]
    assert "counted from another step source" in found[1].what


def test_counts_without_a_ledger_are_unsealed():
    (found,) = judge_layer(None, {"hslm": report(a=counts())}, SOURCE, REASONS)
    assert found.kind == "UNSEALED" and found.red and "doit layer shape=hslm" in found.fix
    assert judge_layer(None, {}, SOURCE, REASONS) == []  # nothing counted, nothing held


def test_accepted_and_bad_reasons():
    accepted = LayerLevel(shape_set="hslm", shape="a", level=counts(launches=10), reason="trade-off",
                          rose_from=counts())
    found = judge_layer(ledger(a=accepted), {"hslm": report(a=counts(launches=10))}, SOURCE, REASONS)
    assert kinds(found) == [("ACCEPTED SLOWER", "launches 9 -> 10 accepted: trade-off", False)]
    bad = accepted.model_copy(update={"reason": "flaky"})
    found = judge_layer(ledger(a=bad), {"hslm": report(a=counts(launches=10))}, SOURCE, REASONS)
    assert [f.kind for f in found] == ["BAD REASON"]


def test_bless_records_new_levels_and_falls():
    new, notes = bless_layer(None, {"hslm": report(a=counts())}, SOURCE)
    assert new.levels[0].level == counts() and "new level" in notes[0]
    fell, notes = bless_layer(new, {"hslm": report(a=counts(bytes_moved=800))}, SOURCE)
    assert fell.levels[0].level.bytes_moved == 800 and notes == ["layer hslm/a: bytes_moved 1000 -> 800"]


def test_bless_refuses_a_rise_unless_accepted():
    held = ledger(a=counts())
    with pytest.raises(BlessRefused, match=r"counts rose: hslm/a launches 9 -> 10"):
        bless_layer(held, {"hslm": report(a=counts(launches=10))}, SOURCE)
    rose, _ = bless_layer(held, {"hslm": report(a=counts(launches=10))}, SOURCE, accept_slower="trade-off")
    assert (rose.levels[0].reason, rose.levels[0].rose_from) == ("trade-off", counts())
    back, _ = bless_layer(rose, {"hslm": report(a=counts())}, SOURCE)
    assert (back.levels[0].reason, back.levels[0].rose_from) == (None, None)


def test_bless_refuses_a_stale_report_and_keeps_other_sets():
    with pytest.raises(BlessRefused, match="counted from another step source"):
        bless_layer(None, {"hslm": report(source="c" * 64, a=counts())}, SOURCE)
    other = LayerLevel(shape_set="smoke", shape="tiny", level=counts())
    held = LayerLedger(source_sha256=SOURCE, levels=[other, LayerLevel(shape_set="hslm", shape="gone", level=counts())])
    new, notes = bless_layer(held, {"hslm": report(a=counts())}, SOURCE)
    assert [level.key for level in new.levels] == [("hslm", "a"), ("smoke", "tiny")]
    assert notes[-1] == "dropped 1 layer levels: hslm/gone"


def test_bless_and_gate_count_afresh(tmp_path):
    path, folder = tmp_path / "layer.json", tmp_path / "layer"
    assert read_layer_ledger(path) is None
    assert planned_bless(ledger_path=path, folder=folder)[0] is None  # nothing counted, nothing held
    assert gate_findings(REASONS, path, required=False, folder=folder) == []
    written = report(source="x" * 64, a=counts()).model_copy(update={"shape_set": "smoke"})
    write_model(folder / "smoke.json", written)  # what doit layer wrote: its set is what counts
    (unsealed,) = gate_findings(REASONS, path, folder=folder)
    assert unsealed.kind == "UNSEALED" and "smoke.json" in unsealed.what and "shape=smoke" in unsealed.fix
    planned, notes = planned_bless(ledger_path=path, folder=folder)  # counted again, not read back
    assert [level.key for level in planned.levels] == [("smoke", "k_tail"), ("smoke", "small"), ("smoke", "tiny")]
    assert planned.source_sha256 == layer_ratchet.step_source_sha256() and len(notes) == 3
    write_layer_ledger(planned, path)
    assert read_layer_ledger(path) == planned and path.read_text() == dump_layer_ledger(planned)
    assert len(path.read_text().splitlines()) == 4 + 3 + 2  # the head, one line a level, the tail
    assert gate_findings(REASONS, path) == []
    tiny = planned.levels[2]
    lowered = tiny.model_copy(update={"level": tiny.level.model_copy(update={"launches": tiny.level.launches - 1})})
    write_layer_ledger(planned.model_copy(update={"levels": [*planned.levels[:2], lowered]}), path)
    (slower,) = gate_findings(REASONS, path)
    assert (slower.kind, slower.subject) == ("SLOWER", "layer smoke/tiny") and slower.red


def test_a_set_gone_from_shapes_yaml(tmp_path):
    path, folder = tmp_path / "layer.json", tmp_path / "layer"
    gone = LayerLevel(shape_set="retired", shape="x", level=counts())
    write_layer_ledger(LayerLedger(source_sha256=layer_ratchet.step_source_sha256(), levels=[gone]), path)
    (found,) = gate_findings(REASONS, path, folder=folder)  # one line for the set, not one per level
    assert found.kind == "MISSING" and "set 'retired' is not in shapes.yaml" in found.what
    planned, notes = planned_bless(ledger_path=path, folder=folder)
    assert planned.levels == [] and notes == ["dropped 1 layer levels: retired/x"]


# ---- the bench's layer rows ------------------------------------------------------------------------

def test_bench_refuses_without_a_gpu(tmp_path):
    out = tmp_path / "layer.json"
    done = subprocess.run([sys.executable, "-m", "hslm_ptx.pipeline.bench.layer", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and not out.exists()
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "bench_layer needs a CUDA GPU" in lines[0] and "Traceback" not in done.stderr


@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required: --out"),
    (["--out", "x.json", "--budget-s", "0"], "--budget-s 0: expected a number of seconds > 0"),
    (["--out", "x.json", "--budget-s", "soon"], "argument --budget-s: invalid float value: 'soon'"),
    (["--out", "x.json", "--shape", "nope"], "unknown shape set 'nope'"),
])
def test_bench_arguments_are_one_line(argv, message, capsys):
    assert bench_layer.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_bench_timing_helpers():
    timing = bench_layer.summarize([3.0, 1.0, 2.0, 4.0, 5.0])
    assert (timing.median_us, timing.samples) == (3.0, 5) and timing.p10_us < timing.median_us < timing.p90_us
    assert [bench_layer.steps_per_sample(us) for us in (1000.0, 50.0, 0.0)] == [1, 4, bench_layer.MAX_STEPS_PER_SAMPLE]


def test_bench_rows_past_the_budget_are_not_run():
    ticks = iter([0.0, 0.0, 100.0, 100.0])

    class Boom:
        def __getattr__(self, name):
            raise RuntimeError("no such device")

    rows = bench_layer.run(Boom(), [shape()], budget_s=10, clock=lambda: next(ticks))
    assert [r.implementation for r in rows] == list(bench_layer.IMPLEMENTATIONS)
    assert rows[0].error == "RuntimeError: no such device"  # a failing row says why, in one line
    assert rows[1].error == "not run: the --budget-s 10 was spent"
    assert json.loads(rows[1].model_dump_json())["eager"] is None


class FakeCuda:
    """torch.cuda's events on a clock that one step advances by ``step_ms``."""

    def __init__(self, step_ms: float) -> None:
        self.now, self.step_ms, self.steps = 0.0, step_ms, 0

    def run(self) -> None:
        self.now += self.step_ms
        self.steps += 1

    def Event(self, enable_timing: bool = False):
        cuda = self

        class Event:
            def record(self) -> None:
                self.at = cuda.now

            def synchronize(self) -> None:
                pass

            def elapsed_time(self, end) -> float:
                return end.at - self.at

        return Event()


def test_bench_time_device_is_per_step():
    class FakeTorch:
        cuda = FakeCuda(step_ms=0.0625)  # 62.5 us a step (exact in binary): 4 steps a sample

    timing = bench_layer.time_device(FakeTorch, FakeTorch.cuda.run, samples=5)
    assert (timing.median_us, timing.samples) == (62.5, 5)
    assert FakeTorch.cuda.steps == 2 * bench_layer.WARMUP_STEPS + 5 * 4


def test_bench_ratios():
    t = lambda us: bench_layer.LayerTiming(median_us=us, p10_us=us, p90_us=us, samples=1)  # noqa: E731
    rows = [bench_layer.LayerBenchRow(shape="a", R=1, K=1, N=1, implementation="TernaryLinear", dtype="bfloat16",
                                      eager=t(30.0), graph=t(12.0)),
            bench_layer.LayerBenchRow(shape="a", R=1, K=1, N=1, implementation="nn.Linear", dtype="bfloat16",
                                      eager=t(20.0), graph=t(10.0)),
            bench_layer.LayerBenchRow(shape="b", R=1, K=1, N=1, implementation="TernaryLinear", dtype="bfloat16",
                                      error="boom")]
    assert [(q.shape, q.eager, q.graph) for q in bench_layer.ratios(rows)] == [("a", 1.5, 1.2), ("b", None, None)]


# ---- the hooks: the gate reports the layer findings, bless writes the levels ---------------------------

def test_the_gate_reports_the_layer_step(world, monkeypatch, capsys):
    from hslm_ptx.pipeline.ratchet import gate

    assert gate.main([]) == 0  # a ledger folder other than the project's need not hold layer levels
    monkeypatch.setattr(config, "LEDGER_FILE", world["ledger"])  # now it is the project's
    monkeypatch.setattr(gate, "counts_findings", lambda *a, **k: [])  # the loop-counts rule: tests/test_gate_counts.py
    monkeypatch.setattr(gate, "doc_findings", lambda *a, **k: [])  # the MODEL tables' rule: tests/test_model_doc.py
    monkeypatch.setattr(gate, "working_tree", lambda *a: None)  # the stores' pins: tests/test_gate_stores.py
    assert gate.main([]) == 1
    assert "UNSEALED  ledger/layer.json" in capsys.readouterr().out
    layer = world["ledger"].with_name("layer.json")
    reports, _ = layer_ratchet.count_sets(["smoke"], layer_ratchet.step_source_sha256())
    held, _ = bless_layer(None, reports, layer_ratchet.step_source_sha256())
    write_layer_ledger(held, layer)
    assert gate.main([]) == 0
    tiny = next(level for level in held.levels if level.shape == "tiny")
    lowered = tiny.model_copy(update={"level": tiny.level.model_copy(update={"bytes_moved": 1})})
    write_layer_ledger(held.model_copy(update={"levels": [lowered if x is tiny else x for x in held.levels]}), layer)
    assert gate.main([]) == 1
    assert "SLOWER  layer smoke/tiny: bytes_moved 1 in the ledger ->" in capsys.readouterr().out


def test_bless_writes_the_layer_levels_beside_the_projects_ledger(tmp_path, monkeypatch):
    from hslm_ptx.pipeline.ratchet import ledger

    path = tmp_path / "ledger.json"
    ledger.bless_file([], [], path=path)
    assert path.exists() and not (tmp_path / "layer.json").exists()  # not the project's ledger: untouched
    monkeypatch.setattr(ledger, "LEDGER_FILE", path)
    monkeypatch.setattr(layer_ratchet, "LAYER_DIR", tmp_path / "layer")
    written = report(a=counts()).model_copy(update={"shape_set": "smoke"})
    write_model(tmp_path / "layer" / "smoke.json", written)
    _, notes = ledger.bless_file([], [], path=path)
    held = read_layer_ledger(tmp_path / "layer.json")
    assert [level.shape for level in held.levels] == ["k_tail", "small", "tiny"]
    assert any(note.startswith("layer smoke/tiny: new level") for note in notes)
