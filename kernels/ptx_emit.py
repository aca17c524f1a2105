"""PTX emit helpers shared by every kernel: a register-allocating builder and one
helper per instruction form.

A kernel is written as calls on :class:`Ptx`; each helper below emits one PTX form
and returns the register that holds its result, so kernel code reads like dataflow:

    ptr = ptx.param_ptr("x")
    row = ptx.mad("u32", ptx.ctaid("y"), 64, ptx.warp())

Every instruction text is produced in exactly one place (``Ptx.ins`` formats,
the helpers choose the opcode), so a change of form is one edit. Nothing here knows
about a particular kernel; the staged tile all three kernels share lives in
``kernels/staged_tile.py``.

PTX target: ``.version 8.0`` / ``.target sm_80`` (mma.m16n8k32 needs sm_80, and 8.0 is
old enough for every driver and ptxas we meet).
"""
from __future__ import annotations

from typing import Sequence

PTX_VERSION = "8.0"
PTX_TARGET = "sm_80"

# register kind -> (PTX declaration type, name prefix)
REG_KINDS = {"b32": (".b32", "%r"), "b64": (".b64", "%rd"), "pred": (".pred", "%p")}

Operand = str | int

# prmt table for ternary decode: bytes 0x00, 0x01, 0xFF, 0x00 for codes 0, 1, 2, 3
TERNARY_PRMT_TABLE = 0x00FF0100


def imm(value: int) -> str:
    """An integer immediate as PTX writes it (hex for masks keeps the listing readable)."""
    return hex(value) if value > 255 else str(value)


def operand(value: Operand) -> str:
    return imm(value) if isinstance(value, int) else value


class Ptx:
    """One kernel's PTX: parameters, registers allocated on demand, an instruction list."""

    def __init__(self, entry: str, params: Sequence[tuple[str, str]], max_threads: int, min_ctas: int = 1):
        self.entry = entry
        self.params = list(params)  # (name, "u64" | "u32")
        self.max_threads = max_threads
        self.min_ctas = min_ctas  # CTAs an SM must hold at once: caps registers per thread
        self.count = {kind: 0 for kind in REG_KINDS}
        self.shared: list[tuple[str, int, int]] = []
        self.body: list[str] = []

    # -- registers, labels, raw instructions -------------------------------------------
    def reg(self, kind: str = "b32") -> str:
        """A fresh register of ``kind`` (b32, b64 or pred)."""
        name = f"{REG_KINDS[kind][1]}{self.count[kind]}"
        self.count[kind] += 1
        return name

    def ins(self, opcode: str, *operands: Operand, guard: str | None = None) -> None:
        """Emit ``[@guard] opcode op0, op1, ...;`` -- the single formatter of instructions."""
        prefix = f"@{guard} " if guard else ""
        self.body.append(f"\t{prefix}{opcode} {', '.join(operand(o) for o in operands)};")

    def fresh(self, kind: str, opcode: str, *srcs: Operand, guard: str | None = None) -> str:
        """Emit ``opcode dst, srcs`` into a fresh register and return it."""
        dst = self.reg(kind)
        self.ins(opcode, dst, *srcs, guard=guard)
        return dst

    def label(self, name: str) -> None:
        self.body.append(f"{name}:")

    def comment(self, text: str) -> None:
        self.body.append(f"\t// {text}")

    def shared_array(self, name: str, nbytes: int, align: int = 16) -> str:
        """Declare an aligned static shared array; returns its 32-bit address register."""
        self.shared.append((name, nbytes, align))
        return self.fresh("b32", "mov.u32", name)

    # -- parameters and special registers ---------------------------------------------
    def param_ptr(self, name: str) -> str:
        """A global pointer parameter, converted to a global-window address."""
        generic = self.fresh("b64", "ld.param.u64", f"[{name}]")
        return self.fresh("b64", "cvta.to.global.u64", generic)

    def param_u32(self, name: str) -> str:
        return self.fresh("b32", "ld.param.u32", f"[{name}]")

    def special(self, name: str) -> str:
        """%tid.x, %ctaid.y, %laneid ... into a fresh register."""
        return self.fresh("b32", "mov.u32", name)

    # -- integer arithmetic (u32 unless stated) -----------------------------------------
    def mov(self, value: Operand, kind: str = "b32") -> str:
        return self.fresh(kind, "mov.b64" if kind == "b64" else "mov.b32", value)

    def binop(self, op: str, a: Operand, b: Operand, ty: str = "u32") -> str:
        """add, sub, mul.lo, shl, shr, and, or, min, max ... on ``ty``; returns the result."""
        return self.fresh("b64" if ty.endswith("64") else "b32", f"{op}.{ty}", a, b)

    def add(self, a: Operand, b: Operand, ty: str = "u32") -> str:
        return self.binop("add", a, b, ty)

    def sub(self, a: Operand, b: Operand, ty: str = "s32") -> str:
        return self.binop("sub", a, b, ty)

    def mul(self, a: Operand, b: Operand) -> str:
        return self.binop("mul.lo", a, b)

    def mad(self, a: Operand, b: Operand, c: Operand) -> str:
        return self.fresh("b32", "mad.lo.u32", a, b, c)

    def shl(self, a: Operand, bits: int) -> str:
        return self.binop("shl", a, bits, "b32")

    def shr(self, a: Operand, bits: int) -> str:
        return self.binop("shr", a, bits)

    def band(self, a: Operand, b: Operand) -> str:
        return self.binop("and", a, b, "b32")

    def round_up(self, a: Operand, multiple: int) -> str:
        """``a`` rounded up to a power-of-2 ``multiple``."""
        return self.band(self.add(a, multiple - 1), ~(multiple - 1) & 0xFFFFFFFF)

    def lop3(self, a: Operand, b: Operand, c: Operand, lut: int) -> str:
        return self.fresh("b32", "lop3.b32", a, b, c, lut)

    def prmt(self, a: Operand, b: Operand, selector: Operand) -> str:
        return self.fresh("b32", "prmt.b32", a, b, selector)

    def selp(self, a: Operand, b: Operand, pred: str) -> str:
        return self.fresh("b32", "selp.b32", a, b, pred)

    def setp(self, cmp: str, a: Operand, b: Operand, ty: str = "s32") -> str:
        return self.fresh("pred", f"setp.{cmp}.{ty}", a, b)


    def increment(self, reg: str, step: Operand, ty: str = "u32") -> None:
        """In-place ``reg += step`` (loop counters and walking pointers)."""
        self.ins(f"add.{ty}", reg, reg, step)

    def widen(self, a: str) -> str:
        """u32 -> u64."""
        return self.fresh("b64", "cvt.u64.u32", a)

    def wide_mul(self, a: Operand, b: Operand) -> str:
        """u32 x u32 -> u64 (offsets in bytes stay exact past 4 GiB); register first."""
        if isinstance(a, int):
            a, b = b, a
        if b == 1:
            return self.widen(a)
        return self.fresh("b64", "mul.wide.u32", a, b)

    def byte_offset(self, base64: str, index: Operand, scale: Operand) -> str:
        """``base64 + index * scale`` with a widening multiply (32-bit index, 64-bit address)."""
        if index == 0:
            return base64
        return self.add(base64, self.wide_mul(index, scale), "s64")

    # -- memory ----------------------------------------------------------------------
    def load(self, space: str, ty: str, address: str, offset: int = 0,
             guard: str | None = None, zero_fill: bool = False, into: str | None = None) -> str:
        """``ld.<space>.<ty>`` into a fresh b32, or ``into`` (which keeps its value where
        ``guard`` is off); with ``zero_fill`` a fresh register is 0 where ``guard`` is off."""
        dst = into or (self.mov(0) if zero_fill else self.reg("b32"))
        self.ins(f"ld.{space}.{ty}", dst, addr(address, offset), guard=guard)
        return dst


    def load_vector(self, space: str, ty: str, address: str, count: int, offset: int = 0) -> list[str]:
        """``ld.<space>.v<count>.<ty>`` into fresh b32 registers (element 0 at the lowest address)."""
        dsts = [self.reg("b32") for _ in range(count)]
        self.ins(f"ld.{space}.v{count}.{ty}", "{" + ", ".join(dsts) + "}", addr(address, offset))
        return dsts

    def store(self, space: str, ty: str, address: str, value: str | Sequence[str],
              offset: int = 0, guard: str | None = None) -> None:
        """``st.<space>.<ty>``; a sequence of values is a vector store ``{a, b, ...}``."""
        src = value if isinstance(value, str) else "{" + ", ".join(value) + "}"
        self.ins(f"st.{space}.{ty}", addr(address, offset), src, guard=guard)

    def red_add(self, address: str, value: str, offset: int = 0, guard: str | None = None) -> None:
        """``red.global.add.s32``: atomically add ``value`` to the word (PTX ISA red)."""
        self.ins("red.global.add.s32", addr(address, offset), value, guard=guard)

    def barrier(self) -> None:
        self.ins("bar.sync", 0)

    def cp_async(self, dst: str, src: str, src_size: Operand, dst_offset: int = 0) -> None:
        """16-byte ``cp.async.cg`` global -> shared; bytes past ``src_size`` are zero-filled
        and never read (PTX ISA 9.7.9.25)."""
        self.ins("cp.async.cg.shared.global", addr(dst, dst_offset), addr(src), 16, src_size)

    def cp_async_commit(self) -> None:
        self.ins("cp.async.commit_group")

    def cp_async_wait(self, pending: int | None) -> None:
        """Wait until at most ``pending`` committed groups are in flight (None: all)."""
        if pending is None:
            self.ins("cp.async.wait_all")
        else:
            self.ins("cp.async.wait_group", pending)

    def ldmatrix_x4(self, address: str, offset: int = 0, trans: bool = False) -> list[str]:
        """Four 8x8 b16 matrices; lanes 8q..8q+7 address matrix q's 16-byte rows (PTX ISA
        9.7.14.5.15). Register q of lane l: row l >> 2, bytes 4(l & 3)..+3 of matrix q;
        ``trans``: b16 element l >> 2 of rows 2(l & 3) (low half) and 2(l & 3) + 1."""
        dst = [self.reg("b32") for _ in range(4)]
        self.ins(f"ldmatrix.sync.aligned.m8n8.x4{'.trans' if trans else ''}.shared.b16",
                 "{" + ", ".join(dst) + "}", addr(address, offset))
        return dst

    # -- control -------------------------------------------------------------------------
    def branch(self, target: str, guard: str | None = None) -> None:
        """A non-divergent branch: every active thread of a warp takes the same way (PTX ISA
        bra.uni); the kernels' branches are uniform over the launch or over a warp."""
        self.ins("bra.uni", target, guard=guard)

    # -- tensor core ------------------------------------------------------------------
    def mma_s8(self, acc: Sequence[str], a: Sequence[str], b: Sequence[str]) -> None:
        """acc += A(16x32 s8, row) * B(32x8 s8, col) in s32, accumulating in place."""
        group = lambda regs: "{" + ", ".join(regs) + "}"
        self.ins("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32",
                 group(acc), group(a), group(b), group(acc))

    # -- the module text --------------------------------------------------------------
    def render(self) -> str:
        params = ",\n".join(f"\t.param .{ty} {name}" for name, ty in self.params)
        decls = [f"\t.reg {REG_KINDS[k][0]} {REG_KINDS[k][1]}<{n}>;" for k, n in self.count.items() if n]
        decls += [f"\t.shared .align {align} .b8 {name}[{nbytes}];" for name, nbytes, align in self.shared]
        return "\n".join([
            f"// {self.entry}: generated by hslm-ptx (kernels/), do not edit",
            f".version {PTX_VERSION}",
            f".target {PTX_TARGET}",
            ".address_size 64",
            "",
            f".visible .entry {self.entry}(",
            params,
            f")\n.maxntid {self.max_threads}, 1, 1" + (f"\n.minnctapersm {self.min_ctas}" if self.min_ctas > 1 else ""),
            "{",
            *decls,
            "",
            *self.body,
            "\tret;",
            "}",
            "",
        ])


def addr(base: str, offset: int = 0) -> str:
    """``[base]`` or ``[base+offset]`` (offset may be negative)."""
    if not offset:
        return f"[{base}]"
    return f"[{base}{'+' if offset > 0 else ''}{offset}]"


def decode_ternary(ptx: Ptx, word: str, table: str) -> list[str]:
    """16 packed 2-bit codes -> four b32 registers of 16 int8 values, without branches.

    The word holds its codes in the planes' order (``kernels/planes.py``: the code of
    register s, byte u at bit 4u + 16 (s & 1) + 2 (s >> 1)), so one mask with 0x33333333
    leaves registers 0 and 1 as eight nibbles and the same mask after a shift by 2
    registers 2 and 3: each nibble (0, 1 or 2) is the prmt selector that picks
    0x00/0x01/0xFF out of ``table`` (0x00FF0100). prmt reads only the low 16 selector
    bits, so the upper four nibbles serve the next register after a shift.
    """
    out: list[str] = []
    for codes in (word, ptx.shr(word, 2)):
        nibbles = ptx.band(codes, 0x33333333)
        out.append(ptx.prmt(table, 0, nibbles))
        out.append(ptx.prmt(table, 0, ptx.shr(nibbles, 16)))
    return out
