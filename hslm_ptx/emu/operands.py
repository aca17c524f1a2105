"""Types, the per-launch register state, and operand decoding into closures.

Decoding happens once per module: each operand becomes a closure ``get(st, m)`` (value
over all threads) or ``put(st, m, value)``, where ``m`` is the executing-thread mask or
``None`` for "every thread" (the fast path: no masking at all). Registers hold raw bits
in an unsigned array of their declared width (bool for .pred); a getter returns the
signed view for .sN operands, so each op is plain numpy on correctly typed arrays and
wraps like the hardware. Immediates become numpy scalars of the operand type.

A register whose bits are not yet written by every thread is listed in ``st.partial``
with a written-mask; reading it for a thread that never wrote it is ``uninitialized``.

Every source operand is read before any destination is written, as the PTX ISA
defines each instruction (e.g. setp: t = a CmpOp b; p = BoolOp(t, c); q = BoolOp(!t,
c) with the old c even when p is c): a writer only stages its value, and
``State.commit`` (called once after each instruction) stores them all. A stored
register array is never modified afterwards (a write makes a new array), so a value
read earlier cannot change under the reader either.
"""
from __future__ import annotations

import re
from typing import Any, Callable, NamedTuple

import numpy as np

from hslm_ptx.emu.memory import Fault
from hslm_ptx.emu.parse import EmulatorError, Entry, Instr


# The value dtype of each float type; bf16 (numpy has none) is carried as its bits, and
# every bf16 conversion goes through hslm_ptx.formats.floats.
FLOAT_VALUES = {"f16": np.dtype(np.float16), "f32": np.dtype(np.float32),
                "f64": np.dtype(np.float64), "bf16": np.dtype(np.uint16)}


class Ty(NamedTuple):
    name: str
    bits: int
    signed: bool

    @property
    def is_float(self) -> bool:
        return self.name in FLOAT_VALUES

    @property
    def dtype(self) -> np.dtype:
        """The dtype an instruction of this type computes in."""
        if self.name == "pred":
            return np.dtype(bool)
        if self.is_float:
            return FLOAT_VALUES[self.name]
        return np.dtype(f"{'i' if self.signed else 'u'}{self.bits // 8}")

    @property
    def udtype(self) -> np.dtype:
        return np.dtype(f"u{self.bits // 8}")

    @property
    def storage(self) -> np.dtype:
        """The dtype a register declared with this type holds: a float register holds
        raw bits, so a bit-cast ``mov.b32`` between it and an integer register is exact."""
        return self.udtype if self.is_float else self.dtype


TYPES = {f"{k}{b}": Ty(f"{k}{b}", b, k == "s") for k in "bus" for b in (8, 16, 32, 64)}
TYPES.update({name: Ty(name, dt.itemsize * 8, False) for name, dt in FLOAT_VALUES.items()})
TYPES["pred"] = Ty("pred", 1, False)
U32, U64, PRED = TYPES["u32"], TYPES["u64"], TYPES["pred"]
F32 = TYPES["f32"]

SPECIAL = {f"%{r}.{a}" for r in ("tid", "ntid", "ctaid", "nctaid") for a in "xyz"} | {"%laneid"}

Get = Callable[[Any, Any], Any]
Put = Callable[[Any, Any, Any], None]


class Rows(NamedTuple):
    """A destination value for only the executing threads ``sel`` (a load's data): the
    register keeps its old bits elsewhere, without a full-size array in between."""

    sel: np.ndarray
    values: np.ndarray


class State:
    """Everything one launch mutates: registers, memories, and the launch constants."""

    def __init__(self, T: int, special: dict[str, Any], params: bytes, gmem, smem, tpc: int,
                 traffic):
        self.T, self.special, self.params, self.gmem, self.smem = T, special, params, gmem, smem
        self.tpc, self.traffic = tpc, traffic     # traffic: per-line memory counts
        self.regs: dict[str, np.ndarray] = {}
        self.partial: dict[str, np.ndarray] = {}   # written-mask of partly written registers
        self.staged: list[tuple[str, np.dtype, Any, Any]] = []   # this instruction's writes
        self._fragments: dict = {}     # operand layouts built from register arrays (mma)
        self._mask, self._selected = None, None     # sel()'s last mask and answer
        self.threads = np.arange(T)
        first = special["laneid"] == 0      # every warp starts at a lane 0 of its CTA
        self.warp_start = np.flatnonzero(first)          # first thread of each warp
        self.warp_index = np.cumsum(first) - 1           # each thread's warp

    def commit(self) -> None:
        """Store the writes the instruction staged (all its sources are read by now).

        Each write makes a new array: an array handed out by an earlier read stays as
        it was. Threads outside the mask keep their old bits."""
        for name, dtype, m, v in self.staged:
            old = self.regs.get(name)
            if m is None:
                if type(v) is np.ndarray and v.dtype == dtype and v.shape == (self.T,):
                    new = v         # kept as it is: no array is ever changed in place
                else:
                    new = np.empty(self.T, dtype)
                    new[...] = v
                self.partial.pop(name, None)
            else:
                new = np.zeros(self.T, dtype) if old is None else old.copy()
                if isinstance(v, Rows):
                    new[v.sel] = v.values
                else:
                    np.copyto(new, v, where=m, casting="unsafe")
                w = m if old is None else self.partial.get(name)
                if w is not None:
                    w = w | m                       # a new mask: never alias the caller's
                    if w.all():
                        self.partial.pop(name, None)
                    else:
                        self.partial[name] = w
            self.regs[name] = new
        self.staged.clear()

    def fragment(self, kind, regs: list, build: Callable):
        """``build(regs)``, kept while the same register arrays come back: the four mma of
        a 2x2 warp tile share each A and B fragment, and a stored register array never
        changes (``commit`` makes a new one), so the identity of the arrays is the key."""
        key = (kind, *map(id, regs))
        hit = self._fragments.get(key)
        if hit is not None and all(x is y for x, y in zip(hit[0], regs)):
            return hit[1]
        if len(self._fragments) >= 8:
            self._fragments.clear()
        value = build(regs)
        self._fragments[key] = (regs, value)
        return value

    def check(self, name: str, m) -> None:
        """Raise ``uninitialized`` if a thread of ``m`` reads ``name`` before writing it."""
        w = self.partial.get(name)
        never = ~w if w is not None else np.ones(self.T, bool)
        bad = never if m is None else (never & m)
        if bad.any():
            raise Fault("uninitialized", np.flatnonzero(bad)[0], f"register {name} read "
                        "before any write by this thread")

    def sel(self, m) -> np.ndarray:
        """Indices of the executing threads (kept for the mask the last call saw: the
        executor passes one mask object per step, and masks are never changed)."""
        if m is None:
            return self.threads
        if m is not self._mask:
            self._mask, self._selected = m, np.flatnonzero(m)
        return self._selected


def per_lane(v, T: int) -> np.ndarray:
    """``v`` (an operand's value: one per thread, or one literal for all) as an array of
    ``T`` values; a register's array is returned as it is (``np.broadcast_to`` costs
    tens of microseconds of Python per call, as much as the arithmetic on a warp)."""
    if type(v) is np.ndarray and v.shape == (T,):
        return v
    return np.broadcast_to(v, (T,))


def imm(tok: str, ty: Ty):
    """Integer literal (decimal, 0x hex, 0b binary, leading-0 octal, U suffix) in ``ty``."""
    t = tok.rstrip("Uu")
    neg = t.startswith("-")
    t = t.lstrip("-")
    if re.fullmatch(r"0[xX][0-9a-fA-F]+", t):
        v = int(t, 16)
    elif re.fullmatch(r"0[bB][01]+", t):
        v = int(t[2:], 2)
    elif re.fullmatch(r"0[0-7]+", t):
        v = int(t, 8)
    elif re.fullmatch(r"\d+", t):
        v = int(t)
    else:
        raise ValueError(tok)
    v = (-v if neg else v) & ((1 << ty.bits) - 1)
    if ty.signed and v >> (ty.bits - 1):
        v -= 1 << ty.bits
    return ty.dtype.type(v)


def float_imm(tok: str, ty: Ty):
    """An f32 operand literal: ``0fXXXXXXXX`` (the exact bits), ``0dXXXXXXXXXXXXXXXX`` or a
    decimal like ``1.5e-3`` (PTX ISA "Floating-Point Constants": a double, rounded to
    nearest even into f32)."""
    if ty.name != "f32":
        raise ValueError(tok)
    if re.fullmatch(r"0[fF][0-9a-fA-F]{8}", tok):
        return np.uint32(int(tok[2:], 16)).view(np.float32)
    if re.fullmatch(r"0[dD][0-9a-fA-F]{16}", tok):
        value = np.uint64(int(tok[2:], 16)).view(np.float64)
    elif re.fullmatch(r"[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?", tok) and \
            re.search(r"[.eE]", tok):
        value = np.float64(float(tok))
    else:
        raise ValueError(tok)
    with np.errstate(all="ignore"):
        return np.float32(value)


def _reader(name: str, convert=None):
    """Read register ``name`` (refusing a never-written one for the threads in ``m``),
    optionally reinterpreted or truncated by ``convert``."""
    def read(st, m):
        a = st.regs.get(name)
        if a is None or name in st.partial:
            st.check(name, m)
        return a if convert is None else convert(a)
    return read


class Ctx:
    """Decodes one instruction's operands against its entry's declarations."""

    def __init__(self, entry: Entry, ins: Instr, shared_offsets: dict[str, int],
                 param_offsets: dict[str, tuple[int, str]]):
        self.entry, self.ins = entry, ins
        self.shared, self.param_offsets = shared_offsets, param_offsets

    def error(self, why: str) -> EmulatorError:
        return EmulatorError("unsupported", self.ins.line, self.ins.text, why)

    def nargs(self, *counts: int) -> tuple:
        if len(self.ins.args) not in counts:
            raise self.error(f"expected {' or '.join(map(str, counts))} operands, got "
                             f"{len(self.ins.args)}")
        return self.ins.args

    def reg_type(self, tok) -> Ty:
        if not isinstance(tok, str) or tok not in self.entry.regs:
            raise self.error(f"`{tok}` is not a declared register")
        return TYPES[self.entry.regs[tok]]

    def _width(self, tok: str, ty: Ty, relaxed: bool) -> Ty:
        """The register's type, checked against the instruction type as ptxas checks it
        (PTX ISA "Operand Type Information", "Operand Size Exceeding Instruction-Type
        Size"): a bit-size register serves any type of its size; a float instruction type
        takes its own float register or a bit-size one, an integer type never a float
        register; a wider register (``relaxed``: ld/st/cvt) only where the ISA allows
        one, never for .bf16 (PTX ISA 9.7.9.21)."""
        rty = self.reg_type(tok)
        if (rty.name == "pred") != (ty.name == "pred"):
            raise self.error(f"`{tok}` is .{rty.name}, the instruction wants .{ty.name}")
        if rty.bits != ty.bits and not (relaxed and rty.bits > ty.bits and ty.name != "bf16"):
            raise self.error(f"`{tok}` is a {rty.bits}-bit register, the instruction wants "
                             f"{ty.bits} bits")
        bit_size = rty.name[0] == "b"
        if ty.is_float and not (bit_size or (rty.name == ty.name and rty.bits == ty.bits)):
            raise self.error(f"`{tok}` is .{rty.name}, a .{ty.name} operand needs a "
                             f".{ty.name if ty.name != 'bf16' else 'b16'} or .b{ty.bits} "
                             "register")
        if ty.name[0] in "su" and rty.is_float:
            raise self.error(f"`{tok}` is .{rty.name}, a .{ty.name} operand needs an "
                             "integer or bit-size register")
        return rty

    def src(self, tok, ty: Ty, relaxed: bool = False) -> Get:
        """Value of a source operand as ``ty`` (relaxed: a wider register is truncated)."""
        if not isinstance(tok, str):
            raise self.error(f"vector operand {{{', '.join(tok)}}} not allowed here")
        if tok in SPECIAL:
            if ty.bits != 32 or ty.is_float:
                raise self.error(f"special register {tok} is a 32-bit integer")
            name = tok[1:]
            return lambda st, m: st.special[name]
        if tok in self.shared:
            if ty.is_float:
                raise self.error(f"shared symbol `{tok}` is an address, not a .{ty.name}")
            off = imm(str(self.shared[tok]), ty)
            return lambda st, m: off
        if tok.startswith("%") or tok in self.entry.regs:
            rty = self._width(tok, ty, relaxed)
            view = None if ty.name == "pred" else ty.dtype
            if rty.bits != ty.bits:
                if ty.is_float:         # the low bits, reinterpreted
                    return _reader(tok, lambda a: a.astype(ty.udtype).view(view))
                return _reader(tok, lambda a: a.astype(view))
            if view == rty.storage or view is None:
                return _reader(tok)
            return _reader(tok, lambda a: a.view(view))
        if ty.name == "pred":
            raise self.error(f"predicate operand `{tok}` must be a register")
        try:
            v = float_imm(tok, ty) if ty.is_float else imm(tok, ty)
        except ValueError:
            what = ("an f32 literal (0fXXXXXXXX or a decimal with a point)" if ty.is_float
                    else "an integer literal")
            raise self.error(f"operand `{tok}` is not a register, {what}, special "
                             "register or shared symbol") from None
        return lambda st, m: v

    def pred(self, tok: str) -> Get:
        """A predicate source, ``%p`` or ``!%p``."""
        if isinstance(tok, str) and tok.startswith("!"):
            g = self.src(tok[1:], PRED)
            return lambda st, m: ~g(st, m)
        return self.src(tok, PRED)

    def dst(self, tok, ty: Ty, relaxed: bool = False) -> Put:
        """Writer of a destination register (relaxed: a wider register gets the value
        sign- or zero-extended by ``ty``, as ld/cvt into a wider register do)."""
        if not isinstance(tok, str) or tok in SPECIAL:
            raise self.error(f"`{tok}` cannot be a destination")
        rty = self._width(tok, ty, relaxed)
        dtype = rty.storage
        if ty.is_float:                 # stage the value's bits, not a converted value
            value, bits = ty.dtype, ty.udtype

            def put_bits(st, m, v, name=tok):
                if isinstance(v, Rows):
                    v = Rows(v.sel, np.asarray(v.values, value).view(bits))
                else:
                    v = np.asarray(v, value).view(bits)
                st.staged.append((name, dtype, m, v))
            return put_bits

        def put(st, m, v, name=tok):
            st.staged.append((name, dtype, m, v))
        return put

    def address(self, tok) -> tuple[Get | None, int]:
        """``[reg]``, ``[reg+imm]``, ``[sym]``, ``[sym+imm]`` -> (register getter, offset).

        A shared symbol's offset folds into the constant; the getter returns the raw
        register bits (64-bit, or 32-bit for shared windows)."""
        m = re.fullmatch(r"\[\s*([%\w$.]+)\s*(?:([+-])\s*(-?\w+))?\s*\]", tok) \
            if isinstance(tok, str) else None
        if not m:
            raise self.error(f"address operand `{tok}` not supported")
        base, sign, off = m.groups()
        k = 0
        if off is not None:
            try:
                k = int(imm(off, TYPES["s64"])) * (-1 if sign == "-" else 1)
            except ValueError:
                raise self.error(f"address offset `{off}`") from None
        if base in self.shared:
            return None, self.shared[base] + k
        if base in self.param_offsets:
            return None, ("param", base, k)
        rty = self.reg_type(base)
        if rty.bits not in (32, 64) or rty.name == "pred":
            raise self.error(f"address register `{base}` must be 32 or 64-bit")
        return self.src(base, rty), k

    def label(self, tok) -> int:
        if not isinstance(tok, str) or tok not in self.entry.labels:
            raise self.error(f"unknown branch target `{tok}`")
        return self.entry.labels[tok]
