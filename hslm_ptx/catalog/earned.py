"""Whether each configuration the catalogue offers earns its place.

The tile rule (:func:`hslm_ptx.catalog.registry.choose`) scores a family's configurations
with the cost model on one GPU's figures, and most of those figures are estimates with a
range (hslm_ptx/cost/devices.json). A configuration that wins a shape by less than that
range is a choice the first GPU run has to decide; offering it costs every user its
emit, ptxas, verify cells, seals and ledger rows. So a configuration earns its place
when on some shape of shapes.yaml (every set, ``large`` included) the rule picks it on
every device of the model's sweep (:func:`hslm_ptx.cost.model.device_sweep`: the
nominal figures, each ranged figure at its low and at its high, and seeded joint
draws): its win over the next-best of its family holds over the whole interval.

A family's first configuration (its own name, the pick on a tie) always stays, and
:data:`KEPT` names the few that stay for another reason, each with it.
"""
from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from typing import Iterable, Iterator

from hslm_ptx.catalog.registry import FAMILIES, forget_scores, lowest_cost
from hslm_ptx.cost import model as cost
from hslm_ptx.kernel.spec import Dims, KernelSpec
from hslm_ptx.tile import rule

# kernel -> why it stays although it wins no shape over the interval
_DW_TILE = ("hslm_dw_<out> and hslm_dw_splitk_<out> offer hslm_dw_s8's tiles, and the fused "
            "backward's dW parts run on its 32 x 128n16 and 64 x 128 tiles")
KEPT: dict[str, str] = {
    **{f"hslm_dw_s8_{tile}": "its loop counts score the fused backward's dW part on this tile (loop_family)"
       for tile in ("m32n16", "m64")},
    **{f"hslm_dw_{out}_{tile}": _DW_TILE for out in ("f32", "f16", "bf16") for tile in ("m32n16", "m64")},
    **{f"hslm_dw_splitk_{out}_m64": _DW_TILE for out in ("f32", "f16", "bf16")},
    **{f"hslm_bwd_f32_{wdt}_32x128n16_32x128n16": "the hslm_bwd families offer one list of tile pairs, and this "
       "pair earns its place with f16 and bf16 dY" for wdt in ("f32", "f16", "bf16")},
}


def rule_sweep() -> list[cost.Device]:
    """The devices the rule's GPU is swept over: its figures' ranges in devices.json."""
    nominal = cost.device(cost.RULE_DEVICE)
    return cost.device_sweep(nominal, cost.load_ranges().get(cost.RULE_DEVICE, {}))


@contextmanager
def scoring_for(dev: cost.Device) -> Iterator[None]:
    """Inside the block the rule scores for ``dev`` instead of its own GPU; every kept
    score and pick is forgotten on the way in and on the way out."""
    saved = rule.rule_device
    rule.rule_device = lambda: dev
    forget_scores()
    try:
        yield
    finally:
        rule.rule_device = saved
        forget_scores()


def picks(families: dict[str, tuple[KernelSpec, ...]], shapes: Iterable[Dims], devices: list[cost.Device]
          ) -> dict[tuple[str, Dims], set[str]]:
    """(family, shape) -> the configurations the rule picks over ``devices``: one name
    where the pick holds over the whole sweep."""
    shapes = tuple(shapes)
    out: dict[tuple[str, Dims], set[str]] = defaultdict(set)
    for dev in devices:
        with scoring_for(dev):
            for family, specs in families.items():
                for dims in shapes:
                    out[family, dims].add(lowest_cost(specs, dims).name)
    return dict(out)


def unearned(families: dict[str, tuple[KernelSpec, ...]], shapes: Iterable[Dims],
             devices: list[cost.Device], kept: dict[str, str] = KEPT) -> dict[str, tuple[str, ...]]:
    """family -> its configurations, the first and ``kept`` aside, that the rule picks
    over the whole sweep on none of ``shapes`` (families with none left out)."""
    shapes = tuple(dict.fromkeys(Dims(*s) for s in shapes))
    offered = {name: specs for name, specs in families.items() if len(specs) > 1}
    held = picks(offered, shapes, devices)
    out = {}
    for name, specs in offered.items():
        robust = {next(iter(held[name, dims])) for dims in shapes if len(held[name, dims]) == 1}
        idle = tuple(s.name for s in specs[1:] if s.name not in robust and s.name not in kept)
        if idle:
            out[name] = idle
    return out


def catalogue_unearned(shapes: Iterable[Dims], kept: dict[str, str] = KEPT) -> dict[str, tuple[str, ...]]:
    """:func:`unearned` of every family of the catalogue over the rule's sweep."""
    return unearned(FAMILIES, shapes, rule_sweep(), kept)
