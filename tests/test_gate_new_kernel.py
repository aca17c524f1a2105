"""A kernel the ledger and the seals have never seen gets one gate line saying what to run,
instead of one red line per cell (hslm_ptx.pipeline.ratchet.gate_new_kernel)."""
from __future__ import annotations

from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.ratchet import gate
from hslm_ptx.pipeline.ratchet.gate_new_kernel import KIND, fold_new_kernels, new_kernels, subject_kernel
from hslm_ptx.pipeline.ratchet.ledger import make_ledger
from hslm_ptx.pipeline.core.models import (AllowedDuplicates, CellResult, KernelState, PtxasArch, RunSummary, SassEntry,
                                           SassFigures, SassLevel, Seal, SealedShape, SealedVerify, Shape, TestCounts)
from hslm_ptx.pipeline.ratchet.results import cells

ARCHS = ("sm_80", "sm_90")
SETS = {"smoke": (Shape(name="tiny", R=1, K=1, N=1), Shape(name="tail", R=3, K=17, N=5))}
LEVEL = SassLevel(fast=SassFigures(sass_per_imma=10.0, lsu_per_imma=2.0),
                  tail=SassFigures(sass_per_imma=20.0, lsu_per_imma=4.0))


def seal(kernel: str) -> Seal:
    return Seal(
        kernel=kernel, source_sha256=f"s-{kernel}", ptx_sha256=f"p-{kernel}", ptx_bytes=10, ptxas_version="12.9",
        ptxas=[PtxasArch(arch=a, registers=40, spill_stores=0, spill_loads=0, shared_bytes=0, stack_bytes=0)
               for a in config.ARCHS],
        verify=SealedVerify(backend="emulator", device="cpu-emulator", shapes=[
            SealedShape(shape_set="smoke", shape=s.name, R=s.R, K=s.K, N=s.N, mismatches=0, rows_checked=s.R)
            for s in SETS["smoke"]]),
        tests=TestCounts(passed=2, failed=0, skipped=0, total=2, vacuous=0, invariants=1),
        sass={a: LEVEL for a in config.ARCHS}, sealed_at="2025-01-01",
        gpu={a: SealedVerify(backend="gpu", device=f"GPU {a}", shapes=[
            SealedShape(shape_set="smoke", shape=s.name, R=s.R, K=s.K, N=s.N, mismatches=0, rows_checked=s.R)
            for s in SETS["smoke"]]) for a in config.GPU_EVIDENCE_ARCHS})


def world(old=("kern_a",), new=("kern_new", "kern_newer"), failing: tuple[str, str, str] | None = None) -> gate.Inputs:
    """``old`` kernels sealed and in the ledger, ``new`` ones only in the run; every cell
    passes but ``failing``."""
    kernels = (*old, *new)
    universe = cells(kernels, ARCHS, SETS)
    results = [CellResult(kernel=k[0], check=k[1], target=k[2], verdict="fail" if k == failing else "pass",
                          blocker="3 mismatches" if k == failing else None) for k in universe]
    run = RunSummary(cells=universe, results=results, duplicates=[],
                     kernels=[KernelState(kernel=k, source_sha256=f"s-{k}", ptx_sha256=f"p-{k}") for k in kernels],
                     sass={k: dict.fromkeys(ARCHS, LEVEL) for k in kernels})
    ledger = make_ledger([r for r in results if r.kernel in old], max_not_pass=0,
                         sass=[SassEntry(kernel=k, arch=a, level=LEVEL) for k in old for a in ARCHS])
    return gate.Inputs(run, ledger, {k: seal(k) for k in old}, AllowedDuplicates(allowed=[]))


def judged(i: gate.Inputs) -> list[gate.Finding]:
    return gate.compare(i.run, i.ledger, i.seals, i.allowed)


def test_each_new_kernel_is_one_red_line_with_the_commands_to_run():
    i = world()
    raw = [finding for rule in gate.RULES for finding in rule(i)]  # the rules before the gate folds them
    assert sum(subject_kernel(f) == "kern_new" for f in raw) > 5  # unfolded: a line per cell and figure
    folded = fold_new_kernels(raw, i)
    assert judged(i) == folded  # the gate folds: `doit gate` prints the folded lines
    assert [f.subject for f in folded if f.red] == ["kern_new", "kern_newer"]
    line = str(next(f for f in folded if f.subject == "kern_new"))
    assert line == ("NEW KERNEL  kern_new: 5 cells (5 pass, 0 not passing, 0 not run), no seal in "
                    "ledger/seals/kern_new.json, no entry in the ledger  -> doit seal:kern_new && doit bless accept_new=1")


def test_a_new_kernel_that_fails_a_cell_says_which_first():
    i = world(new=("kern_new",), failing=("kern_new", "verify", "smoke/tail"))
    folded = fold_new_kernels(judged(i), i)
    assert [f.kind for f in folded if f.red] == [KIND]
    assert folded[0].what.startswith("5 cells (4 pass, 1 not passing")
    assert folded[0].fix == "make verify smoke/tail pass (3 mismatches), then doit seal:kern_new && doit bless accept_new=1"


def test_known_kernels_keep_their_findings():
    """Negative: a kernel with a seal or ledger entries is not new, so an unlisted cell of
    it stays an UNLISTED line, and a green world gains no line."""
    i = world(new=())
    assert new_kernels(i) == [] and fold_new_kernels(judged(i), i) == judged(i) == []
    sealed_only = i._replace(ledger=make_ledger([], max_not_pass=0))  # sealed, but the ledger lost it
    assert new_kernels(sealed_only) == []
    folded = fold_new_kernels(judged(sealed_only), sealed_only)
    assert folded and {f.kind for f in folded} == {"UNLISTED", "MISSING"}
    unsealed = world(new=())._replace(seals={})  # in the ledger, seal lost
    assert [f.kind for f in fold_new_kernels(judged(unsealed), unsealed)] == ["UNSEALED"]


def test_subject_kernel_reads_cells_figures_and_seal_files():
    cases = {"kern_a ptxas sm_80": "kern_a", "kern_a sm_90": "kern_a", "ledger/seals/kern_b.json": "kern_b"}
    for subject, kernel in cases.items():
        assert subject_kernel(gate.Finding("UNLISTED", subject, "", "")) == kernel
