"""hslm_grads_<dt>_<wdt>[_<dX tile>_<dW tile>]: a layer step's two backward products, dX
and dW, in one launch (family ``hslm_grads_<dt>_<wdt>``, its 128 x 128 with 256 x 128
entry so named: dX written in dY's float type ``dt``, dW in the weight's ``wdt``).

The two products read what the quantization of dY wrote and nothing either writes, so one
grid holds both: its first CTAs are ``hslm_dx_splitk_<dt>``'s grid, the rest
``hslm_dw_splitk_<wdt>``'s, each part the very body of that kernel (``KernelSpec.part``),
its labels in a scope of its own (``Ptx.scope``) and its CTA coordinates (%ctaid,
%nctaid) given by the part's place in the grid (``Ptx.specials``): CTA c - first of a
part of gx x gy x gz CTAs is (x, y, z) = (c mod gx, (c / gx) mod gy, c / (gx gy)), x
fastest, as the hardware numbers a 3-D grid's CTAs. The branch to a part is uniform over
a CTA, so every bar.sync of a part sees all the threads of its CTA. A CTA is as wide as
the wider part; the narrower part's extra warps exit before its body, and its barriers
wait for the threads that have not exited (PTX ISA 9.7.13.1, bar: "the barrier waits for
the non-exited threads"). The parts share the ring (``Ptx.shared_array``: one array, as
large as the larger part's). Each part takes its split and its workspace as its kernel
does (``partials`` and ``tickets``, here ``dx_partials`` ..., kept zeroed between launches);
where a part runs one split it never touches them.

So every output is bit for bit its kernel's, and the backward of a step with both
gradients is two launches (dY's quantization, this) where it was three. What it saves is
one launch's fixed cost and the tail of the first product: the second's CTAs fill the SMs
the first leaves idle.

Each entry is a pair of tiles the tile rule picks at the HSLM and large shapes
(:data:`PAIRS`); the family's rule is the sum of its parts' scores (the cost model's
device us of each launch alone: the grouped launch is not modelled apart).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from kernels import hslm_dw_rescaled, hslm_dx_rescaled
from kernels.hslm_rescaled import OUT_TYPES
from kernels.ptx_emit import Ptx
from kernels.spec import BufferSpec, Dims, KernelSpec, Launch, Param, ScalarSpec
from kernels.tile import geometry
from kernels.tile.geometry import TILE_N

SHARED_NAMES = ("R", "K", "N")  # the sizes both parts read: one parameter each
# (dX tile, dW tile): what the rule picks at the large shapes (128 x 128 with 256 x 128:
# the family's own name, first, as the large tile is in every family) and the HSLM ones
# (R = 27: 32 x 128n16 with 16 x 128n16; R = 1782: 32 x 128n16 or 32 x 128 with 32 x 128n16
# or 64 x 128)
PAIRS = ((geometry.LARGE, geometry.TALL), (geometry.NARROW, geometry.SHORT), (geometry.NARROW, geometry.NARROW),
         (geometry.NARROW, geometry.MID), (geometry.SMALL, geometry.MID))
PRODUCTS = ("dx", "dw")  # the parts in grid order
PARTS: dict[str, tuple[KernelSpec, KernelSpec]] = {}  # each entry's (dX, dW) kernels


def family(dtype: str, weight_dtype: str) -> str:
    return f"hslm_grads_{dtype}_{weight_dtype}"


def _renamed(params: tuple[Param, ...], product: str, clash: set[str]) -> dict[str, Param]:
    """A part's parameters by their own names, as the grouped entry declares them: a name
    both parts use for different values (their workspaces, pitches, spans) takes the
    product's prefix."""
    out = {}
    for param in params:
        if param.name not in clash:
            out[param.name] = param
        elif param.is_scalar:
            derived = param.derived or (lambda d, name=param.name: getattr(d, name))
            out[param.name] = dataclasses.replace(param, name=f"{product}_{param.name}", derived=derived)
        else:
            out[param.name] = param._replace(name=f"{product}_{param.name}")
    return out


def part_ctas(spec: KernelSpec, d: Dims) -> int:
    grid = spec.geometry(d).grid
    return grid[0] * grid[1] * grid[2]


def idle_workspace(spec: KernelSpec, d: Dims) -> tuple[str, ...]:
    """The workspace parameters of ``spec`` (an ``hslm_grads`` entry) that no CTA touches on
    ``d``: those of a part that runs one split (none for an entry this module did not build)."""
    return tuple(f"{product}_{name}" for product, part in zip(PRODUCTS, PARTS.get(spec.name, ()))
                 if part.geometry(d).grid[2] == 1 for name in part.workspace)


def _part_grid(ptx: Ptx, spec: KernelSpec, p: dict[str, str]) -> tuple[str, str, str]:
    """``spec``'s grid (gx, gy, gz) from the sizes, as its geometry has it: TILE_N columns
    a CTA along x, its tile's rows along y, a split of kspan bytes of the contraction along z."""
    part = spec.part
    rows, cols, contraction = (p[name] for name in part.gemm)
    gx = ptx.shr(ptx.add(cols, TILE_N - 1), TILE_N.bit_length() - 1)
    gy = ptx.shr(ptx.add(rows, part.tile_m - 1), part.tile_m.bit_length() - 1)
    span = p["kspan"]
    return gx, gy, ptx.binop("div", ptx.add(contraction, ptx.sub(span, 1, "u32")), span)


def _emit_part(ptx: Ptx, spec: KernelSpec, p: dict[str, str], grid: tuple[str, str, str], cta: str, first: str,
               threads: int, product: str) -> None:
    """``spec``'s body for the CTAs first .. first + gx gy gz of this launch (the caller
    branched here for them)."""
    gx, gy, gz = grid
    if spec.part.threads < threads:  # warps past the part's CTA exit; its barriers wait for the rest
        ptx.branch("grouped_end", guard=ptx.setp("ge", ptx.special("%tid.x"), spec.part.threads, "u32"))
    local = ptx.sub(cta, first, "u32")
    plane = ptx.mul(gx, gy)
    z = ptx.binop("div", local, plane)
    in_plane = ptx.sub(local, ptx.mul(z, plane), "u32")
    y = ptx.binop("div", in_plane, gx)
    x = ptx.sub(in_plane, ptx.mul(y, gx), "u32")
    ptx.comment(f"{spec.name}'s body")
    ptx.scope, ptx.specials = f"{product}_", {"%ctaid.x": x, "%ctaid.y": y, "%ctaid.z": z,
                                              "%nctaid.x": gx, "%nctaid.y": gy, "%nctaid.z": gz}
    spec.part.emit(ptx, p)
    ptx.scope, ptx.specials = "", {}


def grads_spec(dx: KernelSpec, dw: KernelSpec, dtype: str, weight_dtype: str) -> KernelSpec:
    """The entry holding ``dx``'s and ``dw``'s bodies (split families' entries)."""
    parts = (dx, dw)
    large = (dx.tile, dw.tile) == tuple(tile.label for tile in PAIRS[0])
    name = family(dtype, weight_dtype) if large else f"{family(dtype, weight_dtype)}_{dx.tile}_{dw.tile}"
    PARTS[name] = parts
    names = [{p.name for p in spec.params} for spec in parts]
    clash = (names[0] & names[1]) - set(SHARED_NAMES)
    renames = [_renamed(spec.params, product, clash) for spec, product in zip(parts, PRODUCTS)]
    buffers = tuple(param for renamed in renames for param in renamed.values() if not param.is_scalar)
    scalars = tuple(ScalarSpec(n) for n in SHARED_NAMES) + tuple(
        param for renamed in renames for param in renamed.values() if param.is_scalar and param.name not in SHARED_NAMES)
    params = (*buffers, *scalars)
    threads = max(spec.part.threads for spec in parts)
    # registers a thread: the wider part's cap (as many CTAs an SM as it asks)
    min_ctas = max(parts, key=lambda spec: (spec.part.threads, spec.part.min_ctas)).part.min_ctas

    def emit() -> str:
        ptx = Ptx(name, [(p.name, "u32" if p.is_scalar else "u64") for p in params], threads, min_ctas=min_ctas)
        loaded = {p.name: ptx.param_u32(p.name) if p.is_scalar else ptx.param_ptr(p.name) for p in params}
        cta, first = ptx.special("%ctaid.x"), ptx.mov(0)
        for index, (spec, renamed, product) in enumerate(zip(parts, renames, PRODUCTS)):
            p = {own: loaded[param.name] for own, param in renamed.items()}
            grid = _part_grid(ptx, spec, p)
            later = PRODUCTS[index + 1] if index + 1 < len(parts) else None
            if later:  # the CTAs past this part's run the next
                end = ptx.add(first, ptx.mul(ptx.mul(grid[0], grid[1]), grid[2]))
                ptx.branch(f"part_{later}", guard=ptx.setp("ge", cta, end, "u32"))
            _emit_part(ptx, spec, p, grid, cta, first, threads, product)
            if later:
                ptx.branch("grouped_end")
                ptx.label(f"part_{later}")
                first = end
        ptx.label("grouped_end")
        return ptx.render()

    def own_inputs(inputs: dict[str, np.ndarray], renamed: dict[str, Param]) -> dict[str, np.ndarray]:
        return {own: inputs[param.name] for own, param in renamed.items() if param.name in inputs}

    def make_inputs(d: Dims, rng: np.random.Generator) -> dict[str, np.ndarray]:
        made: dict[str, Any] = {}
        for spec, renamed in zip(parts, renames):
            made |= {renamed[own].name: value for own, value in spec.make_inputs(d, rng).items()}
        return made

    def reference(d: Dims, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for spec, renamed in zip(parts, renames):
            out |= {renamed[own].name: value for own, value in spec.expected(d, own_inputs(inputs, renamed)).items()}
        return out

    def launch(d: Dims) -> Launch:
        return Launch((sum(part_ctas(spec, d) for spec in parts), 1, 1), (threads, 1, 1))

    bounds = [spec.max_rows for spec in parts if spec.max_rows is not None]
    outputs = tuple(renamed[p.name].name for spec, renamed in zip(parts, renames) for p in spec.output_params)
    return KernelSpec(
        name=name, emit=emit, geometry=launch, params=params, make_inputs=make_inputs, reference=reference,
        max_rows=min(bounds) if bounds else None, family=family(dtype, weight_dtype), tile=f"{dx.tile}+{dw.tile}",
        cost=lambda d: dx.cost(d) + dw.cost(d),
        workspace=tuple(renamed[n].name for spec, renamed in zip(parts, renames) for n in spec.workspace),
        outputs=outputs)


def _entry(specs: tuple[KernelSpec, ...], tile: geometry.Tile) -> KernelSpec:
    return next(spec for spec in specs if spec.tile == tile.label)


def _family_specs(dtype: str, weight_dtype: str) -> tuple[KernelSpec, ...]:
    dx_family, dw_family = hslm_dx_rescaled.dx_specs(dtype, split=True), hslm_dw_rescaled.dw_specs(weight_dtype, split=True)
    return tuple(grads_spec(_entry(dx_family, dx_tile), _entry(dw_family, dw_tile), dtype, weight_dtype)
                 for dx_tile, dw_tile in PAIRS)


SPECS = tuple(spec for dt in OUT_TYPES for wdt in OUT_TYPES for spec in _family_specs(dt, wdt))
