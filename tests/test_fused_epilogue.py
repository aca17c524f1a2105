"""The rescaled GEMM entries (hslm_ptx/hslm_{fwd,dx,dw}_rescaled.py, hslm_ptx/families/hslm_rescaled.py): bit-exact on the emulator against
the stepmath references, the bias switch, NaN propagation, split-K reduced in int32 (the
workspace left zeroed, the same bits for any split), the registry's choice, and the
tile-rule figures the module's docstring states."""
from __future__ import annotations

import functools
import math
import re

import numpy as np
import pytest

from hslm_ptx.runtime import backends
from hslm_ptx.families import hslm_dw_rescaled, hslm_dx_rescaled, hslm_fwd_rescaled, hslm_fwd_s8, hslm_rescaled
from hslm_ptx.reference import stepmath
from hslm_ptx.formats.floats import SHORT_NAMES, from_f32, same_values, to_f32
from hslm_ptx.runtime.launch import kernel_args, launch, poisoned
from hslm_ptx.catalog.registry import FAMILIES, KERNELS, choose
from hslm_ptx.kernel.spec import Dims
from hslm_ptx.tile import geometry
from hslm_ptx.pipeline.core.shapes import load_shape_sets

SPECS = hslm_fwd_rescaled.SPECS + hslm_dx_rescaled.SPECS + hslm_dw_rescaled.SPECS
RESCALED = [spec.name for spec in SPECS]
UNSPLIT = [spec for spec in SPECS if "_splitk_" not in spec.name]
SPLIT = [spec for spec in SPECS if "_splitk_" in spec.name]
SHAPES = [Dims(8, 40, 24), Dims(1, 17, 3), Dims(33, 31, 9), Dims(129, 65, 127), Dims(65, 257, 63),
          Dims(40, 70, 260)]
ARGS_OF = {  # the parameter lists callers are written against
    "fwd": ["y", "x", "w", "row_scales", "beta", "bias", "R", "K", "N", "ldx", "has_bias"],
    "dx": ["dx", "dy", "w", "row_scales", "beta", "R", "K", "N", "ldy"],
    "dw": ["dw", "x_t", "dy_t", "u", "v", "R", "K", "N", "ldr"],
}
WORKSPACE = ["partials", "tickets"]
# shapes where the split families split (the contraction is long against the tiles)
SPLIT_SHAPES = {"fwd": Dims(27, 729, 120), "dx": Dims(27, 120, 729), "dw": Dims(1782, 40, 24)}


def emulated(spec):
    """The spec's entry on the emulator, parsed once per module text for the whole file (the
    Function keeps only its last launch's stats, which no test here reads)."""
    return _loaded(spec.name, spec.emit())


@functools.lru_cache(maxsize=None)
def _loaded(name: str, ptx: str):
    return backends.load_ptx("emulator", ptx, name)


def run(spec, dims, inputs, has_bias=None):
    """The emulator's output, launched as hslm_ptx.runtime.launch does; ``has_bias`` overrides the switch."""
    if has_bias is None:
        return launch(spec, emulated(spec), dims, inputs)
    out = poisoned(spec.output, dims)
    args = kernel_args(spec, dims, out, inputs)
    names = [p.name for p in spec.params]
    args[names.index("has_bias")] = np.uint32(has_bias)
    geometry = spec.geometry(dims)
    emulated(spec)(geometry.grid, geometry.block, args, shared_mem=geometry.shared_mem)
    return out


CASES = [(spec.name, dims) for spec in UNSPLIT for dims in SHAPES] + [
    (spec.name, dims) for spec in SPLIT for dims in SHAPES[2:5]]  # the split ones' unsplit path


@pytest.mark.parametrize("name, dims", CASES, ids=lambda v: f"{v.R}x{v.K}x{v.N}" if isinstance(v, Dims) else v)
def test_rescaled_entry_is_bit_exact(name, dims):
    spec = KERNELS[name]
    inputs = spec.make_inputs(dims, np.random.default_rng(dims.R * 7 + dims.N))
    got, want = run(spec, dims, inputs), spec.reference(dims, inputs)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert same_values(got, want, spec.output.dtype).all()


@pytest.mark.parametrize("name", RESCALED)
def test_parameters_are_the_callers(name):
    product, names = name.split("_")[1], ARGS_OF[name.split("_")[1]]
    if "_splitk_" in name:  # the workspace after the float inputs, the split's scalars last
        first_size = names.index("R")
        names = names[:first_size] + WORKSPACE + names[first_size:] + ["ldo", "kspan"]
    assert [p.name for p in KERNELS[name].params] == names, product


@pytest.mark.parametrize("spec", SPLIT, ids=lambda s: s.name)
def test_a_split_launch_reduces_in_int32_and_leaves_the_workspace_zeroed(spec):
    """Split several ways, the rescale still sees the whole int32 sum: the same bits as the
    unsplit family's reference; partials and tickets end at 0, so a second launch on the
    same workspace gives the same output."""
    dims = SPLIT_SHAPES[spec.name.split("_")[1]]
    assert spec.geometry(dims).grid[2] > 1
    inputs = spec.make_inputs(dims, np.random.default_rng(8))
    fn, want = emulated(spec), spec.reference(dims, inputs)
    args = kernel_args(spec, dims, poisoned(spec.output, dims), inputs)
    workspace = [arg for param, arg in zip(spec.params, args) if param.name in WORKSPACE]
    assert all(any(arg is inputs[name] for arg in workspace) for name in WORKSPACE)  # the caller's buffers
    for _ in range(2):
        got = launch(spec, fn, dims, inputs)
        assert same_values(got, want, spec.output.dtype).all()
        assert not inputs["partials"].any() and not inputs["tickets"].any()


def test_a_dirty_ticket_is_seen():
    """Negative: a ticket not left at 0 makes the wrong CTA rescale (some tile is never
    written), so the zeroed workspace the test above checks is what makes the result."""
    spec = KERNELS["hslm_dw_splitk_f32_m32n16"]
    dims = SPLIT_SHAPES["dw"]
    inputs = spec.make_inputs(dims, np.random.default_rng(8))
    inputs["tickets"][:] = 1000  # no CTA sees the count reach splits - 1
    got = launch(spec, emulated(spec), dims, inputs)
    assert not same_values(got, spec.reference(dims, inputs), "float32").all()


def tickets_of(buffers, dims: Dims) -> int:
    (tickets,) = [b for b in buffers if b.name == "tickets"]
    return math.prod(tickets.layout.shape(dims))


def test_every_tile_of_a_split_family_has_its_ticket():
    """A split launch takes one arrival ticket per output tile of its grid (x by y): the
    family's workspace holds that many on every configuration of the family, dW's 16-row
    tile (twice the 32-row tile's tiles) included. Negative: sized by the 32-row tile, as
    it was before dW had the 16-row one, the workspace is short for that tile."""
    for spec in SPLIT:
        for dims in SHAPES + [Dims(27, 243, 729), Dims(1782, 729, 243)]:
            x, y, _ = spec.geometry(dims).grid
            assert tickets_of(spec.params, dims) >= x * y
    short, dims = KERNELS["hslm_dw_splitk_f32_m16n16"], Dims(27, 243, 243)
    x, y, _ = short.geometry(dims).grid
    old, _ = hslm_rescaled.split_workspace(lambda d: d.N, lambda d: d.K, (geometry.SMALL,))
    assert tickets_of(old, dims) < x * y == tickets_of(short.params, dims)


def test_the_exact_check_sees_the_order_of_the_multiplies():
    """Negative: (acc * (s * beta)), one rounding fewer, differs in some elements from the
    kernel's ((acc * s) * beta): the bit comparison above would catch a reordered epilogue."""
    spec, dims = KERNELS["hslm_fwd_f32"], Dims(64, 128, 130)
    inputs = spec.make_inputs(dims, np.random.default_rng(2))
    got = run(spec, dims, inputs)
    acc = hslm_fwd_s8.reference(dims, inputs).astype(np.float32)
    folded = acc * (inputs["row_scales"][:, None] * inputs["beta"][0]) + inputs["bias"][None, :]
    assert not same_values(got, folded.astype(np.float32), "float32").all()
    assert same_values(got, spec.reference(dims, inputs), "float32").all()


@pytest.mark.parametrize("suffix", list(SHORT_NAMES.values()))
def test_without_a_bias_nothing_is_added_not_even_a_zero(suffix):
    """has_bias = 0: (f32(acc) * s) * beta exactly, -0.0 included (the kernel adds -0.0, which
    changes nothing); a bias of +0.0 does change a -0.0 (so the check can fail)."""
    spec, dims = KERNELS[f"hslm_fwd_{suffix}"], Dims(20, 64, 40)
    dtype = spec.output.dtype
    inputs = spec.make_inputs(dims, np.random.default_rng(4))
    inputs["x"][3] = 0  # row 3 sums to 0 ...
    inputs["row_scales"][3] = -inputs["row_scales"][3]  # ... and 0 * -s is -0.0
    acc = hslm_fwd_s8.reference(dims, inputs)
    want = from_f32(stepmath.rescale_rows(acc, inputs["row_scales"], inputs["beta"][0]), dtype)
    assert np.signbit(to_f32(want, dtype)[3]).all()
    inputs["bias"] = from_f32(np.full(dims.N, 1000.0, np.float32), dtype)  # never read with has_bias = 0
    got = run(spec, dims, inputs, has_bias=0)
    assert same_values(got, want, dtype).all()
    with_zero = run(spec, dims, {**inputs, "bias": from_f32(np.zeros(dims.N, np.float32), dtype)}, has_bias=1)
    assert not same_values(with_zero, want, dtype)[3].any()  # -0.0 + +0.0 is +0.0
    assert same_values(with_zero, want, dtype)[np.arange(dims.R) != 3].all()


@pytest.mark.parametrize("name", ["hslm_fwd_bf16_m32", "hslm_dx_f16", "hslm_dw_f32_m32n16"])
def test_a_nan_scale_makes_its_row_nan(name):
    spec, dims = KERNELS[name], Dims(12, 48, 36)
    inputs = spec.make_inputs(dims, np.random.default_rng(5))
    row_key = "v" if "_dw_" in name else "row_scales"
    inputs[row_key][2] = np.nan
    got = run(spec, dims, inputs)
    values = to_f32(got, spec.output.dtype)
    assert np.isnan(values[2]).all() and not np.isnan(np.delete(values, 2, axis=0)).any()
    assert same_values(got, spec.reference(dims, inputs), spec.output.dtype).all()


def test_an_unwritten_element_is_caught():
    """Negative: a reference whose last column the kernel never wrote (poison left) fails."""
    spec, dims = KERNELS["hslm_dx_bf16_m32"], Dims(9, 33, 20)
    inputs = spec.make_inputs(dims, np.random.default_rng(6))
    out = poisoned(spec.output, dims)
    assert not same_values(out, spec.reference(dims, inputs), "bfloat16").any()


def test_unsplit_families_never_split_and_split_ones_never_cost_more():
    for shapes in load_shape_sets().values():
        for shape in shapes:
            dims = Dims(shape.R, shape.K, shape.N)
            assert all(spec.geometry(dims).grid[2] == 1 for spec in UNSPLIT)
            for spec in SPLIT:
                unsplit = KERNELS[spec.name.replace("_splitk", "")]
                assert spec.cost(dims) <= unsplit.cost(dims)


def test_choose_works_for_every_rescaled_family():
    families = {spec.family_name for spec in SPECS}
    assert len(families) == 18
    for family in families:
        int32 = FAMILIES[f"hslm_{family.split('_')[1]}_s8"]  # the int32 family whose loop it shares
        assert {s.tile for s in FAMILIES[family]} == {s.tile for s in int32} >= {"128x128", "32x128n16"}
        # dW's output is the weight's (N x K): at R = 27 its one chunk leaves the epilogue the
        # largest phase, so the 16-row tile (half the output a CTA, twice the CTAs) wins
        assert choose(family, Dims(27, 243, 729)).tile == ("16x128n16" if "_dw_" in family else "32x128n16")
        assert choose(family, Dims(8192, 4096, 4096)).tile == ("256x128" if "_dw_" in family else "128x128")


ROW = re.compile(r"^\s+(fwd|dx|dw)\s+(\w+)" + r"\s+(\d+\.\d\d)\s+(\S+)\s+(\d+)" * 3 + "$", re.M)


def figures(spec, dims) -> tuple[str, str, int]:
    return f"{spec.cost(dims):.2f}", spec.tile, spec.geometry(dims).grid[2]


def test_the_docstring_figures_are_the_rules():
    rows = ROW.findall(hslm_rescaled.__doc__)
    assert len(rows) == 22
    shapes = {s.name: Dims(s.R, s.K, s.N) for group in load_shape_sets().values() for s in group}
    for product, shape, *stated in rows:
        dims = shapes[shape]
        want = [(stated[i], stated[i + 1], int(stated[i + 2])) for i in (0, 3, 6)]
        assert figures(choose(f"hslm_{product}_s8", dims), dims) == want[0]
        for suffix in SHORT_NAMES.values():
            assert figures(choose(f"hslm_{product}_{suffix}", dims), dims) == want[1]
            assert figures(choose(f"hslm_{product}_splitk_{suffix}", dims), dims) == want[2]


def test_a_wrong_docstring_figure_fails_the_check():
    """Negative: the parser reads the figures (a changed figure no longer matches the rule)."""
    product, shape, us, *_ = ROW.findall(hslm_rescaled.__doc__)[0]
    dims = {s.name: Dims(s.R, s.K, s.N) for s in load_shape_sets()["hslm"]}[shape]
    spec = choose(f"hslm_{product}_s8", dims)
    assert figures(spec, dims)[0] == us and f"{float(us) + 0.01:.2f}" != figures(spec, dims)[0]
