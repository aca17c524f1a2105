"""Suite-wide settings, wiring and fixtures.

- Warnings are errors in the emulator's tests (tests/test_ptxemu*.py: a numpy overflow or
  invalid-value warning is a bug in an emulator form); a test that expects one says so
  with its own ``filterwarnings`` mark, which takes precedence.
- pipeline.assertcount: registers the ``kernel(name)`` marker and, with
  ``--test-counts=PATH`` (and enable_assertion_pass_hook), counts each kernel's tests
  for seals and the ledger.
- pytester: tests/test_assertcount.py runs small pytest sessions through it.
- ``fake_artifacts``: emit/ptxas/verify/sass results written into a tmp artifacts tree
  (tests/artifactcases.py), so ledger, seal and gate logic is tested without emitting
  or running a kernel.
- ``tmp_doit``: runs ``python -m doit`` on a small dodo written in a tmp folder
  (the ratchet's tasks with their inputs swapped for fixtures).
- Helpers tests share live in modules that are not tests (kernelcases, emucases,
  artifactcases, quantbounds), so no test module imports another.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable

import pytest

from artifactcases import FakeArtifacts

from pipeline import config
from pipeline.config import ROOT

pytest_plugins = ["pipeline.assertcount", "pytester"]


ERRORS_ON_WARNINGS = "test_ptxemu"  # the emulator's test modules: a numpy warning there is a bug


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Warnings are errors in the emulator's tests, below any filterwarnings mark of the
    test's own."""
    for item in items:
        if item.path.name.startswith(ERRORS_ON_WARNINGS):
            item.add_marker(pytest.mark.filterwarnings("error"), append=False)


@pytest.fixture
def fake_artifacts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeArtifacts:
    for name in ("PTX_DIR", "PTXAS_DIR", "VERIFY_DIR", "SASS_DIR"):
        monkeypatch.setattr(config, name, tmp_path / "artifacts" / name.lower())
    return FakeArtifacts(tmp_path)


@pytest.fixture
def tmp_doit(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess]:
    """``tmp_doit(dodo_source, *doit_args)``: doit run in tmp_path with that dodo.py."""

    def run(dodo: str, *args: str) -> subprocess.CompletedProcess:
        (tmp_path / "dodo.py").write_text(textwrap.dedent(dodo) + '\nDOIT_CONFIG = {"dep_file": "db", "backend": "json"}\n')
        return subprocess.run([sys.executable, "-m", "doit", "-f", str(tmp_path / "dodo.py"), "-d", str(tmp_path), *args],
                              cwd=ROOT, capture_output=True, text=True)

    return run
