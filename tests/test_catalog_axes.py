"""The product's axes are each one edit: the float axis is one table
(hslm_ptx.formats.floats.FLOAT_TYPES), and a tile is one more entry in a product's
``TILES``. Each edit changes every family built over it, the kernel names and the step's
lookups, and nothing else. Shown in copies of the package: bf16 taken out of the table,
and the 64 x 128 tile added to the forward product's tiles."""
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
new = [name for name in KERNELS if name.endswith("_m64") and name.startswith("hslm_fwd")]
print(json.dumps({"kernels": list(KERNELS), "dtypes": list(FLOAT_DTYPES),
                  "grads": family_name("grads", *FLOAT_DTYPES[:2]),
                  "emitted": [name for name in new[:2] if f".entry {name}(" in KERNELS[name].emit()]}))
"""
TILES = "TILES = (geometry.LARGE, geometry.SMALL, geometry.NARROW)"  # hslm_fwd_s8's line


def edited(root: Path, module: str, old: str, new: str) -> dict:
    """What a copy of the package under ``root`` lists with one edit made in ``module``."""
    shutil.copytree(PACKAGE, root / "hslm_ptx", ignore=shutil.ignore_patterns("__pycache__"))
    path = root / "hslm_ptx" / module
    text = path.read_text()
    assert text.count(old) == 1, f"{module}: the line to edit moved: update the test"
    path.write_text(text.replace(old, new))
    return listed(root)


def listed(root: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", LISTING], cwd=root, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def without_bf16(tmp_path_factory) -> dict:
    return edited(tmp_path_factory.mktemp("without_bf16"), "formats/floats.py", ROW, "")


def test_the_copy_lists_what_the_checkout_lists_before_the_edit(tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "hslm_ptx", ignore=shutil.ignore_patterns("__pycache__"))
    assert listed(tmp_path)["kernels"] == list(KERNELS)


def test_one_row_out_of_the_table_takes_every_kernel_of_that_type_and_no_other(without_bf16):
    assert without_bf16["dtypes"] == ["float32", "float16"]
    kept = [name for name in KERNELS if "bf16" not in name.split("_")]
    assert len(kept) < len(KERNELS) and without_bf16["kernels"] == kept
    assert without_bf16["grads"] == "hslm_grads_f32_f16"


def test_one_more_tile_adds_its_entry_to_every_family_of_that_product_and_nothing_else(tmp_path):
    got = edited(tmp_path, "families/hslm_fwd_s8.py", TILES, TILES.replace("NARROW)", "NARROW, geometry.MID)"))
    added = [name for name in got["kernels"] if name not in KERNELS]
    assert [name for name in got["kernels"] if name in KERNELS] == list(KERNELS)  # every entry kept, in order
    assert added and all(name.endswith("_m64") and name.startswith("hslm_fwd") for name in added)
    assert {"hslm_fwd_s8_m64", "hslm_fwd_bf16_m64", "hslm_fwd_splitk_f16_m64", "hslm_fwdq_f32_m64"} <= set(added)
    assert len(got["emitted"]) == 2  # the new entries emit PTX under their own names
