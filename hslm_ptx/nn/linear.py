"""TernaryLinear: a drop-in for ``torch.nn.Linear`` whose products are ternary x int8.

The layer keeps latent float weights (``nn.Linear``'s parameters: ``weight`` N x K,
``bias`` N, same names, shapes and initialization, so an ``nn.Linear`` state_dict loads
strictly) and ternarizes them as BitNet b1.58 does: beta = mean|W|,
W_t = clip(rint(W / beta), -1, 1). Activations and output gradients are int8 with one
scale per row (forward, dX) or per column (dW). The straight-through estimator passes the
gradient of beta * W_t to the latent W unchanged (as BitNet's ``w + (q(w) - w).detach()``).
Every float operation of the step, and its order, is fixed by hslm_ptx.reference.stepmath, so the
three backends give the same bits:

- ``backend='cpu'`` (the default for CPU tensors): hslm_ptx.nn.cpu_step, the kernels'
  integers through float BLAS (exact: the bound is in that module);
- ``backend='emulator'``: the step's PTX kernels on the CPU PTX emulator (exact, slow);
- ``backend='cuda'`` (the default for CUDA tensors): the PTX kernels on the GPU, launched on
  torch's current stream with memory from torch's allocator and nothing read back, so a
  step can be captured in a CUDA graph.

The step is two ``torch.library`` operators (hslm_ptx.nn.ops), so ``torch.compile(model,
fullgraph=True)`` traces it without a graph break.

dtypes: parameters and inputs may be float32, float16 or bfloat16 (any mix); the step
widens them to f32 exactly, y and dX come out in x's dtype, dW in the weight's, db in the
bias's, each rounded to nearest even. Under autocast, x is first cast to the autocast
dtype (as ``nn.Linear``'s inputs are), so y is in that dtype; the latent weight is read as
it is. float64 is refused (the kernels read 16- and 32-bit floats; ``kernels=False`` runs
it), as are bool, integer and complex inputs (``nn.Linear`` refuses those too).

NaN and inf: a non-finite value in a row of x makes that row's scale non-finite and the
whole row of y NaN (the same holds for dY's rows in dX and its columns in dW, and a
non-finite weight makes y and dX NaN), as ``nn.Linear`` propagates it; nothing is
checked on the host, so no step waits for the device. Finite inputs give inf only where
the exact ternary answer is past the output type's range, and an exact zero sum is +0
on every backend (hslm_ptx.reference.stepmath: the overflow and signed-zero rules).

The weight is prepared (beta and its codes) by every forward, so the next forward after
any change reads the new weight, whoever made the change (a fused optimizer, an edit
through ``weight.data`` or a numpy view); backward reuses its forward's preparation.
``cache_weight=True`` (or setting ``layer.cache_weight``) keeps the preparation across
forwards instead, while the weight's stamp holds: its version, data pointer, view,
dtype and device, and no ``torch.optim`` optimizer has stepped since
(hslm_ptx.nn.ops); ``load_state_dict`` drops it too. An edit through ``weight.data``
or a numpy view is invisible to the stamp: call ``layer.refresh_weight()`` after one.

Double backward is refused. ``TernaryLinear(..., kernels=False)`` is the same layer with
float matmuls on the same STE weights and float activations (the weight's quantization
alone, not BitNet's layer, which also quantizes x: hslm_ptx.nn.bitlinear has that).

``grad`` picks the backward: 'int8' (the default, the step's int8 dX and dW kernels) or
'ste' (hslm_ptx.nn.ste_grad: the references' float-dY straight-through gradients
dX = dY (beta W_t), dW = dY^T x_q, for reproducing a BitNet run).
"""
from __future__ import annotations

from typing import Any

import torch

from hslm_ptx.nn import ste_grad, ops as torch_ops
from hslm_ptx.nn.ops import BACKEND_DEVICE, BACKENDS, STEP_DTYPES


def ste_weight(weight: torch.Tensor) -> torch.Tensor:
    """beta * W_t in value, the identity in gradient (the float reference's weight)."""
    beta = weight.detach().abs().mean()
    beta = torch.where(beta > 0, beta, torch.ones_like(beta))  # all-zero or empty W: beta = 1
    quantized = (weight.detach() / beta).round().clamp(-1, 1) * beta
    return weight + (quantized - weight).detach()


def ternary_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   backend: str | None = None, cache_weight: bool = False) -> torch.Tensor:
    """The layer's function: y = x (beta W_t)^T + bias for x (..., K), ``weight`` N x K.
    ``backend`` None picks 'cpu' or 'cuda' from x's device; ``cache_weight`` reuses the
    weight's kept preparation while its stamp holds (hslm_ptx.nn.ops)."""
    rows = x.flatten(0, -2) if x.dim() > 1 else x[None]  # flatten, not reshape(-1, K): K may be 0
    backend = backend or ("cuda" if x.is_cuda else "cpu")
    keep_for_dw = torch.is_grad_enabled() and weight.requires_grad  # else forward keeps nothing for dW
    y, _, _ = torch_ops.linear(rows, weight, bias, backend, keep_for_dw, cache_weight)
    return y.reshape(*x.shape[:-1], weight.shape[0])


class TernaryLinearFunction:
    """The layer's function as ``TernaryLinearFunction.apply(x, weight, bias=None,
    backend=None)`` (hslm_ptx.nn.linear.ternary_linear), for callers of the functional form."""

    apply = staticmethod(ternary_linear)


def _refresh_after_load(module: "TernaryLinear", incompatible_keys: Any) -> None:
    """load_state_dict's post hook (a module-level function, so a layer still pickles)."""
    module.refresh_weight()


class TernaryLinear(torch.nn.Module):
    """``nn.Linear(in_features, out_features, bias=True, device=None, dtype=None)`` with
    ternary weights and int8 activations.

    ``kernels`` False runs float matmuls on the same STE weights (the weight quantized, x not).
    ``backend``: None (pick 'cpu' or 'cuda' from the input's device), 'cpu', 'emulator' or
    'cuda' (see the module docstring). ``cache_weight`` True keeps the weight's preparation
    across forwards while its stamp holds (see the module docstring; False, the default,
    prepares it in every forward). ``grad``: 'int8' or 'ste' (see the module docstring).
    """

    __constants__ = ["in_features", "out_features"]

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: Any = None,
                 dtype: Any = None, *, kernels: bool = True, backend: str | None = None,
                 cache_weight: bool = False, grad: str = "int8") -> None:
        super().__init__()
        if backend is not None and backend not in BACKENDS:
            raise ValueError(f"TernaryLinear: backend={backend!r}, expected one of {', '.join(BACKENDS)} "
                             "or None (pick from the input's device)")
        ste_grad.check_grad(grad)
        self.in_features, self.out_features = in_features, out_features
        self.kernels, self.backend, self.cache_weight, self.grad = kernels, backend, cache_weight, grad
        factory = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty((out_features, in_features), **factory))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_features, **factory))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()
        self.register_load_state_dict_post_hook(_refresh_after_load)

    def refresh_weight(self) -> None:
        """Drop the kept preparation of the weight, so the next forward prepares it: after
        an edit the cached stamp cannot see (``weight.data``, a numpy view) when
        ``cache_weight`` is on. Without it every forward prepares anyway."""
        torch_ops.forget_prepared_weights(self.weight)

    def reset_parameters(self) -> None:
        """nn.Linear's initialization, the same draws from the same generator."""
        torch.nn.Linear.reset_parameters(self)  # type: ignore[arg-type]

    def _name(self) -> str:
        return f"TernaryLinear({self.in_features}, {self.out_features})"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_floating_point():
            raise TypeError(f"{self._name()}: x is {x.dtype}; expected a float tensor (float32, float16 or "
                            "bfloat16), as nn.Linear does: cast it with x.float()")
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"{self._name()}: x has shape {tuple(x.shape)}, expected last dimension "
                             f"in_features={self.in_features}; pass (..., {self.in_features})")
        x = self.layer_input(x)
        if not self.kernels:
            return torch.nn.functional.linear(x, ste_weight(self.weight), self.bias)
        if x.device.type in BACKEND_DEVICE.values() and torch.is_autocast_enabled(x.device.type):
            x = x.to(torch.get_autocast_dtype(x.device.type))
        backend = self.backend or ("cuda" if x.is_cuda else "cpu")  # meta tensors: shapes only
        for name, tensor in (("x", x), ("weight", self.weight), ("bias", self.bias)):
            if tensor is not None and tensor.dtype not in STEP_DTYPES:
                raise TypeError(f"{self._name()}: {name} is {tensor.dtype}; the int8 step reads float32, "
                                "float16 or bfloat16 (cast the layer with .float() or .bfloat16(), or use "
                                "kernels=False for other float types)")
            if tensor is not None and tensor.device.type not in (BACKEND_DEVICE[backend], "meta"):
                raise ValueError(f"{self._name()}: {name} is on '{tensor.device}', backend '{backend}' "
                                 f"runs on {BACKEND_DEVICE[backend]} tensors; move the layer and its "
                                 "input with .to(device)")
        if self.grad == "ste":
            return ste_grad.ternary_linear_ste(x, self.weight, self.bias, backend)
        return ternary_linear(x, self.weight, self.bias, backend, self.cache_weight)

    def layer_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the layer quantizes: x itself (hslm_ptx.nn.bitlinear.BitLinear normalizes it first)."""
        return x

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, kernels={self.kernels}, backend={self.backend}, "
                f"cache_weight={self.cache_weight}, grad={self.grad}")
