"""The assertcount plugin: per-kernel counts, vacuous tests and invariants, from small
pytest sessions run through pytester."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hslm_ptx.pipeline.core.artifacts import read_model
from hslm_ptx.pipeline.ratchet.kernel_tests import run_kernel_tests
from hslm_ptx.pipeline.core.models import KernelTestRun, TestCounts

SUITE = '''
import pytest
from hypothesis import given, settings, strategies as st

@pytest.mark.kernel("fwd")
def test_checks():
    assert 1 + 1 == 2

@pytest.mark.kernel("fwd")
def test_vacuous():
    x = 1 + 1

@pytest.mark.kernel("fwd")
def test_raises_counts_as_a_check():
    with pytest.raises(ZeroDivisionError):
        1 / 0

@pytest.mark.kernel("fwd", "dw")
def test_fails():
    assert 1 == 2, "one is not two"

@pytest.mark.kernel("dw")
@pytest.mark.skip(reason="needs a GPU")
def test_skipped():
    assert True

@pytest.mark.kernel("dw")
@settings(max_examples=5)
@given(st.integers())
def test_property(n):
    assert n - n == 0

@pytest.mark.parametrize("kernel", ["dx", "dw"])
def test_parametrized(kernel):
    assert kernel

def test_not_a_kernel_test():
    assert True
'''


def run_counts(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, KernelTestRun]:
    out = pytester.path / "counts.json"
    result = pytester.runpytest("-p", "hslm_ptx.pipeline.ratchet.assertcount", f"--test-counts={out}", *args)
    return result, read_model(out, KernelTestRun)


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini("[pytest]\nenable_assertion_pass_hook = true\n")
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def test_counts_per_kernel(suite):
    result, run = run_counts(suite, "-m", "kernel")
    result.assert_outcomes(passed=6, failed=1, skipped=1, deselected=1)
    assert run.kernels == {
        "fwd": TestCounts(passed=3, failed=1, skipped=0, total=4, vacuous=1, invariants=0),
        "dw": TestCounts(passed=2, failed=1, skipped=1, total=4, vacuous=0, invariants=1),
        "dx": TestCounts(passed=1, failed=0, skipped=0, total=1, vacuous=0, invariants=0),
    }
    assert run.vacuous_tests == {"fwd": ["test_suite.py::test_vacuous"]}
    assert run.failures["dw"] == "test_suite.py::test_fails: AssertionError: one is not two"
    assert run.exitstatus == 1 and run.errors == []


def test_without_the_hook_the_counts_are_refused(pytester):
    pytester.makepyfile(test_x="def test_x():\n    assert True\n")
    result = pytester.runpytest("-p", "hslm_ptx.pipeline.ratchet.assertcount", f"--test-counts={pytester.path / 'c.json'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*enable_assertion_pass_hook*"])
    assert not (pytester.path / "c.json").exists()


def test_collection_errors_are_reported(suite):
    suite.makepyfile(test_broken="import no_such_module_here\n")
    _, run = run_counts(suite, "-m", "kernel")
    assert len(run.errors) == 1 and "test_broken.py" in run.errors[0] and "no_such_module_here" in run.errors[0]


def test_subprocess_run_ignores_pyc_compiled_without_the_hook(tmp_path):
    """A test module cached by an earlier plain pytest run has no hook calls in its .pyc:
    counted from that cache its asserts vanish, so run_kernel_tests keeps its own cache."""
    test_file = tmp_path / "test_cached.py"
    test_file.write_text('import pytest\n\n@pytest.mark.kernel("k")\ndef test_a():\n    assert 2 > 1\n')
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    pytest_cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file), "--rootdir", str(tmp_path)]
    assert subprocess.run(pytest_cmd, capture_output=True, cwd=tmp_path, env=env).returncode == 0
    assert list((tmp_path / "__pycache__").glob("test_cached*pytest*.pyc"))
    counted = [*pytest_cmd, "-p", "hslm_ptx.pipeline.ratchet.assertcount", "-o", "enable_assertion_pass_hook=true",
               f"--test-counts={tmp_path / 'stale.json'}"]
    assert subprocess.run(counted, capture_output=True, cwd=tmp_path, env=env).returncode == 0
    assert read_model(tmp_path / "stale.json", KernelTestRun).kernels["k"].vacuous == 1  # the trap
    run = run_kernel_tests(tmp_path / "counts.json", str(test_file), "--rootdir", str(tmp_path))
    assert run.kernels == {"k": TestCounts(passed=1, failed=0, skipped=0, total=1, vacuous=0, invariants=0)}
