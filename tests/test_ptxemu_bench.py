"""The emulator benchmark's plumbing (its figures are printed, never asserted): bad
arguments are one error line, the table sums the headline launches, and a launch it
times is exact and counted."""
from __future__ import annotations

from hslm_ptx import emu_bench as bench
from hslm_ptx.catalog.registry import KERNELS


def test_bad_arguments_are_one_error_line(capsys):
    assert bench.main(["--repeat", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --repeat: 0:") and "\n" not in err
    assert bench.main(["--only", "no_such_kernel"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --only: no_such_kernel:") and "hslm_dw_s8_m64" in err


def test_the_headline_sums_only_its_launches():
    rows = [bench.Timing("hslm_fwd_s8", "ffn_up_r1782", 3_000_000, 10, 1.0, 0.5, True),
            bench.Timing("hslm_dx_s8_m32", "ffn_down_r27", 1_000_000, 10, 1.0, 0.01, True),
            bench.Timing("hslm_dw_s8", "ffn_up_r1782", 9_000_000, 10, 1.0, 0.1, True)]
    text = bench.report(rows)
    assert "headline (2 of 4 launches): 4,000,000 warp instructions in 2.000 CPU s = 2.00M" in text
    assert "slowest hslm_dx_s8_m32 ffn_down_r27 1.00M" in text
    assert len(text.splitlines()) == 1 + len(rows) + 1
    assert "headline" not in bench.report(rows[2:])


def test_every_tile_configuration_is_benchmarked_once():
    kernels = [k for k, s in bench.LAUNCHES if s == "ffn_up_r1782"]
    int8_gemms = {name for name, spec in KERNELS.items() if spec.is_gemm}  # every int32-out configuration
    assert len(kernels) == len(set(kernels)) and set(kernels) == int8_gemms and len(int8_gemms) >= 10
    assert set(bench.HEADLINE) <= set(bench.LAUNCHES)


def test_a_timed_launch_is_exact_and_counted():
    got = bench.time_launch("hslm_dx_s8_m32", "ffn_down_r27")
    assert got.exact and got.warp_instructions > 0 and got.steps > 0
    assert got.emulator_s > 0 and got.reference_s > 0


def test_a_nan_both_sides_produce_matches_and_a_changed_bit_does_not():
    """The bench judges a launch by verify's rule: dY's non-finite slices give db a NaN in
    the kernel and the reference alike, which ``np.array_equal`` would call a mismatch."""
    import numpy as np

    from hslm_ptx.catalog.registry import get_kernel
    from hslm_ptx.emu_bench import matches

    spec = get_kernel("hslm_bwd_bf16_bf16")
    want = {"dx": np.zeros((2, 3), np.uint16), "dw": np.zeros((3, 3), np.uint16),
            "db": np.array([1.0, np.nan, 2.0], np.float32)}
    got = {name: value.copy() for name, value in want.items()}
    assert not np.array_equal(got["db"], want["db"]) and matches(spec, got, want)
    got["dx"][1, 2] ^= 1
    assert not matches(spec, got, want)
