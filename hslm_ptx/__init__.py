"""Int8 tensor-core kernels for HSLM's ternary linear layers, and what a trainer calls.

The names below load on first use (PEP 562), so ``import hslm_ptx.emu`` or
``hslm_ptx.kernel.spec`` stays as light as those modules, and the torch layer is only imported
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
    "forward": "hslm_ptx.arrays",  # Y = X (beta W) through the int8 forward kernel
    "grad_input": "hslm_ptx.arrays",  # dX = dY (beta W)^T through the dX kernel
    "grad_weight": "hslm_ptx.arrays",  # dW = X^T dY (K x N) through the dW kernel
    "pack": "hslm_ptx.formats.ternary",  # K x N ternary -> packed uint32 (N, Kp/16)
    "unpack": "hslm_ptx.formats.ternary",
    "packed_shape": "hslm_ptx.formats.ternary",
    "PackError": "hslm_ptx.formats.ternary",
    "ternarize": "hslm_ptx.reference.quant",  # float W -> (ternary, beta = mean|W|)
    "quantize_rows": "hslm_ptx.reference.quant",
    "quantize_cols": "hslm_ptx.reference.quant",
    "LaunchError": "hslm_ptx.validate",
    "TernaryLinear": "hslm_ptx.nn.linear",  # needs torch
    "TernaryLinearFunction": "hslm_ptx.nn.linear",  # needs torch
    "BitLinear": "hslm_ptx.nn.bitlinear",  # TernaryLinear with BitNet's input RMSNorm; needs torch
    "ternarize_model": "hslm_ptx.nn.convert",  # nn.Linear -> TernaryLinear, lm_head kept; needs torch
}
_NEEDS_TORCH = {"TernaryLinear", "TernaryLinearFunction", "BitLinear", "ternarize_model"}

__all__ = [name for name in _HOME
           if name not in _NEEDS_TORCH or importlib.util.find_spec("torch") is not None]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'hslm_ptx' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
