"""Grouped entries: independent kernels' bodies in one grid, so what would be several
launches is one (``hslm_grads``: dX and dW; ``hslm_fwdx``: forward and x's column codes).

The first CTAs of the grid run the first member, the next ones the second, ... : a branch
on %ctaid.x that is uniform over a CTA, so every bar.sync of a member sees all the
threads of its CTA. Each member is the very body of its kernel, so its outputs are that
kernel's bits: its labels are in a scope of its own (``Ptx.scope``) and a staged member
(``KernelSpec.part``) reads its CTA coordinates (%ctaid, %nctaid) from its place in the
grid (``Ptx.specials``): CTA c - first of a member of gx x gy x gz CTAs is (c mod gx,
(c / gx) mod gy, c / (gx gy)), x fastest, as the hardware numbers a 3-D grid's CTAs. A
CTA is as wide as the widest member; a narrower member's extra warps exit before its
body, and its barriers wait for the threads that have not exited (PTX ISA, "Parallel
Synchronization and Communication Instructions: bar, barrier"). Shared arrays of the same name are one
(``Ptx.shared_array``: as large as the largest asker), as the ring is.

Parameters: a name two members use for different values (their workspaces, pitches,
spans) takes the member's prefix (``dx_partials``); the names the entry lists as shared
(the sizes, an input both read) are one parameter.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import numpy as np

from hslm_ptx.emit.ptx import Ptx
from hslm_ptx.kernel.spec import Dims, KernelSpec, Launch, Param, ScalarSpec
from hslm_ptx.tile.geometry import TILE_N


class Member(NamedTuple):
    """One member of a grouped entry: its kernel (parameters, inputs, reference, outputs,
    launch), the ``prefix`` of its clashing names and labels, its CTA's ``threads``,
    ``place(ptx, p)``: whatever its body needs to know of its grid (emitted before the
    branch to it), ``count(ptx, place)``: its CTAs, and ``emit(ptx, p, cta, place)``: its
    body for its CTA ``cta`` (0-based)."""

    spec: KernelSpec
    prefix: str
    threads: int
    place: Callable[[Ptx, dict[str, str]], Any]
    count: Callable[[Ptx, Any], str]
    emit: Callable[[Ptx, dict[str, str], str, Any], None]


def staged_member(spec: KernelSpec, prefix: str, recompute: bool = False) -> Member:
    """A staged kernel (``KernelSpec.part``) as a member: its grid (gx, gy, gz) from the
    sizes as its geometry has it (TILE_N columns a CTA along x, its tile's rows along y, a
    split of kspan bytes of the contraction along z). ``recompute`` (a first member only:
    its CTAs start at 0): every read of a coordinate derives it from %ctaid.x and the
    sizes again, so none is a register live through the chunk loop, as a hardware
    coordinate is not (ptxas reads %ctaid again); at 128 registers a thread that is what
    keeps the 128 x 128 forward with x's columns from spilling (f16, bf16)."""
    part = spec.part

    def place(ptx: Ptx, p: dict[str, str]) -> tuple[str, str, str]:
        rows, cols, contraction = (p[name] for name in part.gemm)
        gx = ptx.shr(ptx.add(cols, TILE_N - 1), TILE_N.bit_length() - 1)
        gy = ptx.shr(ptx.add(rows, part.tile_m - 1), part.tile_m.bit_length() - 1)
        span = p["kspan"]
        return gx, gy, ptx.binop("div", ptx.add(contraction, ptx.sub(span, 1, "u32")), span)

    def count(ptx: Ptx, grid: tuple[str, str, str]) -> str:
        return ptx.mul(ptx.mul(grid[0], grid[1]), grid[2])

    def coordinates(ptx: Ptx, local: str, grid: tuple[str, str, str]) -> dict[str, str]:
        gx, gy, gz = grid
        plane = ptx.mul(gx, gy)
        z = ptx.binop("div", local, plane)
        in_plane = ptx.sub(local, ptx.mul(z, plane), "u32")
        y = ptx.binop("div", in_plane, gx)
        x = ptx.sub(in_plane, ptx.mul(y, gx), "u32")
        return {"%ctaid.x": x, "%ctaid.y": y, "%ctaid.z": z, "%nctaid.x": gx, "%nctaid.y": gy, "%nctaid.z": gz}

    def emit(ptx: Ptx, p: dict[str, str], local: str, grid: tuple[str, str, str]) -> None:
        if recompute:  # each read derives its value from %ctaid.x and the sizes again
            ptx.specials = {name: lambda name=name: coordinates(ptx, ptx.fresh("b32", "mov.u32", "%ctaid.x"),
                                                                place(ptx, p))[name]
                            for name in ("%ctaid.x", "%ctaid.y", "%ctaid.z", "%nctaid.x", "%nctaid.y", "%nctaid.z")}
        else:
            ptx.specials = coordinates(ptx, local, grid)
        ptx.comment(f"{spec.name}'s body")
        part.emit(ptx, p)
        ptx.specials = {}

    return Member(spec, prefix, part.threads, place, count, emit)


# each entry's members' kernels with their parameters' names in the entry (idle_workspace)
_MEMBERS: dict[str, tuple[tuple[KernelSpec, dict[str, str]], ...]] = {}


def members_of(spec: KernelSpec) -> tuple[KernelSpec, ...]:
    """The kernels whose bodies the grouped entry ``spec`` holds, in grid order (none for
    an entry not built here)."""
    return tuple(member for member, _ in _MEMBERS.get(spec.name, ()))


def idle_workspace(spec: KernelSpec, d: Dims) -> tuple[str, ...]:
    """The workspace parameters of the grouped entry ``spec`` that no CTA touches on ``d``:
    those of a member that runs one split (none for an entry not built here), which a
    caller passes as any valid pointer."""
    return tuple(names[n] for member, names in _MEMBERS.get(spec.name, ())
                 if member.geometry(d).grid[2] == 1 for n in member.workspace)


def launch_ctas(spec: KernelSpec, d: Dims) -> int:
    grid = spec.geometry(d).grid
    return grid[0] * grid[1] * grid[2]


def _renamed(params: tuple[Param, ...], prefix: str, clash: set[str]) -> dict[str, Param]:
    """A member's parameters by their own names, as the entry declares them."""
    out = {}
    for param in params:
        if param.name not in clash:
            out[param.name] = param
        elif param.is_scalar:
            derived = param.derived or (lambda d, name=param.name: getattr(d, name))
            out[param.name] = dataclasses.replace(param, name=f"{prefix}_{param.name}", derived=derived)
        else:
            out[param.name] = param._replace(name=f"{prefix}_{param.name}")
    return out


def grouped_spec(name: str, family: str, tile: str, members: tuple[Member, ...], shared: tuple[str, ...],
                 min_ctas: int, cost: Callable[[Dims], float]) -> KernelSpec:
    """The entry ``name`` of ``family`` holding ``members``' bodies in grid order; the
    parameters named in ``shared`` are one for all (the sizes among them come after the
    buffers, then each member's other scalars); ``min_ctas`` is stated to ptxas."""
    names = [{p.name for p in m.spec.params} for m in members]
    clash = {n for i, a in enumerate(names) for b in names[i + 1:] for n in a & b} - set(shared)
    renames = [_renamed(m.spec.params, m.prefix, clash) for m in members]
    declared: dict[str, Param] = {}
    for renamed in renames:
        for param in renamed.values():
            if not param.is_scalar:
                declared.setdefault(param.name, param)
    sizes = tuple(ScalarSpec(n) for n in shared if n in Dims._fields)
    rest = {param.name: param for renamed in renames for param in renamed.values()
            if param.is_scalar and param.name not in shared}
    params = (*declared.values(), *sizes, *rest.values())
    threads = max(m.threads for m in members)
    _MEMBERS[name] = tuple((m.spec, {own: param.name for own, param in renamed.items()})
                           for m, renamed in zip(members, renames))

    def emit() -> str:
        ptx = Ptx(name, [(p.name, "u32" if p.is_scalar else "u64") for p in params], threads, min_ctas=min_ctas)
        loaded = {p.name: ptx.param_u32(p.name) if p.is_scalar else ptx.param_ptr(p.name) for p in params}
        cta, first = ptx.special("%ctaid.x"), ptx.mov(0)
        for index, (member, renamed) in enumerate(zip(members, renames)):
            p = {own: loaded[param.name] for own, param in renamed.items()}
            place = member.place(ptx, p)
            later = members[index + 1].prefix if index + 1 < len(members) else None
            if later:  # the CTAs past this member's run the next
                end = ptx.add(first, member.count(ptx, place))
                ptx.branch(f"part_{later}", guard=ptx.setp("ge", cta, end, "u32"))
            if member.threads < threads:  # warps past the member's CTA exit; its barriers wait for the rest
                ptx.branch("grouped_end", guard=ptx.setp("ge", ptx.special("%tid.x"), member.threads, "u32"))
            local = ptx.sub(cta, first, "u32")
            ptx.scope = f"{member.prefix}_"
            member.emit(ptx, p, local, place)
            ptx.scope = ""
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
        for member, renamed in zip(members, renames):  # a shared input: the first member's
            made |= {renamed[own].name: value for own, value in member.spec.make_inputs(d, rng).items()
                     if renamed[own].name not in made}
        return made

    def reference(d: Dims, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for member, renamed in zip(members, renames):
            out |= {renamed[own].name: value
                    for own, value in member.spec.expected(d, own_inputs(inputs, renamed)).items()}
        return out

    def launch(d: Dims) -> Launch:
        return Launch((sum(launch_ctas(m.spec, d) for m in members), 1, 1), (threads, 1, 1))

    bounds = [m.spec.max_rows for m in members if m.spec.max_rows is not None]
    return KernelSpec(
        name=name, emit=emit, geometry=launch, params=params, make_inputs=make_inputs, reference=reference,
        max_rows=min(bounds) if bounds else None, family=family, tile=tile, cost=cost,
        workspace=tuple(renamed[n].name for m, renamed in zip(members, renames) for n in m.spec.workspace),
        outputs=tuple(renamed[p.name].name for m, renamed in zip(members, renames) for p in m.spec.output_params))
