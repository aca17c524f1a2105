"""What the build's tasks are made of (kernels, their sources, ptxas, the verify cells), as data.

emit, ptxas and verify create their tasks from a :class:`BuildPlan`: each kernel's name
and source files, which ptxas, and each kernel's verify cells with their inputs hashes.
Computing it (:func:`_compute`, on a miss) imports every kernel and hashes
every cell's inputs; a run that changed no file under hslm_ptx/, nor
shapes.yaml, dodo.py, the ptxas binary, its command-line variables or environment, takes
it from ``artifacts/cache/plans/<key>.json`` (hslm_ptx.pipeline.core.treememo; one file per set of
variables, so ``doit gate shape=smoke`` and ``doit verify`` keep theirs) and imports none
of that.
So a no-op ``doit verify`` loads the standard library, doit and this.

A machine that has CuPy never keeps the plan: ``backend=auto`` asks it for a device on
every run, and a verdict is of the backend that gave it.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import sys
from typing import TYPE_CHECKING, NamedTuple

from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.request import Request, current
from hslm_ptx.pipeline.core.treememo import remembered, stamp

if TYPE_CHECKING:
    from hslm_ptx.pipeline.core.models import Shape

VARIABLES = ("shape", "backend", "force")  # the command-line variables the plan reads


class KernelCells(NamedTuple):
    """One kernel's verify cells on this command line: the verify stage's cell, one doit task."""

    kernel: str
    shapes: tuple[tuple[str, str], ...]  # (set, shape name), set then file order
    inputs: tuple[str, ...]  # each cell's inputs hash (build_steps.cell_inputs), beside ``shapes``
    backend: str
    force: bool

    def keys(self) -> list[str]:
        return [index_key(shape_set, shape) for shape_set, shape in self.shapes]

    def named(self) -> list[tuple[str, str, str]]:
        return [(self.kernel, shape_set, shape) for shape_set, shape in self.shapes]


def index_key(shape_set: str, shape: str) -> str:
    return f"{shape_set}/{shape}"


class KernelSources(NamedTuple):
    name: str
    sources: tuple[str, ...]  # the module and its hslm_ptx closure: emit's file_dep


class BuildPlan(NamedTuple):
    kernels: tuple[KernelSources, ...]  # registry order
    ptxas: tuple[tuple[str, str | None], ...]  # which ptxas and its version, or ("ptxas", None)
    verify: tuple[KernelCells, ...] | str  # the cells, or the one-line error the variables gave

    def names(self) -> list[str]:
        return [kernel.name for kernel in self.kernels]


def ptxas_stamp(ptxas: str | None) -> list:
    """The found ptxas binary's stamp: an upgrade in place changes its version."""
    return stamp((), [ptxas]) if ptxas else []


def _key(request: Request) -> dict:
    given = dict(request.given)
    nvcc = importlib.util.find_spec("nvidia.cuda_nvcc") if importlib.util.find_spec("nvidia") else None
    return {"variables": {name: given.get(name) for name in VARIABLES}, "python": sys.version,
            "PTXAS": os.environ.get("PTXAS"), "PATH": os.environ.get("PATH"),
            "nvcc": sorted(nvcc.submodule_search_locations or []) if nvcc else None}


# ---- computing it (on a miss: these import the kernels) ------------------------------------

@functools.lru_cache(maxsize=None)
def found_ptxas() -> tuple[tuple[str, str | None], ...]:
    """Which ptxas, looked up once a run. A missing ptxas is not an error here (``doit
    emit`` must work without one)."""
    from hslm_ptx.pipeline.core.errors import UserError
    from hslm_ptx.pipeline.stages.ptxas import find_ptxas, ptxas_version

    try:
        ptxas = find_ptxas()
        return (("ptxas", str(ptxas)), ("version", ptxas_version(ptxas)))
    except UserError:
        return (("ptxas", None),)


class VerifyPlan(NamedTuple):
    """The verify cells this command line asks for, and how to run them."""

    cells: list[tuple[str, str, Shape]]  # (kernel, set, shape), registry then file order
    backend: str
    force: bool


def verify_plan(request: Request) -> VerifyPlan:
    """From ``shape=``, ``backend=`` and ``force=``; :class:`UserError` on a bad one. The
    tasks that depend on verify cells (seal, gate) read the same plan, so a bad input
    fails them the same way instead of leaving them a dependency that does not exist."""
    from hslm_ptx.catalog.registry import KERNELS
    from hslm_ptx.pipeline.stages.verify import resolve_backend

    sets = request.sets()  # default: config.VERIFY_SETS
    cells = [(spec.name, shape_set, shape) for spec in KERNELS.values()
             for shape_set, shapes in sets.items() for shape in shapes]
    return VerifyPlan(cells, resolve_backend(request.value("backend")), request.flag("force"))


def kernel_cells(request: Request) -> list[KernelCells]:
    """The stage's cells: the plan's cells grouped by kernel, with their inputs hashed."""
    from hslm_ptx.pipeline.stages.verify import cell_inputs

    plan = verify_plan(request)
    grouped: dict[str, list[tuple[str, Shape]]] = {}
    for kernel, shape_set, shape in plan.cells:
        grouped.setdefault(kernel, []).append((shape_set, shape))
    return [KernelCells(kernel, tuple((shape_set, shape.name) for shape_set, shape in shapes),
                        tuple(cell_inputs(kernel, shape, plan.backend) for _, shape in shapes), plan.backend, plan.force)
            for kernel, shapes in grouped.items()]


def _compute(request: Request) -> dict:
    """:class:`BuildPlan` as JSON: what creating the build's tasks reads. It imports the
    kernels, numpy and pydantic (each import below), so it runs only on a miss."""
    from hslm_ptx.catalog.registry import KERNELS
    from hslm_ptx.cost.model import CostInputError  # the tile rule reads hslm_ptx/cost/devices.json and the loop counts
    from hslm_ptx.pipeline.core.errors import UserError
    from hslm_ptx.pipeline.core.sources import source_files

    try:
        verify: list[dict] | str = [cells._asdict() for cells in kernel_cells(request)]
    except (UserError, CostInputError) as exc:
        verify = str(exc)
    ptxas = found_ptxas()
    return {"kernels": [{"name": spec.name, "sources": [str(p) for p in source_files(spec)]} for spec in KERNELS.values()],
            "ptxas": ptxas, "ptxas_stamp": ptxas_stamp(dict(ptxas)["ptxas"]), "verify": verify}


@functools.lru_cache(maxsize=None)
def build_plan() -> BuildPlan:
    """This command line's plan, computed once a run, from the memo when nothing changed."""
    request = current()
    if importlib.util.find_spec("cupy") is not None:
        found = _compute(request)
    else:
        key = _key(request)
        memo = config.PLAN_DIR / f"{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]}.json"
        found = remembered(memo, key, (config.ROOT / "hslm_ptx",),
                           (config.SHAPES_FILE, config.ROOT / "dodo.py"), lambda: _compute(request))
        if found["ptxas_stamp"] != ptxas_stamp(dict(found["ptxas"]).get("ptxas")):
            found = _compute(request)  # that ptxas was replaced, upgraded or removed
    verify = found["verify"]
    return BuildPlan(
        kernels=tuple(KernelSources(k["name"], tuple(k["sources"])) for k in found["kernels"]),
        ptxas=tuple((name, value) for name, value in found["ptxas"]),
        verify=verify if isinstance(verify, str) else tuple(
            KernelCells(c["kernel"], tuple((s, n) for s, n in c["shapes"]), tuple(c["inputs"]), c["backend"], c["force"])
            for c in verify))
