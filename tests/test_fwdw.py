"""hslm_fwdw: the forward of a new weight version, W coded by the product's own CTAs.

Its outputs are the bits of the two launches it replaces (hslm_wprep's beta and planes,
hslm_fwdx's y and x's columns), and the compares it codes W with are the division's codes
for every float."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.families import hslm_wprep
from hslm_ptx.formats.floats import to_f32
from hslm_ptx.kernel.spec import Dims
from hslm_ptx.pipeline.stages.verify import compare_output, compare_outputs
from hslm_ptx.reference import stepmath
from hslm_ptx.runtime import backends
from hslm_ptx.runtime.launch import launch_outputs

F32 = np.float32
TINY = float(stepmath.THRESHOLD_TINY)


def _outputs(name: str, dims: Dims, inputs: dict[str, np.ndarray], ptx: str | None = None) -> dict[str, np.ndarray]:
    fn = backends.load_ptx("emulator", ptx or KERNELS[name].emit(), name)
    return launch_outputs(KERNELS[name], fn, dims, {k: np.array(v) for k, v in inputs.items()})


@settings(max_examples=300, deadline=None)
@given(w_bits=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64),
       beta=st.one_of(st.floats(min_value=0, allow_infinity=True, width=32), st.just(float("nan")),
                      st.floats(min_value=0, max_value=TINY * 4, width=32)))
def test_the_threshold_codes_are_the_division_codes(w_bits, beta):
    """Any f32 W (NaN, inf, subnormal) and any beta the preparation can produce (0 is 1 there),
    and the elements next to +-beta / 2, where a compare with a wrong constant would differ."""
    beta = F32(1.0) if beta == 0 else F32(beta)
    w = np.array(w_bits, dtype=np.uint32).view(F32)
    half = F32(beta * F32(0.5))
    edges = np.array([half, np.nextafter(half, F32(np.inf)), np.nextafter(half, F32(0))], dtype=F32)
    w = np.concatenate([w, edges, -edges])
    with np.errstate(all="ignore"):
        assert np.array_equal(stepmath.ternary_codes_by_threshold(w, beta), stepmath.ternary_codes(w, beta))


def test_a_wrong_threshold_is_told_apart():
    """w = beta / 2 exactly: rint(1/2) is 0, so a compare with >= would code it +1."""
    beta = F32(0.75)
    w = np.array([beta * F32(0.5)], dtype=F32)
    assert stepmath.ternary_codes(w, beta)[0] == 0
    scale, half = stepmath.ternary_threshold(beta)
    assert bool(w[0] * scale >= half) and not bool(w[0] * scale > half)


CASES = {"hslm_fwdw_bf16_bf16": Dims(67, 97, 131), "hslm_fwdw_f16_f32_m32n16": Dims(27, 200, 150)}


@pytest.mark.parametrize("kernel", CASES)
def test_the_fused_forward_is_wprep_then_fwdx_bit_for_bit(kernel):
    dims = CASES[kernel]
    spec = KERNELS[kernel]
    dtype, wdt = spec.params[1].dtype, spec.params[2].dtype  # x's and W's float types
    inputs = spec.make_inputs(dims, np.random.default_rng(3))
    fused = _outputs(kernel, dims, inputs)
    short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
    prep_name, fwd_name = f"hslm_wprep_{short[wdt]}", f"hslm_fwdx_{short[dtype]}_m32" if dtype != "float32" else "hslm_fwdx_f32"
    prep = _outputs(prep_name, dims, {"w": inputs["w"], "w_partials": inputs["w_partials"]})
    packed = hslm_wprep.coded(dims, to_f32(inputs["w"], wdt), inputs["w_partials"])[1]  # W's codes as fwdx takes them
    fwd_inputs = {"x": inputs["x"], "w": packed, "beta": prep["beta"], "bias": inputs["bias"]}
    fwd_inputs |= {name: np.zeros_like(inputs[name]) for name in ("partials", "tickets") if name in inputs}
    fwd = _outputs(fwd_name, dims, fwd_inputs)
    for name, want in (prep | fwd).items():
        param = next(p for p in spec.output_params if p.name == name)
        assert compare_output(param, fused[name], want)[0] == 0, name


def test_a_code_in_the_wrong_bits_is_caught_in_y_and_the_planes():
    """The planes word's gather (prmt 0x6420) moved: both the product's own codes and the
    preparation's planes go wrong, and verify says so per output."""
    kernel, dims = "hslm_fwdw_bf16_bf16", CASES["hslm_fwdw_bf16_bf16"]
    ptx = KERNELS[kernel].emit()
    assert "0x6420" in ptx
    inputs = KERNELS[kernel].make_inputs(dims, np.random.default_rng(3))
    want = KERNELS[kernel].expected(dims, {k: np.array(v) for k, v in inputs.items()})
    got = _outputs(kernel, dims, inputs, ptx=ptx.replace("0x6420", "0x6410"))
    bad = compare_outputs(KERNELS[kernel], got, want)[0]
    assert bad["y"] > 0 and bad["planes"] > 0 and bad["planes_t"] > 0
    assert bad["codes_t"] == 0 and bad["beta"] == 0
