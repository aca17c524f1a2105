"""What the hardware will issue: SASS instruction counts per loop trip, per kernel x arch.

The PTX is assembled by ptxas into a cubin and disassembled by nvdisasm (both found as
$PTXAS / $NVDISASM, then the pip wheels, then PATH). Loops are read off the branch
targets: a branch to an earlier address closes a loop whose body is target..branch.
Inside a loop the control flow is followed path by path (each conditional branch taken
and not taken, exits out of the loop dropped), and each path's instructions are counted
by class. A kernel's loop may run one of two bodies per chunk, chosen uniformly on k:

- the **fast** (steady-state) body: of the paths with the most tensor instructions, the
  longest with the fewest predicated global loads (none, where the loop has a separate
  predicate-free body; a one-body loop whose copies carry guards is its own fast body);
- the **tail** body: the longest path with more predicated global loads than the fast
  one (None for a one-body loop).

Counts are per warp and per loop trip; NOPs the scheduler inserted are counted apart
and left out of the per-IMMA figures.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from hslm_ptx.pipeline.core.files import rel, sha256_file, write_atomic
from hslm_ptx.pipeline.core.errors import ArtifactError, UserError
from hslm_ptx.pipeline.core.models import Record
from hslm_ptx.pipeline.stages.ptxas import PtxasError, find_ptxas, first_error, ptxas_version, tool_version

if TYPE_CHECKING:
    from hslm_ptx.pipeline.stages.executor import Executor

NVDISASM_HINT = "pip install nvidia-cuda-nvdisasm (or set NVDISASM=/path/to/nvdisasm)"
CUOBJDUMP_HINT = "pip install nvidia-cuda-cuobjdump (or set CUOBJDUMP=/path/to/cuobjdump)"
WHEEL_PACKAGE = "nvidia.cu13"  # the 13.x wheels put their tools in nvidia/cu13/bin

# ---- tools ---------------------------------------------------------------------------


def find_tool(name: str, env_var: str, hint: str) -> Path:
    """$<env_var>, else ``nvidia/cu13/bin/<name>`` from the pip wheel, else PATH."""
    override = os.environ.get(env_var)
    if override:
        path = Path(override)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise UserError(f"{env_var}={override}: not an executable file; fix it or unset {env_var}")
        return path
    try:
        spec = importlib.util.find_spec(WHEEL_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / "bin" / name
        if candidate.is_file():
            return candidate
    found = shutil.which(name)
    if found is None:
        raise UserError(f"{name} not found: {hint}")
    return Path(found)


def find_nvdisasm() -> Path:
    return find_tool("nvdisasm", "NVDISASM", NVDISASM_HINT)


def find_cuobjdump() -> Path:
    return find_tool("cuobjdump", "CUOBJDUMP", CUOBJDUMP_HINT)


def disassembler_version(tool: Path) -> str:
    """nvdisasm's or cuobjdump's version (their banners name the tool, as ptxas's does)."""
    name = Path(tool).name
    return tool_version(tool, f"{name}: NVIDIA (R)", hint=NVDISASM_HINT if name == "nvdisasm" else CUOBJDUMP_HINT)


def cubin(ptx: Path, arch: str, out: Path, ptxas: Path | None = None) -> Path:
    """Assemble ``ptx`` for ``arch`` into ``out`` (the same ptxas the ptxas stage uses)."""
    proc = subprocess.run([str(ptxas or find_ptxas()), f"-arch={arch}", "-o", str(out), str(ptx)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise PtxasError(f"{rel(ptx)} ({arch}): {first_error(proc.stderr, proc.returncode)}")
    return out


def disassemble(cubin_path: Path, nvdisasm: Path | None = None) -> str:
    """nvdisasm's listing of the code of every function in ``cubin_path`` (``-c``). ``-ndf``:
    no dataflow analysis, so no branch-stack annotations, whichever nvdisasm it is (one
    that cannot analyse the cubin skips it anyway), and a fifth less time a call."""
    proc = subprocess.run([str(nvdisasm or find_nvdisasm()), "-c", "-ndf", str(cubin_path)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise PtxasError(f"nvdisasm {cubin_path.name}: {first_error(proc.stderr, proc.returncode)}")
    return proc.stdout


# ---- parsing -------------------------------------------------------------------------

LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
LABEL = re.compile(r"^(\.L_\w+):")
TARGET = re.compile(r"`\((\.L_\w+)\)")
FUNCTION = re.compile(r"^\s+\.type\s+(\S+),@function")


class Instr(NamedTuple):
    """One SASS instruction: address, guard predicate (None when always), opcode, target label."""

    addr: int
    guard: str | None
    opcode: str  # with modifiers, e.g. "LDG.E.U8"
    target: str | None  # branch target label

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]


class Listing(NamedTuple):
    instrs: list[Instr]
    labels: dict[str, int]  # label -> address


def parse_listing(text: str, function: str) -> Listing:
    """The instructions and labels of ``function`` in an nvdisasm listing."""
    instrs: list[Instr] = []
    labels: dict[str, int] = {}
    pending: list[str] = []
    inside = False
    for line in text.splitlines():
        if m := FUNCTION.match(line):
            if inside:
                break
            inside = m.group(1) == function
            continue
        if not inside:
            continue
        if m := LABEL.match(line):
            pending.append(m.group(1))
        elif m := LINE.search(line):
            addr = int(m.group(1), 16)
            labels.update((name, addr) for name in pending)
            pending = []
            target = TARGET.search(m.group(4))
            guard = m.group(2).strip() if m.group(2) else None
            instrs.append(Instr(addr, None if guard == "@PT" else guard, m.group(3),
                                target.group(1) if target else None))
    for name in pending:  # a label after the last instruction
        labels[name] = instrs[-1].addr + 16 if instrs else 0
    if not instrs:
        raise PtxasError(f"nvdisasm listing: no instructions for function '{function}'")
    return Listing(instrs, labels)


# ---- classes -------------------------------------------------------------------------

TENSOR = {"IMMA", "HMMA"}
BRANCH = {"BRA", "CALL", "EXIT", "RET", "BSSY", "BSYNC", "WARPSYNC", "BRX", "JMP"}
INT_ALU = {"IMAD", "IADD3", "IADD", "LOP3", "LOP", "SHF", "SHL", "SHR", "ISETP", "LEA", "IMNMX",
           "SEL", "MOV", "IABS", "POPC", "FLO", "BMSK", "SGXT", "CS2R", "PLOP3", "P2R", "R2P",
           "IDP", "BREV", "VIADD", "VIMNMX", "VIADDMNMX"}
WIDTH = {"U8": 8, "S8": 8, "U16": 16, "S16": 16, "64": 64, "128": 128}
# counted per access width (LDGSTS: cp.async, 4 bytes a lane unmodified, .128 for 16)
SIZED = {"LDG": "ldg", "LDS": "lds", "STS": "sts", "STG": "stg", "LDGSTS": "ldgsts"}
SINGLE = {"LDSM": "ldsm", "PRMT": "prmt", "BAR": "barrier", "NOP": "nop"}
LSU_PREFIXES = ("ldg", "lds", "sts", "stg", "ldgsts", "ldsm")


def width(opcode: str) -> int:
    """Access width in bits from the modifiers (no size modifier: 32 bits)."""
    sizes = [WIDTH[m] for m in opcode.split(".")[1:] if m in WIDTH]
    return sizes[0] if sizes else 32


def classify(opcode: str) -> str:
    """The counting class of one opcode: tensor, ldg32, lds128, prmt, int_alu, uniform, ..."""
    base = opcode.split(".")[0]
    if base in TENSOR:
        return "tensor"
    if base in SIZED:
        return f"{SIZED[base]}{width(opcode)}"
    if base in SINGLE:
        return SINGLE[base]
    if base in BRANCH:
        return "branch"
    if base in INT_ALU:
        return "int_alu"
    if base.startswith("U"):
        return "uniform"
    return "other"


def is_lsu(cls: str) -> bool:
    return cls.startswith(LSU_PREFIXES)


def class_width(cls: str) -> int | None:
    """The access width in bits a sized class carries ("ldg8" -> 8, "lds128" -> 128), else None."""
    digits = cls[len(cls.rstrip("0123456789")):]
    return int(digits) if digits else None


def is_guarded_global_load(ins: Instr) -> bool:
    return ins.guard is not None and ins.base in ("LDG", "LDGSTS")


# ---- loops and paths -----------------------------------------------------------------

MAX_PATHS = 4096


class Loop(NamedTuple):
    start: int  # index of the first instruction (the branch target)
    end: int  # index of the backward branch


def is_jump(ins: Instr) -> bool:
    """A branch to a label: BRA, or the CALL.REL.NOINC ptxas uses as a branch (it pushes
    no return address)."""
    return ins.target is not None and (ins.base == "BRA" or ins.opcode.startswith("CALL.REL.NOINC"))


def find_loops(listing: Listing) -> list[Loop]:
    """Every backward branch: its target..itself (a branch to itself is the trap after EXIT)."""
    index = {ins.addr: i for i, ins in enumerate(listing.instrs)}
    loops = []
    for i, ins in enumerate(listing.instrs):
        if is_jump(ins) and listing.labels[ins.target] < ins.addr:
            loops.append(Loop(index[listing.labels[ins.target]], i))
    return loops


def successors(listing: Listing, index: dict[int, int], i: int) -> list[int]:
    ins = listing.instrs[i]
    if ins.base == "EXIT":
        return [i + 1] if ins.guard else []
    if not is_jump(ins):
        return [i + 1]
    taken = index[listing.labels[ins.target]]
    return [i + 1, taken] if ins.guard else [taken]


def loop_paths(listing: Listing, loop: Loop) -> list[list[int]]:
    """Every path from the loop's first instruction to its backward branch, as instruction
    indices; branches out of the loop and inner backward branches are not followed."""
    index = {ins.addr: i for i, ins in enumerate(listing.instrs)}
    paths: list[list[int]] = []
    stack: list[tuple[int, list[int]]] = [(loop.start, [])]
    while stack:
        i, path = stack.pop()
        path = path + [i]
        if i == loop.end:
            paths.append(path)
            if len(paths) > MAX_PATHS:
                raise PtxasError(f"loop at {listing.instrs[loop.start].addr:#x}: over {MAX_PATHS} paths")
            continue
        for nxt in successors(listing, index, i):
            if i < nxt <= loop.end:
                stack.append((nxt, path))
    return paths


# what only a split-K epilogue runs after the last loop: a barrier around the staged sums,
# their red.global adds, the arrival ticket's atomic (sm_80 names RED/ATOM, sm_90 REDG/ATOMG)
SPLIT_EPILOGUE = {"BAR", "RED", "REDG", "ATOM", "ATOMG"}


def outside_route(listing: Listing, skip: tuple[Loop, ...] = (), unsplit: bool = False) -> list[int] | None:
    """The instructions (indices, NOPs included) on the longest path from the function's
    entry to an EXIT that takes no backward branch, those of the loops in ``skip`` left
    out: what one warp runs outside its chunk loops at most when every other loop runs
    once. ``skip`` holds every loop that runs the chunk's mma: the steady loop, and a
    second loop of the same body (the one a source whose copies need tail arithmetic runs
    its last chunks in, ``hslm_ptx.tile.mainloop.emit_staged``), whose trips the model
    counts as chunks. A kernel's epilogue paths (stored from the accumulators, or staged
    and added for split-K; guarded edge stores) exclude one another, so their sum is no
    warp's count. The edges only go forward, so one pass from the end finds it; "longest"
    counts instructions, NOPs excluded.

    ``unsplit``: the longest such path that runs no barrier, red or atomic after the
    function's last loop, which is what a launch with one split runs: its epilogue stores
    each lane's sums from registers (``hslm_ptx.tile.epilogue.Epilogue.store_fragments``),
    where split-K's stages them through shared memory behind a barrier and adds them with
    red.global. None when no path qualifies (a kernel whose every epilogue stages)."""
    index = {ins.addr: i for i, ins in enumerate(listing.instrs)}
    end = len(listing.instrs)
    last_loop_end = max((lp.end for lp in find_loops(listing) if lp.start < lp.end), default=-1)
    barred = float("-inf")
    best: list[float] = [0] * (end + 1)
    ahead_of: list[int | None] = [None] * (end + 1)
    inside = [any(loop.start <= i <= loop.end for loop in skip) for i in range(end)]
    for i in range(end - 1, -1, -1):
        ins = listing.instrs[i]
        if unsplit and i > last_loop_end and ins.base in SPLIT_EPILOGUE:
            best[i] = barred
            continue
        weight = 0 if inside[i] or classify(ins.opcode) == "nop" else 1
        ahead = [n for n in successors(listing, index, i) if i < n <= end]
        ahead_of[i] = max(ahead, key=lambda n: best[n], default=None)
        best[i] = weight + (best[ahead_of[i]] if ahead_of[i] is not None else 0)
    if best[0] == barred:
        return None
    route, i = [], 0
    while i is not None and i < end:
        if not inside[i]:
            route.append(i)
        i = ahead_of[i]
    return route


def route_instructions(listing: Listing, route: list[int] | None) -> int | None:
    """The instructions of ``route``, NOPs excluded (None for no route)."""
    return None if route is None else sum(classify(listing.instrs[i].opcode) != "nop" for i in route)


# ---- records -------------------------------------------------------------------------


class Body(Record):
    """One path through a loop, counted per warp per trip."""

    runs: list[str]  # address ranges the path executes, e.g. "0x3a0-0x830"
    instructions: int  # NOPs excluded
    nops: int
    imma: int
    lsu: int
    classes: dict[str, int]  # by class, NOPs included as "nop"
    per_imma: float | None  # instructions / imma
    lsu_per_imma: float | None
    guarded_global_loads: int


class LoopCounts(Record):
    start: str  # hex address of the first instruction
    end: str  # hex address of the backward branch
    instructions: int  # every instruction in the address range, NOPs excluded
    classes: dict[str, int]
    paths: int


class SassArch(Record):
    arch: str
    instructions: int  # the whole function, NOPs excluded
    loops: list[LoopCounts]
    steady_loop: str | None  # start address of the loop with the most IMMA
    fast: Body | None  # the steady-state body (None when the kernel has no loop)
    tail: Body | None  # the predicated tail body (None for a one-body loop)
    outside_path: int | None = None  # the longest path's instructions outside the chunk loops
    outside_path_unsplit: int | None = None  # the same, of a launch with one split (no split-K epilogue)
    outside_runs: list[str] = []  # the address ranges of the longest path outside the chunk loops
    outside_unsplit_runs: list[str] | None = None  # those of the unsplit path


class SassReport(Record):
    kernel: str
    ptx_sha256: str
    ptxas_version: str
    nvdisasm_version: str
    archs: list[SassArch]

    def arch(self, arch: str) -> SassArch:
        for entry in self.archs:
            if entry.arch == arch:
                return entry
        known = ", ".join(a.arch for a in self.archs)
        raise ArtifactError(f"{self.kernel}: no SASS counts for {arch} (known: {known}); add it to ARCHS "
                            "in hslm_ptx/pipeline/core/config.py and run `doit sass`")


def count(instrs: list[Instr]) -> Counter:
    return Counter(classify(ins.opcode) for ins in instrs)


def runs(listing: Listing, path: list[int]) -> list[str]:
    """Contiguous index runs of ``path`` as 'first-last' address ranges."""
    out, first = [], path[0]
    for prev, cur in zip(path, path[1:] + [None]):
        if cur != prev + 1:
            out.append(f"{listing.instrs[first].addr:#x}-{listing.instrs[prev].addr:#x}")
            first = cur
    return out


def body(listing: Listing, path: list[int]) -> Body:
    instrs = [listing.instrs[i] for i in path]
    classes = count(instrs)
    nops, imma = classes.get("nop", 0), classes.get("tensor", 0)
    total = len(instrs) - nops
    lsu = sum(n for c, n in classes.items() if is_lsu(c))
    return Body(runs=runs(listing, path), instructions=total, nops=nops, imma=imma, lsu=lsu,
                classes=dict(sorted(classes.items())),
                per_imma=round(total / imma, 4) if imma else None,
                lsu_per_imma=round(lsu / imma, 4) if imma else None,
                guarded_global_loads=sum(is_guarded_global_load(ins) for ins in instrs))


def loop_counts(listing: Listing, loop: Loop, paths: int) -> LoopCounts:
    classes = count(listing.instrs[loop.start:loop.end + 1])
    return LoopCounts(start=f"{listing.instrs[loop.start].addr:#x}", end=f"{listing.instrs[loop.end].addr:#x}",
                      instructions=sum(classes.values()) - classes.get("nop", 0),
                      classes=dict(sorted(classes.items())), paths=paths)


def longest(bodies: list[Body]) -> Body | None:
    return max(bodies, key=lambda b: (b.imma, b.instructions), default=None)


def analyse(listing: Listing, arch: str, bodies: bool = True) -> SassArch:
    """Loops, and the fast and tail bodies of the loop with the most IMMA. Without
    ``bodies`` (a kernel that is not a GEMM: its loops' guarded loads and division slow
    paths branch, so paths multiply past counting, and there is no IMMA to count them
    by), only the loops' and the function's instructions."""
    loops = find_loops(listing)
    paths = [loop_paths(listing, loop) for loop in loops] if bodies else [[] for _ in loops]
    counted = [loop_counts(listing, loop, len(p)) for loop, p in zip(loops, paths)]
    whole = count(listing.instrs)
    fast = tail = steady = outside = unsplit = None
    route: list[int] = []
    unsplit_route: list[int] | None = None
    if loops and bodies:
        best = max(range(len(loops)), key=lambda i: (counted[i].classes.get("tensor", 0), -i))
        chunk_loops = tuple(loop for loop, c in zip(loops, counted) if c.classes.get("tensor", 0))
        route = outside_route(listing, chunk_loops)
        unsplit_route = outside_route(listing, chunk_loops, unsplit=True)
        outside, unsplit = route_instructions(listing, route), route_instructions(listing, unsplit_route)
        steady = counted[best].start
        bodies = [body(listing, p) for p in paths[best]]
        top = max(b.imma for b in bodies)
        fewest = min(b.guarded_global_loads for b in bodies if b.imma == top)
        fast = longest([b for b in bodies if b.imma == top and b.guarded_global_loads == fewest])
        tail = longest([b for b in bodies if b.guarded_global_loads > fewest])
    return SassArch(arch=arch, instructions=sum(whole.values()) - whole.get("nop", 0), loops=counted,
                    steady_loop=steady, fast=fast, tail=tail, outside_path=outside,
                    outside_path_unsplit=unsplit, outside_runs=runs(listing, route) if route else [],
                    outside_unsplit_runs=runs(listing, unsplit_route) if unsplit_route else None)


def sass_report(kernel: str, entry: str, ptx: Path, archs: tuple[str, ...],
                sass_dir: Path | None = None, bodies: bool = True, runner: Executor | None = None) -> SassReport:
    """Assemble and disassemble ``ptx`` per arch and count; the listings are kept in
    ``sass_dir`` as ``<kernel>.<arch>.sass`` when given (for reading, not re-parsed).
    ``bodies``: find the fast and tail loop bodies (GEMMs; see :func:`analyse`).

    Each arch is one cell of ``runner`` (default: this machine's cores; ``doit sass
    executor=ray``: a Ray cluster, hslm_ptx.pipeline.stages.executor): the archs' ptxas and
    nvdisasm run side by side. A worker uses its own tools, and refuses the cell when
    their versions are not the driver's, which the report records."""
    from hslm_ptx.pipeline.stages.executor import Job, executor

    ptxas, nvdisasm = find_ptxas(), find_nvdisasm()  # here: a missing tool is one line before any cell
    versions = (ptxas_version(ptxas), disassembler_version(nvdisasm))
    text = ptx.read_text()
    jobs = [Job(sass_arch, (entry, text, arch, bodies, rel(ptx), versions)) for arch in archs]
    found = dict((runner or executor("local")).run(jobs))
    results = []
    for i, arch in enumerate(archs):
        if isinstance(found[i], BaseException):
            raise found[i]
        listing, counted = found[i]
        if sass_dir is not None:
            write_atomic(sass_dir / f"{kernel}.{arch}.sass", listing)
        results.append(counted)
    return SassReport(kernel=kernel, ptx_sha256=sha256_file(ptx), ptxas_version=versions[0],
                      nvdisasm_version=versions[1], archs=results)


def sass_arch(entry: str, ptx: str, arch: str, bodies: bool, name: str, versions: tuple[str, str]
              ) -> tuple[str, SassArch]:
    """One arch of a kernel, where an executor runs it: the PTX comes as text, the listing
    and its counts go back; ``name`` is the PTX file an error names; ``versions``: the
    driver's ptxas and nvdisasm versions, which this worker's own tools must have."""
    from hslm_ptx.runtime.backends import node_name

    ptxas, nvdisasm = find_ptxas(), find_nvdisasm()
    here = (ptxas_version(ptxas), disassembler_version(nvdisasm))
    if here != tuple(versions):
        raise UserError(f"sass {entry} {arch} on {node_name()}: this worker has ptxas {here[0]}, nvdisasm {here[1]}; "
                        f"the driver has {versions[0]}, {versions[1]}: install the driver's (the nvidia-cuda-nvcc-cu12 wheel)")
    with tempfile.TemporaryDirectory(prefix="sass-") as tmp:
        source = Path(tmp) / f"{entry}.ptx"
        source.write_text(ptx)
        try:
            text = disassemble(cubin(source, arch, Path(tmp) / f"{arch}.cubin", ptxas), nvdisasm)
        except PtxasError as exc:
            raise PtxasError(str(exc).replace(rel(source), name)) from None
    return text, analyse(parse_listing(text, entry), arch, bodies)
