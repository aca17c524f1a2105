"""The lockstep executor: every thread of every CTA of a launch in one set of arrays.

Scheduling is min-PC: each step runs the instruction at the smallest PC among the
threads still running, for exactly the threads at that PC. Uniform code therefore
runs once for all threads; a divergent forward branch runs its sides one after the
other and reconverges where the PCs meet again; loops with per-thread trip counts
work the same way. While all running threads share one PC the executor keeps it as a
Python int and passes the mask ``None`` (no masking anywhere: the fast path).

Strictness that needs the schedule lives here: ``bra.uni`` must be uniform within
each warp (as PTX defines it; different warps may go different ways); ``mma`` needs all 32 lanes of each warp that executes it;
``bar.sync`` needs every running thread of the CTA there (exited threads do
not count) and then closes the CTA's shared-memory race window. Threads that reach a
bar.sync before the rest of their CTA wait there (PC parked) while the others run on;
the barrier opens when every running thread of the CTA waits at it, so the common
`if (i >= n) return; ... __syncthreads()` is fine, and waiting at two different
barriers is a divergence error.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np

from kernels.ptxemu import async_copy, atomics, ldmatrix  # noqa: F401 (their forms join ops.FORMS)
from kernels.ptxemu.memory import Fault, GlobalMemory, SharedMemory
from kernels.ptxemu.operands import TYPES, Ctx, State
from kernels.ptxemu.ops import Exec, decode
from kernels.ptxemu.parse import EmulatorError, Entry, Instr, fmt3, parse

DONE = np.iinfo(np.int32).max      # the PC of an exited thread
WAIT = DONE - 1                     # the PC of a thread waiting at a bar.sync


class Step(NamedTuple):
    ins: Instr
    guard: Any          # getter of the guard predicate (negation folded in), or None
    ex: Exec


class LaunchStats(NamedTuple):
    """What one launch issued, counted as the hardware counts: one per warp that reaches
    an instruction, predicated-off or not (a guard does not take back the issue slot)."""

    warp_instructions: int
    by_opcode: dict[str, int]  # "ld.global", "ld.shared", "mma", "prmt", ... -> count

    def per(self, opcode: str) -> float:
        """Warp instructions issued per ``opcode`` instruction (e.g. per mma)."""
        return self.warp_instructions / max(1, self.by_opcode.get(opcode, 0))


def opcode_class(op: str) -> str:
    """The name statistics group by: memory ops keep their state space."""
    words = op.split(".")
    space = next((w for w in words[1:] if w in ("global", "shared", "param")), None)
    return f"{words[0]}.{space}" if words[0] in ("ld", "st") and space else words[0]


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def _dim3(v: Any, what: str, line: int) -> tuple[int, int, int]:
    t = tuple(v) if isinstance(v, (tuple, list)) else (v,)
    if not 1 <= len(t) <= 3 or not all(isinstance(x, (int, np.integer)) and x >= 1
                                       for x in t):
        raise EmulatorError("launch", line, "", f"{what} must be 1 to 3 positive ints, "
                                                f"got {v!r}")
    return tuple(int(x) for x in t) + (1,) * (3 - len(t))


class Function:
    """One decoded ``.entry``; call it as CuPy's RawKernel: ``fn(grid, block, args)``."""

    def __init__(self, entry: Entry, strict_shared_init: bool = True):
        self.entry, self.name, self.strict_shared_init = entry, entry.name, strict_shared_init
        self.stats: LaunchStats | None = None  # of the last launch
        offsets, end, ext_align = {}, 0, 0
        for sym, align, nbytes, _ in entry.shared:
            if nbytes is not None:
                end = _align(end, align)
                offsets[sym], end = end, end + nbytes
            else:
                ext_align = max(ext_align, align)
        self.static_shared = end
        self.extern_offset = _align(end, ext_align) if ext_align else None
        for sym, _, nbytes, _ in entry.shared:
            if nbytes is None:
                offsets[sym] = self.extern_offset
        self.param_offsets, pend = {}, 0
        for name, ty in entry.params:
            size = TYPES[ty].bits // 8
            pend = _align(pend, size)
            self.param_offsets[name], pend = (pend, ty), pend + size
        self.param_bytes = pend
        self.steps = [self._decode(ins, offsets) for ins in entry.body]
        end = entry.body[-1].line if entry.body else entry.line    # falling off the end
        self.steps.append(Step(Instr(end, "(end of kernel)", None, "exit", ()), None,
                               Exec("exit")))
        # race tracking grain: the smallest shared access (all are aligned to their size)
        self.grain = min([s.ex.shared_bytes for s in self.steps if s.ex.shared_bytes] + [16])

    def _decode(self, ins: Instr, shared_offsets: dict[str, int]) -> Step:
        cx = Ctx(self.entry, ins, shared_offsets, self.param_offsets)
        guard = None
        if ins.guard is not None:
            reg, neg = ins.guard
            guard = cx.pred(("!" if neg else "") + reg)
        return Step(ins, guard, decode(cx))

    # ---- launch -----------------------------------------------------------------------

    def _bind(self, args: Sequence[Any]) -> tuple[bytes, list[tuple[str, np.ndarray]]]:
        """Parameter bytes (arrays become fake global addresses) and the buffer list."""
        line = self.entry.line
        params = self.entry.params
        if not isinstance(args, (list, tuple)) or len(args) != len(params):
            n = len(args) if isinstance(args, (list, tuple)) else type(args).__name__
            raise EmulatorError("launch", line, "", f"{self.name} takes {len(params)} "
                                f"arguments ({', '.join(p for p, _ in params)}), got {n}")
        blob, buffers = bytearray(self.param_bytes), []
        for (name, ty), arg in zip(params, args):
            off, _ = self.param_offsets[name]
            size = TYPES[ty].bits // 8
            if isinstance(arg, np.ndarray) and arg.ndim > 0:
                if size != 8:
                    raise EmulatorError("launch", line, "", f"parameter '{name}' is .{ty}, "
                                        "an array (a 64-bit address) cannot go there")
                if not arg.flags.c_contiguous:
                    raise EmulatorError("launch", line, "", f"array for '{name}' must be "
                                        "C-contiguous (use np.ascontiguousarray)")
                value = GlobalMemory.base(len(buffers))
                buffers.append((name, arg))
            elif isinstance(arg, np.generic) and np.issubdtype(arg.dtype, np.integer):
                if arg.dtype.itemsize != size:
                    raise EmulatorError("launch", line, "", f"parameter '{name}' is .{ty} "
                                        f"({size} bytes), got {arg.dtype} "
                                        f"({arg.dtype.itemsize} bytes)")
                value = int(arg) & ((1 << (8 * size)) - 1)
            else:
                raise EmulatorError("launch", line, "", f"argument for '{name}' must be a "
                                    "numpy array or numpy integer scalar (e.g. np.uint32(n)),"
                                    f" got {type(arg).__name__}")
            blob[off:off + size] = value.to_bytes(size, "little")
        return bytes(blob), buffers

    def __call__(self, grid, block, args, shared_mem: int = 0) -> None:
        line = self.entry.line
        g, b = _dim3(grid, "grid", line), _dim3(block, "block", line)
        tpc, ctas = b[0] * b[1] * b[2], g[0] * g[1] * g[2]
        if tpc > 1024:
            raise EmulatorError("launch", line, "", f"block {b} has {tpc} threads, over 1024")
        if not isinstance(shared_mem, (int, np.integer)) or shared_mem < 0:
            raise EmulatorError("launch", line, "", f"shared_mem must be an int >= 0, "
                                                    f"got {shared_mem!r}")
        params, buffers = self._bind(args)
        window = self.static_shared
        if self.extern_offset is not None:
            window = max(window, self.extern_offset + int(shared_mem))
        T = tpc * ctas
        tl, cl = np.arange(T, dtype=np.uint32) % tpc, np.arange(T, dtype=np.uint32) // tpc
        special: dict[str, Any] = {"laneid": tl % 32}
        for reg, lin, dims in (("tid", tl, b), ("ctaid", cl, g)):
            special[f"{reg}.x"] = lin % dims[0]
            special[f"{reg}.y"] = (lin // dims[0]) % dims[1]
            special[f"{reg}.z"] = lin // (dims[0] * dims[1])
        for reg, dims in (("ntid", b), ("nctaid", g)):
            for axis, v in zip("xyz", dims):
                special[f"{reg}.{axis}"] = np.uint32(v)
        st = State(T, special, params, GlobalMemory(buffers),
                   SharedMemory(ctas, tpc, window, self.strict_shared_init, self.grain),
                   tpc)
        self._grid, self._block = g, b
        warps = np.arange(T) // tpc * -(-tpc // 32) + tl // 32
        issued = np.zeros(len(self.steps), np.int64)
        self._run(st, issued, warps)
        by_opcode: dict[str, int] = {}
        for step, count in zip(self.steps, issued.tolist()):
            if count:
                name = opcode_class(step.ins.op)
                by_opcode[name] = by_opcode.get(name, 0) + count
        self.stats = LaunchStats(int(issued.sum()), by_opcode)

    # ---- the executor -------------------------------------------------------------------

    def _where(self, thread: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """Global thread index -> (ctaid, tid)."""
        (bx, by, bz), (gx, gy, _gz) = self._block, self._grid
        tpc = bx * by * bz
        c, t = divmod(int(thread), tpc)
        return ((c % gx, c // gx % gy, c // (gx * gy)), (t % bx, t // bx % by, t // (bx * by)))

    def _fail(self, kind: str, ins: Instr, thread: int, detail: str = "",
              address: int | None = None) -> EmulatorError:
        ctaid, tid = self._where(thread)
        return EmulatorError(kind, ins.line, ins.text, detail, ctaid, tid, address)

    def _fault(self, f: Fault, ins: Instr) -> EmulatorError:
        detail = f.detail
        if f.other is not None:
            detail += f"; other thread tid={fmt3(self._where(f.other)[1])}"
        return self._fail(f.kind, ins, f.thread, detail, f.address)

    def _warp_check(self, st: State, m, ins: Instr) -> None:
        if st.tpc % 32:
            first = 0 if m is None else int(np.flatnonzero(m)[0])
            raise self._fail("divergence", ins, first, f"a warp-collective instruction needs "
                             f"whole warps; the block has {st.tpc} threads")
        if m is None:
            return
        mw = m.reshape(-1, 32)
        bad = mw.any(1) & ~mw.all(1)
        if bad.any():
            w = int(np.flatnonzero(bad)[0])
            lanes = mw[w]
            raise self._fail("divergence", ins, w * 32 + int(np.flatnonzero(lanes)[0]),
                             f"only {int(lanes.sum())} of 32 lanes of the warp execute it "
                             f"(lane {int(np.flatnonzero(~lanes)[0])} does not)")

    def _release(self, st: State, pcs: np.ndarray) -> None:
        """Open the barrier of every CTA whose running threads all wait at one.

        Waiting threads sit at PC ``WAIT`` (never the minimum) with their barrier's PC
        in ``self._waitpc``. Threads that exited do not count, as on hardware; threads
        of one CTA waiting at different bar.sync instructions are a divergence error."""
        waiting = (pcs == WAIT).reshape(-1, st.tpc)
        running = (pcs != DONE).reshape(-1, st.tpc)
        ready = waiting.any(1) & (waiting.sum(1) == running.sum(1))
        if not ready.any():
            return
        ctas = np.flatnonzero(ready)
        rows = waiting[ctas]
        wpc = np.where(rows, self._waitpc.reshape(-1, st.tpc)[ctas], -1)
        lo = np.where(rows, wpc, np.iinfo(np.int32).max).min(1)
        split = (wpc.max(1) != lo)
        if split.any():
            c = int(np.flatnonzero(split)[0])
            t = int(np.flatnonzero(rows[c] & (wpc[c] != lo[c]))[0])
            first = self.steps[int(lo[c])].ins
            raise self._fail("divergence", self.steps[int(wpc[c, t])].ins,
                             int(ctas[c]) * st.tpc + t, "threads of the CTA wait at different "
                             f"barriers (this one and line {first.line})")
        w = np.zeros(pcs.size, bool)
        w.reshape(-1, st.tpc)[ctas] = rows
        pcs[w] = self._waitpc[w] + 1
        st.smem.barrier(ctas)

    def _run(self, st: State, issued: np.ndarray, warps: np.ndarray) -> None:
        """Run to the end; ``issued[i]`` counts the warps that issued step i."""
        steps, T = self.steps, st.T
        pc, pcs, live, nlive = 0, None, None, T   # converged: pc; diverged: pcs array
        all_warps = int(warps[-1]) + 1
        self._waitpc = np.zeros(T, np.int32)
        while True:
            if pcs is None:
                i, active = pc, live
            else:
                i = int(pcs.min())
                if i >= WAIT:                   # cannot happen: _release opens barriers
                    raise EmulatorError("divergence", None, "", "every running thread "
                                        "waits at a barrier that never opens")
                active = pcs == i
                if int(np.count_nonzero(active)) == nlive:      # reconverged
                    pc, pcs, live = i, None, (None if nlive == T else active)
                    active = live
            step = steps[i]
            ins, ex = step.ins, step.ex
            issued[i] += all_warps if active is None else np.unique(warps[active]).size
            try:
                m = active
                if step.guard is not None:
                    p = step.guard(st, active)
                    m = p if active is None else (p & active)
                    if m.all():
                        m = None
                kind = ex.kind
                if kind == "op":
                    if m is None or m.any():
                        if ex.warp:
                            self._warp_check(st, m, ins)
                        ex.run(st, m)
                elif kind == "bar" and m is None:
                    st.smem.barrier(None)
                elif kind == "bar" and m.any():            # some wait for the others
                    if pcs is None:
                        pcs = np.full(T, i, np.int32)
                        if live is not None:
                            pcs[~live] = DONE
                    pcs[active] = i + 1
                    pcs[m] = WAIT
                    self._waitpc[m] = i
                    self._release(st, pcs)
                    continue
                elif kind == "bra":
                    taken = m
                    if taken is None or step.guard is None:
                        stay = None
                    else:
                        stay = ~taken if active is None else (active & ~taken)
                        if not stay.any():
                            stay = None
                        elif not taken.any():                # nobody takes it
                            if pcs is None:
                                pc += 1
                            else:
                                pcs[active] = i + 1
                            continue
                    if stay is None:                       # every thread here takes it
                        if pcs is None:
                            pc = ex.target
                        else:
                            pcs[active] = ex.target
                        continue
                    if ex.uni:  # PTX: uniform within each warp (warps may differ)
                        mixed = np.intersect1d(warps[taken], warps[stay])
                        if mixed.size:
                            in_warp = warps == mixed[0]
                            t0 = int(np.flatnonzero(taken & in_warp)[0])
                            s0 = int(np.flatnonzero(stay & in_warp)[0])
                            raise self._fail("divergence", ins, s0, "bra.uni is not uniform "
                                             f"in the warp: this thread falls through, tid="
                                             f"{fmt3(self._where(t0)[1])} branches")
                    if pcs is None:
                        pcs = np.full(T, i + 1, np.int32)
                        if live is not None:
                            pcs[~live] = DONE
                    else:
                        pcs[active] = i + 1
                    pcs[taken] = ex.target
                    continue
                elif kind == "exit":
                    if m is None:
                        return
                    nlive -= int(np.count_nonzero(m))
                    if nlive == 0:
                        return
                    if pcs is None:
                        live = ~m if live is None else (live & ~m)
                        pc += 1
                    else:
                        pcs[active] = i + 1
                        pcs[m] = DONE
                        self._release(st, pcs)
                    continue
            except Fault as f:
                raise self._fault(f, ins) from None
            if pcs is None:
                pc += 1
            else:
                pcs[active] = i + 1


class Module:
    """A PTX module, parsed and decoded once; mirrors ``cupy.RawModule``.

    ``strict_shared_init``: reading a shared byte no thread of the CTA ever wrote is an
    ``uninitialized`` error (real hardware returns garbage there).
    """

    def __init__(self, code: str | None = None, path: str | Path | None = None,
                 strict_shared_init: bool = True):
        if (code is None) == (path is None):
            raise TypeError("Module needs exactly one of code= or path=")
        text = Path(path).read_text() if path is not None else code
        self.functions = {name: Function(e, strict_shared_init)
                          for name, e in parse(text).items()}

    def get_function(self, name: str) -> Function:
        if name not in self.functions:
            raise EmulatorError("launch", None, "", f"no .entry '{name}' in the module; "
                                f"entries: {', '.join(self.functions) or 'none'}")
        return self.functions[name]
