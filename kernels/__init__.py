"""Int8 tensor-core kernels for HSLM's ternary linear layers, and what a trainer calls.

The names below load on first use (PEP 562), so ``import kernels.ptxemu`` or
``kernels.spec`` stays as light as those modules, and the torch layer is only imported
(with torch) when asked for. Nothing here needs ptxas or the nvcc wheel: the float
ops emit their PTX in-process and run it on CuPy (GPU) or the emulator (numpy).

Orientation: W is K x N (Y = X W) for :func:`pack` and :func:`grad_weight` alike;
:class:`TernaryLinear` keeps torch's ``nn.Linear`` layout, ``weight`` N x K.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any

_HOME = {
    "forward": "kernels.array_ops",  # Y = X (beta W) through the int8 forward kernel
    "grad_input": "kernels.array_ops",  # dX = dY (beta W)^T through the dX kernel
    "grad_weight": "kernels.array_ops",  # dW = X^T dY (K x N) through the dW kernel
    "pack": "kernels.ternary",  # K x N ternary -> packed uint32 (N, Kp/16)
    "unpack": "kernels.ternary",
    "packed_shape": "kernels.ternary",
    "PackError": "kernels.ternary",
    "ternarize": "kernels.quant",  # float W -> (ternary, beta = mean|W|)
    "quantize_rows": "kernels.quant",
    "quantize_cols": "kernels.quant",
    "LaunchError": "kernels.validate",
    "TernaryLinear": "kernels.torch_linear",  # needs torch
    "TernaryLinearFunction": "kernels.torch_linear",  # needs torch
    "BitLinear": "kernels.bitlinear",  # TernaryLinear with BitNet's input RMSNorm; needs torch
    "ternarize_model": "kernels.convert",  # nn.Linear -> TernaryLinear, lm_head kept; needs torch
}
_NEEDS_TORCH = {"TernaryLinear", "TernaryLinearFunction", "BitLinear", "ternarize_model"}

__all__ = [name for name in _HOME
           if name not in _NEEDS_TORCH or importlib.util.find_spec("torch") is not None]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
