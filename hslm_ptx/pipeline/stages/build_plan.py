"""What the build's tasks are made of (kernels, their sources, ptxas, the verify cells), as data.

emit, ptxas and verify create their tasks from a :class:`BuildPlan`: each kernel's name
and source files, which ptxas, and each kernel's verify cells with their inputs hashes.
Computing it (hslm_ptx.pipeline.stages.build_steps.compute_plan) imports every kernel and hashes
every cell's inputs; a run that changed no file under kernels/ or pipeline/, nor
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
from typing import NamedTuple

from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.cmdline import given_variables
from hslm_ptx.pipeline.core.treememo import remembered, stamp

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
    sources: tuple[str, ...]  # the module and its kernels/ closure: emit's file_dep


class BuildPlan(NamedTuple):
    kernels: tuple[KernelSources, ...]  # registry order
    ptxas: tuple[tuple[str, str | None], ...]  # which ptxas and its version, or ("ptxas", None)
    verify: tuple[KernelCells, ...] | str  # the cells, or the one-line error the variables gave

    def names(self) -> list[str]:
        return [kernel.name for kernel in self.kernels]


def ptxas_stamp(ptxas: str | None) -> list:
    """The found ptxas binary's stamp: an upgrade in place changes its version."""
    return stamp((), [ptxas]) if ptxas else []


def _key() -> dict:
    given = given_variables()
    nvcc = importlib.util.find_spec("nvidia.cuda_nvcc") if importlib.util.find_spec("nvidia") else None
    return {"variables": {name: given.get(name) for name in VARIABLES}, "python": sys.version,
            "PTXAS": os.environ.get("PTXAS"), "PATH": os.environ.get("PATH"),
            "nvcc": sorted(nvcc.submodule_search_locations or []) if nvcc else None}


def _compute() -> dict:
    from hslm_ptx.pipeline.stages.build_steps import compute_plan  # the kernels, numpy, pydantic: only on a miss

    return compute_plan()


@functools.lru_cache(maxsize=None)
def build_plan() -> BuildPlan:
    """This command line's plan, computed once a run, from the memo when nothing changed."""
    if importlib.util.find_spec("cupy") is not None:
        found = _compute()
    else:
        key = _key()
        memo = config.PLAN_DIR / f"{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]}.json"
        found = remembered(memo, key, (config.ROOT / "hslm_ptx",),
                           (config.SHAPES_FILE, config.ROOT / "dodo.py"), _compute)
        if found["ptxas_stamp"] != ptxas_stamp(dict(found["ptxas"]).get("ptxas")):
            found = _compute()  # that ptxas was replaced, upgraded or removed
    verify = found["verify"]
    return BuildPlan(
        kernels=tuple(KernelSources(k["name"], tuple(k["sources"])) for k in found["kernels"]),
        ptxas=tuple((name, value) for name, value in found["ptxas"]),
        verify=verify if isinstance(verify, str) else tuple(
            KernelCells(c["kernel"], tuple((s, n) for s, n in c["shapes"]), tuple(c["inputs"]), c["backend"], c["force"])
            for c in verify))
