"""The tile rule (hslm_ptx.catalog.registry.choose, scored by hslm_ptx.tile.rule.phase_cost: the cost
model's device time of the launch): which configuration a family runs on a shape, and that
the float ops launch that one."""
import math

import numpy as np
import pytest
from kernelcases import family_configs, plans_scored, tile_of

from hslm_ptx import arrays as array_ops
from hslm_ptx.cost import model as cost
from hslm_ptx.catalog.registry import FAMILIES, KERNELS, choose, forget_scores
from hslm_ptx.kernel.spec import Dims
from hslm_ptx.formats.ternary import pack
from hslm_ptx.tile import geometry, rule
from hslm_ptx.pipeline.stages.perf_model import loop_entry

HSLM = [Dims(27, 243, 243), Dims(27, 243, 729), Dims(27, 729, 243)]
LARGE = [Dims(4096, 4096, 4096), Dims(8192, 4096, 4096)]


# the families with a choice of tile: the staged ones built on both
TILED = [f for f, configs in FAMILIES.items() if {s.tile for s in configs} >= {"32x128n16", "128x128"}]


def test_every_configuration_belongs_to_one_family_and_has_its_own_entry():
    assert {"hslm_fwd_s8", "hslm_dx_s8", "hslm_dw_s8"} <= set(TILED)
    assert sorted(s.name for f in FAMILIES.values() for s in f) == sorted(KERNELS)
    for family, configs in FAMILIES.items():
        assert configs[0].name == family and len({s.tile for s in configs}) == len(configs)
        assert len(configs) == 1 or all(s.cost is not None for s in configs)  # a choice needs its rule
        assert all(f".visible .entry {s.name}(" in s.emit() for s in configs)


@pytest.mark.parametrize("family", TILED)
def test_short_batches_take_a_short_tile_and_large_problems_the_large_one(family):
    """Short: 32 x 128 (4 or 8 warps) for forward and dX, 16 x 128 for dW (whose output is
    the weight's: ``test_dw_at_r27_takes_the_16_row_tile``). The large one: 128 x 128 for
    forward and dX, 256 x 128 for dW (both its operands are int8 rows, so the taller tile's
    third fewer L2 bytes a multiply-add win)."""
    short = "16x128" if family.startswith("hslm_dw") else "32x128"
    assert all(choose(family, d).tile.startswith(short) for d in HSLM)
    large = "256x128" if family.startswith("hslm_dw") else "128x128"
    assert all(choose(family, d).tile == large for d in LARGE)


@pytest.mark.parametrize("family", [f for f, configs in FAMILIES.items() if len(configs) > 1])
def test_the_rule_picks_the_lowest_score(family):
    for dims in HSLM + LARGE + [Dims(1782, 243, 729), Dims(1, 1, 1), Dims(65536, 729, 243)]:
        chosen = choose(family, dims)
        assert all(chosen.cost(dims) <= s.cost(dims) for s in FAMILIES[family])


def launch_work(spec, dims):
    """The launch ``spec`` runs on ``dims`` as the cost model takes it."""
    entry = loop_entry(spec)  # the int32 GEMM whose loop it runs
    rows, cols = spec.output.layout.logical(dims)
    contraction = dims.R * dims.K * dims.N // (rows * cols)
    resident = cost.resident_ctas(rule.RULE_DEVICE, spec.geometry(dims).block[0] // 32, cost.occupancy(spec.name))
    return rule.staged_work(spec.geometry(dims), rows, cols, contraction, spec.stages, spec.chunk_bytes,
                            cost.loop_counts(entry), resident, spec.buffer_bytes(dims, spec.geometry(dims).grid[2]), spec.split_rescale)


def test_the_score_is_the_cost_models_device_time_of_the_launch():
    """One model: the rule's score is ``cost.staged_phases`` of the very launch the kernel
    makes (its grid, split, loop counts and ptxas occupancy), never below the device's
    fixed cost of a kernel."""
    for name in ("hslm_fwd_s8_m32", "hslm_dw_s8", "hslm_dx_splitk_bf16_m32", "hslm_dw_f16"):
        spec = KERNELS[name]
        for dims in (Dims(27, 243, 729), Dims(1782, 729, 243), Dims(8192, 4096, 4096)):
            want = cost.staged_phases(rule.RULE_DEVICE, launch_work(spec, dims)).device_us
            assert spec.cost(dims) == want > rule.RULE_DEVICE.kernel_fixed_us


def test_bytes_through_l2_are_the_rings_copies_and_the_output_tile():
    """By hand: 2 CTAs (2 column tiles) over 3 chunks of k (2 fast, 1 tail), each copying
    3000 bytes into its ring a chunk (whatever its warps' loads request: the copies of one
    warp row serve the others), each CTA writing its int32 share of a 27 x 243 output."""
    body = cost.LoopFigures(instructions=100, imma=32, issue_clocks=300, direct_loads=False, global_bytes=1000)
    counts = cost.KernelCounts(fast=body, tail=body._replace(global_bytes=600), outside_instructions=50)
    launch = geometry.geometry(27, 243, geometry.Plan(splits=1, span=192), geometry.SMALL._replace(warps_m=2))
    work = rule.staged_work(launch, 27, 243, 150, 4, 3000, counts, resident=2, dram_bytes=0)
    assert (work.ctas, work.fast_chunks, work.tail_chunks) == (2, 2, 1)
    output = 4 * 27 * 243 / 2
    assert work.l2_bytes == 2 * (3 * 3000 + output)
    assert work.settle_round_trips == 0
    split = rule.staged_work(launch._replace(grid=(2, 1, 3)), 27, 243, 150, 4, 3000, counts, 2, 0,
                             split_rescale=True)
    assert split.ctas == 6 and split.settle_round_trips == 2  # the ticket, then the summed tile read back


def test_a_short_batch_takes_the_small_tile_and_a_large_problem_the_large_one_by_the_model():
    """R = 27 wastes 101 of a 128-row tile's rows: the small tile's serial phases are
    shorter. At 4096^3 both fill every SM; the small tile moves more L2 bytes per
    multiply-add (each of its CTAs fetches the same W for a quarter of the rows) and loses."""
    small, large = KERNELS["hslm_fwd_s8_m32"], KERNELS["hslm_fwd_s8"]
    short, big = Dims(27, 243, 243), Dims(4096, 4096, 4096)
    assert small.cost(short) < large.cost(short)
    assert large.cost(big) < small.cost(big)
    per_mac = {s.name: launch_work(s, big).l2_bytes / (big.R * big.K * big.N) for s in (small, large)}
    assert per_mac["hslm_fwd_s8_m32"] > 1.2 * per_mac["hslm_fwd_s8"]


def test_dw_at_r1782_takes_the_64_row_tile_split_five_ways():
    """The FFN dW at R = 1782 (28 chunks of k; a 243 x 729 output): 128 x 128 is 50% slower
    by the model. The 8-warp 32-row tile has two warps on each scheduler, issuing in each
    other's stalls, in one CTA (two splits of 14). The 64 x 128 tile (8 warps of 32 x 32)
    has them too, and reads half the B bytes per output row of the 32-row tile: five
    splits of 6 chunks on it (120 CTAs) are the cheapest of all. The deepest split the
    rule offers the 32-row tile costs more than any of those."""
    for dims in (Dims(1782, 243, 729), Dims(1782, 729, 243)):
        picked = choose("hslm_dw_s8", dims)
        assert picked.name == "hslm_dw_s8_m64" and picked.geometry(dims).grid[2] == 5
        assert KERNELS["hslm_dw_s8"].cost(dims) > 1.5 * picked.cost(dims)
        eight_warps = plans_scored("hslm_dw_s8_m32n16", dims)
        assert min(eight_warps, key=eight_warps.get).splits == 2
        assert min(eight_warps.values()) > 1.03 * picked.cost(dims)
        deepest = max(eight_warps, key=lambda plan: plan.splits)
        assert deepest.splits > 2 and eight_warps[deepest] > picked.cost(dims)


def test_an_int32_launch_splits_only_where_the_rule_says_it_pays():
    """One split skips the split-K epilogue (staging, a barrier, a red a word), so a short
    contraction runs unsplit; a longer one on few tiles still splits. Either way the plan is
    the cheapest of rule.split_plans by the launch's own score."""
    spec = KERNELS["hslm_fwd_s8_m32"]
    for dims in (Dims(27, 243, 243), Dims(27, 729, 243)):
        scores = plans_scored("hslm_fwd_s8_m32", dims)
        plans = list(scores)
        assert plans[0].splits == 1 and max(p.splits for p in plans) > 1  # split_k alone would split both
        assert spec.geometry(dims).grid[2] == min(scores, key=scores.get).splits
    assert spec.geometry(Dims(27, 243, 243)).grid[2] == 1  # 4 chunks: the split's epilogue costs more
    assert spec.geometry(Dims(27, 729, 243)).grid[2] > 1  # 12 chunks on 2 tiles: splitting pays


def test_the_rule_follows_the_device_facts(monkeypatch):
    """Negative: the rule reads the device it scores for. With L2 at a tenth of its rate,
    dW at R = 1782 turns L2-bound and the large tile, which moves fewer bytes, wins."""
    dims = Dims(1782, 243, 729)
    assert choose("hslm_dw_s8", dims).name == "hslm_dw_s8_m64"
    slow = rule.RULE_DEVICE._replace(l2_bandwidth_gbs=rule.RULE_DEVICE.l2_bandwidth_gbs / 10)
    monkeypatch.setattr(rule, "rule_device", lambda: slow)
    assert choose("hslm_dw_s8", dims).name == "hslm_dw_s8_m64"  # the pick is kept per shape ...
    try:
        forget_scores()  # ... until the scores are forgotten
        assert choose("hslm_dw_s8", dims).name == "hslm_dw_s8"
    finally:
        monkeypatch.undo()
        forget_scores()
    assert choose("hslm_dw_s8", dims).name == "hslm_dw_s8_m64"


def test_an_uncounted_configuration_is_never_picked_and_runs_one_split(monkeypatch):
    """A configuration whose loop is not in hslm_ptx/cost/loop_counts.json yet (just added, before
    `doit sass && doit model:counts`) scores infinite: the family's pick is another one, and
    its own launch is one split, so the pipeline can still build, verify and count it."""
    dims = Dims(27, 729, 243)
    name = "hslm_fwd_s8_m32n16"
    assert choose("hslm_fwd_s8", dims).name == name and KERNELS[name].geometry(dims).grid[2] == 6
    counted = cost.loop_counts

    def without(entry, *args, **kwargs):
        if entry == name:
            raise cost.NotCounted(f"no loop counts for '{entry}'")
        return counted(entry, *args, **kwargs)

    monkeypatch.setattr(cost, "loop_counts", without)
    try:
        forget_scores()
        assert KERNELS[name].cost(dims) == math.inf and KERNELS[name].geometry(dims).grid[2] == 1
        assert choose("hslm_fwd_s8", dims).name == "hslm_fwd_s8_m32"
    finally:
        monkeypatch.undo()
        forget_scores()
    assert choose("hslm_fwd_s8", dims).name == name


def test_unknown_family_names_the_known_ones():
    with pytest.raises(KeyError, match="unknown kernel family 'fwd'; known: hslm_fwd_s8"):
        choose("fwd", Dims(1, 1, 1))


@pytest.mark.parametrize("R, K, N, want", [(27, 729, 243, "hslm_fwd_s8_m32n16"), (1782, 243, 729, "hslm_fwd_s8_m32"),
                                          (2048, 1024, 2048, "hslm_fwd_s8")])
def test_forward_launches_the_configuration_the_rule_picks(R, K, N, want):
    """A stand-in kernel records the block each launch asked for (128 threads: the 4-warp
    32 x 128 tile; 256: the others)."""
    assert choose("hslm_fwd_s8", Dims(R, K, N)).name == want
    blocks = []
    rng = np.random.default_rng(0)
    w = pack(rng.integers(-1, 2, (K, N)).astype(np.int8))
    array_ops.forward(rng.standard_normal((R, K)), w, 1.0, fn=lambda grid, block, args, shared_mem=0: blocks.append(block))
    assert blocks == [(tile_of(want).threads, 1, 1)]


def test_configurations_share_a_family_but_differ_in_their_launch():
    small, large = (KERNELS[n] for n in ("hslm_dx_s8_m32", "hslm_dx_s8"))
    dims = Dims(27, 243, 243)
    assert small.family_name == large.family_name == "hslm_dx_s8"
    assert family_configs("hslm_dx_s8") == ["hslm_dx_s8", "hslm_dx_s8_m32", "hslm_dx_s8_m32n16"]
    assert small.geometry(dims).block == (128, 1, 1) and large.geometry(dims).block == (256, 1, 1)


def test_dw_at_r27_takes_the_16_row_tile():
    """dW at R = 27 is one chunk of k into the weight's N x K output: the epilogue is the
    largest phase a CTA runs after the prologue. The 16 x 128 tile writes half the
    32 x 128 one's output a CTA on twice the CTAs (still under one an SM), so its
    epilogue takes half as long; its chunk costs no more (the ring's round trip bounds
    both, and its copies are no more often first touches), and it is the cheapest tile at
    every HSLM dW shape."""
    short, narrow = KERNELS["hslm_dw_s8_m16n16"], KERNELS["hslm_dw_s8_m32n16"]
    for dims in HSLM:
        assert choose("hslm_dw_s8", dims).name == short.name
        ours, theirs = (cost.staged_phases(rule.RULE_DEVICE, launch_work(s, dims)) for s in (short, narrow))
        assert ours.epilogue == pytest.approx(theirs.epilogue / 2, rel=0.01) and ours.chunks <= theirs.chunks
        assert short.geometry(dims).grid[1] == 2 * narrow.geometry(dims).grid[1] <= 2 * rule.RULE_DEVICE.sms
        assert short.cost(dims) < narrow.cost(dims)
