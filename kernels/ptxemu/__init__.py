"""A strict, vectorized CPU emulator for the PTX subset our kernels use.

    from kernels.ptxemu import Module, EmulatorError
    fn = Module(code=ptx).get_function("hslm_fwd_s8")
    fn(grid, block, [out, x, w, np.uint32(R), ...], shared_mem=0)   # like cupy.RawKernel

Modules: parse (text -> records), operands (types, registers, operand closures),
ops (the instruction table), memory (global/shared with bounds, alignment and race
checks), machine (the lockstep min-PC executor, Module and Function). After a launch
``fn.stats`` (LaunchStats) says how many warp instructions it issued, by opcode.
"""
from kernels.ptxemu.machine import Function, LaunchStats, Module
from kernels.ptxemu.parse import EmulatorError

__all__ = ["Module", "Function", "EmulatorError", "LaunchStats"]
