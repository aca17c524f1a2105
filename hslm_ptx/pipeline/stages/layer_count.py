"""Counting one TernaryLinear step on the recording stand-in: what ``doit layer`` writes and
what the gate and ``doit bless`` judge (each counts afresh: it takes milliseconds, nothing
is computed).

The layer step's own code (hslm_ptx.step.launches: prepare_and_forward, backward with dX,
dW and the bias gradient, the code that runs on a GPU) runs on
hslm_ptx.runtime.recording.RecordingRuntime in place of the GPU runtime, in bf16 as a trainer
runs it. A first step runs uncounted (it makes the workspaces a split-K kernel keeps,
zeroed once); the second is counted, as every later step of a training run would be.
"""
from __future__ import annotations

from hslm_ptx.runtime.base import Runtime
from hslm_ptx.runtime.recording import Recording, RecordingRuntime
from hslm_ptx.step import launches as layer_step
from hslm_ptx.validate import LaunchError
from hslm_ptx.pipeline.core.layer_records import LayerLaunch, LayerReport, LayerShape
from hslm_ptx.pipeline.core.models import Shape

STEP_DTYPE = "bfloat16"  # activations, weight and bias: the layer as a bf16 trainer runs it


def run_step(rt: Runtime, R: int, K: int, N: int, dtype: str, weight_dtype: str, bias: bool) -> None:
    """One training step of the layer: a new weight version prepared with the forward
    (``prepare_and_forward``, as the torch op runs a weight's first forward), dX + dW + db."""
    prepared, y, saved = layer_step.prepare_and_forward(rt, rt.input((R, K), dtype), rt.input((N, K), weight_dtype),
                                                        rt.input((N,), dtype) if bias else None)
    layer_step.backward(rt, rt.input(tuple(y.shape), dtype), saved, prepared,
                        need_dx=True, need_dw=True, need_db=bias)


def other_launches(R: int, K: int, N: int, dtype: str, weight_dtype: str, bias: bool) -> tuple[int, int]:
    """Launches of a training step on a weight prepared before (forward + dX + dW + db) and
    of an inference forward on it (no gradient to come), each the second of its kind (the
    first makes the workspaces a split-K kernel keeps)."""
    rt = RecordingRuntime()
    prepared = layer_step.prepare_weight(rt, rt.input((N, K), weight_dtype))
    bias_in = rt.input((N,), dtype) if bias else None

    def launches(keep: bool) -> int:
        before = len(rt.recording.launches)
        y, saved = layer_step.forward(rt, rt.input((R, K), dtype), prepared, bias_in, keep_columns=keep)
        if keep:
            layer_step.backward(rt, rt.input(tuple(y.shape), dtype), saved, prepared, need_db=bias)
        return len(rt.recording.launches) - before

    counted = []
    for keep in (True, False):
        launches(keep)  # the first makes the workspaces
        counted.append(launches(keep))
    return counted[0], counted[1]


def count_step(shape: Shape, dtype: str = STEP_DTYPE, weight_dtype: str = STEP_DTYPE,
               bias: bool = True) -> LayerShape:
    """The steady-state step on ``shape``, recorded: a first step runs uncounted (it makes
    the workspaces a split-K kernel keeps, zeroed once), then the second is counted, as
    every later step of a training run would be."""
    R, K, N = shape.R, shape.K, shape.N
    rt = RecordingRuntime()
    run_step(rt, R, K, N, dtype, weight_dtype, bias)
    first = len(rt.recording.launches)
    rt.recording = Recording()
    run_step(rt, R, K, N, dtype, weight_dtype, bias)
    rec = rt.recording
    kept, inference = other_launches(R, K, N, dtype, weight_dtype, bias)
    return LayerShape(
        name=shape.name, R=R, K=K, N=N, dtype=dtype, weight_dtype=weight_dtype, bias=bias, first_step_launches=first,
        kept_weight_launches=kept, inference_launches=inference,
        launches=len(rec.launches), host_syncs=len(rec.host_syncs), h2d_copies=len(rec.h2d_copies),
        foreign_allocations=len(rec.foreign_allocations), bytes_moved=rec.bytes_moved,
        bytes_minimum=layer_step.step_bytes_minimum(R, K, N, dtype, weight_dtype, bias),
        launch_list=[LayerLaunch(kernel=x.kernel, grid=x.grid, block=x.block, shared_mem=x.shared_mem, bytes=x.bytes)
                     for x in rec.launches],
        sync_sites=rec.host_syncs, copy_sites=rec.h2d_copies, foreign_sites=rec.foreign_allocations)


def build_report(shape_set: str, shapes: tuple[Shape, ...], source_sha256: str) -> LayerReport:
    """Every shape of a set counted; a step that cannot run is a LaunchError naming the shape."""
    counted = []
    for shape in shapes:
        try:
            counted.append(count_step(shape))
        except LaunchError as exc:
            raise LaunchError(f"layer {shape_set}/{shape.name}: {exc}") from None
    return LayerReport(shape_set=shape_set, source_sha256=source_sha256, shapes=counted)
