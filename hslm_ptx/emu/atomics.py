"""red / atom .global.add and atom .global.exch on 32-bit words, and the fences.

PTX ISA 9.7.13.5 (atom) and 9.7.13.6 (red): ``red{.sem}{.scope}.global.add.{s32,u32}
[a], b`` adds b to the word at a; ``atom{.sem}{.scope}.global.add.{s32,u32} d, [a], b``
also returns the word's old value in d. The address is 4-byte aligned; the sum wraps
modulo 2^32 (two's complement), so integer sums come out the same in any order.

``atom{.sem}{.scope}.global.exch.b32 d, [a], b`` stores b and returns the old word.

The order the emulator guarantees: atomic instructions apply in the order the lockstep
schedule executes them, and the threads of one instruction that hit one word in thread
order (atom's old values follow that order; hardware picks some order, which only atom
can observe). So in a split-K ticket (every CTA's thread 0 does ``atom.add`` on the
tile's ticket) the CTA that sees ``splits - 1`` is the last in that order, and every
other CTA's ticket came before its own. Shared-memory atomics are not supported
(refused at load).

Fences (PTX ISA 9.7.13.4 membar/fence) order a thread's memory accesses; the lockstep
executor already performs every access in program order and makes it visible to every
thread at once, so ``membar.{cta,gl,sys}`` and ``fence.{sc,acq_rel}.{cta,gpu,sys}``
change no data. A gpu- or system-scope fence (membar.gl/.sys, fence.*.gpu/.sys) and
each atomic move the launch's synchronisation clock, by which the cross-CTA race check
(memory.py, GlobalMemory) decides whether one CTA may read (or overwrite) what another
stored (or read): the writer's stores, then its fence, then its atomic (release), then
the reader's later atomic and its fence (acquire), PTX ISA 8.10 "Memory Consistency
Model: release and acquire patterns".
"""
from __future__ import annotations

import numpy as np

from hslm_ptx.emu.async_copy import place
from hslm_ptx.emu.operands import TYPES, per_lane
from hslm_ptx.emu.ops import form

_SEM = r"(?:\.(?:relaxed|release|acquire|acq_rel))?(?:\.(?:cta|gpu|sys))?"


def _add_in_order(words: np.ndarray, at: np.ndarray, add: np.ndarray) -> np.ndarray:
    """``words[at[i]] += add[i]`` for every i, in order; returns each i's old value."""
    order = np.argsort(at, kind="stable")
    rows, inc = at[order], add[order].astype(np.uint64)
    run = np.cumsum(inc)                                   # wraps mod 2^64, fine mod 2^32
    first = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    starts = np.repeat(first, np.diff(np.r_[first, rows.size]))
    before = run - inc - (run[starts] - inc[starts])       # sum of earlier adds to the word
    old = np.empty(at.size, np.uint32)
    old[order] = (words[rows].astype(np.uint64) + before).astype(np.uint32)
    np.add.at(words, at, add.astype(np.uint32))
    return old


def _update_words(st, m, where, value, unsigned, in_order) -> np.ndarray:
    """One atomic update of the 32-bit words the active threads of mask ``m`` address:
    ``value``'s operand seen as ``unsigned``, the accesses recorded, then ``in_order(words,
    rows, operands)`` (add or exchange, in thread order) on each global buffer the addresses
    fall in. Returns every thread's old word (0 for an inactive one), as atom returns it."""
    sel = st.sel(m)
    operand = per_lane(np.asarray(value(st, m)).view(unsigned), st.T)
    operand = operand if m is None else operand[sel]
    old = np.zeros(sel.size, np.uint32)
    at = where.addresses(st, m, sel)
    where.record(st, at, sel)
    for k, pos, rows in st.gmem.locate(at, sel, 4):
        st.gmem.writing(k, sel[pos], 4, at[pos])
        old[pos] = in_order(st.gmem.words(k), rows, operand[pos])
    st.gmem.atomic(sel)
    full = np.zeros(st.T, np.uint32)
    full[sel] = old
    return full


@form(rf"(?P<op>red|atom){_SEM}\.global\.add\.(?P<t>[su]32)")
def _atomic_add(cx, op, t):
    t = TYPES[t]
    args = cx.nargs(3 if op == "atom" else 2)
    put = cx.dst(args[0], t) if op == "atom" else None
    where, value = place(cx, args[-2], op + ".global", "global", 4), cx.src(args[-1], t)

    def run(st, m):
        old = _update_words(st, m, where, value, t.udtype,
                            _add_in_order if put is not None else _add_all)
        if put is not None:
            put(st, m, old.view(t.dtype))
    return run


def _add_all(words: np.ndarray, at: np.ndarray, add: np.ndarray) -> np.ndarray:
    """``words[at[i]] += add[i]`` for every i (red: the old values are not wanted, and a
    sum modulo 2^32 is the same in any order); returns zeros for the old values."""
    np.add.at(words, at, add.astype(np.uint32))
    return np.zeros(at.size, np.uint32)


def _exchange_in_order(words: np.ndarray, at: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``old[i] = words[at[i]]; words[at[i]] = new[i]`` for every i, in order."""
    order = np.argsort(at, kind="stable")
    rows, vals = at[order], new[order].astype(np.uint32)
    first = np.r_[True, rows[1:] != rows[:-1]]
    old_sorted = np.where(first, words[rows], np.r_[np.uint32(0), vals[:-1]])
    last = np.r_[rows[1:] != rows[:-1], True]
    old = np.empty(at.size, np.uint32)
    old[order] = old_sorted
    words[rows[last]] = vals[last]
    return old


@form(rf"atom{_SEM}\.global\.exch\.b32")
def _atomic_exchange(cx):
    d, a, b = cx.nargs(3)
    t = TYPES["b32"]
    put, where, value = cx.dst(d, t), place(cx, a, "atom.global", "global", 4), cx.src(b, t)

    def run(st, m):
        put(st, m, _update_words(st, m, where, value, np.uint32, _exchange_in_order))
    return run


@form(r"membar\.(?P<wide>cta|gl|sys)|fence\.(?:sc|acq_rel)\.(?P<scope>cta|gpu|sys)")
def _fence(cx, wide, scope):
    """A CTA-scope fence orders nothing between CTAs; a gpu/system one is what the
    cross-CTA race check counts (memory.py, GlobalMemory)."""
    cx.nargs(0)
    if "cta" in (wide, scope):
        return lambda st, m: None
    return lambda st, m: st.gmem.fence(st.sel(m))
