"""The doit graph re-runs exactly the stale stages, judged by content, never by mtime.

One copy of the project (dodo.py, hslm_ptx/, shapes.yaml, ledger/) per module
in a temp folder; each test runs ``python -m doit`` there and reads which tasks ran
(``.  name``) from doit's output; up-to-date tasks are only counted, in one line per
stage (hslm_ptx.pipeline.tasks.reporter). Tests run in file order and each leaves the copy up to date
for the next.

The graph's behaviour does not depend on how many kernels there are, so the copy's
registry keeps the three int8 families, one configuration each and two of dX (an edit of
a module re-emits each of its configurations: :data:`GRAPH_KERNELS`), and its tests/ folder
holds one kernel-marked test per kernel (:data:`KERNEL_TESTS`): the gate's kernel_tests
stage runs, re-runs and feeds the gate as it does on the whole suite, in seconds (the
kernel tests themselves run in this suite directly). The failing-cell case and the two
SASS-ratchet cases share one red gate run (:func:`red_gate`).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest
from doit.task import Task

from hslm_ptx.catalog import registry
from hslm_ptx.pipeline.core.files import RACY_NS, sha256_file
from hslm_ptx.pipeline.core.checker import ContentChecker, targets_intact
from hslm_ptx.pipeline.core.cmdline import VARIABLES
from hslm_ptx.pipeline.core.config import ROOT
from hslm_ptx.pipeline.ratchet.ledger import dump_ledger, make_ledger, read_ledger
from hslm_ptx.pipeline.core.models import SassEntry
from hslm_ptx.pipeline.stages.sass import SassReport
from hslm_ptx.pipeline.ratchet.sass_ratchet import current_figures

GRAPH_KERNELS = ("hslm_fwd_s8", "hslm_dx_s8", "hslm_dx_s8_m32", "hslm_dw_s8")
KERNELS = {name: spec for name, spec in registry.KERNELS.items() if name in GRAPH_KERNELS}
# appended to the copy's hslm_ptx/catalog/registry.py: its kernels are these only
RESTRICT = f"""

GRAPH_KERNELS = {GRAPH_KERNELS!r}
KERNELS = {{name: spec for name, spec in KERNELS.items() if name in GRAPH_KERNELS}}
FAMILIES = {{family: tuple(c for c in configs if c.name in KERNELS) for family, configs in FAMILIES.items()
            if any(c.name in KERNELS for c in configs)}}
"""
# the copy's whole tests/ folder: what the gate's kernel_tests stage runs there
KERNEL_TESTS = """
import pytest

from hslm_ptx.catalog.registry import KERNELS


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_emits_its_entry(kernel):
    assert f".visible .entry {kernel}(" in KERNELS[kernel].emit()
"""
EMIT = {f"emit:{k}" for k in KERNELS}
PTXAS = {f"ptxas:{k}" for k in KERNELS}
SASS = {f"sass:{k}" for k in KERNELS}


class Run(NamedTuple):
    rc: int
    ran: set[str]  # the tasks that ran (doit's ".  name" lines)
    out: str
    err: str
    cells: set[str]  # the verify cells that ran inside them, "<kernel>/<set>/<shape>" (their verdict lines)


VERDICT = re.compile(r"^(\w+) (\w+)/(\w+) R=\d+ K=\d+ N=\d+: ", re.M)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("project")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", ".*.tmp")
    for name in ("hslm_ptx", "ledger", "schemas"):
        shutil.copytree(ROOT / name, root / name, ignore=skip)
    for name in ("dodo.py", "shapes.yaml", "pyproject.toml"):
        shutil.copy2(ROOT / name, root / name)
    with open(root / "hslm_ptx" / "catalog" / "registry.py", "a") as registry_file:
        registry_file.write(RESTRICT)
    (root / "tests").mkdir()
    (root / "tests" / "test_kernels_emit.py").write_text(KERNEL_TESTS)
    first = doit(root, "ptxas")
    assert first.rc == 0, first.out + first.err
    assert first.ran == EMIT | PTXAS | {"ptxas:check"}  # the judge reads the new reports once
    assert "kernel" in first.out and "spill st" in first.out  # the table, since cells ran
    assert (root / "artifacts/ptxas/hslm_dw_s8.json").exists()  # the copy's own artifacts
    return root


def copy_environ(project: Path) -> dict[str, str]:
    """The environment of a run in the copy: its own modules first, no $PTXAS, and bytecode
    kept in the copy (each of the file's ~60 runs would otherwise compile every module again)."""
    skip = ("PTXAS", "PYTHONDONTWRITEBYTECODE")
    return {**{k: v for k, v in os.environ.items() if k not in skip}, "PYTHONPATH": str(project)}


def doit(project: Path, *args: str, **env: str) -> Run:
    environ = {**copy_environ(project), **env}
    proc = subprocess.run([sys.executable, "-m", "doit", *args], cwd=project, env=environ,
                          capture_output=True, text=True, timeout=300)
    lines = proc.stdout.splitlines()
    cells = {"/".join(m.groups()) for m in VERDICT.finditer(proc.stdout)}
    return Run(proc.returncode, {l[3:] for l in lines if l.startswith(".  ")}, proc.stdout, proc.stderr, cells)


def imported(project: Path, *args: str) -> set[str]:
    """The modules a doit run in the copy imports (``python -X importtime``)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "doit", *args], cwd=project,
                          env=copy_environ(project), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


def settle(project: Path) -> None:
    """Wait until every file the build plan is stamped with (hslm_ptx/,
    shapes.yaml, dodo.py) last changed more than RACY_NS ago. A plan computed from a file
    that changed within it is not kept (git's racy-clean rule, hslm_ptx.pipeline.core.treememo), so
    on a fast machine a run right after an earlier test's edit plans again, as it should."""
    files = [f for folder in ("hslm_ptx",) for f in (project / folder).rglob("*")
             if f.is_file() and "__pycache__" not in f.parts] + [project / "shapes.yaml", project / "dodo.py"]
    wait_ns = max(f.stat().st_ctime_ns for f in files) + RACY_NS - time.time_ns()
    if wait_ns > 0:
        time.sleep(wait_ns / 1e9 + 0.1)


def edit(path: Path, text: str, keep_mtime: bool = False) -> None:
    stat = path.stat()
    path.write_text(text)
    if keep_mtime:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        assert path.stat().st_mtime_ns == stat.st_mtime_ns


# ---- units ---------------------------------------------------------------------------

def test_content_checker_ignores_mtime(tmp_path):
    path = tmp_path / "f"
    path.write_text("one")
    checker = ContentChecker()
    state = checker.get_state(str(path), None)
    assert not checker.check_modified(str(path), path.stat(), state)
    edit(path, "two", keep_mtime=True)
    assert checker.check_modified(str(path), path.stat(), state)
    edit(path, "one")  # new mtime, same content
    assert not checker.check_modified(str(path), path.stat(), state)


def test_targets_intact(tmp_path):
    target = tmp_path / "k.ptx"
    task = Task("t", actions=None, targets=[str(target)], uptodate=[targets_intact()])
    check = task.uptodate[0][0]
    assert not check(task, {})  # never succeeded
    target.write_text("ptx")
    task.save_extra_values()  # what doit does after the task succeeded
    assert check(task, task.values)
    target.write_text("PTX")
    assert not check(task, task.values)  # damaged
    target.unlink()
    assert not check(task, task.values)  # missing


# ---- the graph -----------------------------------------------------------------------

def test_list_shows_the_stages(project):
    run = doit(project, "list")
    docs = dict(line.split(None, 1) for line in run.out.splitlines())
    assert run.rc == 0 and {"emit", "ptxas", "verify"} <= set(docs)
    assert all(docs[t].strip() for t in ("emit", "ptxas", "verify"))
    helped = doit(project, "help", "verify").out
    for variable in ("shape=<set,...> (shapes.yaml) (default smoke,tails,hslm)",
                     "backend=auto|gpu|emulator (default auto)", "force=0|1 (default 0)"):
        assert variable in helped


def test_second_ptxas_runs_nothing(project):
    second = doit(project, "ptxas")  # the fixture ran the first
    assert second.rc == 0 and second.ran == set()
    assert second.out == f"ptxas: {len(KERNELS)} kernels (all up to date): all within budget on sm_80, sm_86, sm_89, sm_90\n"


def test_comment_only_edit_reruns_emit_not_ptxas(project):
    source = project / "hslm_ptx" / "families" / "hslm_dx_s8.py"
    original = source.read_text()
    ptx = project / "artifacts/ptx/hslm_dx_s8.ptx"
    before = sha256_file(ptx)
    edit(source, original + "# a comment: the PTX does not change\n")
    run = doit(project, "ptxas")
    assert len(family_emits("hslm_dx_s8")) == 2  # the 128 x 128 and the 32 x 128 configurations
    assert run.rc == 0 and run.ran == family_emits("hslm_dx_s8")  # its configurations share the module
    assert sha256_file(ptx) == before
    edit(source, original)
    assert doit(project, "ptxas").ran == family_emits("hslm_dx_s8")


def emits_a_trailer(text: str) -> str:
    """The kernel module, edited so its PTX gains a trailing comment line."""
    return text + ("\nimport dataclasses as _dc\n"
                   "SPECS = (_dc.replace(SPECS[0], emit=lambda _emit=SPECS[0].emit: _emit() + '// edited\\n'),"
                   " *SPECS[1:])\n")


def test_edit_that_keeps_the_mtime_is_caught(project):
    source = project / "hslm_ptx" / "families" / "hslm_fwd_s8.py"
    original = source.read_text()
    ptx = project / "artifacts/ptx/hslm_fwd_s8.ptx"
    edit(source, emits_a_trailer(original), keep_mtime=True)
    run = doit(project, "ptxas")
    assert run.rc == 0 and run.ran == family_emits("hslm_fwd_s8") | {"ptxas:hslm_fwd_s8", "ptxas:check"}
    assert ptx.read_text().endswith("// edited\n")
    edit(source, original, keep_mtime=True)
    assert doit(project, "ptxas").ran == family_emits("hslm_fwd_s8") | {"ptxas:hslm_fwd_s8", "ptxas:check"}
    assert not ptx.read_text().endswith("// edited\n")


def test_doit_md5_checker_would_miss_that_edit(project):
    """The negative of the test above: why ContentChecker exists."""
    source = project / "hslm_ptx" / "families" / "hslm_fwd_s8.py"
    original = source.read_text()
    md5 = ("--check_file_uptodate", "md5")
    assert doit(project, *md5, "ptxas").rc == 0  # checker switched: everything re-runs once
    edit(source, emits_a_trailer(original), keep_mtime=True)
    missed = doit(project, *md5, "ptxas")
    assert missed.rc == 0 and missed.ran == set()
    caught = doit(project, "ptxas")
    assert "emit:hslm_fwd_s8" in caught.ran
    assert (project / "artifacts/ptx/hslm_fwd_s8.ptx").read_text().endswith("// edited\n")
    edit(source, original, keep_mtime=True)
    assert doit(project, "ptxas").ran == family_emits("hslm_fwd_s8") | {"ptxas:hslm_fwd_s8", "ptxas:check"}


def test_damaged_targets_are_rebuilt(project):
    ptx = project / "artifacts/ptx/hslm_dw_s8.ptx"
    good = ptx.read_bytes()
    ptx.write_bytes(good[:-40] + b"garbage")
    run = doit(project, "ptxas")
    assert run.rc == 0 and run.ran == {"emit:hslm_dw_s8"} and ptx.read_bytes() == good
    report = project / "artifacts/ptxas/hslm_dx_s8.json"
    good = report.read_bytes()
    report.write_text("{}")
    assert doit(project, "ptxas").ran == {"ptxas:hslm_dx_s8"} and report.read_bytes() == good


def test_over_budget_fails_with_one_line(project):
    cfg = project / "hslm_ptx" / "pipeline" / "core" / "config.py"
    original = cfg.read_text()
    assert "max_registers=128" in original
    edit(cfg, original.replace("max_registers=128", "max_registers=24"))
    run = doit(project, "ptxas")
    # the cells record the figures (the budget is part of each one's config); the judge fails
    assert run.rc == 1 and run.ran == PTXAS | {"ptxas:check"}
    assert "Traceback" not in run.out + run.err
    row = re.search(r"^hslm_fwd_s8 +sm_80 +(\d+) .* (\d+) registers > budget 24$", run.out, re.M)
    assert row and row.group(1) == row.group(2)
    failure = run.out.split("TaskFailed - taskid:ptxas:check\n", 1)[1].split("\n")
    assert re.fullmatch(rf"hslm_fwd_s8 sm_80: \d+ registers > budget 24 \(\+{4 * len(KERNELS) - 1} more\)", failure[0])
    edit(cfg, original)
    run = doit(project, "ptxas")  # the config changed back: the cells re-run, and pass
    assert run.rc == 0 and run.ran == PTXAS | {"ptxas:check"}  # a judge that failed runs until it passes


def test_missing_ptxas_fails_with_one_line(project):
    run = doit(project, "ptxas", PTXAS=str(project / "nope"))
    assert run.rc == 1 and "Traceback" not in run.out + run.err
    assert run.out.rstrip().endswith(f"PTXAS={project / 'nope'}: not an executable file; fix it or unset PTXAS")
    assert doit(project, "ptxas").ran == {"ptxas:hslm_fwd_s8"}  # the failed task re-runs


@pytest.mark.parametrize("ptxas, message", [
    ("nope", "not an executable file; fix it or unset PTXAS"),
    ("/bin/true", "it is not ptxas; pip install nvidia-cuda-nvcc-cu12"),
])
def test_gate_without_ptxas_says_so_once(project, ptxas, message):
    ptxas = str(project / ptxas) if ptxas == "nope" else ptxas
    run = doit(project, "gate", "shape=smoke", PTXAS=ptxas)
    assert run.rc == 1 and "Traceback" not in run.out + run.err
    assert run.out.count(message) == 1 and "UNEXPECTED FAILURE" not in run.out
    assert doit(project, "ptxas").ran == {"ptxas:hslm_fwd_s8"}


def test_user_errors_fail_only_the_tasks_that_read_them(project):
    run = doit(project, "verify", "shape=nope")
    assert run.rc == 1 and run.ran == {"verify:error"} and "Traceback" not in run.out + run.err
    assert "TaskFailed - taskid:verify:error\nunknown shape set 'nope' in shapes.yaml; known: smoke, tails, hslm, large\n" in run.out
    run = doit(project, "verify", "shape=smoke", "backend=tpu")
    assert run.rc == 1 and "unknown backend 'tpu'; known: auto, gpu, emulator\n" in run.out
    assert doit(project, "emit", "shape=nope").rc == 0


def test_unknown_variable_is_refused(project):
    run = doit(project, "verify", "shap=smoke")
    assert (run.rc, run.out) == (3, "")
    known = ", ".join(VARIABLES)
    assert known.startswith("shape, backend, force, ") and "accept_new" in known
    assert run.err == f"error: unknown variable 'shap'; known: {known}\n"


def test_bad_shapes_yaml_blocks_only_what_reads_it(project):
    shapes = project / "shapes.yaml"
    original = shapes.read_text()
    edit(shapes, "smoke:\n  - {name: a, R: 1, K: 1, N: 1}\n  - {name: odd, R: 33, K: 0, N: 9}\n")
    run = doit(project, "verify")
    listed = doit(project, "list")
    emitted = doit(project, "emit")
    edit(shapes, original)
    assert run.rc == 1 and "Traceback" not in run.out + run.err
    assert ("TaskFailed - taskid:verify:error\nshapes.yaml: set 'smoke' entry 2 ('odd'): field 'K': "
            "Input should be greater than or equal to 1\n") in run.out
    assert listed.rc == 0 and "verify" in listed.out and emitted.rc == 0


# ---- verify (on the emulator) --------------------------------------------------------

SMOKE = ("tiny", "small", "k_tail")
CELLS = {f"{k}/smoke/{s}" for k in KERNELS for s in SMOKE}
VERIFY = {f"verify:{k}" for k in KERNELS}  # one task a kernel, its cells run inside it


def family_emits(family: str) -> set[str]:
    """The emit tasks an edit of a family's module re-runs: one per configuration."""
    return {f"emit:{spec.name}" for spec in registry.FAMILIES[family] if spec.name in KERNELS}


def test_verify_runs_only_stale_cells(project):
    args = ("verify", "shape=smoke", "backend=emulator")
    first = doit(project, *args)
    assert first.rc == 0, first.out + first.err
    assert first.ran == VERIFY | {"verify:check"} and first.cells == CELLS
    assert f"verify: {len(CELLS)} cells on emulator ({len(CELLS)} ran): all exact" in first.out
    settle(project)  # so that the next run keeps its plan
    again = doit(project, *args)
    assert again.ran == again.cells == set() and again.out.endswith(f"verify: {len(CELLS)} cells on emulator (all up to date): all exact\n")
    # with nothing to do it loads no kernel, no numpy and no pydantic (hslm_ptx.pipeline.stages.build_plan)
    assert not imported(project, *args) & {"numpy", "pydantic", "yaml", "hslm_ptx.catalog.registry", "hslm_ptx.pipeline.core.models"}
    source = project / "hslm_ptx" / "families" / "hslm_dw_s8.py"
    original = source.read_text()
    edit(source, original + "# comment only\n")
    assert doit(project, *args).ran == family_emits("hslm_dw_s8")  # same PTX: no ptxas, no verify
    edit(source, original)
    assert doit(project, *args).ran == family_emits("hslm_dw_s8")
    report = project / "artifacts/verify/hslm_dx_s8/smoke/small.json"
    good = report.read_text()
    report.write_text(good.replace('"mismatches": 0', '"mismatches": 7'))
    rerun = doit(project, *args)
    # that cell only; its new report (a new run, a new time) is a new index entry, which the judge reads
    assert rerun.ran == {"verify:hslm_dx_s8", "verify:check"} and rerun.cells == {"hslm_dx_s8/smoke/small"}
    assert '"mismatches": 0' in report.read_text()
    index = project / "artifacts/verify/hslm_dx_s8/index.json"
    index.write_text(index.read_text().replace('"passed": true', '"passed": false', 1))
    rerun = doit(project, *args)  # an edited index is a damaged target: rebuilt from the reports, no cell runs
    assert rerun.ran == {"verify:hslm_dx_s8"} and rerun.cells == set() and '"passed": false' not in index.read_text()


def test_a_launch_change_with_the_same_ptx_reruns_its_cells(project):
    """A tile or split-K rule lives in Python, not in the PTX: a cell whose launch changes
    runs again; the emitted PTX and its ptxas report stay as they were."""
    source = project / "hslm_ptx" / "families" / "hslm_fwd_s8.py"
    original = source.read_text()
    assert doit(project, "verify", "shape=smoke", "backend=emulator").rc == 0
    # one more column of CTAs: they find no columns to store, so the answer stays exact
    edit(source, original + "\nimport dataclasses as _dc\n"
         "SPECS = (_dc.replace(SPECS[0], geometry=lambda d, _g=SPECS[0].geometry: _g(d)._replace(\n"
         "    grid=(_g(d).grid[0] + 1,) + tuple(_g(d).grid[1:]))), *SPECS[1:])\n")
    run = doit(project, "verify", "shape=smoke", "backend=emulator")
    edit(source, original)
    back = doit(project, "verify", "shape=smoke", "backend=emulator")  # the original launch again
    assert run.rc == 0 and {f"hslm_fwd_s8/smoke/{name}" for name in SMOKE} <= run.cells
    assert back.rc == 0 and {f"hslm_fwd_s8/smoke/{name}" for name in SMOKE} <= back.cells
    assert not {"ptxas:hslm_fwd_s8"} & run.ran and not any(t.startswith("verify:hslm_dx_s8") for t in run.ran)


def test_verify_mismatch_fails_with_the_first_one(project):
    """A kernel whose PTX changed and now disagrees with its reference (here: the reference
    is made off by one): its cells record the mismatches, the judge fails with the first."""
    source = project / "hslm_ptx" / "families" / "hslm_fwd_s8.py"
    original = source.read_text()
    edit(source, emits_a_trailer(original) +
         "SPECS = (_dc.replace(SPECS[0], reference=lambda d, i, _ref=SPECS[0].reference: _ref(d, i) + 1),"
         " *SPECS[1:])\n")
    run = doit(project, "verify", "shape=smoke", "backend=emulator")
    edit(source, original)
    assert run.rc == 1 and "Traceback" not in run.out + run.err
    failure = re.search(r"TaskFailed - taskid:verify:check\n(.*)\n", run.out)
    assert failure, run.out
    line = re.fullmatch(r"hslm_fwd_s8 smoke/(\w+) R=\d+ K=\d+ N=\d+: (\d+) mismatches \(max \|diff\| 1\); "
                        r"first at \(row 0, col 0\): got (-?\d+), want (-?\d+) \(\+2 more above\)", failure.group(1))
    assert line and int(line.group(3)) == int(line.group(4)) - 1
    again = doit(project, "verify", "shape=smoke", "backend=emulator")  # restored
    assert again.rc == 0 and again.cells >= {f"hslm_fwd_s8/smoke/{s}" for s in SMOKE}


# ---- the gate shares the graph -------------------------------------------------------

def test_gate_then_verify_reruns_nothing(project):
    """`doit gate` runs the cells through the same tasks and database as `doit verify`, so
    what it ran is up to date afterwards (a gate on its own database re-ran 55 tasks here)."""
    (project / "artifacts" / "verify").exists() and shutil.rmtree(project / "artifacts" / "verify")
    gate = doit(project, "gate", "shape=smoke")
    assert VERIFY | SASS | {"kernel_tests", "gate"} <= gate.ran and gate.cells == CELLS, gate.out + gate.err
    assert "gate: " in gate.out and "Traceback" not in gate.out + gate.err
    assert doit(project, "sass").ran == {"sass:summary"}  # the counts the gate judged are up to date
    after = doit(project, "verify", "shape=smoke")  # no cell runs; the judges read the gate's records once
    assert after.rc == 0 and after.ran <= {"ptxas:check", "verify:check"} and after.cells == set()
    again = doit(project, "verify", "shape=smoke")
    assert again.ran == set() and again.out == (f"ptxas: {len(KERNELS)} kernels (all up to date): all within budget on sm_80, sm_86, sm_89, sm_90\n"
                         f"verify: {len(CELLS)} cells on emulator (all up to date): all exact\n")


def test_gate_judges_a_failing_cell(red_gate):
    """A cell that mismatches is evidence: the gate still runs and names it against the ledger."""
    gate = red_gate.run
    assert gate.rc == 1 and "gate" in gate.ran and "Traceback" not in gate.out + gate.err
    failures = re.findall(r"^UNEXPECTED FAILURE  hslm_fwd_s8 verify smoke/(\w+): ledger pass, now fail: .* mismatches",
                          gate.out, re.M)
    assert sorted(failures) == sorted(SMOKE)


class RedGate(NamedTuple):
    run: Run
    slower: float  # hslm_fwd_s8 sm_80's fast SASS per IMMA now: the ledger says 1
    accepted: float  # hslm_dx_s8 sm_80's: the ledger accepted the rise from 1, with a reason


@pytest.fixture(scope="module")
def red_gate(project) -> RedGate:
    """One gate run (a gate run costs the most of any run here) with two plants the gate
    must each name on its own:

    - hslm_fwd_s8's PTX changed and its reference made off by one: its smoke cells
      mismatch (UNEXPECTED FAILURE, one line a cell);
    - a ledger with two SASS levels below the current counts: hslm_fwd_s8 sm_80 as a
      plain level (SLOWER, red), hslm_dx_s8 sm_80 as a rise accepted with a reason
      (informational). The counts come from the graph's own sass task, brought up to
      date (for the edited kernel too) before the gate runs.

    Kernel and ledger are restored afterwards."""
    source = project / "hslm_ptx" / "families" / "hslm_fwd_s8.py"
    original_source = source.read_text()
    ledger_file = project / "ledger" / "ledger.json"
    original_ledger = ledger_file.read_text()
    edit(source, emits_a_trailer(original_source) +
         "SPECS = (_dc.replace(SPECS[0], reference=lambda d, i, _ref=SPECS[0].reference: _ref(d, i) + 1),"
         " *SPECS[1:])\n")
    try:
        assert doit(project, "sass").rc == 0  # up to date first: the gate must not count again
        reports = [SassReport.model_validate_json((project / f"artifacts/sass/{k}.json").read_text()) for k in KERNELS]
        now = current_figures(reports)

        def lowered(kernel: str):
            level = now[kernel]["sm_80"]
            return level.model_copy(update={"fast": level.fast.model_copy(update={"sass_per_imma": 1.0})})

        entries = [SassEntry(kernel=k, arch=a, level=v) for k, archs in now.items() for a, v in archs.items()]
        planted = {("hslm_fwd_s8", "sm_80"): {"level": lowered("hslm_fwd_s8")},
                   ("hslm_dx_s8", "sm_80"): {"reason": "known-bug", "rose_from": lowered("hslm_dx_s8")}}
        entries = [e.model_copy(update=planted[e.key]) if e.key in planted else e for e in entries]
        ledger = read_ledger(ledger_file)
        ledger_file.write_text(dump_ledger(make_ledger(ledger.entries, ledger.max_not_pass, entries)))
        run = doit(project, "gate", "shape=smoke")
    finally:
        ledger_file.write_text(original_ledger)
        edit(source, original_source)
    return RedGate(run, now["hslm_fwd_s8"]["sm_80"].fast.sass_per_imma, now["hslm_dx_s8"]["sm_80"].fast.sass_per_imma)


def test_gate_judges_the_sass_counts_against_the_ledger(red_gate):
    """A ledger level below the current count is SLOWER, red; the gate reuses the graph's
    SASS counts rather than counting again."""
    run = red_gate.run
    assert not SASS & run.ran and "Traceback" not in run.out + run.err
    assert run.rc == 1
    assert f"\nSLOWER  hslm_fwd_s8 sm_80: fast SASS/IMMA 1 in the ledger -> {red_gate.slower:g} now  -> " in run.out


def test_gate_shows_an_accepted_rise_as_informational(red_gate):
    """The same rise accepted with a reason: one informational line, not SLOWER."""
    run = red_gate.run
    assert (f"INFO ACCEPTED SLOWER  hslm_dx_s8 sm_80: fast SASS/IMMA 1 -> {red_gate.accepted:g} accepted: known-bug"
            in run.out)
    assert "\nSLOWER  hslm_dx_s8" not in run.out and "\nSLOWER  hslm_fwd_s8" in run.out


def test_interrupted_verify_keeps_the_finished_cells(project):
    """SIGTERM in the middle of `doit verify`: one line, and the cells that finished are
    saved (doit writes its database when the run ends, also on an exception).

    One kernel's task on tails, stopped after 3 of its 12 cells: the run after has that
    task's other cells to finish (all of tails would leave some 45 emulator cells, the
    largest shapes of the four kernels among them). Only tails' reports are removed, so
    smoke's stay up to date for the tests after this one."""
    for reports in (project / "artifacts" / "verify").glob("*/tails"):
        shutil.rmtree(reports)
    task = ("verify:hslm_fwd_s8", "shape=tails", "backend=emulator")
    environ = {**copy_environ(project), "PYTHONUNBUFFERED": "1"}  # each line as it is printed
    proc = subprocess.Popen([sys.executable, "-m", "doit", *task],
                            cwd=project, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finished = set()
    for line in proc.stdout:
        if match := VERDICT.match(line):  # printed once the cell is in its kernel's index
            finished.add("/".join(match.groups()))
        if len(finished) == 3:
            proc.send_signal(signal.SIGTERM)
            break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err
    assert err.strip().startswith("interrupted (signal 15); the tasks that finished are saved")
    again = doit(project, *task)
    assert again.rc == 0 and again.cells  # the rest of the cells
    assert len(finished) == 3 and not finished & again.cells


def test_report_reprints_the_last_tables(project):
    assert doit(project, "verify", "shape=smoke").rc == 0
    text = doit(project, "report", "shape=smoke")
    assert text.rc == 0 and text.ran == set() and "spill st" in text.out and "mismatches" in text.out
    data = json.loads(doit(project, "report", "shape=smoke", "format=json").out)
    assert len(data["ptxas"]) == len(KERNELS) and len(data["verify"]) == len(CELLS)
    assert {r["kernel"] for r in data["verify"]} == set(KERNELS) and all(r["mismatches"] == 0 for r in data["verify"])
    bad = doit(project, "report", "format=xml")
    assert bad.rc == 1 and "format=xml: expected text or json" in bad.out


def test_report_into_a_closed_pipe_ends_quietly(project):
    """`doit report format=json | head`: the reader leaves before the report is written
    (here: before it starts); no BrokenPipeError traceback, exit 0."""
    environ = copy_environ(project)
    proc = subprocess.Popen([sys.executable, "-m", "doit", "report", "shape=smoke", "format=json"], cwd=project,
                            env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # no reader: the first write fails with EPIPE
    with proc.stderr:
        err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0 and err == ""


@pytest.mark.parametrize("quiet", [True, False], ids=["print_to_pipe", "plain-print"])
def test_print_to_pipe_swallows_only_a_closed_pipe(quiet):
    """Negative included: a plain print into the same closed pipe leaves a BrokenPipeError."""
    write = "from hslm_ptx.pipeline.stages.report import print_to_pipe; print_to_pipe('x' * 100000)" if quiet else "print('x' * 100000)"
    proc = subprocess.Popen([sys.executable, "-c", write], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    proc.stdout.close()
    with proc.stderr:
        err = proc.stderr.read()
    proc.wait(timeout=60)
    assert ("BrokenPipeError" in err) is not quiet


def test_clean_removes_everything_the_graph_wrote(project):
    """Runs last: `doit clean` leaves nothing under artifacts/ (temp files of killed runs
    included, and the folders), no database and no hypothesis example database."""
    assert (project / "artifacts" / "gate" / "run.json").exists() and (project / "artifacts" / "tests").exists()
    stray = project / "artifacts" / "verify" / ".x.json.tmp-999999999"
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_text("half")
    (project / ".hypothesis" / "examples").mkdir(parents=True, exist_ok=True)  # what the kernel tests' hypothesis keeps
    assert list(project.glob(".doit.db*"))  # the database the earlier runs wrote
    run = doit(project, "clean")
    assert run.rc == 0 and "TaskError" not in run.out + run.err, run.out + run.err
    assert not (project / "artifacts").exists(), sorted(map(str, (project / "artifacts").rglob("*")))
    assert list(project.glob(".doit.db*")) == [] and not (project / ".hypothesis").exists()
