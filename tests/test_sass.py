"""SASS counts (hslm_ptx.pipeline.stages.sass): a hand-counted loop, and every kernel's loop counts checked
against a second route (cuobjdump's listing of the same cubin, read by a deliberately
simple counter written here)."""
from __future__ import annotations

import functools
import itertools
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.pipeline.stages import sass
from hslm_ptx.pipeline.core.errors import ArtifactError, UserError

DATA = Path(__file__).parent / "data" / "sass"
ARCHS = ("sm_80", "sm_90")  # the oldest and the newest: different schedules, uniform datapath


@pytest.fixture(scope="module")
def tools() -> tuple[Path, Path]:
    try:
        return sass.find_nvdisasm(), sass.find_cuobjdump()
    except UserError as exc:
        pytest.skip(f"SASS tools not installed: {exc}")


class Listings:
    """The listings of each (PTX, arch) the module reads, each tool run once per cubin.

    ptxas, nvdisasm and cuobjdump each take about half a second a call, even on the small
    loop.ptx, and the tests read the same cubins many times (loop.ptx on sm_80 in five
    tests, the GEMM loops again for their decode tables). The listings are strings, so a
    test that plants an instruction in one changes only its own copy."""

    def __init__(self, tmp: Path, tools: tuple[Path, Path]) -> None:
        self.tmp, self.tools, self.numbers = tmp, tools, itertools.count()

    @functools.cache
    def cubin(self, ptx: str, name: str, arch: str) -> Path:
        source = self.tmp / f"{name}.{next(self.numbers)}.ptx"  # numbered: an edited PTX of one name is its own
        source.write_text(ptx)
        return sass.cubin(source, arch, source.with_suffix(f".{arch}.cubin"))

    @functools.cache
    def nvdisasm(self, ptx: str, name: str, arch: str) -> str:
        """nvdisasm's listing of the cubin (what hslm_ptx.pipeline.stages.sass counts)."""
        return sass.disassemble(self.cubin(ptx, name, arch), self.tools[0])

    @functools.cache
    def cuobjdump(self, ptx: str, name: str, arch: str) -> str:
        """cuobjdump -sass's listing of the same cubin (the second route)."""
        return subprocess.run([str(self.tools[1]), "-sass", str(self.cubin(ptx, name, arch))],
                              capture_output=True, text=True, check=True).stdout

    def both(self, ptx: str, name: str, arch: str) -> tuple[str, str]:
        """(nvdisasm listing, cuobjdump -sass listing) of one cubin."""
        return self.nvdisasm(ptx, name, arch), self.cuobjdump(ptx, name, arch)


@pytest.fixture(scope="module")
def listings(tmp_path_factory, tools) -> Listings:
    return Listings(tmp_path_factory.mktemp("listings"), tools)


LOOP = (DATA / "loop.ptx").read_text()


# ---- the second route: cuobjdump text, counted by address ----------------------------

ROW = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
LSU = ("LDG", "LDS", "STS", "STG", "LDSM", "LDGSTS")


def simple_rows(dump: str) -> dict[int, tuple[str, str]]:
    """address -> (opcode, operands); cuobjdump's encoding lines carry no address."""
    return {int(m.group(1), 16): (m.group(2), m.group(3)) for line in dump.splitlines() if (m := ROW.match(line))}


def simple_loop(rows: dict[int, tuple[str, str]]) -> tuple[int, int]:
    """The backward branch with the most IMMA between its target and itself; of equals, the
    first in the code (a peeled tail loop follows the steady loop it repeats)."""
    loops = []
    for addr, (op, operands) in rows.items():
        if op == "BRA" and operands.startswith("0x") and int(operands, 16) < addr:
            start = int(operands, 16)
            loops.append((sum(o.startswith("IMMA") for a, (o, _) in rows.items() if start <= a <= addr), -start, addr))
    _, neg_start, end = max(loops)
    return -neg_start, end


def simple_count(rows: dict[int, tuple[str, str]], ranges: list[tuple[int, int]]) -> Counter:
    counts: Counter = Counter()
    for first, last in ranges:
        for addr in range(first, last + 16, 16):
            op = rows[addr][0]
            counts["nop"] += op == "NOP"
            counts["instructions"] += op != "NOP"
            counts["imma"] += op.startswith("IMMA")
            counts["lsu"] += op.split(".")[0] in LSU
            counts["bar"] += op.startswith("BAR")
    return counts


def body_ranges(body: sass.Body) -> list[tuple[int, int]]:
    return [tuple(int(x, 16) for x in run.split("-")) for run in body.runs]


def agrees(body: sass.Body, counts: Counter) -> bool:
    return (body.instructions, body.nops, body.imma, body.lsu, body.classes.get("barrier", 0)) == (
        counts["instructions"], counts["nop"], counts["imma"], counts["lsu"], counts["bar"])


# ---- a loop counted by hand -----------------------------------------------------------

# tests/data/sass/loop.ptx with ptxas 12.9: the loop body, instruction by instruction.
# sm_80 (0x00b0-0x01f0): IMAD.MOV LDG.E IADD3 ISETP IADD3 IMAD.X STS BAR LDS.128 PRMT
#   IMAD.MOV MOV IMAD.MOV MOV IMAD.MOV MOV MOV IMMA NOP IMMA BRA
# sm_90 (0x00f0-0x0230): LDG.E UIADD3 ISETP IADD3 IADD3.X STS BAR LDS.128 PRMT IMAD.MOV MOV
#   IMAD.MOV MOV IMAD.MOV IMAD.MOV IMAD.MOV IMMA NOP IMMA NOP BRA
HAND = {
    "sm_80": {"runs": ["0xb0-0x1f0"], "instructions": 20, "nops": 1, "imma": 2, "lsu": 3,
              "classes": {"barrier": 1, "branch": 1, "int_alu": 12, "ldg32": 1, "lds128": 1, "nop": 1,
                          "prmt": 1, "sts32": 1, "tensor": 2},
              "per_imma": 10.0, "lsu_per_imma": 1.5},
    "sm_90": {"runs": ["0xf0-0x230"], "instructions": 19, "nops": 2, "imma": 2, "lsu": 3,
              "classes": {"barrier": 1, "branch": 1, "int_alu": 10, "ldg32": 1, "lds128": 1, "nop": 2,
                          "prmt": 1, "sts32": 1, "tensor": 2, "uniform": 1},
              "per_imma": 9.5, "lsu_per_imma": 1.5},
}


@pytest.mark.parametrize("arch", ARCHS)
def test_hand_counted_loop(arch, listings):
    text, dump = listings.both(LOOP, "loop", arch)
    counted = sass.analyse(sass.parse_listing(text, "tiny_loop"), arch)
    assert len(counted.loops) == 1 and counted.loops[0].paths == 1
    assert counted.tail is None  # no guarded global load: one body only
    got = counted.fast.model_dump(include=set(HAND[arch]))
    assert got == HAND[arch]
    assert agrees(counted.fast, simple_count(simple_rows(dump), body_ranges(counted.fast)))


# ---- every GEMM kernel: the module against the simple counter --------------------------
# (the float-output entries share these mainloops; the step kernels have no tensor-core loop)
GEMMS = [name for name, spec in KERNELS.items() if spec.is_gemm]


@pytest.fixture(scope="module")
def kernel_listings(listings) -> dict[tuple[str, str], tuple[str, str]]:
    return {(name, arch): listings.both(KERNELS[name].emit(), name, arch) for name in GEMMS for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel", GEMMS)
def test_kernel_counts_agree_with_cuobjdump(kernel, arch, kernel_listings):
    text, dump = kernel_listings[kernel, arch]
    counted = sass.analyse(sass.parse_listing(text, kernel), arch)
    rows = simple_rows(dump)
    start, end = simple_loop(rows)
    assert counted.steady_loop == f"{start:#x}"
    loop = next(lp for lp in counted.loops if lp.start == counted.steady_loop)
    region = simple_count(rows, [(start, end)])
    assert (loop.instructions, loop.classes.get("tensor", 0)) == (region["instructions"], region["imma"])
    bodies = [body for body in (counted.fast, counted.tail) if body is not None]
    assert counted.fast is not None
    for body in bodies:
        assert body.imma > 0 and agrees(body, simple_count(rows, body_ranges(body)))
    # the bodies together cover the whole loop: no instruction is off every path
    covered = {a for body in bodies for f, l in body_ranges(body) for a in range(f, l + 16, 16)}
    assert covered == set(range(start, end + 16, 16))
    assert counted.tail is None or counted.tail.guarded_global_loads > counted.fast.guarded_global_loads


# ---- the checks can fail --------------------------------------------------------------

def plant(text: str, after: str, line: str) -> str:
    """``text`` with ``line`` inserted after the first line containing ``after`` and every
    later address moved up by 16 (so the listing stays contiguous)."""
    out, shift = [], 0
    for row in text.splitlines():
        if shift:
            row = re.sub(r"/\*([0-9a-f]{4,})\*/", lambda m: f"/*{int(m.group(1), 16) + 16:04x}*/", row)
        out.append(row)
        if not shift and after in row:
            addr = int(re.search(r"/\*([0-9a-f]{4,})\*/", row).group(1), 16) + 16
            out.append(f"        /*{addr:04x}*/                   {line} ;")
            shift = 16
    return "\n".join(out)


def test_planted_load_is_counted_and_disagrees(listings):
    text, dump = listings.both(LOOP, "loop", "sm_80")
    planted = plant(text, "LDS.128", "LDS.128 R4, [R20+0x10]")
    body = sass.analyse(sass.parse_listing(planted, "tiny_loop"), "sm_80").fast
    assert (body.lsu, body.instructions, body.classes["lds128"]) == (4, 21, 2)
    assert not agrees(body, simple_count(simple_rows(dump), [(0xB0, 0x1F0)]))


def test_a_one_path_loop_with_a_guarded_load_is_its_own_steady_state(listings):
    text = listings.nvdisasm(LOOP, "loop", "sm_80")
    planted = text.replace("LDG.E R3, [R2.64]", "@P1 LDG.E R3, [R2.64]")
    counted = sass.analyse(sass.parse_listing(planted, "tiny_loop"), "sm_80")
    assert counted.fast.guarded_global_loads == 1 and counted.tail is None


def test_branch_around_a_load_gives_two_paths_and_the_longer_is_fast(listings):
    text = listings.nvdisasm(LOOP, "loop", "sm_80")
    # a guarded skip over the load (as ptxas emits for a divergent if): two paths
    planted = plant(text, "IMAD.MOV.U32 R3, RZ, RZ, R23", "@!P2 BRA `(.L_x_9)")
    planted = planted.replace("LDG.E R3, [R2.64] ;", "LDG.E R3, [R2.64] ;\n.L_x_9:")
    counted = sass.analyse(sass.parse_listing(planted, "tiny_loop"), "sm_80")
    assert counted.loops[0].paths == 2
    assert (counted.fast.instructions, counted.fast.lsu) == (21, 3)


def test_unknown_function_is_one_clear_error(listings):
    text = listings.nvdisasm(LOOP, "loop", "sm_80")
    with pytest.raises(sass.PtxasError, match="no instructions for function 'nope'"):
        sass.parse_listing(text, "nope")


def test_classes():
    assert [sass.classify(op) for op in ("LDG.E.U8", "LDG.E.128", "LDG.E", "LDS.64", "STS.128", "IMMA.16832.S8.S8",
                                         "ULDC.64", "LOP3.LUT", "BAR.SYNC.DEFER_BLOCKING", "S2R", "LDGSTS.E.BYPASS.128",
                                         "LDGSTS.E")] == [
        "ldg8", "ldg128", "ldg32", "lds64", "sts128", "tensor", "uniform", "int_alu", "barrier", "other", "ldgsts128",
        "ldgsts32"]  # cp.async: 16 bytes a lane (.128), 4 (no size)
    assert [sass.class_width(c) for c in ("ldg8", "lds128", "sts32", "ldgsts32", "prmt")] == [8, 128, 32, 32, None]


# ---- finding the tools ----------------------------------------------------------------

def test_bad_override_names_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("NVDISASM", str(tmp_path / "missing"))
    with pytest.raises(UserError, match=r"NVDISASM=.*missing: not an executable file"):
        sass.find_nvdisasm()


def test_missing_tool_gives_the_install_hint(monkeypatch):
    monkeypatch.delenv("NVDISASM", raising=False)
    monkeypatch.setattr(sass, "WHEEL_PACKAGE", "no_such_package_here")
    monkeypatch.setenv("PATH", "")
    with pytest.raises(UserError, match=r"nvdisasm not found: pip install nvidia-cuda-nvdisasm"):
        sass.find_nvdisasm()


def test_report_records_tool_versions(tools, tmp_path):
    spec = KERNELS["hslm_fwd_s8"]
    ptx = tmp_path / "fwd.ptx"
    ptx.write_text(spec.emit())
    report = sass.sass_report(spec.name, spec.name, ptx, ("sm_89",), tmp_path)
    # one IMMA per mma.sync m16n8k32 of the PTX: ptxas neither drops nor duplicates them
    assert (tmp_path / f"{spec.name}.sm_89.sass").read_text().count("IMMA") == spec.emit().count("mma.sync")
    assert report.nvdisasm_version == sass.disassembler_version(tools[0]) and report.ptxas_version.startswith("12.")
    fast = report.arch("sm_89").fast
    assert fast.lsu_per_imma == round(fast.lsu / fast.imma, 4) and 0 < fast.lsu < fast.instructions
    with pytest.raises(ArtifactError, match=r"no SASS counts for sm_75 \(known: sm_89\)"):
        report.arch("sm_75")


def test_only_branches_and_noinc_calls_are_jumps():
    def instr(opcode: str, target: str | None = ".L_x_0") -> sass.Instr:
        return sass.Instr(0x100, None, opcode, target)

    assert [sass.is_jump(instr(op)) for op in ("BRA", "CALL.REL.NOINC", "CALL.REL", "CALL.ABS.NOINC")] == [
        True, True, False, False]
    assert not sass.is_jump(instr("BRA", None))


# ---- the ternary decode's table stays in one register ---------------------------------

TABLE_KERNELS = ("hslm_fwd_s8", "hslm_dx_s8_m32", "hslm_fwd_splitk_bf16")  # int32, small tile, fused


def prmt_tables(ptx: str, kernel: str, arch: str, listings: Listings) -> tuple[set[str], int]:
    """The registers the fast loop body's PRMTs read their table from (operand a), and
    how many instructions of the body write one of them."""
    text = listings.nvdisasm(ptx, kernel, arch)
    body = sass.analyse(sass.parse_listing(text, kernel), arch).fast
    rows = {int(m.group(1), 16): (m.group(3), [o.strip().split(".")[0] for o in m.group(4).split(",")])
            for line in text.splitlines() if (m := sass.LINE.search(line))}
    inside = [rows[a] for first, last in body_ranges(body) for a in range(first, last + 16, 16)]
    tables = {operands[1] for opcode, operands in inside if opcode == "PRMT"}
    writes = sum(opcode != "PRMT" and operands[0] in tables for opcode, operands in inside if operands[0])
    return tables, writes


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel", TABLE_KERNELS)
def test_decode_table_is_one_register_the_loop_never_rewrites(kernel, arch, listings):
    """ptxas re-materialises a warp-uniform constant at each use; the table is a per-thread
    value (hslm_ptx.tile.operands.FragmentTernary), so every prmt reads one register."""
    tables, writes = prmt_tables(KERNELS[kernel].emit(), kernel, arch, listings)
    assert len(tables) == 1 and writes == 0


def test_a_constant_table_is_rematerialised_and_the_check_fails(listings):
    """Negative: without the per-thread add the table is a constant again, and the loop
    copies it into many registers."""
    ptx = KERNELS["hslm_fwd_s8"].emit()
    table = re.search(r"mov\.b32 (%r\d+), 0xff0100;", ptx).group(1)
    constant = re.sub(rf"\tadd\.u32 {table}, {table}, %r\d+;\n", "", ptx, count=1)
    assert constant != ptx
    tables, writes = prmt_tables(constant, "hslm_fwd_s8", "sm_80", listings)
    assert len(tables) > 1 or writes > 0
