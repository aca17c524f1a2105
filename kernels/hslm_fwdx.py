"""hslm_fwdx_<out>: a training forward in one launch: ``hslm_fwdq_splitk_<out>``'s product
(y from float x, each CTA quantizing its own rows of x) and ``hslm_qcols_<out>``'s column
codes, scales and sums of the same x (what dW reads later), in one grid
(``kernels.grouped``: the product's CTAs first, then one CTA per 32 columns of x). The
two share x and nothing else: neither reads what the other writes. So a forward that
keeps what dW needs is one launch where it was two (``hslm_quant_<dt>``, then
``hslm_fwd_<out>``), and x's row codes are never written or read back.

One entry per 32-row forward tile (:data:`TILES`: the family's name is the 4-warp one's,
``_m32n16`` the 8-warp one's); the rule scores it as the product's configuration (the
column CTAs, a pass of x a column, are not in the model). ``scales`` are x's column scales,
``sums`` its column sums (unused by the step: dW's bias gradient is dY's).
"""
from __future__ import annotations

from kernels import hslm_fwd_s8, hslm_fwdq
from kernels.grouped import Member, grouped_spec, staged_member
from kernels.hslm_quant import cols_body, qcols_spec
from kernels.hslm_rescaled import OUT_TYPES
from kernels.ptx_emit import Ptx
from kernels.spec import KernelSpec
from kernels.stepforms import CTA_THREADS, WARP
from kernels.tile.geometry import entry_name

SHARED_NAMES = ("R", "K", "N", "x")  # the sizes, and x: both read it
# forward's 32-row tiles: on the 128 x 128 one the two bodies need more than its 128
# registers a thread (ptxas 13.0 spills 12 bytes on sm_80-sm_89, 4 on sm_90 for f32, with
# or without .minnctapersm 2), so a large shape's training forward runs a 32-row tile
TILES = tuple(tile for tile in hslm_fwd_s8.TILES if tile.m == 32)


def columns_member(dtype: str) -> Member:
    """``hslm_qcols``' body as a member: a CTA per 32 columns of x."""
    def count(ptx: Ptx, place: None) -> str:
        return ptx.shr(ptx.add(place, WARP - 1), WARP.bit_length() - 1)

    def emit(ptx: Ptx, p: dict[str, str], local: str, place: None) -> None:
        cols_body(ptx, dtype, p, lambda: local)

    return Member(qcols_spec(dtype), "cols", CTA_THREADS, lambda ptx, p: p["C"], count, emit)


def forward_specs(suffix: str) -> tuple[KernelSpec, ...]:
    family = f"hslm_fwdx_{suffix}"
    products = hslm_fwdq.forward_specs(suffix, split=True)
    out = []
    for tile in TILES:
        product = next(spec for spec in products if spec.tile == tile.label)
        name = family if tile == TILES[0] else entry_name(family, tile)  # the first: the family's own name
        out.append(grouped_spec(name, family, tile.label,
                                (staged_member(product, "fwd"), columns_member(OUT_TYPES[suffix])),
                                SHARED_NAMES, tile.min_ctas, cost=product.cost, load_in_member=True))
    return tuple(out)


SPECS = tuple(spec for suffix in OUT_TYPES for spec in forward_specs(suffix))
