"""hslm_ptx.pipeline.stages.build_plan: the kept plan is the computed plan, and what it is keyed by."""
from __future__ import annotations

import importlib.util

import pytest

from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.pipeline.core import config, treememo
from hslm_ptx.pipeline.core.shapes import select_sets
from hslm_ptx.pipeline.stages import build_plan as plan_module
from hslm_ptx.pipeline.stages.build_plan import build_plan


@pytest.fixture
def plan(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "PLAN_DIR", tmp_path)
    monkeypatch.setattr(treememo, "RACY_NS", 0)  # the copy's files are not changing under it
    build_plan.cache_clear()
    yield build_plan
    build_plan.cache_clear()


def test_the_plan_is_the_registry_and_the_sealed_sets(plan):
    found = plan()
    assert found.names() == list(KERNELS)
    shapes = [(s, shape.name) for s, found_shapes in select_sets(config.VERIFY_SETS).items() for shape in found_shapes]
    assert [cells.kernel for cells in found.verify] == list(KERNELS)
    assert all(list(cells.shapes) == shapes and len(set(cells.inputs)) == len(shapes) for cells in found.verify)
    assert all(str(config.ROOT / (KERNELS[kernel.name].module.replace(".", "/") + ".py")) in kernel.sources
               for kernel in found.kernels)  # emit's file_dep: the module and what it imports


def test_a_kept_plan_is_read_back_without_computing(plan, monkeypatch):
    first = plan()
    assert len(list(config.PLAN_DIR.glob("*.json"))) == 1
    plan.cache_clear()
    monkeypatch.setattr(plan_module, "_compute", lambda request: pytest.fail("computed again"))
    assert plan() == first


def test_another_variable_or_a_machine_with_cupy_computes_it(plan, monkeypatch):
    plan()
    plan.cache_clear()
    computed = []
    real = plan_module._compute
    monkeypatch.setattr(plan_module, "_compute", lambda request: computed.append(1) or real(request))
    monkeypatch.setattr(plan_module, "_key", lambda request: {**real_key(request), "variables": {"shape": "smoke"}})
    assert plan().names() == list(KERNELS) and computed == [1]
    plan.cache_clear()
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "cupy" else find_spec(name, *a))
    plan()
    assert computed == [1, 1]  # CuPy here: the backend is asked each run, never kept


real_key = plan_module._key
