"""Convert a model's linear layers to TernaryLinear (or BitLinear), keeping the LM head.

``ternarize_model(model)`` swaps every ``torch.nn.Linear`` (the class itself, not its
subclasses, whose callers may read the weight directly, as ``nn.MultiheadAttention`` does)
for a TernaryLinear that holds the same ``weight`` and ``bias`` Parameter objects, so ties,
``requires_grad`` and an optimizer's references survive and the checkpoint keeps its names.
Modules named in ``skip`` stay as they are; the default ``("lm_head",)`` keeps the output
head in full precision, as BitNet b1.58 does and as Hugging Face's
``modules_to_not_convert=["lm_head"]`` does. A name in ``skip`` matches a module whose
own name or dotted path equals it, and everything below that path.

Hugging Face's packed BitNet format (``transformers.integrations.bitnet.BitLinear``: a
uint8 ``weight`` of out_features / 4 rows holding four 2-bit codes t + 1 per byte, and a
``weight_scale`` with W = t / weight_scale) converts too: :func:`latent_from_packed` gives
a float weight whose ternarization is exactly those codes with beta = 1 / weight_scale.

The epsilon choice. Figure 3 of "The Era of 1-bit LLMs: Training Tips, Code and FAQ"
clamps mean|W| and each row's absmax at 1e-5; the step does not clamp, it only replaces a
scale of exactly 0 by 1 (hslm_ptx.reference.stepmath). The step's rule is kept: without a clamp the
quantization is scale-invariant (W and c W give the same codes for any c > 0, and so do
x and c x), it introduces no constant tied to the units of the weights, and in the
ranges where training runs (mean|W| and the row absmax far above 1e-5; BitLinear's norm
brings every row's absmax near 1 or above) the two rules give the same codes. They
differ only below 1e-5, where Figure 3's clamp turns a tiny weight or row into all-zero
codes and the step keeps its ternary sign pattern.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

from hslm_ptx.nn.bitlinear import BitLinear
from hslm_ptx.nn.linear import TernaryLinear

DEFAULT_SKIP = ("lm_head",)
CODES_PER_BYTE = 4  # Hugging Face's packing: 2 bits per ternary code


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """The int8 ternary codes (4 P x K) of Hugging Face's packed uint8 weight (P x K): byte
    (p, k) holds the codes of rows p + i P, i = 0..3, as t + 1 in bits 2i, 2i + 1."""
    rows = [((packed >> (2 * i)) & 3).to(torch.int8) - 1 for i in range(CODES_PER_BYTE)]
    return torch.cat(rows, dim=0)


def latent_from_packed(packed: torch.Tensor, weight_scale: torch.Tensor,
                       dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A latent float weight whose ternarization is exactly the packed codes t with
    beta = 1 / weight_scale: W = t * beta / f, f the fraction of non-zero codes.

    Why it round-trips: mean|W| = (beta / f) * f = beta, and W / beta = t / f with 1 / f >= 1,
    which rounds and clips to t. (All-zero codes give W = 0: every code 0, as packed.)"""
    codes = unpack_codes(packed).float()
    nonzero = float(codes.count_nonzero()) / max(codes.numel(), 1)
    beta = 1.0 / float(weight_scale.detach().float().reshape(-1)[0])
    magnitude = beta / nonzero if nonzero > 0 else 0.0
    return (codes * magnitude).to(dtype)


def _skipped(path: str, name: str, skip: Iterable[str]) -> bool:
    return any(entry in (name, path) or path.startswith(entry + ".") for entry in skip)


def _is_packed_bitnet(module: torch.nn.Module) -> bool:
    """Hugging Face's packed BitLinear, recognised by its buffers (transformers is optional)."""
    weight = getattr(module, "weight", None)
    return (type(module).__name__ == "BitLinear" and isinstance(weight, torch.Tensor)
            and weight.dtype == torch.uint8 and hasattr(module, "weight_scale"))


def _from_linear(child: torch.nn.Linear, norm: bool, options: dict) -> TernaryLinear:
    kind = BitLinear if norm else TernaryLinear
    layer = kind(child.in_features, child.out_features, child.bias is not None, child.weight.device,
                 child.weight.dtype, **options)
    layer.weight = child.weight  # the same Parameter: ties, requires_grad and optimizers survive
    if child.bias is not None:
        layer.bias = child.bias
    return layer


def _from_packed(child: torch.nn.Module, options: dict) -> TernaryLinear:
    rms_norm = getattr(child, "rms_norm", None)
    dtype = child.weight_scale.dtype
    if rms_norm is None:
        layer = TernaryLinear(child.in_features, child.out_features, child.bias is not None,
                              child.weight.device, dtype, **options)
    else:
        layer = BitLinear(child.in_features, child.out_features, child.bias is not None, child.weight.device,
                          dtype, norm_eps=rms_norm.variance_epsilon, **options)
    with torch.no_grad():
        if rms_norm is not None:
            layer.rms_norm.weight.copy_(rms_norm.weight)
        layer.weight.copy_(latent_from_packed(child.weight, child.weight_scale, dtype))
        if child.bias is not None:
            layer.bias.copy_(child.bias)
    return layer


def ternarize_model(model: torch.nn.Module, skip: Iterable[str] = DEFAULT_SKIP, *, norm: bool = False,
                    **options: Any) -> list[str]:
    """Swap ``model``'s ``nn.Linear`` layers (and Hugging Face packed BitLinear layers) in
    place for TernaryLinear, or for BitLinear (Figure 3's input RMSNorm) with ``norm``
    True; ``options`` go to each layer (``backend=``, ``grad=``, ``kernels=``,
    ``norm_eps=`` with ``norm``). Returns the dotted names of the converted modules."""
    skip = tuple(skip)
    converted: list[str] = []

    def visit(module: torch.nn.Module, prefix: str) -> None:
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if _skipped(path, name, skip):
                continue
            if type(child) is torch.nn.Linear:
                setattr(module, name, _from_linear(child, norm, options))
                converted.append(path)
            elif _is_packed_bitnet(child):
                setattr(module, name, _from_packed(child, options))
                converted.append(path)
            else:
                visit(child, path + ".")

    visit(model, "")
    return converted
