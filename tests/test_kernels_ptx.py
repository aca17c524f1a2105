"""What the emitted PTX promises, read off the text: target, decode form, tensor-core op.

The numbers that matter (exact results) come from running this PTX on the emulator
(tests/test_kernels_run.py) and on a GPU; these tests pin the structural contract of
DESIGN.md so a refactor of the emitters cannot drop it silently.
"""
import re

import pytest
from kernelcases import per_kernel

from kernels.registry import KERNELS, get_kernel

TERNARY = ["ternary_fwd_s8", "hslm_dx_s8"]


@pytest.mark.parametrize("name", per_kernel())
def test_emission_is_deterministic_and_targets_sm80(name):
    ptx = KERNELS[name].emit()
    assert ptx == KERNELS[name].emit()
    assert ".version 8.0\n.target sm_80\n.address_size 64" in ptx
    assert f".visible .entry {name}(" in ptx
    assert ptx.count("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32") == 8  # 2 k-steps x 4 n-tiles


@pytest.mark.parametrize("name", per_kernel())
def test_control_flow_is_uniform(name):
    ptx = KERNELS[name].emit()
    branches = re.findall(r"\bbra(\.\w+)?\b", ptx)
    assert branches == [".uni"]  # the chunk loop's back edge, nothing data-dependent


@pytest.mark.parametrize("name", per_kernel(TERNARY))
def test_ternary_decode_is_one_word_prmt_and_one_16_byte_store(name):
    ptx = KERNELS[name].emit()
    assert ptx.count("ld.global.u32") == 1  # one u32 of 16 codes per thread per chunk
    assert "mov.b32 %r" in ptx and "0xff0100;" in ptx  # the 0x00FF0100 prmt table
    table = re.search(r"mov\.b32 (%r\d+), 0xff0100;", ptx).group(1)
    assert len(re.findall(rf"prmt\.b32 %r\d+, {table}, 0, %r\d+;", ptx)) == 4
    assert ptx.count("st.shared.v4.b32") == 1
    assert ptx.count("bar.sync 0;") == 2


@pytest.mark.kernel("hslm_dw_s8")
def test_dw_reads_no_weights_and_uses_no_shared_memory():
    ptx = get_kernel("hslm_dw_s8").emit()
    assert ".shared" not in ptx and "bar.sync" not in ptx


def test_unknown_kernel_names_the_known_ones():
    with pytest.raises(KeyError, match="unknown kernel 'fwd'; known: ternary_fwd_s8, hslm_dx_s8, hslm_dw_s8"):
        get_kernel("fwd")
