"""ptxas: parsing real -v output (recorded from ptxas 12.9 and 13.0), budget verdicts, lookup.

tests/data/ptxas/<version>/<case>.<arch>.stderr (+ .rc) were recorded by
tests/data/ptxas/record.sh from the PTX files beside it: small.ptx (one kernel with
1 KiB of shared memory, one with none), spill.ptx (.maxnreg 16 forces 144-byte
spills), bad.ptx (an unknown instruction on line 18), newver.ptx (.version 9.0,
which 12.9 refuses with a fatal line).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from hslm_ptx.pipeline.core.errors import PtxasError, UserError
from hslm_ptx.pipeline.core.config import ARCHS, Budget
from hslm_ptx.pipeline.core.models import PtxasUsage
from hslm_ptx.pipeline.stages.ptxas import (assemble, find_ptxas, first_error, judge, parse_verbose, ptxas_version,
                                            wheel_ptxas)

DATA = Path(__file__).parent / "data" / "ptxas"
VERSIONS = ("12.9", "13.0")
BUDGET = Budget(max_registers=128, max_shared_bytes=48 * 1024)
FIELDS = tuple(PtxasUsage.model_fields)


def usage_of(*figures: int) -> PtxasUsage:
    """PtxasUsage from (registers, spill_stores, spill_loads, shared_bytes, stack_bytes)."""
    return PtxasUsage(**dict(zip(FIELDS, figures)))


def figures(usage: PtxasUsage) -> tuple[int, ...]:
    return tuple(getattr(usage, f) for f in FIELDS)


def recorded(version: str, case: str, arch: str) -> tuple[str, int]:
    folder = DATA / version
    return ((folder / f"{case}.{arch}.stderr").read_text(),
            int((folder / f"{case}.{arch}.rc").read_text()))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("arch", ARCHS)
def test_parse_small(version, arch):
    stderr, rc = recorded(version, "small", arch)
    assert rc == 0
    found = parse_verbose(stderr)
    assert set(found) == {("smem_copy", arch), ("plain_add", arch)}
    copy, plain = found[("smem_copy", arch)], found[("plain_add", arch)]
    assert copy.shared_bytes == 1024 and plain.shared_bytes == 0  # no smem item when 0
    assert 8 <= plain.registers < copy.registers <= 16
    assert figures(copy)[1:] == (0, 0, 1024, 0) and figures(plain)[1:] == (0, 0, 0, 0)
    assert judge(arch, copy, BUDGET).problems == []


def test_parse_exact_figures():
    stderr, _ = recorded("12.9", "small", "sm_80")
    assert parse_verbose(stderr)[("smem_copy", "sm_80")] == usage_of(12, 0, 0, 1024, 0)
    stderr, _ = recorded("13.0", "small", "sm_90")  # sm_90: no cmem item on the Used line
    assert "cmem" not in stderr
    assert parse_verbose(stderr)[("plain_add", "sm_90")] == usage_of(10, 0, 0, 0, 0)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("arch", ARCHS)
def test_parse_spill_fails_the_verdict(version, arch):
    stderr, rc = recorded(version, "spill", arch)
    assert rc == 0 and "cumulative stack size" in stderr
    usage = parse_verbose(stderr)[("spill_sum", arch)]
    assert usage == usage_of(24, 144, 144, 0, 144)
    assert judge(arch, usage, BUDGET).problems == ["spills 144 bytes stores / 144 bytes loads"]


def test_budget_verdicts():
    ok = usage_of(128, 0, 0, 48 * 1024, 0)
    assert judge("sm_80", ok, BUDGET).ok
    over = ok.model_copy(update={"registers": 129, "shared_bytes": 48 * 1024 + 16})
    assert judge("sm_80", over, BUDGET).problems == [
        "129 registers > budget 128", "49168 bytes shared > budget 49152"]
    assert not judge("sm_80", ok.model_copy(update={"spill_loads": 4}), BUDGET).ok


@pytest.mark.parametrize("version", VERSIONS)
def test_first_error_line(version):
    stderr, rc = recorded(version, "bad", "sm_80")
    assert rc == 255
    assert first_error(stderr, rc) == (
        "ptxas bad.ptx, line 18; error   : Not a name of any known instruction: 'frobnicate'")


def test_unsupported_version_is_a_fatal_line():
    stderr, rc = recorded("12.9", "newver", "sm_80")
    assert rc == 255
    assert first_error(stderr, rc) == (
        "ptxas newver.ptx, line 3; fatal   : Unsupported .version 9.0; current version is '8.8'")
    assert recorded("13.0", "newver", "sm_80")[1] == 0
    assert first_error("", 3) == "ptxas exited 3: no output"


def test_unreadable_output_is_an_error_not_zeros():
    stderr, _ = recorded("12.9", "small", "sm_80")
    with pytest.raises(PtxasError, match="no register count"):
        parse_verbose(stderr.replace("Used 12 registers", "Used lots of registers"))
    no_spill_line = "\n".join(l for l in stderr.splitlines() if "stack frame" not in l)
    with pytest.raises(PtxasError, match="no stack/spill line for 'plain_add' on sm_80"):
        parse_verbose(no_spill_line)


# ---- the real ptxas -----------------------------------------------------------------

def test_find_ptxas_order(monkeypatch, tmp_path):
    monkeypatch.delenv("PTXAS", raising=False)
    wheel = wheel_ptxas()
    assert wheel is not None and wheel.parts[-4:] == ("nvidia", "cuda_nvcc", "bin", "ptxas")
    assert find_ptxas() == wheel
    monkeypatch.setenv("PTXAS", str(wheel))
    assert find_ptxas() == wheel
    monkeypatch.setenv("PTXAS", str(tmp_path / "nope"))
    with pytest.raises(UserError, match=r"^PTXAS=.*nope: not an executable file; fix it or unset PTXAS$"):
        find_ptxas()


def test_no_ptxas_says_how_to_install(monkeypatch):
    monkeypatch.delenv("PTXAS", raising=False)
    monkeypatch.setattr("hslm_ptx.pipeline.stages.ptxas.wheel_ptxas", lambda: None)
    monkeypatch.setenv("PATH", "")
    with pytest.raises(UserError) as info:
        find_ptxas()
    assert str(info.value) == (
        "ptxas not found: pip install nvidia-cuda-nvcc-cu12 (or set PTXAS=/path/to/ptxas)")


def test_assemble_with_real_ptxas(monkeypatch):
    monkeypatch.delenv("PTXAS", raising=False)
    ptxas = find_ptxas()
    version = ptxas_version(ptxas)
    assert version.count(".") == 2
    report = assemble("k", "smem_copy", DATA / "small.ptx", ("sm_80", "sm_90"), BUDGET, ptxas)
    assert report.ok and report.ptxas_version == version and report.max_registers == 128
    major_minor = ".".join(version.split(".")[:2])
    for arch in report.archs:
        want = parse_verbose(recorded(major_minor, "small", arch.arch)[0])[("smem_copy", arch.arch)]
        assert figures(arch) == figures(want)
    spilled = assemble("k", "spill_sum", DATA / "spill.ptx", ("sm_89",), BUDGET, ptxas)
    assert not spilled.ok and spilled.archs[0].spill_stores == 144
    refused = assemble("k", "smem_copy", DATA / "bad.ptx", ("sm_80", "sm_90"), BUDGET, ptxas)
    assert not refused.ok and refused.archs == [] and set(refused.errors) == {"sm_80", "sm_90"}
    assert re.search(r"bad\.ptx \(sm_80\): ptxas .*line 18; error .*'frobnicate'", refused.errors["sm_80"])
    missing = assemble("k", "missing", DATA / "small.ptx", ("sm_80",), BUDGET, ptxas)
    assert "reported no entry 'missing'" in missing.errors["sm_80"]


def test_a_tool_that_is_not_ptxas_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("PTXAS", "/bin/true")
    with pytest.raises(UserError, match=r"^PTXAS=/bin/true: '--version' printed no 'ptxas: NVIDIA .* banner: "
                                        r"it is not ptxas; pip install nvidia-cuda-nvcc-cu12"):
        find_ptxas()
    impostor = tmp_path / "ptxas"
    impostor.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.9, V12.9.86'\n")
    impostor.chmod(0o755)
    monkeypatch.setenv("PTXAS", str(impostor))
    with pytest.raises(UserError, match="it is not ptxas"):
        find_ptxas()
