"""TernaryLinear against BitNet's published layer, measured: a benchmark that prints figures, not a test.

    python bench/bitnet_conventions.py

Figure 3's BitLinear ("The Era of 1-bit LLMs: Training Tips, Code and FAQ") is the code
marked FIGURE 3 in examples/bitnet_charlm.py, loaded from there. Over 3 shapes x 5 seeds
(f32, random Gaussian x and dY, nn.Linear's initialization, BitLinear's gains drawn in
[0.5, 1.5]) it prints the rel L2 of the library's layers against Figure 3's autograd, for
y, dX and dW (and the norm gain's gradient):

- TernaryLinear (plain) against Figure 3's product without the norm, and BitLinear
  against Figure 3's full layer, each with ``grad='int8'`` (the default) and ``grad='ste'``;
- ``kernels=False`` (the weight quantized, x in float) against Figure 3's product;
- the epsilon rules: the share of non-zero ternary codes of a weight scaled by 1e-7,
  and y for rows scaled by 1e-7, against Figure 3's 1e-5 clamps;
- where torchao is installed (it is no dependency of this project), TernaryLinear against
  torchao's ``quantize_(linear, bitnet_training())`` the same way.

tests/test_bitnet.py holds the same comparisons to their bounds.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hslm_ptx.nn import cpu_step as layer_cpu  # noqa: E402
from hslm_ptx.nn.bitlinear import BitLinear  # noqa: E402
from hslm_ptx.nn.linear import TernaryLinear  # noqa: E402

_spec = importlib.util.spec_from_file_location("bitnet_charlm", ROOT / "examples" / "bitnet_charlm.py")
figure3 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figure3)

SHAPES = [(19, 40, 24), (3, 17, 33), (64, 243, 81)]  # (R, K, N): K off 16, R and N off any tile
SEEDS = range(5)


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in f64."""
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / want.norm())


def random_layer(kind: type, K: int, N: int, seed: int, **options) -> torch.nn.Module:
    """A layer with nn.Linear's initialization and, for BitLinear, gains away from 1."""
    torch.manual_seed(seed)
    layer = kind(K, N, **options)
    if hasattr(layer, "rms_norm"):
        with torch.no_grad():
            layer.rms_norm.weight.uniform_(0.5, 1.5)
    return layer


def figure3_twin(layer: torch.nn.Module) -> torch.nn.Module:
    """Figure 3's layer holding copies of ``layer``'s parameters: Figure3BitLinear for a
    layer with ``rms_norm``, else Figure3Product."""
    bias = layer.bias is not None
    if hasattr(layer, "rms_norm"):
        twin = figure3.Figure3BitLinear(layer.in_features, layer.out_features, bias, layer.rms_norm.eps)
    else:
        twin = figure3.Figure3Product(layer.in_features, layer.out_features, bias)
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


def errors_against_figure3(kind: type, bias: bool = False, **options) -> np.ndarray:
    """rel L2 of (y, dx, dW[, dgain]) against Figure 3, one row per shape and seed."""
    rows = []
    for R, K, N in SHAPES:
        for seed in SEEDS:
            layer = random_layer(kind, K, N, seed, bias=bias, **options)
            x, dy = torch.randn(R, K), torch.randn(R, N)
            rows.append([rel_l2(g, w) for g, w in zip(layer_step(layer, x, dy), layer_step(figure3_twin(layer), x, dy))])
    return np.array(rows)


def errors_against_torchao(grad: str) -> np.ndarray | None:
    """rel L2 of (y, dx, dW) of TernaryLinear against torchao's bitnet_training layer, or
    None without torchao."""
    try:
        from torchao import quantize_
        from torchao.prototype.quantized_training import bitnet_training
    except ImportError:
        return None
    rows = []
    for R, K, N in SHAPES:
        for seed in SEEDS:
            layer = random_layer(TernaryLinear, K, N, seed, bias=False, grad=grad)
            twin = torch.nn.Linear(K, N, bias=False)
            twin.load_state_dict(layer.state_dict())
            quantize_(twin, bitnet_training())
            x, dy = torch.randn(R, K), torch.randn(R, N)
            rows.append([rel_l2(g, w) for g, w in zip(layer_step(layer, x, dy), layer_step(twin, x, dy))])
    return np.array(rows)


def print_ranges(title: str, errors: np.ndarray) -> None:
    names = ("y", "dX", "dW", "dgain")[: errors.shape[1]]
    print(f"  {title:<26} " + "  ".join(f"{n} {lo:.2e} - {hi:.2e}" for n, lo, hi in zip(names, errors.min(0), errors.max(0))))


def main() -> None:
    torch.set_num_threads(1)
    print(f"rel L2 against Figure 3's autograd, f32, {len(SHAPES)} shapes x {len(SEEDS)} seeds: min - max")
    for title, kind in (("TernaryLinear", TernaryLinear), ("BitLinear", BitLinear)):
        for grad in ("int8", "ste"):
            print_ranges(f"{title} grad={grad}", errors_against_figure3(kind, grad=grad))
    print_ranges("TernaryLinear kernels=False", errors_against_figure3(TernaryLinear, kernels=False)[:, :1])
    for grad in ("int8", "ste"):
        errors = errors_against_torchao(grad)
        if errors is not None:
            print_ranges(f"vs torchao bitnet grad={grad}", errors)
    torch.manual_seed(0)
    w = torch.randn(729, 243) * 0.05
    tiny = w * 1e-7
    ours = float(layer_cpu.prepare_weight(tiny).codes.count_nonzero()) / w.numel()
    theirs = float(figure3.weight_quant(tiny.clone()).count_nonzero()) / w.numel()
    print(f"weight scaled by 1e-7 (mean|W| {float(tiny.abs().mean()):.1e}): non-zero codes {ours:.1%} (step), "
          f"{theirs:.1%} (Figure 3's clamp)")
    layer = random_layer(TernaryLinear, 243, 729, 0, bias=False)
    x = torch.randn(64, 243) * 1e-7
    with torch.no_grad():
        print(f"rows scaled by 1e-7: rel L2 of y, step against Figure 3's clamp: "
              f"{rel_l2(layer(x), figure3_twin(layer)(x)):.2e} (at scale 1: "
              f"{rel_l2(layer(x * 1e7), figure3_twin(layer)(x * 1e7)):.2e})")


if __name__ == "__main__":
    main()
