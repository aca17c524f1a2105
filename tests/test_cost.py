"""The one cost module (hslm_ptx/cost/model.py): its device facts, the committed loop counts
against the SASS, the serial phases worked by hand, the reference configurations and
the tile rule's rates."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from hslm_ptx.cost import model as cost
from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.tile import rule
from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.stages import perf_model
from hslm_ptx.pipeline.stages.sass import SassReport, sass_report

H200 = cost.device("h200")
GEMMS = [name for name, spec in KERNELS.items() if spec.is_gemm]


# ---- device facts --------------------------------------------------------------------

def test_every_device_figure_has_a_source():
    raw = json.loads(cost.DEVICES_FILE.read_text())
    for name, entry in raw["devices"].items():
        numbers = {k: v for k, v in entry.items() if isinstance(v, dict)}
        assert set(numbers) == set(cost.Device._fields) - {"name", "arch"}, name
        assert all(len(v["source"]) > 20 for v in numbers.values()), name


def test_the_corrected_l2_and_the_floor_and_launch_are_apart():
    assert 5500 <= H200.l2_bandwidth_gbs <= 7500  # public H100 microbenchmarks' range
    assert H200.kernel_fixed_us >= 2.0 and H200.launch_us > 0


def test_a_device_without_a_source_is_one_line_naming_the_field(tmp_path):
    raw = json.loads(cost.DEVICES_FILE.read_text())
    raw["devices"]["h200"]["red_gbs"]["source"] = " "
    bad = tmp_path / "devices.json"
    bad.write_text(json.dumps(raw))
    with pytest.raises(cost.CostInputError, match=r"field 'devices\.h200\.red_gbs': expected \{value"):
        cost.load_devices(bad)
    with pytest.raises(cost.CostInputError, match="missing"):
        cost.load_devices(tmp_path / "absent.json")
    with pytest.raises(cost.CostInputError, match="unknown device 'v100'; known in devices.json: h200"):
        cost.device("v100")


def test_the_tile_rule_scores_for_the_device_files_h200():
    assert rule.RULE_DEVICE == H200 and rule.TARGET_CTAS == H200.sms == 132


# ---- loop counts ---------------------------------------------------------------------

def test_no_kernel_module_carries_pasted_loop_counts():
    sources = [p.read_text() for p in (config.ROOT / "hslm_ptx" / "families").glob("hslm_*.py")]
    assert sources and not any("LOOP_INSTRUCTIONS" in text for text in sources)


@pytest.fixture(scope="module")
def fresh_sass(tmp_path_factory) -> dict[str, tuple[object, SassReport]]:
    """Each GEMM's PTX emitted afresh and counted as `doit sass` counts it (no artifacts/
    needed: a clean checkout has none): {kernel: (ptx path, SassReport)}."""
    tmp = tmp_path_factory.mktemp("sass")
    out = {}
    for name in GEMMS:
        ptx = tmp / f"{name}.ptx"
        ptx.write_text(KERNELS[name].emit())
        out[name] = ptx, sass_report(name, name, ptx, config.ARCHS)
    return out


def test_the_committed_counts_agree_with_the_sass_records(fresh_sass):
    counts = json.loads(cost.COUNTS_FILE.read_text())
    reports = {k: report for k, (_, report) in fresh_sass.items()}
    assert perf_model.counts_problems(counts, reports) == []
    # negative: a count changed by hand is found
    name = GEMMS[0]
    counts["kernels"][name]["archs"]["sm_90"]["fast"]["imma"] += 1
    fast = counts["kernels"][name]["archs"]["sm_90"]["fast"]
    sass_fast = reports[name].arch("sm_90").fast
    assert perf_model.counts_problems(counts, reports) == [
        f"hslm_ptx/cost/loop_counts.json: {name} sm_90 fast: (instructions, imma, global_bytes) "
        f"({fast['instructions']}, {fast['imma']}, {fast['global_bytes']}), the SASS "
        f"({sass_fast.instructions}, {sass_fast.imma}, {perf_model.global_bytes(sass_fast.classes)}); "
        "run `doit model:counts`"]


def test_the_stall_clocks_are_ptxas_s_for_the_forward_loop(fresh_sass):
    """Recount one body from a fresh cubin: the committed stall clocks are what the control
    bits of ptxas's code say (2-3.5 clocks an instruction at one warp a scheduler)."""
    ptx, report = fresh_sass["hslm_fwd_s8_m32"]
    listing = perf_model.cuobjdump_listing(ptx, "sm_90")
    fresh = perf_model.arch_counts(report.arch("sm_90"), perf_model.control_stalls(listing, "hslm_fwd_s8_m32"))
    committed = cost.loop_counts("hslm_fwd_s8_m32", "sm_90")
    assert fresh["fast"]["issue_clocks"] == committed.fast.issue_clocks
    assert 2.0 <= committed.clocks_per_instruction <= 3.6


def test_a_missing_entry_says_what_to_run(tmp_path):
    with pytest.raises(cost.CostInputError, match="no sm_90 loop counts for 'nope'; run `doit sass` then"):
        cost.loop_counts("nope")
    bad = tmp_path / "counts.json"
    bad.write_text("{")
    with pytest.raises(cost.CostInputError, match="not strict JSON"):
        cost.load_counts(bad)


# ---- serial phases -------------------------------------------------------------------

BODY = cost.LoopFigures(instructions=100, imma=16, issue_clocks=250, direct_loads=False)
COUNTS = cost.KernelCounts(fast=BODY, tail=None, outside_instructions=40)
WORK = cost.StagedWork(ctas=132, warps_per_cta=4, resident=1, fast_chunks=3, tail_chunks=0, stages=4, counts=COUNTS,
                       epilogue_wavefronts=256, output_bytes_per_cta=16384, splits=1, l2_bytes=0, dram_bytes=0)


def test_the_chunk_chain_is_the_largest_of_its_limits():
    # one warp per scheduler: stall clocks 250 > issue 100 > ring (300 + 30) / 3 = 110; tensor 16 IMMA x 4 warps
    assert cost.trip_cycles(H200, BODY, WORK, active=1) == 250
    # W straight into registers one chunk ahead: its L2 round trip (300) is the chain
    assert cost.trip_cycles(H200, BODY._replace(direct_loads=True), WORK, active=1) == 300
    # three CTAs on an SM: 3 warps a scheduler issue 300 instructions a trip
    assert cost.trip_cycles(H200, BODY, WORK, active=3) == 300
    # nothing prefetched: the whole round trip a chunk
    assert cost.trip_cycles(H200, BODY, WORK._replace(stages=2), active=1) == 330


def test_first_touches_wait_on_dram():
    """Copies of bytes no other CTA read before miss to DRAM: a launch whose copies are all
    first touches waits DRAM's round trip (600 + 30), half of them half DRAM's extra
    latency (300 + 150 + 30). Negative: with every byte read before, L2's."""
    once = WORK._replace(stages=2, first_touch=1.0)
    assert cost.trip_cycles(H200, BODY, once, active=1) == 630
    assert cost.trip_cycles(H200, BODY, once._replace(first_touch=0.5), active=1) == 480
    assert cost.trip_cycles(H200, BODY, once._replace(first_touch=0.0), active=1) == 330
    # one row of tiles (a short batch): B's share is copied once, A's rows by every column
    assert cost.first_touch_share(1, 6) == pytest.approx((1 / 6 + 1) / 2)
    assert cost.first_touch_share(1, 1) == 1.0 and cost.first_touch_share(100, 100) == pytest.approx(0.01)


def test_staged_phases_by_hand():
    p = cost.staged_phases(H200, WORK)
    clocks = 600 + 30 + 3 * 250 + 40 * 2.5 + 256 + 300  # DRAM + shared, chunks, outside at 2.5 clk, epilogue, drain
    assert p.serial == pytest.approx(clocks / 1.83e3) and p.limiter == "serial"
    assert p.device_us == pytest.approx(2.0 + clocks / 1.83e3) and p.per_call_us == pytest.approx(p.device_us + 5.0)
    # a second wave of CTAs doubles the serial part, never the fixed cost
    two = cost.staged_phases(H200, WORK._replace(ctas=264))
    assert two.serial == pytest.approx(2 * p.serial) and two.fixed == p.fixed
    # split-K: the reds at the atomic rate
    split = cost.staged_phases(H200, WORK._replace(splits=4, ctas=528, resident=4))
    assert split.reds == pytest.approx(528 * 16384 / (H200.red_gbs * 1e3))


def test_a_launch_with_one_split_runs_the_unsplit_path_outside_the_loop():
    counts = COUNTS._replace(outside_unsplit_instructions=16)
    assert counts.outside(1) == 16 and counts.outside(2) == 40
    assert COUNTS.outside(1) == 40  # not counted: the longest path stands in
    one = cost.staged_phases(H200, WORK._replace(counts=counts))
    assert one.outside == pytest.approx(16 * 2.5 / 1.83e3)  # 16 instructions at the loop's 2.5 clocks
    split = cost.staged_phases(H200, WORK._replace(counts=counts, splits=2))
    assert split.outside == pytest.approx(40 * 2.5 / 1.83e3)


def test_the_outside_path_is_timed_by_its_own_stall_clocks_where_counted():
    counts = COUNTS._replace(outside_unsplit_instructions=16, outside_issue_clocks=120, outside_unsplit_issue_clocks=24)
    assert counts.outside_clocks_per_instruction(1) == 1.5 and counts.outside_clocks_per_instruction(2) == 3.0
    one = cost.staged_phases(H200, WORK._replace(counts=counts))
    assert one.outside == pytest.approx(24 / 1.83e3)  # the path's 24 stall clocks, not 16 x the loop's 2.5
    # four CTAs of 4 warps on an SM: 4 warps a scheduler, one issue slot a clock each
    crowded = cost.staged_phases(H200, WORK._replace(counts=counts, ctas=4 * 132, resident=4))
    assert crowded.outside == pytest.approx(16 * 4 / 1.83e3)


def test_nothing_is_predicted_below_the_device_floor():
    tiny = WORK._replace(ctas=1, fast_chunks=0, epilogue_wavefronts=0, counts=COUNTS._replace(outside_instructions=0))
    assert cost.staged_phases(H200, tiny).device_us >= H200.kernel_fixed_us
    for cfg in cost.dense_configs("sm_90"):
        assert cost.dense_phases(H200, 1, 1, 1, "int8", cfg).device_us >= H200.kernel_fixed_us


# ---- the reference class -------------------------------------------------------------

def test_the_reference_class_has_the_configurations_a_user_would_get():
    labels = {c.label for c in cost.dense_configs("sm_80")}
    for tile in ("64x64", "128x64", "128x128"):
        assert {tile, f"{tile} split-K 2", f"{tile} stream-K"} <= labels
    assert not any("cluster" in label for label in labels)
    assert any("cluster" in c.label for c in cost.dense_configs("sm_90"))


def test_best_dense_is_the_lowest_of_them():
    cfg, best = cost.best_dense(H200, 1782, 243, 729)
    every = [cost.dense_phases(H200, 1782, 243, 729, "int8", c) for c in cost.dense_configs(H200.arch)]
    assert best.per_call_us == min(p.per_call_us for p in every)
    assert cost.dense_phases(H200, 1782, 243, 729, "int8", cfg) == best


def counts_file(folder: Path, **kernels) -> Path:
    """A loop-counts file in its own ``folder`` (the cost module keeps what it read of a
    path), of kernels given as (imma, instructions, issue_clocks, outside, outside_unsplit)."""
    def entry(imma, instructions, clocks, outside, unsplit):
        body = {"instructions": instructions, "imma": imma, "issue_clocks": clocks, "direct_loads": False,
                "global_bytes": 0.0}
        return {"archs": {"sm_90": {"fast": body, "tail": None, "outside_instructions": outside,
                                    "outside_unsplit_instructions": unsplit}}}
    folder.mkdir()
    path = folder / "loop_counts.json"
    path.write_text(json.dumps({"kernels": {k: entry(*v) for k, v in kernels.items()}, "occupancy": {}}))
    return path


def test_a_warps_straight_line_code_issues_in_its_stalls_or_in_every_sharing_warps_slots():
    assert cost.issue_cycles(100, 2.5, 1) == 250  # alone: ptxas's stall clocks
    assert cost.issue_cycles(100, 2.5, 2) == 250  # a second warp issues in the first's stalls
    assert cost.issue_cycles(100, 2.5, 3) == 300  # three: one issue slot a clock for each


def test_the_reference_configurations_count_their_outside_phase_by_hand():
    """The reference runs its own prologue and epilogue (devices.json's library figures),
    not ours: 80 + 5.5 a lane's accumulator at 3 clocks an instruction."""
    small = cost.DenseConfig("64x64", 64, 64, 4, 4, 3)  # 32 accumulators a lane, one CTA an SM: 1 warp a scheduler
    p = cost.dense_phases(H200, 64, 64, 64, "int8", small)
    assert p.outside == pytest.approx(H200.us((80 + 5.5 * 32) * 3))
    wide = cost.DenseConfig("128x256", 128, 256, 8, 3, 1)  # 128 accumulators, 2 warps a scheduler
    assert cost.dense_phases(H200, 128, 256, 64, "int8", wide).outside == pytest.approx(H200.us((80 + 5.5 * 128) * 3))
    # negative: a cheaper epilogue is a shorter outside phase, and the loop counts play no part
    cheap = H200._replace(library_epilogue_instructions=4.0)
    assert cost.dense_phases(cheap, 64, 64, 64, "int8", small).outside < p.outside
    # the serial phase holds it
    assert p.serial == pytest.approx(p.prologue + p.chunks + p.outside + p.epilogue + p.drain)


def test_split_k_pays_a_reduction_kernel_and_its_launch():
    plain = cost.DenseConfig("128x128", 128, 128, 8, 3, 1)
    split = plain._replace(label="128x128 split-K 4", split=4)
    one, four = (cost.dense_phases(H200, 128, 128, 8192, "int8", c) for c in (plain, split))
    assert four.launch_us == 2 * one.launch_us
    assert four.chunks < one.chunks  # each CTA walks a quarter of the k-tiles
    assert four.device_us > four.fixed + max(four.serial, four.l2, four.dram)  # + the reduction kernel


def test_torch_linear_is_three_bf16_gemms_and_the_bias_gradients_reduction():
    want = sum(cost.best_dense(H200, m, n, k, "bf16")[1].per_call_us
               for m, n, k in ((1782, 729, 243), (1782, 243, 729), (729, 243, 1782)))
    assert cost.torch_linear_step(H200, 1782, 243, 729, bias=False) == pytest.approx(want)
    assert want > 3 * (H200.kernel_fixed_us + H200.launch_us)
    reduction = cost.stream_phases(H200, (1782 * 729 + 729) * 2)  # dY read, db written, bf16
    assert cost.torch_linear_step(H200, 1782, 243, 729) == pytest.approx(want + reduction.per_call_us)
    assert len(cost.torch_linear_launches(H200, 1782, 243, 729)) == 4
    assert len(cost.torch_linear_launches(H200, 1782, 243, 729, bias=False)) == 3


def test_a_big_square_gemm_is_near_the_library_tensor_rate():
    _, p = cost.best_dense(H200, 8192, 8192, 8192, "int8", per_call=False)
    reached = 2 * 8192 ** 3 / (p.device_us * 1e-6) / (H200.int8_dense_tops * 1e12)
    assert 0.7 * H200.library_tensor_fraction < reached <= H200.library_tensor_fraction
    assert math.isclose(cost.host_loop_us(p), p.device_us)


# ---- launches that are not GEMMs, and a step of launches --------------------------------

def test_a_memory_bound_kernel_is_its_bytes_at_the_reachable_rate_plus_the_fixed_cost():
    p = cost.stream_phases(H200, 40.8e6)  # 40.8 MB at 4800 x 0.85 GB/s: 10 us
    assert p.device_us == pytest.approx(2.0 + 10.0) and p.limiter == "dram" and p.launch_us == H200.launch_us
    on_chip = cost.stream_phases(H200, 6.5e6, resident="l2")  # at L2's 6.5 TB/s: 1 us
    assert on_chip.device_us == pytest.approx(3.0) and on_chip.limiter == "l2"
    assert cost.stream_phases(H200, 0).device_us == H200.kernel_fixed_us  # never below the device floor


def test_eager_pays_every_launch_a_graph_replay_one():
    launches = [cost.stream_phases(H200, 40.8e6), cost.staged_phases(H200, WORK)]
    device = sum(p.device_us for p in launches)
    assert cost.eager_us(launches) == pytest.approx(device + 2 * H200.launch_us)
    assert cost.graph_us(H200, launches) == pytest.approx(device + H200.launch_us)
    torch = cost.torch_linear_gemms(H200, 27, 243, 729)
    assert len(torch) == 3 and cost.torch_linear_step(H200, 27, 243, 729, bias=False) == pytest.approx(
        cost.eager_us(torch))


@given(st.lists(st.floats(min_value=0, max_value=1e9), min_size=1, max_size=12))
def test_a_graph_replay_saves_exactly_the_launches_after_the_first(sizes):
    launches = [cost.stream_phases(H200, nbytes) for nbytes in sizes]
    assert all(p.device_us >= H200.kernel_fixed_us for p in launches)
    saved = cost.eager_us(launches) - cost.graph_us(H200, launches)
    assert saved == pytest.approx((len(launches) - 1) * H200.launch_us, rel=1e-9, abs=1e-6)
