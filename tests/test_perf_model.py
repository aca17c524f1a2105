"""The performance model (pipeline.perf_model): its assumptions file, each bound worked by
hand on a small invented loop, occupancy, and the emulator memory rows it reads."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
import yaml

from kernels.registry import KERNELS
from kernels.spec import Dims, Launch
from pipeline import config, perf_model, sass
from pipeline.errors import UserError
from pipeline.models import PtxasArch, Shape

ASSUMPTIONS = perf_model.load_assumptions()
H200 = ASSUMPTIONS.gpus["h200"]


# ---- the assumptions file ------------------------------------------------------------

@pytest.mark.parametrize("name", list(ASSUMPTIONS.gpus))
def test_every_number_has_a_source_and_the_peaks_agree_with_sms_and_clock(name):
    g = ASSUMPTIONS.gpus[name]
    numbers = [v for v in g.model_dump().values() if isinstance(v, dict)]
    assert numbers and all(len(n["source"]) > 20 for n in numbers)
    assert g.arch in config.ARCHS
    # datasheet peak = SMs x clock x int8 ops per SM clock, a power of two (2048/4096/8192)
    per_clock = g.peak_ops_per_sm_clock
    assert abs(per_clock - 2 ** round(math.log2(per_clock))) / per_clock < 0.01


def test_bad_assumptions_file_is_one_line_naming_the_field(tmp_path):
    raw = yaml.safe_load(perf_model.GPUS_FILE.read_text())
    del raw["gpus"]["a100"]["clock_ghz"]["source"]
    bad = tmp_path / "gpus.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(UserError, match=r"field 'gpus\.a100\.clock_ghz\.source': Field required"):
        perf_model.load_assumptions(bad)


def test_unknown_gpu_lists_the_known_ones():
    with pytest.raises(UserError, match="unknown gpu 'v100'.*h200, rtx4090, a100"):
        perf_model.gpu(ASSUMPTIONS, "v100")


# ---- the work of a launch ------------------------------------------------------------

def test_chunks_fast_while_chunk_and_slack_fit():
    assert [perf_model.chunks(n) for n in (243, 64, 68, 1782, 1)] == [(3, 1), (0, 1), (1, 1), (27, 1), (0, 1)]


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
    # wavefronts: LDG.32 1 each, STS.128 and LDS.128 4 each; LDG.8 1 each
    assert w.lsu_wavefronts_per_warp == 3 * (2 + 4 + 16) + (32 + 4 + 16)
    assert w.global_bytes_per_warp == 3 * 2 * 128 + 32 * 32
    assert w.compulsory_bytes == 1782 * 243 * 4 + 1782 * 243 + 243 * 16 * 4  # y int32, x int8, w packed
    assert w.stages_through_shared


def test_bounds_by_hand():
    w = perf_model.work(FWD, Dims(1782, 243, 243), SASS)
    bounds, waves = perf_model.bounds_for(H200, w, resident=7, l1_wavefronts_per_cta=4 * w.lsu_wavefronts_per_warp,
                                          l2_bytes=perf_model.l2_bytes(w, None))
    clock = 1.83e9
    # 224 CTAs on 132 SMs: the busiest runs 2, i.e. 8 warps on 4 schedulers
    assert math.isclose(bounds["issue"], 8 * 460 / 4 / clock * 1e6)
    assert math.isclose(bounds["tensor"], 8 * 32 * 8192 / (8192 * 0.70) / clock * 1e6, rel_tol=1e-3)
    assert math.isclose(bounds["l1"], 2 * 4 * 118 / 1.0 / clock * 1e6)
    assert waves == 1 and math.isclose(bounds["latency"], 4 * (300 + 30) / clock * 1e6)
    assert math.isclose(bounds["l2"], 224 * 4 * 1792 / 12000e3)
    assert math.isclose(bounds["dram"], w.compulsory_bytes / 4800e3)
    row = perf_model.predict(H200, bounds, 2.0 * 1782 * 243 * 243)
    assert row.device_us == round(max(bounds.values()), 4) and row.limiter == max(bounds, key=bounds.get)
    assert math.isclose(row.per_call_us, row.device_us + 5.0)


def test_a_planted_regression_raises_the_prediction():
    slower = SASS.model_copy(update={"fast": body(400, 8, FAST.classes)})
    shape = Shape(name="s", R=1782, K=729, N=243)
    before = perf_model.model_row(FWD, shape, H200, ASSUMPTIONS.reference, SASS, PTXAS, None, "-")
    after = perf_model.model_row(FWD, shape, H200, ASSUMPTIONS.reference, slower, PTXAS, None, "-")
    assert after.ours.bounds["issue"] == pytest.approx(before.ours.bounds["issue"] * (11 * 400 + 220) / (11 * 80 + 220), rel=1e-3)
    assert after.ours.device_us > before.ours.device_us and after.kind == "MODEL"
    assert after.reference == before.reference  # the reference class does not read our SASS


def test_split_k_and_a_copy_ring_by_hand():
    # the same problem split in two along z, 4-stage ring, one loop body (no tail body)
    split = dataclasses.replace(FWD, stages=4,
                                geometry=lambda d: Launch(grid=(-(-d.N // 32), -(-d.R // 64), 2), block=(128, 1, 1)))
    one_body = SASS.model_copy(update={"tail": None})
    w = perf_model.work(split, Dims(1782, 243, 243), one_body)
    # K=243 is 4 chunks of 64; 2 splits -> 2 chunks a CTA, both on the one body
    assert (w.ctas, w.fast_chunks, w.tail_chunks, w.stages) == (448, 2, 0, 4)
    assert perf_model.exposed_round_trips(w) == 1 + 2 / 3  # fill the ring, then 1 per 3 chunks
    nothing_prefetched = w.model_copy(update={"stages": 1})
    assert perf_model.exposed_round_trips(nothing_prefetched) == 2  # one a chunk


def test_reference_pads_to_its_tile():
    # 27 x 243 output, contraction 243 -> padded 128 x 256 x 256: 2 CTAs, 1024 IMMA each
    b = perf_model.reference_bounds(H200, ASSUMPTIONS.reference, 27, 243, 243, 0)
    assert math.isclose(b["issue"], 1024 * 2.5 / 4 / 1.83e9 * 1e6)
    assert math.isclose(b["l2"], 2 * (256 * 256 + 4 * 128 * 128) / 12000e3)  # operands in, int32 tile out


def test_the_output_s_ideal_wavefronts_follow_the_epilogue_path():
    """One split: stored from the accumulators, 64 contiguous bytes a row (bytes / 64);
    split-K: staged and added, three passes of bytes / 128."""
    one = perf_model.work(FWD, Dims(1782, 243, 243), SASS)
    assert perf_model.output_wavefronts(one) == one.output_bytes_per_cta / (64 if one.splits == 1 else 128 / 3)
    assert perf_model.output_wavefronts(one.model_copy(update={"splits": 1, "output_bytes_per_cta": 65536})) == 1024
    assert perf_model.output_wavefronts(one.model_copy(update={"splits": 4, "output_bytes_per_cta": 65536})) == 1536


def test_reference_l1_counts_fragments_copies_and_its_epilogue():
    """Per 64-deep k-tile: 256 IMMA x 0.25 LDSM.x4 x 4 wavefronts = 256, and 128 + 128
    rows copied, a line each; then the 64 KiB int32 tile through shared memory and out
    (3 x 512). The epilogue is what an R = 27 dW (one k-tile) is mostly made of."""
    ref = ASSUMPTIONS.reference
    assert perf_model.reference_l1_per_cta(ref, 1) == 256 + 256 + 3 * 512
    assert perf_model.reference_l1_per_cta(ref, 4) - perf_model.reference_l1_per_cta(ref, 3) == 512
    b = perf_model.reference_bounds(H200, ref, 243, 243, 27, 0)  # dW at R = 27: 4 CTAs, one k-tile
    assert math.isclose(b["l1"], (256 + 256 + 1536) / 1.83e9 * 1e6)
    # negative: without its epilogue the same CTA would need a quarter of that
    assert perf_model.reference_l1_per_cta(ref.model_copy(update={"epilogue_passes": ref.epilogue_passes.model_copy(
        update={"value": 0})}), 1) == 512


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
    ideal, source = perf_model.l1_per_cta(w, None, "-")
    assert source.startswith("SASS ideal") and ideal == w.lsu_wavefronts_per_warp * w.warps_per_cta + perf_model.output_wavefronts(w)
    assert perf_model.l2_bytes(w, rows) == 32 * 80  # global rows only
    assert perf_model.l2_bytes(w, None) == 224 * 4 * w.global_bytes_per_warp
    no_stats = tmp_path / "old.json"
    no_stats.write_text(json.dumps({"kernel": "k"}))
    assert perf_model.memory_rows_from_report(no_stats) is None
    assert perf_model.memory_rows_from_report(tmp_path / "absent.json") is None


def test_malformed_memory_rows_are_one_line(tmp_path):
    report = tmp_path / "bad.json"
    report.write_text(json.dumps({"launch_stats": {"memory": [dict(ROW, wavefronts="many")]}}))
    with pytest.raises(UserError, match=r"launch_stats.memory unreadable.*re-run `doit verify`"):
        perf_model.memory_rows_from_report(report)


def test_emulator_memory_rows_when_the_emulator_counts_them(monkeypatch):
    class Stats:
        memory = [ROW]

    class Fn:
        stats = Stats()

    launched = []
    monkeypatch.setattr(perf_model, "emulator_counts_memory", lambda: True)
    monkeypatch.setattr(perf_model, "load_ptx", lambda backend, ptx, entry: Fn())
    monkeypatch.setattr(perf_model, "launch", lambda spec, fn, dims, inputs: launched.append((spec.name, dims)))
    rows = perf_model.memory_rows_from_emulator(FWD, Shape(name="s", R=5, K=7, N=3), "// ptx")
    assert rows == [perf_model.MemoryAccess(**ROW)] and launched == [("hslm_fwd_s8", Dims(5, 7, 3))]
    monkeypatch.setattr(perf_model, "emulator_counts_memory", lambda: False)
    assert perf_model.memory_rows_from_emulator(FWD, Shape(name="s", R=5, K=7, N=3), "// ptx") is None


def test_each_row_says_whether_the_tile_rule_runs_that_configuration():
    shape = Shape(name="s", R=27, K=729, N=243)  # the rule runs the 32-row tile here
    rows = {name: perf_model.model_row(KERNELS[name], shape, H200, ASSUMPTIONS.reference, SASS, PTXAS, None, "-")
            for name in ("hslm_fwd_s8", "hslm_fwd_s8_m32")}
    assert not rows["hslm_fwd_s8"].rule_pick and rows["hslm_fwd_s8_m32"].rule_pick
    big = perf_model.model_row(FWD, Shape(name="b", R=4096, K=4096, N=4096), H200, ASSUMPTIONS.reference,
                               SASS, PTXAS, None, "-")
    assert big.rule_pick
