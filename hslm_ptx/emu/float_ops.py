"""The f32 instructions, and conversions between f32, f16, bf16 and the integers.

Arithmetic is numpy float32, which is IEEE 754 binary32 with round to nearest even and
subnormals kept: what the ``.rn`` forms (and the forms without a rounding modifier,
whose default is ``.rn``) compute (PTX ISA 9.7.3 "Floating-Point Instructions";
``.ftz``, ``.sat`` and the approximate forms are refused). No multiply-add is fused.

A NaN result is the canonical NaN 0x7FFFFFFF (CUDA C++ Programming Guide, "Floating-Point
Standard": an operation whose result is NaN gives that one quiet NaN), so the bits a
kernel stores do not depend on which operand was NaN. ``abs`` and ``neg`` only change
the sign bit. 16-bit rounding goes through hslm_ptx.formats.floats, the definition the numpy
references use too.
"""
from __future__ import annotations

import numpy as np

from hslm_ptx.formats.floats import bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16
from hslm_ptx.emu.operands import F32, PRED, TYPES, per_lane
from hslm_ptx.emu.ops import binary_op, form, setp_exec

CANONICAL_NAN = np.uint32(0x7FFFFFFF).view(np.float32)
_SIGN = np.uint32(0x80000000)
_SMALLEST_NORMAL = np.float32(2.0 ** -126)


def canonical(r) -> np.ndarray:
    """``r`` as float32 with every NaN replaced by the canonical NaN."""
    r = np.asarray(r, np.float32)
    nan = np.isnan(r)
    return np.where(nan, CANONICAL_NAN, r) if nan.any() else r


def _ieee(f):
    """``f`` over float32 operands with IEEE exceptions silent (inf and NaN are values)."""
    def run(*operands):
        with np.errstate(all="ignore"):
            return canonical(f(*(np.asarray(x, np.float32) for x in operands)))
    return run


def _bits(x) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


# ---- arithmetic (PTX ISA 9.7.3.3 add, 9.7.3.4 sub, 9.7.3.5 mul, 9.7.3.8 div, 9.7.3.13 rcp)

_ARITH = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


@form(r"(?P<op>add|sub|mul)(?:\.rn)?\.f32")
def _farith(cx, op):
    """d = a op b rounded once to nearest even (no modifier means .rn)."""
    return binary_op(cx, F32, _ieee(_ARITH[op]))


@form(r"div\.rn\.f32")
def _fdiv(cx):
    """IEEE division (div.full and div.approx are approximations: refused)."""
    return binary_op(cx, F32, _ieee(np.divide))


@form(r"rcp\.rn\.f32")
def _frcp(cx):
    """d = 1 / a, correctly rounded (rcp.approx refused)."""
    d, a = cx.nargs(2)
    put, ga = cx.dst(d, F32), cx.src(a, F32)
    inverse = _ieee(lambda x: np.float32(1) / x)
    return lambda st, m: put(st, m, inverse(ga(st, m)))


@form(r"(?P<op>abs|neg)\.f32")
def _fsign(cx, op):
    """abs clears and neg flips the sign bit (PTX ISA 9.7.3.9, 9.7.3.10), NaN included."""
    d, a = cx.nargs(2)
    put, ga = cx.dst(d, F32), cx.src(a, F32)
    if op == "abs":
        return lambda st, m: put(st, m, (_bits(ga(st, m)) & ~_SIGN).view(np.float32))
    return lambda st, m: put(st, m, (_bits(ga(st, m)) ^ _SIGN).view(np.float32))


def _min_max(op: str, propagate_nan: bool):
    """PTX ISA 9.7.3.11 min / 9.7.3.12 max: +0.0 > -0.0; one NaN input gives the other
    input, two give NaN; with .NaN any NaN input gives the canonical NaN."""
    def run(a, b):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        with np.errstate(all="ignore"):
            pick = np.where(a > b, a, b) if op == "max" else np.where(a < b, a, b)
        # equal values have equal bits except +0/-0: AND keeps +0 (max), OR keeps -0 (min)
        tie = (_bits(a) & _bits(b)) if op == "max" else (_bits(a) | _bits(b))
        r = np.where(a == b, tie.view(np.float32), pick)
        na, nb = np.isnan(a), np.isnan(b)
        if propagate_nan:
            return np.where(na | nb, CANONICAL_NAN, r)
        r = np.where(na, b, np.where(nb, a, r))
        return np.where(na & nb, CANONICAL_NAN, r)
    return run


@form(r"(?P<op>min|max)(?P<nan>\.NaN)?\.f32")
def _fminmax(cx, op, nan):
    return binary_op(cx, F32, _min_max(op, bool(nan)))


# ---- compare and classify (PTX ISA 9.3.1.2 "Floating Point Comparisons", 9.7.6.2 setp,
# 9.7.3.1 testp)

_ORDERED = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
            "gt": np.greater, "ge": np.greater_equal}


def _float_compare(cmp: str):
    """Ordered (eq..ge): false when either operand is NaN; unordered (equ..geu): true
    then; num: neither is NaN; nan: either is."""
    def compare(a, b):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        either = np.isnan(a) | np.isnan(b)
        if cmp == "num":
            return ~either
        if cmp == "nan":
            return either
        if cmp.endswith("u"):
            return _ORDERED[cmp[:-1]](a, b) | either
        return _ORDERED[cmp](a, b) & ~either
    return compare


@form(r"setp\.(?P<cmp>eq|ne|lt|le|gt|ge|equ|neu|ltu|leu|gtu|geu|num|nan)"
      r"(?:\.(?P<bop>and|or|xor))?\.f32")
def _fsetp(cx, cmp, bop):
    return setp_exec(cx, bop, F32, _float_compare(cmp))


_CLASSES = {
    "finite": np.isfinite,
    "infinite": np.isinf,
    "number": lambda x: ~np.isnan(x),
    "notanumber": np.isnan,
    "normal": lambda x: np.isfinite(x) & (np.abs(x) >= _SMALLEST_NORMAL),
    "subnormal": lambda x: (np.abs(x) < _SMALLEST_NORMAL) & (x != 0),
}


@form(r"testp\.(?P<op>finite|infinite|number|notanumber|normal|subnormal)\.f32")
def _testp(cx, op):
    """p = the class test of a (zero is neither normal nor subnormal)."""
    d, a = cx.nargs(2)
    put, ga, test = cx.dst(d, PRED), cx.src(a, F32), _CLASSES[op]
    return lambda st, m: put(st, m, per_lane(test(np.asarray(ga(st, m))), st.T))


# ---- conversions (PTX ISA 9.7.9.21 cvt) ------------------------------------------------

_INT_ROUNDING = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}
_FROM_HALF = {"f16": f16_to_f32, "bf16": bf16_to_f32}
_TO_HALF = {"f16": f32_to_f16, "bf16": f32_to_bf16}
_INT = r"[su](?:8|16|32|64)"


def _f32_of_int(x) -> np.ndarray:
    """Integer to f32: exact in f64 (any 32-bit integer is), then one rounding to nearest
    even, so the result is the correctly rounded ``cvt.rn.f32``."""
    return np.asarray(x).astype(np.float64).astype(np.float32)


def _int_of_float(rnd: str, dt):
    """Float to integer, rounded by ``rnd``: "the result is clamped to the destination
    range by default; i.e, .sat is redundant", and a NaN input "results in ... zero if
    source is not .f64 and destination is not .s64, .u64" (PTX ISA 9.7.9.21 cvt, Integer
    Notes and Saturation modifier)."""
    lo, hi = np.iinfo(dt.dtype).min, np.iinfo(dt.dtype).max
    rounding = _INT_ROUNDING[rnd]

    def convert(x):
        wide = np.asarray(x, np.float32).astype(np.float64)   # exact
        nan = np.isnan(wide)
        r = np.clip(rounding(np.where(nan, 0.0, wide)), lo, hi)
        return r.astype(dt.dtype)
    return convert


@form(rf"cvt(?:\.(?P<rnd>rn|rz|rm|rp|rni|rzi|rmi|rpi))?(?P<sat>\.sat)?"
      rf"\.(?P<dt>f16|bf16|f32|{_INT})\.(?P<s>f16|bf16|f32|{_INT})")
def _fcvt(cx, rnd, sat, dt, s):
    """f32 <- f16/bf16 (exact, no rounding modifier); f16/bf16 <- f32 (.rn: nearest even,
    hslm_ptx.formats.floats); f32 <- 8/16/32-bit integer (.rn; exact in f64, then one rounding);
    8/16/32-bit integer <- f32 (.rni/.rzi/.rmi/.rpi, clamped, NaN -> 0, .sat allowed)."""
    dt, s = TYPES[dt], TYPES[s]
    d, a = cx.nargs(2)
    if not (dt.is_float or s.is_float):
        raise cx.error("an integer cvt takes no rounding or .sat modifier here")
    if sat and not (s.is_float and not dt.is_float):
        raise cx.error(".sat is supported only on float-to-integer cvt")
    if dt.is_float and s.is_float:
        if dt.name == "f32" and s.name in _FROM_HALF:
            if rnd:
                raise cx.error(f"cvt.f32.{s.name} is exact: no rounding modifier")
            f = _FROM_HALF[s.name]
        elif s.name == "f32" and dt.name in _TO_HALF:
            if rnd != "rn":
                raise cx.error(f"cvt.{dt.name}.f32 needs .rn (the only rounding supported)")
            f = _TO_HALF[dt.name]
        else:
            raise cx.error(f"cvt.{dt.name}.{s.name} is not supported")
    elif dt.is_float:
        if dt.name != "f32" or s.bits > 32:
            raise cx.error("integer-to-float cvt is supported into .f32 from 8/16/32 bits")
        if rnd != "rn":
            raise cx.error(f"cvt.f32.{s.name} needs .rn (the only rounding supported)")
        f = _f32_of_int
    else:
        if s.name != "f32" or dt.bits > 32:
            raise cx.error("float-to-integer cvt is supported from .f32 into 8/16/32 bits")
        if rnd not in _INT_ROUNDING:
            raise cx.error(f"cvt.{dt.name}.f32 needs an integer rounding "
                           "(.rni, .rzi, .rmi or .rpi)")
        f = _int_of_float(rnd, dt)
    put, ga = cx.dst(d, dt, relaxed=True), cx.src(a, s, relaxed=True)

    def run(st, m):
        with np.errstate(all="ignore"):         # overflow to inf is the answer, not an error
            put(st, m, f(ga(st, m)))
    return run
