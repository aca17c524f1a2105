"""BitNet's conventions on the int8 step: hslm_ptx/nn/bitlinear.py, hslm_ptx/nn/ste_grad.py, hslm_ptx/nn/convert.py.

- BitLinear (the input RMSNorm) against Figure 3's BitLinear (examples/bitnet_charlm.py,
  written from the paper): forward within float rounding; the emulator backend gives the
  cpu backend's bits; it compiles with fullgraph=True for both backwards.
- grad='ste' against Figure 3's autograd gradients within float rounding; the default
  int8 backward is measurably different (the negative case of the same check).
- The converter: what it swaps and keeps (lm_head), shared parameters, skip=, norm=True.
- Hugging Face's packed format: unpacking and a latent weight that ternarizes to the codes.
- The epsilon choice: scale invariance, and where Figure 3's 1e-5 clamps differ.
- examples/bitnet_charlm.py runs (a few steps) and writes its PNG and table.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from bitnetcases import BOUND, SHAPES, errors_against_figure3, figure3, figure3_twin, layer_step, random_layer, rel_l2
from hypothesis import given, settings
from hypothesis import strategies as st
from torchcases import torch

from hslm_ptx.nn import cpu_step as layer_cpu
from hslm_ptx.nn.bitlinear import BitLinear
from hslm_ptx.nn.convert import latent_from_packed, ternarize_model, unpack_codes
from hslm_ptx.nn.linear import TernaryLinear


def worst(kind: type, grad: str, bias: bool = False) -> list[float]:
    """The largest rel L2 of (y, dx, dW[, dgain]) against Figure 3 over SHAPES x SEEDS."""
    return list(errors_against_figure3(kind, bias=bias, grad=grad).max(axis=0))


# ---- BitLinear's forward and the two backwards against Figure 3 ------------------------------

def test_bitlinear_forward_is_figure3s_within_float_rounding():
    assert worst(BitLinear, "int8")[0] <= BOUND


def test_a_plain_ternarylinear_is_not_figure3s_bitlinear():
    """The negative of the forward check: without the norm the output is far off."""
    errors = []
    for R, K, N in SHAPES:
        torch.manual_seed(0)
        layer = BitLinear(K, N)
        plain = TernaryLinear(K, N, bias=False)
        plain.weight = layer.weight
        x = torch.randn(R, K) * 3
        errors.append(rel_l2(plain(x), figure3_twin(layer)(x)))
    assert min(errors) > 0.5


@pytest.mark.parametrize("kind", [BitLinear, TernaryLinear], ids=["BitLinear", "TernaryLinear"])
def test_ste_gradients_are_figure3s_autograd_gradients(kind):
    """y, dx, dW (and the gain's gradient) within float rounding of Figure 3's autograd."""
    assert max(worst(kind, "ste", bias=kind is TernaryLinear)) <= BOUND


def test_the_int8_backward_differs_from_figure3s_by_design():
    """The default backward quantizes dY: its dx and dW are over 0.1% off (the negative of
    the ste check), while its forward is the same."""
    y, dx, dw, dgain = worst(BitLinear, "int8")
    assert y <= BOUND
    assert min(dx, dw, dgain) > 1e-3


def test_ste_bias_gradient_is_the_column_sum_of_dy():
    layer = TernaryLinear(17, 9, grad="ste")
    dy = torch.randn(4, 9)
    layer(torch.randn(4, 17)).backward(dy)
    assert torch.allclose(layer.bias.grad, dy.sum(0), rtol=0, atol=1e-6)


@pytest.mark.parametrize("grad", ["int8", "ste"])
def test_bitlinear_on_the_emulator_gives_the_cpu_backends_bits(grad):
    torch.manual_seed(3)
    cpu = random_layer(BitLinear, 40, 24, 3, grad=grad)
    emulator = BitLinear(40, 24, backend="emulator", grad=grad)
    emulator.load_state_dict(cpu.state_dict())
    x, dy = torch.randn(19, 40) * 4, torch.randn(19, 24)
    for got, want in zip(layer_step(emulator, x, dy), layer_step(cpu, x, dy)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_bitlinear_keeps_the_input_dtype(dtype):
    layer = BitLinear(16, 8, dtype=dtype, grad="ste")
    x = torch.randn(2, 3, 16, dtype=dtype, requires_grad=True)
    y = layer(x)
    y.sum().backward()
    assert y.dtype == dtype and x.grad.dtype == dtype and layer.rms_norm.weight.grad.dtype == dtype


def test_bitlinear_state_dict_has_hugging_faces_names():
    assert list(BitLinear(8, 4, bias=True).state_dict()) == ["weight", "bias", "rms_norm.weight"]


def test_an_unknown_grad_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^TernaryLinear: grad='float', expected 'int8'"):
        TernaryLinear(4, 4, grad="float")


def test_ste_skips_the_gradients_not_asked_for():
    layer = TernaryLinear(8, 4, grad="ste")
    layer.weight.requires_grad_(False)
    x = torch.randn(3, 8, requires_grad=True)
    layer(x).sum().backward()
    assert layer.weight.grad is None and x.grad.shape == (3, 8) and layer.bias.grad.shape == (4,)


@pytest.mark.parametrize("backend", ["cpu", "emulator"])
def test_ste_prepares_the_weight_once_a_step(preparations, backend):
    """The backward's beta * W_t is the forward's preparation, never made again: one
    preparation a step (the emulator backend's own, then the CPU codes its dX reads: two),
    a new one after each optimizer step."""
    layer = TernaryLinear(8, 4, grad="ste", backend=backend)
    x = torch.randn(3, 8, requires_grad=True)
    sgd = torch.optim.SGD(layer.parameters(), lr=0.1)
    per_step = 1 if backend == "cpu" else 2
    for step in (1, 2):
        layer(x).sum().backward()
        assert preparations.count == step * per_step
        sgd.step()


# ---- the converter ---------------------------------------------------------------------------

class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(11, 8)
        self.block = torch.nn.ModuleDict({"up": torch.nn.Linear(8, 16), "down": torch.nn.Linear(16, 8, bias=False)})
        self.attention = torch.nn.MultiheadAttention(8, 2)  # out_proj: an nn.Linear subclass
        self.router = torch.nn.Linear(8, 2)
        self.lm_head = torch.nn.Linear(8, 11, bias=False)


def test_the_converter_keeps_lm_head_and_shares_parameters():
    model = Tiny()
    up_weight, head = model.block["up"].weight, model.lm_head
    keys = list(model.state_dict())
    converted = ternarize_model(model)
    assert converted == ["block.up", "block.down", "router"]
    assert type(model.block["up"]) is TernaryLinear and model.block["up"].weight is up_weight
    assert model.lm_head is head and type(model.lm_head) is torch.nn.Linear
    assert type(model.attention.out_proj) is not TernaryLinear  # MultiheadAttention reads its weight itself
    assert list(model.state_dict()) == keys  # the checkpoint's names are unchanged


def test_the_converter_skips_named_modules_and_their_subtrees():
    model = Tiny()
    assert ternarize_model(model, skip=("block", "router")) == ["lm_head"]
    assert type(model.block["up"]) is torch.nn.Linear and type(model.lm_head) is TernaryLinear


def test_the_converter_passes_options_and_makes_bitlinear_with_norm():
    model = Tiny()
    ternarize_model(model, norm=True, grad="ste", norm_eps=1e-5)
    layer = model.router
    assert type(layer) is BitLinear and layer.grad == "ste" and layer.rms_norm.eps == 1e-5
    assert layer.bias is not None  # the nn.Linear's bias is kept


# ---- Hugging Face's packed format ---------------------------------------------------------------

def test_unpacking_follows_hugging_faces_documented_example():
    """The example of transformers.integrations.bitnet.unpack_weights' docstring."""
    packed = torch.tensor([[0b10100001, 0b00011000], [0b10010000, 0b00001010]], dtype=torch.uint8)
    want = [[0, -1], [-1, 1], [-1, 1], [-1, 1], [1, 0], [0, -1], [1, -1], [1, -1]]
    assert unpack_codes(packed).tolist() == want


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """Four row blocks of t + 1 into the 2-bit fields of one byte (the inverse of unpack_codes)."""
    blocks = (codes + 1).to(torch.uint8).chunk(4, dim=0)
    return blocks[0] | blocks[1] << 2 | blocks[2] << 4 | blocks[3] << 6


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 6), cols=st.integers(1, 20), zero=st.floats(0.0, 1.0), scale=st.floats(1e-3, 1e3),
       seed=st.integers(0, 2**31))
def test_the_latent_weight_ternarizes_to_the_packed_codes(rows, cols, zero, scale, seed):
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(-1, 2, (4 * rows, cols), generator=gen).to(torch.int8)
    codes[torch.rand(codes.shape, generator=gen) < zero] = 0
    weight_scale = torch.tensor([scale])
    latent = latent_from_packed(pack_codes(codes), weight_scale)
    prepared = layer_cpu.prepare_weight(latent)
    assert torch.equal(prepared.codes.to(torch.int8), codes)
    if codes.any():
        assert abs(prepared.beta * scale - 1) <= 1e-6  # beta = 1 / weight_scale


def test_the_codes_times_beta_are_not_a_faithful_latent_weight():
    """Why latent_from_packed divides by the non-zero fraction: W = t * beta has
    mean|W| = beta * f, so the step's beta would be off by the factor f."""
    codes = torch.tensor([[1, 0, 0, -1]] * 4, dtype=torch.int8)
    prepared = layer_cpu.prepare_weight(codes.float() * 2.0)
    assert prepared.beta == pytest.approx(1.0)  # not 2
    assert layer_cpu.prepare_weight(latent_from_packed(pack_codes(codes), torch.tensor([0.5]))).beta == pytest.approx(2.0)


# ---- the epsilon choice ---------------------------------------------------------------------

def test_the_step_is_scale_invariant_where_figure3s_clamp_zeroes_tiny_weights():
    torch.manual_seed(5)
    w = torch.randn(24, 40) * 0.05
    tiny = w * 1e-7  # mean|W| ~ 4e-9, under Figure 3's 1e-5 clamp
    assert torch.equal(layer_cpu.prepare_weight(tiny).codes, layer_cpu.prepare_weight(w).codes)
    assert layer_cpu.prepare_weight(tiny).codes.count_nonzero() > 0
    assert figure3.weight_quant(tiny.clone()).count_nonzero() == 0  # the clamp: every code 0
    # at a training scale the two rules give the same codes
    assert torch.equal(layer_cpu.prepare_weight(w).codes, torch.sign(figure3.weight_quant(w.clone())))


# ---- the example -----------------------------------------------------------------------------

def test_the_charlm_example_runs_and_writes_its_picture_and_table(tmp_path):
    out = tmp_path / "charlm"
    result = subprocess.run([sys.executable, "examples/bitnet_charlm.py", "--steps", "3", "--width", "16",
                             "--blocks", "1", "--batch", "2", "--context", "16", "--out", str(out)],
                            capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("ms CPU / step") == 4
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = out.with_suffix(".md").read_text()
    assert table.count("\n| ") == 6 and "Figure 3 BitLinear" in table  # header, rule, four layers


@pytest.mark.parametrize("grad", ["int8", "ste"])
def test_bitlinear_compiles_without_a_graph_break(grad):
    """fullgraph=True (AOTAutograd, eager kernels: the trace is what is checked) equals eager."""
    layer = random_layer(BitLinear, 16, 8, 2, grad=grad)
    x, dy = torch.randn(4, 16), torch.randn(4, 8)
    want = layer_step(layer, x, dy)
    got = layer_step(torch.compile(layer, fullgraph=True, backend="aot_eager"), x, dy)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
