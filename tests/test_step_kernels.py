"""The layer step's weight-preparation and quantization kernels, and the multi-output,
float-buffer side of the kernel framework they need (hslm_ptx.kernel.spec, hslm_ptx.runtime.launch,
hslm_ptx.pipeline.stages.verify).

Every kernel runs its emitted PTX on the CPU emulator against its numpy reference
(hslm_ptx.reference.stepmath), compared bit for bit; each check is shown to fail on a planted
fault (a PTX edit, an unwritten output, a wrong reference).
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hslm_ptx.runtime import backends
from hslm_ptx.reference import stepmath
from hslm_ptx.formats.floats import from_f32, storage_dtype, to_f32
from hslm_ptx.families.hslm_quant import SPECS as QUANT_SPECS
from hslm_ptx.families.hslm_wprep import SPECS as PREP_SPECS, partial_count
from hslm_ptx.runtime.launch import POISON, LaunchError, kernel_args, launch, launch_outputs
from hslm_ptx.formats.planes import FRAGMENTS, FRAGMENTS_T
from hslm_ptx.emu.parse import EmulatorError
from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.kernel.spec import Dims
from hslm_ptx.formats.ternary import pack
from hslm_ptx.reference.testdata import float_activations, latent_weights
from hslm_ptx.pipeline.stages.sass import SassArch, SassReport
from hslm_ptx.pipeline.stages.verify import compare_output, compare_outputs

STEP_KERNELS = [s.name for s in PREP_SPECS + QUANT_SPECS]
SHAPES = [Dims(1, 1, 1), Dims(5, 33, 7), Dims(37, 70, 129), Dims(130, 129, 65)]


@functools.lru_cache(maxsize=None)
def emulated(name: str, ptx: str | None = None):
    return backends.load_ptx("emulator", ptx or KERNELS[name].emit(), name)


def run(name: str, dims: Dims, seed: int = 0, ptx: str | None = None):
    """(got, want) of every output, the kernel on the emulator against its reference."""
    spec = KERNELS[name]
    inputs = spec.make_inputs(dims, np.random.default_rng(seed))
    return launch_outputs(spec, emulated(name, ptx), dims, inputs), spec.expected(dims, inputs)


def mismatches(name: str, got, want) -> dict[str, int]:
    return compare_outputs(KERNELS[name], got, want)[0]


# ---- the kernels on the emulator -------------------------------------------------------


@pytest.mark.parametrize("dims", SHAPES, ids=lambda d: f"{d.R}x{d.K}x{d.N}")
@pytest.mark.parametrize("kernel", STEP_KERNELS)
def test_kernel_is_exact(kernel, dims):
    got, want = run(kernel, dims)
    assert mismatches(kernel, got, want) == {name: 0 for name in want}


# one planted fault per kernel kind, each of which the exact comparison must catch
FAULTS = {
    "hslm_wsum": ("shfl.sync.down.b32", "shfl.sync.up.b32", "partials"),  # the tree's order
    "hslm_wprep": ("0x6420", "0x6410", "planes"),  # a code in the wrong bits of a forward word
    "hslm_qrows": ("cvt.rni.s32.f32", "cvt.rzi.s32.f32", "codes"),  # truncation, not nearest even
    "hslm_qcols": ("add.rn.f32", "sub.rn.f32", "sums"),  # the column sum
    "hslm_quant": ("cvt.rni.s32.f32", "cvt.rzi.s32.f32", "codes"),  # the row half's rounding
}


def fault_of(kernel: str) -> tuple[str, str, str]:
    """The planted fault of ``kernel``'s kind: the longest kind its name starts with."""
    return FAULTS[max((kind for kind in FAULTS if kernel.startswith(kind + "_")), key=len)]


@pytest.mark.parametrize("kernel", ["hslm_quant_f32", "hslm_quant_bf16"])
def test_a_fault_in_the_column_half_of_quant_is_caught_there(kernel):
    """The fused kernel's column CTAs: the column sum's order, in sums only."""
    ptx = KERNELS[kernel].emit()
    assert ptx.count("add.rn.f32") >= 1
    got, want = run(kernel, Dims(37, 70, 70), ptx=ptx.replace("add.rn.f32", "sub.rn.f32"))
    counts = mismatches(kernel, got, want)
    assert counts["sums"] > 0 and counts["codes"] == counts["row_scales"] == counts["codes_t"] == 0


@pytest.mark.parametrize("kernel", STEP_KERNELS)
def test_a_planted_fault_is_caught(kernel):
    old, new, output = fault_of(kernel)
    ptx = KERNELS[kernel].emit()
    assert old in ptx
    got, want = run(kernel, Dims(37, 70, 129), ptx=ptx.replace(old, new))
    assert mismatches(kernel, got, want)[output] > 0


@pytest.mark.parametrize("kernel", ["hslm_wprep_f32", "hslm_wprep_bf16"])
def test_transposed_planes_fault_is_caught(kernel):
    """The column-major tile's words: a rotation that folds columns c and c + 32 onto one
    word loses half of them, in planes_t only."""
    text = KERNELS[kernel].emit()
    assert text.count(", 63;") == 8  # the four stores and four loads of the column tile
    got, want = run(kernel, Dims(5, 70, 129), ptx=text.replace(", 63;", ", 31;"))
    counts = mismatches(kernel, got, want)
    assert counts["planes_t"] > 0 and counts["planes"] == 0 and counts["beta"] == 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_weight_preparation_chain(dtype):
    """wsum then wprep, as the layer runs them: beta and both plane sets equal the host's
    own conversion of stepmath's ternary codes (the partials never leave the device)."""
    N, K = 77, 150
    dims = Dims(1, K, N)
    w = latent_weights(np.random.default_rng(4), N, K, dtype)
    short = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}[dtype]
    partials = launch(KERNELS[f"hslm_wsum_{short}"], emulated(f"hslm_wsum_{short}"), dims, {"w": w})
    prep = launch(KERNELS[f"hslm_wprep_{short}"], emulated(f"hslm_wprep_{short}"), dims,
                  {"w": w, "w_partials": partials})
    values = to_f32(w, dtype)
    beta = stepmath.weight_scale(values)
    packed = pack(stepmath.ternary_codes(values, beta).T)
    assert prep["beta"].view(np.uint32)[0] == np.float32(beta).view(np.uint32)
    assert np.array_equal(prep["planes"], FRAGMENTS(packed, FRAGMENTS.shape(dims)))
    assert np.array_equal(prep["planes_t"], FRAGMENTS_T(packed, FRAGMENTS_T.shape(dims)))


def test_every_cta_sums_many_partials_alike():
    """P over 256 partials (W of over 256 x 4096 elements): the threads take several each
    (stepmath.strided_sum), and every CTA's planes follow from the same beta."""
    spec = KERNELS["hslm_wprep_f32"]
    N, K = 300, 3600
    P = partial_count(N * K)
    rng = np.random.default_rng(8)
    partials = (rng.random(P) * 50).astype(np.float32)  # not W's own: any partials give one beta
    w = latent_weights(rng, N, K, "float32")
    dims = Dims(1, K, N)
    outs = launch(spec, emulated(spec.name), dims, {"w": w, "w_partials": partials})
    beta = stepmath.scale_of_partials(partials, N * K)
    assert P > 256 and outs["beta"][0] == beta and beta != stepmath.scale_of_partials(partials[:256], N * K)
    packed = pack(stepmath.ternary_codes(w, beta).T)
    assert np.array_equal(outs["planes"], FRAGMENTS(packed, FRAGMENTS.shape(dims)))


@pytest.mark.parametrize("kernel", ["hslm_qrows_bf16", "hslm_qcols_f16"])
def test_non_finite_slices_propagate(kernel):
    """A NaN in a slice gives a NaN scale and codes 0, never a finite wrong answer; an
    all-zero slice gets scale 1 and codes 0; the padding of the pitched codes is 0."""
    dims = Dims(40, 67, 1)
    got, want = run(kernel, dims, seed=3)
    scales = got["scales"]
    assert np.isnan(scales).sum() == 1 and (scales == 1).any()
    codes, width = (got["codes"], dims.K) if "codes" in got else (got["codes_t"], dims.R)  # a slice per row
    assert not codes[:, width:].any() and codes.shape[1] > width
    assert not codes[np.isnan(scales)].any() and codes[~np.isnan(scales)].any()
    assert mismatches(kernel, got, want) == {name: 0 for name in want}


def test_column_sums_are_the_bias_gradient():
    got, _ = run("hslm_qcols_f32", Dims(45, 40, 1), seed=9)
    x = float_activations(np.random.default_rng(9), (45, 40), "float32", axis=0)
    finite = np.isfinite(x).all(axis=0)
    assert np.allclose(got["sums"][finite], x[:, finite].astype(np.float64).sum(axis=0), rtol=1e-5)


@settings(max_examples=12, deadline=None)
@given(R=st.integers(1, 70), C=st.integers(1, 90), dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
       seed=st.integers(0, 2**16))
def test_row_quantizer_matches_stepmath(R, C, dtype, seed):
    """Any shape, any float type: the kernel's scales and codes are stepmath's, bit for bit."""
    name = {"float32": "hslm_qrows_f32", "float16": "hslm_qrows_f16", "bfloat16": "hslm_qrows_bf16"}[dtype]
    got, want = run(name, Dims(R, C, 1), seed=seed)
    assert mismatches(name, got, want) == {"codes": 0, "scales": 0}


# ---- the test data plants what it promises ------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_activations_hold_ties_zeros_and_non_finite(dtype):
    x = to_f32(float_activations(np.random.default_rng(2), (30, 50), dtype, axis=1), dtype)
    s = stepmath.scales_of(stepmath.absmax(x, 1))
    with np.errstate(invalid="ignore"):
        q = np.abs(x / s[:, None])
    assert (q % 1 == 0.5).sum() > 100  # exact rounding ties of x / s
    assert (np.signbit(x) & (x == 0)).any() and (np.abs(x).max(axis=1) == 0).any()
    assert np.isnan(x).any() and np.isinf(x).any()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_latent_weights_hold_exact_ties(dtype):
    kinds = set()
    for seed in range(6):
        w = to_f32(latent_weights(np.random.default_rng(seed), 20, 30, dtype), dtype)
        q = np.abs(w / stepmath.weight_scale(w))
        kinds.add(bool((q == 0.5).any() and (q == 1.5).any()))
        assert (np.abs(w).max(axis=1) == 0).any() and (np.signbit(w) & (w == 0)).any()
    assert kinds == {True, False}  # both kinds are drawn


# ---- framework: several outputs, float buffers, poison ----------------------------------


def test_launch_poisons_every_output_so_unwritten_elements_are_mismatches():
    spec = KERNELS["hslm_qcols_bf16"]
    dims = Dims(9, 20, 1)
    inputs = spec.make_inputs(dims, np.random.default_rng(0))
    want = spec.expected(dims, inputs)
    got = launch_outputs(spec, lambda grid, block, args, shared_mem=0: None, dims, inputs)
    counts = compare_outputs(spec, got, want)[0]
    # every element, the reference's NaN scale included (the poison is a NaN, but not one any kernel writes)
    assert counts == {"codes_t": want["codes_t"].size, "scales": dims.K, "sums": dims.K}
    assert np.isnan(want["scales"]).any()


def test_float_comparison_is_by_bits_with_nan_equal_to_nan():
    scales = KERNELS["hslm_qrows_f32"].params[1]
    want = np.array([1.0, np.nan, 0.0, 2.0], dtype=np.float32)
    other_nan = np.array([1.0, 0.0, 0.0, 2.0], dtype=np.float32)
    other_nan[1] = np.uint32(0x7FC00001).view(np.float32)
    assert compare_output(scales, other_nan, want)[0] == 0
    negative_zero = want.copy()
    negative_zero[2] = -0.0
    next_up = want.copy()
    next_up[3] = np.nextafter(np.float32(2.0), np.float32(3.0))
    count, ulps, first = compare_output(scales, negative_zero, want)
    assert count == 1 and (first.row, first.col) == (2, 0) and first.output == "scales"  # 1-D: (index, 0)
    assert compare_output(scales, next_up, want)[:2] == (1, 1)


def test_bf16_outputs_compare_their_bit_patterns():
    bits = from_f32(np.array([1.5, np.nan], dtype=np.float32), "bfloat16")
    param = KERNELS["hslm_qrows_f32"].params[1]._replace(dtype="bfloat16")
    assert param.storage == "uint16" and storage_dtype("bfloat16") == np.uint16
    assert compare_output(param, bits.copy(), bits)[0] == 0
    poisoned = bits.copy()
    poisoned[1] = POISON["bfloat16"]  # a NaN, but the poison's
    assert compare_output(param, poisoned, bits)[0] == 1


def test_a_bf16_input_must_be_its_bit_patterns():
    spec = KERNELS["hslm_qrows_bf16"]
    dims = Dims(3, 8, 1)
    with pytest.raises(LaunchError, match=r"input 'x' is float32\(3, 8\), expected bfloat16"):
        launch(spec, emulated(spec.name), dims, {"x": np.zeros((3, 8), np.float32)})


def test_a_missing_output_is_refused():
    spec = KERNELS["hslm_qrows_f32"]
    dims = Dims(3, 8, 1)
    with pytest.raises(LaunchError, match="output 'scales' is missing"):
        kernel_args(spec, dims, {"codes": np.zeros((3, 16), np.int8)}, {"x": np.zeros((3, 8), np.float32)})


def test_reference_must_return_every_output():
    spec = KERNELS["hslm_qrows_f32"]
    broken = dataclasses.replace(spec, reference=lambda d, inputs: {"codes": np.zeros(1)})
    with pytest.raises(ValueError, match="expected the outputs"):
        broken.expected(Dims(1, 1, 1), {})
    with pytest.raises(ValueError, match="not all parameters"):
        dataclasses.replace(spec, outputs=("codes", "nowhere")).output_params


def test_non_gemm_kernels_have_no_gemm_form():
    assert not any(KERNELS[k].is_gemm for k in STEP_KERNELS)
    assert KERNELS["hslm_fwd_s8"].is_gemm and KERNELS["hslm_fwd_s8"].output_params == (KERNELS["hslm_fwd_s8"].params[0],)
    with pytest.raises(ValueError, match="no GEMM form"):
        KERNELS["hslm_qrows_f32"].gemm_operands({}, Dims(1, 1, 1))


def test_sass_summary_counts_non_gemm_kernels_per_element():
    from hslm_ptx.pipeline.tasks.perf import element_rows

    report = SassReport(kernel="hslm_qrows_f32", ptx_sha256="0", ptxas_version="x", nvdisasm_version="y",
                        archs=[SassArch(arch="sm_90", instructions=512, loops=[], steady_loop=None, fast=None, tail=None)])
    spec = KERNELS["hslm_qrows_f32"]
    assert element_rows(report, spec) == [["hslm_qrows_f32", "sm_90", 0, 512, 128, 4.0]]
    assert element_rows(report, dataclasses.replace(spec, trip_elements=0))[0][-1] == "-"


@pytest.mark.parametrize("kernel", ["hslm_qrows_f32", "hslm_qrows_bf16"])
def test_aligned_rows_take_16_byte_vectors(kernel):
    """A row width of whole 16-byte vectors (K = 1000) is read 16 bytes a lane: a quarter
    (f32) or an eighth (bf16) of the element path's load instructions; an odd width
    (K = 999) takes the element path. Both exact."""
    counts = {}
    for K in (1000, 999):
        dims = Dims(16, K, 1)
        spec = KERNELS[kernel]
        inputs = spec.make_inputs(dims, np.random.default_rng(K))
        fn = backends.load_ptx("emulator", spec.emit(), kernel)
        got = launch_outputs(spec, fn, dims, inputs)
        assert mismatches(kernel, got, spec.expected(dims, inputs)) == {"codes": 0, "scales": 0}
        counts[K] = fn.stats.by_opcode["ld.global"]
    element_loads = 16 * 2 * -(-999 // 128) * 4  # rows x passes x trips x loads a trip
    assert counts[999] == element_loads and counts[1000] <= element_loads // 4


# ---- the grouped backward: dX's and dW's products in one grid ------------------------------

GRADS = {  # every tile pair once, and mixed float types; the shapes split dX (R = 27, N = 729) or dW (R = 1782)
    "hslm_grads_f32_f32_32x128n16_16x128n16": Dims(27, 243, 729),
    "hslm_grads_bf16_f32_32x128n16_32x128n16": Dims(1782, 243, 243),
    "hslm_grads_f16_bf16_32x128n16_16x128n16": Dims(67, 97, 131),
    "hslm_grads_f32_f16_32x128n16_32x128n16": Dims(33, 31, 9),
    "hslm_grads_bf16_bf16": Dims(130, 68, 132),  # 128 x 128 with 256 x 128
}


@pytest.mark.parametrize("kernel", GRADS)
def test_grouped_backward_is_both_kernels_bit_for_bit(kernel):
    got, want = run(kernel, GRADS[kernel])
    assert mismatches(kernel, got, want) == {"dx": 0, "dw": 0}


def test_grouped_backward_splits_where_its_parts_do():
    """The shapes above run each part's split: dX 6 ways at R = 27, N = 729, dW 7 ways at R = 1782."""
    from hslm_ptx.tile.grouped import idle_workspace
    from hslm_ptx.families.hslm_grads import PARTS

    dx, _ = PARTS["hslm_grads_f32_f32_32x128n16_16x128n16"]
    _, dw = PARTS["hslm_grads_bf16_f32_32x128n16_32x128n16"]
    assert dx.geometry(Dims(27, 243, 729)).grid[2] > 1 and dw.geometry(Dims(1782, 243, 243)).grid[2] > 1
    assert idle_workspace(KERNELS["hslm_grads_bf16_f32_32x128n16_32x128n16"], Dims(1782, 243, 243)) == (
        "dx_partials", "dx_tickets")


def test_a_wrong_cta_of_the_grouped_backward_is_caught():
    """dX's split index taken as the remainder, not the quotient, of its CTA by its plane
    (the second div.u32: after its grid's split count): the emulator refuses the launch."""
    kernel = "hslm_grads_f32_f32_32x128n16_16x128n16"
    ptx = KERNELS[kernel].emit()
    first = ptx.index("div.u32")
    second = ptx.index("div.u32", first + 1)
    with pytest.raises(EmulatorError, match="out_of_bounds"):  # the split's ticket is past the tickets
        run(kernel, GRADS[kernel], ptx=ptx[:second] + "rem.u32" + ptx[second + len("div.u32"):])


# ---- the whole backward from float dY in one launch ----------------------------------------

BWD = {  # every tile pair once, mixed float types, shapes where dX (R = 27, N = 729) or dW (R = 1782) splits
    "hslm_bwd_f32_f32": Dims(27, 243, 729),
    "hslm_bwd_bf16_f32_32x128n16_32x128n16": Dims(1782, 243, 243),
    "hslm_bwd_f16_bf16_32x128n16_64x128": Dims(67, 97, 131),
    "hslm_bwd_f32_f16_32x128n16_32x128n16": Dims(33, 31, 9),
    "hslm_bwd_bf16_bf16": Dims(1, 1, 1),
}


@pytest.mark.parametrize("kernel", BWD)
def test_backward_from_float_dy_is_exact(kernel):
    """dX, dW and db from float dY: the codes and scales each CTA makes are hslm_quant's,
    so every output is the two-launch backward's reference bit for bit."""
    got, want = run(kernel, BWD[kernel])
    assert mismatches(kernel, got, want) == {"dx": 0, "dw": 0, "db": 0}


@pytest.mark.kernel("hslm_bwd_f32_f16_32x128n16_32x128n16", "hslm_grads_f32_f16_32x128n16_32x128n16", "hslm_quant_f32")
def test_backward_from_float_dy_equals_the_two_launch_backward():
    """On the same dY, x codes and weight: hslm_quant then hslm_grads gives the same bits as
    hslm_bwd (the references are each kernel's own: this ties them together)."""
    d = Dims(33, 31, 9)
    bwd, grads, quant = (KERNELS[n] for n in ("hslm_bwd_f32_f16_32x128n16_32x128n16", "hslm_grads_f32_f16_32x128n16_32x128n16",
                                              "hslm_quant_f32"))
    inputs = bwd.make_inputs(d, np.random.default_rng(3))
    one = launch_outputs(bwd, emulated(bwd.name), d, inputs)
    q = launch_outputs(quant, emulated(quant.name), Dims(d.R, d.N, d.N), {"x": inputs["dy"]})
    two_inputs = grads.make_inputs(d, np.random.default_rng(3))
    two_inputs |= {"dy": q["codes"][:, : d.N], "w": inputs["w"], "row_scales": q["row_scales"], "beta": inputs["beta"],
                   "x_t": inputs["x_t"], "dy_t": q["codes_t"][:, : d.R].T, "u": inputs["u"], "v": q["col_scales"]}
    two = launch_outputs(grads, emulated(grads.name), d, two_inputs)
    assert np.array_equal(one["dx"].view(np.uint8), two["dx"].view(np.uint8))
    assert np.array_equal(one["dw"].view(np.uint8), two["dw"].view(np.uint8))
    assert np.array_equal(one["db"].view(np.uint8), q["sums"].view(np.uint8))


@pytest.mark.kernel("hslm_bwd_bf16_f32_32x128n16_32x128n16")
def test_a_column_scale_taken_over_one_split_is_caught():
    """dW's column scales from the CTA's own split of R only (the scales pass starting at the
    split's first row, not row 0): at R = 1782, where dW splits, the codes differ."""
    kernel = "hslm_bwd_bf16_f32_32x128n16_32x128n16"
    from hslm_ptx.families.hslm_bwd import PARTS

    assert PARTS[kernel][1].geometry(BWD[kernel]).grid[2] > 1
    ptx = KERNELS[kernel].emit()
    scope = ptx.index("dw_row_absmax:")
    start = ptx.rindex("shl.b32", 0, scope)  # k_at = piece << 4: the whole column, whatever the split
    line_end = ptx.index("\n", start)
    dst, src = ptx[start:line_end].split()[1].rstrip(","), ptx[start:line_end].split()[2].rstrip(",")
    planted = ptx[:start] + f"mad.lo.u32 {dst}, {src}, 16, 448;" + ptx[line_end:]  # 7 chunks in: a split's start
    got, want = run(kernel, BWD[kernel], ptx=planted)
    assert mismatches(kernel, got, want)["dw"] > 0


# ---- the forward that quantizes its own rows of x -----------------------------------------

FWDQ = {  # each tile and type, the split family where it splits (R = 27, K = 729: 6 ways)
    "hslm_fwdq_f32": Dims(130, 68, 132), "hslm_fwdq_bf16_m32": Dims(67, 97, 131),
    "hslm_fwdq_f16_m32n16": Dims(33, 257, 9), "hslm_fwdq_splitk_bf16_m32n16": Dims(27, 729, 243),
    "hslm_fwdq_splitk_f32_m32": Dims(1, 1, 1),
}


@pytest.mark.parametrize("kernel", FWDQ)
def test_quantizing_forward_is_qrows_then_forward_bit_for_bit(kernel):
    got, want = run(kernel, FWDQ[kernel])
    assert mismatches(kernel, got, want) == {"y": 0}


def test_the_quantizing_forward_splits_where_the_forward_does():
    from hslm_ptx.catalog.registry import choose

    for dims in (Dims(27, 729, 243), Dims(1782, 243, 729), Dims(27, 243, 243)):
        fwdq, fwd = choose("hslm_fwdq_splitk_bf16", dims), choose("hslm_fwd_splitk_bf16", dims)
        assert fwdq.tile == fwd.tile and fwdq.geometry(dims) == fwd.geometry(dims)
    assert choose("hslm_fwdq_splitk_bf16", Dims(27, 729, 243)).geometry(Dims(27, 729, 243)).grid[2] == 6


@pytest.mark.parametrize("fault", [
    ("shfl.sync.bfly.b32", "shfl.sync.idx.b32"),  # a row's four threads do not combine their maxima
    ("cvt.rni.s32.f32", "cvt.rzi.s32.f32"),  # the codes truncated, not rounded to nearest even
])
def test_a_fault_in_the_quantizing_forward_is_caught(fault):
    kernel = "hslm_fwdq_bf16_m32"
    ptx = KERNELS[kernel].emit()
    assert fault[0] in ptx
    got, want = run(kernel, FWDQ[kernel], ptx=ptx.replace(*fault))
    assert mismatches(kernel, got, want)["y"] > 0


# ---- the training forward: the quantizing product and x's columns in one grid -------------

FWDX = {"hslm_fwdx_f32": Dims(67, 97, 131), "hslm_fwdx_bf16_m32n16": Dims(27, 729, 243),
        "hslm_fwdx_f16": Dims(130, 68, 132)}


@pytest.mark.parametrize("kernel", FWDX)
def test_training_forward_is_fwdq_and_qcols_bit_for_bit(kernel):
    got, want = run(kernel, FWDX[kernel])
    assert mismatches(kernel, got, want) == {"y": 0, "codes_t": 0, "scales": 0, "sums": 0}


def test_a_fault_in_the_column_half_of_the_training_forward_is_caught():
    """The column sums' adds turned into subtractions (the product's adds with them)."""
    kernel = "hslm_fwdx_bf16_m32n16"
    ptx = KERNELS[kernel].emit()
    assert "add.rn.f32" in ptx
    got, want = run(kernel, FWDX[kernel], ptx=ptx.replace("add.rn.f32", "sub.rn.f32"))
    assert mismatches(kernel, got, want)["sums"] > 0
