"""cp.async: copies global -> shared that complete only when their thread waits for them.

PTX ISA 9.7.9.25 (data movement, cp.async; cp.async.commit_group, cp.async.wait_group,
cp.async.wait_all):

- ``cp.async.ca.shared.global [dst], [src], cp-size{, src-size | ignore-src}`` with
  cp-size 4, 8 or 16; ``.cg`` only 16. Both addresses are aligned to cp-size. With
  src-size < cp-size only the first src-size bytes are read and the rest of the
  destination is zero-filled (src-size 0 reads nothing); src-size > cp-size is undefined.
  The predicate ignore-src (PTX 7.5) set means src-size 0: all cp-size bytes are zeros.
- ``commit_group`` closes this thread's copies issued since its last commit into one group;
  ``wait_group N`` returns when at most the N most recent committed groups of this
  thread are still pending; ``wait_all`` waits for every copy (committed or not).
- Only the issuing thread sees the data after its wait; other threads need a barrier.

The traffic counts (``traffic.py``) see a copy's global side for the lanes that read
(src-size > 0): a zero-filled lane asks the memory system for nothing, so a copy wholly
past an operand costs no sector. (An assumption the ISA implies but does not state; the
first GPU run's sector counters calibrate it.)

The emulator writes the bytes when the copy issues (as a shared store, so a copy into
bytes another thread touched since the last bar.sync is a race) and marks them pending;
touching a pending byte is a race. The wait writes them again in the waiting thread's
name, so a reader in another thread needs a bar.sync after the wait, like after any store.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from hslm_ptx.emu.memory import Fault, put, span_of
from hslm_ptx.emu.operands import U32, Ctx, per_lane
from hslm_ptx.emu.ops import Access, Exec, form

VALID_SIZES = {"ca": (4, 8, 16), "cg": (16,)}


class Copy(NamedTuple):
    """One cp.async executed by some threads: their destinations and the group each joins."""

    threads: np.ndarray     # global thread indices
    dst: np.ndarray         # shared offsets
    size: int
    group: np.ndarray       # per thread: its commit count at issue (the group it joins)
    source: np.ndarray      # global addresses it reads
    have: np.ndarray        # bytes it reads there (src-size: 0 for a zero fill)
    span: tuple[int, int]   # the window offsets [lo, hi) its destinations lie in


class CopyBook:
    """The launch's copies in flight and every thread's commit count."""

    def __init__(self, threads: int):
        self.committed = np.zeros(threads, np.int64)
        self.copies: list[Copy] = []

    def wait(self, smem, threads: np.ndarray, keep: int | None) -> None:
        """Settle ``threads``' copies of every group but the ``keep`` newest committed
        ones (``None``: all copies, committed or not)."""
        waiting = np.zeros(self.committed.size, bool)
        waiting[threads] = True
        limit = self.committed - (keep or 0) if keep is not None else None
        left = []
        for c in self.copies:
            done = waiting[c.threads]
            if limit is not None:
                done &= c.group < limit[c.threads]
            if not done.any():
                left.append(c)
                continue
            smem.settle(c.dst[done], c.threads[done], 4, c.size // 4)
            if not done.all():
                later = ~done
                left.append(Copy(c.threads[later], c.dst[later], c.size, c.group[later],
                                 c.source[later], c.have[later], c.span))
        self.copies = left


def _book(st) -> CopyBook:
    if st.smem.copies is None:
        st.smem.copies = st.gmem.copies = CopyBook(st.T)
    return st.smem.copies


def place(cx: Ctx, tok, opcode: str, space: str, size: int) -> Access:
    """The per-thread address ``tok`` names (``[reg+imm]``, or ``[symbol]`` in shared) as
    an access of ``size`` bytes, filed under ``opcode`` in the traffic counts."""
    base, off = cx.address(tok)
    if isinstance(off, tuple) or (base is None and space != "shared"):
        raise cx.error(f"`{tok}` cannot address {space} memory here")
    return Access(opcode, cx.ins.line, space, size, 1, base, np.uint64(off & (2 ** 64 - 1)))


def per_thread(get, st, m, sel) -> np.ndarray:
    v = per_lane(np.asarray(get(st, m)), st.T)
    return v if m is None else v[sel]


def _read_source(st, src: np.ndarray, sel: np.ndarray, size: int, have: np.ndarray) -> np.ndarray:
    """``size`` bytes per thread from global, of which only the first ``have`` exist; the
    rest are zero and never read (so a zero-filled tail may lie past the buffer)."""
    mis = (src & np.uint64(size - 1)) != 0
    if mis.any():
        i = int(np.flatnonzero(mis)[0])
        raise Fault("misaligned", sel[i], f"cp.async of {size} bytes needs a {size}-byte "
                    "aligned source", int(src[i]))
    whole = have == size
    if whole.all():
        return st.gmem.load(src, sel, 4, size // 4).view(np.uint8)
    data = np.zeros((sel.size, size), np.uint8)
    if whole.any():
        at = np.flatnonzero(whole)
        put(data, at, st.gmem.load(src[at], sel[at], 4, size // 4).view(np.uint8))
    if ((have > 0) & ~whole).any():
        for b in range(size):
            part = (have > b) & ~whole
            if part.any():
                data[part, b] = st.gmem.load(src[part] + np.uint64(b), sel[part], 1, 1)[:, 0]
    return data


@form(r"cp\.async\.(?P<level>ca|cg)\.shared(?:::cta)?\.global(?:\.L2::(?:64|128|256)B)?")
def _cp_async(cx, level):
    args = cx.nargs(3, 4)
    try:
        size = int(args[2])
    except ValueError:
        raise cx.error("cp-size must be a literal") from None
    if size not in VALID_SIZES[level]:
        raise cx.error(f"cp.async.{level} copies {' or '.join(map(str, VALID_SIZES[level]))} "
                       f"bytes, not {size}")
    dst = place(cx, args[0], "cp.async", "shared", size)
    src = place(cx, args[1], "cp.async", "global", size)
    if len(args) == 3:
        src_size = lambda st, m: np.uint32(size)  # noqa: E731
    elif isinstance(args[3], str) and args[3].lstrip("!") in cx.entry.regs \
            and cx.entry.regs[args[3].lstrip("!")] == "pred":
        ignore = cx.pred(args[3])
        src_size = lambda st, m: np.where(ignore(st, m), 0, size).astype(np.uint32)  # noqa: E731
    else:
        src_size = cx.src(args[3], U32)

    def run(st, m):
        sel = st.sel(m)
        have = per_thread(src_size, st, m, sel).astype(np.int64)
        over = have > size
        if over.any():
            i = int(np.flatnonzero(over)[0])
            raise Fault("undefined", sel[i], f"cp.async src-size {have[i]} exceeds cp-size {size}")
        source = src.addresses(st, m, sel)
        reads = have > 0  # the traffic counts see the global side of the lanes that read
        src.record(st, source[reads], sel[reads])
        data = _read_source(st, source, sel, size, have)
        where = dst.addresses(st, m, sel)
        st.smem.claim(where, sel, 4, size // 4, data.view(np.uint32))
        book = _book(st)
        dst_at = where.astype(np.int64)
        book.copies.append(Copy(sel, dst_at, size, book.committed[sel].copy(), source, have,
                                span_of(dst_at, size)))
    return Exec("op", run, shared_bytes=size)


@form(r"cp\.async\.commit_group")
def _commit(cx):
    cx.nargs(0)

    def run(st, m):
        _book(st).committed[st.sel(m)] += 1
    return run


@form(r"cp\.async\.wait_(?P<what>group|all)")
def _wait(cx, what):
    """wait_group N (N a literal); wait_all commits and waits for everything."""
    if what == "all":
        cx.nargs(0)
        keep = None
    else:
        (n,) = cx.nargs(1)
        if not n.isdigit():
            raise cx.error("cp.async.wait_group takes a literal group count")
        keep = int(n)

    def run(st, m):
        sel, book = st.sel(m), _book(st)
        if keep is None:
            book.committed[sel] += 1
        book.wait(st.smem, sel, keep)
    return run

