"""What the torch tests share: torch itself, and one training step's gradients.

torch is an optional extra. Where it is not installed, importing this module skips the
test module that imports it (``pytest.skip(allow_module_level=True)`` raised during that
module's collection); in CI, which installs ``.[dev]`` and sets CI, a missing torch is an
error instead, so a broken install cannot pass as a skip.
"""
from __future__ import annotations

import os

import pytest

try:
    import torch
except ImportError:  # never a silent skip in CI, where .[dev] installs torch
    if os.environ.get("CI"):
        raise
    pytest.skip("torch is not installed: pip install -e '.[torch]'", allow_module_level=True)


def gradients(model: torch.nn.Module, params: list[torch.nn.Parameter], x: torch.Tensor,
              dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor | None]]:
    """y, x's gradient and each of ``params``' for the loss sum(y * dy), every gradient
    fresh: ``params``' old gradients are cleared and x is a detached copy."""
    for p in params:
        p.grad = None
    x = x.detach().clone().requires_grad_()
    y = model(x)
    y.backward(dy)
    return y.detach(), x.grad, [p.grad for p in params]

