"""The performance model (hslm_ptx.pipeline.stages.perf_model): its assumptions file, each bound worked by
hand on a small invented loop, occupancy, and the emulator memory rows it reads."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest

from hslm_ptx.cost import model as cost
from hslm_ptx.tile import grouped
from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.kernel.spec import Dims, Launch
from hslm_ptx.tile import rule
from hslm_ptx.pipeline.stages import model_build
from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.stages import perf_model
from hslm_ptx.pipeline.stages import sass
from hslm_ptx.pipeline.core.errors import UserError
from hslm_ptx.pipeline.core.models import PtxasArch, Shape

ASSUMPTIONS = perf_model.load_assumptions()
H200 = ASSUMPTIONS.devices["h200"]


# ---- the assumptions file ------------------------------------------------------------

@pytest.mark.parametrize("name", list(ASSUMPTIONS.devices))
def test_every_number_has_a_source_and_the_peaks_agree_with_sms_and_clock(name):
    g = ASSUMPTIONS.devices[name]
    numbers = [v for v in g.model_dump().values() if isinstance(v, dict)]
    assert numbers and all(len(n["source"]) > 20 for n in numbers)
    assert g.arch in config.ARCHS
    # datasheet peak = SMs x clock x int8 ops per SM clock, a power of two (2048/4096/8192)
    per_clock = g.peak_ops_per_sm_clock
    assert abs(per_clock - 2 ** round(math.log2(per_clock))) / per_clock < 0.01


def test_bad_assumptions_file_is_one_line_naming_the_field(tmp_path):
    raw = json.loads(perf_model.DEVICES_FILE.read_text())
    del raw["devices"]["a100"]["clock_ghz"]["source"]
    bad = tmp_path / "devices.json"
    bad.write_text(json.dumps(raw))
    with pytest.raises(UserError, match=r"field 'devices\.a100\.clock_ghz\.source': Field required"):
        perf_model.load_assumptions(bad)


def test_the_assumptions_reader_refuses_a_duplicate_key_and_non_utf8(tmp_path):
    text = perf_model.DEVICES_FILE.read_text()
    twice = tmp_path / "twice.json"
    twice.write_text(text.replace('"devices": {', '"devices": {"h200": {}, ', 1))
    with pytest.raises(UserError, match="duplicate"):
        perf_model.load_assumptions(twice)
    latin = tmp_path / "latin.json"
    latin.write_bytes(text.encode("utf-8").replace(b"Hopper", b"Hopp\xe9r", 1))
    with pytest.raises(UserError, match="UTF-8|utf-8"):
        perf_model.load_assumptions(latin)


def test_unknown_gpu_lists_the_known_ones():
    with pytest.raises(UserError, match="unknown gpu 'v100'.*h200, rtx4090, a100"):
        perf_model.gpu(ASSUMPTIONS, "v100")


def test_the_validated_entry_is_the_cost_module_s_device():
    assert perf_model.as_device(H200) == cost.device("h200")


# ---- the work of a launch ------------------------------------------------------------

def test_chunks_fast_while_chunk_and_slack_fit():
    assert [rule.chunks(n) for n in (243, 64, 68, 1782, 1)] == [(3, 1), (0, 1), (1, 1), (27, 1), (0, 1)]


def body(instructions: int, imma: int, classes: dict[str, int]) -> sass.Body:
    lsu = sum(n for c, n in classes.items() if sass.is_lsu(c))
    return sass.Body(runs=["0x0-0x0"], instructions=instructions, nops=0, imma=imma, lsu=lsu,
                     classes={**classes, "tensor": imma}, per_imma=instructions / imma,
                     lsu_per_imma=lsu / imma, guarded_global_loads=0)


# an invented loop: fast 80 instructions (2 LDG.32, 1 STS.128, 4 LDS.128), tail 160 (32 LDG.8)
FAST = body(80, 8, {"ldg32": 2, "sts128": 1, "lds128": 4})
TAIL = body(160, 8, {"ldg8": 32, "sts128": 1, "lds128": 4})
LOOP = sass.LoopCounts(start="0x100", end="0x900", instructions=240, classes={}, paths=2)
SASS = sass.SassArch(arch="sm_90", instructions=300, loops=[LOOP], steady_loop="0x100", fast=FAST, tail=TAIL)
PTXAS = PtxasArch(arch="sm_90", registers=66, spill_stores=0, spill_loads=0, shared_bytes=2048, stack_bytes=0)
# the forward kernel on a fixed stand-in geometry (64 x 32 tiles of 4 warps, no split, nothing
# prefetched), so the figures below are worked by hand once and do not move with the kernel
FWD = dataclasses.replace(KERNELS["hslm_fwd_s8"], stages=1,
                          geometry=lambda d: Launch(grid=(-(-d.N // 32), -(-d.R // 64), 1), block=(128, 1, 1)))


def test_work_by_hand():
    # R=1782 K=243 N=243: 8 x 28 CTAs of 4 warps, K=243 -> 3 fast + 1 tail chunk
    w = perf_model.work(FWD, Dims(1782, 243, 243), SASS)
    assert (w.ctas, w.warps_per_cta, w.contraction, w.fast_chunks, w.tail_chunks) == (224, 4, 243, 3, 1)
    assert w.instructions_per_warp == 3 * 80 + 160 + (300 - 240)
    assert w.imma_per_warp == 32
    assert w.global_bytes_per_warp == 3 * 2 * 128 + 32 * 32
    assert w.compulsory_bytes == 1782 * 243 * 4 + 1782 * 243 + 243 * 16 * 4  # y int32, x int8, w packed


# the stall clocks and the outside instructions of the invented loop
COUNTS = cost.KernelCounts(fast=cost.LoopFigures(80, 8, 240, True), tail=cost.LoopFigures(160, 8, 400, True),
                           outside_instructions=60)


def test_a_planted_regression_raises_the_prediction():
    shape = Shape(name="s", R=1782, K=729, N=243)
    before = perf_model.model_row(FWD, shape, H200, SASS, COUNTS, PTXAS, None, "-")
    slower = COUNTS._replace(fast=COUNTS.fast._replace(issue_clocks=2400))
    after = perf_model.model_row(FWD, shape, H200, SASS, slower, PTXAS, None, "-")
    assert after.ours.phases["chunks"] > before.ours.phases["chunks"]
    assert after.ours.device_us > before.ours.device_us and after.kind == "MODEL"
    assert after.reference == before.reference  # the reference class does not read our SASS


def test_every_prediction_is_at_or_above_the_device_floor():
    for shape in (Shape(name="a", R=1, K=1, N=1), Shape(name="b", R=27, K=243, N=243)):
        row = perf_model.model_row(FWD, shape, H200, SASS, COUNTS, PTXAS, None, "-")
        assert row.ours.device_us >= H200.kernel_fixed_us.value <= row.reference.device_us
        assert row.ours.per_call_us == pytest.approx(row.ours.device_us + H200.launch_us.value, abs=1e-3)


def test_split_k_by_hand():
    # the same problem split in two along z, 4-stage ring, one loop body (no tail body)
    split = dataclasses.replace(FWD, stages=4,
                                geometry=lambda d: Launch(grid=(-(-d.N // 32), -(-d.R // 64), 2), block=(128, 1, 1)))
    one_body = SASS.model_copy(update={"tail": None})
    w = perf_model.work(split, Dims(1782, 243, 243), one_body)
    # K=243 is 4 chunks of 64; 2 splits -> 2 chunks a CTA, both on the one body
    assert (w.ctas, w.fast_chunks, w.tail_chunks, w.stages, w.splits) == (448, 2, 0, 4, 2)
    row = perf_model.model_row(split, Shape(name="s", R=1782, K=243, N=243), H200, one_body, COUNTS, PTXAS, None, "-")
    # the reds: every CTA adds its int32 share at the atomic rate
    assert row.ours.bounds["reds"] == pytest.approx(448 * w.output_bytes_per_cta / (H200.red_gbs.value * 1e3),
                                                    abs=1e-4)


def test_occupancy_from_ptxas():
    # 66 registers -> 2304 per warp -> 65536 / (4 x 2304) = 7 CTAs; shared allows 76, warps 16
    assert perf_model.ctas_per_sm(H200, 4, PTXAS) == 7
    assert perf_model.ctas_per_sm(H200, 4, PTXAS.model_copy(update={"registers": 255})) == 2
    assert perf_model.ctas_per_sm(H200, 4, PTXAS.model_copy(update={"shared_bytes": 100_000})) == 2


# ---- emulator memory rows --------------------------------------------------------------

ROW = {"line": 40, "opcode": "ld.global.u32", "space": "global", "in_loop": True, "requests": 10,
       "bytes_used": 1280, "sectors": 80, "lines": 20, "wavefronts": 300, "ideal_wavefronts": 100}


def test_memory_rows_from_a_verify_report_feed_l1(tmp_path):
    report = tmp_path / "cell.json"
    shared = dict(ROW, opcode="ld.shared.u32", space="shared", sectors=0, lines=0)
    report.write_text(json.dumps({"kernel": "k", "launch_stats": {"memory": [ROW, shared, dict(ROW, space="param")]}}))
    rows = perf_model.memory_rows_from_report(report)
    w = perf_model.work(FWD, Dims(1782, 243, 243), SASS)
    # global: one wavefront per 128-byte line (20); shared: its bank wavefronts (300); param: none
    assert perf_model.l1_per_cta(w, rows, "emulator (cell.json)") == ((20 + 300) / 224, "emulator (cell.json)")
    output, source = perf_model.l1_per_cta(w, None, "-")
    assert source.startswith("output only") and output == w.output_bytes_per_cta / 64  # one split: bytes / 64
    assert perf_model.l2_bytes(rows) == 32 * 80  # global rows only
    # without them, the rule's figure: what each CTA copies into its ring a chunk (A's 128
    # rows of 64 bytes and W's 2 KiB, whatever each warp's loads request) and the output
    _, staged, _ = perf_model.staged_work(FWD, Dims(1782, 243, 243), H200, SASS, COUNTS, PTXAS)
    assert FWD.chunk_bytes == 128 * 64 + 2048
    chunks = w.fast_chunks + w.tail_chunks
    assert staged.l2_bytes == 224 * (chunks * FWD.chunk_bytes + w.output_bytes_per_cta)
    no_stats = tmp_path / "old.json"
    no_stats.write_text(json.dumps({"kernel": "k"}))
    assert perf_model.memory_rows_from_report(no_stats) is None
    assert perf_model.memory_rows_from_report(tmp_path / "absent.json") is None


def test_malformed_memory_rows_are_one_line(tmp_path):
    report = tmp_path / "bad.json"
    report.write_text(json.dumps({"launch_stats": {"memory": [dict(ROW, wavefronts="many")]}}))
    with pytest.raises(UserError, match=r"launch_stats.memory unreadable.*re-run `doit verify`"):
        perf_model.memory_rows_from_report(report)


def test_emulator_memory_rows_come_from_one_emulator_launch(monkeypatch):
    class Stats:
        memory = [ROW]

    class Fn:
        stats = Stats()

    launched = []
    monkeypatch.setattr(perf_model, "load_ptx", lambda backend, ptx, entry: Fn())
    monkeypatch.setattr(perf_model, "launch", lambda spec, fn, dims, inputs: launched.append((spec.name, dims)))
    rows = perf_model.memory_rows_from_emulator(FWD, Shape(name="s", R=5, K=7, N=3), "// ptx")
    assert rows == [perf_model.MemoryAccess(**ROW)] and launched == [("hslm_fwd_s8", Dims(5, 7, 3))]


def test_each_row_says_whether_the_tile_rule_runs_that_configuration():
    shape = Shape(name="s", R=27, K=729, N=243)  # the rule runs the 8-warp 32-row tile here
    rows = {name: perf_model.model_row(KERNELS[name], shape, H200, SASS, COUNTS, PTXAS, None, "-")
            for name in ("hslm_fwd_s8", "hslm_fwd_s8_m32", "hslm_fwd_s8_m32n16")}
    assert [name for name, row in rows.items() if row.rule_pick] == ["hslm_fwd_s8_m32n16"]
    big = perf_model.model_row(FWD, Shape(name="b", R=4096, K=4096, N=4096), H200, SASS, COUNTS, PTXAS, None, "-")
    assert big.rule_pick


# ---- loop counts from the control bits -------------------------------------------------

LISTING = """\
\tFunction : k
        /*0000*/                   MOV R1, c[0x0][0x28] ;                     /* 0x00000a0000017a02 */
                                                                              /* 0x000fca0000000f00 */
        /*0010*/                   IMMA.16832.S8.S8 R4, R92.ROW, R84.COL, R4 ; /* 0x000000545c047237 */
                                                                              /* 0x008fe20000405c04 */
        /*0020*/                   BRA 0x10 ;                                 /* 0xfffffffc00f47947 */
                                                                              /* 0x000fc0000383ffff */
\tFunction : other
        /*0000*/                   EXIT ;                                     /* 0x000000000000794d */
                                                                              /* 0x000fea0003800000 */
"""


def test_stall_counts_are_bits_41_to_44_of_the_upper_word():
    # 0x000fca...: stall field 0b0101 = 5; 0x008fe2...: 1; 0x000fc0...: 0
    assert perf_model.control_stalls(LISTING, "k") == {0x0: 5, 0x10: 1, 0x20: 0}
    assert perf_model.control_stalls(LISTING, "other") == {0x0: 5}
    assert perf_model.stall_count(0xF << 41) == 15 and perf_model.stall_count(1 << 45) == 0  # the yield bit is not it
    with pytest.raises(perf_model.ArtifactError, match="no instructions with control words for 'absent'"):
        perf_model.control_stalls(LISTING, "absent")


def test_body_counts_sum_the_stalls_of_the_path():
    body = sass.Body(runs=["0x10-0x20"], instructions=2, nops=0, imma=1, lsu=1, classes={"tensor": 1, "ldg32": 1},
                     per_imma=2.0, lsu_per_imma=1.0, guarded_global_loads=0)
    counts = perf_model.body_counts(body, {0x0: 5, 0x10: 1, 0x20: 3})
    assert counts == {"instructions": 2, "imma": 1, "issue_clocks": 4, "direct_loads": True,
                      "global_bytes": 128.0}  # one 32-bit load a lane: 4 sectors
    with pytest.raises(perf_model.ArtifactError, match="first missing 0x20"):
        perf_model.body_counts(body, {0x10: 1})


def test_counts_problems_name_a_disagreeing_body():
    report = sass.SassReport(kernel="k", ptx_sha256="ab", ptxas_version="1", nvdisasm_version="1", archs=[SASS])
    good = {"kernels": {"k": {"ptx_sha256": "ab", "archs": {"sm_90": {
        "fast": {"instructions": 80, "imma": 8, "global_bytes": 256.0},  # 2 LDG.32 a warp: 4 sectors each
        "tail": {"instructions": 160, "imma": 8, "global_bytes": 1024.0}}}}}}  # 32 LDG.8: a sector each
    assert perf_model.counts_problems(good, {"k": report}) == []
    bad = json.loads(json.dumps(good))
    bad["kernels"]["k"]["archs"]["sm_90"]["fast"]["instructions"] = 79
    assert any("k sm_90 fast" in p for p in perf_model.counts_problems(bad, {"k": report}))
    stale = json.loads(json.dumps(good))
    stale["kernels"]["k"]["ptx_sha256"] = "cd"
    assert "other PTX" in perf_model.counts_problems(stale, {"k": report})[0]
    assert "no counts for k" in perf_model.counts_problems({"kernels": {}}, {"k": report})[0]


# ---- the layer step: every launch ------------------------------------------------------

def test_a_fused_gemm_runs_the_loop_of_its_int32_family_on_its_tile():
    assert perf_model.loop_entry(KERNELS["hslm_fwd_bf16_m32"]) == "hslm_fwd_s8_m32"
    assert perf_model.loop_entry(KERNELS["hslm_dx_splitk_bf16_m32"]) == "hslm_dx_s8_m32"
    assert perf_model.loop_entry(KERNELS["hslm_dw_splitk_bf16"]) == "hslm_dw_s8"
    assert perf_model.loop_entry(KERNELS["hslm_fwd_s8"]) == "hslm_fwd_s8"
    assert perf_model.loop_entry(KERNELS["hslm_qrows_bf16"]) is None
    assert perf_model.loop_entry(KERNELS["hslm_wprep_bf16"]) is None


def stub_records(entry: str, kernel: str):
    return SASS, COUNTS, PTXAS


@pytest.fixture(scope="module")
def counted_step():
    from hslm_ptx.pipeline.stages.layer_count import count_step
    return count_step(Shape(name="ffn_up_r1782", R=1782, K=243, N=729))


def test_every_launch_of_the_step_is_timed(counted_step):
    row = perf_model.layer_step_row(counted_step, H200, stub_records, "hslm")
    dev = perf_model.as_device(H200)
    assert [x.kernel for x in row.launches] == [x.kernel for x in counted_step.launch_list] and len(row.launches) == 3
    gemms = [x for x in row.launches if x.model == "gemm"]
    # the forward and the backward are grouped launches: each timed on its GEMM members' loops
    assert [x.loop for x in gemms] == ["+".join(filter(None, map(perf_model.loop_entry, grouped.members_of(KERNELS[x.kernel]))))
                                       for x in gemms] and len(gemms) == 2
    assert [len(x.loop.split("+")) for x in gemms] == [1, 2]  # fwdw: the product (x's columns, W's preparation: passes); bwd: dX and dW
    for launch, timed in zip(counted_step.launch_list, row.launches):
        if timed.model == "memory":  # the bytes of its buffers at DRAM's reachable rate + the fixed cost
            assert timed.device_us == pytest.approx(
                dev.kernel_fixed_us + launch.bytes / (dev.dram_bandwidth_gbs * dev.dram_efficiency * 1e3), abs=1e-4)
    assert row.gemm_device_us + row.other_device_us == pytest.approx(sum(x.device_us for x in row.launches), abs=1e-2)
    # eager pays the host's launch per kernel, a graph replay once
    assert row.eager_us - row.graph_us == pytest.approx(2 * dev.launch_us, abs=1e-2)
    torch = cost.torch_linear_launches(dev, 1782, 243, 729, bias=counted_step.bias)
    assert counted_step.bias and len(torch) == 4  # the step is counted with a bias: torch reduces dY for db
    assert row.torch_eager_us == pytest.approx(cost.torch_linear_step(dev, 1782, 243, 729), abs=1e-3)
    assert row.torch_graph_us == pytest.approx(sum(p.device_us for p in torch) + dev.launch_us, abs=1e-3)


def test_a_step_the_model_cannot_time_is_one_line(counted_step):
    foreign = counted_step.model_copy(update={"launch_list": [
        counted_step.launch_list[0].model_copy(update={"kernel": "hslm_nope"})]})
    with pytest.raises(UserError, match="launches 'hslm_nope', which hslm_ptx/catalog/registry.py does not hold"):
        perf_model.layer_step_row(foreign, H200, stub_records, "hslm")
    gemm = next(x for x in counted_step.launch_list if x.kernel.startswith("hslm_fwd"))
    moved = counted_step.model_copy(update={"launch_list": [gemm.model_copy(update={"grid": (1, 1, 1)})]})
    with pytest.raises(UserError, match=r"launched on grid \(1, 1, 1\), its spec gives"):
        perf_model.layer_step_row(moved, H200, stub_records, "hslm")


def step(target: str, eager: float, graph: float, spread: float = 0.0) -> perf_model.LayerStepRow:
    """A step whose ratios to torch (10 us eager, 5 us graph) spread by +-``spread`` over the ranges."""
    e, g = eager / 10.0, graph / 5.0
    return perf_model.LayerStepRow(target=target, shape=f"{target}_{eager}", R=1, K=1, N=1, launches=[],
                                   gemm_device_us=0, other_device_us=0, eager_us=eager, graph_us=graph,
                                   torch_eager_us=10.0, torch_graph_us=5.0,
                                   eager_interval=(e - spread, e, e + spread), graph_interval=(g - spread, g, g + spread))


def test_the_target_lines_say_met_only_when_every_interval_is():
    assert perf_model.layer_targets([step("hslm", 14.0, 7.0), step("hslm", 12.0, 6.0)]) == [
        "MODEL target: HSLM step, graph-replayed, within 1.5x of torch bf16 nn.Linear: graph 2 of 2 shapes over "
        "the whole interval (ours/torch 1.20-1.40) (eager, not the target: eager 2 of 2 shapes over the whole "
        "interval (ours/torch 1.20-1.40)): met"]
    assert perf_model.layer_targets([step("hslm", 14.0, 8.0)])[0].endswith(": NOT met")
    # the target is the graph-replayed step: a slow eager step alone does not miss it
    assert perf_model.layer_targets([step("hslm", 17.0, 7.0)])[0].endswith("): met")
    # negative: a nominal figure inside the target whose interval crosses it is level, not met
    assert perf_model.layer_targets([step("hslm", 12.0, 7.0, spread=0.2)])[0].endswith(": level")
    big = perf_model.layer_targets([step("large", 7.0, 3.0), step("large", 7.0, 4.0), step("large", 7.0, 3.0, 0.3)])
    assert [line.rsplit(": ", 1)[1] for line in big] == ["met", "NOT met", "level"]
    assert "torch/ours eager 1.429 [1.429-1.429], graph 1.667 [1.667-1.667]" in big[0]


def test_an_interval_is_ahead_only_when_all_of_it_is():
    assert cost.Interval(0.8, 0.9, 0.99).verdict() == "ahead"
    assert cost.Interval(0.8, 0.9, 1.01).verdict() == "level"  # negative: the nominal alone is ahead
    assert cost.Interval(1.01, 1.1, 1.2).verdict() == "behind"
    assert cost.Interval.of([0.9, 0.7, 1.2]) == (0.7, 0.9, 1.2)


def test_the_sweep_moves_every_ranged_figure_and_only_those():
    ranges = cost.load_ranges()["h200"]
    h200 = perf_model.as_device(H200)
    devices = cost.device_sweep(h200, ranges)
    assert devices[0] == h200 and len(devices) == 1 + 2 * len(ranges) + cost.SWEEP_DRAWS
    for field, (low, high) in ranges.items():
        values = {getattr(d, field) for d in devices}
        assert min(values) == low and max(values) == high
    assert {d.sms for d in devices} == {h200.sms}  # a datasheet figure has no range
    assert "sms" not in ranges and {"l2_latency_cycles", "mma_sync_fraction", "launch_us"} <= set(ranges)


def test_the_large_layer_is_modelled_once_and_judged_by_its_own_target():
    hslm = model_build.layer_shapes("hslm", (Shape(name="a", R=27, K=243, N=243),))
    assert [(s.name, t) for s, t in hslm] == [("a", "hslm"), ("large_r8192", "large")]
    large = model_build.layer_shapes("large", (Shape(name="sq", R=4096, K=4096, N=4096),
                                              Shape(name="r8192", R=8192, K=4096, N=4096)))
    assert [(s.name, t) for s, t in large] == [("sq", ""), ("r8192", "large")]  # no target for sq4096
