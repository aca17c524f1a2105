"""The records that cross stage boundaries: emit -> ptxas -> verify (-> seal, gate).

Each stage writes one of these as JSON beside its artifact and the next stage reads
it back through :func:`hslm_ptx.pipeline.core.artifacts.read_model`; no stage re-parses another's
free text. Models are strict (``extra="forbid"``) so a hand-edited or stale-format
file is refused with the field named instead of half-understood.
"""
from __future__ import annotations

import re
from typing import Annotated, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, model_validator

# A name that becomes a file or folder name (shape sets, shapes): safe characters and
# at least one that is not a dot (so never "." or "..").
# At most MAX_NAME characters: a file name may have 255 bytes, and the verify report's
# name and the temp files beside it add to the shape's.
MAX_NAME = 100
NAME_RULE = f"letters, digits, '_', '.', '-', not only dots, at most {MAX_NAME} characters"
_NAME = re.compile(r"[A-Za-z0-9_.-]*[A-Za-z0-9_-][A-Za-z0-9_.-]*")


def safe_name(name: str) -> str:
    """``name`` when it is safe as a file name (:data:`NAME_RULE`), else ValueError."""
    if len(name) > MAX_NAME or not _NAME.fullmatch(name):
        shown = repr(name) if len(name) <= 40 else f"{name[:20]!r}... ({len(name)} characters)"
        raise ValueError(f"{shown} is not a safe name: use {NAME_RULE}")
    return name


SafeName = Annotated[str, AfterValidator(safe_name)]


class Record(BaseModel):
    """Every record that crosses a stage boundary: unknown fields refused, immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


SCHEMA_VERSION = 1


class Document(Record):
    """A record written as a JSON file of its own: it says which schema it follows
    (schemas/<Name>.json, exported by hslm_ptx.pipeline.core.schemas)."""

    schema_version: Literal[1] = SCHEMA_VERSION


class Shape(Record):
    """One named problem size from shapes.yaml."""

    name: SafeName
    R: StrictInt = Field(ge=1, description="rows (tokens)")
    K: StrictInt = Field(ge=1, description="in-features")
    N: StrictInt = Field(ge=1, description="out-features")


class EmitResult(Document):
    """emit: the PTX text of one kernel, pinned by content."""

    kernel: str
    entry: str
    ptx_path: str  # relative to the project root
    ptx_sha256: str
    ptx_bytes: int
    source_sha256: str  # hash of the kernel's source closure (hslm_ptx.pipeline.core.sources)


class PtxasUsage(Record):
    """What ``ptxas -v`` reports for one entry on one arch."""

    registers: int
    spill_stores: int
    spill_loads: int
    shared_bytes: int
    stack_bytes: int


class PtxasArch(PtxasUsage):
    """ptxas -v figures for one kernel on one arch, and the budget verdict."""

    arch: str
    problems: list[str] = []  # empty when within budget and spill-free

    @property
    def ok(self) -> bool:
        return not self.problems


class PtxasReport(Document):
    kernel: str
    ptx_sha256: str
    ptxas: str  # path of the ptxas that ran
    ptxas_version: str
    max_registers: int
    max_shared_bytes: int
    archs: list[PtxasArch]
    errors: dict[str, str] = {}  # arch -> ptxas's first error line, for archs it refused

    @property
    def ok(self) -> bool:
        return not self.errors and all(a.ok for a in self.archs)


class Mismatch(Record):
    """The first element that differs: its value, or a float's bit pattern as an unsigned
    integer; ``output`` names the buffer for a kernel with several ("" for the only one)."""

    row: int
    col: int
    got: int
    want: int
    output: str = ""


class MemoryAccess(Record):
    """One memory instruction's traffic over a launch, as the emulator counts it."""

    line: int
    opcode: str
    space: str
    in_loop: bool
    requests: int
    bytes_used: int
    sectors: int
    lines: int
    wavefronts: int
    ideal_wavefronts: int


class LaunchStats(Record):
    """What the emulator counted in a verify launch (warp instructions issued)."""

    warp_instructions: int
    by_opcode: dict[str, int]
    memory: list[MemoryAccess] = []


class VerifyReport(Document):
    """verify: one kernel on one shape, checked element by element against the reference."""

    kernel: str
    shape_set: str
    shape: str
    R: int
    K: int
    N: int
    backend: Literal["gpu", "emulator"]
    device: str  # GPU name, or "cpu-emulator"
    driver: str | None = None  # CUDA driver version when a GPU ran it
    arch: str | None = None  # the GPU's arch ("sm_90") when a GPU ran it: the seal keeps GPU evidence per arch
    node: str = ""  # the machine that ran it (and its Ray node id on a cluster: hslm_ptx.pipeline.stages.executor)
    mismatches: int
    rows_checked: int
    max_abs_diff: int  # integer outputs: |got - want|; float outputs: units in the last place
    first_mismatch: Mismatch | None = None
    output_mismatches: dict[str, int] = {}  # per output, for a kernel with several
    seconds: float
    ptx_sha256: str
    error: str | None = None  # the emulator's or driver's error, when the launch failed
    launch_stats: LaunchStats | None = None  # emulator launches only

    @property
    def passed(self) -> bool:
        return self.error is None and self.mismatches == 0 and self.rows_checked == self.R



class VerifiedCell(Record):
    """One cell in its kernel's :class:`VerifyIndex`: what it was run on and what it said."""

    inputs: str  # sha256 of the cell's inputs besides the PTX (shape, seed, launch, reference, backend)
    ptx_sha256: str
    report_sha256: str  # of its VerifyReport file: a report edited since is run again
    backend: Literal["gpu", "emulator"]
    passed: bool
    line: str  # the verdict line (hslm_ptx.pipeline.stages.verify.verdict)


class VerifyIndex(Document):
    """verify: one kernel's cells, keyed "<set>/<shape>", written after each cell. A cell
    whose inputs, PTX and report file are unchanged is not run again, and the judge and
    the summary read this instead of every report."""

    kernel: str
    cells: dict[str, VerifiedCell] = {}


# --- seal, ledger, gate -------------------------------------------------------------
# Written by hslm_ptx/pipeline/ratchet/assertcount.py (test counts), hslm_ptx/pipeline/ratchet/seal.py (seals),
# hslm_ptx/pipeline/ratchet/results.py (a run's verdicts), hslm_ptx/pipeline/ratchet/ledger.py (ledger) and read back
# by hslm_ptx/pipeline/ratchet/gate.py.

Verdict = Literal["pass", "pass_vacuous", "blocked", "fail"]
Check = Literal["ptxas", "verify", "tests"]
CellKey = tuple[str, str, str]  # (kernel, check, target): the ledger's sort key


class TestCounts(Record):
    """One kernel's tests as counted by the assertcount plugin.

    ``vacuous``: passed without one passing assert (or pytest.raises);
    ``invariants``: passed hypothesis properties.
    """

    __test__ = False  # not a pytest test class, despite the name

    passed: int = Field(ge=0)
    failed: int = Field(ge=0)
    skipped: int = Field(ge=0)
    total: int = Field(ge=0)
    vacuous: int = Field(ge=0)
    invariants: int = Field(ge=0)


class KernelTestRun(Document):
    """What one pytest run of the kernel-marked tests found, per kernel."""

    exitstatus: int
    kernels: dict[str, TestCounts]
    failures: dict[str, str] = {}  # kernel -> "nodeid: first error line" of its first failure
    vacuous_tests: dict[str, list[str]] = {}  # kernel -> node ids of its vacuous tests
    errors: list[str] = []  # collection/internal errors: the counts cannot be trusted
    files: dict[str, list[str]] = {}  # kernel -> the test files (relative paths) its tests are in


class SealedShape(Record):
    shape_set: str
    shape: str
    R: int
    K: int
    N: int
    mismatches: int
    rows_checked: int


class SealedVerify(Record):
    backend: Literal["gpu", "emulator"]
    device: str
    driver: str | None = None
    node: str = ""  # where it ran (GPU evidence: the machine and its Ray node id)
    shapes: list[SealedShape]


class SassFigures(Record):
    """One loop body's issue cost per warp per trip (hslm_ptx.pipeline.stages.sass): SASS instructions and
    LSU instructions per IMMA."""

    sass_per_imma: float
    lsu_per_imma: float


class SassLevel(Record):
    """A kernel's SASS figures on one arch: the steady-state (fast) body and the
    predicated tail body, each absent when the loop has none."""

    fast: SassFigures | None = None
    tail: SassFigures | None = None


class SassEntry(Record):
    """The ledger's SASS level for one kernel x arch: what the gate holds the current
    counts to (hslm_ptx.pipeline.ratchet.sass_ratchet). A rise is recorded only with a reason from
    hslm_ptx.pipeline.ratchet.ledger.REASONS; ``rose_from`` then keeps the level before the rise."""

    kernel: str
    arch: str
    level: SassLevel
    reason: str | None = None
    rose_from: SassLevel | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.kernel, self.arch)


class Seal(Document):
    """ledger/seals/<kernel>.json: what was verified, pinned by content.

    Stale when the kernel's current source hash or PTX hash differs. ``sealed_at`` is
    information only; nothing compares it.
    """

    kernel: str
    source_sha256: str
    ptx_sha256: str
    ptx_bytes: int
    ptxas_version: str
    ptxas: list[PtxasArch]
    verify: SealedVerify
    tests: TestCounts
    test_files: dict[str, str] = {}  # path -> sha256 of each test file the kernel's tests are in
    sass: dict[str, SassLevel] = {}  # arch -> figures of the sealed PTX
    gpu: dict[str, SealedVerify] = {}  # arch ("sm_90") -> the sealed sets verified on a GPU of that arch, this PTX
    sealed_at: str


class SealEvidence(Record):
    """What the gate's own run shows of one kernel, in a seal's terms, so each sealed
    figure is compared with one just produced (hslm_ptx.pipeline.ratchet.seal.mismatches). None (or an
    empty list) where this run has no such evidence: that figure is not compared.

    ``defined``: the sealed sets' shapes as shapes.yaml defines them now (mismatches and
    rows_checked 0); ``verify``: the verify reports of the current PTX this run read.
    """

    ptx_bytes: int | None = None
    ptxas_version: str | None = None
    ptxas: list[PtxasArch] | None = None
    defined: list[SealedShape] = []
    verify: list[SealedShape] = []
    runs: list[tuple[str, str, str | None]] = []  # distinct (backend, device, driver) of those reports
    arch: str | None = None  # the GPU arch of those reports, when they are one GPU's
    tests: TestCounts | None = None
    test_files: dict[str, str] | None = None
    sass: dict[str, SassLevel] | None = None


class CellResult(Record):
    """One cell kernel x check x target and its verdict: a run's result and, the same
    record, a ledger entry (the verdict the ledger expects).

    ``reason`` is kept free-form here so a wrong one in the ledger is a gate finding
    (BAD REASON) rather than an unreadable ledger.
    """

    kernel: str
    check: Check
    target: str  # arch (ptxas), "set/shape" (verify), "tests" (tests)
    verdict: Verdict
    blocker: str | None = None  # first error line, for a non-pass verdict
    reason: str | None = None  # one of hslm_ptx.pipeline.ratchet.ledger.REASONS, for a non-pass verdict

    @property
    def key(self) -> CellKey:
        return (self.kernel, self.check, self.target)


class Ledger(Document):
    """ledger/ledger.json: every cell's expected verdict, the tally and the cap.

    Entries are unique per cell and kept sorted; ``counts`` must be the tally of the
    entries, so a hand edit that forgets it is refused as unreadable, not half-trusted.
    """

    max_not_pass: int = Field(ge=0)
    counts: dict[Verdict, int]
    entries: list[CellResult]
    sass: list[SassEntry] = []  # sorted by (kernel, arch)

    @model_validator(mode="after")
    def _consistent(self) -> "Ledger":
        keys = [e.key for e in self.entries]
        dups = sorted({k for k in keys if keys.count(k) > 1})
        if dups:
            raise ValueError(f"cell {'/'.join(dups[0])} is listed twice")
        if keys != sorted(keys):
            raise ValueError("entries are not sorted by (kernel, check, target)")
        tally = {v: sum(1 for e in self.entries if e.verdict == v) for v in get_args(Verdict)}
        if dict(self.counts) != tally:
            raise ValueError(f"counts {dict(self.counts)} do not add up to the entries' {tally}")
        sass = [e.key for e in self.sass]
        if sass != sorted(set(sass)):
            raise ValueError("sass entries are not unique and sorted by (kernel, arch)")
        return self

    @property
    def not_pass(self) -> int:
        return sum(1 for e in self.entries if e.verdict != "pass")


class KernelState(Record):
    """A kernel's current source and PTX hashes (what a seal must match)."""

    kernel: str
    source_sha256: str
    ptx_sha256: str


class FunctionRef(Record):
    path: str  # relative to the project root
    qualname: str
    line: int

    @property
    def name(self) -> str:
        return f"{self.path}::{self.qualname}"


class DuplicateGroup(Record):
    """Functions in two or more files whose normalized bodies are identical."""

    members: list[FunctionRef]


class AllowedDuplicate(Record):
    functions: list[str] = Field(min_length=2)  # "path::qualname"
    reason: str = Field(min_length=1)


class AllowedDuplicates(Record):
    """ledger/allowed_duplicates.yaml."""

    allowed: list[AllowedDuplicate] = []


class RunSummary(Document):
    """What the gate's run found: the cells that exist, the verdicts it could get,
    the kernels' current hashes, the duplicate bodies and the schema files that drifted."""

    cells: list[CellKey]
    results: list[CellResult]
    kernels: list[KernelState]
    duplicates: list[DuplicateGroup]
    schema_drift: list[str] = []  # schemas/ files that differ from the models (hslm_ptx.pipeline.core.schemas)
    sass: dict[str, dict[str, SassLevel]] = {}  # kernel -> arch -> figures of the current PTX
    evidence: dict[str, SealEvidence] = {}  # kernel -> what this run shows, in a seal's terms
