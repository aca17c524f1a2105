"""What the emitted PTX promises, read off the text: target, decode form, tensor-core op,
and the shape of the two loop bodies (fast, tail).

The numbers that matter (exact results) come from running this PTX on the emulator
(tests/test_kernels_run.py) and on a GPU; these tests pin the structural contract of
DESIGN.md so a refactor of the emitters cannot drop it silently.
"""
import re

import pytest
from kernelcases import per_kernel

from kernels.registry import KERNELS, get_kernel

TERNARY = ["hslm_fwd_s8", "hslm_dx_s8"]
MMA = "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"


def bodies(ptx: str) -> dict[str, str]:
    """The chunk loop's two bodies: 'fast' (no tail predicates) and 'tail'."""
    fast = ptx.split("chunk:\n", 1)[1].split("tail_chunk:\n", 1)[0]
    tail = ptx.split("tail_chunk:\n", 1)[1].split("next_chunk:\n", 1)[0]
    return {"fast": fast, "tail": tail}


@pytest.mark.parametrize("name", per_kernel())
def test_emission_is_deterministic_and_targets_sm80(name):
    ptx = KERNELS[name].emit()
    assert ptx == KERNELS[name].emit()
    assert ".version 8.0\n.target sm_80\n.address_size 64" in ptx
    assert f".visible .entry {name}(" in ptx
    for body in bodies(ptx).values():
        assert body.count(MMA) == 8  # 2 k-steps x 4 n-tiles per chunk of 64
    assert ptx.count(MMA) == 16


@pytest.mark.parametrize("name", per_kernel())
def test_control_flow_is_uniform(name):
    ptx = KERNELS[name].emit()
    branches = re.findall(r"\bbra(\.\w+)?\b", ptx)
    assert branches == [".uni"] * 3  # fast-or-tail choice, skip the tail body, loop back edge


@pytest.mark.parametrize("name", per_kernel())
def test_fast_body_loads_without_predicates(name):
    fast, tail = bodies(KERNELS[name].emit()).values()
    guarded = [ln for ln in fast.splitlines() if "ld.global" in ln and ln.strip().startswith("@")]
    if name in TERNARY:
        assert len(guarded) == 1 and "ld.global.u32" in guarded[0]  # only the packed W word
        assert "ld.global.u8" not in fast and "ld.global.b32" in fast  # activations: aligned funnel
        assert "ld.global.b32" not in tail
    else:
        assert guarded == []
        assert fast.count("ld.global.u8") == tail.count("ld.global.u8") == 96


@pytest.mark.parametrize("name", per_kernel(TERNARY))
def test_ternary_decode_is_one_word_prmt_and_one_16_byte_store(name):
    ptx = KERNELS[name].emit()
    table = re.search(r"mov\.b32 (%r\d+), 0xff0100;", ptx).group(1)  # the 0x00FF0100 prmt table
    for body in bodies(ptx).values():
        assert body.count("ld.global.u32") == 1  # one u32 of 16 codes per thread per chunk
        assert len(re.findall(rf"prmt\.b32 %r\d+, {table}, 0, %r\d+;", body)) == 4
        assert body.count("st.shared.v4.b32") == 1
        assert body.count("bar.sync 0;") == 2


@pytest.mark.kernel("hslm_fwd_s8")
def test_forward_reads_each_lanes_b_chunk_with_one_16_byte_load_per_n_tile():
    for body in bodies(get_kernel("hslm_fwd_s8").emit()).values():
        assert body.count("ld.shared.v4.b32") == 4 and body.count("ld.shared.b32") == 0
    fast = bodies(get_kernel("hslm_fwd_s8").emit())["fast"]
    assert fast.count("ld.global.b32") == 2 * 5  # two rows, 16 bytes each: five aligned words


@pytest.mark.kernel("hslm_dx_s8")
def test_dx_gathers_b_with_word_loads_and_byte_transposes():
    for body in bodies(get_kernel("hslm_dx_s8").emit()).values():
        assert body.count("ld.shared.b32") == 16 and "ld.shared.u8" not in body
        assert body.count(", 0x5140;") == 8  # 4 transposes x 2 pairs


@pytest.mark.kernel("hslm_dw_s8")
def test_dw_reads_no_weights_and_uses_no_shared_memory():
    ptx = get_kernel("hslm_dw_s8").emit()
    assert ".shared" not in ptx and "bar.sync" not in ptx


def test_unknown_kernel_names_the_known_ones():
    with pytest.raises(KeyError, match="unknown kernel 'fwd'; known: hslm_fwd_s8, hslm_dx_s8, hslm_dw_s8"):
        get_kernel("fwd")
