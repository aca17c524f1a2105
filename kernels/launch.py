"""One launch routine for every kernel and every backend.

``fn`` is anything called as CuPy's RawKernel is: ``fn(grid, block, args,
shared_mem=...)``. ``xp`` is the array module the buffers live in (numpy for the
CPU emulator, cupy on a GPU), so verify, bench and the float ops share this code.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from kernels.spec import Dims, KernelSpec


GRID_LIMITS = (2**31 - 1, 65535, 65535)  # CUDA's maximum grid size per axis


class LaunchError(ValueError):
    """A launch was refused before it started (bad input shape, dtype or size)."""


def kernel_args(spec: KernelSpec, dims: Dims, out: Any, inputs: dict[str, Any]) -> list[Any]:
    """Arguments in PTX parameter order: output buffer, input buffers, then u32 scalars.

    An input given in its logical layout where the kernel wants another (rows at a
    16-byte aligned pitch for cp.async, or transposed) is copied into that layout first
    (``kernels.pitch``: one extra pass over the operand)."""
    args: list[Any] = []
    for param in spec.params:
        if param.shape is None:
            value = param.value(dims) if param.value else getattr(dims, param.name)
            args.append(np.dtype(param.dtype).type(value))
            continue
        buf = out if param is spec.output else inputs.get(param.name)
        if buf is None:
            raise LaunchError(f"{spec.name}: input '{param.name}' is missing")
        want = tuple(param.shape(dims))
        if param.logical is not None and tuple(buf.shape) == tuple(param.logical(dims)) \
                and str(buf.dtype) == param.dtype:  # a square buffer counts as logical
            buf = param.prepare(buf, want)
        if tuple(buf.shape) != want or str(buf.dtype) != param.dtype:
            raise LaunchError(
                f"{spec.name}: input '{param.name}' is {buf.dtype}{tuple(buf.shape)}, "
                f"expected {param.dtype}{want} for R={dims.R} K={dims.K} N={dims.N}"
            )
        args.append(buf)
    return args


def launch(spec: KernelSpec, fn: Callable[..., Any], dims: Dims,
           inputs: dict[str, Any], xp: Any = np) -> Any:
    """Run ``spec`` once on ``inputs`` and return its freshly allocated output."""
    if min(dims) < 1:
        raise LaunchError(f"{spec.name}: R, K, N must be >= 1, got {tuple(dims)}")
    if spec.max_rows is not None and dims.R > spec.max_rows:
        raise LaunchError(
            f"{spec.name}: R={dims.R} is over {spec.max_rows}, where int32 accumulation "
            f"could overflow; split the rows (kernels.ops does) and sum the chunks in int64"
        )
    geometry = spec.geometry(dims)
    for axis, size, limit in zip("xyz", geometry.grid, GRID_LIMITS):
        if size > limit:
            raise LaunchError(
                f"{spec.name}: R={dims.R} K={dims.K} N={dims.N} needs grid.{axis}={size}, over "
                f"CUDA's {limit}; split the problem into smaller launches"
            )
    out = xp.zeros(spec.output.shape(dims), dtype=spec.output.dtype)  # split-K adds into it
    fn(geometry.grid, geometry.block, kernel_args(spec, dims, out, inputs),
       shared_mem=geometry.shared_mem)
    return out
