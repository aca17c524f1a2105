"""The float axis is one table (hslm_ptx.formats.floats.FLOAT_TYPES): one edit there changes
every family built over it, the kernel names and the step's lookups, and nothing else.
Shown in a copy of the package with bf16 taken out of the table."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hslm_ptx.catalog.registry import KERNELS

PACKAGE = Path(__file__).resolve().parent.parent / "hslm_ptx"
ROW = ', FloatType("bfloat16", "bf16", 2)'  # the table's bf16 row
LISTING = """
import json
from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.formats.floats import FLOAT_DTYPES
from hslm_ptx.kernel.spec import family_name
print(json.dumps({"kernels": list(KERNELS), "dtypes": list(FLOAT_DTYPES),
                  "grads": family_name("grads", *FLOAT_DTYPES[:2])}))
"""


def listed(root: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", LISTING], cwd=root, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def without_bf16(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("one_edit")
    shutil.copytree(PACKAGE, root / "hslm_ptx", ignore=shutil.ignore_patterns("__pycache__"))
    floats = root / "hslm_ptx" / "formats" / "floats.py"
    text = floats.read_text()
    assert text.count(ROW) == 1, "the table's bf16 row moved: update ROW"
    floats.write_text(text.replace(ROW, ""))
    return listed(root)


def test_the_copy_lists_what_the_checkout_lists_before_the_edit(tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "hslm_ptx", ignore=shutil.ignore_patterns("__pycache__"))
    assert listed(tmp_path)["kernels"] == list(KERNELS)


def test_one_row_out_of_the_table_takes_every_kernel_of_that_type_and_no_other(without_bf16):
    assert without_bf16["dtypes"] == ["float32", "float16"]
    kept = [name for name in KERNELS if "bf16" not in name.split("_")]
    assert len(kept) < len(KERNELS) and without_bf16["kernels"] == kept
    assert without_bf16["grads"] == "hslm_grads_f32_f16"
