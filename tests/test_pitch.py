"""The row pitch rule for cp.async-staged operands and the aligned copy."""
import numpy as np
import pytest

from hslm_ptx.kernel.pitch import PITCH_ALIGN, KernelLayout, aligned_copy, kernel_buffer, pitch
from hslm_ptx.catalog.registry import get_kernel
from hslm_ptx.kernel.spec import Dims


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


@pytest.mark.parametrize("kernel, name, want, transposed", [
    ("hslm_fwd_s8", "x", (9, 48), False),  # R x pitch(K)
    ("hslm_dx_s8", "dy", (9, 32), False),  # R x pitch(N)
    ("hslm_dw_s8", "x", (40, 16), True),  # K x pitch(R)
    ("hslm_dw_s8", "dy", (24, 16), True),  # N x pitch(R)
])
def test_kernel_buffer_is_the_zeroed_kernel_layout_and_a_view_of_its_logical_part(kernel, name, want, transposed):
    dims = Dims(9, 40, 24)
    param = next(p for p in get_kernel(kernel).params if p.name == name)
    marked, view = kernel_buffer(param, dims, np)
    assert isinstance(marked, KernelLayout)
    buf = marked.array
    assert buf.shape == tuple(param.layout.shape(dims)) == want and buf.dtype == np.int8
    assert buf.flags.c_contiguous and not buf.any()
    assert view.shape == tuple(param.layout.logical(dims)) and np.shares_memory(view, buf)
    view[...] = np.arange(view.size).reshape(view.shape) % 100 + 1  # no zero: every written byte shows
    logical = buf[:, :dims.R].T if transposed else buf[:, :view.shape[1]]
    assert np.array_equal(logical, view) and np.array_equal(param.layout.view(buf, dims), view)
    assert np.count_nonzero(buf) == view.size  # the bytes past the logical part stay zero
