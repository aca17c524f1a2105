"""What the BitNet tests share: Figure 3's BitLinear, as the example writes it from the paper.

The reference lives in examples/bitnet_charlm.py (the code marked FIGURE 3), loaded here by
path, so the layer the example trains against is the one these tests measure.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from torchcases import torch

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "bitnet_charlm.py"
_spec = importlib.util.spec_from_file_location("bitnet_charlm", EXAMPLE)
figure3 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figure3)

SHAPES = [(19, 40, 24), (3, 17, 33), (64, 243, 81)]  # (R, K, N): K off 16, R and N off any tile
SEEDS = range(5)
BOUND = 1e-6  # rel L2, f32: float rounding only


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in f64."""
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / want.norm())


class Figure3Product(torch.nn.Linear):
    """Figure 3's quantized product without its RMSNorm (what a plain TernaryLinear is)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return figure3.figure3_linear(x, self.weight, self.bias)


def figure3_twin(layer: torch.nn.Module) -> torch.nn.Module:
    """Figure 3's layer holding copies of ``layer``'s parameters: Figure3BitLinear for a
    layer with ``rms_norm``, else Figure3Product."""
    bias = layer.bias is not None
    if hasattr(layer, "rms_norm"):
        twin = figure3.Figure3BitLinear(layer.in_features, layer.out_features, bias, layer.rms_norm.eps)
    else:
        twin = Figure3Product(layer.in_features, layer.out_features, bias)
    twin.load_state_dict({k: v.detach().clone() for k, v in layer.state_dict().items()})
    return twin


def layer_step(layer: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(y, dx, dW[, dgain]) of a layer for the loss sum(y * dy), every gradient fresh."""
    for p in layer.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_()
    y = layer(x)
    y.backward(dy)
    grads = (layer.weight.grad,) + ((layer.rms_norm.weight.grad,) if hasattr(layer, "rms_norm") else ())
    return (y.detach(), x.grad) + grads
