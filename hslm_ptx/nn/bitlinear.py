"""BitLinear as BitNet defines it: an RMSNorm on the input, then the ternary x int8 product.

Microsoft's "The Era of 1-bit LLMs: Training Tips, Code and FAQ" (Figure 3) writes the
layer as

    x_norm  = RMSNorm(x)
    x_quant = x_norm + (activation_quant(x_norm) - x_norm).detach()
    w_quant = w + (weight_quant(w) - w).detach()
    y       = F.linear(x_quant, w_quant)

and the FAQ removes the block's own pre-norms, since every BitLinear carries one. A plain
swap of ``nn.Linear`` for TernaryLinear has the quantizers but not the norm; ``BitLinear``
is TernaryLinear with the norm: y = TernaryLinear(rms_norm(x) * g), with a learnable gain g
(``rms_norm.weight``, ones at start) and the norm's epsilon (``norm_eps``).

Where the norm runs: here, in f32 on the torch side before the step (torch's
``F.rms_norm`` on x widened to f32, rounded back to x's dtype), so the cpu, emulator and
cuda backends all quantize the same normalized bits and autograd carries the gradient
through the norm. Inside the step's quantization pass (the row pass that finds the absmax
could find the sum of squares in the same sweep) it would save one read and write of x;
that fused form is not written.

The parameter names follow Hugging Face's ``AutoBitLinear(use_rms_norm=True)``
(``weight``, ``bias``, ``rms_norm.weight``), so its state_dict loads strictly.
"""
from __future__ import annotations

from typing import Any

import torch

from hslm_ptx.nn.linear import TernaryLinear

NORM_EPS = 1e-6  # Hugging Face's BitLinear / LlamaRMSNorm default; BitNet b1.58 2B4T's config uses 1e-5


def rms_normalized(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * gain over the last dimension, in f32, in x's dtype."""
    return torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), gain.float(), eps).to(x.dtype)


class BitLinear(TernaryLinear):
    """Figure 3's BitLinear on the int8 step: ``TernaryLinear`` (same arguments) with an
    input RMSNorm of ``in_features`` learnable gains and epsilon ``norm_eps``.

    ``bias`` defaults to False, as Figure 3's layer (``F.linear(x_quant, w_quant)``) has none.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, device: Any = None,
                 dtype: Any = None, *, norm_eps: float = NORM_EPS, **options: Any) -> None:
        super().__init__(in_features, out_features, bias, device, dtype, **options)
        self.rms_norm = torch.nn.RMSNorm(in_features, eps=norm_eps, device=device, dtype=dtype)

    def _name(self) -> str:
        return f"BitLinear({self.in_features}, {self.out_features})"

    def layer_input(self, x: torch.Tensor) -> torch.Tensor:
        """The RMS-normalized input the step quantizes."""
        return rms_normalized(x, self.rms_norm.weight, self.rms_norm.eps)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, norm_eps={self.rms_norm.eps}"
