"""ldmatrix: a warp loads 8x8 matrices of 16-bit elements from shared memory.

PTX ISA 9.7.14.5.15 (warp-level matrix load, ldmatrix):
``ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared{::cta}.b16 {d0..}, [addr]``.

- Lanes 8q..8q+7 give the addresses of the 8 rows of matrix q (x1: lanes 0-7 only,
  x2: 0-15); each row is 16 bytes (8 b16), its address 16-byte aligned. Other lanes'
  addresses are ignored.
- Register q of lane l holds matrix q: row l >> 2, elements 2(l & 3) (low half) and
  2(l & 3) + 1 (high half); with ``.trans`` the matrix is transposed first, i.e. the
  low half is element l >> 2 of row 2(l & 3) and the high half that of row 2(l & 3) + 1.

It is warp-collective (``.sync.aligned``): every lane of the warp executes it. Each row
is read in the name of the lane that gave its address (race and init checks as ld.shared)
and counted in the launch's traffic as a 16-byte shared access of that lane.
"""
from __future__ import annotations

import numpy as np

from hslm_ptx.emu.async_copy import place
from hslm_ptx.emu.operands import TYPES, Rows
from hslm_ptx.emu.ops import Exec, form

ROW_BYTES = 16


@form(r"ldmatrix\.sync\.aligned\.m8n8\.x(?P<count>[124])(?P<trans>\.trans)?\.shared(?:::cta)?\.b16")
def _ldmatrix(cx, count, trans):
    count = int(count)
    dst, src = cx.nargs(2)
    regs = dst if isinstance(dst, tuple) else (dst,)
    if len(regs) != count:
        raise cx.error(f"ldmatrix .x{count} needs {{{count} registers}}")
    puts = [cx.dst(r, TYPES["b32"]) for r in regs]
    rows_at = place(cx, src, "ldmatrix", "shared", ROW_BYTES)
    lanes = 8 * count

    def run(st, m):
        sel = st.sel(m)
        warps = sel.size // 32
        giver = sel.reshape(warps, 32)[:, :lanes].ravel()
        at = rows_at.addresses(st, m, sel).reshape(warps, 32)[:, :lanes].ravel()
        rows_at.record(st, at, giver)  # bank wavefronts: 8 rows of one matrix per phase
        got = st.smem.load(at, giver, 4, 4)
        rows = got.view(np.uint8).reshape(warps, count, 8, 8, 2)  # [warp, q, row, column, byte]
        if trans:
            rows = rows.transpose(0, 1, 3, 2, 4)
        # lane l, register q: row l >> 2, columns 2(l & 3), 2(l & 3) + 1 -> 4 bytes
        words = np.ascontiguousarray(rows.view(np.uint8)).reshape(warps, count, 8, 4, 4)
        words = words.view(np.uint32)[..., 0].reshape(warps, count, 32)
        for q, put in enumerate(puts):
            v = words[:, q].ravel()
            put(st, m, v if m is None else Rows(sel, v))
    return Exec("op", run, warp=True, shared_bytes=ROW_BYTES)
