"""The MODEL report of a shape set on a GPU, from the artifacts on disk: each GEMM's SASS
counts, ptxas figures and committed loop counts, the emulator's memory rows, and each layer
step counted on the recording runtime. ``doit model:run`` writes it; the model's documents
and the gate's doc check render it afresh."""
from __future__ import annotations

from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.kernel.spec import KernelSpec
from hslm_ptx.cost import model as cost
from hslm_ptx.pipeline.bench.layer import LARGE_LAYER
from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.artifacts import read_model
from hslm_ptx.pipeline.core.config import sass_json
from hslm_ptx.pipeline.core.errors import UserError
from hslm_ptx.pipeline.core.files import rel, sha256_file
from hslm_ptx.pipeline.core.models import MemoryAccess, PtxasArch, PtxasReport, Shape
from hslm_ptx.pipeline.core.shapes import select_sets
from hslm_ptx.pipeline.stages import layer_count, perf_model
from hslm_ptx.pipeline.stages.sass import SassArch, SassReport
from hslm_ptx.pipeline.stages.verify import work
from hslm_ptx.validate import LaunchError


def memory_counts(spec: KernelSpec, shape_set: str, shape: Shape, ptx: str) -> tuple[list[MemoryAccess] | None, str]:
    """Emulator memory rows for one cell: the verify report's, else a fresh emulator run's,
    unless the shape is over the emulator's work budget (then none: the SASS ideal stands in)."""
    report = config.verify_json(spec.name, shape_set, shape.name)
    rows = perf_model.memory_rows_from_report(report)
    if rows is not None:
        return rows, f"emulator ({rel(report)})"
    if work(shape) > config.EMULATOR_WORK_BUDGET:
        return None, "SASS ideal (over the emulator's work budget)"
    return perf_model.memory_rows_from_emulator(spec, shape, ptx), "emulator (run by the model)"


def gemm_kernels() -> list[str]:
    """The kernels the cost model times: the GEMMs (its phases and reference are a GEMM's)."""
    return [name for name, spec in KERNELS.items() if spec.is_gemm]


def ptxas_arch(name: str, g: perf_model.GpuModel, gpu_name: str) -> PtxasArch:
    """``name``'s ptxas figures (registers, shared memory) on the model's arch."""
    ptxas = next((a for a in read_model(config.ptxas_json(name), PtxasReport).archs if a.arch == g.arch), None)
    if ptxas is None:
        raise UserError(f"{rel(config.ptxas_json(name))}: no figures for {g.arch} ({gpu_name}); "
                        f"add it to ARCHS in hslm_ptx/pipeline/core/config.py")
    return ptxas


def counted_loop(name: str, arch: str) -> cost.KernelCounts:
    """The committed loop counts of ``name``; a missing entry is one line saying what to run."""
    try:
        return cost.loop_counts(name, arch)
    except cost.CostInputError as exc:
        raise UserError(str(exc)) from None


def layer_shapes(shape_set: str, shapes: tuple[Shape, ...]) -> list[tuple[Shape, str]]:
    """The layer steps to model, each with the target that judges it ("hslm", "large" or
    "": none): the set's shapes and the large layer the bench runs
    (hslm_ptx.pipeline.bench.layer.LARGE_LAYER), once."""
    large = (LARGE_LAYER.R, LARGE_LAYER.K, LARGE_LAYER.N)
    out = [(s, "large" if (s.R, s.K, s.N) == large else "hslm" if shape_set == "hslm" else "") for s in shapes]
    return out if any(t == "large" for _, t in out) else out + [(LARGE_LAYER, "large")]


def layer_steps(shape_set: str, shapes: tuple[Shape, ...], g: perf_model.GpuModel,
                gpu_name: str) -> list[perf_model.LayerStepRow]:
    """Each layer step counted on the recording runtime (what `doit layer` counts) and
    every launch of it timed."""
    def records(entry: str, kernel: str) -> tuple[SassArch, cost.KernelCounts, PtxasArch]:
        return (read_model(sass_json(entry), SassReport).arch(g.arch), counted_loop(entry, g.arch),
                ptxas_arch(kernel, g, gpu_name))

    out = []
    for shape, target in layer_shapes(shape_set, shapes):
        try:
            layer = layer_count.count_step(shape)
        except LaunchError as exc:
            raise UserError(f"layer step {shape.name}: {exc}") from None
        out.append(perf_model.layer_step_row(layer, g, records, target))
    return out


def build_model(shape_set: str, gpu_name: str) -> perf_model.ModelReport:
    assumptions = perf_model.load_assumptions()
    g = perf_model.gpu(assumptions, gpu_name)
    shapes = select_sets((shape_set,))[shape_set]
    rows, tools = [], {}
    for name in gemm_kernels():
        spec = KERNELS[name]
        counts = read_model(sass_json(name), SassReport)
        ptxas = ptxas_arch(name, g, gpu_name)
        loop = counted_loop(name, g.arch)
        tools[name] = f"ptxas {counts.ptxas_version} / nvdisasm {counts.nvdisasm_version}"
        ptx = config.ptx_path(name).read_text()
        for shape in shapes:
            memory, source = memory_counts(spec, shape_set, shape, ptx)
            rows.append(perf_model.model_row(spec, shape, g, counts.arch(g.arch), loop, ptxas, memory, source))
    return perf_model.ModelReport(shape_set=shape_set, gpu=gpu_name, gpu_name=g.name, arch=g.arch,
                                  assumptions_sha256=perf_model.assumptions_sha256(),
                                  counts_sha256=sha256_file(perf_model.COUNTS_FILE), sass_tools=tools, rows=rows,
                                  layer_steps=layer_steps(shape_set, shapes, g, gpu_name))
