"""Parametrize a test over kernels with each case marked ``kernel(name)``, so the
seal's test counts (pipeline.assertcount) attribute it to that kernel; and each
kernel's CTA tile and contraction, for tests that count what a tile should emit."""
import pytest

from kernels import hslm_dw_s8, hslm_dx_s8, hslm_fwd_s8, staged_tile
from kernels.registry import KERNELS
from kernels.spec import Dims

MODULES = {m.FAMILY: m for m in (hslm_fwd_s8, hslm_dx_s8, hslm_dw_s8)}
TILES = {staged_tile.entry_name(family, tile): tile for family, m in MODULES.items() for tile in m.TILES}


def per_kernel(names=tuple(KERNELS)):
    return [pytest.param(name, marks=pytest.mark.kernel(name), id=name) for name in names]


def family_configs(family: str) -> list[str]:
    """Every configuration's name of ``family``."""
    return [name for name, spec in KERNELS.items() if spec.family_name == family]


def tile_of(name: str) -> staged_tile.Tile:
    return TILES[name]


def contraction(name: str, dims: Dims) -> int:
    """The k extent the kernel's chunk loop walks."""
    return {"hslm_fwd_s8": dims.K, "hslm_dx_s8": dims.N, "hslm_dw_s8": dims.R}[KERNELS[name].family_name]


def span_of(name: str, dims: Dims) -> int:
    """k bytes per split of the kernel's own plan (its kspan parameter)."""
    return next(p.value(dims) for p in KERNELS[name].params if p.name == "kspan")
