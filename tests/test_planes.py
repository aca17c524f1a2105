"""W in planes (hslm_ptx/formats/planes.py): where each code sits, the padding, the scan, the way back."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hslm_ptx.formats import planes
from hslm_ptx.kernel.spec import Dims
from hslm_ptx.formats.ternary import VALUE_OF_CODE, pack

ORDERS = [pytest.param(planes.FRAGMENTS, id="W"), pytest.param(planes.FRAGMENTS_T, id="W^T")]


def plane_codes(buf: np.ndarray) -> np.ndarray:
    """Every code of ``buf`` by the documented rule, as a padded contraction x columns grid:
    index k of column c is in plane k // 64, word 4 c + w, at bit b, where (w, b) =
    place[k % 64]: w = (k % 16) // 4, b = 4 (k % 4) + 16 (s & 1) + 2 (s >> 1), s = (k % 64) // 16."""
    k = np.arange(buf.shape[0] * planes.CHUNK)[:, None]
    c = np.arange(buf.shape[1] // planes.WORDS)[None, :]
    s = (k % 64) // 16
    word, bit = (k % 16) // 4, (4 * (k % 4) + 16 * (s & 1) + 2 * (s >> 1)).astype(np.uint32)
    return (buf[k // planes.CHUNK, planes.WORDS * c + word] >> bit) & 3


@pytest.mark.parametrize("order", ORDERS)
@settings(max_examples=40, deadline=None)
@given(K=st.integers(1, 300), N=st.integers(1, 140), seed=st.integers(0, 2**32 - 1))
def test_planes_hold_every_weight_where_the_kernels_read_it(order, K, N, seed):
    """Every W[i, j] where the rule says (W: contraction i, column j; W^T: contraction j,
    column i); every code past K or N is zero; the shape is the contraction and the
    columns rounded up to 128 (64 a plane, 4 words a column); the packed buffer comes back."""
    w = np.random.default_rng(seed).integers(-1, 2, size=(K, N), dtype=np.int8)
    packed = pack(w)
    buf = order(packed, order.shape(Dims(1, K, N)))
    depth, width = (N, K) if order.transposed else (K, N)
    assert buf.shape == (-(-depth // 128) * 2, -(-width // 128) * 128 * 4)
    codes = plane_codes(buf)
    assert np.array_equal(VALUE_OF_CODE[codes[:depth, :width]], w.T if order.transposed else w)
    assert not codes[depth:].any() and not codes[:, width:].any()
    assert order.problem(buf, K, N) is None
    assert np.array_equal(order.packed(buf, K, N), packed)


def test_a_decoded_word_is_one_lanes_b_fragments():
    """The decode makes register s, byte u of the code at bit 4u + 16 (s & 1) + 2 (s >> 1)
    (hslm_ptx.emit.ptx.decode_ternary); word t, register s must hold k = 16s + 4t .. + 3:
    lane t's b0 (s even) or b1 (s odd) of k step s // 2 (PTX ISA, mma.m16n8k32 .s8 B)."""
    def decoded(word, register):
        return [q for q, (w, b) in enumerate(planes.FRAGMENTS.place)
                if w == word and b in [4 * u + 16 * (register & 1) + 2 * (register >> 1) for u in range(4)]]
    assert decoded(2, 1) == [24, 25, 26, 27]  # lane t = 2, b1 of step 0: k = 16 + 4t ..
    assert decoded(3, 2) == [44, 45, 46, 47]  # lane t = 3, b0 of step 1: k = 32 + 4t ..
    assert sorted(q for t in range(4) for s in range(4) for q in decoded(t, s)) == list(range(64))


def test_one_mask_makes_the_selectors():
    """Registers 0 and 1 are the nibbles of word & 0x33333333, 2 and 3 those of
    (word >> 2) & 0x33333333, each nibble the code itself (a prmt selector)."""
    place = [b for w, b in planes.FRAGMENTS.place if w == 0]  # word 0: registers 0-3, bytes 0-3
    codes = [(q % 3) for q in range(16)]
    word = sum(c << bit for c, bit in zip(codes, place))
    low, high = word & 0x33333333, (word >> 2) & 0x33333333
    assert [(low >> 4 * k) & 0xF for k in range(8)] == codes[:8]
    assert [(high >> 4 * k) & 0xF for k in range(8)] == codes[8:]


@pytest.mark.parametrize("order", ORDERS)
def test_planes_refuse_a_three_and_padding_past_k_or_n(order):
    """Negative: code 3 is named by W's column and in-feature in either order; a non-zero
    code past K or in a column past N is padding."""
    K, N = 70, 5

    def planted(i, j, code):
        buf = order(pack(np.zeros((K, N), dtype=np.int8)), order.shape(Dims(1, K, N)))
        k, c = (j, i) if order.transposed else (i, j)
        word, bit = order.place[k % planes.CHUNK]
        buf[k // planes.CHUNK, planes.WORDS * c + word] |= np.uint32(code << bit)
        return order.problem(buf, K, N)
    assert planted(73 if not order.transposed else 63, 3, 3).startswith(
        f"packed weights: code 3 at column 3, in-feature {73 if not order.transposed else 63} ")
    assert planted(70, 2, 1).startswith("packed weights: padding code at column 2, in-feature 70 ")
    assert planted(5, N, 2).startswith(f"packed weights: padding code at column {N}, in-feature 5 ")
    assert planted(5, N - 1, 2) is None
