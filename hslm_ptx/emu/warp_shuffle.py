"""shfl.sync: one 32-bit value per lane exchanged within a warp (PTX ISA 9.7.9.6).

``shfl.sync.mode.b32 d[|p], a, b, c, membermask``: lane ``l`` computes its source lane
from b (lane or offset, bits 4:0) and c (clamp value cval = c[4:0], segment mask
segmask = c[12:8]): maxLane = (l & segmask) | (cval & ~segmask), minLane = l & segmask;

- up:   j = l - b, valid when j >= maxLane
- down: j = l + b, valid when j <= maxLane
- bfly: j = l ^ b, valid when j <= maxLane
- idx:  j = minLane | (b & ~segmask), valid when j <= maxLane

d = a of lane j when valid, else the lane's own a; p (optional) = valid.

It is warp-collective: the ISA leaves the result undefined when the executing thread is
not in its membermask, and a lane's value is unpredictable unless that lane executes
the instruction. So the emulator refuses: a thread outside its own membermask; a lane
of a membermask that does not execute the instruction with it (a partial warp's
missing lanes never do); and reading a lane outside the reader's membermask.
"""
from __future__ import annotations

import numpy as np

from hslm_ptx.emu.async_copy import per_thread
from hslm_ptx.emu.memory import Fault
from hslm_ptx.emu.operands import PRED, TYPES, U32, per_lane
from hslm_ptx.emu.ops import form

B32 = TYPES["b32"]


def _lanes_executing(st, m, sel: np.ndarray) -> np.ndarray:
    """For each executing thread, the bit mask of its warp's executing lanes."""
    bits = np.zeros(st.T, np.int64)
    bits[sel] = np.int64(1) << st.special["laneid"][sel].astype(np.int64)
    return np.add.reduceat(bits, st.warp_start)[st.warp_index[sel]]


def _source_lane(mode: str, lane, b, c):
    """(j, valid) of PTX ISA 9.7.9.6's semantics, per lane."""
    bval, cval, seg = b & 31, c & 31, (c >> 8) & 31
    max_lane = (lane & seg) | (cval & ~seg)
    if mode == "up":
        j = lane - bval
        return j, j >= max_lane
    if mode == "down":
        j = lane + bval
    elif mode == "bfly":
        j = lane ^ bval
    else:
        j = (lane & seg) | (bval & ~seg)
    return j, j <= max_lane


@form(r"shfl\.sync\.(?P<mode>up|down|bfly|idx)\.b32")
def _shfl(cx, mode):
    d, a, b, c, mask = cx.nargs(5)
    dests = [x.strip() for x in d.split("|")] if isinstance(d, str) else []
    if not 1 <= len(dests) <= 2:
        raise cx.error("shfl.sync destination must be `d` or `d|p`")
    put = cx.dst(dests[0], B32)
    put_valid = cx.dst(dests[1], PRED) if len(dests) == 2 else None
    ga, gb, gc, gmask = cx.src(a, B32), cx.src(b, U32), cx.src(c, U32), cx.src(mask, U32)

    def int64_of(get, st, m, sel) -> np.ndarray:
        return per_thread(get, st, m, sel).astype(np.int64)

    def run(st, m):
        sel = st.sel(m)
        lane = st.special["laneid"][sel].astype(np.int64)
        member = int64_of(gmask, st, m, sel) & 0xFFFFFFFF
        outside = ((member >> lane) & 1) == 0
        if outside.any():
            i = int(np.flatnonzero(outside)[0])
            raise Fault("undefined", sel[i], f"shfl.sync by a thread outside its membermask "
                        f"{int(member[i]):#010x}")
        absent = member & ~_lanes_executing(st, m, sel)
        if absent.any():
            i = int(np.flatnonzero(absent)[0])
            k = (int(absent[i]) & -int(absent[i])).bit_length() - 1      # the lowest
            raise Fault("divergence", sel[i], f"lane {k} of membermask {int(member[i]):#010x} "
                        "does not execute this shfl.sync (every lane of the mask must)")
        j, valid = _source_lane(mode, lane, int64_of(gb, st, m, sel), int64_of(gc, st, m, sel))
        j = np.where(valid, j, lane)
        foreign = ((member >> j) & 1) == 0
        if foreign.any():
            i = int(np.flatnonzero(foreign)[0])
            raise Fault("undefined", sel[i], f"shfl.sync reads lane {int(j[i])}, outside the "
                        f"membermask {int(member[i]):#010x} (its value is unpredictable)")
        values = per_lane(np.asarray(ga(st, m)).view(np.uint32), st.T)
        out = np.zeros(st.T, np.uint32)
        out[sel] = values[sel - lane + j]
        put(st, m, out)
        if put_valid is not None:
            flag = np.zeros(st.T, bool)
            flag[sel] = valid
            put_valid(st, m, flag)
    return run
