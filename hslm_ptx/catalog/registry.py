"""All kernels by name, in the order tables and reports list them, and the rule that
picks a family's configuration for a shape.

A family (``hslm_fwd_s8``, ``hslm_dx_s8``, ``hslm_dw_s8``) is one product built on
several CTA tiles; each configuration is its own PTX entry and KernelSpec, so emit,
ptxas, verify, seals and the ledger treat it as a kernel of its own. Callers name the
family; :func:`choose` applies the family's one rule (``KernelSpec.cost``) per shape,
as a library's heuristics would.
"""
from __future__ import annotations

import functools
import importlib
import math

from hslm_ptx.kernel.spec import Dims, KernelSpec
from hslm_ptx.cost import model as cost
from hslm_ptx.tile.specs import SCORE_CACHES

# The catalogue of families: one module of hslm_ptx/families/ each, in the order tables and
# reports list them. Adding a family is its module and its name here.
FAMILY_MODULES = ("hslm_fwd_s8", "hslm_dx_s8", "hslm_dw_s8", "hslm_fwd_rescaled", "hslm_dx_rescaled", "hslm_dw_rescaled",
                  "hslm_fwdq", "hslm_fwdx", "hslm_fwdw", "hslm_grads", "hslm_bwd", "hslm_wprep", "hslm_quant")

KERNELS: dict[str, KernelSpec] = {s.name: s for name in FAMILY_MODULES
                                  for s in importlib.import_module(f"hslm_ptx.families.{name}").SPECS}
FAMILIES: dict[str, tuple[KernelSpec, ...]] = {}
for _spec in KERNELS.values():
    FAMILIES[_spec.family_name] = FAMILIES.get(_spec.family_name, ()) + (_spec,)


def get_kernel(name: str) -> KernelSpec:
    """The kernel called ``name``; an unknown name lists the known ones."""
    try:
        return KERNELS[name]
    except KeyError:
        raise KeyError(f"unknown kernel '{name}'; known: {', '.join(KERNELS)}") from None


def choose(family: str, dims: Dims) -> KernelSpec:
    """The configuration of ``family`` the rule picks for ``dims``: the lowest
    ``cost(dims)``, the first listed (the large tile) on a tie. Kept per shape
    (:func:`forget_scores`)."""
    if family not in FAMILIES:
        raise KeyError(f"unknown kernel family '{family}'; known: {', '.join(FAMILIES)}")
    return _choose(family, Dims(*dims))


@functools.lru_cache(maxsize=4096)
def _choose(family: str, dims: Dims) -> KernelSpec:
    return lowest_cost(FAMILIES[family], dims)


def lowest_cost(specs: tuple[KernelSpec, ...], dims: Dims) -> KernelSpec:
    """The rule itself: the configuration of ``specs`` with the lowest ``cost(dims)``,
    the first listed on a tie (one without a score is taken first)."""
    return min(specs, key=lambda s: s.cost(dims) if s.cost else -math.inf)


def forget_scores() -> None:
    """Forget every kept score, plan and pick, and the loop counts they were read from:
    after ``doit model:counts`` rewrote hslm_ptx/cost/loop_counts.json, or a test changed what the
    rule scores with."""
    cost.read_counts_file.cache_clear()
    _choose.cache_clear()
    for cached in SCORE_CACHES:
        cached.cache_clear()
