"""What the build stages' tasks do when they run: emit, assemble and verify one kernel, judge
the records, print the lines; and the plan their tasks are created from.

hslm_ptx.pipeline.tasks.build declares the tasks and names these functions by their dotted
path (hslm_ptx.pipeline.stages.taskkit.Deferred), so this module, and the kernels, numpy and
pydantic with it, is imported only by a run that has work to do.

A cell records its evidence and succeeds, whatever the evidence says: a ptxas report
with spills, a verify report with mismatches or a launch error. It fails only when it
could produce no evidence (no ptxas, an unreadable artifact, a cell refused as too
big). The judges (``ptxas:check``, ``verify:check``) fail when a cell's evidence does
not pass. So ``doit gate`` can depend on the cells and judge a failing one against the
ledger, and whatever it ran is up to date for ``doit verify``.
"""
from __future__ import annotations

from typing import Sequence

from doit.exceptions import TaskFailed

from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.stages import report
from hslm_ptx.pipeline.core.artifacts import check_artifact, read_model, read_present, write_model
from hslm_ptx.pipeline.core.files import rel, sha256_file
from hslm_ptx.pipeline.core.request import Request
from hslm_ptx.pipeline.core.shapes import select_sets
from hslm_ptx.pipeline.stages.emit import emit
from hslm_ptx.pipeline.core.errors import ArtifactError, UserError, one_line
from hslm_ptx.pipeline.core.models import EmitResult, PtxasReport, VerifiedCell, VerifyIndex, VerifyReport
from hslm_ptx.pipeline.stages.ptxas import assemble
from hslm_ptx.pipeline.stages.build_plan import KernelCells
from hslm_ptx.pipeline.stages.taskkit import one_line_failure
from hslm_ptx.pipeline.stages.executor import Executor, Job, executor, parse_devices
from hslm_ptx.pipeline.stages.progress import PROGRESS
from hslm_ptx.pipeline.stages.verify import check_work, run_cell, verdict


# ---- emit ----------------------------------------------------------------------------

@one_line_failure
def run_emit(kernel: str) -> None:
    result = emit(KERNELS[kernel])
    print(f"{kernel}: {result.ptx_path} {result.ptx_bytes} bytes sha256 {result.ptx_sha256[:12]}")


# ---- ptxas ---------------------------------------------------------------------------

@one_line_failure
def run_ptxas(kernel: str) -> None:
    result = assemble(kernel, kernel, config.ptx_path(kernel), config.ARCHS, config.budget(kernel))
    write_model(config.ptxas_json(kernel), result)
    problems = report.ptxas_problems(result)
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        print(f"{problems[0]}{more}; see {rel(config.ptxas_json(kernel))}")
    else:
        print(f"{kernel}: within budget on {', '.join(config.ARCHS)} (ptxas {result.ptxas_version})")


def current_ptxas(kernel: str) -> PtxasReport | None:
    """The kernel's ptxas report when it is of the current PTX, else None."""
    emitted = report.cached_record(config.emit_json(kernel), EmitResult)
    found = report.cached_record(config.ptxas_json(kernel), PtxasReport)
    return found if emitted and found and found.ptx_sha256 == emitted.ptx_sha256 else None


def ptxas_problems(kernel: str) -> list[str]:
    """The judge's lines for one kernel: each arch not within budget, or no current report."""
    found = current_ptxas(kernel)
    return report.ptxas_problems(found) if found else [f"{kernel}: no ptxas report of the current PTX"]


def ptxas_summary(kernels: Sequence[str], ran: int) -> str:
    return report.ptxas_line([report.cached_record(config.ptxas_json(k), PtxasReport, True) for k in kernels], ran)


# ---- verify --------------------------------------------------------------------------
# One doit task per kernel (``verify:<kernel>``), its cells run inside it: doit's cost is
# per task, and a kernel's cells share its PTX, its reference and its emulator. A cell is
# run again only when its inputs, its PTX or its report file changed since its entry in
# the kernel's VerifyIndex was written (after each cell, so a killed run keeps what finished).

def read_index(kernel: str) -> VerifyIndex:
    """The kernel's index; an empty one when there is none or it is unreadable (its cells
    then all run again, which rewrites it)."""
    try:
        return read_present(config.verify_index(kernel), VerifyIndex) or VerifyIndex(kernel=kernel)
    except ArtifactError:
        return VerifyIndex(kernel=kernel)


def is_current(entry: VerifiedCell | None, inputs: str, ptx_sha256: str) -> bool:
    return entry is not None and entry.inputs == inputs and entry.ptx_sha256 == ptx_sha256


def indexed(found: VerifyReport, inputs: str, report_sha256: str) -> VerifiedCell:
    return VerifiedCell(inputs=inputs, ptx_sha256=found.ptx_sha256, report_sha256=report_sha256,
                        backend=found.backend, passed=found.passed, line=verdict(found))


def run_executor(request: Request) -> Executor:
    """The executor of ``executor=`` and ``address=`` (hslm_ptx.pipeline.stages.executor)."""
    return executor(request.value("executor"), request.value("address"))


def gpu_arch(backend: str, request: Request) -> str | None:
    """The arch resource a GPU cell asks a cluster for: the one of ``devices=`` (a verify
    report is one device's evidence per cell, so more than one is refused)."""
    devices = parse_devices(request.value("devices"))
    if backend != "gpu" or not devices:
        return None
    if len(devices) > 1:
        raise UserError(f"devices={request.value('devices')}: verify records one device per cell; "
                        "name one arch (devices=sm_90) and run once per arch")
    return devices[0]


@one_line_failure
def run_verify(cells: KernelCells, request: Request) -> dict | TaskFailed:
    """Run the kernel's cells that are not current; ``{"ran": n}`` for the reporter. The
    cells go to the run's executor together and each report is written here, with the
    index, as it arrives, so a run killed next keeps it. A cell refused (over the
    emulator's work budget) is left out of the index, the others run, and the task fails
    with the refusal; so it does with a cell whose worker could return no report."""
    kernel = cells.kernel
    emitted = read_model(config.emit_json(kernel), EmitResult)
    ptx_path = config.ptx_path(kernel)
    check_artifact(ptx_path, emitted.ptx_sha256)
    index = read_index(kernel)
    entries = dict(index.cells)
    named_sets = tuple(dict.fromkeys(shape_set for shape_set, _ in cells.shapes))
    shapes = {(shape_set, shape.name): shape for shape_set, found in select_sets(named_sets).items() for shape in found}
    todo, refused = [], []
    for (shape_set, name), inputs, key in zip(cells.shapes, cells.inputs, cells.keys()):
        path = config.verify_json(kernel, shape_set, name)
        entry = entries.get(key)
        if is_current(entry, inputs, emitted.ptx_sha256) and path.is_file() and sha256_file(path) == entry.report_sha256:
            entries[key] = indexed(read_model(path, VerifyReport), inputs, entry.report_sha256)  # the report decides
            PROGRESS.skip()
            continue
        try:
            check_work(kernel, shape_set, shapes[shape_set, name], cells.backend, cells.force)
        except UserError as exc:
            refused.append(str(exc))
            entries.pop(key, None)
            PROGRESS.skip()
            continue
        todo.append((key, inputs, shape_set, shapes[shape_set, name]))
    ptx, arch = ptx_path.read_text() if todo else "", gpu_arch(cells.backend, request)
    jobs = [Job(run_cell, (kernel, shape_set, shape, cells.backend, cells.force, ptx, emitted, inputs),
                gpu=cells.backend == "gpu", arch=arch) for _, inputs, shape_set, shape in todo]
    if jobs:
        PROGRESS.start()
    ran = 0
    for i, found in run_executor(request).run(jobs):
        key, inputs, shape_set, shape = todo[i]
        PROGRESS.advance()
        if isinstance(found, BaseException):
            refused.append(f"{kernel} {key}: {one_line(found)}")
            entries.pop(key, None)
            continue
        path = config.verify_json(kernel, shape_set, shape.name)
        write_model(path, found)
        entries[key] = indexed(found, inputs, sha256_file(path))
        write_model(config.verify_index(kernel), VerifyIndex(kernel=kernel, cells=entries))
        if not (found.passed and PROGRESS.live):  # on a terminal the live line counts the passing ones
            print(entries[key].line)  # after the index: a cell whose line was printed is kept by a run killed next
        ran += 1
    if refused:
        more = f" (+{len(refused) - 1} more)" if len(refused) > 1 else ""
        return TaskFailed(refused[0] + more)
    if entries != index.cells or not config.verify_index(kernel).is_file():
        write_model(config.verify_index(kernel), VerifyIndex(kernel=kernel, cells=entries))
    return {"ran": ran}


def verify_problems(cells: KernelCells) -> list[str]:
    """The judge's lines for one kernel: each cell's verdict when it does not pass, or no
    current entry (of this PTX and these inputs) in the kernel's index."""
    emitted = report.cached_record(config.emit_json(cells.kernel), EmitResult)
    index = report.cached_record(config.verify_index(cells.kernel), VerifyIndex) or VerifyIndex(kernel=cells.kernel)
    lines = []
    for inputs, key in zip(cells.inputs, cells.keys()):
        entry = index.cells.get(key)
        if emitted is None or not is_current(entry, inputs, emitted.ptx_sha256):
            lines.append(f"{cells.kernel} {key}: no verify report of the current PTX")
        elif not entry.passed:
            lines.append(entry.line)
    return lines


def verify_entries(kernels: Sequence[KernelCells]) -> list[VerifiedCell]:
    """Every cell's index entry, for the summary line; a missing one is an ArtifactError."""
    found = []
    for cells in kernels:
        index = report.cached_record(config.verify_index(cells.kernel), VerifyIndex, True)
        for key in cells.keys():
            if key not in index.cells:
                raise ArtifactError(f"{rel(config.verify_index(cells.kernel))}: no entry for {key}")
            found.append(index.cells[key])
    return found


def verify_summary(kernels: Sequence[KernelCells], ran: int) -> str:
    return report.verify_line(verify_entries(kernels), ran)


def verify_table(kernels: Sequence[KernelCells]) -> str:
    return report.verify_table([cell for cells in kernels for cell in cells.named()])


# ---- report --------------------------------------------------------------------------

@one_line_failure  # an unreadable report is one line, not a traceback
def run_report(kernels: Sequence[str], cells: Sequence[tuple[str, str, str]], fmt: str) -> None:
    report.print_to_pipe(report.last_run(kernels, cells, fmt))  # `doit report | head` ends quietly
