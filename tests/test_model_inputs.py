"""The cost model's input files refused in one line naming the file and the field, under
the commands that read them: hslm_ptx/cost/devices.json and hslm_ptx/cost/loop_counts.json under
`doit model` (every subtask), `doit model:calibrate` and `doit layer` (the tile rule),
hslm_ptx/cost/calibration.yaml under `doit model:calibrate`. Each fault is planted in a copy
the readers are pointed at; the committed files pass the same checks."""
from __future__ import annotations

import json

import pytest
import yaml
from doit.exceptions import TaskFailed

from hslm_ptx.cost import model as cost
from hslm_ptx.catalog import registry
from hslm_ptx.kernel.spec import Dims
from hslm_ptx.pipeline.core.request import Request
from hslm_ptx.tile import rule
from hslm_ptx.pipeline.stages import build_plan, perf_model
from hslm_ptx.pipeline.tasks import layer as tasks_layer, perf as tasks_perf

DEVICES = json.loads(cost.DEVICES_FILE.read_text())
COUNTS = json.loads(cost.COUNTS_FILE.read_text())
CALIBRATION = yaml.safe_load(perf_model.CALIBRATION_FILE.read_text())
A_KERNEL = next(iter(COUNTS["kernels"]))


def one_line(message: str) -> str:
    assert "\n" not in message and "Traceback" not in message
    return message


def forget(monkeypatch, devices=None, counts=None) -> None:
    """Point every reader at the planted copies and drop what was read before."""
    if devices is not None:
        monkeypatch.setattr(cost, "DEVICES_FILE", devices)
    if counts is not None:
        monkeypatch.setattr(cost, "COUNTS_FILE", counts)
    for cached in (cost.load_devices, cost.read_counts_file, cost.load_ranges, rule.rule_device):
        cached.cache_clear()
    registry.forget_scores()


@pytest.fixture(autouse=True)
def restore():
    yield
    for cached in (cost.load_devices, cost.read_counts_file, cost.load_ranges, rule.rule_device):
        cached.cache_clear()
    registry.forget_scores()


def planted_devices(tmp_path, edit) -> object:
    raw = json.loads(json.dumps(DEVICES))
    text = edit(raw)
    path = tmp_path / "devices.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text if isinstance(text, str) else json.dumps(raw))
    return path


def set_h200(field: str, value: object):
    def edit(raw):
        raw["devices"]["h200"][field]["value"] = value
    return edit


DEVICE_FAULTS = {
    "clock_ghz 0": (set_h200("clock_ghz", 0), "devices.h200.clock_ghz.value"),
    "sms 1e400": (lambda raw: json.dumps(raw).replace('"value": 132,', '"value": 1e400,', 1),
                  "devices.h200.sms.value"),
    "sms NaN": (lambda raw: json.dumps(raw).replace('"value": 132,', '"value": NaN,', 1), "NaN"),
    "launch_us -5": (set_h200("launch_us", -5), "devices.h200.launch_us.value"),
    "a missing field": (lambda raw: raw["devices"]["h200"].pop("red_gbs") and None, "devices.h200.red_gbs"),
    "a top-level list": (lambda raw: "[1, 2]", "(top level)"),
    "a 0xff byte": (lambda raw: b'{"note": "\xff"}', "0xff"),
    "a range without the value": (lambda raw: raw["devices"]["h200"]["l2_latency_cycles"].update(range=[1, 2]),
                                  "devices.h200.l2_latency_cycles"),
}


@pytest.mark.parametrize("fault", DEVICE_FAULTS)
def test_a_bad_devices_file_is_one_line_under_every_command(fault, tmp_path, monkeypatch):
    edit, field = DEVICE_FAULTS[fault]
    bad = planted_devices(tmp_path, edit)
    forget(monkeypatch, devices=bad)
    # the kernel side alone (the tile rule under `doit layer`, `doit verify`)
    with pytest.raises(cost.CostInputError) as info:
        cost.load_devices()
    assert one_line(str(info.value)).startswith(f"{bad}: ") and field in str(info.value)
    # `doit model` and `doit model:calibrate`: each subtask exists and fails with the line
    tasks = {t["name"]: t for t in tasks_perf.task_model()}
    assert set(tasks) == set(tasks_perf.MODEL_SUBTASKS)
    action, args = tasks["calibrate"]["actions"][0]
    failed = action(*args)
    assert isinstance(failed, TaskFailed) and bad.name in one_line(failed.message)
    assert field in failed.message or "finite number" in failed.message


@pytest.mark.parametrize("fault", ["clock_ghz 0", "a missing field"])
def test_a_bad_devices_file_fails_doit_layer_in_one_line(fault, tmp_path, monkeypatch):
    edit, field = DEVICE_FAULTS[fault]
    forget(monkeypatch, devices=planted_devices(tmp_path, edit))
    monkeypatch.setattr(tasks_layer, "report_path", lambda s: tmp_path / f"{s}.json")
    result = tasks_layer._layer("smoke")
    assert isinstance(result, TaskFailed) and field in one_line(result.message)
    assert not (tmp_path / "smoke.json").exists()


def planted_counts(tmp_path, text: str):
    path = tmp_path / "loop_counts.json"
    path.write_text(text)
    return path


def with_clocks(value: str) -> str:
    raw = json.loads(json.dumps(COUNTS))
    raw["kernels"][A_KERNEL]["archs"]["sm_90"]["fast"]["issue_clocks"] = "@"
    return json.dumps(raw).replace('"@"', value)


@pytest.mark.parametrize("value, says", [("1e400", "issue_clocks': inf is not a whole count"),
                                          ("NaN", "NaN is not a figure"), ("-3", "issue_clocks': -3"),
                                          ("2.5", "issue_clocks': 2.5")])
def test_bad_loop_counts_are_one_line(value, says, tmp_path, monkeypatch):
    bad = planted_counts(tmp_path, with_clocks(value))
    forget(monkeypatch, counts=bad)
    with pytest.raises(cost.CostInputError) as info:
        cost.loop_counts(A_KERNEL, "sm_90")
    assert one_line(str(info.value)).startswith(f"{bad}: ") and says in str(info.value)


def test_a_bad_count_of_an_arch_no_command_reads_is_still_refused(tmp_path, monkeypatch):
    """Negative: the sm_80 record of a kernel the H200 rule never reads; the file is
    checked whole when it is read."""
    raw = json.loads(json.dumps(COUNTS))
    raw["kernels"][A_KERNEL]["archs"]["sm_80"]["fast"]["issue_clocks"] = -1
    forget(monkeypatch, counts=planted_counts(tmp_path, json.dumps(raw)))
    with pytest.raises(cost.CostInputError, match=r"archs\.sm_80\.fast\.issue_clocks': -1 is not a whole count"):
        cost.loop_counts(A_KERNEL, "sm_90")


@pytest.mark.parametrize("value", ["1e400", "NaN"])
def test_bad_loop_counts_are_one_line_where_the_tile_rule_reads_them(value, tmp_path, monkeypatch):
    """`doit layer` and `doit verify` create their tasks from the kernels' launches, which
    the tile rule picks from the counted loops: the plan holds the one line, not a traceback."""
    every = cost.COUNTS_FILE.read_text().replace('"issue_clocks": ', f'"issue_clocks": {value}, "was": ')
    forget(monkeypatch, counts=planted_counts(tmp_path, every))
    with pytest.raises(cost.CostInputError) as info:
        registry.choose("hslm_fwd_s8", Dims(27, 243, 729))
    assert "loop_counts.json: " in one_line(str(info.value))
    plan = build_plan._compute(Request())
    assert isinstance(plan["verify"], str) and "loop_counts.json: " in one_line(plan["verify"])


def test_unreadable_loop_counts_fail_model_run_and_docs_but_not_counts_or_calibrate(tmp_path, monkeypatch):
    every = cost.COUNTS_FILE.read_text().replace('"issue_clocks": ', '"issue_clocks": 1e400, "was": ')
    forget(monkeypatch, counts=planted_counts(tmp_path, every))
    tasks = {t["name"]: t for t in tasks_perf.task_model()}
    assert set(tasks) == set(tasks_perf.MODEL_SUBTASKS)
    for name in ("run", "docs"):
        action, args = tasks[name]["actions"][0]
        failed = action(*args)
        assert isinstance(failed, TaskFailed) and "issue_clocks': inf" in one_line(failed.message)
    # model:counts rewrites the file; model:calibrate does not read it
    assert tasks["counts"]["targets"] == [str(perf_model.COUNTS_FILE)] and "task_dep" not in tasks["docs"]
    assert tasks["calibrate"] == tasks_perf.calibrate_task()


def test_the_committed_inputs_pass():
    assert set(cost.devices_from(DEVICES, cost.DEVICES_FILE)) >= {"h200", "h100", "a100", "rtx4090"}
    assert set(perf_model.load_assumptions().devices) == set(DEVICES["devices"])
    for entry in COUNTS["kernels"]:
        assert cost.loop_counts(entry, "sm_90").fast.instructions > 0


def planted_calibration(tmp_path, text: str):
    path = tmp_path / "calibration.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("edit, says", [
    (lambda p: p.update(M=10**400), "points.0.M"),
    (lambda p: p.update(published=float("inf")), "points.0.published"),
    (lambda p: p.update(published=float("nan")), "points.0.published"),
])
def test_a_bad_calibration_figure_is_one_line(edit, says, tmp_path):
    raw = json.loads(json.dumps(CALIBRATION))
    edit(raw["points"][0])
    bad = planted_calibration(tmp_path, yaml.safe_dump(raw))
    with pytest.raises(perf_model.UserError) as info:
        perf_model.load_calibration(bad)
    assert f"field '{says}'" in one_line(str(info.value))


def test_a_duplicate_calibration_key_names_it_under_doit_model_calibrate(tmp_path, monkeypatch):
    text = perf_model.CALIBRATION_FILE.read_text().replace("    device: h100\n", "    device: h100\n    device: h100\n", 1)
    monkeypatch.setattr(perf_model, "CALIBRATION_FILE", planted_calibration(tmp_path, text))
    monkeypatch.setattr(tasks_perf, "CALIBRATION_DOC", tmp_path / "calibration.md")
    failed = tasks_perf._calibrate()
    assert isinstance(failed, TaskFailed) and "duplicate key 'device'" in one_line(failed.message)
    assert not (tmp_path / "calibration.md").exists()
