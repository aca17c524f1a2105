"""The tile rule (kernels.registry.choose, scored by kernels.tile.rule.rule_cost): which
configuration a family runs on a shape, and that the float ops launch that one."""
import numpy as np
import pytest
from kernelcases import family_configs, tile_of

from kernels import array_ops
from kernels.registry import FAMILIES, KERNELS, choose
from kernels.spec import Dims
from kernels.ternary import pack
from kernels.tile import geometry, rule

HSLM = [Dims(27, 243, 243), Dims(27, 243, 729), Dims(27, 729, 243)]
LARGE = [Dims(4096, 4096, 4096), Dims(8192, 4096, 4096)]


# the families with a choice of tile: the staged ones built on both
TILED = [f for f, configs in FAMILIES.items() if {s.tile for s in configs} >= {"32x128", "128x128"}]


def test_every_configuration_belongs_to_one_family_and_has_its_own_entry():
    assert {"hslm_fwd_s8", "hslm_dx_s8", "hslm_dw_s8"} <= set(TILED)
    assert sorted(s.name for f in FAMILIES.values() for s in f) == sorted(KERNELS)
    for family, configs in FAMILIES.items():
        assert configs[0].name == family and len({s.tile for s in configs}) == len(configs)
        assert len(configs) == 1 or all(s.cost is not None for s in configs)  # a choice needs its rule
        assert all(f".visible .entry {s.name}(" in s.emit() for s in configs)


@pytest.mark.parametrize("family", TILED)
def test_short_batches_take_the_small_tile_and_large_problems_the_large_one(family):
    assert all(choose(family, d).tile == "32x128" for d in HSLM)
    assert all(choose(family, d).tile == "128x128" for d in LARGE)


@pytest.mark.parametrize("family", [f for f, configs in FAMILIES.items() if len(configs) > 1])
def test_the_rule_picks_the_lowest_score(family):
    for dims in HSLM + LARGE + [Dims(1782, 243, 729), Dims(1, 1, 1), Dims(65536, 729, 243)]:
        chosen = choose(family, dims)
        assert all(chosen.cost(dims) <= s.cost(dims) for s in FAMILIES[family])


def score(tile, rows=4096, cols=4096, contraction=4096, loop=150):
    return rule.rule_cost(rows, cols, contraction, tile, b_bits=2, loop_instructions=loop)


def test_l1_wavefronts_by_hand():
    # 128 x 128: per chunk 256 rows x 64 B stored, A (8 KiB) read by 4 warp columns and B
    # (8 KiB) by 2 warp rows: (16 + 32 + 16) KiB / 128 = 512; the 64 KiB output stored from
    # the accumulators 64 B a row (/ 64 = 1024), or staged and added with split-K (x 3 / 128)
    assert rule.l1_wavefronts(geometry.LARGE, 1, splits=1) == 512 + 1024
    assert rule.l1_wavefronts(geometry.LARGE, 1, splits=2) == 512 + 1536
    # 32 x 128: 160 rows stored, A (2 KiB) x 4, B (8 KiB) x 1: 208 a chunk; output 256 / 384
    assert rule.l1_wavefronts(geometry.SMALL, 2, splits=1) == 2 * 208 + 256
    assert rule.l1_wavefronts(geometry.SMALL, 2, splits=3) == 2 * 208 + 384


def test_a_large_problem_makes_the_small_tile_lose_on_l1_traffic():
    """4096^3 fills every SM with either tile and the same padded work per SM; the small
    tile moves more shared bytes per multiply-add (its A is read by every warp, its B by one
    warp row for a quarter of the rows)."""
    large, small = score(geometry.LARGE), score(geometry.SMALL)
    assert large[0] == 8 * rule.l1_wavefronts(geometry.LARGE, 64, 1)  # 1024 CTAs: 8 on the busiest SM
    assert small[0] == 32 * rule.l1_wavefronts(geometry.SMALL, 64, 1) > large[0]
    # either way the tensor work per SM is the same, and below both
    assert 8 * 128 * 128 * 4096 // rule.MACS_PER_SM_CLOCK < large[0]


def test_the_score_counts_padded_rows_so_a_27_row_batch_wastes_less_on_32():
    # same grid and splits (2 x 1 x 2, 128 k each): a quarter of the rows per CTA
    large, small = score(geometry.LARGE, 27, 243, 243), score(geometry.SMALL, 27, 243, 243)
    assert large[0] == rule.l1_wavefronts(geometry.LARGE, 2, splits=2) == 2560
    assert small[0] == rule.l1_wavefronts(geometry.SMALL, 2, splits=2) == 800
    # a loop four times as long would make the small tile issue-bound, and lose even here
    assert score(geometry.SMALL, 27, 243, 243, loop=3000)[0] == 4 * 3000 * 2 // 4 > large[0]


def test_bytes_moved_count_packed_w_at_two_bits_and_the_output_tile():
    moved = rule.rule_cost(27, 243, 243, geometry.SMALL, b_bits=2, loop_instructions=1)[1]
    assert moved == 4 * ((32 + 32) * 128 + 4 * 32 * 128)  # 4 CTAs: A, packed B, the int32 tile
    as_int8 = rule.rule_cost(27, 243, 243, geometry.SMALL, b_bits=8, loop_instructions=1)[1]
    assert as_int8 - moved == 4 * 96 * 128


def test_segment_lines_by_hand():
    assert rule.segment_lines(128, 64, 256) == 128  # Xq rows of K = 243: a line each
    assert rule.segment_lines(128, 16, 64) == 64  # packed W columns of K = 243: two a line
    assert rule.segment_lines(128, 16, 184) == 128  # K = 729: a column a line
    assert rule.segment_lines(64, 32, 64) == 32  # dX's W rows of K = 243
    assert rule.segment_lines(32, 64, 48) == 16  # rows narrower than the chunk: their span


def test_the_rule_counts_the_lines_a_small_tile_fetches_again():
    """Forward at 1782 x 729 x 243: the 32 x 128 tile runs 112 CTAs of 12 chunks, each
    fetching the W a 128 x 128 CTA fetches for four times the rows. In planes a chunk of
    128 columns is 16 lines, so the small tile wins (the model agrees: 1.86 us against
    2.07 on an H200). Negative: with W in the packed order (a column a line at K = 729,
    128 lines a chunk) the same count makes the large tile win."""
    dims = Dims(1782, 729, 243)
    assert choose("hslm_fwd_s8", dims).name == "hslm_fwd_s8_m32"
    assert KERNELS["hslm_fwd_s8_m32"].cost(dims) < KERNELS["hslm_fwd_s8"].cost(dims)

    def packed_order(tile):
        lines = rule.segment_lines(tile.m, 64, 736) + rule.segment_lines(128, 16, 184)
        return rule.rule_cost(1782, 243, 729, tile, b_bits=2, loop_instructions=105, operand_lines=lines)
    assert packed_order(geometry.LARGE) < packed_order(geometry.SMALL)


def test_unknown_family_names_the_known_ones():
    with pytest.raises(KeyError, match="unknown kernel family 'fwd'; known: hslm_fwd_s8"):
        choose("fwd", Dims(1, 1, 1))


@pytest.mark.parametrize("R, K, N, want", [(27, 729, 243, "hslm_fwd_s8_m32"), (2048, 512, 1024, "hslm_fwd_s8")])
def test_forward_launches_the_configuration_the_rule_picks(R, K, N, want):
    """A stand-in kernel records the block each launch asked for (128 threads: the small tile)."""
    assert choose("hslm_fwd_s8", Dims(R, K, N)).name == want
    blocks = []
    rng = np.random.default_rng(0)
    w = pack(rng.integers(-1, 2, (K, N)).astype(np.int8))
    array_ops.forward(rng.standard_normal((R, K)), w, 1.0, fn=lambda grid, block, args, shared_mem=0: blocks.append(block))
    assert blocks == [(tile_of(want).threads, 1, 1)]


def test_configurations_share_a_family_but_differ_in_their_launch():
    small, large = (KERNELS[n] for n in ("hslm_dx_s8_m32", "hslm_dx_s8"))
    dims = Dims(27, 243, 243)
    assert small.family_name == large.family_name == "hslm_dx_s8" and family_configs("hslm_dx_s8") == ["hslm_dx_s8", "hslm_dx_s8_m32"]
    assert small.geometry(dims).block == (128, 1, 1) and large.geometry(dims).block == (256, 1, 1)
