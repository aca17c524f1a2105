"""A kernel added in its module and the registry gets every kernel test, with no table
to edit: in a scratch copy of the project, hslm_dw_s8's module copied under a new name
(``hslm_dwcopy_s8``) and added to hslm_ptx/catalog/registry.py, the kernel tests collect the
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

from hslm_ptx.pipeline.core.config import ROOT

NEW = "hslm_dwcopy_s8"
KERNEL_TEST_FILES = ("tests/test_kernels_run.py", "tests/test_reference.py", "tests/test_tiling.py",
                     "tests/test_sources.py", "tests/test_kernels_ptx.py", "tests/test_spec.py")
# stated for the existing families by name in tests/test_kernels_run.py, not derived: a
# new family states its own in its module (PLANTED_BUGS)
FAMILY_STATED = {"test_planted_bug_is_caught"}


def add_kernel(root: Path) -> None:
    """The two edits a kernel engineer makes: the module, and the registry's import and list."""
    source = (ROOT / "hslm_ptx" / "families" / "hslm_dw_s8.py").read_text()
    module, count = re.subn(r'^FAMILY = "hslm_dw_s8"$', f'FAMILY = "{NEW}"', source, flags=re.M)
    assert count == 1
    (root / "hslm_ptx" / "families" / f"{NEW}.py").write_text(module)
    registry = root / "hslm_ptx" / "catalog" / "registry.py"
    text, listed = re.subn(r"^FAMILY_MODULES = \(", f'FAMILY_MODULES = ("{NEW}", ', registry.read_text(), count=1,
                           flags=re.M)
    assert listed == 1, "hslm_ptx/catalog/registry.py no longer lists its families in FAMILY_MODULES"
    registry.write_text(text)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("project")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", ".*.tmp")
    for name in ("hslm_ptx", "tests", "ledger"):
        shutil.copytree(ROOT / name, root / name, ignore=skip)
    shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")
    add_kernel(root)
    counted_like(root, "hslm_dw_s8")
    return root


def counted_like(root: Path, original: str) -> None:
    """What `doit sass && doit model:counts` would record for the copy: its PTX is the
    original's but for the entry name, so its loops count the same (the tile rule,
    hslm_ptx.cost.model, reads them from hslm_ptx/cost/loop_counts.json)."""
    path = root / "hslm_ptx" / "cost" / "loop_counts.json"
    counts = json.loads(path.read_text())
    for section in ("kernels", "occupancy"):  # the loops, and the ptxas occupancy the rule reads
        for entry in [e for e in counts[section] if e == original or e.startswith(f"{original}_m")]:
            counts[section][entry.replace(original, NEW, 1)] = counts[section][entry]
    path.write_text(json.dumps(counts))


def pytest_in(root: Path, *args: str, importable: tuple[Path, ...] = (), **env: str) -> subprocess.CompletedProcess:
    """pytest in the copy, its modules first; ``importable``: folders of plugins (``-p NAME``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (root, *importable))), "PYTHONDONTWRITEBYTECODE": "1",
           **env}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--hypothesis-seed=0", *args],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)


# A plugin for the copy's pytest (``-p collected_ids``): every id the files collect, the ones
# ``-k`` deselects too, written to $COLLECTED_IDS once collection is done. One session then
# both lists the cases and runs the new kernel's: a ``--collect-only`` session first would
# import and collect the six kernel test files a second time.
COLLECTED_IDS = '''
import os

deselected = []


def pytest_deselected(items):
    deselected.extend(items)


def pytest_collection_finish(session):
    with open(os.environ["COLLECTED_IDS"], "w") as out:
        out.writelines(f"{item.nodeid}\\n" for item in [*session.items, *deselected])
'''


def cases(ids: list[str], kernel: str) -> set[str]:
    """The test functions (file::name) with a case of ``kernel`` (its name in the case id)."""
    return {i.split("[", 1)[0] for i in ids if re.search(rf"[\[-]{kernel}(_m\d+)?[\]-]", i)}


def test_a_copied_kernel_gets_every_kernel_test_and_passes(project, tmp_path):
    (tmp_path / "collected_ids.py").write_text(COLLECTED_IDS)
    listed = tmp_path / "ids.txt"  # one id a line
    run = pytest_in(project, "-p", "collected_ids", "-o", "addopts=", "-q", "-x", "-k", NEW, *KERNEL_TEST_FILES,
                    importable=(tmp_path,), COLLECTED_IDS=str(listed))
    assert listed.is_file(), run.stdout[-2000:] + run.stderr[-2000:]  # collection finished
    ids = [line for line in listed.read_text().splitlines() if "::" in line]
    old, new = cases(ids, "hslm_dw_s8"), cases(ids, NEW)
    assert len(old) > 20 and new == old - FAMILY_STATED, sorted(old ^ new)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    ran = re.search(r"(\d+) passed", run.stdout)
    assert ran and int(ran.group(1)) >= len(new) and " failed" not in run.stdout


def test_without_the_registry_line_the_kernel_gets_no_test(tmp_path):
    """Negative: the module alone is not a kernel; the registry is what every table reads."""
    shutil.copytree(ROOT / "hslm_ptx", tmp_path / "hslm_ptx", ignore=shutil.ignore_patterns("__pycache__"))
    source = (ROOT / "hslm_ptx" / "families" / "hslm_dw_s8.py").read_text()
    (tmp_path / "hslm_ptx" / "families" / f"{NEW}.py").write_text(source.replace('FAMILY = "hslm_dw_s8"', f'FAMILY = "{NEW}"'))
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    probe = subprocess.run([sys.executable, "-c", f"from hslm_ptx.catalog.registry import KERNELS; print('{NEW}' in KERNELS)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "False", probe.stderr
