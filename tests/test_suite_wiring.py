"""The suite's own wiring (tests/conftest.py) under the README's test command: with
``pytest -n 2 --dist loadgroup`` the tests sharing a module fixture run on one worker, so
the fixture is built once, not once per worker. Small sessions run through pytester in a
subprocess (pytest-xdist starts its workers from there)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# a module fixture that leaves one line per build, its tests interleaved with tests that
# do not use it (those go to whichever worker is free)
SESSION = '''
import os
import time

import pytest


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    with open(os.environ["BUILDS"], "a") as log:
        log.write(f"{os.getpid()}\\n")
    time.sleep(1.0)  # long enough that the other worker is free for the next test
    return True


def test_1(built): assert built
def test_2(): time.sleep(0.05)
def test_3(built): assert built
def test_4(): time.sleep(0.05)
def test_5(built): assert built
def test_6(): time.sleep(0.05)
def test_7(built): assert built
def test_8(): time.sleep(0.05)
'''


def builds_under_loadgroup(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, conftest: str) -> list[str]:
    """The processes that built the module fixture in one ``-n 2 --dist loadgroup`` session."""
    builds = pytester.path / "builds.txt"
    monkeypatch.setenv("BUILDS", str(builds))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    pytester.makeconftest(conftest)
    pytester.makepyfile(test_session=SESSION)
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=8)
    return builds.read_text().split()


def test_a_module_fixture_is_built_once_under_loadgroup(pytester, monkeypatch):
    """The suite's collection hook, as tests/conftest.py defines it."""
    suite_hook = (
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('suite_conftest', {str(TESTS / 'conftest.py')!r})\n"
        "suite = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(suite)\n"
        "pytest_collection_modifyitems = suite.pytest_collection_modifyitems\n")
    assert len(builds_under_loadgroup(pytester, monkeypatch, suite_hook)) == 1


def test_without_the_group_in_the_node_id_each_worker_builds_the_fixture(pytester, monkeypatch, request):
    """Negative: the xdist_group mark alone, as pytest-xdist reads it on this pytest, leaves
    the group scattered (on a pytest where the mark alone works, there is nothing to show)."""
    if not hasattr(request.node, "_id"):
        pytest.skip("this pytest keeps pytest-xdist's group suffix by itself")
    mark_only = (
        "import pytest\n\n"
        "@pytest.hookimpl(tryfirst=True)\n"
        "def pytest_collection_modifyitems(items):\n"
        "    for item in items:\n"
        "        if 'built' in item.fixturenames:\n"
        "            item.add_marker(pytest.mark.xdist_group(item.path.stem))\n")
    assert len(builds_under_loadgroup(pytester, monkeypatch, mark_only)) == 2
