"""hslm_fwdx_<out>: a training forward in one launch: ``hslm_fwdq_splitk_<out>``'s product
(y from float x, each CTA quantizing its own rows of x) and ``hslm_qcols_<out>``'s column
codes, scales and sums of the same x (what dW reads later), in one grid
(``hslm_ptx.tile.grouped``: the product's CTAs first, then one CTA per 32 columns of x). The
two share x and nothing else: neither reads what the other writes. So a forward that
keeps what dW needs is one launch where it was two (``hslm_quant_<dt>``, then
``hslm_fwd_<out>``), and x's row codes are never written or read back.

One entry per forward tile (:func:`tiles_of`: the family's name is its first tile's, the
others ``_m32`` and ``_m32n16``); the rule scores it as the product's configuration (the
column CTAs, a pass of x a column, are not in the model). The product reads its CTA
coordinates afresh at each use (``grouped.staged_member``'s ``recompute``). ``scales`` are x's column scales,
``sums`` its column sums (unused by the step: dW's bias gradient is dY's).
"""
from __future__ import annotations

from hslm_ptx.families import hslm_fwd_s8, hslm_fwdq
from hslm_ptx.tile.grouped import Member, grouped_spec, staged_member
from hslm_ptx.families.hslm_quant import cols_body, qcols_spec
from hslm_ptx.formats.floats import FLOAT_DTYPES
from hslm_ptx.emit.ptx import Ptx
from hslm_ptx.kernel.spec import KernelSpec, family_name
from hslm_ptx.emit.stepforms import CTA_THREADS, WARP
from hslm_ptx.tile.geometry import entry_name

SHARED_NAMES = ("R", "K", "N", "x")  # the sizes, and x: both read it
# forward's tiles; f32's 128 x 128 one spills 4 bytes on sm_80-sm_89 with both bodies at
# its 128 registers a thread (ptxas 13.0; f16 and bf16 do not), so f32 has the 32-row ones


def tiles_of(dtype: str) -> tuple:
    return tuple(tile for tile in hslm_fwd_s8.TILES if dtype != "float32" or tile.m == 32)

def columns_member(dtype: str) -> Member:
    """``hslm_qcols``' body as a member: a CTA per 32 columns of x."""
    def count(ptx: Ptx, place: None) -> str:
        return ptx.shr(ptx.add(place, WARP - 1), WARP.bit_length() - 1)

    def emit(ptx: Ptx, p: dict[str, str], local: str, place: None) -> None:
        cols_body(ptx, dtype, p, lambda: local)

    return Member(qcols_spec(dtype), "cols", CTA_THREADS, lambda ptx, p: p["C"], count, emit)


def forward_specs(dtype: str) -> tuple[KernelSpec, ...]:
    family = family_name("fwdx", dtype)
    products = hslm_fwdq.forward_specs(dtype, split=True)
    out = []
    tiles = tiles_of(dtype)
    for tile in tiles:
        product = next(spec for spec in products if spec.tile == tile.label)
        name = family if tile == tiles[0] else entry_name(family, tile)  # the first: the family's own name
        out.append(grouped_spec(name, family, tile.label,
                                (staged_member(product, "fwd", recompute=True), columns_member(dtype)),
                                SHARED_NAMES, tile.min_ctas, cost=product.cost))
    return tuple(out)


SPECS = tuple(spec for dtype in FLOAT_DTYPES for spec in forward_specs(dtype))
