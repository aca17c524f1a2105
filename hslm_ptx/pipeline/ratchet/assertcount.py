"""pytest plugin: count each test's passing asserts, so a seal can say how many of a
kernel's tests actually checked something.

A test concerns kernel ``k`` when it is marked ``@pytest.mark.kernel("k")`` (several
names allowed) or is parametrized with an argument named ``kernel`` whose value is
``"k"`` (the marker is then added for it, so ``-m kernel`` selects it). Per kernel the
plugin counts tests passed / failed / skipped / total, the *vacuous* ones (passed
without a single passing ``assert`` and without ``pytest.raises``/``pytest.warns``)
and the *invariants* (passed hypothesis properties).

Passing asserts come from pytest's ``pytest_assertion_pass`` hook, which only fires
with ``enable_assertion_pass_hook = true`` and only in modules pytest rewrites (test
files, conftest.py, ``pytest.register_assert_rewrite`` modules). Rewritten modules are
cached as .pyc without noting whether the hook was on, so the runner gives pytest
its own pycache folder.

``--test-counts=PATH`` writes a :class:`hslm_ptx.pipeline.core.models.KernelTestRun` JSON there;
hslm_ptx.pipeline.ratchet.kernel_tests runs it (kept there, so importing the pipeline never needs
pytest).
"""
from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import pytest

from hslm_ptx.pipeline.core.artifacts import write_model
from hslm_ptx.pipeline.core.models import KernelTestRun, TestCounts

MARKER = "kernel"
CHECKS = ("raises", "warns")  # pytest helpers that check without an assert statement


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--test-counts", metavar="PATH", default=None,
                     help="write per-kernel test counts (passed, vacuous, invariants) as JSON to PATH")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}(*names): the test checks these kernels "
                                       "(counted in their seals and in the ledger's tests cell)")
    out = config.getoption("--test-counts")
    if out is None:
        return
    if not config.getini("enable_assertion_pass_hook"):
        raise pytest.UsageError("--test-counts needs enable_assertion_pass_hook = true "
                                "(pass -o enable_assertion_pass_hook=true)")
    config.pluginmanager.register(AssertCounter(Path(out)), "assertcount-counter")


def kernels_of(item: pytest.Item) -> tuple[str, ...]:
    """The kernels a test concerns: its kernel markers' names, else a ``kernel`` parameter."""
    names = [str(n) for mark in item.iter_markers(MARKER) for n in mark.args]
    param = getattr(getattr(item, "callspec", None), "params", {}).get("kernel")
    if isinstance(param, str):
        names.append(param)
    return tuple(dict.fromkeys(names))


@pytest.hookimpl(tryfirst=True)  # before -m deselects unmarked items
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if kernels_of(item) and item.get_closest_marker(MARKER) is None:
            item.add_marker(pytest.mark.kernel(*kernels_of(item)))


def first_error_line(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The crash message's first line, else the last ``E`` line of the report."""
    crash = getattr(report.longrepr, "reprcrash", None)
    lines = [line.strip() for line in (crash.message if crash else str(report.longrepr)).splitlines()]
    marked = [line[1:].strip() for line in lines if line.startswith("E ")]
    if marked and crash is None:  # a collection error: the exception is the last E line
        return marked[-1]
    return next((line for line in lines if line), "failed")


class AssertCounter:
    """Registered only when counts were asked for; see the module docstring."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.checks: Counter[str] = Counter()  # nodeid -> passing asserts + raises/warns calls
        self.outcome: dict[str, str] = {}  # nodeid -> passed | failed | skipped
        self.failure: dict[str, str] = {}
        self.kernels: dict[str, tuple[str, ...]] = {}
        self.hypothesis: set[str] = set()
        self.errors: list[str] = []
        self.current: str | None = None
        self.saved = {name: getattr(pytest, name) for name in CHECKS}

    def pytest_configure(self) -> None:
        for name, original in self.saved.items():
            setattr(pytest, name, self.counting(original))

    def pytest_unconfigure(self) -> None:
        for name, original in self.saved.items():
            setattr(pytest, name, original)

    def counting(self, original):
        def check(*args, **kwargs):
            if self.current is not None:
                self.checks[self.current] += 1
            return original(*args, **kwargs)

        return check

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        self.current = item.nodeid
        try:
            return (yield)
        finally:
            self.current = None

    def pytest_assertion_pass(self, item: pytest.Item) -> None:
        self.checks[item.nodeid] += 1

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            if kernels := kernels_of(item):
                self.kernels[item.nodeid] = kernels
                if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
                    self.hypothesis.add(item.nodeid)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.errors.append(f"{report.nodeid or '(session)'}: {first_error_line(report)}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.nodeid not in self.kernels:
            return
        if report.failed and report.nodeid not in self.failure:
            self.failure[report.nodeid] = f"{report.nodeid}: {first_error_line(report)}"
        before = self.outcome.get(report.nodeid)
        if report.failed or before is None or (report.when == "call" and before != "failed"):
            self.outcome[report.nodeid] = "failed" if report.failed else report.outcome

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        counts: dict[str, Counter[str]] = defaultdict(Counter)
        failures: dict[str, str] = {}
        vacuous: dict[str, list[str]] = defaultdict(list)
        files: dict[str, set[str]] = defaultdict(set)
        for nodeid, kernels in self.kernels.items():
            outcome = self.outcome.get(nodeid)
            if outcome is None:  # deselected or never run
                continue
            for kernel in kernels:  # a seal pins these files' hashes beside the counts
                files[kernel].add(nodeid.split("::")[0])
            empty = outcome == "passed" and self.checks[nodeid] == 0
            for kernel in kernels:
                tally = counts[kernel]
                tally["total"] += 1
                tally[outcome] += 1
                tally["vacuous"] += empty
                tally["invariants"] += outcome == "passed" and nodeid in self.hypothesis
                if empty:
                    vacuous[kernel].append(nodeid)
                if outcome == "failed":
                    failures.setdefault(kernel, self.failure.get(nodeid, f"{nodeid}: failed"))
        fields = TestCounts.model_fields
        write_model(self.out, KernelTestRun(
            exitstatus=int(exitstatus),
            kernels={k: TestCounts(**{f: c[f] for f in fields}) for k, c in sorted(counts.items())},
            failures=failures, vacuous_tests=dict(vacuous), errors=self.errors,
            files={k: sorted(f) for k, f in sorted(files.items())},
        ))
