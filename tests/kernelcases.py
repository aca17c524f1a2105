"""The kernel tests' tables, derived from hslm_ptx.catalog.registry so a new kernel needs none.

Every parametrization over kernels comes from here, each case marked ``kernel(name)``
so the seal's test counts (hslm_ptx.pipeline.ratchet.assertcount) attribute it to that kernel. What a
test needs to know about a kernel is read off its KernelSpec and module:

- :func:`gemm_roles`: which Dims field is the output's rows, its columns and the
  contraction, probed through the kernel's GEMM form (``out == A @ Bt.T``) on a tiny
  problem with three different extents; :func:`gemm_dims` maps a test's (rows, cols,
  contraction) back to that kernel's Dims, so one table of shapes serves forward, dX
  and dW alike.
- :func:`tile_of`: the staged tile configuration (``hslm_ptx.tile.geometry.Tile``) the
  kernel's module lists in ``TILES`` under the spec's ``tile`` label.
- the groups tests run over: every kernel, the GEMMs, the staged-tile kernels, those
  with the int32 epilogue (one int32 output, stored or added by split-K), the ternary
  ones (a packed-W input decoded into fragments), and one configuration per family
  (:func:`one_per_family`), and one case per kernel module (:func:`per_module`), for
  the expensive cases that say nothing new per tile or per output type.
- :func:`emulated`: a kernel's emitted PTX on the emulator, parsed once per process.
- :func:`stated`: test cases a kernel module states itself, as a module attribute
  (``PLANTED_BUGS``: mutations of its PTX the emulator must catch, in the format of
  tests/test_kernels_run.py's PLANTED).
"""
from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any, Callable, Iterable, NamedTuple

import numpy as np
import pytest

from hslm_ptx.formats.floats import same_values
from hslm_ptx.kernel.pitch import WPlanes
from hslm_ptx.emu import Function, Module
from hslm_ptx.catalog.registry import FAMILIES, KERNELS
from hslm_ptx.kernel.spec import Dims, KernelSpec
from hslm_ptx.cost import model as cost
from hslm_ptx.tile import rule
from hslm_ptx.tile.geometry import Plan, Tile

PROBE = Dims(7, 11, 13)  # three extents no shape of the GEMM form can confuse


class GemmRoles(NamedTuple):
    """The Dims fields that are the output's rows, its columns and the contraction."""

    rows: str
    cols: str
    contraction: str


def emulated(name: str) -> Function:
    """``name``'s PTX as emitted now, on the emulator: emitted each call (a test may have
    patched what the emitter reads), parsed and decoded once per distinct text and test
    process. The Function keeps only the last launch's stats, which a caller reads right
    after its own launch."""
    return _decoded(name, KERNELS[name].emit())


@functools.lru_cache(maxsize=None)
def _decoded(name: str, ptx: str) -> Function:
    return Module(code=ptx).get_function(name)


def per_kernel(names: Iterable[str] = tuple(KERNELS)) -> list[Any]:
    return [pytest.param(name, marks=pytest.mark.kernel(name), id=name) for name in names]


def module_of(name: str) -> ModuleType:
    return importlib.import_module(KERNELS[name].module)


def family_configs(family: str) -> list[str]:
    """Every configuration's name of ``family``."""
    return [spec.name for spec in FAMILIES.get(family, ())]


def inputs_of(spec: KernelSpec) -> list[str]:
    """The kernel's input buffers, in parameter order (the layout the kernel reads)."""
    written = {p.name for p in spec.output_params}
    return [p.name for p in spec.params if not p.is_scalar and p.name not in written]


@functools.lru_cache(maxsize=None)
def gemm_roles(name: str) -> GemmRoles | None:
    """``name``'s GEMM roles (None: not a GEMM), probed on :data:`PROBE`."""
    spec = KERNELS[name]
    if spec.gemm_form is None:
        return None
    a, bt = spec.gemm_operands(spec.make_inputs(PROBE, np.random.default_rng(0)), PROBE)
    field = {getattr(PROBE, f): f for f in PROBE._fields}
    return GemmRoles(rows=field[a.shape[0]], cols=field[bt.shape[0]], contraction=field[a.shape[1]])


def gemm_dims(name: str, rows: int, cols: int, contraction: int) -> Dims:
    """The Dims of ``name`` whose output is rows x cols over ``contraction``."""
    roles = gemm_roles(name)
    assert roles is not None, f"{name} is not a GEMM"
    by_field = {roles.rows: rows, roles.cols: cols, roles.contraction: contraction}
    return Dims(**by_field)


def contraction(name: str, dims: Dims) -> int:
    """The k extent the kernel's chunk loop walks."""
    return getattr(dims, gemm_roles(name).contraction)


def span_of(name: str, dims: Dims) -> int:
    """k bytes per split of the kernel's own plan (its kspan parameter)."""
    return next(p.value(dims) for p in KERNELS[name].params if p.name == "kspan")


def plans_scored(name: str, dims: Dims) -> dict[Plan, float]:
    """Every plan the tile rule offers int32 GEMM ``name`` on ``dims`` (rule.split_plans, in
    their order) with its score, the rule's phase_cost of that launch: the kernel's own plan
    is the lowest."""
    extents = tuple(getattr(dims, field) for field in gemm_roles(name))  # rows, cols, contraction
    tile, spec = tile_of(name), KERNELS[name]
    return {plan: rule.phase_cost(*extents, tile, plan, spec.chunk_bytes, cost.loop_counts(name),
                                  cost.occupancy(name), spec.buffer_bytes(dims, plan.splits))
            for plan in rule.split_plans(*extents, tile)}


def tile_of(name: str) -> Tile | None:
    """The staged tile ``name`` runs on (None: not a staged-tile kernel)."""
    tiles = getattr(module_of(name), "TILES", ())
    return next((t for t in tiles if isinstance(t, Tile) and t.label == KERNELS[name].tile), None)


def where(test: Callable[[KernelSpec], bool]) -> list[str]:
    return [name for name, spec in KERNELS.items() if test(spec)]


def is_staged(spec: KernelSpec) -> bool:
    return spec.gemm_form is not None and tile_of(spec.name) is not None


def has_int32_epilogue(spec: KernelSpec) -> bool:
    outputs = spec.output_params
    return is_staged(spec) and len(outputs) == 1 and outputs[0].dtype == "int32"


def is_ternary(spec: KernelSpec) -> bool:
    """A staged GEMM whose B is packed ternary W, decoded into fragments."""
    return is_staged(spec) and any(isinstance(p.layout, WPlanes) for p in spec.params if p.name in inputs_of(spec))


ALL = list(KERNELS)
GEMMS = where(lambda s: s.gemm_form is not None)
STAGED = where(is_staged)
INT32_EPILOGUE = where(has_int32_epilogue)
TERNARY = where(is_ternary)
TWO_STAGED = [n for n in INT32_EPILOGUE if n not in TERNARY]  # both operands by cp.async (dW)


def one_per_family(names: Iterable[str]) -> list[str]:
    """The first of ``names`` in each family (the family's first listed configuration)."""
    seen: dict[str, str] = {}
    for name in names:
        seen.setdefault(KERNELS[name].family_name, name)
    return list(seen.values())


def stated(attribute: str) -> list[tuple[str, tuple]]:
    """(family, case) for every case a registered kernel module states in ``attribute``."""
    found: dict[str, tuple] = {}
    for family, configs in FAMILIES.items():
        for case in getattr(module_of(configs[0].name), attribute, ()):
            found.setdefault(repr((family, case)), (family, tuple(case)))
    return list(found.values())


def outputs(spec: KernelSpec, value: Any) -> dict[str, np.ndarray]:
    """A launch's or a reference's value as a dict of every output by name."""
    return value if isinstance(value, dict) else {spec.output.name: value}


def exact(spec: KernelSpec, got: Any, want: Any) -> bool:
    """Every output as the reference says, compared as a verify cell compares them:
    integers by value, floats by their bits (any NaN equals any NaN)."""
    got, want = outputs(spec, got), outputs(spec, want)
    for param in spec.output_params:
        g, w = np.asarray(got[param.name]), np.asarray(want[param.name])
        if g.shape != w.shape or g.dtype != w.dtype:
            return False
        same = same_values(g, w, param.dtype).all() if param.is_float else np.array_equal(g, w)
        if not same:
            return False
    return True


def per_module(names: Iterable[str] = tuple(KERNELS)) -> list[Any]:
    """One case per kernel module of ``names`` (its value: those kernels' names), marked
    with each of them: for a test that draws the kernel itself (hypothesis), so an
    expensive check runs once per emitter however many families and tiles it builds."""
    modules: dict[str, list[str]] = {}
    for name in names:
        modules.setdefault(KERNELS[name].module, []).append(name)
    return [pytest.param(tuple(kernels), marks=pytest.mark.kernel(*kernels), id=module.rsplit(".", 1)[-1])
            for module, kernels in modules.items()]
