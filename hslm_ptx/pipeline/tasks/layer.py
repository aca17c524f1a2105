"""``doit layer shape=<set>`` (default hslm): what one TernaryLinear step costs, counted.

For every shape of the set, the layer step's own code (hslm_ptx.step.launches: prepare_weight,
forward, backward with dX, dW and the bias gradient, the code that runs on a GPU) runs on
the recording stand-in (hslm_ptx.runtime.recording.RecordingRuntime) in place of the GPU runtime,
in bf16 as a trainer runs it (hslm_ptx.pipeline.stages.layer_count), and the stage writes artifacts/layer/<set>.json
(hslm_ptx.pipeline.core.layer_records.LayerReport): launches, host syncs, host-to-device copies,
allocations outside torch's allocator, the bytes every launch reads and writes (the
DRAM-level floor, not L2 traffic) against the bytes a step cannot avoid, and the launch
list; then prints one table. Nothing is computed, so it takes milliseconds on any machine.

The counts are ratcheted in ledger/layer.json (hslm_ptx.pipeline.ratchet.layer_ratchet): a rise is red at
``doit gate``, which counts the ledger's sets afresh (no dependency on this task). The stage re-runs when the step's source (hslm_ptx/step/launches.py and the
hslm_ptx modules it imports, the step kernels' specs among them), shapes.yaml or the
stage's own code changes. Its cells are the sets of ``shape=``, declared as one
:class:`hslm_ptx.pipeline.stages.table.Stage` (:data:`LAYER`), listed in ``dodo.py``.
"""
from __future__ import annotations

from doit.exceptions import TaskFailed
from doit.tools import config_changed

from hslm_ptx.step import launches as layer_step
from hslm_ptx.validate import LaunchError
from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.stages import layer_count
from hslm_ptx.pipeline.core import layer_records
from hslm_ptx.pipeline.core.artifacts import write_model
from hslm_ptx.pipeline.core.files import remove_folder
from hslm_ptx.pipeline.core.request import VARIABLES, current
from hslm_ptx.pipeline.stages.layer_count import STEP_DTYPE, build_report
from hslm_ptx.pipeline.ratchet.layer_ratchet import LAYER_DIR, report_path, step_source_files, step_source_sha256
from hslm_ptx.pipeline.core.layer_records import LayerReport, LayerShape
from hslm_ptx.pipeline.stages.report import table
from hslm_ptx.pipeline.core.shapes import select_sets
from hslm_ptx.pipeline.stages.table import Stage
from hslm_ptx.pipeline.stages.taskkit import one_line_failure

DEFAULT_LAYER_SET = "hslm"
# the targets a step is measured against (printed beside the counts; the ledger ratchets them)
TARGETS = {"launches": 3, "kept_weight_launches": 2, "inference_launches": 1, "host_syncs": 0, "h2d_copies": 0,
           "foreign_allocations": 0}
BYTES_TARGET = 2.5  # bytes_moved <= 2.5 x bytes_minimum
COLUMNS = ("shape", "R", "K", "N", "launches", "kept W", "inference", "host syncs", "h2d copies", "foreign allocs",
           "bytes moved", "bytes minimum", "moved / min", "targets")


def missed_targets(shape: LayerShape) -> list[str]:
    """The targets a step misses ("launches 11 > 10"), empty when it meets them all."""
    missed = [f"{name.replace('_', ' ')} {getattr(shape, name)} > {limit}" for name, limit in TARGETS.items()
              if getattr(shape, name) > limit]
    if shape.bytes_moved > BYTES_TARGET * shape.bytes_minimum:
        missed.append(f"bytes moved > {BYTES_TARGET} x minimum")
    return missed


def layer_table(report: LayerReport) -> str:
    rows = [[s.name, s.R, s.K, s.N, s.launches, s.kept_weight_launches, s.inference_launches, s.host_syncs,
             s.h2d_copies, s.foreign_allocations, s.bytes_moved,
             s.bytes_minimum, round(s.bytes_moved / s.bytes_minimum, 2), "; ".join(missed_targets(s)) or "met"]
            for s in report.shapes]
    first = report.shapes[0]
    return "\n".join([
        f"layer step ({report.shape_set}): prepare W + forward + dX + dW + db, {first.dtype} activations, "
        f"{first.weight_dtype} weight, with bias; counted on the recording stand-in",
        table(COLUMNS, rows),
        "launches: a training step preparing a new weight version; kept W: one on a weight prepared before; "
        "inference: a forward on a prepared weight with no gradient to come",
        f"targets: launches <= {TARGETS['launches']} ({TARGETS['kept_weight_launches']} with a kept W, "
        f"{TARGETS['inference_launches']} for inference), no host syncs, h2d copies or foreign allocations, "
        f"bytes moved <= {BYTES_TARGET} x minimum; bytes moved = every launch's buffers once (a DRAM-level floor, "
        "not L2 traffic)",
    ])


@one_line_failure
def _layer(shape_set: str) -> TaskFailed | None:
    shapes = select_sets((shape_set,))[shape_set]
    try:
        report = build_report(shape_set, shapes, step_source_sha256())
    except LaunchError as exc:
        return TaskFailed(str(exc))
    write_model(report_path(shape_set), report)
    print(layer_table(report))
    return None


def layer_sets() -> list[str]:
    """The sets of ``shape=`` (default hslm); an unknown one is a UserError, one line."""
    return list(current().sets(DEFAULT_LAYER_SET))


def layer_task(shape_set: str) -> dict:
    deps = sorted({str(p) for p in step_source_files()}
                  | {str(config.SHAPES_FILE), __file__, layer_count.__file__, layer_records.__file__,
                     layer_step.__file__})
    return {
        "name": shape_set,
        "actions": [(_layer, [shape_set])],
        "file_dep": deps,
        "targets": [str(report_path(shape_set))],
        "uptodate": [config_changed({"shape_set": shape_set, "dtype": STEP_DTYPE})],
        "clean": [(remove_folder, [LAYER_DIR])],
        "verbosity": 2,
    }


LAYER = Stage(
    name="layer",
    doc=("Count what one TernaryLinear step launches, syncs, copies, allocates and moves: "
         f"shape={VARIABLES['shape'].values} (default {DEFAULT_LAYER_SET})"),
    cells=layer_sets,
    cell_task=layer_task,
    record="LayerReport",  # hslm_ptx.pipeline.core.layer_records; judged by the layer ratchet at doit gate, not by a check task
)
task_layer = LAYER.create_doit_tasks  # the creator doit builds from LAYER (what the tests call)
