"""What the BitNet tests share: Figure 3's BitLinear and the comparisons with it.

They live in bench/bitnet_conventions.py (which loads Figure 3's code from
examples/bitnet_charlm.py, written there from the paper), loaded here by path, so the
tests hold to their bounds the same comparisons the benchmark prints for the docs.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from torchcases import torch  # noqa: F401  (skips the importing module where torch is missing)

_spec = importlib.util.spec_from_file_location(
    "bitnet_conventions", Path(__file__).resolve().parent.parent / "bench" / "bitnet_conventions.py")
conventions = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conventions)

figure3 = conventions.figure3
SHAPES, SEEDS = conventions.SHAPES, conventions.SEEDS
rel_l2, random_layer = conventions.rel_l2, conventions.random_layer
figure3_twin, layer_step = conventions.figure3_twin, conventions.layer_step
errors_against_figure3 = conventions.errors_against_figure3
BOUND = 1e-6  # rel L2, f32: float rounding only
