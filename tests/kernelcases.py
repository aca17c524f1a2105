"""Parametrize a test over kernels with each case marked ``kernel(name)``, so the
seal's test counts (pipeline.assertcount) attribute it to that kernel."""
import pytest

from kernels.registry import KERNELS


def per_kernel(names=tuple(KERNELS)):
    return [pytest.param(name, marks=pytest.mark.kernel(name), id=name) for name in names]
