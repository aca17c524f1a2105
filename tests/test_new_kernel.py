"""A kernel added in its module and the registry gets every kernel test, with no table
to edit: in a scratch copy of the project, hslm_dw_s8's module copied under a new name
(``hslm_dwcopy_s8``) and added to kernels/registry.py, the kernel tests collect the
same cases for the new kernel as for the one it copies and pass
(docs/adding-a-kernel.md). The loop counts the tile rule reads are the generated
step between (`doit sass && doit model:counts`), copied here from the original's."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.config import ROOT

NEW = "hslm_dwcopy_s8"
KERNEL_TEST_FILES = ("tests/test_kernels_run.py", "tests/test_reference.py", "tests/test_tiling.py",
                     "tests/test_sources.py", "tests/test_kernels_ptx.py", "tests/test_spec.py")
# stated for the existing families by name in tests/test_kernels_run.py, not derived: a
# new family states its own in its module (PLANTED_BUGS)
FAMILY_STATED = {"test_planted_bug_is_caught"}


def add_kernel(root: Path) -> None:
    """The two edits a kernel engineer makes: the module, and the registry's import and list."""
    source = (ROOT / "kernels" / "hslm_dw_s8.py").read_text()
    module, count = re.subn(r'^FAMILY = "hslm_dw_s8"$', f'FAMILY = "{NEW}"', source, flags=re.M)
    assert count == 1
    (root / "kernels" / f"{NEW}.py").write_text(module)
    registry = root / "kernels" / "registry.py"
    text = registry.read_text()
    text, imported = re.subn(r"^from kernels\.spec import", f"from kernels import {NEW}\nfrom kernels.spec import", text,
                             count=1, flags=re.M)
    text, listed = re.subn(r"for m in \(", f"for m in ({NEW}, ", text, count=1)
    assert imported == listed == 1, "kernels/registry.py no longer imports kernels.spec and lists its modules"
    registry.write_text(text)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("project")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", ".*.tmp")
    for name in ("kernels", "pipeline", "tests", "ledger"):
        shutil.copytree(ROOT / name, root / name, ignore=skip)
    shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")
    add_kernel(root)
    counted_like(root, "hslm_dw_s8")
    return root


def counted_like(root: Path, original: str) -> None:
    """What `doit sass && doit model:counts` would record for the copy: its PTX is the
    original's but for the entry name, so its loops count the same (the tile rule,
    kernels.cost, reads them from ledger/loop_counts.json)."""
    path = root / "ledger" / "loop_counts.json"
    counts = json.loads(path.read_text())
    for entry in [e for e in counts["kernels"] if e == original or e.startswith(f"{original}_m")]:
        counts["kernels"][entry.replace(original, NEW, 1)] = counts["kernels"][entry]
    path.write_text(json.dumps(counts))


def pytest_in(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--hypothesis-seed=0", *args],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)


def cases(ids: list[str], kernel: str) -> set[str]:
    """The test functions (file::name) with a case of ``kernel`` (its name in the case id)."""
    return {i.split("[", 1)[0] for i in ids if re.search(rf"[\[-]{kernel}(_m\d+)?[\]-]", i)}


def test_a_copied_kernel_gets_every_kernel_test_and_passes(project):
    listed = pytest_in(project, "-o", "addopts=", "--collect-only", "-q", *KERNEL_TEST_FILES)  # one id a line
    assert listed.returncode == 0, listed.stdout[-2000:] + listed.stderr[-2000:]
    ids = [line for line in listed.stdout.splitlines() if "::" in line]
    old, new = cases(ids, "hslm_dw_s8"), cases(ids, NEW)
    assert len(old) > 20 and new == old - FAMILY_STATED, sorted(old ^ new)
    run = pytest_in(project, "-o", "addopts=", "-q", "-x", "-k", NEW, *KERNEL_TEST_FILES)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    ran = re.search(r"(\d+) passed", run.stdout)
    assert ran and int(ran.group(1)) >= len(new) and " failed" not in run.stdout


def test_without_the_registry_line_the_kernel_gets_no_test(tmp_path):
    """Negative: the module alone is not a kernel; the registry is what every table reads."""
    (tmp_path / "kernels").mkdir()
    shutil.copytree(ROOT / "kernels", tmp_path / "kernels", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    source = (ROOT / "kernels" / "hslm_dw_s8.py").read_text()
    (tmp_path / "kernels" / f"{NEW}.py").write_text(source.replace('FAMILY = "hslm_dw_s8"', f'FAMILY = "{NEW}"'))
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    probe = subprocess.run([sys.executable, "-c", f"from kernels.registry import KERNELS; print('{NEW}' in KERNELS)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "False", probe.stderr
