"""PTX emit helpers shared by every kernel: a register-allocating builder and one
helper per instruction form.

A kernel is written as calls on :class:`Ptx`; each helper below emits one PTX form
and returns the register that holds its result, so kernel code reads like dataflow:

    ptr = ptx.param_ptr("x")
    row = ptx.mad(ptx.special("%ctaid.y"), 64, ptx.special("%tid.x"))

Every instruction text is produced in exactly one place (``Ptx.ins`` formats,
the helpers choose the opcode), so a change of form is one edit. Nothing here knows
about a particular kernel; the staged tile all three kernels share lives in
``hslm_ptx/tile/``.

PTX target: ``.version 8.0`` / ``.target sm_80`` (mma.m16n8k32 needs sm_80, and 8.0 is
old enough for every driver and ptxas we meet).
"""
from __future__ import annotations

import struct
from typing import Sequence

PTX_VERSION = "8.0"
PTX_TARGET = "sm_80"

# register kind -> (PTX declaration type, name prefix)
# (b16: a 16-bit float on its way to or from memory, f16 / bf16 bits; f32: the float forms)
REG_KINDS = {"b32": (".b32", "%r"), "b64": (".b64", "%rd"), "pred": (".pred", "%p"), "b16": (".b16", "%rs"),
             "f32": (".f32", "%f")}

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
        # A part of a grouped entry (hslm_ptx.tile.grouped) is emitted as if it were a kernel of
        # its own: its labels take ``scope`` as a prefix, and the special registers named
        # in ``specials`` (%ctaid.x ...) read the registers given there instead, or what
        # a function given there emits at each read.
        self.scope = ""
        self.specials: dict[str, str] = {}

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
        self.body.append(f"{self.scope}{name}:")

    def comment(self, text: str) -> None:
        self.body.append(f"\t// {text}")

    def shared_array(self, name: str, nbytes: int, align: int = 16) -> str:
        """Declare an aligned static shared array; returns its 32-bit address register. A
        name declared again (the parts of a grouped entry) is one array, as large and as
        aligned as its largest asker: the parts run in different CTAs."""
        for i, (known, size, was) in enumerate(self.shared):
            if known == name:
                self.shared[i] = (name, max(size, nbytes), max(was, align))
                break
        else:
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
        """%tid.x, %ctaid.y, %laneid ... into a fresh register (a grouped entry's part
        reads its own CTA coordinates: ``specials``)."""
        value = self.specials.get(name, name)
        return value() if callable(value) else self.fresh("b32", "mov.u32", value)

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

    def cp_async(self, dst: str, src: str, src_size: Operand, dst_offset: int = 0, size: int = 16,
                 src_offset: int = 0, guard: str | None = None) -> None:
        """``size``-byte ``cp.async`` global -> shared (16: ``.cg``, through L2 only; 4 or 8:
        ``.ca``, the only level those sizes have); bytes past ``src_size`` (or all of
        them, where ``src_size`` is an ignore-src predicate that holds) are zero-filled
        and never read (PTX ISA 9.7.9.25). ``guard``: only threads where it holds copy."""
        level = "cg" if size == 16 else "ca"
        self.ins(f"cp.async.{level}.shared.global", addr(dst, dst_offset), addr(src, src_offset), size, src_size,
                 guard=guard)

    def cp_async_commit(self) -> None:
        self.ins("cp.async.commit_group")

    def cp_async_wait(self, pending: int | None) -> None:
        """Wait until at most ``pending`` committed groups are in flight (None: all)."""
        if pending is None:
            self.ins("cp.async.wait_all")
        else:
            self.ins("cp.async.wait_group", pending)

    def ldmatrix_x4(self, address: str, offset: int = 0) -> list[str]:
        """Four 8x8 b16 matrices; lanes 8q..8q+7 address matrix q's 16-byte rows (PTX ISA
        9.7.14.5.15). Register q of lane l: row l >> 2, bytes 4(l & 3)..+3 of matrix q."""
        dst = [self.reg("b32") for _ in range(4)]
        self.ins("ldmatrix.sync.aligned.m8n8.x4.shared.b16",
                 "{" + ", ".join(dst) + "}", addr(address, offset))
        return dst

    # -- control -------------------------------------------------------------------------
    def branch(self, target: str, guard: str | None = None) -> None:
        """A non-divergent branch: every active thread of a warp takes the same way (PTX ISA
        bra.uni); the kernels' branches are uniform over the launch or over a warp."""
        self.ins("bra.uni", self.scope + target, guard=guard)

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
            f"// {self.entry}: generated by hslm-ptx (hslm_ptx.emit), do not edit",
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

    # -- epilogue forms ----------------------------------------------------------------
    def take_ticket(self, address: str, into: str, guard: str) -> None:
        """``@guard atom.global.add.u32 into, [address], 1``: where ``guard`` holds (one
        thread of a CTA), the arrival count before this one into ``into`` (PTX ISA 9.7.13.5)."""
        self.ins("atom.global.add.u32", into, addr(address), 1, guard=guard)

    # -- float forms (layer step kernels) ------------------------------------------------
    # f32 values in .f32 registers, 16-bit floats in .b16; a float or int operand is an
    # exact f32 literal. Semantics: PTX ISA 9.7.3 (f32 arithmetic), 9.7.9.21 (cvt), 9.7.9.6
    # (shfl.sync), 9.7.13.4 (fences); hslm_ptx/emu/float_ops.py is their definition.
    @staticmethod
    def f32_literal(value: float) -> str:
        """``0fXXXXXXXX``: the f32 nearest ``value``, written bit-exactly."""
        return f"0f{struct.unpack('<I', struct.pack('<f', value))[0]:08X}"

    def _f32_operand(self, value: str | float) -> str:
        return value if isinstance(value, str) else self.f32_literal(value)

    def _f32_form(self, opcode: str, *srcs: str | float) -> str:
        return self.fresh("f32", opcode, *(self._f32_operand(x) for x in srcs))

    def fmov(self, value: str | float) -> str:
        """``mov.f32`` of a register or literal into a fresh .f32 register."""
        return self._f32_form("mov.f32", value)

    def fadd(self, a: str | float, b: str | float) -> str:
        """``add.rn.f32``: the rounding named, so ptxas never contracts it into an fma."""
        return self._f32_form("add.rn.f32", a, b)

    def fsub(self, a: str | float, b: str | float) -> str:
        return self._f32_form("sub.rn.f32", a, b)

    def fmul(self, a: str | float, b: str | float) -> str:
        """``mul.rn.f32``, never contracted with an add after it."""
        return self._f32_form("mul.rn.f32", a, b)

    def fdiv(self, a: str | float, b: str | float) -> str:
        """``div.rn.f32``: IEEE division, correctly rounded."""
        return self._f32_form("div.rn.f32", a, b)

    def frcp(self, a: str | float) -> str:
        """``rcp.rn.f32``: 1 / a, correctly rounded."""
        return self._f32_form("rcp.rn.f32", a)

    def fabs(self, a: str) -> str:
        return self._f32_form("abs.f32", a)

    def fneg(self, a: str) -> str:
        return self._f32_form("neg.f32", a)

    def fmin(self, a: str | float, b: str | float) -> str:
        """``min.f32``: a NaN operand gives the other one."""
        return self._f32_form("min.f32", a, b)

    def fmax(self, a: str | float, b: str | float) -> str:
        """``max.f32``: a NaN operand gives the other one."""
        return self._f32_form("max.f32", a, b)

    def fmin_nan(self, a: str | float, b: str | float) -> str:
        """``min.NaN.f32``: any NaN operand gives NaN."""
        return self._f32_form("min.NaN.f32", a, b)

    def fmax_nan(self, a: str | float, b: str | float) -> str:
        """``max.NaN.f32``: any NaN operand gives NaN (absmax that propagates NaN)."""
        return self._f32_form("max.NaN.f32", a, b)

    def setp_f32(self, cmp: str, a: str | float, b: str | float) -> str:
        """``setp.<cmp>.f32``: eq..ge false on NaN, equ..geu true on NaN, num, nan."""
        return self.fresh("pred", f"setp.{cmp}.f32", self._f32_operand(a), self._f32_operand(b))

    def selp_f32(self, a: str | float, b: str | float, pred: str) -> str:
        """``selp.f32``: a where ``pred``, else b."""
        return self.fresh("f32", "selp.f32", self._f32_operand(a), self._f32_operand(b), pred)

    def testp(self, test: str, a: str) -> str:
        """``testp.<test>.f32`` (finite, infinite, number, notanumber, normal, subnormal)."""
        return self.fresh("pred", f"testp.{test}.f32", a)

    def bits_as_f32(self, a: str) -> str:
        """``mov.b32`` of a b32 register's bits into a fresh .f32 register."""
        return self.fresh("f32", "mov.b32", a)

    def f32_bits(self, a: str) -> str:
        """``mov.b32`` of an .f32 register's bits into a fresh b32 register."""
        return self.fresh("b32", "mov.b32", a)

    def cvt(self, dst_type: str, src_type: str, value: str, rnd: str | None = None,
            sat: bool = False) -> str:
        """``cvt{.rnd}{.sat}.<dst_type>.<src_type>`` into a fresh register of the result's
        kind: f32 -> .f32, f16/bf16 -> .b16, 8/16/32-bit integers -> b32 (sign- or
        zero-extended). rnd: rn for f32 -> f16/bf16 and int -> f32; rni/rzi/rmi/rpi for
        f32 -> int (clamped, NaN -> 0); none for f16/bf16 -> f32."""
        kind = {"f32": "f32", "f16": "b16", "bf16": "b16"}.get(dst_type, "b32")
        modifiers = (f".{rnd}" if rnd else "") + (".sat" if sat else "")
        return self.fresh(kind, f"cvt{modifiers}.{dst_type}.{src_type}", value)

    def shfl(self, mode: str, value: str, lane_or_delta: Operand, clamp: Operand,
             membermask: int = 0xFFFFFFFF) -> str:
        """``shfl.sync.<mode>.b32`` (up, down, bfly, idx); every lane of ``membermask``
        must execute it. clamp: 0x1f for down/bfly/idx over a whole warp, 0 for up."""
        kind = "f32" if value.startswith(REG_KINDS["f32"][1]) else "b32"
        return self.fresh(kind, f"shfl.sync.{mode}.b32", value, lane_or_delta, clamp, membermask)

    def fence(self, sem: str = "acq_rel", scope: str = "gpu") -> None:
        """``fence.<sem>.<scope>`` (sem: acq_rel or sc)."""
        self.ins(f"fence.{sem}.{scope}")

    def membar(self, level: str = "gl") -> None:
        """``membar.<level>`` (cta, gl, sys)."""
        self.ins(f"membar.{level}")

    def atom_add(self, address: str, value: Operand, offset: int = 0) -> str:
        """``atom.global.add.u32``: the old word into a fresh b32 (an arrival ticket)."""
        return self.fresh("b32", "atom.global.add.u32", addr(address, offset), value)

    def atom_exch(self, address: str, value: Operand, offset: int = 0) -> str:
        """``atom.global.exch.b32``: store ``value``, the old word into a fresh b32."""
        return self.fresh("b32", "atom.global.exch.b32", addr(address, offset), value)

    def load_acquire(self, address: str, offset: int = 0) -> str:
        """``ld.acquire.gpu.global.b32``: later accesses see what the releasing writer saw."""
        return self.fresh("b32", "ld.acquire.gpu.global.b32", addr(address, offset))

    def load_f32(self, space: str, address: str, offset: int = 0, guard: str | None = None) -> str:
        """``ld.<space>.f32`` into a fresh .f32 register."""
        return self.fresh("f32", f"ld.{space}.f32", addr(address, offset), guard=guard)

    def load_f32_vector(self, space: str, address: str, count: int, offset: int = 0) -> list[str]:
        """``ld.<space>.v<count>.f32`` into fresh .f32 registers (element 0 lowest)."""
        dsts = [self.reg("f32") for _ in range(count)]
        self.ins(f"ld.{space}.v{count}.f32", "{" + ", ".join(dsts) + "}", addr(address, offset))
        return dsts

    def load_b16(self, space: str, address: str, offset: int = 0, guard: str | None = None) -> str:
        """``ld.<space>.b16`` into a fresh .b16 register (an f16 or bf16 value)."""
        return self.fresh("b16", f"ld.{space}.b16", addr(address, offset), guard=guard)

    # -- step kernel forms (weight preparation, quantization) ---------------------------------
    def load_vector_into(self, space: str, ty: str, address: str, dsts: Sequence[str],
                         guard: str | None = None, offset: int = 0) -> list[str]:
        """``[@guard] ld.<space>.v<n>.<ty>`` into ``dsts``, which keep their values where
        ``guard`` is off (zero them first for a predicated tail)."""
        self.ins(f"ld.{space}.v{len(dsts)}.{ty}", "{" + ", ".join(dsts) + "}", addr(address, offset), guard=guard)
        return list(dsts)

    def unpack_halves(self, word: str) -> tuple[str, str]:
        """``mov.b32 {lo, hi}, word``: a b32 register's two 16-bit halves into fresh .b16
        registers (low half: the element at the lower address)."""
        low, high = self.reg("b16"), self.reg("b16")
        self.ins("mov.b32", "{" + f"{low}, {high}" + "}", word)
        return low, high


def addr(base: str, offset: int = 0) -> str:
    """``[base]`` or ``[base+offset]`` (offset may be negative)."""
    if not offset:
        return f"[{base}]"
    return f"[{base}{'+' if offset > 0 else ''}{offset}]"


def decode_ternary(ptx: Ptx, word: str, table: str) -> list[str]:
    """16 packed 2-bit codes -> four b32 registers of 16 int8 values, without branches.

    The word holds its codes in the planes' order (``hslm_ptx/formats/planes.py``: the code of
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
