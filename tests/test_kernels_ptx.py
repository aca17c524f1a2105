"""What the emitted PTX promises, read off the text: target, decode form, tensor-core op,
and the shape of the staged chunk loops (copies ahead, wait, barrier, ldmatrix): one
loop, or for dW, whose A copies stop at R, a loop of whole chunks and a tail loop.

The numbers that matter (exact results) come from running this PTX on the emulator
(tests/test_kernels_run.py) and on a GPU; these tests pin the structural contract the
README describes so a refactor of the emitters cannot drop it silently.
"""
import re

import pytest
from kernelcases import INT32_EPILOGUE, STAGED, TERNARY, TWO_STAGED, per_kernel, tile_of

from hslm_ptx.catalog.registry import KERNELS, get_kernel
from hslm_ptx.tile.geometry import TILE_N
from hslm_ptx.tile import mainloop
from hslm_ptx.tile.operands import FragmentTernary, StagedRows

MMA = "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"
COPY = r"cp\.async\.cg\.shared\.global \[[^]]+\], \[[^]]+\], 16, (%[pr]\d+);"


def loop(ptx: str, label: str = "chunk") -> str:
    """The chunk loop at ``label``: from the label to its back edge."""
    assert f"\n{label}:\n" in ptx, f"no loop {label}"
    return ptx.split(f"\n{label}:\n", 1)[1].split(f"bra.uni {label};", 1)[0]


def loop_labels(ptx: str) -> list[str]:
    """The labels a later branch returns to (the loops), in the order they appear."""
    labels = re.findall(r"^(\w+):$", ptx, re.M)
    return [label for label in labels if f"bra.uni {label};" in ptx.split(f"\n{label}:\n", 1)[1]]


def chunk_loops(name: str) -> list[str]:
    """The loops ``name`` should have: dW's A copies have an exact tail at R, so whole
    chunks run in "chunk" and the chunks that reach past R in "chunk_tail"."""
    return ["chunk", "chunk_tail"] if name in TWO_STAGED else ["chunk"]


@pytest.mark.parametrize("name", per_kernel())
def test_emission_is_deterministic_and_targets_sm80(name):
    ptx = KERNELS[name].emit()
    assert ptx == KERNELS[name].emit()
    assert ".version 8.0\n.target sm_80\n.address_size 64" in ptx
    assert f".visible .entry {name}(" in ptx


def check_loops_are_uniform_bodies_of_all_mma(name: str, ptx: str) -> None:
    tile, labels = tile_of(name), chunk_loops(name)
    per_chunk = tile.m_tiles * tile.n_tiles * 2  # m16 x n8 tiles x 2 k steps per warp
    assert loop_labels(ptx) == labels
    for label in labels:
        body = loop(ptx, label)
        assert body.count(MMA) == per_chunk and body.count("bar.sync 0;") == 1  # one barrier per chunk
    assert ptx.count(MMA) == per_chunk * len(labels)
    # the loops, then the output: stored from the accumulators with one split, staged and
    # added with several, where a warp skips reading back rows past the last: m_tiles
    # passes x 4 rows
    targets = re.findall(r"\bbra\.uni (\w+);", ptx)
    skips = [t for t in targets if re.fullmatch(r"add_written_\d_\d", t)]
    # dW: into the tail loop when the first chunk is not whole; back while the next chunk
    # exists and is whole, out when none exists, else on into the tail loop
    loops = ["chunk_tail", "chunk", "chunks_done", "chunk_tail"] if len(labels) == 2 else ["chunk"]
    assert [t for t in targets if t not in skips] == loops + ["add_out", "out_done"]
    assert len(skips) == len(set(skips)) == tile.m_tiles * tile.rows_read_back
    assert len(re.findall(r"\bbra\b", ptx)) == len(targets)
    if len(labels) == 2:
        whole = re.search(r"setp\.le\.s32 (%p\d+), (%r\d+), (%r\d+);\n\t@!\1 bra\.uni chunk_tail;\nchunk:\n", ptx)
        assert whole, "the first chunk's whole test does not pick the loop"
        main, tail = loop(ptx, "chunk"), loop(ptx, "chunk_tail")
        next_whole = re.search(rf"setp\.le\.s32 (%p\d+), {whole[2]}, {whole[3]};", main)  # same test, next chunk
        more = re.search(r"setp\.lt\.u32 (%p\d+), ", main)
        assert next_whole and more
        both = re.search(rf"and\.pred (%p\d+), {more[1]}, {next_whole[1]};", main)
        assert both and main.endswith(f"@{both[1]} ")
        assert f"@{both[1]} bra.uni chunk;\n\t@!{more[1]} bra.uni chunks_done;\nchunk_tail:\n" in ptx
        tail_more = re.search(r"setp\.lt\.u32 (%p\d+), ", tail)
        assert tail_more and f"@{tail_more[1]} bra.uni chunk_tail;\nchunks_done:\n" in ptx


@pytest.mark.parametrize("name", per_kernel(INT32_EPILOGUE))
def test_staged_loops_are_uniform_bodies_of_all_mma(name):
    check_loops_are_uniform_bodies_of_all_mma(name, KERNELS[name].emit())


@pytest.mark.parametrize("name", per_kernel(INT32_EPILOGUE))
def test_output_is_stored_or_added_once_per_accumulator(name):
    ptx, tile = KERNELS[name].emit(), tile_of(name)
    stores, adds = ptx.split("add_out:\n", 1)
    per_lane = tile.m_tiles * tile.n_tiles * 4  # m16 x n8 tiles x 4 elements per lane
    assert 4 * len(re.findall(r"@%p\d+ st\.global\.v4\.b32", stores)) == per_lane  # four a store
    assert len(re.findall(r"@%p\d+ red\.global\.add\.s32", adds)) == per_lane
    assert "red.global.add" not in stores and " st.global" not in adds and "st.global.s32" not in ptx


@pytest.mark.parametrize("name", per_kernel(INT32_EPILOGUE))
def test_one_split_stores_from_registers_and_split_k_stages_one_pass_per_m_tile(name):
    ptx, tile = KERNELS[name].emit(), tile_of(name)
    passes, runs = tile.m_tiles, tile.n_tiles // 2  # runs of four columns a lane holds in a row
    after = ptx.split("bra.uni chunk;", 1)[1]
    assert after.index("cp.async.wait_all") < after.index("bra.uni add_out;")
    stores, adds = after.split("bra.uni add_out;", 1)[1].split("add_out:\n", 1)
    # one split: each lane's rows g and g + 8 of each m tile, one 16-byte store per run of
    # four columns, guarded by row and run; no shared memory, no barrier
    assert len(re.findall(r"@%p\d+ st\.global\.v4\.b32", stores)) == stores.count("st.global") == 2 * passes * runs
    assert "shared" not in stores and "bar.sync" not in stores
    # split-K: the ring is free (a barrier), then per pass a lane's fragment row, four
    # consecutive columns per n tile pair: a v4 per run and row half, written / read back
    # with a barrier each
    assert adds.index("bar.sync 0;") < adds.index("st.shared")
    assert len(re.findall(r"st\.shared\.v4\.b32 \[", adds)) == adds.count("st.shared") == 2 * runs * passes
    assert adds.count("bar.sync 0;") == 2 * passes
    # read back as words, one per output element: 4 column groups of each row a warp reads
    assert adds.count("ld.shared.b32") == 4 * tile.rows_read_back * passes


def check_loops_copy_ahead_and_read_fragments_with_ldmatrix(name: str, ptx: str) -> None:
    tile, labels = tile_of(name), chunk_loops(name)
    stages = tile.stages  # 16-byte copies per thread and chunk: A's rows, and dW's B rows
    two_staged = name not in TERNARY  # B by cp.async too (dW), else decoded from W in registers
    copies = tile.copies(tile.m) + (tile.copies(TILE_N) if two_staged else 0)
    assert loop_labels(ptx) == labels
    for label in labels:  # each loop copies one chunk ahead and multiplies one
        body = loop(ptx, label)
        assert len(re.findall(COPY, body)) == copies
        assert body.count("cp.async.commit_group") == 1
        assert body.count(f"cp.async.wait_group {stages - 2};") == 1  # this chunk landed, newer in flight
        a_loads = 2 * tile.m_tiles  # A: m tiles x 2 k steps; B: one per n tile (dW), none in registers (W)
        b_loads = tile.n_tiles if two_staged else 0
        assert body.count("ldmatrix.sync.aligned.m8n8.x4.shared.b16") == a_loads + b_loads and ".trans" not in body
        # no byte or scalar gathers; W through the ring comes back as one vector load a lane
        w_reads = 0 if two_staged else 1
        assert body.count("ld.shared") == body.count(f"ld.shared.v{tile.n_tiles}.u32") == w_reads
        assert "ld.global.u8" not in body
    groups = stages - 1 + len(labels)  # stages - 1 chunks ahead, then one in each loop's body
    assert ptx.count("cp.async.cg") == groups * copies and ptx.count("cp.async.commit_group") == groups


@pytest.mark.parametrize("name", per_kernel(STAGED))
def test_staged_loop_copies_ahead_and_reads_fragments_with_ldmatrix(name):
    check_loops_copy_ahead_and_read_fragments_with_ldmatrix(name, KERNELS[name].emit())


def copies_follow_the_mma(body: str) -> bool:
    """The trip's ring copies all come after its last mma (the copies' arithmetic issues in
    the tensor pipe's stalls), rather than all before its first."""
    copies = [m.start() for m in re.finditer(r"cp\.async\.c[ag]\.shared", body)]
    mmas = [m.start() for m in re.finditer(re.escape(MMA), body)]
    assert copies and mmas and (min(copies) > max(mmas) or max(copies) < min(mmas))  # never interleaved
    return min(copies) > max(mmas)


@pytest.mark.parametrize("name", per_kernel(STAGED))
def test_staged_loop_copies_after_the_mma(name):
    """Each trip multiplies first and copies after: the copies' address arithmetic issues
    in the tensor pipe's stalls between a warp's mma."""
    ptx = get_kernel(name).emit()
    for label in chunk_loops(name):
        assert copies_follow_the_mma(loop(ptx, label))


def test_copies_before_the_mma_are_told_apart():
    """Negative for the test above: the same trip with its copies moved before the mma."""
    body = loop(get_kernel("hslm_fwd_s8").emit())
    lines = body.splitlines(keepends=True)
    copies = [line for line in lines if "cp.async" in line]
    reordered = "".join(copies + [line for line in lines if "cp.async" not in line])
    assert copies_follow_the_mma(body) and not copies_follow_the_mma(reordered)


@pytest.mark.parametrize("name", per_kernel(TERNARY))
def test_ternary_kernels_decode_w_into_the_mma_b_registers(name):
    """Each lane decodes one word per n tile (4 prmt each), and the decoded registers are
    the mma's B operands: no shared store or ldmatrix for B. The words come back through
    the ring after the barrier, from the stage being multiplied, in one 16-byte load."""
    ptx = get_kernel(name).emit()
    body = loop(ptx)
    table = re.search(r"mov\.b32 (%r\d+), 0xff0100;", ptx).group(1)
    decoded = re.findall(rf"prmt\.b32 (%r\d+), {table}, 0, %r\d+;", body)
    b_operands = set(re.findall(r"mma\.sync[^\n]*\{[^}]*\}, \{[^}]*\}, \{(%r\d+), (%r\d+)\}", body))
    tile = tile_of(name)
    assert len(decoded) == 4 * tile.n_tiles and {r for pair in b_operands for r in pair} == set(decoded)
    assert "st.shared" not in body
    words = re.search(rf"ld\.shared\.v{tile.n_tiles}\.u32 \{{" + ", ".join([r"(%r\d+)"] * tile.n_tiles) + r"\}", body)
    assert body.index("bar.sync") < words.start() < body.index("prmt.b32") and "ld.global" not in body
    after = body[words.end():]
    assert all(re.search(rf", {word}[,;]", after) for word in words.groups())  # each word is decoded


def check_w_copies(name: str, ptx: str) -> None:
    """W's planes are padded to the tile, so no word is clamped or bounds-guarded: the
    copies of a chunk (one per n tile) share one ignore-src predicate (the chunk starts at
    or past K) and one address (this lane's words plus the chunk's k times the plane bytes
    a byte of k takes), each an immediate offset from it, both from the CTA's one k, which
    the loop steps a chunk a trip; into this lane's 16 bytes of the stage; with more than
    one warp row, all under one guard, set from the warp row being 0 (the other rows read
    the first row's words)."""
    body = loop(ptx)
    tile = tile_of(name)
    copies = re.findall(r"(?:@(%p\d+) )?cp\.async\.ca\.shared\.global \[(%r\d+)(?:\+(\d+))?\], "
                        r"\[(%rd\d+)(?:\+\d+)?\], 4, (%p\d+);", body)
    assert len(copies) == tile.n_tiles and len({(g, dst, ptr, pred) for g, dst, _, ptr, pred in copies}) == 1
    assert [int(offset or 0) for _, _, offset, _, _ in copies] == [4 * ni for ni in range(tile.n_tiles)]
    guard, _, _, ptr, pred = copies[0]
    k = re.search(rf"setp\.ge\.u32 {pred}, (%r\d+), %r\d+;", body).group(1)
    product = re.search(rf"add\.s64 {ptr}, %rd\d+, (%rd\d+);", body).group(1)
    assert re.search(rf"mul\.wide\.u32 {product}, {k}, %r\d+;", body) and "min.u32" not in body
    assert re.search(rf"add\.u32 {k}, {k}, 64;", body)  # the CTA's k walks a chunk a trip
    if tile.warps_m == 1:
        assert guard == ""
    else:
        warp_m = re.search(rf"and\.b32 (%r\d+), %r\d+, {tile.warps_m - 1};", ptx).group(1)
        assert re.search(rf"setp\.eq\.u32 {guard}, {warp_m}, 0;", ptx)


@pytest.mark.parametrize("name", per_kernel(TERNARY))
def test_ternary_kernels_copy_w_from_the_ctas_k_in_the_first_warp_row(name):
    check_w_copies(name, get_kernel(name).emit())


@pytest.mark.parametrize("name", ["hslm_fwd_s8", "hslm_dx_s8_m32n16"])
def test_the_w_copy_check_fails_for_a_w_that_does_not_walk_with_k(name, monkeypatch):
    """Negative: W's copies from a copy of k taken before the loop (so every trip would
    copy the same plane) fail the check."""
    issue = FragmentTernary.issue
    frozen = {}

    def stale_k(self, stage, k, whole=False):
        if k not in frozen:
            frozen[k] = self.ptx.mov(k)
        issue(self, stage, frozen[k], whole)

    with monkeypatch.context() as patch:
        patch.setattr(FragmentTernary, "issue", stale_k)
        wrong = get_kernel(name).emit()
    assert wrong != get_kernel(name).emit()
    with pytest.raises(AssertionError):
        check_w_copies(name, wrong)


def check_dw_copies(name: str, ptx: str) -> None:
    tile = tile_of(name)
    a_copies, b_copies = tile.copies(tile.m), tile.copies(TILE_N)
    assert loop_labels(ptx) == ["chunk", "chunk_tail"]
    main, tail = loop(ptx, "chunk"), loop(ptx, "chunk_tail")
    for body in (main, tail):
        assert "ld.global" not in body and "st.shared" not in body  # everything by cp.async
    main_fills, tail_fills = re.findall(COPY, main), re.findall(COPY, tail)
    # B: whole pieces or none (ignore-src) in both loops. A, in whole chunks: whole pieces,
    # or none for a row past the last, under predicates set once before the loop, with no
    # size arithmetic; in the tail loop: src-size stops at R, one size for all rows
    assert [f[:2] for f in main_fills] == ["%p"] * (a_copies + b_copies)
    assert [f[:2] for f in tail_fills] == ["%r"] * a_copies + ["%p"] * b_copies
    for pred in main_fills[:a_copies]:
        assert re.search(rf"setp\.ge\.u32 {pred}, ", ptx) and not re.search(rf"\s{pred}, ", main)
    assert "min.s32" not in main and "max.s32" not in main
    assert tail.count("max.s32") == 1 and tail.count("min.s32") == 1


@pytest.mark.parametrize("name", per_kernel(TWO_STAGED))
def test_dw_is_a_tn_gemm_of_two_copied_operands(name):
    check_dw_copies(name, get_kernel(name).emit())


def wrong_dw_kernels(name: str, monkeypatch) -> dict[str, str]:
    """dW emitted wrong three ways: without the peel (one loop, tail arithmetic every
    chunk), with the peel but the tail arithmetic in both loops, and with whole-chunk
    copies in both loops (reading past R)."""
    issue = StagedRows.issue
    wrong = {}
    with monkeypatch.context() as patch:
        patch.setattr(mainloop, "peeled", lambda sources: False)
        wrong["one loop"] = get_kernel(name).emit()
    with monkeypatch.context() as patch:
        patch.setattr(StagedRows, "issue", lambda self, stage, k, whole=False: issue(self, stage, k, whole=False))
        wrong["tail copies in both"] = get_kernel(name).emit()
    with monkeypatch.context() as patch:
        patch.setattr(StagedRows, "issue",
                      lambda self, stage, k, whole=False: issue(self, stage, k, whole=self.exact_tail))
        wrong["whole copies in both"] = get_kernel(name).emit()
    assert len(set(wrong.values()) | {get_kernel(name).emit()}) == 4  # each patch changed the PTX
    return wrong


@pytest.mark.parametrize("name", per_kernel(TWO_STAGED))
def test_loop_checks_fail_for_a_wrong_dw(name, monkeypatch):
    wrong = wrong_dw_kernels(name, monkeypatch)
    checks = {check_loops_are_uniform_bodies_of_all_mma: ["one loop"],
              check_loops_copy_ahead_and_read_fragments_with_ldmatrix: ["one loop"],
              check_dw_copies: list(wrong)}
    for check, kinds in checks.items():
        for kind in kinds:
            with pytest.raises(AssertionError):
                check(name, wrong[kind])


def test_unknown_kernel_names_the_known_ones():
    known = "hslm_fwd_s8, hslm_fwd_s8_m32, hslm_fwd_s8_m32n16, hslm_dx_s8"
    with pytest.raises(KeyError, match=f"unknown kernel 'fwd'; known: {known}"):
        get_kernel("fwd")
