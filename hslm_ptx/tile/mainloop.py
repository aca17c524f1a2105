"""The staged tile's chunk loop: the copy ring's prologue, one ``bar.sync`` per chunk
(after this thread's copies of the chunk have landed, ``cp.async.wait_group stages - 2``,
it publishes them to the CTA and tells every thread that the stage read in the previous
chunk is free, so the next copies may go there), the mma of the chunk, then the next
copies, then the epilogue (``hslm_ptx.tile.epilogue``).

The copies follow the mma: the barrier freed their stage either way, and there the
address arithmetic and ``cp.async`` of one warp issue in the tensor pipe's stalls
between its mma, rather than standing between the barrier and the first mma. By
ptxas's stall counts (sm_90) that takes the 32 x 128 loops' chain from 223-261 clocks a
trip to 179-197 and the 128 x 128 dW's from 328 to 261.

The loop is uniform: every thread runs ceil(K / 64) chunks, only the copy sizes differ.
One register, the first k byte of the chunk the next copies read, is the same for the
whole CTA: the loop steps it once a trip and tests it (is there a next chunk, is it
whole), and W's copies take their address and their bound from it. ptxas then needs no
reconvergence (BSSY/BSYNC) around dW's two loops, and by its stall counts (sm_90) the
32 x 128 8-warp loops' chain goes 138-155 -> 118-127 clocks a trip (``docs/performance.md``).
"""
from __future__ import annotations

from hslm_ptx.emit.ptx import Ptx
from hslm_ptx.tile.epilogue import Epilogue, Rescale, RescaledRows, emit_split_rescale
from hslm_ptx.tile.geometry import CHUNK_K
from hslm_ptx.tile.operands import Coords, Source, StagedRows


def peeled(sources: tuple[Source, ...]) -> bool:
    """Whether the whole chunks (those that end at or before K) run in a loop of their own:
    where a source's copies past K need tail arithmetic (``Source.exact_tail``)."""
    return any(src.exact_tail for src in sources)


def emit_staged(ptx: Ptx, at: Coords, a: StagedRows, b: Source, k_limit: str, out: str,
                rows: str, cols: str, out_pitch: str,
                rescale: "tuple[Rescale, dict[str, str]] | None" = None) -> None:
    """The staged chunk loop over this CTA's split of k and the int32 output (rows
    ``out_pitch`` words apart, ``Epilogue``): stored straight from the accumulators, 16
    bytes a lane, when the launch has one split; staged through the ring and added with
    red.global.add.s32 (into a zeroed output) when it has several. Rows past ``rows`` are
    neither; columns past ``cols`` are only stored, into the pitch's padding, when they
    share a lane's 16 bytes with one inside. With ``rescale`` (the :class:`Rescale` and
    the loaded parameters) the output is floats, ``out_pitch`` elements a row: with one
    split the sums are staged the same way, then rescaled and stored
    (:class:`RescaledRows`); with several they go through the partials
    (:func:`emit_split_rescale`).

    A source whose copies need tail arithmetic (``Source.exact_tail``) gets two loops of
    the same body: "chunk" while the next chunk to copy ends at or before K, copying it
    with no size arithmetic, then "chunk_tail" for the rest; each chunk runs in one of
    them, so the loops' trips are the one loop's."""
    stages, ring = at.tile.stages, a.ring
    acc = [[[ptx.mov(0) for _ in range(4)] for _ in range(at.tile.n_tiles)] for _ in range(at.tile.m_tiles)]
    # the first k byte of the chunk the next copies read: one value for the whole CTA, so
    # the loop's tests on it are uniform and ptxas needs no reconvergence around them
    k_next = ptx.mov(at.k_first)
    for stage in range(stages - 1):
        for src in (a, b):
            src.issue(stage * ring.stage_bytes, k_next)
        ptx.cp_async_commit()
        ptx.increment(k_next, CHUNK_K)
    read_stage = ptx.mov(0)
    k_end = ptx.binop("min", ptx.add(at.k_first, at.span), k_limit, "u32")
    # a trip's copies read stages - 1 chunks past the one it multiplies: after them, the
    # CTA has a next chunk while k_next is short of k_end moved as far
    copies_end = ptx.add(k_end, (stages - 1) * CHUNK_K)
    # B's copies go first where their address is one multiply-add off k_next (W's planes)
    copy_order = (b, a) if b.addressed_by_k else (a, b)
    tails = peeled((a, b))
    if tails:  # copies with tail arithmetic: whole chunks in "chunk", the rest in "chunk_tail"
        whole_until = ptx.sub(k_limit, CHUNK_K)  # a chunk is whole while its k <= K - 64
        ptx.branch("chunk_tail", guard="!" + ptx.setp("le", k_next, whole_until, "s32"))

    def chunk_loop(label: str, whole_copies: bool) -> None:
        ptx.label(label)
        ptx.cp_async_wait(stages - 2)  # this thread's copies of this chunk have landed
        ptx.barrier()  # everyone's copies are in; the previous chunk's stage is free

        def copies() -> str:
            """The ring's next copies; returns the predicate: this CTA has a next chunk."""
            write_stage = ring.step(read_stage, stages - 1)
            for src in copy_order:
                src.issue(write_stage, k_next, whole=whole_copies)
            ptx.cp_async_commit()
            ptx.increment(k_next, CHUNK_K)
            return ptx.setp("lt", k_next, copies_end, "u32")

        def multiply() -> None:
            frag_b = b.b_fragments(read_stage)
            for step, frag_a in enumerate(a.a_fragments(read_stage)):
                for mi in range(at.tile.m_tiles):
                    for ni in range(at.tile.n_tiles):
                        ptx.mma_s8(acc[mi][ni], frag_a[mi], frag_b[step][ni])

        multiply()
        more = copies()
        ring.step(read_stage, 1, into=read_stage)
        if whole_copies:  # stay while the next chunk is whole too; past the split's end, done
            next_whole = ptx.setp("le", k_next, whole_until, "s32")
            ptx.branch(label, guard=ptx.fresh("pred", "and.pred", more, next_whole))
            ptx.branch("chunks_done", guard="!" + more)
        else:
            ptx.branch(label, guard=more)

    if tails:
        chunk_loop("chunk", True)
        chunk_loop("chunk_tail", False)
        ptx.label("chunks_done")
    else:
        chunk_loop("chunk", False)
    ptx.cp_async_wait(None)  # no copy outlives the CTA or lands in the ring the output reuses

    out = Epilogue(ptx, at, acc, ring.base, b, out, rows, cols, out_pitch, ring.bytes)
    if rescale is not None:
        ptx.barrier()  # every warp's last fragments are read: the ring is free to stage the sums
        spec, p = rescale
        if spec.splits:
            ptx.branch("rescale_alone", guard=ptx.setp("eq", ptx.special("%nctaid.z"), 1, "u32"))
            partial = Epilogue(ptx, at, acc, ring.base, b, p[spec.partials], rows, cols, p["ldo"], ring.bytes)
            emit_split_rescale(ptx, at, out, partial, spec, p)
            ptx.branch("rescale_done")
            ptx.label("rescale_alone")
        writer = RescaledRows(out, spec, p)
        out.emit(writer.write_row, "rescale", prepare=writer.prepare)
        if spec.splits:
            ptx.label("rescale_done")
        return
    ptx.branch("add_out", guard=ptx.setp("gt", ptx.special("%nctaid.z"), 1, "u32"))
    out.store_fragments()
    ptx.branch("out_done")
    ptx.label("add_out")
    ptx.barrier()  # every warp's last fragments are read: the ring is free to stage the sums
    out.emit(out.added_row, "add")
    ptx.label("out_done")
