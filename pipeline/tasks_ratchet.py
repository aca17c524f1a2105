"""The ratchet half of the doit graph: kernel_tests, seal, bless, gate.

- ``doit kernel_tests``: the kernel-marked tests under the assertcount plugin ->
  artifacts/tests/kernel_tests.json (re-runs when a .py under tests/, kernels/ or
  pipeline/ changes).
- ``doit seal`` (``seal:<kernel>``): verify of the sealed sets (config.VERIFY_SETS) and
  the kernel tests first, then ledger/seals/<kernel>.json; refuses, writing nothing,
  when a sealed shape did not pass (pipeline.seal).
- ``doit bless`` / ``doit bless accept_new=1``: ledger/ledger.json from the last run's
  artifacts, under the ratchet's rules (pipeline.ledger.bless); runs nothing itself.
- ``doit gate``: ``python -m pipeline.gate`` in-process; its exit status (0 green,
  1 red, 2 unreadable input) is doit's, through SystemExit.
"""
from __future__ import annotations

from typing import Iterator

from doit import get_var
from doit.exceptions import TaskFailed

from kernels.registry import KERNELS
from pipeline import config, gate
from pipeline.artifacts import ROOT, read_model, rel
from pipeline.emit import source_sha256
from pipeline.gate import TESTS_JSON, run_kernel_tests
from pipeline.ledger import LEDGER_FILE, bless_file
from pipeline.models import KernelTestRun
from pipeline.seal import build_seal, seal_path, write_seal
from pipeline.shapes import parse_set_names, select_sets
from pipeline.tasks_build import exits_on_user_error, one_line_failure


@one_line_failure
def _kernel_tests() -> TaskFailed | None:
    run = run_kernel_tests(TESTS_JSON)
    for kernel, c in run.kernels.items():
        print(f"{kernel}: {c.passed}/{c.total} passed, {c.failed} failed, {c.skipped} skipped, "
              f"{c.vacuous} vacuous, {c.invariants} invariants")
    return TaskFailed(f"kernel tests could not be collected: {run.errors[0]}") if run.errors else None


def task_kernel_tests() -> dict:
    """Run the kernel-marked tests, counting asserts (the counts seals and the ledger use)."""
    deps = sorted(str(p) for folder in ("tests", "kernels", "pipeline") for p in (ROOT / folder).rglob("*.py")
                  if "__pycache__" not in p.parts)
    return {"actions": [_kernel_tests], "file_dep": deps, "targets": [str(TESTS_JSON)], "verbosity": 2}


@one_line_failure
def _seal(kernel: str) -> None:
    seal = build_seal(kernel, source_sha256(KERNELS[kernel]), select_sets(config.VERIFY_SETS),
                      read_model(TESTS_JSON, KernelTestRun))
    written = write_seal(seal)
    print(f"{kernel}: {'sealed' if written else 'seal unchanged'} in {rel(seal_path(kernel))} "
          f"({len(seal.verify.shapes)} shapes on {seal.verify.backend}, tests {seal.tests.passed}/"
          f"{seal.tests.total} passed, {seal.tests.vacuous} vacuous, {seal.tests.invariants} invariants)")


@exits_on_user_error
def task_seal() -> Iterator[dict]:
    """Seal each kernel (ledger/seals/<kernel>.json) once its sealed sets verify."""
    # seal:<k> waits for the verify cells this command line creates (see task_verify)
    chosen = parse_set_names(get_var("shape", None) or ",".join(config.VERIFY_SETS))
    sets = select_sets(tuple(s for s in config.VERIFY_SETS if s in chosen))
    for kernel in KERNELS:
        verify = [f"verify:{kernel}/{s}/{shape.name}" for s, shapes in sets.items() for shape in shapes]
        yield {"name": kernel, "actions": [(_seal, [kernel])], "task_dep": [*verify, "kernel_tests"],
               "uptodate": [False], "verbosity": 2}


@one_line_failure
def _bless() -> None:
    accept_new = (get_var("accept_new", None) or "0") == "1"
    run = gate.summarize(tuple(dict.fromkeys((*config.VERIFY_SETS, *config.GATE_SETS))))
    ledger, notes = bless_file(run.cells, run.results, accept_new)
    print(f"blessed {rel(LEDGER_FILE)}: {len(ledger.entries)} entries {dict(ledger.counts)}, "
          f"max_not_pass {ledger.max_not_pass}")
    for note in notes:
        print(note)


def task_bless() -> dict:
    """Write ledger/ledger.json from the last run (accept_new=1 raises the cap by the new entries)."""
    return {"actions": [_bless], "uptodate": [False], "verbosity": 2}


def _gate() -> None:
    code = gate.main([])
    if code:
        raise SystemExit(code)  # doit exits with it: 1 red, 2 unreadable input


def task_gate() -> dict:
    """CI's gate: emit, ptxas, emulator verify, kernel tests, then ledger/seals/duplicates findings."""
    return {"actions": [_gate], "uptodate": [False], "verbosity": 2}
