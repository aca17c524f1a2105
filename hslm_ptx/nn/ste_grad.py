"""The references' backward for TernaryLinear: float dY through the straight-through estimator.

BitNet's published BitLinear (Microsoft, "The Era of 1-bit LLMs: Training Tips, Code and
FAQ", Figure 3), torchao's prototype bitnet layer and Hugging Face's AutoBitLinear write
the layer as ``F.linear(x + (q(x) - x).detach(), w + (q(w) - w).detach())``, so autograd
gives, for y = x_q W_q^T with x_q the row-dequantized activation codes (q * s) and W_q =
beta * W_t:

    dX = dY W_q        dW = dY^T x_q        db = the column sums of dY

with dY in float. The layer's default backward ('int8') quantizes dY to int8 first (per
row for dX, per column for dW, and x per column for dW), which is what makes the backward
run on the int8 tensor cores; ``grad='ste'`` keeps the forward on the int8 step and takes
these float products instead, for a user who must reproduce a BitNet run's gradients.

Every value here is what the step's forward used: the weight's preparation is the one the
CPU backend caches (beta is stepmath's ordered sum, the codes its rounding) and x_q is
hslm_ptx.nn.cpu_step's row quantization, which gives stepmath's bits. The products are f32
matmuls (not the exact integer ones of the default), so their summation order is BLAS's.
On a CUDA weight the preparation is made on a host copy (one device-to-host copy per
backward, which the default backward does not need).
"""
from __future__ import annotations

from typing import Any

import torch

from hslm_ptx.nn import cpu_step as layer_cpu, ops as torch_ops

GRADS = ("int8", "ste")


def check_grad(grad: str) -> None:
    """Refuse an unknown ``grad`` in one line."""
    if grad not in GRADS:
        raise ValueError(f"TernaryLinear: grad={grad!r}, expected 'int8' (the int8 step's backward, the "
                         "default) or 'ste' (float dY through the straight-through estimator)")


def dequantized_weight(weight: torch.Tensor) -> torch.Tensor:
    """beta * W_t in f32 on the weight's device, from the CPU backend's preparation: on a CPU
    weight the one its forward just made and kept (the stamp is unchanged since), so the
    weight is prepared once a step."""
    if weight.device.type == "cpu":
        prepared = torch_ops.prepared_weight(weight, "cpu", reuse=True)
    else:
        prepared = layer_cpu.prepare_weight(weight.detach().cpu())
    return prepared.codes.to(device=weight.device, dtype=torch.float32) * prepared.beta


def dequantized_rows(x: torch.Tensor) -> torch.Tensor:
    """x_q = q * s with one scale per row, the forward's codes (hslm_ptx.nn.cpu_step), in f32."""
    x32 = layer_cpu.widened(x.detach())
    s = layer_cpu.scales(x32, 1)
    return layer_cpu.rounded_codes(x32 / s[:, None], layer_cpu.QMAX).mul_(s[:, None])


@torch.library.custom_op("hslm::ste_forward_weight", mutates_args=())
def ste_forward_weight(weight: torch.Tensor) -> torch.Tensor:
    """beta * W_t (f32) as the forward used it, kept for dX (:func:`dequantized_weight`). An
    operator (opaque to ``torch.compile``, like the step's own): the preparation is read
    from the cache on the host."""
    return dequantized_weight(weight)


@ste_forward_weight.register_fake
def _ste_forward_weight_fake(weight: torch.Tensor) -> torch.Tensor:
    return weight.new_empty(weight.shape, dtype=torch.float32)


@torch.library.custom_op("hslm::ste_backward", mutates_args=())
def ste_backward(dy: torch.Tensor, rows: torch.Tensor, wq: torch.Tensor, weight_dtype: torch.dtype,
                 need_dx: bool, need_dw: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(dX = dY wq in x's dtype, dW = dY^T x_q in ``weight_dtype``), an empty tensor for one
    not asked for; ``wq`` is the forward's beta * W_t (empty when dX is not asked for)."""
    dy32 = layer_cpu.widened(dy.detach())
    dx = (dy32 @ wq).to(rows.dtype) if need_dx else rows.new_empty((0,))
    dw = (dy32.T @ dequantized_rows(rows)).to(weight_dtype) if need_dw else rows.new_empty((0,), dtype=weight_dtype)
    return dx, dw


@ste_backward.register_fake
def _ste_backward_fake(dy: torch.Tensor, rows: torch.Tensor, wq: torch.Tensor, weight_dtype: torch.dtype,
                       need_dx: bool, need_dw: bool) -> tuple[torch.Tensor, torch.Tensor]:
    (R, N), K = dy.shape, rows.shape[1]
    return (rows.new_empty((R, K) if need_dx else (0,)),
            rows.new_empty((N, K) if need_dw else (0,), dtype=weight_dtype))


class _FloatStraightThrough(torch.autograd.Function):
    """y from the int8 step, gradients from float dY (the module docstring)."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                backend: str) -> torch.Tensor:
        y, _, _ = torch_ops.linear(rows, weight, bias, backend, False)  # nothing kept: dW reads x_q
        wq = ste_forward_weight(weight) if ctx.needs_input_grad[0] else weight.new_empty((0,), dtype=torch.float32)
        ctx.save_for_backward(rows, wq)
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.weight_dtype = weight.dtype
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, Any, Any, None]:
        rows, wq = ctx.saved_tensors
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        dx, dw = ste_backward(dy, rows, wq, ctx.weight_dtype, need_dx, need_dw)
        db = dy.float().sum(0).to(ctx.bias_dtype) if need_db and ctx.bias_dtype is not None else None
        return dx if need_dx else None, dw if need_dw else None, db, None


def ternary_linear_ste(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       backend: str) -> torch.Tensor:
    """hslm_ptx.nn.linear.ternary_linear with the float straight-through backward."""
    rows = x.flatten(0, -2) if x.dim() > 1 else x[None]
    y = _FloatStraightThrough.apply(rows, weight, bias, backend)
    return y.reshape(*x.shape[:-1], weight.shape[0])
