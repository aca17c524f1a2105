"""A strict, vectorized CPU emulator for the PTX subset our kernels use.

    from hslm_ptx.emu import Module, EmulatorError
    fn = Module(code=ptx).get_function("hslm_fwd_s8")
    fn(grid, block, [out, x, w, np.uint32(R), ...], shared_mem=0)   # like cupy.RawKernel

Modules: parse (text -> records), operands (types, registers, operand closures),
ops (the instruction table), memory (global/shared with bounds, alignment and race
checks), traffic (memory request counts), float_ops (f32 and 16-bit float forms),
warp_shuffle (shfl.sync), atomics, async_copy, ldmatrix (their forms), limits (launch
and shared-memory limits, the instruction budget), machine (the lockstep min-PC
executor, Module and Function), bench (``python -m hslm_ptx.emu_bench``: its speed on
our kernels). After a launch
``fn.stats`` (LaunchCounts) says how many warp instructions it issued, by opcode, and
``fn.stats.memory`` the global/shared traffic of each PTX line (AccessStats: requests,
bytes, 32-byte sectors, 128-byte lines, shared bank wavefronts; see ``traffic.py``);
``fn.stats.memory_totals("shared", in_loop=True)`` sums them.
"""
from hslm_ptx.emu.machine import Function, LaunchCounts, Module
from hslm_ptx.emu.parse import EmulatorError
from hslm_ptx.emu.traffic import AccessStats

__all__ = ["Module", "Function", "EmulatorError", "LaunchCounts", "AccessStats"]
