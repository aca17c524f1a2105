"""The ratchet half of the doit graph: kernel_tests, seal, bless, gate.

- ``doit kernel_tests``: the kernel-marked tests under the assertcount plugin ->
  artifacts/tests/kernel_tests.json (re-runs when a .py under tests/, hslm_ptx/ or
  pipeline/ changes). A failing test is evidence; only a run that wrote no counts fails.
- ``doit seal`` (``seal:<kernel>``): verify of the sealed sets (config.VERIFY_SETS), the
  SASS counts and the kernel tests first, then ledger/seals/<kernel>.json; refuses,
  writing nothing, when a sealed shape did not pass (hslm_ptx.pipeline.ratchet.seal).
- ``doit bless`` / ``doit bless accept_new=1`` / ``doit bless accept_slower=<reason>``:
  ledger/ledger.json from the last run's artifacts, under the ratchet's rules
  (hslm_ptx.pipeline.ratchet.ledger.bless), ledger/layer.json, and ledger/stores.json, the pins of the
  other committed stores and of the test files (hslm_ptx.pipeline.ratchet.stores); runs nothing itself.
- ``doit gate``: depends on the emit, ptxas, sass and verify cells of the chosen sets and on
  kernel_tests (the same tasks and database as ``doit verify``: what the gate ran is up
  to date afterwards), then judges (hslm_ptx.pipeline.ratchet.gate.main); its exit status (0 green,
  1 red, 2 unreadable input) is doit's, through SystemExit.
"""
from __future__ import annotations

from typing import Iterator

from doit.exceptions import TaskFailed

from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.artifacts import read_model
from hslm_ptx.pipeline.core.files import rel, remove_folder, sweep_temp_files
from hslm_ptx.pipeline.core.request import Request, current, describe
from hslm_ptx.pipeline.core.errors import UserError
from hslm_ptx.pipeline.ratchet.kernel_tests import run_kernel_tests
from hslm_ptx.pipeline.ratchet.ledger import bless_file
from hslm_ptx.pipeline.core.models import KernelTestRun, Seal
from hslm_ptx.pipeline.ratchet.results import summarize
from hslm_ptx.pipeline.ratchet.seal import build_seal, seal_path, write_seal
from hslm_ptx.pipeline.core.shapes import select_sets
from hslm_ptx.pipeline.core.sources import source_sha256
from hslm_ptx.pipeline.stages.taskkit import failing_task, fails_on_user_error, one_line_failure
from hslm_ptx.pipeline.stages.build_plan import verify_plan
from hslm_ptx.pipeline.tasks.build import verify_task_name


@one_line_failure
def _kernel_tests() -> TaskFailed | None:
    run = run_kernel_tests(config.TESTS_JSON)
    for kernel, c in run.kernels.items():
        print(f"{kernel}: {c.passed}/{c.total} passed, {c.failed} failed, {c.skipped} skipped, "
              f"{c.vacuous} vacuous, {c.invariants} invariants")
    return TaskFailed(f"kernel tests could not be collected: {run.errors[0]}") if run.errors else None


def _sweep_all_temp_files() -> None:
    """A `doit clean` action (doit wants None or a bool back, not the list swept)."""
    sweep_temp_files(everything=True)


def task_kernel_tests() -> dict:
    """Run the kernel-marked tests, counting asserts (the counts seals and the ledger use)."""
    deps = sorted(str(p) for folder in config.TEST_INPUT_DIRS for p in folder.rglob("*.py")
                  if "__pycache__" not in p.parts)
    return {"actions": [_kernel_tests], "file_dep": deps, "targets": [str(config.TESTS_JSON)], "verbosity": 2,
            "clean": [(remove_folder, [config.TESTS_DIR]), (remove_folder, [config.HYPOTHESIS_DIR])]}


@one_line_failure
def _seal(kernel: str) -> None:
    path = seal_path(kernel)
    seal = build_seal(kernel, source_sha256(KERNELS[kernel]), select_sets(config.VERIFY_SETS),
                      read_model(config.TESTS_JSON, KernelTestRun), read_model(path, Seal) if path.is_file() else None)
    written = write_seal(seal)
    print(f"{kernel}: {'sealed' if written else 'seal unchanged'} in {rel(seal_path(kernel))} "
          f"({len(seal.verify.shapes)} shapes on {seal.verify.backend}, tests {seal.tests.passed}/"
          f"{seal.tests.total} passed, {seal.tests.vacuous} vacuous, {seal.tests.invariants} invariants, "
          f"SASS per IMMA on {len(seal.sass)} archs)")


@fails_on_user_error
def task_seal() -> Iterator[dict]:
    """Seal each kernel (ledger/seals/<kernel>.json) once its sealed sets verify."""
    # seal:<k> waits for the kernel's verify task when this command line asks for a sealed set
    verified = {kernel for kernel, shape_set, _ in verify_plan(current()).cells if shape_set in config.VERIFY_SETS}
    for kernel in KERNELS:
        verify = [verify_task_name(kernel)] if kernel in verified else []
        yield {"name": kernel, "actions": [(_seal, [kernel])],
               "task_dep": [*verify, f"ptxas:{kernel}", f"sass:{kernel}", "kernel_tests"],
               "uptodate": [False], "verbosity": 2}


@one_line_failure
def _bless(request: Request) -> None:
    run = summarize(config.VERIFY_SETS)
    ledger, notes = bless_file(run.cells, run.results, request.flag("accept_new"), sass=run.sass,
                               accept_slower=request.value("accept_slower") or None)
    print(f"blessed {rel(config.LEDGER_FILE)}: {len(ledger.entries)} entries {dict(ledger.counts)}, "
          f"max_not_pass {ledger.max_not_pass}")
    for note in notes:
        print(note)


def task_bless() -> dict:
    """Write ledger/ledger.json from the last run (accept_new=1 raises the cap by the new entries;
    accept_slower=<reason> records a SASS per IMMA rise with that reason), ledger/layer.json and
    the pins of the committed stores and test files (ledger/stores.json)."""
    return {"actions": [(_bless, [current()])], "uptodate": [False], "verbosity": 2}


def _gate(sets: list[str], base: str) -> None:
    from hslm_ptx.pipeline.ratchet import gate  # the judge and its rules: imported only when the gate runs

    code = gate.main(["--sets", ",".join(sets)] + (["--base", base] if base else []))
    if code:
        raise SystemExit(code)  # doit exits with it: 1 red, 2 unreadable input


def task_gate() -> dict:
    """CI's gate: brings emit, ptxas, sass, verify (shape=, default the sealed sets) and the kernel
    tests up to date, then judges them against ledger, seals and the duplicate-body rule."""
    try:
        request = current()
        cells = verify_plan(request).cells
    except UserError as exc:
        return failing_task(str(exc))
    deps = [f"{task}:{k}" for task in ("emit", "ptxas", "sass") for k in KERNELS]
    sets = list(dict.fromkeys(shape_set for _, shape_set, _ in cells))
    return {"actions": [(_gate, [sets, request.value("base")])], "task_dep": deps + [verify_task_name(k) for k in dict.fromkeys(k for k, _, _ in cells)]
            + ["kernel_tests"],
            "uptodate": [False], "verbosity": 2,
            "clean": [(remove_folder, [config.GATE_DIR]), (_sweep_all_temp_files, [])]}


task_gate.__doc__ = (f"CI: emit, ptxas, sass, verify, kernel tests, then judged vs ledger and seals: "
                     f"{describe('shape', 'backend', 'base')}")
task_bless.__doc__ = (f"Write ledger/ledger.json from the last run, ledger/layer.json, ledger/stores.json: "
                      f"{describe('accept_new', 'accept_slower')}")
