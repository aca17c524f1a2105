"""The lockstep executor: the threads of a group of CTAs of a launch in one set of arrays.

A launch runs as consecutive groups of whole CTAs (at most ``GROUP_THREADS`` threads a
group, one CTA at least), each group to its end before the next starts, in increasing
CTA index. CTAs share nothing but global memory, so a grid whose CTAs take different
paths (the fused kernels: dX, dW and db members in one grid) no longer pays every
member's steps over every thread, and the arrays stay cache-sized. This is a legal
hardware schedule (the CUDA model lets a CTA run to completion before another starts);
a kernel that spins on another CTA's flag would hang here, and none of ours does. The
global race tracking (which CTA stored or read each cell, and when, on the launch's one
synchronisation clock) spans the groups, so a race between CTAs of different groups is
refused as within one.

Scheduling is min-PC: each step runs the instruction at the smallest PC among the
threads still running, for exactly the threads at that PC. Uniform code therefore
runs once for all threads; a divergent forward branch runs its sides one after the
other and reconverges where the PCs meet again; loops with per-thread trip counts
work the same way. While all running threads share one PC the executor keeps it as a
Python int and passes the mask ``None`` (no masking anywhere: the fast path).

Strictness that needs the schedule lives here: ``bra.uni`` must be uniform within
each warp (as PTX defines it; different warps may go different ways); ``mma`` needs
all 32 lanes of each warp that executes it; ``bar.sync`` needs every running thread of
the CTA there and then closes the CTA's shared-memory race window.

Barriers follow PTX ISA, "Parallel Synchronization and Communication Instructions:
bar, barrier": ``bar.sync`` is ``barrier.sync.aligned``, so all threads of a warp
execute the same barrier instruction, and in conditional code only if they evaluate
the condition identically; the barrier waits for the non-exited threads, and (PTX
ISA, "Control Flow Instructions: exit") a barrier held up only by exiting threads is
released. So:

- threads that reach a bar.sync before the rest of their CTA wait there (PC parked)
  while the others run on; the barrier opens when every running thread of the CTA
  waits at it. Threads that exit do not count: ``if (tid >= n) return;
  __syncthreads();`` is fine, also when part of a warp takes the return;
- a guard that differs within a warp at a bar.sync is a divergence error;
- while lanes of a warp wait at a bar.sync, the warp's other lanes may only branch
  and exit (they are exiting threads) or reach the same barrier; a lane that
  executes anything else and then exits without reaching it (a barrier inside a loop
  whose trip count differs within the warp, with work after the loop) is a
  divergence error, and so is waiting at two different barriers.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np

from hslm_ptx.emu import async_copy, atomics, float_ops, ldmatrix, warp_shuffle
from hslm_ptx.emu import limits
from hslm_ptx.emu.memory import Fault, GlobalMemory, SharedMemory, allocation_offset
from hslm_ptx.emu.operands import TYPES, Ctx, State
from hslm_ptx.emu.ops import Exec, decode
from hslm_ptx.emu.parse import EmulatorError, Entry, Instr, fmt3, parse
from hslm_ptx.emu.traffic import FIELDS, AccessStats, Traffic, loop_lines

DONE = np.iinfo(np.int32).max      # the PC of an exited thread
WAIT = DONE - 1                     # the PC of a thread waiting at a bar.sync
# A launch runs as consecutive groups of whole CTAs, each in its own lockstep arrays of
# at most this many threads (one CTA at least). See Function.__call__ for why.
GROUP_THREADS = 16384


class Step(NamedTuple):
    ins: Instr
    guard: Any          # getter of the guard predicate (negation folded in), or None
    ex: Exec


class LaunchCounts(NamedTuple):
    """What one launch issued, counted as the hardware counts: one per warp that reaches
    an instruction, predicated-off or not (a guard does not take back the issue slot)."""

    warp_instructions: int
    by_opcode: dict[str, int]  # "ld.global", "ld.shared", "mma", "prmt", ... -> count
    memory: tuple[AccessStats, ...] = ()   # per PTX line with global/shared requests
    steps: int = 0          # lockstep steps the launch took (what the budget counts)
    budget: int = 0         # the launch's instruction budget

    def per(self, opcode: str) -> float:
        """Warp instructions issued per ``opcode`` instruction (e.g. per mma)."""
        return self.warp_instructions / max(1, self.by_opcode.get(opcode, 0))

    def memory_totals(self, space: str, in_loop: bool | None = None) -> dict[str, int]:
        """The ``memory`` counts of ``space`` summed over its lines (only those inside,
        or outside, a loop when ``in_loop`` is given): requests, bytes_used, sectors,
        lines, wavefronts, ideal_wavefronts."""
        rows = [a for a in self.memory
                if a.space == space and (in_loop is None or a.in_loop == in_loop)]
        return {f: sum(getattr(a, f) for a in rows) for f in FIELDS}


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
    """One decoded ``.entry``; call it as CuPy's RawKernel: ``fn(grid, block, args)``.

    ``arch`` is the GPU whose limits a launch must respect (``limits.py``);
    ``max_dynamic_shared_size_bytes`` is the opt-in attribute as CuPy exposes it;
    ``instruction_budget`` (None: sized from each launch's work, ``limits.default_budget``)
    is how many lockstep steps a launch may take before it is stopped as endless."""

    def __init__(self, entry: Entry, strict_shared_init: bool = True, arch: str = "sm_80"):
        self.entry, self.name, self.strict_shared_init = entry, entry.name, strict_shared_init
        self.arch = arch
        self.stats: LaunchCounts | None = None  # of the last launch
        self.instruction_budget: int | None = None
        self._dynamic_opt_in: int | None = None
        self._first_thread = 0      # global index of the running CTA group's thread 0
        offsets, end, ext_align = {}, 0, 0
        for sym, align, nbytes, _ in entry.shared:
            if nbytes is not None:
                end = _align(end, align)
                offsets[sym], end = end, end + nbytes
            else:
                ext_align = max(ext_align, align)
        self.static_shared = end
        limits.check_static_shared(end, entry.line)
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
        self.in_loop = loop_lines([s.ins.line for s in self.steps],
                                  [(i, s.ex.target) for i, s in enumerate(self.steps)
                                   if s.ex.kind == "bra"])
        # race tracking grain: the smallest shared access (all are aligned to their size)
        self.grain = min([s.ex.shared_bytes for s in self.steps if s.ex.shared_bytes] + [16])
        # the same for the CTA-conflict tracking of global stores
        self.store_grain = min([s.ex.global_store_bytes for s in self.steps
                                if s.ex.global_store_bytes] + [16])

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        """cudaFuncAttributeMaxDynamicSharedMemorySize: 48 KiB less the static shared
        memory until set."""
        if self._dynamic_opt_in is None:
            return limits.STATIC_SHARED_MAX - self.static_shared
        return self._dynamic_opt_in

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value: int) -> None:
        self._dynamic_opt_in = limits.check_dynamic_attribute(value, self.static_shared,
                                                              self.arch, self.entry.line)

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
                value = GlobalMemory.base(len(buffers), allocation_offset(arg))
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
        limits.check_geometry(g, b, line)
        if not isinstance(shared_mem, (int, np.integer)) or shared_mem < 0:
            raise EmulatorError("launch", line, "", f"shared_mem must be an int >= 0, "
                                                    f"got {shared_mem!r}")
        limits.check_dynamic_launch(int(shared_mem), self.max_dynamic_shared_size_bytes,
                                    self._dynamic_opt_in is not None, self.static_shared,
                                    self.arch, line)
        params, buffers = self._bind(args)
        self._first_thread = 0
        window = self.static_shared
        if self.extern_offset is not None:
            window = max(window, self.extern_offset + int(shared_mem))
        T = tpc * ctas
        cl_all = np.arange(T, dtype=np.uint32) // tpc
        gmem = GlobalMemory(buffers, cl_all if ctas > 1 else None, g, self.store_grain)
        traffic = None
        self._grid, self._block = g, b
        issued = np.zeros(len(self.steps), np.int64)
        budget = self.instruction_budget
        if budget is None:
            budget = limits.default_budget(len(self.steps), self._scalars(args),
                                           [a.nbytes for _, a in buffers], T)
        elif not isinstance(budget, (int, np.integer)) or isinstance(budget, bool) or budget < 1:
            raise EmulatorError("launch", line, "", "instruction_budget must be None (sized "
                                f"from the launch) or an int >= 1, got {budget!r}")
        steps, per_group = 0, max(1, GROUP_THREADS // tpc)
        for first in range(0, ctas, per_group):
            n = min(per_group, ctas - first)
            Tg = tpc * n
            tl = np.arange(Tg, dtype=np.uint32) % tpc
            cl = cl_all[first * tpc:(first + n) * tpc]
            special: dict[str, Any] = {"laneid": tl % 32}
            for reg, lin, dims in (("tid", tl, b), ("ctaid", cl, g)):
                special[f"{reg}.x"] = lin % dims[0]
                special[f"{reg}.y"] = (lin // dims[0]) % dims[1]
                special[f"{reg}.z"] = lin // (dims[0] * dims[1])
            for reg, dims in (("ntid", b), ("nctaid", g)):
                for axis, v in zip("xyz", dims):
                    special[f"{reg}.{axis}"] = np.uint32(v)
            warps = np.arange(Tg) // tpc * -(-tpc // 32) + tl // 32
            if traffic is None:
                traffic = Traffic(warps, tl % 32)
            else:
                traffic.bind(warps, tl % 32)
            if gmem.ctas is not None:
                gmem.ctas = cl
            gmem.copies = None          # the last group's threads have all exited
            st = State(Tg, special, params, gmem,
                       SharedMemory(n, tpc, window, self.strict_shared_init, self.grain),
                       tpc, traffic)
            self._first_thread = first * tpc
            steps += self._run(st, issued, warps, budget)
        self._first_thread = 0
        by_opcode: dict[str, int] = {}
        for step, count in zip(self.steps, issued.tolist()):
            if count:
                name = opcode_class(step.ins.op)
                by_opcode[name] = by_opcode.get(name, 0) + count
        self.stats = LaunchCounts(int(issued.sum()), by_opcode, traffic.stats(self.in_loop),
                                 steps, budget)

    # ---- the executor -------------------------------------------------------------------

    def _where(self, thread: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """Global thread index -> (ctaid, tid)."""
        (bx, by, bz), (gx, gy, _) = self._block, self._grid  # z: what is left of c after x and y
        tpc = bx * by * bz
        c, t = divmod(int(thread) + self._first_thread, tpc)
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

    def _release(self, st: State, sch: Schedule) -> None:
        """Open the barrier of every CTA whose running threads all wait at one.

        Waiting threads sit at PC ``WAIT`` (never the minimum) with their barrier's PC
        in ``sch.waitpc``. Threads that exited do not count, as on hardware; threads
        of one CTA waiting at different bar.sync instructions are a divergence error."""
        pcs = sch.pcs
        waiting = (pcs == WAIT).reshape(-1, st.tpc)
        running = (pcs != DONE).reshape(-1, st.tpc)
        ready = waiting.any(1) & (waiting.sum(1) == running.sum(1))
        if not ready.any():
            return
        ctas = np.flatnonzero(ready)
        rows = waiting[ctas]
        wpc = np.where(rows, sch.waitpc.reshape(-1, st.tpc)[ctas], -1)
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
        pcs[w] = sch.waitpc[w] + 1
        st.smem.barrier(ctas)

    # One handler per scheduling kind: run the step at PC i for the threads ``active``
    # (None: every running thread) of which ``m`` (None: all of them) pass the guard,
    # and move those threads on. A handler returns True when no thread is left.

    def _plain(self, st: State, sch: Schedule, step: Step, i: int, active, m) -> bool:
        if sch.held is not None:
            sch.stray(active, i)
        if m is None or m.any():
            if step.ex.warp:
                self._warp_check(st, m, step.ins)
            step.ex.run(st, m)
            st.commit()
        sch.goto(active, i + 1)
        return False

    def _barrier(self, st: State, sch: Schedule, step: Step, i: int, active, m) -> bool:
        if m is None:                               # every thread of every CTA is here
            st.smem.barrier(None)
        elif m.any():                               # some wait for the others
            if step.guard is not None:
                self._uniform_check(sch.warps, m, active & ~m if active is not None else ~m,
                                    step.ins, "the guard of an aligned bar.sync differs in "
                                    "the warp: this thread skips it, tid={} executes it")
            sch.split(active, i + 1, m, WAIT)
            sch.waitpc[m] = i
            sch.strayed[m] = -1
            self._release(st, sch)
            sch.hold()
            return False
        sch.goto(active, i + 1)
        return False

    def _branch(self, st: State, sch: Schedule, step: Step, i: int, active, m) -> bool:
        target, taken = step.ex.target, m
        if taken is None or step.guard is None:     # every thread here takes it
            sch.goto(active, target)
            return False
        stay = ~taken if active is None else (active & ~taken)
        if not stay.any():
            sch.goto(active, target)
        elif not taken.any():                       # nobody takes it
            sch.goto(active, i + 1)
        else:
            if step.ex.uni:
                self._uniform_check(sch.warps, taken, stay, step.ins, "bra.uni is not uniform "
                                    "in the warp: this thread falls through, tid={} branches")
            sch.split(active, i + 1, taken, target)
        return False

    def _uniform_check(self, warps: np.ndarray, taken, stay, ins: Instr, why: str) -> None:
        """No warp has threads on both sides (bra.uni, PTX ISA "bra"; the guard of an
        aligned barrier): ``why`` names the other side's thread at ``{}``."""
        mixed = np.intersect1d(warps[taken], warps[stay])
        if mixed.size:
            in_warp = warps == mixed[0]
            t0 = int(np.flatnonzero(taken & in_warp)[0])
            s0 = int(np.flatnonzero(stay & in_warp)[0])
            raise self._fail("divergence", ins, s0, why.format(fmt3(self._where(t0)[1])))

    def _exit(self, st: State, sch: Schedule, step: Step, i: int, active, m) -> bool:
        if m is None:
            return True
        sch.nlive -= int(np.count_nonzero(m))
        if sch.nlive == 0:
            return True
        if sch.pcs is None:
            sch.live = ~m if sch.live is None else (sch.live & ~m)
            sch.pc += 1
            return False
        if sch.held is not None:
            self._straggler_check(sch, m)
        sch.split(active, i + 1, m, DONE)
        self._release(st, sch)
        sch.hold()
        return False

    def _straggler_check(self, sch: Schedule, leaving) -> None:
        """An exiting thread that did work while lanes of its warp waited at a barrier
        left that aligned barrier behind instead of exiting on the way to it."""
        bad = leaving & (sch.strayed >= 0) & sch.held[sch.warps]
        if bad.any():
            t = int(np.flatnonzero(bad)[0])
            lane = int(np.flatnonzero((sch.warps == sch.warps[t]) & (sch.pcs == WAIT))[0])
            did = self.steps[int(sch.strayed[t])].ins
            raise self._fail("divergence", self.steps[int(sch.waitpc[lane])].ins, t,
                             f"lanes of this thread's warp (tid={fmt3(self._where(lane)[1])}) "
                             f"wait at this aligned bar.sync while this thread ran line "
                             f"{did.line} and then exited without reaching it")

    @staticmethod
    def _scalars(args: Sequence[Any]) -> list[int]:
        return [int(a) for a in args if isinstance(a, np.generic)]

    def _out_of_budget(self, sch: Schedule, i: int, budget: int) -> EmulatorError:
        """One line: the budget, and the PTX lines the running threads are at."""
        if sch.pcs is None:
            at = [i]
        else:
            pcs = sch.pcs[sch.pcs < WAIT]
            at = sorted(set(np.unique(pcs).tolist()) | {i})
        lines = ", ".join(str(self.steps[p].ins.line) for p in at[:8])
        return EmulatorError("budget", self.steps[i].ins.line, self.steps[i].ins.text,
                             f"the launch ran {budget} lockstep steps, its instruction "
                             f"budget, with threads at line(s) {lines}: a loop that never "
                             "ends? (a longer run: set fn.instruction_budget)")

    def _run(self, st: State, issued: np.ndarray, warps: np.ndarray, budget: int) -> int:
        """Run to the end; ``issued[i]`` counts the warps that issued step i. More than
        ``budget`` steps stop the launch with a ``budget`` error; returns the steps."""
        sch = Schedule(st.T, warps)
        handlers = {"op": self._plain, "bar": self._barrier, "bra": self._branch,
                    "exit": self._exit}
        all_warps = int(warps[-1]) + 1
        if st.tpc % 32 == 0:
            def count_warps(active) -> int:
                return int(np.count_nonzero(active.reshape(-1, 32).any(1)))
        else:
            def count_warps(active) -> int:
                return int(np.count_nonzero(np.logical_or.reduceat(active, st.warp_start)))
        done, left = False, budget
        while not done:
            i, active = sch.next()
            left -= 1
            if left < 0:
                raise self._out_of_budget(sch, i, budget)
            step = self.steps[i]
            issued[i] += all_warps if active is None else count_warps(active)
            try:
                m = active
                if step.guard is not None:
                    p = step.guard(st, active)
                    m = p if active is None else (p & active)
                    if m.all():
                        m = None
                done = handlers[step.ex.kind](st, sch, step, i, active, m)
            except Fault as f:
                raise self._fault(f, step.ins) from None
        return budget - left


class Schedule:
    """Where every thread of the launch is (min-PC scheduling).

    Converged: all running threads are at ``pc`` (``pcs`` is None) and ``live`` masks
    the running ones (None: all). Diverged: ``pcs`` holds each thread's PC, ``DONE``
    for exited threads and ``WAIT`` for threads parked at a barrier (``waitpc`` says
    which). ``nlive`` counts the running threads either way.
    """

    def __init__(self, T: int, warps: np.ndarray):
        self.T, self.warps = T, warps
        self.pc, self.pcs, self.live, self.nlive = 0, None, None, T
        self.waitpc = np.zeros(T, np.int32)
        self.held: np.ndarray | None = None    # per warp: some lane waits at a barrier
        self.strayed = np.full(T, -1, np.int32)  # PC a thread ran while its warp was held

    def hold(self) -> None:
        """Recompute which warps have lanes waiting at a barrier (None: no warp)."""
        waiting = self.pcs == WAIT
        self.held = None
        if waiting.any():
            self.held = np.zeros(int(self.warps[-1]) + 1, bool)
            self.held[self.warps[waiting]] = True

    def stray(self, active, i: int) -> None:
        """Remember (first PC) the threads of ``active`` whose warp has waiting lanes."""
        busy = active & self.held[self.warps] & (self.strayed < 0)
        self.strayed[busy] = i

    def next(self) -> tuple[int, Any]:
        """The smallest PC and the threads at it (None: all running threads)."""
        if self.pcs is None:
            return self.pc, self.live
        i = int(self.pcs.min())
        if i >= WAIT:                   # cannot happen: _release opens barriers
            raise EmulatorError("divergence", None, "", "every running thread waits at a "
                                "barrier that never opens")
        active = self.pcs == i
        if int(np.count_nonzero(active)) == self.nlive:        # reconverged
            self.pc, self.pcs = i, None
            self.live = None if self.nlive == self.T else active
            return i, self.live
        return i, active

    def goto(self, active, pc: int) -> None:
        """Every thread of ``active`` continues at ``pc``."""
        if self.pcs is None:
            self.pc = pc
        else:
            self.pcs[active] = pc

    def split(self, active, rest: int, some, pc: int) -> None:
        """``some`` of the ``active`` threads go to ``pc``, the rest to ``rest``."""
        if self.pcs is None:                    # diverge: active is every running thread
            self.pcs = np.full(self.T, rest, np.int32)
            if self.live is not None:
                self.pcs[~self.live] = DONE
        else:
            self.pcs[active] = rest
        self.pcs[some] = pc


class Module:
    """A PTX module, parsed and decoded once; mirrors ``cupy.RawModule``.

    ``strict_shared_init``: reading a shared byte no thread of the CTA ever wrote is an
    ``uninitialized`` error (real hardware returns garbage there). ``arch``: the GPU whose
    launch limits apply (default: the module's ``.target``, e.g. sm_80; a module built
    for sm_80 also runs on an sm_90, with that GPU's larger opt-in shared memory).
    """

    def __init__(self, code: str | None = None, path: str | Path | None = None,
                 strict_shared_init: bool = True, arch: str | None = None):
        if (code is None) == (path is None):
            raise TypeError("Module needs exactly one of code= or path=")
        text = Path(path).read_text() if path is not None else code
        target = re.search(r"^\s*\.target\s+(sm_\d+)", text, re.M)
        self.arch = arch or (target.group(1) if target else "sm_80")
        self.functions = {name: Function(e, strict_shared_init, self.arch)
                          for name, e in parse(text).items()}

    def get_function(self, name: str) -> Function:
        if name not in self.functions:
            raise EmulatorError("launch", None, "", f"no .entry '{name}' in the module; "
                                f"entries: {', '.join(self.functions) or 'none'}")
        return self.functions[name]
