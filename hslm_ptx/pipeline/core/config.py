"""The one place for the build's knobs and paths: target archs, ptxas budgets, shape sets,
the emulator's work budget, and every file and folder the graph reads or writes.

Stages read these names instead of carrying their own constants, so changing an
arch or a budget is one edit here, and the tasks that depend on it re-run (their
``uptodate`` carries these values through ``config_changed``).
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[3]  # the checkout: hslm_ptx/pipeline/core/config.py
ARTIFACTS = ROOT / "artifacts"

# Every arch the PTX is assembled for. The kernels use mma.sync m16n8k32 s8,
# sm_80 and newer, so one PTX (.target sm_80) serves them all.
ARCHS: tuple[str, ...] = ("sm_80", "sm_86", "sm_89", "sm_90")
GPU_EVIDENCE_ARCHS: tuple[str, ...] = ("sm_80", "sm_89", "sm_90")  # the GPU kinds a seal wants verify evidence from


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


# Shape sets (names in shapes.yaml). `doit verify`, `doit seal` and `doit gate` check
# VERIFY_SETS unless told otherwise (shape=...): the whole hslm set, every row, costs
# seconds on the emulator. `large` is for GPU throughput.
SHAPES_FILE = ROOT / "shapes.yaml"
VERIFY_SETS: tuple[str, ...] = ("smoke", "tails", "hslm")

# The emulator's work budget per verify cell, in multiply-adds (R*K*N): it runs about
# 4e8 of them a second on one core, so this is about 10 s. Bigger cells are refused
# unless forced (force=1); a GPU has no such budget.
EMULATOR_MACS_PER_SECOND = 4e8
EMULATOR_WORK_BUDGET = 2**32

BACKENDS: tuple[str, ...] = ("auto", "gpu", "emulator")
DEFAULT_BACKEND = "auto"

# Everything the graph writes or reads, by path.
PTX_DIR = ARTIFACTS / "ptx"
PTXAS_DIR = ARTIFACTS / "ptxas"
VERIFY_DIR = ARTIFACTS / "verify"
CACHE_DIR = ARTIFACTS / "cache"  # what a run keeps to be fast, never evidence: `doit clean` removes it
SOURCES_MEMO = CACHE_DIR / "sources.json"  # what parsing the kernels' sources gave (hslm_ptx.pipeline.core.sources)
PLAN_DIR = CACHE_DIR / "plans"  # the build's tasks as data, one file per command line (hslm_ptx.pipeline.stages.build_plan)
HASHES_MEMO = CACHE_DIR / "hashes.json"  # each file version's sha256 (hslm_ptx.pipeline.core.checker)
SASS_DIR = ARTIFACTS / "sass"
TESTS_DIR = ARTIFACTS / "tests"
TESTS_JSON = TESTS_DIR / "kernel_tests.json"
TESTS_PYCACHE = TESTS_DIR / "pycache"
HYPOTHESIS_DIR = ROOT / ".hypothesis"  # hypothesis's example database, which the kernel tests grow
# The kernel tests re-run when a .py file under these changes.
TEST_INPUT_DIRS: tuple[Path, ...] = (ROOT / "tests", ROOT / "hslm_ptx")
GATE_DIR = ARTIFACTS / "gate"
BENCH_DIR = ARTIFACTS / "bench"
MODEL_DIR = ARTIFACTS / "model"
LEDGER_DIR = ROOT / "ledger"
LEDGER_FILE = LEDGER_DIR / "ledger.json"
SEALS_DIR = LEDGER_DIR / "seals"
ALLOWED_FILE = LEDGER_DIR / "allowed_duplicates.yaml"
SCHEMAS_DIR = ROOT / "schemas"  # committed JSON Schema of every record file (hslm_ptx.pipeline.core.schemas)
# Folders the pipeline writes into atomically: a killed run's temp files are swept here.
WRITTEN_DIRS: tuple[Path, ...] = (ARTIFACTS, LEDGER_DIR)


def ptx_path(kernel: str) -> Path:
    return PTX_DIR / f"{kernel}.ptx"


def emit_json(kernel: str) -> Path:
    return PTX_DIR / f"{kernel}.emit.json"


def ptxas_json(kernel: str) -> Path:
    return PTXAS_DIR / f"{kernel}.json"


def verify_json(kernel: str, shape_set: str, shape: str) -> Path:
    return VERIFY_DIR.joinpath(kernel, shape_set, f"{shape}.json")  # one parse: a no-op run names 1134 of these


def verify_index(kernel: str) -> Path:
    return VERIFY_DIR / kernel / "index.json"


def sass_json(kernel: str) -> Path:
    return SASS_DIR / f"{kernel}.json"
