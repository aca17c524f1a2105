"""W in planes (kernels/planes.py): where each code sits, the padding, the scan, the way back."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kernels import planes
from kernels.ternary import VALUE_OF_CODE, pack

ORDERS = [pytest.param(planes.ROWS, id="rows"), pytest.param(planes.FRAGMENTS, id="fragments")]


def plane_codes(order: planes.Planes, buf: np.ndarray) -> np.ndarray:
    """Every code of ``buf`` by the documented rule, as a padded K x N grid: W[i, j] is in
    plane i // 64, word 4 j + w, at bit b, where (w, b) = order.place[i % 64]."""
    i = np.arange(buf.shape[0] * planes.CHUNK)[:, None]
    j = np.arange(buf.shape[1] // planes.WORDS)[None, :]
    word = np.array([w for w, _ in order.place])[i % planes.CHUNK]
    bit = np.array([b for _, b in order.place], dtype=np.uint32)[i % planes.CHUNK]
    return (buf[i // planes.CHUNK, planes.WORDS * j + word] >> bit) & 3


@pytest.mark.parametrize("order", ORDERS)
@settings(max_examples=40, deadline=None)
@given(K=st.integers(1, 300), N=st.integers(1, 140), seed=st.integers(0, 2**32 - 1))
def test_planes_hold_every_weight_where_the_kernels_read_it(order, K, N, seed):
    """Every W[i, j] at its plane, word and bits; every code past K or N is zero; the
    shape is K and N rounded up to 128 (64 in-features a plane, 4 words a column); and
    the packed buffer comes back."""
    w = np.random.default_rng(seed).integers(-1, 2, size=(K, N), dtype=np.int8)
    packed = pack(w)
    buf = order(packed, planes.shape(K, N))
    assert buf.shape == (-(-K // 128) * 2, -(-N // 128) * 128 * 4)
    codes = plane_codes(order, buf)
    assert np.array_equal(VALUE_OF_CODE[codes[:K, :N]], w)
    assert not codes[K:].any() and not codes[:, N:].any()
    assert order.problem(buf, K, N) is None
    assert np.array_equal(order.packed(buf, K, N), packed)


def test_the_orders_put_a_decoded_word_where_each_kernel_uses_it():
    """The decode makes register s, byte u of the codes at bit 4u + 16 (s & 1) + 2 (s >> 1)
    (kernels.ptx_emit.decode_ternary). ROWS: word w, register s holds in-features
    16w + 4s .. + 3 (a 16-byte piece of one B row); FRAGMENTS: word t, register s holds
    16s + 4t .. + 3 (lane t's b0 / b1 of k step s // 2)."""
    def decoded(order, word, register):
        return [q for q, (w, b) in enumerate(order.place)
                if w == word and b in [4 * u + 16 * (register & 1) + 2 * (register >> 1) for u in range(4)]]
    assert decoded(planes.ROWS, 2, 1) == [36, 37, 38, 39]
    assert decoded(planes.FRAGMENTS, 2, 1) == [24, 25, 26, 27]  # lane t = 2, b1 of step 0: k = 16 + 4t ..
    assert decoded(planes.FRAGMENTS, 3, 2) == [44, 45, 46, 47]  # b0 of step 1: k = 32 + 4t ..


def test_one_mask_makes_the_selectors():
    """Registers 0 and 1 are the nibbles of word & 0x33333333, 2 and 3 those of
    (word >> 2) & 0x33333333, each nibble the code itself (a prmt selector)."""
    codes = [(q % 3) for q in range(16)]  # word 0 of ROWS: in-features 0-15
    word = sum(c << planes.ROWS.place[q][1] for q, c in enumerate(codes))
    low, high = word & 0x33333333, (word >> 2) & 0x33333333
    assert [(low >> 4 * k) & 0xF for k in range(8)] == codes[:8]
    assert [(high >> 4 * k) & 0xF for k in range(8)] == codes[8:]


@pytest.mark.parametrize("order", ORDERS)
def test_planes_refuse_a_three_and_padding_past_k_or_n(order):
    """Negative: code 3 is named by column and in-feature; a non-zero code past K (in the
    last plane) or in a column past N is padding."""
    K, N = 70, 5

    def planted(i, j, code):
        buf = order(pack(np.zeros((K, N), dtype=np.int8)), planes.shape(K, N))
        word, bit = order.place[i % planes.CHUNK]
        buf[i // planes.CHUNK, planes.WORDS * j + word] |= np.uint32(code << bit)
        return order.problem(buf, K, N)
    assert planted(73, 3, 3).startswith("packed weights: code 3 at column 3, in-feature 73 ")
    assert planted(70, 2, 1).startswith("packed weights: padding code at column 2, in-feature 70 ")
    assert planted(5, N, 2).startswith(f"packed weights: padding code at column {N}, in-feature 5 ")
    assert planted(5, N - 1, 2) is None
