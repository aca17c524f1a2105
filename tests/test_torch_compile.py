"""torch.compile of a model of TernaryLinear layers (hslm_ptx/nn/ops.py's operators).

One small two-layer model is compiled once for the module (compiling is the slow part):
``fullgraph=True`` must trace it with no graph break, and forward + backward under
compile must equal eager bit for bit on CPU, before and after an optimizer step (the
prepared-weight cache sees the new version inside the compiled code too). A model with a
planted host read shows that fullgraph would catch a break. torch.library.opcheck checks
both operators' registrations (fake against real, autograd, dynamic shapes); an operator
with a wrong fake shows it would catch one.
"""
from __future__ import annotations

import pytest
from torchcases import gradients, torch

from hslm_ptx import TernaryLinear
from hslm_ptx.nn import ops as torch_ops


def two_layers() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(TernaryLinear(16, 32), torch.nn.ReLU(), TernaryLinear(32, 8))


def step(model: torch.nn.Module, params: list[torch.nn.Parameter], x: torch.Tensor, dy: torch.Tensor):
    """y, x's gradient and every parameter's, for the loss sum(y * dy)."""
    y, dx, grads = gradients(model, params, x, dy)
    return [y, dx, *grads]


@pytest.fixture(scope="module")
def compiled():
    """(eager model, its compiled twin sharing the parameters, x, dy); compiled once."""
    torch._dynamo.reset()
    model = two_layers()
    x = torch.randn(2, 5, 16)  # leading dimensions: the flatten is traced as well
    dy = torch.randn(2, 5, 8)
    fast = torch.compile(model, fullgraph=True)
    step(fast, list(model.parameters()), x, dy)  # compile here, once
    return model, fast, x, dy


def test_compiled_forward_and_backward_equal_eager_bit_for_bit(compiled):
    model, fast, x, dy = compiled
    params = list(model.parameters())
    want = step(model, params, x, dy)
    got = step(fast, params, x, dy)
    assert len(got) == 6
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g, w)


def test_compiled_step_sees_an_optimizer_update(compiled, preparations):
    model, fast, x, dy = compiled
    params = list(model.parameters())
    before = step(fast, params, x, dy)
    torch.optim.SGD(params, lr=0.5).step()
    prepared = preparations.count
    got = step(fast, params, x, dy)
    assert preparations.count == prepared + 2  # one per layer, shared by its backward
    want = step(model, params, x, dy)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert not torch.equal(got[0], before[0])  # the update changed the output: the test can fail


def test_fullgraph_would_catch_a_graph_break():
    """Negative: a layer that reads a value back to the host breaks the graph, and
    fullgraph=True refuses it, so the compiled model above had none."""

    class HostRead(TernaryLinear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if float(x.sum()) > 1e30:  # a host read: data-dependent control flow
                x = x * 0
            return super().forward(x)

    model = torch.nn.Sequential(HostRead(16, 8))
    with pytest.raises(Exception, match="data-dependent"):
        torch.compile(model, fullgraph=True)(torch.randn(3, 16))


def test_compiled_on_cuda_with_cuda_graphs_equals_eager():
    """On a GPU: mode='reduce-overhead' (CUDA graphs) traces and replays the same step."""
    if not torch.cuda.is_available():
        pytest.skip("GPU check: torch sees no CUDA device")
    pytest.importorskip("cupy", reason="GPU check: needs CuPy")
    model = two_layers().cuda()
    params = list(model.parameters())
    x, dy = torch.randn(2, 5, 16, device="cuda"), torch.randn(2, 5, 8, device="cuda")
    fast = torch.compile(model, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):  # record, then replay
        got = [g.clone() for g in step(fast, params, x, dy)]
    want = step(model, params, x, dy)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


# ---- the operators' registrations, checked by torch.library.opcheck -------------------------

def test_the_operators_pass_opcheck():
    """Schema, autograd registration, fake against real (shapes, dtypes, strides) and
    AOTAutograd with dynamic shapes, for forward and every gradient combination."""
    torch.manual_seed(1)
    x = torch.randn(5, 16, requires_grad=True)
    w = torch.randn(8, 16, requires_grad=True)
    b = torch.randn(8, requires_grad=True)
    cases = [(x, w, b, "cpu", True), (x, w.detach(), None, "cpu", False), (torch.randn(0, 16), w, b, "cpu", True),
             (x.bfloat16(), w, b, "cpu", True)]
    for args in cases:
        report = torch.library.opcheck(torch_ops.linear, args)
        assert set(report.values()) == {"SUCCESS"}, report
    y, codes, scales = torch_ops.linear(x, w, b, "cpu", True)
    dy = torch.randn_like(y)
    for flags in [(True, True, True), (False, True, False), (True, False, False)]:
        report = torch.library.opcheck(torch_ops.linear_backward, (dy, codes, scales, w.detach(), "cpu", *flags))
        assert set(report.values()) == {"SUCCESS"}, report


def test_the_emulator_backends_fake_matches_what_it_keeps():
    """The fake implementation's saved layout (K x pitch(R) codes) is what hslm_ptx.step.launches
    returns, so compiling a model on the emulator or CUDA backend traces the right shapes."""
    from hslm_ptx.catalog import registry

    if "hslm_wsum_f32" not in registry.FAMILIES:
        pytest.skip("the layer step's kernels are not in hslm_ptx.catalog.registry yet")
    torch.manual_seed(2)
    args = (torch.randn(3, 16), torch.randn(8, 16), None, "emulator", True)
    report = torch.library.opcheck(torch_ops.linear, args, test_utils=("test_faketensor",))
    assert report == {"test_faketensor": "SUCCESS"}


def test_opcheck_catches_a_wrong_fake():
    """Negative: an operator whose fake says the wrong shape fails opcheck."""

    @torch.library.custom_op("hslm_test::wrong_fake", mutates_args=())
    def wrong(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @wrong.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return x.new_empty((x.shape[0] + 1,))

    with pytest.raises(Exception, match="(?i)shape|size"):
        torch.library.opcheck(wrong, (torch.randn(3),), test_utils=("test_faketensor",))


def test_asking_for_dw_after_keeping_nothing_is_one_line():
    w = torch.randn(8, 16, requires_grad=True)
    y, _, _ = torch_ops.linear(torch.randn(3, 16), w, None, "cpu", False)
    with pytest.raises(RuntimeError, match=r"^hslm::linear: the weight's gradient was asked for"):
        y.sum().backward()
