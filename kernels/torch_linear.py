"""TernaryLinear: a torch linear layer whose forward, dX and dW run the int8 kernels.

The layer keeps latent float weights (``nn.Linear``'s layout, ``weight`` N x K) and
ternarizes them in every forward as BitNet b1.58 does: beta = mean|W|,
W_t = clip(round(W / beta), -1, 1). The straight-through estimator passes the gradient
of beta * W_t to the latent W unchanged (d(beta W_t)/dW taken as the identity, beta's
own dependence on W included, as BitNet's ``w + (q(w) - w).detach()`` does).
Activations and output gradients are int8 (one scale per row for forward and dX, per
column for dW: kernels/ops.py), so a layer's three products are the three kernels:
forward, dX (skipped when the input needs no gradient) and dW.

Tensors cross into the kernels without a copy through DLPack: a CUDA tensor becomes a
CuPy array and the PTX runs on the GPU; a CPU tensor becomes a numpy array and the PTX
runs on the CPU emulator (exact, but it runs every thread in numpy: small shapes only).
Results come back the same way. float16/32/64 run as they are; other float types
(bfloat16, which numpy lacks) run in float32 and are cast back.

``TernaryLinear(..., kernels=False)`` is the same layer with float matmuls on the same
STE weights: the reference the int8 path is measured against.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from kernels import ops
from kernels.quant import ternarize
from kernels.ternary import pack
from kernels.validate import LaunchError

KERNEL_DTYPES = (torch.float16, torch.float32, torch.float64)


def to_array(tensor: torch.Tensor) -> Any:
    """A numpy (CPU) or CuPy (CUDA) view of ``tensor``'s memory, no copy (DLPack)."""
    tensor = tensor.detach()
    if tensor.device.type == "cuda":
        import cupy  # optional: only a CUDA tensor needs it

        return cupy.from_dlpack(tensor)
    if tensor.device.type == "cpu":
        return np.from_dlpack(tensor)
    raise LaunchError(f"TernaryLinear: tensors on '{tensor.device}' are not supported; use a CPU or CUDA device")


def to_tensor(array: Any) -> torch.Tensor:
    """The tensor viewing a numpy or CuPy array's memory, no copy (DLPack)."""
    return torch.from_dlpack(array)


def ste_weight(weight: torch.Tensor) -> torch.Tensor:
    """beta * W_t in value, the identity in gradient (the float path's weight)."""
    beta = weight.detach().abs().mean()
    beta = torch.where(beta > 0, beta, torch.ones_like(beta))  # all-zero W: as kernels.quant.ternarize
    quantized = (weight.detach() / beta).round().clamp(-1, 1) * beta
    return weight + (quantized - weight).detach()


class TernaryLinearFunction(torch.autograd.Function):
    """y = x (beta W_t)^T for x R x K, latent ``weight`` N x K, through the int8 kernels.

    forward runs hslm_fwd_s8; backward runs hslm_dx_s8 for x's gradient and hslm_dw_s8
    for the weight's (straight through the ternarization).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x if dtype in KERNEL_DTYPES else x.float()
        t, beta = ternarize(to_array(weight))  # t: N x K int8
        packed = pack(t.T)  # pack takes W as K x N
        ctx.save_for_backward(x)
        ctx.packed, ctx.beta, ctx.weight_dtype = packed, beta, weight.dtype
        return to_tensor(ops.forward(to_array(x), packed, beta)).to(dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        (x,) = ctx.saved_tensors
        dy_array = to_array(dy if dy.dtype in KERNEL_DTYPES else dy.float())
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = to_tensor(ops.grad_input(dy_array, ctx.packed, ctx.beta, x.shape[1])).to(dy.dtype)
        if ctx.needs_input_grad[1]:
            dw = to_tensor(ops.grad_weight(to_array(x), dy_array).T).to(ctx.weight_dtype)  # K x N -> N x K
        return dx, dw


class TernaryLinear(torch.nn.Module):
    """A drop-in for ``nn.Linear(in_features, out_features)`` with ternary weights.

    ``weight`` (N x K) holds the latent floats the optimizer updates; every forward
    ternarizes them (absmean beta) and runs the int8 kernels, or float matmuls on the
    same STE weights when ``kernels`` is False. Inputs may have any leading dimensions
    (batch, sequence); they are flattened to rows for the kernels.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, *,
                 kernels: bool = True, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.in_features, self.out_features, self.kernels = in_features, out_features, kernels
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.bias = (torch.nn.Parameter(torch.empty(out_features, device=device, dtype=dtype))
                     if bias else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.Linear's initialization: uniform in +-1/sqrt(in_features)."""
        bound = 1 / math.sqrt(self.in_features)
        torch.nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise LaunchError(f"TernaryLinear: x has shape {tuple(x.shape)}, expected last dimension "
                              f"in_features={self.in_features}; pass (..., {self.in_features})")
        rows = x.reshape(-1, self.in_features)
        if self.kernels:
            y = TernaryLinearFunction.apply(rows, self.weight)
        else:
            y = torch.nn.functional.linear(rows, ste_weight(self.weight))
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, kernels={self.kernels}")
