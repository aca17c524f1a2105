"""The emulator on PTX that nvcc wrote (tests/data/ptx/kernels.ptx from kernels.cu;
nvcc 13.0, `nvcc -ptx -arch=sm_80`, .version 9.0), against numpy."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hslm_ptx.emu import EmulatorError, Module


PTX = Path(__file__).parent / "data" / "ptx" / "kernels.ptx"
U = np.uint32


@pytest.fixture(scope="module")
def mod() -> Module:
    return Module(path=PTX)


def test_vadd_with_bounds_check(mod):
    rng = np.random.default_rng(0)
    n = 1000
    a, b = rng.integers(-2**31, 2**31, (2, n)).astype(np.int32)
    c = np.zeros(n, np.int32)
    mod.get_function("vadd")((4,), (256,), [a, b, c, U(n)])
    assert (c == a + b).all()


def test_vadd_launched_past_its_buffers_is_out_of_bounds(mod):
    a = b = c = np.zeros(100, np.int32)
    with pytest.raises(EmulatorError) as info:
        mod.get_function("vadd")((1,), (128,), [a, b, c, U(128)])
    e = info.value
    assert e.kind == "out_of_bounds" and e.tid == (100, 0, 0) and "ld.global.u32" in e.text
    assert " ".join(PTX.read_text().splitlines()[e.line - 1].split()) == e.text


def test_grid_stride_loop(mod):
    x = np.random.default_rng(1).integers(0, 2**32, 3001, dtype=np.uint64).astype(U)
    y = np.zeros_like(x)
    mod.get_function("grid_stride")((3,), (128,), [x, y, U(x.size)])
    assert (y == x * U(3) + U(1)).all()


def test_shared_memory_reduction(mod):
    x = np.random.default_rng(2).integers(-1000, 1000, 5000).astype(np.int32)
    out = np.zeros(20, np.int32)
    mod.get_function("reduce")((20,), (256,), [x, out, U(x.size)])
    assert (out == np.pad(x, (0, 120)).reshape(20, 256).sum(1)).all()


def test_reduction_without_its_first_syncthreads_is_a_race(mod):
    x = np.ones(512, np.int32)
    with pytest.raises(EmulatorError) as info:
        mod.get_function("reduce_nosync")((2,), (256,), [x, np.zeros(2, np.int32), U(512)])
    e = info.value
    assert e.kind == "race" and e.text.startswith("ld.shared.u32")
    assert e.ctaid == (0, 0, 0) and e.tid == (0, 0, 0) and "tid=(128,0,0)" in str(e)


def test_byte_perm(mod):
    rng = np.random.default_rng(3)
    a, b, s = rng.integers(0, 2**32, (3, 500), dtype=np.uint64).astype(U)
    out = np.zeros_like(a)
    mod.get_function("byte_perm")((2,), (256,), [a, b, s, out, U(500)])
    pool = (b.astype(np.uint64) << np.uint64(32)) | a          # __byte_perm: 3-bit selectors
    want = sum(((pool >> (8 * ((s.astype(np.uint64) >> np.uint64(4 * k)) & 7))) & 0xFF)
               << np.uint64(8 * k) for k in range(4))
    assert (out == want.astype(U)).all()


def test_transpose_in_two_dimensions(mod):
    rows, cols = 37, 45
    inp = np.random.default_rng(4).integers(-9, 9, (rows, cols)).astype(np.int32)
    out = np.zeros((cols, rows), np.int32)
    mod.get_function("transpose")((3, 3), (16, 16), [inp, out, U(rows), U(cols)])
    assert (out == inp.T).all()


def test_int8_dot_products(mod):
    rng = np.random.default_rng(5)
    x = rng.integers(-128, 128, (50, 37)).astype(np.int8)
    x[0] = -128
    w = rng.integers(-128, 128, 37).astype(np.int8)
    w[:] = np.where(np.arange(37) % 2, w, -128)
    y = np.zeros(50, np.int32)
    mod.get_function("dot_s8")((1,), (64,), [x, w, y, U(50), U(37)])
    assert (y == x.astype(np.int64) @ w.astype(np.int64)).all()


def test_divergent_loop_trip_counts(mod):
    v = np.random.default_rng(6).integers(1, 1000, 300).astype(U)
    steps = np.zeros_like(v)
    mod.get_function("collatz")((2,), (256,), [v, steps, U(300)])

    def collatz(n: int) -> int:
        s = 0
        while n > 1:
            n, s = (3 * n + 1 if n & 1 else n >> 1), s + 1
        return s
    assert steps.tolist() == [collatz(int(n)) for n in v]


def test_signed_and_unsigned_compares_and_shifts(mod):
    rng = np.random.default_rng(7)
    a, b = rng.integers(-2**31, 2**31, (2, 400)).astype(np.int32)
    a[:4] = [-1, 0, 2**31 - 1, -2**31]
    b[:4] = [0, -1, -2**31, 31]
    out = np.zeros(400, U)
    mod.get_function("compare_shift")((2,), (256,), [a, b, out, U(400)])
    for x, y, got in zip(a.tolist(), b.tolist(), out.tolist()):
        ux, uy = x & 0xFFFFFFFF, y & 0xFFFFFFFF
        want = (x < y) | ((ux < uy) << 1) | ((x >= y) << 2)
        want |= ((x >> (y & 31)) & 0xFF) << 8 | ((ux >> (y & 31)) & 0xFF) << 16
        assert got == want
