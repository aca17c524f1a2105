"""A Hugging Face BitNetForCausalLM on the int8 step (hslm_ptx/nn/convert.py).

A tiny config built here (random weights, nothing downloaded). Two conversions are
checked against transformers' own ternary layers (transformers.integrations.bitnet) on the
same model:

- from float weights: ``ternarize_model`` against transformers' AutoBitLinear in online
  mode (Figure 3's quantizers on the latent weights);
- from the packed format: the model's linear layers replaced by transformers' BitLinear
  holding packed 2-bit codes and weight_scale (a pre-quantized checkpoint's layout), then
  ``ternarize_model`` on that model.

Each converted layer, fed the input its transformers twin sees inside the model, gives that
twin's output within LAYER_BOUND (rel L2): the two differ only in float rounding (x * (127 /
absmax) against x / (absmax / 127), the order of the products' sums). Through the whole
model those last-bit differences reach later layers' inputs, where one can move an
activation across a rounding tie and flip its int8 code (one code step, 1/127 of its row's
absmax), so the logits are held to LOGITS_BOUND: measured 3.2e-7 when no code flips and
1.8e-3 with the flips of the packed case here, against 1.01 for the unconverted float model.
transformers' quantizers are wrapped in ``torch.compile``; they run eagerly here
(``torch._dynamo.config.disable``), the same arithmetic without the compile time.

transformers is the optional extra ``hf``; CI installs it (.ci/run: .[dev,hf]) and sets
CI, and there a missing transformers fails this module instead of skipping it.
"""
from __future__ import annotations

import copy
import os

import pytest
from bitnetcases import rel_l2
from torchcases import torch

try:
    import transformers
    from transformers.integrations import bitnet as hf_bitnet
except ImportError:  # never a silent skip in CI, where .[dev,hf] installs transformers
    if os.environ.get("CI"):
        raise
    pytest.skip("transformers is not installed: pip install -e '.[hf]'", allow_module_level=True)

from hslm_ptx.nn import cpu_step as layer_cpu
from hslm_ptx.nn.convert import ternarize_model
from hslm_ptx.nn.linear import TernaryLinear

LAYER_BOUND = 1e-6  # rel L2 of each layer's output on the same input (measured <= 2.5e-7)
LOGITS_BOUND = 1e-2  # rel L2 of the logits, code flips included (the module docstring)
LINEARS_PER_LAYER = 7  # q, k, v, o, gate, up, down


@pytest.fixture(autouse=True)
def eager_transformers():
    import torch._dynamo

    with torch._dynamo.config.patch(disable=True):
        yield


@pytest.fixture(scope="module")
def model_and_ids():
    config = transformers.BitNetConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.BitNetForCausalLM(config).eval()
    return model, torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))


def replace_linears(module: torch.nn.Module, make) -> None:
    """Every nn.Linear below ``module`` but lm_head, through ``make(linear)``."""
    for name, child in module.named_children():
        if name != "lm_head" and type(child) is torch.nn.Linear:
            setattr(module, name, make(child))
        else:
            replace_linears(child, make)


def hf_online(linear: torch.nn.Linear) -> torch.nn.Module:
    layer = hf_bitnet.AutoBitLinear(linear.in_features, linear.out_features, linear.bias is not None,
                                    online_quant=True)
    layer.load_state_dict(linear.state_dict())
    return layer


def hf_packed(linear: torch.nn.Linear) -> torch.nn.Module:
    """transformers' packed BitLinear holding the ternarization of ``linear``'s weight."""
    layer = hf_bitnet.BitLinear(linear.in_features, linear.out_features, linear.bias is not None,
                                dtype=torch.float32)
    prepared = layer_cpu.prepare_weight(linear.weight)
    layer.weight.copy_(hf_bitnet.pack_weights(prepared.codes.to(torch.int8).clone()))
    layer.weight_scale.fill_(1.0 / prepared.beta)
    return layer


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def layers_agree(ours: torch.nn.Module, reference: torch.nn.Module, ids: torch.Tensor, names: list[str]) -> float:
    """The largest rel L2 between each converted layer and its transformers twin, both fed
    the input the twin receives in ``reference``'s forward on ``ids``."""
    inputs = {}
    hooks = [reference.get_submodule(name).register_forward_hook(
        lambda module, args, out, name=name: inputs.__setitem__(name, args[0].detach())) for name in names]
    logits(reference, ids)
    for hook in hooks:
        hook.remove()
    with torch.no_grad():
        return max(rel_l2(ours.get_submodule(name)(inputs[name]), reference.get_submodule(name)(inputs[name]))
                   for name in names)


def converted_copy(model: torch.nn.Module) -> tuple[torch.nn.Module, list[str]]:
    """A copy of ``model`` with its linear layers converted, and their names: one per
    projection of every layer, each a TernaryLinear."""
    ours = copy.deepcopy(model)
    converted = ternarize_model(ours)
    assert len(converted) == LINEARS_PER_LAYER * model.config.num_hidden_layers
    assert all(type(ours.get_submodule(name)) is TernaryLinear for name in converted)
    return ours, converted


def test_transformers_has_bitnet():
    assert hasattr(transformers, "BitNetForCausalLM") and hasattr(hf_bitnet, "AutoBitLinear")


def test_a_converted_bitnet_model_gives_transformers_logits(model_and_ids):
    model, ids = model_and_ids
    reference = copy.deepcopy(model)
    replace_linears(reference, hf_online)
    ours, converted = converted_copy(model)
    assert type(ours.lm_head) is torch.nn.Linear  # kept in full precision
    assert layers_agree(ours, reference, ids, converted) <= LAYER_BOUND
    assert rel_l2(logits(ours, ids), logits(reference, ids)) <= LOGITS_BOUND


def test_the_float_model_is_far_from_transformers_ternary_logits(model_and_ids):
    """The negative of the bound: not converting is far outside it."""
    model, ids = model_and_ids
    reference = copy.deepcopy(model)
    replace_linears(reference, hf_online)
    assert rel_l2(logits(model, ids), logits(reference, ids)) > 10 * LOGITS_BOUND


def test_a_packed_bitnet_model_converts_to_the_same_logits(model_and_ids):
    model, ids = model_and_ids
    reference = copy.deepcopy(model)
    replace_linears(reference, hf_packed)
    ours, converted = converted_copy(reference)
    assert layers_agree(ours, reference, ids, converted) <= LAYER_BOUND
    assert rel_l2(logits(ours, ids), logits(reference, ids)) <= LOGITS_BOUND


def test_a_converted_bitnet_model_trains(model_and_ids):
    """One optimizer step through the converted model: every converted weight gets a gradient."""
    model, ids = model_and_ids
    ours = copy.deepcopy(model).train()
    converted = ternarize_model(ours, grad="ste")
    loss = ours(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and all(ours.get_submodule(name).weight.grad.abs().sum() > 0 for name in converted)
