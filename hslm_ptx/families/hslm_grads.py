"""hslm_grads_<dt>_<wdt>[_<dX tile>_<dW tile>]: a layer step's two backward products, dX
and dW, in one launch (family ``hslm_grads_<dt>_<wdt>``, its 128 x 128 with 256 x 128
entry so named: dX written in dY's float type ``dt``, dW in the weight's ``wdt``).

The two products read what the quantization of dY wrote and nothing either writes, so one
grid holds both (``hslm_ptx.tile.grouped``): its first CTAs are ``hslm_dx_splitk_<dt>``'s grid,
the rest ``hslm_dw_splitk_<wdt>``'s, each part the very body of that kernel. Each part
takes its split and its workspace as its kernel does (``partials`` and ``tickets``, here
``dx_partials`` ..., kept zeroed between launches); where a part runs one split it never
touches them.

So every output is bit for bit its kernel's, and the backward of a step with both
gradients is two launches (dY's quantization, this) where it was three. What it saves is
one launch's fixed cost and the tail of the first product: the second's CTAs fill the SMs
the first leaves idle.

Each entry is a pair of tiles the tile rule picks at the HSLM and large shapes
(:data:`PAIRS`); the family's rule is the sum of its parts' scores (the cost model's
device us of each launch alone: the grouped launch is not modelled apart).
"""
from __future__ import annotations

from hslm_ptx.families import hslm_dw_rescaled, hslm_dx_rescaled
from hslm_ptx.tile.grouped import grouped_spec, staged_member
from hslm_ptx.formats.floats import FLOAT_DTYPES
from hslm_ptx.kernel.spec import KernelSpec, family_name
from hslm_ptx.tile import geometry

SHARED_NAMES = ("R", "K", "N")  # the sizes both parts read: one parameter each
# (dX tile, dW tile): what the rule picks at the large shapes (128 x 128 with 256 x 128:
# the family's own name, first, as the large tile is in every family) and the HSLM ones
# (R = 27: 32 x 128n16 with 16 x 128n16; R = 1782: 32 x 128n16 with 32 x 128n16). Each pair
# earns its place (hslm_ptx.catalog.earned): 32 x 128n16 or 32 x 128 with 64 x 128 won one shape
# each by less than the model's interval and are not offered
PAIRS = ((geometry.LARGE, geometry.TALL), (geometry.NARROW, geometry.SHORT), (geometry.NARROW, geometry.NARROW))
PRODUCTS = ("dx", "dw")  # the parts in grid order
PARTS: dict[str, tuple[KernelSpec, KernelSpec]] = {}  # each entry's (dX, dW) kernels


def family(dtype: str, weight_dtype: str) -> str:
    """hslm_grads_<dy's type>_<the weight's type>."""
    return family_name("grads", dtype, weight_dtype)


def grads_spec(dx: KernelSpec, dw: KernelSpec, dtype: str, weight_dtype: str) -> KernelSpec:
    """The entry holding ``dx``'s and ``dw``'s bodies (split families' entries)."""
    parts = (dx, dw)
    large = (dx.tile, dw.tile) == tuple(tile.label for tile in PAIRS[0])
    name = family(dtype, weight_dtype) if large else f"{family(dtype, weight_dtype)}_{dx.tile}_{dw.tile}"
    PARTS[name] = parts
    # registers a thread: the wider part's cap (as many CTAs an SM as it asks)
    min_ctas = max(parts, key=lambda spec: (spec.part.threads, spec.part.min_ctas)).part.min_ctas
    return grouped_spec(name, family(dtype, weight_dtype), f"{dx.tile}+{dw.tile}",
                        tuple(staged_member(spec, product) for spec, product in zip(parts, PRODUCTS)),
                        SHARED_NAMES, min_ctas, cost=lambda d: dx.cost(d) + dw.cost(d))


def _entry(specs: tuple[KernelSpec, ...], tile: geometry.Tile) -> KernelSpec:
    return next(spec for spec in specs if spec.tile == tile.label)


def _family_specs(dtype: str, weight_dtype: str) -> tuple[KernelSpec, ...]:
    dx_family, dw_family = hslm_dx_rescaled.dx_specs(dtype, split=True), hslm_dw_rescaled.dw_specs(weight_dtype, split=True)
    return tuple(grads_spec(_entry(dx_family, dx_tile), _entry(dw_family, dw_tile), dtype, weight_dtype)
                 for dx_tile, dw_tile in PAIRS)


SPECS = tuple(spec for dt in FLOAT_DTYPES for wdt in FLOAT_DTYPES for spec in _family_specs(dt, wdt))
