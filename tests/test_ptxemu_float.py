"""The emulator's float forms (f32 arithmetic, min/max, setp, testp, cvt to and from
f16/bf16/integers), shfl.sync, fences and the ordering forms, against hand-written PTX
whose answers are known from the PTX ISA (NaN, inf, -0, ties to even, clamping).

Every body in ``BODIES`` is also assembled by ptxas (``test_accepted_forms_assemble``),
so a form the emulator accepts is one the real assembler accepts too, and the forms on
a body's own lines count as unit-tested for tests/test_ptxemu_forms.py's check that
every form a kernel emits has a test.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from floatcases import BODIES, HEADER, entry, module

from hslm_ptx.formats.floats import f32_to_bf16, f32_to_f16
from hslm_ptx.emit.ptx import Ptx
from hslm_ptx.emu import EmulatorError, Module


U = np.uint32
CANON = 0x7FFFFFFF             # the canonical NaN a NaN result has
NEG_ZERO = 0x80000000
INF, NINF = 0x7F800000, 0xFF800000
# edge values as bits: zeros, ones, ties, the largest finite, the smallest subnormal
# and normal, infinities, NaNs with payload and sign
EDGES = [0x00000000, NEG_ZERO, 0x3F800000, 0xBF800000, 0x3FC00000, 0x3DCCCCCD, 0x40200000,
         0x40400000, 0x4B800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x00800000, INF, NINF,
         0x7FC00000, 0x7FC00001, 0xFFC00000]



def launch(name: str, a, b=None, block: int = 64, ptx: str | None = None) -> np.ndarray:
    """Run body ``name`` over len(a) threads (a, b: u32 bits or float32); the u32 results."""
    a = np.ascontiguousarray(np.asarray(a).view(U) if np.asarray(a).dtype == np.float32
                             else np.asarray(a, np.uint64).astype(U))
    b = np.zeros_like(a) if b is None else np.ascontiguousarray(
        np.asarray(b).view(U) if np.asarray(b).dtype == np.float32
        else np.asarray(b, np.uint64).astype(U))
    assert a.size % block == 0 and b.size == a.size
    out = np.zeros(a.size, U)
    fn = Module(code=ptx or module(name)).get_function(f"k_{name}")
    fn((a.size // block,), (block,), [out, a, b])
    return out


def launch_into(name: str, a: np.ndarray, b: np.ndarray, block: int = 64) -> np.ndarray:
    """Run body ``name`` on u32 arrays ``a`` and ``b`` in place (the body may write them)."""
    out = np.zeros(a.size, U)
    Module(code=module(name)).get_function(f"k_{name}")((a.size // block,), (block,), [out, a, b])
    return out


def padded(values: list[int], block: int = 64) -> np.ndarray:
    n = -(-len(values) // block) * block
    return np.array(values + [0] * (n - len(values)), np.uint64).astype(U)


def pairs() -> tuple[np.ndarray, np.ndarray, int]:
    a, b = zip(*[(x, y) for x in EDGES for y in EDGES])
    return padded(list(a)), padded(list(b)), len(a)


def canonical_bits(x) -> np.ndarray:
    """numpy's float32 result as the GPU stores it: every NaN canonical."""
    x = np.asarray(x, np.float32)
    return np.where(np.isnan(x), U(CANON), x.view(U))


def f(bits) -> np.ndarray:
    return np.asarray(bits, np.uint64).astype(U).view(np.float32)


# ---- arithmetic -----------------------------------------------------------------------

@pytest.mark.parametrize("op", ["add", "add_rn", "sub", "sub_rn", "mul", "mul_rn", "div"])
def test_arithmetic_is_ieee_round_to_nearest_even(op):
    a, b, n = pairs()
    got = launch(op, a, b)
    ufunc = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op[:3]]
    with np.errstate(all="ignore"):
        want = canonical_bits(ufunc(f(a), f(b)))
    assert (got[:n] == want[:n]).all()


def test_arithmetic_known_answers():
    cases = [  # (op, a, b, bits of the answer)
        ("add", 16777216.0, 1.0, 0x4B800000),     # 2^24 + 1: tie, rounds to even 2^24
        ("add", 16777216.0, 3.0, 0x4B800002),     # 2^24 + 3: tie, rounds up to 2^24 + 4
        ("add", -0.0, -0.0, NEG_ZERO),
        ("add", -0.0, 0.0, 0),
        ("sub", np.inf, np.inf, CANON),
        ("mul", 0.0, np.inf, CANON),
        ("mul", -1.0, 0.0, NEG_ZERO),
        ("mul", 3.4028235e38, 2.0, INF),          # overflow
        ("mul", 1e-45, 0.5, 0),                   # smallest subnormal / 2: tie to even 0
        ("div", 1.0, 0.0, INF),
        ("div", -1.0, 0.0, NINF),
        ("div", 0.0, 0.0, CANON),
        ("div", 1.0, 3.0, 0x3EAAAAAB),
        ("div", 1.0, -0.0, NINF),
    ]
    for op, x, y, want in cases:
        got = launch(op, np.full(64, x, np.float32), np.full(64, y, np.float32))
        assert (got == want).all(), (op, x, y, hex(int(got[0])))


def test_reciprocal():
    x = padded(EDGES)
    got = launch("rcp", x)
    with np.errstate(all="ignore"):
        want = canonical_bits(np.float32(1) / f(x))
    assert (got[:len(EDGES)] == want[:len(EDGES)]).all()
    assert got[EDGES.index(NEG_ZERO)] == NINF and got[EDGES.index(INF)] == 0
    assert got[EDGES.index(0x40400000)] == 0x3EAAAAAB       # 1/3


def test_abs_and_neg_change_only_the_sign_bit():
    x = padded(EDGES)
    assert (launch("abs", x) == (x & U(0x7FFFFFFF))).all()
    assert (launch("neg", x) == (x ^ U(0x80000000))).all()
    assert launch("neg", padded([0]))[0] == NEG_ZERO


MINMAX = [  # (a, b, min, max, min.NaN, max.NaN) as bits
    (0, NEG_ZERO, NEG_ZERO, 0, NEG_ZERO, 0),
    (NEG_ZERO, 0, NEG_ZERO, 0, NEG_ZERO, 0),
    (0x7FC00001, 0x3F800000, 0x3F800000, 0x3F800000, CANON, CANON),
    (0x3F800000, 0xFFC00000, 0x3F800000, 0x3F800000, CANON, CANON),
    (0x7FC00000, 0xFFC00000, CANON, CANON, CANON, CANON),
    (NINF, 0x40400000, NINF, 0x40400000, NINF, 0x40400000),
    (0x7FC00000, NINF, NINF, NINF, CANON, CANON),
    (0x00000001, 0x80000001, 0x80000001, 0x00000001, 0x80000001, 0x00000001),
]


@pytest.mark.parametrize("column, name", [(2, "min"), (3, "max"), (4, "min_NaN"), (5, "max_NaN")])
def test_min_max_zeros_and_nans(column, name):
    a, b = padded([r[0] for r in MINMAX]), padded([r[1] for r in MINMAX])
    got = launch(name, a, b)
    assert got[:len(MINMAX)].tolist() == [r[column] for r in MINMAX]


# ---- compare, select, move ---------------------------------------------------------------

def _setp_model(cmp: str, x: float, y: float) -> bool:
    """PTX ISA 9.3.1.2: ordered compares are false on NaN, unordered ones true."""
    nan = np.isnan(x) or np.isnan(y)
    if cmp == "num":
        return not nan
    if cmp == "nan":
        return nan
    rel = {"eq": x == y, "ne": x != y, "lt": x < y, "le": x <= y, "gt": x > y,
           "ge": x >= y}[cmp[:-1] if cmp.endswith("u") else cmp]
    return (rel or nan) if cmp.endswith("u") else (rel and not nan)


@pytest.mark.parametrize("cmp", ["eq", "ne", "lt", "le", "gt", "ge", "equ", "neu", "ltu", "leu",
                                 "gtu", "geu", "num", "nan"])
def test_setp_ordered_unordered(cmp):
    a, b, n = pairs()
    got = launch(f"setp_{cmp}", a, b)
    want = [_setp_model(cmp, float(x), float(y)) for x, y in zip(f(a[:n]), f(b[:n]))]
    assert got[:n].tolist() == [int(w) for w in want]
    assert _setp_model("ne", np.nan, 1.0) is False and _setp_model("neu", np.nan, 1.0) is True
    assert _setp_model("eq", 0.0, -0.0) is True


def test_setp_and_with_complement():
    a = np.array([0.5, 2.0, np.nan, 0.5] * 16, np.float32)
    b = np.array([1.0, 1.0, 1.0, -1.0] * 16, np.float32)
    got = launch("setp_and", a, b)[:4].tolist()
    # p = (a < 1) and (b > 0); q = !(a < 1) and (b > 0); NaN: a < 1 is false
    assert got == [1, 2, 2, 0]


def test_selp_and_literals():
    a = np.array([2.0, -3.0, np.nan, 0.0] * 16, np.float32)
    b = np.zeros(64, np.float32)
    assert launch("selp", a, b)[:4].tolist() == [0x40000000, 0xBF800000, 0xBF800000, 0xBF800000]
    # both sources registers: the smaller of a and b (b where a < b is false, NaN included)
    c = np.array([1.0, 5.0, np.nan, -0.0] * 16, np.float32)
    assert launch("selp_regs", a, c)[:4].tolist() == [0x3F800000, 0xC0400000, 0x7FC00000, 0x80000000]
    # both sources literals: 2^64 where a > b, else 1 (NaN compares false)
    assert launch("selp_imms", a, b)[:4].tolist() == [0x5F800000, 0x3F800000, 0x3F800000, 0x3F800000]
    assert (launch("mov_hex", a) == 0x3FC00000).all()
    assert (launch("mov_decimal", a) == np.float32(0.1).view(U)).all()      # 0x3DCCCCCD
    assert (launch("mov_double", a) == 0x3FC00000).all()


def test_bit_casts_between_float_and_integer_registers():
    x = padded([0x3F800000, 0x00000001, NEG_ZERO, 0x7F800000, 0x7FC00001])
    got = launch("bitcast", x)
    # + 0.0 is exact for numbers (-0 + 0 = +0), a NaN comes back canonical
    assert got[:5].tolist() == [0x3F800000, 0x00000001, 0, 0x7F800000, CANON]


def test_testp_classes():
    x = padded(EDGES)
    v = f(x[:len(EDGES)])
    want = {"finite": np.isfinite(v), "infinite": np.isinf(v), "number": ~np.isnan(v),
            "notanumber": np.isnan(v),
            "normal": np.isfinite(v) & (np.abs(v) >= np.float32(2.0 ** -126)),
            "subnormal": (v != 0) & (np.abs(v) < np.float32(2.0 ** -126))}
    for test, expect in want.items():
        assert launch(f"testp_{test}", x)[:len(EDGES)].tolist() == expect.astype(int).tolist()
    assert launch("testp_subnormal", padded([1]))[0] == 1
    assert launch("testp_normal", padded([0]))[0] == 0


# ---- conversions ---------------------------------------------------------------------

def test_narrowing_to_bf16_and_f16_rounds_to_nearest_even():
    known = [  # (f32 bits, bf16 bits, f16 bits)
        (0x3F808000, 0x3F80, 0x3C04),   # 1 + 2^-8: bf16 tie -> even 1.0
        (0x3F818000, 0x3F82, 0x3C0C),   # 1 + 3 * 2^-8: bf16 tie -> up
        (0x477FE000, 0x4780, 0x7BFF),   # 65504: f16's largest finite
        (0x477FF000, 0x4780, 0x7C00),   # 65520: f16 tie between 65504 and 2^16 -> even: inf
        (0x7F7FFFFF, 0x7F80, 0x7C00),   # f32 max: bf16 rounds up to inf
        (NEG_ZERO, 0x8000, 0x8000),
        (INF, 0x7F80, 0x7C00),
        (0x33800000, 0x3380, 0x0001),   # 2^-24: f16's smallest subnormal
        (0x33000000, 0x3300, 0x0000),   # 2^-25: f16 tie between 0 and 2^-24 -> even: 0
        (0x33400000, 0x3340, 0x0001),   # 1.5 * 2^-25: above the tie
    ]
    x = padded([k[0] for k in known])
    assert launch("to_bf16", x)[:len(known)].tolist() == [k[1] for k in known]
    assert launch("to_f16", x)[:len(known)].tolist() == [k[2] for k in known]
    every = padded(EDGES)
    assert (launch("to_bf16", every)[:len(EDGES)] == f32_to_bf16(f(every))[:len(EDGES)]).all()
    with np.errstate(over="ignore"):
        want16 = f32_to_f16(f(every)).view(np.uint16)
    nan = np.isnan(f(every))
    assert (launch("to_f16", every)[~nan] == want16[~nan]).all()
    assert ((launch("to_f16", every)[nan] & 0x7C00) == 0x7C00).all()    # NaN stays NaN
    assert launch("to_bf16", padded([0x7FC00001]))[0] == 0x7FFF         # hslm_ptx.formats.floats' NaN


def test_widening_from_bf16_and_f16_is_exact():
    halves = np.array([0x3F80, 0xBF80, 0x0001, 0x7F80, 0xFF80, 0x8000, 0x7FC1, 0x3C00, 0x7BFF,
                       0x0400] * 6 + [0] * 4, np.uint16)
    words = halves.astype(U)             # each thread reads the low half of its word
    bf = launch("from_bf16", words)
    assert (bf == (halves.astype(U) << 16)).all()
    hf = launch("from_f16", words)
    want = halves.view(np.float16).astype(np.float32)
    assert (hf[~np.isnan(want)] == want[~np.isnan(want)].view(U)).all()
    assert ((hf[np.isnan(want)] & 0x7F800000) == 0x7F800000).all()
    # 1.875, 2^-24 (the smallest subnormal), -0, 1, 65504 (the largest), 2^-14
    assert hf[[0, 2, 5, 7, 8, 9]].tolist() == [0x3FF00000, 0x33800000, NEG_ZERO, 0x3F800000,
                                               0x477FE000, 0x38800000]


def test_integer_to_f32_rounds_to_nearest_even():
    ints = [16777217, 16777219, -16777217, 0x7FFFFFFF, -(1 << 31), 3, -3, 0]
    x = padded([v & 0xFFFFFFFF for v in ints])
    got = f(launch("from_s32", x)[:len(ints)]).tolist()
    assert got == [16777216.0, 16777220.0, -16777216.0, 2147483648.0, -2147483648.0, 3.0, -3.0, 0.0]
    gotu = f(launch("from_u32", padded([0xFFFFFFFF, 16777217, 0x80000001]))[:3]).tolist()
    assert gotu == [4294967296.0, 16777216.0, 2147483648.0]


FLOAT_TO_INT = [  # (value, rni, rzi, rmi, rpi) as s32
    (2.5, 2, 2, 2, 3), (3.5, 4, 3, 3, 4), (-2.5, -2, -2, -3, -2), (-0.5, 0, 0, -1, 0),
    (np.nan, 0, 0, 0, 0), (3e9, 2147483647, 2147483647, 2147483647, 2147483647),
    (-3e9, -(1 << 31), -(1 << 31), -(1 << 31), -(1 << 31)),
    (np.inf, 2147483647, 2147483647, 2147483647, 2147483647),
    (-np.inf, -(1 << 31), -(1 << 31), -(1 << 31), -(1 << 31)),
]


@pytest.mark.parametrize("column, rnd", [(1, "rni"), (2, "rzi"), (3, "rmi"), (4, "rpi")])
def test_f32_to_s32_rounds_clamps_and_zeroes_nan(column, rnd):
    x = np.zeros(64, np.float32)
    x[:len(FLOAT_TO_INT)] = [r[0] for r in FLOAT_TO_INT]
    got = launch(f"to_s32_{rnd}", x)[:len(FLOAT_TO_INT)].view(np.int32).tolist()
    assert got == [r[column] for r in FLOAT_TO_INT]


def test_f32_to_narrow_integers_clamp_to_the_destination():
    values = [127.5, 126.5, -128.5, 300.0, -300.0, np.nan, -1.0, 40000.0, -40000.0, np.inf]
    x = np.zeros(64, np.float32)
    x[:len(values)] = values
    s8 = launch("to_s8", x)[:len(values)]
    assert s8.view(np.int32).tolist() == [127, 126, -128, 127, -128, 0, -1, 127, -128, 127]
    assert s8[2] == 0xFFFFFF80          # sign-extended into the 32-bit register
    assert (launch("to_s8_sat", x)[:len(values)] == s8).all()
    s16 = launch("to_s16", x)[:len(values)].view(np.int32).tolist()
    assert s16 == [128, 126, -128, 300, -300, 0, -1, 32767, -32768, 32767]
    u8 = launch("to_u8", x)[:len(values)].tolist()
    assert u8 == [128, 126, 0, 255, 0, 0, 0, 255, 0, 255]


# ---- memory forms and ordering ---------------------------------------------------------

def test_fences_and_ordered_accesses():
    x = padded(list(range(100, 164)))
    assert (launch("fences", x) == x).all()
    b = padded([7] * 64)
    assert (launch("ordered", x, b) == x + 7).all()


def test_exchange_and_ticket_in_thread_order():
    a = np.zeros(64, U)
    b = np.zeros(64, U)
    b[0] = 0xCAFE
    out = np.zeros(64, U)
    Module(code=module("exch")).get_function("k_exch")((1,), (64,), [out, a, b])
    assert out.tolist() == [0xCAFE] + list(range(63)) and b[0] == 63
    b[:] = 0
    Module(code=module("ticket")).get_function("k_ticket")((2,), (32,), [out, a, b])
    assert sorted(out.tolist()) == list(range(64)) and b[0] == 64


def test_guarded_float_and_half_loads_and_stores():
    a = padded([0, 0x3FC00000, 0, 0xBF800001] * 16)
    b = np.arange(64, dtype=U) + U(0x12340000)
    a_before, b_before = a.copy(), b.copy()
    out = launch_into("guarded", a, b)
    live = a_before != 0
    # b[i] = a[i] where a != 0, else its low half 0x7FC0; out reads b back
    want_b = np.where(live, a_before, (b_before & U(0xFFFF0000)) | U(0x7FC0))
    assert (b == want_b).all() and (out == want_b).all()
    # a[i] = (a[i] or -1.0) ^ (the low half of a[i] where a != 0, else 0)
    assert (a[live] == (a_before[live] ^ (a_before[live] & U(0xFFFF)))).all()
    assert (a[~live] == U(0xBF800000)).all()


def test_shared_f32_and_narrow_stores():
    tid = np.arange(64) % 64
    a = np.array(EDGES * 4, np.uint64)[:64].astype(U)
    b = (np.arange(64, dtype=U) * U(0x01010101)) ^ U(0xA5A5A5A5)
    low = tid < 32
    with np.errstate(all="ignore"):
        doubled = canonical_bits(f(a) * np.float32(2))
    assert (launch("shared_f32", a) == np.where(low, doubled, a)).all()
    byte1 = np.where(low, b & U(0xFF), U(7)) << U(8)
    assert (launch("shared_ints", a, b) == ((a & U(0xFFFF00FF)) | byte1)).all()
    b_after = b.copy()
    got = launch_into("global_narrow", a.copy(), b_after)
    assert (got == np.where(tid < 16, (b & U(0xFFFFFF00)) | (a & U(0xFF)), b)).all()
    assert (b_after == a).all()


def test_compares_and_division_by_literals():
    x = np.array([0.0, -0.0, 127.0, -127.0, -63.0, -64.0, np.nan, np.inf] * 8, np.float32)
    got = launch("compare_imm", x)
    with np.errstate(all="ignore"):
        q = np.where(x == 0, np.float32(1), x) / np.float32(127)
    want = canonical_bits(np.where(q < -0.5, np.float32(2), q))
    assert (got == want).all()
    assert f(got[:6]).tolist() == [np.float32(1 / 127), np.float32(1 / 127), 1.0, 2.0,
                                   np.float32(-63 / 127), 2.0]


def test_shfl_down_without_a_predicate():
    x = np.arange(64, dtype=np.float32)
    lane = np.arange(64) % 32
    want = np.where(lane < 16, x + 16, x)
    assert (launch("shfl_down_plain", x).view(np.float32) == want).all()


def test_arrival_ticket_picks_one_last_cta_and_resets():
    a = np.arange(256, dtype=U) + U(5000)
    b = np.zeros(256, U)
    b[0] = 0
    out = launch_into("arrival", a, b)
    # the emulator serves tickets in CTA order, so CTA 3 (of 4) arrives last
    assert out[:192].tolist() == [t for t in range(3) for _ in range(64)]
    assert (out[192:] == a[192:]).all() and b[0] == 0


def test_guarded_vector_load_and_word_store():
    """Threads 0..31 of each CTA: out = quad[0] + quad[3] of their 16 bytes of b, also
    stored over a[i]; the others add the zeros they started with and store nothing."""
    a = np.arange(64, dtype=U) + U(77)
    b = np.arange(256, dtype=np.float32) * np.float32(0.5)
    a_before, quad = a.copy(), b.reshape(64, 4).copy()
    out = launch_into("guarded_vector", a, b)
    low = np.arange(64) % 64 < 32
    want = np.where(low, quad[:, 0] + quad[:, 3], np.float32(0)).astype(np.float32)
    assert (out == want.view(U)).all()
    assert (a == np.where(low, want.view(U), a_before)).all()


def test_unpacking_halves_from_a_guarded_vector_load():
    """Threads 0..31 of each CTA: out = word 3 of their 16 bytes of b; words 0 and 1
    become the high and the low half of word 0. The others: out 0, b untouched."""
    a = np.zeros(64, U)
    b = (np.arange(256, dtype=U) * U(0x00010003)) ^ U(0xBEEF0000)
    quad = b.reshape(64, 4).copy()
    out = launch_into("halves_vector", a, b)
    low = np.arange(64) % 64 < 32
    assert (out == np.where(low, quad[:, 3], U(0))).all()
    got = b.reshape(64, 4)
    assert (got[low, 0] == quad[low, 0] >> U(16)).all()
    assert (got[low, 1] == quad[low, 0] & U(0xFFFF)).all()
    assert (got[~low] == quad[~low]).all() and (got[:, 2:] == quad[:, 2:]).all()


def test_vector_f32_loads_and_stores():
    """Thread i: pair i of b (bytes 8i..), quad i of b from byte 512 (16i..); it stores
    {pair sum + quad[0] + quad[3], quad[1]} over its pair."""
    b = np.arange(128 + 256, dtype=np.float32)
    pair, quad = b[:128].reshape(64, 2).copy(), b[128:].reshape(64, 4).copy()
    out = np.zeros(64, U)
    Module(code=module("vector_f32")).get_function("k_vector_f32")(
        (1,), (64,), [out, np.zeros(64, U), b])
    want = pair[:, 0] + pair[:, 1] + quad[:, 0] + quad[:, 3]
    assert (out.view(np.float32) == want).all()
    assert (b[:128].reshape(64, 2)[:, 0] == want).all()
    assert (b[:128].reshape(64, 2)[:, 1] == quad[:, 1]).all()


# ---- shfl.sync ---------------------------------------------------------------------------

def shfl_model(mode: str, values: list[int], b: int, c: int) -> list[tuple[int, bool]]:
    """PTX ISA 9.7.9.6 semantics for one full warp."""
    out = []
    seg, cval = (c >> 8) & 31, c & 31
    for lane in range(32):
        hi = (lane & seg) | (cval & ~seg)
        j = {"up": lane - b, "down": lane + b, "bfly": lane ^ b,
             "idx": (lane & seg) | (b & ~seg)}[mode]
        ok = j >= hi if mode == "up" else j <= hi
        out.append((values[j if ok else lane], ok))
    return out


def test_shfl_modes_against_the_isa_semantics():
    a = (np.arange(64, dtype=U) * U(7) + U(1000))
    for name, mode, b, c in [("shfl_down", "down", 3, 31), ("shfl_up", "up", 2, 0)]:
        got = launch(name, a)
        for w in range(2):
            want = shfl_model(mode, a[32 * w:32 * w + 32].tolist(), b, c)
            assert got[32 * w:32 * w + 32].tolist() == [v | (0x80000000 if ok else 0) for v, ok in want]
    for name, mode, b, c in [("shfl_idx", "idx", 5, 31), ("shfl_idx_width8", "idx", 3, 0x181F),
                             ("shfl_bfly_width8", "bfly", 4, 0x181F)]:
        got = launch(name, a)
        want = [v for w in range(2) for v, _ in shfl_model(mode, a[32 * w:32 * w + 32].tolist(), b, c)]
        assert got.tolist() == want
    assert launch("shfl_idx", a)[:32].tolist() == [a[5]] * 32
    assert launch("shfl_idx_width8", a)[:16].tolist() == [a[3]] * 8 + [a[11]] * 8


def test_shfl_butterfly_sum_and_half_warp_masks():
    x = np.arange(64, dtype=np.float32)
    got = launch("shfl_bfly_sum", x).view(np.float32)
    assert (got[:32] == x[:32].sum()).all() and (got[32:] == x[32:].sum()).all()
    a = np.arange(64, dtype=U)
    assert launch("shfl_half_warps", a).tolist() == (a ^ U(1)).tolist()


@pytest.mark.parametrize("body, kind, words", [
    # lanes 16..31 skip it, yet the mask names them
    ("  setp.lt.u32 %p1, %r1, 16;\n  @%p1 shfl.sync.bfly.b32 %r10, %r5, 1, 31, 0xffffffff;",
     "divergence", "lane 16 of membermask 0xffffffff does not execute"),
    # a thread outside its own mask
    ("  shfl.sync.bfly.b32 %r10, %r5, 1, 31, 0x0000fffe;", "undefined", "outside its membermask"),
    # half-warp masks, but the butterfly reaches into the other half
    ("  and.b32 %r11, %r1, 16;\n  setp.eq.u32 %p1, %r11, 0;\n"
     "  selp.b32 %r12, 0x0000ffff, 0xffff0000, %p1;\n  shfl.sync.bfly.b32 %r10, %r5, 16, 31, %r12;",
     "undefined", "reads lane 16, outside the membermask 0x0000ffff"),
])
def test_shfl_refuses_what_the_isa_leaves_undefined(body, kind, words):
    ptx = HEADER + entry("k_bad", body)
    with pytest.raises(EmulatorError) as info:
        Module(code=ptx).get_function("k_bad")((1,), (64,), [np.zeros(64, U)] * 3)
    assert info.value.kind == kind and words in str(info.value), str(info.value)
    assert info.value.text.startswith(("shfl", "@%p1 shfl"))


def test_shfl_in_a_partial_warp_with_a_full_mask_is_refused():
    with pytest.raises(EmulatorError) as info:
        launch("shfl_idx", np.zeros(48, U), block=48)
    assert info.value.kind == "divergence" and "lane 16" in str(info.value)
    assert info.value.ctaid == (0, 0, 0) and info.value.tid == (32, 0, 0)


# ---- what is refused ------------------------------------------------------------------

# (body, what the one line says, whether ptxas refuses it too: the rest are real PTX
# outside the emulator's subset)
REFUSED = [
    ("  add.f32 %u1, %f1, %f2;", "a .f32 operand needs", True),
    ("  ld.global.f32 %u1, [%rd2];", "a .f32 operand needs", True),
    ("  add.u32 %f3, %r5, %r6;", "a .u32 operand needs an integer", True),
    ("  cvt.rn.bf16.f32 %r10, %f1;", "32-bit register", True),
    ("  cvt.bf16.f32 %h1, %f1;", "needs .rn", True),
    ("  cvt.rn.f32.f16 %f3, %h1;", "is exact", True),
    ("  cvt.s32.f32 %r10, %f1;", "integer rounding", True),
    ("  cvt.f32.s32 %f3, %r5;", "needs .rn", True),
    ("  st.acquire.gpu.global.b32 [%rd4], %r5;", "not supported", True),
    ("  mov.f32 %f3, 1;", "f32 literal", True),
    ("  mov.f32 %f3, %tid.x;", "32-bit integer", True),
    ("  fence.bogus.gpu;", "not supported", True),
    ("  ld.global.f16 %h1, [%rd2];", "not supported", True),     # 16-bit floats: ld.b16
    ("  shfl.sync.bfly.b32 %r10, %r5, 1, 31;", "expected 5 operands", True),
    ("  cvt.rni.s64.f32 %rd5, %f1;", "8/16/32 bits", False),
    ("  div.approx.f32 %f3, %f1, %f2;", "not supported", False),
    ("  add.ftz.f32 %f3, %f1, %f2;", "not supported", False),
]


@pytest.mark.parametrize("body, words", [r[:2] for r in REFUSED])
def test_forms_outside_the_subset_are_refused_with_their_line(body, words):
    with pytest.raises(EmulatorError) as info:
        Module(code=HEADER + entry("k_bad", body))
    assert info.value.kind == "unsupported" and words in str(info.value), str(info.value)
    assert info.value.line is not None and info.value.text.split()[0] == body.split()[0]


# ---- the emit helpers -----------------------------------------------------------------

def helper_kernel() -> str:
    """A kernel written only with Ptx's float helpers: out[i] = bits of a chain of them."""
    p = Ptx("k_helpers", [("out", "u64"), ("a", "u64"), ("b", "u64")], 64)
    tid = p.special("%tid.x")
    a = p.byte_offset(p.param_ptr("a"), tid, 4)
    x = p.load_f32("global", a)
    y = p.load_f32_vector("global", p.byte_offset(p.param_ptr("b"), tid, 8), 2)
    s = p.fadd(p.fmul(x, 2.0), p.fsub(y[0], y[1]))             # 2x + (y0 - y1)
    s = p.fdiv(s, p.frcp(4.0))                                  # * 4
    s = p.fmax_nan(p.fmin_nan(s, 1000.0), p.fneg(p.fabs(p.fmov(1000.0))))
    s = p.fmax(p.fmin(s, 1e30), -1e30)
    big = p.setp_f32("gtu", s, 500.0)
    s = p.selp_f32(500.0, s, big)
    total = p.shfl("bfly", s, 1, 31)
    total = p.fadd(total, s)                                    # pair sums
    half = p.cvt("bf16", "f32", total, rnd="rn")
    back = p.cvt("f32", "bf16", half)
    code = p.cvt("s8", "f32", p.fmul(back, 0.25), rnd="rni", sat=True)
    nan = p.testp("notanumber", x)
    code = p.selp(0xEE, code, nan)
    p.fence()
    p.membar()
    ticket = p.atom_add(p.param_ptr("b"), 1, offset=512)
    seen = p.load_acquire(p.param_ptr("b"), offset=512)
    flag = p.atom_exch(p.param_ptr("b"), ticket, offset=516)
    bits = p.f32_bits(back)
    same = p.bits_as_f32(bits)
    h = p.load_b16("global", a)
    p.store("global", "b16", p.byte_offset(p.param_ptr("b"), tid, 2), h, offset=520)
    words = [p.f32_bits(same), code, seen, flag]
    p.store("global", "v4.b32", p.byte_offset(p.param_ptr("out"), tid, 16), words)
    return p.render()


def test_helper_kernel_runs_with_the_numpy_answer():
    x = np.linspace(-300, 300, 64).astype(np.float32)
    x[5] = np.nan
    b = np.zeros(64 * 2 + 256, np.float32)
    b[:128] = np.arange(128, dtype=np.float32)
    out = np.zeros((64, 4), U)
    Module(code=helper_kernel()).get_function("k_helpers")((1,), (64,), [out, x, b])
    y = np.arange(128, dtype=np.float32).reshape(64, 2)
    with np.errstate(invalid="ignore"):
        s = (x * np.float32(2) + (y[:, 0] - y[:, 1])) / np.float32(0.25)
    s = np.where(np.isnan(s), np.float32(np.nan), np.clip(s, -1000, 1000))
    s = np.where(np.isnan(s) | (s > 500), np.float32(500), s).astype(np.float32)
    total = s + s.reshape(32, 2)[:, ::-1].reshape(64)
    back = (f32_to_bf16(total).astype(U) << 16).view(np.float32)
    code = np.clip(np.rint(back * np.float32(0.25)), -128, 127).astype(np.int32).view(U)
    code = np.where(np.isnan(x), U(0xEE), code)
    assert (out[:, 0] == back.view(U)).all() and (out[:, 1] == code).all()
    # the ticket counter saw all 64 arrivals; exch hands each thread the previous one's ticket
    assert (out[:, 2] == 64).all() and b[128:129].view(U)[0] == 64
    assert out[:, 3].tolist() == [0] + list(range(63))
    assert (b.view(np.uint16)[260:324] == x.view(np.uint16)[0::2]).all()


def test_accepted_forms_assemble(tmp_path):
    """ptxas takes every body this file runs, and the helper kernel."""
    from hslm_ptx.pipeline.core.errors import UserError
    from hslm_ptx.pipeline.stages.ptxas import find_ptxas, run_ptxas
    try:
        ptxas = find_ptxas()
    except UserError as exc:
        pytest.skip(str(exc))
    for name, text in (("bodies", module(*BODIES)), ("helpers", helper_kernel())):
        path = tmp_path / f"{name}.ptx"
        path.write_text(text)
        stderr = run_ptxas(ptxas, path, "sm_80")
        assert "k_" in stderr


@pytest.mark.parametrize("body", [r[0] for r in REFUSED if r[2]])
def test_ptxas_refuses_what_the_emulator_refuses_as_wrong(body, tmp_path):
    """The assembler check above can fail: these malformed forms do not assemble."""
    from hslm_ptx.pipeline.core.errors import PtxasError, UserError
    from hslm_ptx.pipeline.stages.ptxas import find_ptxas, run_ptxas
    try:
        ptxas = find_ptxas()
    except UserError as exc:
        pytest.skip(str(exc))
    path = tmp_path / "bad.ptx"
    path.write_text(HEADER + entry("k_bad", body))
    with pytest.raises(PtxasError) as info:
        run_ptxas(ptxas, path, "sm_80")
    assert "error" in str(info.value)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 2 ** 32 - 1), min_size=64, max_size=64),
       st.lists(st.integers(0, 2 ** 32 - 1), min_size=64, max_size=64))
def test_random_bit_patterns_match_numpy(a, b):
    a, b = np.array(a, np.uint64).astype(U), np.array(b, np.uint64).astype(U)
    with np.errstate(all="ignore"):
        for name, ufunc in (("mul", np.multiply), ("div", np.divide), ("sub", np.subtract)):
            assert (launch(name, a, b) == canonical_bits(ufunc(f(a), f(b)))).all()
