"""The row pitch rule for cp.async-staged operands and the aligned copy."""
import numpy as np
import pytest

from kernels.pitch import PITCH_ALIGN, aligned_copy, pitch


@pytest.mark.parametrize("width, want", [(1, 16), (16, 16), (17, 32), (243, 256), (729, 736)])
def test_pitch_is_the_width_rounded_up_to_16(width, want):
    assert pitch(width) == want and want % PITCH_ALIGN == 0


def test_aligned_copy_keeps_rows_and_zeroes_the_padding():
    rows = np.arange(3 * 5, dtype=np.int8).reshape(3, 5)
    out = aligned_copy(rows, 32)
    assert out.shape == (3, 32) and out.dtype == np.int8
    assert np.array_equal(out[:, :5], rows) and not out[:, 5:].any()


@pytest.mark.parametrize("bad", [24, 0])
def test_aligned_copy_refuses_a_bad_pitch(bad):
    with pytest.raises(ValueError, match="must be a multiple of 16 and at least the width 5"):
        aligned_copy(np.zeros((2, 5), np.int8), bad)
