"""Every configuration the catalogue offers earns its place (hslm_ptx.catalog.earned): on
some shape of shapes.yaml the rule picks it on every device of the cost model's sweep, or
it is its family's first, or KEPT says why it stays."""
from __future__ import annotations

import dataclasses

import pytest

from hslm_ptx.catalog import earned
from hslm_ptx.catalog.registry import FAMILIES, KERNELS
from hslm_ptx.kernel.spec import Dims
from hslm_ptx.pipeline.core.shapes import load_shape_sets


def every_shape() -> list[Dims]:
    return [Dims(s.R, s.K, s.N) for found in load_shape_sets().values() for s in found]


@pytest.fixture(scope="module")
def idle_without_exceptions() -> set[str]:
    """What the whole catalogue leaves unearned with no exception granted (one sweep)."""
    return {name for idle in earned.catalogue_unearned(every_shape(), kept={}).values() for name in idle}


def test_each_configuration_offered_earns_its_place(idle_without_exceptions):
    assert idle_without_exceptions - set(earned.KEPT) == set()


def test_each_exception_is_needed_and_names_a_kernel(idle_without_exceptions):
    assert set(earned.KEPT) <= set(KERNELS)
    assert set(earned.KEPT) == idle_without_exceptions  # a kept one that earns its place is no exception
    assert all(reason for reason in earned.KEPT.values())


def test_a_configuration_that_never_wins_is_named():
    """A copy of a family's first configuration ties it everywhere and the tie goes to the
    first: the copy earns nothing and is the one named."""
    specs = FAMILIES["hslm_fwd_s8"]
    copy = dataclasses.replace(specs[0], name=f"{specs[0].name}_copy")
    family = {"hslm_fwd_s8": (*specs, copy)}
    devices = earned.rule_sweep()[:3]
    assert earned.unearned(family, every_shape(), devices, kept={}) == {"hslm_fwd_s8": (copy.name,)}
    assert earned.unearned({"hslm_fwd_s8": specs}, every_shape(), devices, kept={}) == {}


def test_the_sweep_is_the_rules_device_and_its_ranges():
    devices = earned.rule_sweep()
    assert len(devices) > 2 and len(set(devices)) > 2
    assert {d.sms for d in devices} == {devices[0].sms}  # a datasheet figure is never swept
