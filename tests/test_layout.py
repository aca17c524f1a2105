"""The Layout of each buffer parameter (hslm_ptx/formats/layout.py, hslm_ptx/kernel/pitch.py): ``into`` and
``view`` undo each other on every layout, copy only where the layouts differ, refuse a wrong
shape in one line; W's planes are never a view to write into and are scanned in both
layouts; scalars answer ``value`` from Dims or their rule."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hslm_ptx.formats import planes
from hslm_ptx.formats.layout import Layout, LayoutError, Plain
from hslm_ptx.kernel.pitch import (PITCH_ALIGN, PitchedOutput, PitchedRows, PitchedTranspose, WPlanes, kernel_buffer,
                                    output_pitch, pitch)
from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.kernel.spec import BufferSpec, Dims, ScalarSpec
from hslm_ptx.formats.ternary import pack, packed_shape

ROWS = PitchedRows(lambda d: d.R, lambda d: d.K)  # forward's X: R x pitch(K)
OUTPUT = PitchedOutput(lambda d: d.R, lambda d: d.N)  # forward's Y: R x output_pitch(N)
TRANSPOSE = PitchedTranspose(lambda d: d.R, lambda d: d.K)  # dW's Xq^T: K x pitch(R)
PLAIN = Plain(lambda d: (d.N, d.K))  # a float W as the caller holds it
W_PLANES = WPlanes(planes.FRAGMENTS)
WT_PLANES = WPlanes(planes.FRAGMENTS_T)

ARRAY_LAYOUTS = [pytest.param(ROWS, np.int8, id="rows"), pytest.param(OUTPUT, np.int32, id="output"),
                 pytest.param(TRANSPOSE, np.int8, id="transpose"), pytest.param(PLAIN, np.float32, id="plain")]
PLANES = [pytest.param(W_PLANES, id="W"), pytest.param(WT_PLANES, id="W^T")]
EVERY = [*(pytest.param(p.values[0], id=p.id) for p in ARRAY_LAYOUTS), *PLANES]
SIZES = st.integers(1, 150)


def logical_array(layout: Layout, dims: Dims, dtype, seed: int) -> np.ndarray:
    """Random values of ``layout``'s logical shape, none 0 (so every element shows where it lands)."""
    values = np.random.default_rng(seed).integers(1, 100, size=layout.logical(dims))
    return values.astype(dtype)


def packed_w(dims: Dims, seed: int) -> np.ndarray:
    return pack(np.random.default_rng(seed).integers(-1, 2, size=(dims.K, dims.N), dtype=np.int8))


@pytest.mark.parametrize("layout, dtype", ARRAY_LAYOUTS)
@settings(max_examples=40, deadline=None)
@given(R=SIZES, K=SIZES, N=SIZES, seed=st.integers(0, 2**32 - 1))
def test_into_then_view_gives_the_array_back_and_only_padding_is_added(layout, dtype, R, K, N, seed):
    dims = Dims(R, K, N)
    array = logical_array(layout, dims, dtype, seed)
    buffer = layout.into(array, dims)
    assert tuple(buffer.shape) == layout.shape(dims) and buffer.dtype == array.dtype and buffer.flags.c_contiguous
    assert np.array_equal(layout.view(buffer, dims), array)
    assert np.count_nonzero(buffer) == array.size  # what is not the array is zero padding


@pytest.mark.parametrize("layout", PLANES)
@settings(max_examples=25, deadline=None)
@given(K=st.integers(1, 300), N=st.integers(1, 140), seed=st.integers(0, 2**32 - 1))
def test_planes_into_then_view_gives_the_packed_w_back(layout, K, N, seed):
    dims = Dims(1, K, N)
    packed = packed_w(dims, seed)
    assert packed.shape == layout.logical(dims) == packed_shape(K, N)
    buffer = layout.into(packed, dims)
    assert buffer.shape == layout.order.shape(dims) == layout.shape(dims)
    assert np.array_equal(layout.view(buffer, dims), packed)
    assert not np.shares_memory(layout.view(buffer, dims), buffer)  # a permutation: the logical form is a copy
    assert layout.problem(buffer, dims, in_kernel_layout=True) is None
    assert layout.problem(packed, dims, in_kernel_layout=False) is None


@pytest.mark.parametrize("width, copied", [(48, False), (40, True)])
def test_pitched_rows_are_copied_only_when_the_width_is_no_pitch(width, copied):
    dims = Dims(3, width, 5)
    rows = np.ones((3, width), np.int8)
    assert (ROWS.into(rows, dims) is not rows) == copied


def test_a_plain_buffer_is_its_own_logical_form_both_ways():
    dims = Dims(2, 3, 4)
    array = np.ones((4, 3), np.float32)
    assert PLAIN.into(array, dims) is array and PLAIN.view(array, dims) is array
    assert PLAIN.shape(dims) == PLAIN.logical(dims) == (4, 3)


def test_a_transposed_operand_is_moved_even_where_the_shapes_coincide():
    """R = K = 16: Xq and Xq^T at pitch(R) are both 16 x 16; into transposes all the same."""
    dims = Dims(16, 16, 16)
    x = np.arange(256, dtype=np.int8).reshape(16, 16)
    assert TRANSPOSE.shape(dims) == TRANSPOSE.logical(dims)
    assert np.array_equal(TRANSPOSE.into(x, dims), x.T)


def test_the_kernel_shapes_follow_the_pitch_rules():
    dims = Dims(9, 40, 17)
    assert ROWS.shape(dims) == (9, pitch(40)) == (9, 48)
    assert OUTPUT.shape(dims) == (9, output_pitch(17)) == (9, 32)
    assert TRANSPOSE.shape(dims) == (40, pitch(9)) == (40, 16)
    assert all(layout.shape(dims)[1] % PITCH_ALIGN == 0 for layout in (ROWS, OUTPUT, TRANSPOSE))


@pytest.mark.parametrize("layout", EVERY)
def test_a_wrong_shape_is_refused_in_one_line_naming_the_shape_expected(layout):
    dims = Dims(5, 20, 6)
    want, have = layout.logical(dims), layout.shape(dims)
    wrong = np.zeros((want[0], want[1] + 1), np.uint32)
    with pytest.raises(LayoutError) as info:
        layout.into(wrong, dims)
    assert str(info.value) == (f"{type(layout).__name__} layout for R=5 K=20 N=6: an array of shape "
                               f"{wrong.shape}, expected the logical shape {want} (into takes the caller's array)")
    wrong = np.zeros((have[0] + 1, have[1]), np.uint32)
    with pytest.raises(LayoutError) as info:
        layout.view(wrong, dims)
    assert str(info.value) == (f"{type(layout).__name__} layout for R=5 K=20 N=6: an array of shape "
                               f"{wrong.shape}, expected the kernel's shape {have} (view takes the kernel's buffer)")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("layout, dtype", ARRAY_LAYOUTS)
def test_zeroed_is_the_kernel_buffer_and_a_writable_view_of_its_logical_part(layout, dtype):
    dims = Dims(9, 40, 24)
    buffer, view = layout.zeroed(dims, np.dtype(dtype).name, np)
    assert buffer.shape == layout.shape(dims) and view.shape == layout.logical(dims) and not buffer.any()
    view[...] = 7
    assert np.shares_memory(view, buffer) and np.count_nonzero(buffer) == view.size
    assert np.array_equal(layout.view(buffer, dims), view)


@pytest.mark.parametrize("layout", PLANES)
def test_planes_are_never_a_view_to_write_into(layout):
    name = layout.order.name.upper()
    with pytest.raises(LayoutError, match=rf"^packed W: make its planes .*hslm_ptx\.formats\.planes\.{name}\(packed, shape\)"):
        layout.zeroed(Dims(1, 16, 8), "uint32", np)
    with pytest.raises(LayoutError, match=rf"^kernel_buffer 'w': packed W: .*{name}"):
        kernel_buffer(BufferSpec("w", "uint32", layout), Dims(1, 16, 8), np)


@pytest.mark.parametrize("layout", PLANES)
def test_planes_find_a_code_3_in_either_layout_and_others_have_no_rule(layout):
    dims = Dims(1, 20, 6)
    packed = packed_w(dims, 3)
    packed[1, 0] |= np.uint32(3 << 4)  # column 1, in-feature 2
    in_planes = layout.order(packed, layout.shape(dims))
    for array, in_kernel in ((packed, False), (in_planes, True)):
        assert layout.problem(array, dims, in_kernel_layout=in_kernel).startswith("packed weights: code 3 at column 1, "
                                                                                   "in-feature 2")
    assert all(other.problem(np.full((4, 4), 3, np.uint32), dims, in_kernel) is None
               for other in (ROWS, OUTPUT, TRANSPOSE, PLAIN) for in_kernel in (False, True))


def test_remedies_tell_packed_w_from_any_other_array():
    assert W_PLANES.remedy("uint32") == "pack the K x N ternary matrix with hslm_ptx.formats.ternary.pack(w)"
    assert ROWS.remedy("int8") == "pass a int8 array of that shape (hslm_ptx.arrays quantizes float inputs)"


def test_a_layout_without_every_operation_cannot_be_built():
    class NoView(Layout):
        def shape(self, dims):
            return (1,)

        def logical(self, dims):
            return (1,)

        def _to_kernel(self, array, dims):
            return array

    with pytest.raises(TypeError, match="_to_logical"):
        NoView()


def test_scalars_come_from_dims_or_their_rule_and_an_unknown_one_is_refused():
    dims = Dims(27, 243, 729)
    assert ScalarSpec("K").value(dims) == 243 and ScalarSpec("ld", lambda d: pitch(d.K)).value(dims) == 256
    assert ScalarSpec("K").is_scalar and ScalarSpec("K").dtype == "uint32"
    assert not BufferSpec("x", "int8", ROWS).is_scalar
    with pytest.raises(ValueError, match=r"^scalar parameter 'ldx' is not a Dims field \(R, K, N\) and has no rule"):
        ScalarSpec("ldx").value(dims)


@pytest.mark.parametrize("name", list(KERNELS))
def test_every_parameter_is_a_scalar_or_a_buffer_with_a_layout(name):
    """No parameter is told apart by its dtype: a scalar is a ScalarSpec, a buffer has a Layout
    (packed W's is WPlanes, and every uint32 input the kernel reads is one)."""
    spec = KERNELS[name]
    written = {p.name for p in spec.output_params}
    for param in spec.params:
        assert param.is_scalar == isinstance(param, ScalarSpec)
        if not param.is_scalar:
            assert isinstance(param.layout, Layout)
            if param.dtype == "uint32" and param.name not in written:
                assert isinstance(param.layout, WPlanes)
