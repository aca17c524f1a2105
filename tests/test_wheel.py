"""The wheel a user installs: built from this checkout, installed outside it, it holds its
data (device facts, calibration points, loop counts) and nothing at the top level but
``hslm_ptx``, and it runs a TernaryLinear step on CPU and on the emulator backend with the
same tile picks as the checkout."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hslm_ptx.catalog import registry
from hslm_ptx.kernel.spec import Dims
from hslm_ptx.pipeline.core.config import ROOT

PICKS = [("hslm_fwd_s8", (27, 243, 729)), ("hslm_dw_s8", (1782, 243, 729)), ("hslm_dx_s8", (27, 729, 243)),
         ("hslm_fwdq_bf16", (27, 243, 729))]
DATA = ("hslm_ptx/cost/devices.json", "hslm_ptx/cost/calibration.yaml", "hslm_ptx/cost/loop_counts.json")

USE = r"""
import json, sys
import hslm_ptx
from hslm_ptx.catalog import registry
from hslm_ptx.kernel.spec import Dims
out = {"file": hslm_ptx.__file__,
       "picks": [registry.choose(f, Dims(*d)).name for f, d in json.loads(sys.argv[1])]}
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    from hslm_ptx import TernaryLinear
    for backend in ("cpu", "emulator"):
        torch.manual_seed(0)
        layer = TernaryLinear(32, 16, backend=backend)
        x = torch.randn(5, 32, requires_grad=True)
        layer(x).square().sum().backward()
        out[backend] = [float(x.grad.abs().sum()), float(layer.weight.grad.abs().sum())]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out, source = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):  # a copy: the build writes build/ beside it
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "hslm_ptx", source / "hslm_ptx", ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(out), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    (found,) = out.glob("hslm_ptx-*.whl")
    return found


def test_the_wheel_holds_its_data_and_one_top_level_name(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert all(n in names for n in DATA)
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"hslm_ptx"}


def test_installed_outside_the_checkout_it_steps_and_picks_as_the_checkout(wheel, tmp_path):
    target = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                                str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": str(target), "PYTHONDONTWRITEBYTECODE": "1"}
    ran = subprocess.run([sys.executable, "-c", USE, json.dumps(PICKS)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    got = json.loads(ran.stdout.strip().splitlines()[-1])
    assert Path(got["file"]).is_relative_to(target)  # the wheel's package, not the checkout's
    assert got["picks"] == [registry.choose(f, Dims(*d)).name for f, d in PICKS]
    if "cpu" in got:  # torch is installed here (always in CI)
        assert got["cpu"][0] > 0 and got["emulator"][0] > 0


def test_without_its_loop_counts_the_rule_says_so(wheel, tmp_path):
    """Negative: an install whose counts file is gone fails the first pick with one line,
    never a silent first-listed tile."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    (target / "hslm_ptx" / "cost" / "loop_counts.json").unlink()
    env = {**os.environ, "PYTHONPATH": str(target), "PYTHONDONTWRITEBYTECODE": "1"}
    ran = subprocess.run([sys.executable, "-c", USE, json.dumps(PICKS[:1])], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode != 0 and "loop_counts.json" in ran.stderr
