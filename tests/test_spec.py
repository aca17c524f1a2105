"""The spec's dense GEMM form (what bench times) and the exact product the references use."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from kernelcases import GEMMS, per_kernel

from hslm_ptx.reference import products as reference
from hslm_ptx.reference.products import exact_matmul, float64_is_exact
from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.kernel.spec import Dims


@pytest.mark.parametrize("kernel", per_kernel(GEMMS))
def test_gemm_form_is_the_kernel_product(kernel):
    spec, dims = KERNELS[kernel], Dims(5, 37, 11)
    inputs = spec.make_inputs(dims, np.random.default_rng(1))
    a, bt = spec.gemm_operands(inputs, dims)
    assert a.dtype == bt.dtype == np.int8 and a.flags.c_contiguous and bt.flags.c_contiguous
    assert np.array_equal(a.astype(np.int64) @ bt.T.astype(np.int64), spec.reference(dims, inputs))


def test_exact_matmul_in_blocks_and_past_the_float64_bound(monkeypatch):
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (37, 50), dtype=np.int8)
    b = rng.integers(-128, 128, (50, 9), dtype=np.int8)
    want = a.astype(np.int64) @ b.astype(np.int64)
    monkeypatch.setattr(reference, "BLOCK_MACS", 9 * 50 * 4)  # blocks of 4 rows
    done = []
    assert np.array_equal(exact_matmul(a, b, progress=lambda rows, total: done.append((rows, total))), want)
    assert done[0] == (4, 37) and done[-1] == (37, 37) and len(done) == 10
    big = np.full((2, 3), 2**26, dtype=np.int64)  # 3 * 2^52 > 2^53: float64 would round
    assert not float64_is_exact(big, big.T) and float64_is_exact(a, b)
    assert np.array_equal(exact_matmul(big, big.T), big @ big.T)


def test_warnings_are_errors_in_the_emulator_tests_only(pytester):
    """tests/conftest.py, run as it is on two stand-in test modules: int8 overflow fails
    the emulator's test and only warns in the other (the negative: without the rule
    both would pass)."""
    tests = Path(__file__).parent
    pytester.makeconftest((tests / "conftest.py").read_text())
    pytester.makepyfile(artifactcases=(tests / "artifactcases.py").read_text())
    overflow = "import numpy as np\n\ndef test_overflow():\n    np.int8(127) + np.int8(1)\n"
    pytester.makepyfile(test_ptxemu_stand_in=overflow, test_other_stand_in=overflow)
    result = pytester.runpytest("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=1, failed=1, warnings=1)
    assert "test_ptxemu_stand_in.py::test_overflow" in result.stdout.str().split("short test summary")[-1]
