"""What every supported instruction does: one table of (opcode pattern -> builder).

A builder decodes one instruction (operands to closures, see ``operands.py``) and
returns an :class:`Exec`. For ordinary instructions ``Exec.run(st, m)`` computes over
all threads with numpy and writes the destination only for the threads in ``m``
(``None``: all). Control flow (bra, exit, bar.sync) is interpreted by ``machine.py``;
here it only records its target and checks its operands. An opcode no pattern matches
in full (unknown instruction, type or modifier) is refused with its line.
"""
from __future__ import annotations

import operator
import re
from typing import Callable, NamedTuple

import numpy as np

from hslm_ptx.emu.memory import Fault
from hslm_ptx.emu.operands import PRED, TYPES, U32, U64, Ctx, Rows, Ty, per_lane


class Exec(NamedTuple):
    kind: str                       # "op", "bra", "exit", "bar"
    run: Callable | None = None     # op: run(st, m); bar: run(st, m) after the checks
    target: int = -1                # bra
    uni: bool = False               # bra.uni
    warp: bool = False              # warp-collective: every lane of the warp must execute
    shared_bytes: int = 0           # ld/st.shared: bytes per thread access
    global_store_bytes: int = 0     # st.global: bytes per thread access


FORMS: list[tuple[re.Pattern, Callable[..., Exec]]] = []
INT = r"(?P<t>[su](?:16|32|64))"
ANY = r"(?P<t>[bsu](?:16|32|64))"


def form(pattern: str):
    def register(builder):
        FORMS.append((re.compile(pattern), builder))
        return builder
    return register


def decode(cx: Ctx) -> Exec:
    for pat, builder in FORMS:
        m = pat.fullmatch(cx.ins.op)
        if m:
            ex = builder(cx, **m.groupdict())
            return ex if isinstance(ex, Exec) else Exec("op", ex)
    raise cx.error(f"instruction `{cx.ins.op}` (opcode, type or modifier) is not supported")


def binary_op(cx: Ctx, t: Ty, f: Callable) -> Callable:
    """d = f(a, b), all operands of type t."""
    d, a, b = cx.nargs(3)
    put, ga, gb = cx.dst(d, t), cx.src(a, t), cx.src(b, t)
    return lambda st, m: put(st, m, f(ga(st, m), gb(st, m)))


def _wider(t: Ty) -> Ty:
    return TYPES[("s" if t.signed else "u") + str(2 * t.bits)]


# ---- integer arithmetic --------------------------------------------------------------

_ARITH = {"add": operator.add, "sub": operator.sub, "min": np.minimum, "max": np.maximum}


@form(rf"(?P<op>add|sub|min|max)\.{INT}")
def _arith(cx, op, t):
    return binary_op(cx, TYPES[t], _ARITH[op])


@form(r"(?P<op>add|sub)\.sat\.s32")
def _arith_sat(cx, op):
    f = _ARITH[op]
    return binary_op(cx, TYPES["s32"], lambda a, b: np.clip(f(np.int64(a) if np.isscalar(a) else
                                                              a.astype(np.int64), b),
                                                            -(1 << 31), (1 << 31) - 1))


@form(rf"(?P<op>mul|mad)\.(?P<mode>lo|hi|wide)\.{INT}")
def _mul(cx, op, mode, t):
    """lo: low half (wraps); hi: high half of the double-width product; wide: all of it."""
    t = TYPES[t]
    if mode != "lo" and t.bits == 64:
        raise cx.error("64-bit mul.hi/mul.wide/mad.hi need 128-bit products")
    w = _wider(t) if mode != "lo" else t
    args = cx.nargs(4 if op == "mad" else 3)
    put = cx.dst(args[0], w if mode == "wide" else t)
    ga, gb = cx.src(args[1], t), cx.src(args[2], t)
    gc = cx.src(args[3], w if mode == "wide" else t) if op == "mad" else None
    shift = t.bits if mode == "hi" else 0

    def run(st, m):
        a, b = ga(st, m), gb(st, m)
        r = a * b if mode == "lo" else np.asarray(a).astype(w.dtype) * np.asarray(b).astype(w.dtype)
        if shift:
            r = r >> shift
        if gc is not None:
            r = r + (gc(st, m) if mode == "wide" else np.asarray(gc(st, m)).astype(r.dtype))
        put(st, m, r)
    return run


@form(rf"(?P<op>div|rem)\.{INT}")
def _divrem(cx, op, t):
    """Truncating division (C semantics); a zero divisor is an ``undefined`` error."""
    t = TYPES[t]
    d, a, b = cx.nargs(3)
    put, ga, gb = cx.dst(d, t), cx.src(a, t), cx.src(b, t)

    def run(st, m):
        x = per_lane(ga(st, m), st.T)
        y = per_lane(gb(st, m), st.T)
        zero = (y == 0) if m is None else (y == 0) & m
        if zero.any():
            raise Fault("undefined", np.flatnonzero(zero)[0], f"{op} by zero")
        y = np.where(y == 0, 1, y).astype(t.dtype)
        with np.errstate(all="ignore"):
            if t.signed:
                r = np.fmod(x, y)
                q = (x - r) // y
            else:
                q, r = x // y, x % y
        put(st, m, q if op == "div" else r)
    return run


@form(r"dp4a\.(?P<ta>[su]32)\.(?P<tb>[su]32)")
def _dp4a(cx, ta, tb):
    """d = c + sum of the four byte products of a and b (bytes signed for .s32)."""
    d, a, b, c = cx.nargs(4)
    out = TYPES["s32" if "s" in ta + tb else "u32"]
    put, ga, gb, gc = cx.dst(d, out), cx.src(a, U32), cx.src(b, U32), cx.src(c, out)
    da, db = (np.int8 if x[0] == "s" else np.uint8 for x in (ta, tb))

    def run(st, m):
        x = per_lane(ga(st, m), st.T).astype(np.uint32).view(da).reshape(-1, 4)
        y = per_lane(gb(st, m), st.T).astype(np.uint32).view(db).reshape(-1, 4)
        s = (x.astype(np.int64) * y.astype(np.int64)).sum(1)
        put(st, m, s + np.asarray(gc(st, m)).astype(np.int64))
    return run


@form(r"(?P<op>neg|abs)\.(?P<t>s(?:16|32|64))")
def _neg_abs(cx, op, t):
    t = TYPES[t]
    d, a = cx.nargs(2)
    put, ga = cx.dst(d, t), cx.src(a, t)
    f = np.negative if op == "neg" else np.abs
    return lambda st, m: put(st, m, f(ga(st, m)))


# ---- logic and bits ------------------------------------------------------------------

_LOGIC = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}


@form(r"(?P<op>and|or|xor)\.(?P<t>b(?:16|32|64)|pred)")
def _logic(cx, op, t):
    return binary_op(cx, TYPES[t], _LOGIC[op])


@form(r"not\.(?P<t>b(?:16|32|64)|pred)")
def _not(cx, t):
    d, a = cx.nargs(2)
    put, ga = cx.dst(d, TYPES[t]), cx.src(a, TYPES[t])
    return lambda st, m: put(st, m, np.invert(ga(st, m)))


@form(r"(?P<op>shl|shr)\.(?P<t>[bsu](?:16|32|64))")
def _shift(cx, op, t):
    """The amount is u32 and saturates: >= width gives 0 (shl, shr.u/.b) or the sign."""
    t = TYPES[t]
    if op == "shl" and t.name[0] != "b":
        raise cx.error("shl takes only .b16/.b32/.b64")
    d, a, b = cx.nargs(3)
    put, ga, gb = cx.dst(d, t), cx.src(a, t), cx.src(b, U32)
    arith = op == "shr" and t.signed
    f = np.left_shift if op == "shl" else np.right_shift
    top = t.bits - 1

    def run(st, m):
        x, n = np.asarray(ga(st, m)), gb(st, m)
        r = f(x, np.minimum(n, top).astype(t.dtype))
        if not arith:
            r = np.where(n > top, t.dtype.type(0), r)
        put(st, m, r)
    return run


@form(r"bfe\.(?P<t>[su]32)")
def _bfe(cx, t):
    """d = bits a[pos : pos+len] (pos, len = low bytes of b, c), extended by the sign
    bit a[min(pos+len-1, 31)] for .s32 (len > 0), else by zeros."""
    t = TYPES[t]
    d, a, b, c = cx.nargs(4)
    put, ga, gb, gc = cx.dst(d, t), cx.src(a, t), cx.src(b, U32), cx.src(c, U32)

    def run(st, m):
        x = np.asarray(ga(st, m)).view(np.uint32).astype(np.uint64)
        pos = np.asarray(gb(st, m)).astype(np.uint64) & 0xFF
        ln = np.asarray(gc(st, m)).astype(np.uint64) & 0xFF
        n = np.minimum(ln, np.where(pos >= 32, 0, 32 - np.minimum(pos, 32)))  # bits taken
        keep = (np.uint64(1) << n) - np.uint64(1)
        r = (x >> np.minimum(pos, 32)) & keep
        if t.signed:
            sb = (x >> (np.minimum(pos + ln, 32) - (ln > 0))) & 1  # len 0: unused
            r = np.where((ln > 0) & (sb == 1), r | (~keep & np.uint64(0xFFFFFFFF)), r)
        put(st, m, r.astype(np.uint32).view(t.dtype))
    return run


@form(r"bfi\.b32")
def _bfi(cx):
    """f = b with bits [pos, pos+len) (clipped at 31) replaced by the low bits of a."""
    f, a, b, c, d = cx.nargs(5)
    put = cx.dst(f, TYPES["b32"])
    ga, gb = cx.src(a, TYPES["b32"]), cx.src(b, TYPES["b32"])
    gc, gd = cx.src(c, U32), cx.src(d, U32)

    def run(st, m):
        pos = np.asarray(gc(st, m)).astype(np.uint64) & 0xFF
        ln = np.asarray(gd(st, m)).astype(np.uint64) & 0xFF
        n = np.minimum(ln, np.where(pos >= 32, 0, 32 - np.minimum(pos, 32)))
        mask = ((np.uint64(1) << n) - np.uint64(1)) << np.minimum(pos, 32)
        x = np.asarray(ga(st, m)).astype(np.uint64) << np.minimum(pos, 32)
        r = (np.asarray(gb(st, m)).astype(np.uint64) & ~mask) | (x & mask)
        put(st, m, r.astype(np.uint32))
    return run


@form(r"lop3\.b32")
def _lop3(cx):
    """d[i] = lut bit (4a[i] + 2b[i] + c[i]): OR of the minterms the LUT selects."""
    d, a, b, c, lut = cx.nargs(5)
    put = cx.dst(d, TYPES["b32"])
    g = [cx.src(x, TYPES["b32"]) for x in (a, b, c)]
    try:
        table = int(lut, 0) & 0xFF
    except ValueError:
        raise cx.error("lop3 LUT must be an immediate") from None
    terms = [i for i in range(8) if table >> i & 1]

    def run(st, m):
        v = [np.asarray(gi(st, m)) for gi in g]
        nv = [np.invert(x) for x in v]
        r = np.zeros(np.broadcast(*v).shape, np.uint32)
        for i in terms:
            r = r | ((v[0] if i & 4 else nv[0]) & (v[1] if i & 2 else nv[1])
                     & (v[2] if i & 1 else nv[2]))
        put(st, m, r)
    return run


@form(r"prmt\.b32")
def _prmt(cx):
    """Generic mode: byte k of d = byte (c >> 4k & 7) of the pool b:a (a = bytes 0-3), or
    that byte's sign replicated (0x00/0xFF) when bit 3 of the nibble is set."""
    d, a, b, c = cx.nargs(4)
    put = cx.dst(d, TYPES["b32"])
    ga, gb, gc = cx.src(a, TYPES["b32"]), cx.src(b, TYPES["b32"]), cx.src(c, TYPES["b32"])

    def run(st, m):
        c = np.asarray(gc(st, m)).astype(np.uint32)
        pool = (np.asarray(gb(st, m)).astype(np.uint64) << np.uint64(32)) | \
            np.asarray(ga(st, m)).astype(np.uint64)
        signs = bool((c & np.uint32(0x8888)).any())
        d = np.zeros(np.broadcast(pool, c).shape, np.uint32)
        for k in range(4):                      # nibble k of c picks byte k of d
            nib = (c >> np.uint32(4 * k)) & np.uint32(15)
            byte = ((pool >> ((nib & np.uint32(7)) << np.uint32(3)).astype(np.uint64))
                    & np.uint64(0xFF)).astype(np.uint32)
            if signs:                           # bit 3: the byte's sign, replicated
                byte = np.where(nib >= 8, (byte >> np.uint32(7)) * np.uint32(0xFF), byte)
            d |= byte << np.uint32(8 * k)
        put(st, m, per_lane(d, st.T))
    return run


# ---- compare, select, move, convert ---------------------------------------------------

_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
        "gt": np.greater, "ge": np.greater_equal,
        "lo": np.less, "ls": np.less_equal, "hi": np.greater, "hs": np.greater_equal}


@form(rf"setp\.(?P<cmp>eq|ne|lt|le|gt|ge|lo|ls|hi|hs)(?:\.(?P<bop>and|or|xor))?\.{ANY}")
def _setp(cx, cmp, bop, t):
    """p = a cmp b (signed for .sN, unsigned for .uN; lo/ls/hi/hs only unsigned, .bN only
    eq/ne); with .and/.or/.xor, p = (a cmp b) bop c and the optional q = !(a cmp b) bop c."""
    t = TYPES[t]
    if t.name[0] == "b" and cmp not in ("eq", "ne"):
        raise cx.error(f"setp.{cmp} needs a .s or .u type, not .{t.name}")
    if t.signed and cmp in ("lo", "ls", "hi", "hs"):
        raise cx.error(f"setp.{cmp} is an unsigned comparison, not for .{t.name}")
    return setp_exec(cx, bop, t, _CMP[cmp])


def setp_exec(cx: Ctx, bop, t: Ty, compare: Callable) -> Callable:
    """The operands and combining of every setp: ``p = compare(a, b)``, or with
    .and/.or/.xor ``p = compare(a, b) bop c`` and the optional ``q = !compare(a, b) bop c``
    (PTX ISA 9.7.6.2 setp)."""
    args = cx.nargs(4 if bop else 3)
    dests = args[0].split("|") if isinstance(args[0], str) else []
    if not 1 <= len(dests) <= 2 or (len(dests) == 2 and not bop):
        raise cx.error("setp destination must be `p` or (with .and/.or/.xor) `p|q`")
    puts = [cx.dst(x.strip(), PRED) for x in dests]
    ga, gb = cx.src(args[1], t), cx.src(args[2], t)
    gc = cx.pred(args[3]) if bop else None
    f, comb = compare, _LOGIC.get(bop)

    def run(st, m):
        r = per_lane(f(ga(st, m), gb(st, m)), st.T)
        if comb is None:
            puts[0](st, m, r)
            return
        c = gc(st, m)
        puts[0](st, m, comb(r, c))
        if len(puts) == 2:
            puts[1](st, m, comb(~r, c))
    return run


@form(r"selp\.(?P<t>[bsu](?:16|32|64)|f32)")
def _selp(cx, t):
    t = TYPES[t]
    d, a, b, p = cx.nargs(4)
    put, ga, gb, gp = cx.dst(d, t), cx.src(a, t), cx.src(b, t), cx.pred(p)
    return lambda st, m: put(st, m, np.where(gp(st, m), ga(st, m), gb(st, m)))


@form(r"mov\.(?P<t>[bsu](?:16|32|64)|pred|f32)")
def _mov(cx, t):
    """Register, literal, special register, shared symbol address; a {vector} on either
    side packs/unpacks equal parts, element 0 least significant. ``mov.b32`` between an
    .f32 and an integer register copies the bits (registers hold raw bits)."""
    t = TYPES[t]
    d, a = cx.nargs(2)
    if (isinstance(d, tuple) or isinstance(a, tuple)) and t.is_float:
        raise cx.error("mov.f32 takes no {vector}; pack with mov.b32/mov.b64")
    if isinstance(d, tuple) or isinstance(a, tuple):
        parts = d if isinstance(d, tuple) else a
        pt = TYPES[f"b{t.bits // len(parts)}"] if t.bits % len(parts) == 0 else None
        if pt is None or len(parts) < 2 or t.name == "pred" or pt.bits < 8:
            raise cx.error("mov vector must split the value into 2 or 4 equal parts")
        mask, w = (1 << pt.bits) - 1, pt.bits
        if isinstance(d, tuple):
            puts, ga = [cx.dst(x, pt) for x in d], cx.src(a, t)

            def unpack(st, m):
                v = np.asarray(ga(st, m)).view(t.udtype)
                for i, p in enumerate(puts):
                    p(st, m, (v >> t.udtype.type(i * w)) & t.udtype.type(mask))
            return unpack
        put, gs = cx.dst(d, t), [cx.src(x, pt) for x in a]

        def pack(st, m):
            r = t.udtype.type(0)
            for i, g in enumerate(gs):
                r = r | (np.asarray(g(st, m)).astype(t.udtype) << t.udtype.type(i * w))
            put(st, m, r)
        return pack
    put, ga = cx.dst(d, t), cx.src(a, t)
    return lambda st, m: put(st, m, ga(st, m))


@form(r"cvt\.(?P<dt>[su](?:8|16|32|64))\.(?P<s>[su](?:8|16|32|64))")
def _cvt(cx, dt, s):
    """Integer conversion: source bits read as type s, then truncated or sign/zero-extended
    (by s's signedness) to dt; a wider destination register is extended by dt's."""
    dt, s = TYPES[dt], TYPES[s]
    d, a = cx.nargs(2)
    put, ga = cx.dst(d, dt, relaxed=True), cx.src(a, s, relaxed=True)
    return lambda st, m: put(st, m, np.asarray(ga(st, m)).astype(dt.dtype))


@form(r"cvta(?:\.to)?\.global\.u64")
def _cvta(cx):
    """Generic and global addresses are the same in this emulator."""
    d, a = cx.nargs(2)
    put, ga = cx.dst(d, U64), cx.src(a, U64)
    return lambda st, m: put(st, m, ga(st, m))


# ---- memory -------------------------------------------------------------------------

# Memory-consistency qualifiers (PTX ISA 9.7.9.8 ld, 9.7.9.10 st; 8 "Memory Consistency
# Model"): the lockstep executor performs every access in program order, each one
# visible to all threads at once, so acquire/release/volatile are already honoured.
_SCOPE = r"\.(?:cta|gpu|sys)"
_LD_HINTS = rf"(?:\.(?:weak|volatile|relaxed{_SCOPE}|acquire{_SCOPE}))?"
_ST_HINTS = rf"(?:\.(?:weak|volatile|relaxed{_SCOPE}|release{_SCOPE}))?"
_SPACE = r"(?:\.(?P<space>global|shared))?"      # none: generic, = global here
_CACHE = r"(?:\.(?P<nc>nc))?(?:\.(?:ca|cg|cs|lu|cv|wb|wt))?"
_VEC = r"(?:\.v(?P<vec>[24]))?"
_MTYPE = r"\.(?P<t>[bsu](?:8|16|32|64)|f32)"


class Access(NamedTuple):
    """One global or shared memory instruction: ``vec`` elements of ``elem`` bytes per
    thread at register ``base`` (None: a shared symbol) plus ``offset``."""

    opcode: str             # "ld.global", "st.shared", ... (what traffic is filed under)
    line: int
    space: str              # "global" or "shared"
    elem: int
    vec: int
    base: Callable | None
    offset: np.uint64

    @property
    def shared_bytes(self) -> int:
        return self.elem * self.vec if self.space == "shared" else 0

    def memory(self, st):
        return st.smem if self.space == "shared" else st.gmem

    def addresses(self, st, m, sel: np.ndarray) -> np.ndarray:
        """One address per executing thread (``sel``: their indices)."""
        if self.base is None:
            return np.full(sel.size, self.offset, np.uint64)
        a = per_lane(np.asarray(self.base(st, m), dtype=np.uint64), st.T)
        return (a if m is None else a[sel]) + self.offset

    def record(self, st, addr: np.ndarray, sel: np.ndarray) -> None:
        """File one execution with the launch's traffic counts (see ``traffic.py``)."""
        st.traffic.record(self.line, self.opcode, self.space, addr, sel, self.elem * self.vec)


def _access(cx: Ctx, op: str, space, nc, vec, t: Ty) -> tuple[tuple, Access]:
    """The value operands (one per vector element) and the address of ``ld d, [a]`` or
    ``st [a], d``."""
    if nc and (op == "st" or space != "global"):
        raise cx.error(".nc is only for ld.global")
    a0, a1 = cx.nargs(2)
    addr_tok, val = (a1, a0) if op == "ld" else (a0, a1)
    vec = int(vec or 1)
    vals = val if isinstance(val, tuple) else (val,)
    if len(vals) != vec:
        raise cx.error(f"expected {vec} value operand(s)")
    base, off = cx.address(addr_tok)
    if isinstance(off, tuple):
        raise cx.error("a kernel parameter is only addressed by ld.param")
    if base is None and space != "shared":
        raise cx.error("a shared symbol is only addressed by ld.shared/st.shared")
    space = space or "global"
    return vals, Access(f"{op}.{space}", cx.ins.line, space, t.bits // 8, vec, base,
                        np.uint64(off & (2 ** 64 - 1)))


@form(rf"ld{_LD_HINTS}\.param{_MTYPE}")
def _ld_param(cx, t):
    """Scalar ld.param of a kernel parameter: its bytes in the launch's parameter block."""
    t = TYPES[t]
    val, addr_tok = cx.nargs(2)
    _, off = cx.address(addr_tok)
    if isinstance(val, tuple) or not isinstance(off, tuple):
        raise cx.error("only scalar ld.param from a kernel parameter is supported")
    _, name, k = off
    poff, pty = cx.param_offsets[name]
    elem = t.bits // 8
    if k < 0 or k + elem > TYPES[pty].bits // 8:
        raise cx.error(f"ld.param outside parameter `{name}`")
    put, where = cx.dst(val, t, relaxed=True), poff + k

    def ld_param(st, m):
        raw = np.frombuffer(st.params, t.udtype, 1, where)[0]
        put(st, m, raw.view(t.dtype))
    return ld_param


@form(rf"ld{_LD_HINTS}{_SPACE}{_CACHE}{_VEC}{_MTYPE}")
def _ld(cx, space, nc, vec, t):
    """ld .global (or generic) / .shared, scalar or .v2/.v4 (element 0 at the lowest
    address); a narrower type is extended into a wider register. Cache hints are
    accepted as no-ops; .nc only on ld.global."""
    t = TYPES[t]
    vals, acc = _access(cx, "ld", space, nc, vec, t)
    puts = [cx.dst(v, t, relaxed=True) for v in vals]

    def ld(st, m):
        sel = st.sel(m)
        addr = acc.addresses(st, m, sel)
        got = acc.memory(st).load(addr, sel, acc.elem, acc.vec)
        acc.record(st, addr, sel)
        for j, put in enumerate(puts):
            v = got[:, j].view(t.dtype)
            put(st, m, v if m is None else Rows(sel, v))
    return Exec("op", ld, shared_bytes=acc.shared_bytes)


@form(rf"st{_ST_HINTS}{_SPACE}{_CACHE}{_VEC}{_MTYPE}")
def _st(cx, space, nc, vec, t):
    """st .global (or generic) / .shared, scalar or .v2/.v4; a wider register is
    truncated to the type."""
    t = TYPES[t]
    vals, acc = _access(cx, "st", space, nc, vec, t)
    gets = [cx.src(v, t, relaxed=True) for v in vals]

    def st_(st, m):
        sel = st.sel(m)
        data = np.empty((sel.size, acc.vec), t.udtype)
        for j, g in enumerate(gets):
            v = per_lane(np.asarray(g(st, m)).view(t.udtype), st.T)
            data[:, j] = v if m is None else v[sel]
        addr = acc.addresses(st, m, sel)
        acc.memory(st).store(addr, sel, acc.elem, acc.vec, data)
        acc.record(st, addr, sel)
    return Exec("op", st_, shared_bytes=acc.shared_bytes,
                global_store_bytes=acc.elem * acc.vec if acc.space == "global" else 0)


# ---- control --------------------------------------------------------------------------

@form(r"bra(?P<uni>\.uni)?")
def _bra(cx, uni):
    (target,) = cx.nargs(1)
    return Exec("bra", target=cx.label(target), uni=bool(uni))


@form(r"ret(?:\.uni)?|exit")
def _exit(cx):
    cx.nargs(0)
    return Exec("exit")


@form(r"(?:bar|barrier)\.sync(?:\.aligned)?")
def _bar(cx):
    """Barrier 0..15 over the whole CTA (a thread-count operand is not supported)."""
    (bid,) = cx.nargs(1)
    if not re.fullmatch(r"\d+", bid) or int(bid) > 15:
        raise cx.error("barrier id must be a literal 0..15 (and no thread count)")
    return Exec("bar")


# ---- tensor cores ---------------------------------------------------------------------

_QUAD = np.dtype((np.void, 16))     # four 32-bit words moved as one item


def _quads(v, T: int, W: int) -> np.ndarray:
    """A register's words [warp, g, t] as [warp, g] items of the 4 lanes t = 0..3."""
    return np.ascontiguousarray(per_lane(v, T)).view(_QUAD).reshape(W, 8)


@form(r"mma\.sync\.aligned\.m16n8k(?P<k>16|32)\.row\.col(?P<sat>\.satfinite)?"
      r"\.s32\.(?P<ta>[su]8)\.(?P<tb>[su]8)\.s32")
def _mma(cx, k, sat, ta, tb):
    """D(16x8) = A(16xK) B(Kx8) + C per warp, fragments as in the PTX ISA ("Matrix Fragments
    for mma.m16n8k32"):
    lane l, g = l >> 2, t = l & 3; A reg r byte i holds A[g + 8(r&1)][16(r>>1) + 4t + i],
    B reg r byte i holds B[16r + 4t + i][g], C/D reg r holds C[g + 8(r>>1)][2t + (r&1)].
    The sum is exact (int64), then wraps to int32, or clamps with .satfinite."""
    k = int(k)
    na, nb = k // 8, k // 16
    d, a, b, c = cx.nargs(4)
    for name, x, n in (("D", d, 4), ("A", a, na), ("B", b, nb), ("C", c, 4)):
        if not isinstance(x, tuple) or len(x) != n:
            raise cx.error(f"mma m16n8k{k} {name} needs {{{n} registers}}")
    s32, b32 = TYPES["s32"], TYPES["b32"]
    puts = [cx.dst(x, s32) for x in d]
    ga = [cx.src(x, b32) for x in a]
    gb = [cx.src(x, b32) for x in b]
    gc = [cx.src(x, s32) for x in c]
    adt, bdt = (np.dtype(np.int8 if x == "s8" else np.uint8) for x in (ta, tb))

    def run(st, m):
        T = st.T
        W = T // 32
        # Place whole 32-bit words (4 k-consecutive bytes) as rows, then view the bytes.
        # The 4 words of the lanes t = 0..3 of a group g are k-consecutive too: they move
        # as one 16-byte item (a quarter of the copies of moving words).
        # A: reg r of lane (g, t) -> [warp, rowhalf = r & 1, g, h = r >> 1, t]
        def a_rows(regs):
            A = np.empty((W, 2, 8, nb), _QUAD)
            for r, v in enumerate(regs):
                A[:, r & 1, :, r >> 1] = _quads(v, T, W)
            return A.view(np.uint32).reshape(W, 16, k // 4).view(adt).astype(np.float32)

        # B: reg h of lane (g = n, t) -> [warp, n, h, t]
        def b_columns(regs):
            B = np.empty((W, 8, nb), _QUAD)
            for h, v in enumerate(regs):
                B[:, :, h] = _quads(v, T, W)
            return B.view(np.uint32).reshape(W, 8, k // 4).view(bdt).astype(np.float32) \
                .transpose(0, 2, 1)

        # exact in float32: |sum| <= 32 * 255 * 255 < 2**24
        AB = np.matmul(st.fragment(("A", adt), [g(st, m) for g in ga], a_rows),
                       st.fragment(("B", bdt), [g(st, m) for g in gb], b_columns))
        # AB [warp, rowhalf, g, t, j]: D reg r = 2 rowhalf + j of lane (g, t)
        AB = AB.reshape(W, 2, 8, 4, 2).astype(np.int64 if sat else np.int32)
        for r, (put, g) in enumerate(zip(puts, gc)):
            c = g(st, m)
            c = c.reshape(W, 8, 4) if np.ndim(c) else c
            v = np.empty((W, 8, 4), AB.dtype)
            np.add(AB[:, r >> 1, :, :, r & 1], c, out=v)  # int32 + int32 wraps like hardware
            v = v.reshape(T)
            put(st, m, np.clip(v, -(1 << 31), (1 << 31) - 1) if sat else v)
    return Exec("op", run, warp=True)
