"""Packed ternary layout: code j*Kp + i, 2 bits, least significant first."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hslm_ptx.formats.ternary import PackError, code_problem, codes_of, pack, packed_shape, padded_k, unpack


def test_each_code_lands_at_its_bit_position():
    # K=3, N=2: column 0 = (+1, -1, 0), column 1 = (0, 0, +1); Kp = 16
    w = np.array([[1, 0], [-1, 0], [0, 1]], dtype=np.int8)
    packed = pack(w)
    assert packed.shape == (2, 1) and packed.dtype == np.uint32
    assert packed[0, 0] == (1 << 0) | (2 << 2)  # code 1 at bits 0-1, code 2 at bits 2-3
    assert packed[1, 0] == 1 << 4  # element (2, 1) is code 1*16 + 2 -> word 1, bits 4-5


def test_code_index_crosses_words_at_16():
    w = np.zeros((17, 1), dtype=np.int8)
    w[16, 0] = -1
    packed = pack(w)
    assert packed.shape == (1, 2)
    assert packed[0, 0] == 0 and packed[0, 1] == 2


def test_padding_codes_are_zero():
    rng = np.random.default_rng(0)
    w = rng.integers(-1, 2, size=(5, 7), dtype=np.int8)
    codes = codes_of(pack(w))
    assert codes.shape == (7, 16)
    assert not codes[:, 5:].any()


def test_all_four_codes_decode():
    # word with codes 0, 1, 2 in the first three places; code 3 must be refused
    assert unpack(np.array([[0b10_01_00]], dtype=np.uint32), 3).ravel().tolist() == [0, 1, -1]
    with pytest.raises(PackError, match="code 3 at column 0, in-feature 1"):
        unpack(np.array([[0b11_00]], dtype=np.uint32), 2)


def test_nonzero_padding_is_refused():
    with pytest.raises(PackError, match=r"padding code at column 0, in-feature 3 \(word 0, bits 6-7\)"):
        unpack(np.array([[1 << 6]], dtype=np.uint32), 3)


@settings(max_examples=200, deadline=None)
@given(K=st.integers(1, 70), N=st.integers(1, 5), seed=st.integers(0, 2**32 - 1), density=st.sampled_from([0, 1, 4]))
def test_word_check_agrees_with_a_per_code_check(K, N, seed, density):
    """The vectorised word check flags exactly the buffers a code-by-code scan flags,
    and names the same first code."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 3, size=(N, padded_k(K)), dtype=np.uint32)
    codes[:, K:] = 0
    flat = codes.reshape(-1)
    flat[rng.integers(0, flat.size, size=density)] = rng.integers(1, 4, size=density)  # plant 3s and padding
    packed = (codes.reshape(N, -1, 16) << (2 * np.arange(16, dtype=np.uint32))).sum(axis=2, dtype=np.uint32)
    threes = np.argwhere(codes == 3)
    padding = np.argwhere(codes[:, K:])
    problem = code_problem(packed, K)
    if len(threes):
        j, e = threes[0]
        assert problem.startswith(f"packed weights: code 3 at column {j}, in-feature {e} (word {e // 16}, ")
    elif len(padding):
        j, e = padding[0]
        assert problem.startswith(f"packed weights: padding code at column {j}, in-feature {K + e} ")
    else:
        assert problem is None


def test_a_full_last_word_has_no_padding():
    assert code_problem(np.array([[0x8000_0000]], dtype=np.uint32), 16) is None  # in-feature 15 = -1
    assert code_problem(np.array([[0x8000_0000]], dtype=np.uint32), 15) is not None


def test_pack_refuses_non_ternary_values():
    with pytest.raises(PackError, match=r"element \(1, 0\) is 2"):
        pack(np.array([[0], [2]], dtype=np.int8))


def test_unpack_refuses_wrong_shape():
    with pytest.raises(PackError, match="does not hold K=40"):
        unpack(np.zeros((2, 1), dtype=np.uint32), 40)


@settings(max_examples=60, deadline=None)
@given(K=st.integers(1, 70), N=st.integers(1, 9), seed=st.integers(0, 2**32 - 1))
def test_round_trip(K, N, seed):
    w = np.random.default_rng(seed).integers(-1, 2, size=(K, N), dtype=np.int8)
    packed = pack(w)
    assert packed.shape == packed_shape(K, N) == (N, padded_k(K) // 16)
    assert np.array_equal(unpack(packed, K), w)

