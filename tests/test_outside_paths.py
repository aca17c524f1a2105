"""The instructions a warp runs outside the steady loop (hslm_ptx.pipeline.stages.sass.outside_route):
the longest path of any launch, and the unsplit path of a launch with one split, which
stores from registers and runs none of the split-K epilogue's barrier, staging and reds.
On a small invented listing by hand, then on the int32 GEMMs as ptxas compiles them."""
from __future__ import annotations

import pytest

from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.pipeline.core.errors import UserError
from hslm_ptx.pipeline.stages import sass

I = sass.Instr

# entry: 2 instructions; steady loop 0x20-0x30; the split test; one split: STG, EXIT;
# split-K: barrier, staging, a guarded red, EXIT (the guard can skip the red)
KERNEL = [I(0x00, None, "S2R", None), I(0x10, None, "IMAD", None),
          I(0x20, None, "IMMA.16832.S8.S8", None), I(0x30, "P0", "BRA", ".L_loop"),
          I(0x40, None, "ISETP.GT.U32.AND", None), I(0x50, "P1", "BRA", ".L_split"),
          I(0x60, None, "STG.E.128", None), I(0x70, None, "EXIT", None),
          I(0x80, None, "BAR.SYNC.DEFER_BLOCKING", None), I(0x90, None, "STS.128", None),
          I(0xa0, None, "LDS", None), I(0xb0, "!P2", "BRA", ".L_skip"),
          I(0xc0, None, "REDG.E.ADD.S32.STRONG.GPU", None), I(0xd0, None, "EXIT", None)]
LABELS = {".L_loop": 0x20, ".L_split": 0x80, ".L_skip": 0xd0}
LOOP = (sass.Loop(2, 3),)  # the chunk loops


def listing(instrs: list[sass.Instr]) -> sass.Listing:
    return sass.Listing(instrs, LABELS)


def outside(code: sass.Listing, unsplit: bool = False) -> int | None:
    """The instructions of the route outside the chunk loop, NOPs excluded."""
    return sass.route_instructions(code, sass.outside_route(code, LOOP, unsplit))


def test_the_two_paths_by_hand():
    plain = listing(KERNEL)
    # entry 2 + the test and its branch 2, then the split-K side: BAR, STS, LDS, BRA, REDG, EXIT
    assert outside(plain) == 10
    # one split: entry 2 + 2, then STG and EXIT; the split side with its red skipped is not it
    assert outside(plain, unsplit=True) == 6


def test_a_barrier_before_the_last_loop_is_the_prologue_and_stays_on_the_unsplit_path():
    before = [I(0x00, None, "BAR.SYNC.DEFER_BLOCKING", None)] + KERNEL[1:]
    assert outside(listing(before), unsplit=True) == 6


def test_a_kernel_whose_every_epilogue_stages_has_no_unsplit_path():
    staged = KERNEL[:6] + [I(0x60, None, "BAR.SYNC.DEFER_BLOCKING", None)] + KERNEL[7:]
    assert outside(listing(staged), unsplit=True) is None
    assert outside(listing(staged)) == 10


def test_a_second_loop_of_the_chunk_body_is_counted_as_chunks_not_outside():
    """A source whose copies need tail arithmetic runs its last chunks in a second loop of
    the same body: its mma are chunks (the model counts every chunk on the steady body), so
    neither loop's instructions are outside; a loop without mma stays outside."""
    second = [I(0x40, None, "IMMA.16832.S8.S8", None), I(0x50, "P0", "BRA", ".L_tail")]
    instrs = KERNEL[:4] + second + [I(a + 0x20, g, op, t) for a, g, op, t in KERNEL[4:]]
    labels = {".L_loop": 0x20, ".L_tail": 0x40, ".L_split": 0xa0, ".L_skip": 0xf0}
    counted = sass.analyse(sass.Listing(instrs, labels), "sm_90")
    assert (counted.outside_path, counted.outside_path_unsplit) == (10, 6)
    assert counted.outside_unsplit_runs == ["0x0-0x10", "0x60-0x90"]
    plain = [I(a, g, "IADD3" if op.startswith("IMMA") and a == 0x40 else op, t) for a, g, op, t in instrs]
    assert sass.analyse(sass.Listing(plain, labels), "sm_90").outside_path == 12  # IADD3 and its branch


INT32_GEMMS = [name for name, spec in KERNELS.items() if spec.is_gemm]


@pytest.fixture(scope="module")
def nvdisasm():
    try:
        return sass.find_nvdisasm()
    except UserError as exc:
        pytest.skip(f"SASS tools not installed: {exc}")


@pytest.mark.parametrize("kernel", ["hslm_fwd_s8_m32", "hslm_dw_s8"])
def test_the_int32_gemms_unsplit_path_leaves_the_split_k_epilogue_out(kernel, nvdisasm, tmp_path):
    assert kernel in INT32_GEMMS
    ptx = tmp_path / f"{kernel}.ptx"
    ptx.write_text(KERNELS[kernel].emit())
    text = sass.disassemble(sass.cubin(ptx, "sm_90", tmp_path / f"{kernel}.cubin"), nvdisasm)
    counted = sass.analyse(sass.parse_listing(text, kernel), "sm_90")
    assert counted.outside_path_unsplit is not None
    # the split-K epilogue (staging through shared memory, a red per word) is most of the longest path
    assert 0 < counted.outside_path_unsplit < counted.outside_path / 1.5
