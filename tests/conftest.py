"""Suite-wide settings, wiring and fixtures.

- Under pytest-xdist (``-n N --dist loadgroup``, the README's test command) the tests
  sharing a module-scoped fixture run on one worker (:func:`shares_a_fixture`;
  tests/test_suite_wiring.py checks that the fixture is then built once).
- Warnings are errors in the emulator's tests (tests/test_ptxemu*.py: a numpy overflow or
  invalid-value warning is a bug in an emulator form); a test that expects one says so
  with its own ``filterwarnings`` mark, which takes precedence.
- hslm_ptx.pipeline.ratchet.assertcount: registers the ``kernel(name)`` marker and, with
  ``--test-counts=PATH`` (and enable_assertion_pass_hook), counts each kernel's tests
  for seals and the ledger.
- pytester: tests/test_assertcount.py runs small pytest sessions through it.
- ``fake_artifacts``: emit/ptxas/verify/sass results written into a tmp artifacts tree
  (tests/artifactcases.py), so ledger, seal and gate logic is tested without emitting
  or running a kernel.
- ``tmp_doit``: runs ``python -m doit`` on a small dodo written in a tmp folder
  (the ratchet's tasks with their inputs swapped for fixtures).
- ``world``: gate.main() on files in tmp_path holding the gate's green world
  (tests/gatecases.py).
- The build plan a test computes in-process is kept in a temp folder (``plan_memo_in_tmp``).
- Helpers tests share live in modules that are not tests (kernelcases, emucases,
  artifactcases, quantbounds, floatcases, stepcases, gatecases), so no test module imports another.
"""
from __future__ import annotations

import os

# Before anything imports numpy or torch: one BLAS / OpenMP thread a process. The suite runs
# one worker per core (-n auto), so a second thread per worker only spins against the other
# worker (OpenBLAS busy-waits); every result the tests compare is exact whatever the count.
# torch.compile's inductor would likewise start a pool of compile workers per process.
for _threads in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS"):
    os.environ.setdefault(_threads, "1")

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable

import pytest

from artifactcases import FakeArtifacts
from gatecases import green_world

from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.config import ROOT

pytest_plugins = ["hslm_ptx.pipeline.ratchet.assertcount", "pytester"]


ERRORS_ON_WARNINGS = "test_ptxemu"  # the emulator's test modules: a numpy warning there is a bug


SHARED_SCOPES = ("module", "class", "package")  # fixtures built once for many tests

# The longest files first (seconds of test time, `pytest --durations=0` on 2 workers), so the
# workers start on them and end together on the many short tests: without it the last long
# group can start when everything else is done. A file not listed keeps its place after
# these; a stale order costs wall time only.
LONGEST_FIRST = ("test_graph.py", "test_on_device.py", "test_kernels_run.py", "test_bench_tools.py",
                 "test_fused_epilogue.py", "test_sass.py", "test_torch_linear.py", "test_bench.py", "test_cost.py",
                 "test_new_kernel.py", "test_torch_compile.py", "test_bench_report.py")


def shares_a_fixture(item: pytest.Item) -> bool:
    """Whether ``item`` uses a fixture built once for its module (or class, or package)."""
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(d.scope in SHARED_SCOPES for defs in info.name2fixturedefs.values() for d in defs)


def keep_the_group_in_the_node_id(item: pytest.Item, group: str) -> None:
    """pytest-xdist's loadgroup learns a test's group from a ``@group`` suffix on the node id
    each worker reports, which it writes into ``Node._nodeid``; pytest >= 9.2 builds node ids
    from ``Node._id`` (a NodeId), so that write is lost and every group is scattered over the
    workers (pytest-dev/pytest-xdist#1386): each worker then builds each module fixture again.
    Writes the suffix where this pytest reads the id; older pytest needs nothing."""
    node_id = getattr(item, "_id", None)
    if hasattr(node_id, "parse") and not str(node_id).endswith(f"@{group}"):
        item._id = type(node_id).parse(f"{node_id}@{group}")


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist hands the groups out largest first by their count of tests (its
    ``--loadscope-reorder``, on by default); here the order is the collection's, longest
    first by time (:data:`LONGEST_FIRST`). The controller reads this option; it loads this
    file as an initial conftest of ``testpaths``."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Warnings are errors in the emulator's tests, below any filterwarnings mark of the
    test's own.

    Under ``pytest -n N --dist loadgroup`` (pytest-xdist) the tests of a module that share
    a module-scoped fixture go to one worker, in file order: the fixture is built once
    (not once per worker) and tests that leave state for the next (tests/test_graph.py)
    still run in sequence. Every other test is handed to whichever worker is free, the
    files of :data:`LONGEST_FIRST` first (pytest_configure keeps xdist to that order)."""
    items.sort(key=lambda item: LONGEST_FIRST.index(item.path.name) if item.path.name in LONGEST_FIRST
               else len(LONGEST_FIRST))  # stable: file order within a file, and among the rest
    for item in items:
        if item.path.name.startswith(ERRORS_ON_WARNINGS):
            item.add_marker(pytest.mark.filterwarnings("error"), append=False)
        if shares_a_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
            if getattr(config.option, "loadgroup", False):  # a pytest-xdist worker under --dist loadgroup
                keep_the_group_in_the_node_id(item, item.path.stem)


@pytest.fixture(autouse=True, scope="session")
def plan_memo_in_tmp(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tests create the build's tasks in-process: the plan they keep
    (hslm_ptx.pipeline.stages.build_plan) goes to a temp folder, not the working tree's artifacts/."""
    config.PLAN_DIR = tmp_path_factory.mktemp("plans")


@pytest.fixture
def fake_artifacts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeArtifacts:
    for name in ("PTX_DIR", "PTXAS_DIR", "VERIFY_DIR", "SASS_DIR"):
        monkeypatch.setattr(config, name, tmp_path / "artifacts" / name.lower())
    return FakeArtifacts(tmp_path)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """The gate's green world as files gate.main() reads (tests/gatecases.py); their paths."""
    return green_world(tmp_path, monkeypatch)


@pytest.fixture
def tmp_doit(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess]:
    """``tmp_doit(dodo_source, *doit_args)``: doit run in tmp_path with that dodo.py."""

    def run(dodo: str, *args: str) -> subprocess.CompletedProcess:
        (tmp_path / "dodo.py").write_text(textwrap.dedent(dodo) + '\nDOIT_CONFIG = {"dep_file": "db", "backend": "json"}\n')
        return subprocess.run([sys.executable, "-m", "doit", "-f", str(tmp_path / "dodo.py"), "-d", str(tmp_path), *args],
                              cwd=ROOT, capture_output=True, text=True)

    return run


class Preparations:
    """Counts weight preparations (every backend's: the CPU step's ``prepare_weight`` and the
    launch step's ``prepare_weight`` and ``prepare_and_forward``) by wrapping those
    functions for one test (:func:`count_preparations`)."""

    def __init__(self) -> None:
        self.count = 0

    def wrap(self, fn):
        def counted(*args, **kwargs):
            self.count += 1
            return fn(*args, **kwargs)
        return counted


@pytest.fixture
def preparations(monkeypatch) -> Preparations:
    from hslm_ptx.nn import cpu_step
    from hslm_ptx.step import launches

    seen = Preparations()
    for module, name in ((cpu_step, "prepare_weight"), (launches, "prepare_weight"),
                         (launches, "prepare_and_forward")):
        monkeypatch.setattr(module, name, seen.wrap(getattr(module, name)))
    return seen
