"""A launch's CTAs run in groups (``machine.GROUP_THREADS`` threads of whole CTAs in one
lockstep array, the groups one after another): what a kernel computes and what the
emulator counts do not depend on the grouping. The kernels here cover the grouping's
hard cases: split-K partial sums with an arrival ticket (the last CTA reads what the
others released), and a fused grid whose CTAs take different members (dX, dW, db)."""
from __future__ import annotations

import numpy as np
import pytest

from hslm_ptx.catalog.registry import get_kernel
from hslm_ptx.emu import machine
from hslm_ptx.kernel.spec import Dims
from hslm_ptx.pipeline.stages.verify import compare_outputs
from hslm_ptx.runtime.launch import launch_outputs

CASES = [("hslm_fwd_splitk_f32", Dims(27, 729, 243)), ("hslm_bwd_bf16_bf16", Dims(27, 243, 729))]


def _launch(kernel: str, dims: Dims, group_threads: int, monkeypatch):
    monkeypatch.setattr(machine, "GROUP_THREADS", group_threads)
    spec = get_kernel(kernel)
    inputs = spec.make_inputs(dims, np.random.default_rng(7))
    want = spec.expected(dims, inputs)
    fn = machine.Module(code=spec.emit()).get_function(kernel)
    got = launch_outputs(spec, fn, dims, {name: np.array(a) for name, a in inputs.items()})
    return spec, got, want, fn.stats


@pytest.mark.parametrize("kernel, dims", CASES, ids=[k for k, _ in CASES])
def test_one_cta_a_group_computes_and_counts_what_one_lockstep_array_does(kernel, dims, monkeypatch):
    spec, whole, want, whole_stats = _launch(kernel, dims, 1 << 30, monkeypatch)
    _, single, _, single_stats = _launch(kernel, dims, 1, monkeypatch)
    counts, _, _ = compare_outputs(spec, whole, want)
    assert sum(counts.values()) == 0
    for name in whole:
        assert np.asarray(single[name]).tobytes() == np.asarray(whole[name]).tobytes(), name
    assert single_stats.warp_instructions == whole_stats.warp_instructions
    assert single_stats.by_opcode == whole_stats.by_opcode
    assert single_stats.memory == whole_stats.memory
    # the groups' schedules are their own: a grid of one-CTA groups takes more steps
    assert single_stats.steps > whole_stats.steps


def test_a_wrong_line_is_caught_in_a_later_group(monkeypatch):
    """A fault in a CTA of the last group names that CTA (global ctaid), not the group's
    first: the group offset reaches the error."""
    from emucases import PROLOGUE, Z, module
    monkeypatch.setattr(machine, "GROUP_THREADS", 1)
    body = ("  setp.eq.u32 %p1, %r2, 2;\n  @%p1 ld.param.u64 %rd20, [out];\n"
            "  @%p1 cvta.to.global.u64 %rd20, %rd20;\n  @%p1 ld.global.u32 %r20, [%rd20+4096];")
    fn = machine.Module(code=module(PROLOGUE + body)).get_function("k")
    with pytest.raises(machine.EmulatorError) as err:
        fn((3,), (32,), [np.zeros(128, np.uint32), Z, Z, Z])
    assert err.value.kind == "out_of_bounds"
    assert err.value.ctaid == (2, 0, 0)
