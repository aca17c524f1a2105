"""The one place for the build's knobs: target archs, ptxas budgets, shape sets, paths.

Stages read these names instead of carrying their own constants, so changing an
arch or a budget is one edit here, and the tasks that depend on it re-run (their
``uptodate`` carries these values through ``config_changed``).
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from pipeline.artifacts import ARTIFACTS, ROOT

# Every arch the PTX is assembled for. The kernels use mma.sync m16n8k32 s8,
# sm_80 and newer, so one PTX (.target sm_80) serves them all.
ARCHS: tuple[str, ...] = ("sm_80", "sm_86", "sm_89", "sm_90")


class Budget(NamedTuple):
    """Per-kernel resource ceiling checked on every arch's ptxas -v figures."""

    max_registers: int
    max_shared_bytes: int


# 128 registers keeps 2 CTAs of 256 threads resident per SM; 48 KiB is the static
# shared memory a kernel may use without opting in to more.
DEFAULT_BUDGET = Budget(max_registers=128, max_shared_bytes=48 * 1024)
BUDGET_OVERRIDES: dict[str, Budget] = {}


def budget(kernel: str) -> Budget:
    """The budget of ``kernel``: its override when it has one, else the default."""
    return BUDGET_OVERRIDES.get(kernel, DEFAULT_BUDGET)


# Shape sets (names in shapes.yaml). `doit verify` checks VERIFY_SETS unless told
# otherwise (shape=...); CI's gate checks GATE_SETS on the emulator: all of them, since
# the whole hslm set, every row, costs seconds there. `large` is for GPU throughput
# and never runs on the emulator by default.
SHAPES_FILE = ROOT / "shapes.yaml"
VERIFY_SETS: tuple[str, ...] = ("smoke", "tails", "hslm")
GATE_SETS: tuple[str, ...] = VERIFY_SETS

BACKENDS: tuple[str, ...] = ("auto", "gpu", "emulator")
DEFAULT_BACKEND = "auto"

PTX_DIR = ARTIFACTS / "ptx"
PTXAS_DIR = ARTIFACTS / "ptxas"
VERIFY_DIR = ARTIFACTS / "verify"


def ptx_path(kernel: str) -> Path:
    return PTX_DIR / f"{kernel}.ptx"


def emit_json(kernel: str) -> Path:
    return PTX_DIR / f"{kernel}.emit.json"


def ptxas_json(kernel: str) -> Path:
    return PTXAS_DIR / f"{kernel}.json"


def verify_json(kernel: str, shape_set: str, shape: str) -> Path:
    return VERIFY_DIR / kernel / shape_set / f"{shape}.json"
