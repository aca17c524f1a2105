"""One launch routine for every kernel and every backend.

``fn`` is anything called as CuPy's RawKernel is: ``fn(grid, block, args,
shared_mem=...)``. ``xp`` is the array module the buffers live in (numpy for the
CPU emulator, cupy on a GPU), so verify, bench and the float ops share this code.

Every input is checked before anything runs, each refusal one LaunchError line:
shape and dtype per parameter (an unpacked W is told the packed shape it needs),
packed weights scanned once for code 3 and non-zero padding (kernels.ternary), and
strided inputs (Fortran-ordered, transposed, sliced) copied to C order: a kernel reads
a buffer row-major from its base pointer (CuPy passes only that pointer), so a strided
view would be read as garbage; the copy keeps the caller's meaning. A buffer marked
:class:`kernels.pitch.KernelLayout` is already in the kernel's layout: it must be
exactly that (shape, dtype, C order) and is passed on as it is. The output is
pre-filled with :data:`OUTPUT_POISON`, so an element the kernel never stores shows as
a mismatch even where the exact result is 0. It is allocated here, at the kernel's row
pitch, and returned as its logical rows x width view.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from kernels.pitch import KernelLayout, logical_view
from kernels.ternary import code_problem
from kernels.spec import BufferSpec, Dims, KernelSpec
from kernels.validate import LaunchError, module_of

GRID_LIMITS = (2**31 - 1, 65535, 65535)  # CUDA's maximum grid size per axis
OUTPUT_POISON = -0x2A2A2A2B  # 0xD5D5D5D5 in every int32 output before a launch: an unwritten element
PACKED_DTYPE = "uint32"  # the only uint32 buffers are packed ternary weights, read in planes (kernels/planes.py)


def kernel_args(spec: KernelSpec, dims: Dims, out: Any, inputs: dict[str, Any]) -> list[Any]:
    """Arguments in PTX parameter order: output buffer, checked C-ordered inputs, u32 scalars.

    An input is either marked :class:`kernels.pitch.KernelLayout`, already in the layout
    the kernel reads (rows at a 16-byte aligned pitch for cp.async, transposed for dW):
    the float ops quantize straight into such buffers, and it is checked, never copied;
    or unmarked, in its logical layout (Xq R x K, dYq R x N, also for dW), and copied
    into the kernel's layout here where that differs (``kernels.pitch``: one extra pass,
    R x width bytes read and R x pitch written, and one allocation)."""
    args: list[Any] = []
    for param in spec.params:
        if param.shape is None:
            value = param.value(dims) if param.value else getattr(dims, param.name)
            args.append(np.dtype(param.dtype).type(value))
        elif param is spec.output:
            _check_output(spec, dims, param, out)
            args.append(out)
        elif param.name not in inputs:
            raise LaunchError(f"{spec.name}: input '{param.name}' is missing")
        else:
            args.append(_checked_input(spec, dims, param, inputs[param.name]))
    return args


def _described(buf: Any) -> str:
    """dtype and shape as a message shows them, e.g. ``int8(9, 40)``."""
    return f"{getattr(buf, 'dtype', type(buf).__name__)}{tuple(getattr(buf, 'shape', ()))}"


def _has(buf: Any, dtype: str, shape: tuple[int, ...]) -> bool:
    """Whether ``buf`` is an array of exactly this dtype and shape."""
    return tuple(getattr(buf, "shape", ())) == shape and str(getattr(buf, "dtype", "")) == dtype


def _check_layout(spec: KernelSpec, dims: Dims, param: BufferSpec, buf: Any) -> None:
    """Shape and dtype against the spec's caller-facing (logical) layout, with what to do
    when they differ."""
    want = tuple((param.logical or param.shape)(dims))
    if _has(buf, param.dtype, want):
        return
    if param.dtype == PACKED_DTYPE:
        fix = "pack the K x N ternary matrix with kernels.ternary.pack(w)"
    else:
        fix = f"pass a {param.dtype} array of that shape (kernels.ops quantizes float inputs)"
    raise LaunchError(
        f"{spec.name}: input '{param.name}' is {_described(buf)}, expected {param.dtype}{want} "
        f"for R={dims.R} K={dims.K} N={dims.N}; {fix}"
    )


def _address(buf: Any) -> int:
    """The first byte's address of a numpy or CuPy array."""
    face = getattr(buf, "__cuda_array_interface__", None) or buf.__array_interface__
    return face["data"][0]


def _check_output(spec: KernelSpec, dims: Dims, param: BufferSpec, buf: Any) -> None:
    """The output is written in the kernel's layout (rows at ``kernels.pitch.output_pitch``
    words) with 16-byte vector stores: exactly that shape, C-ordered, 16-byte aligned."""
    want = tuple(param.shape(dims))
    if _has(buf, param.dtype, want) and buf.flags.c_contiguous and _address(buf) % 16 == 0:
        return
    raise LaunchError(
        f"{spec.name}: output '{param.name}' is {_described(buf)}, expected a C-contiguous, 16-byte "
        f"aligned {param.dtype}{want} (rows at the kernel's pitch) for R={dims.R} K={dims.K} N={dims.N}; "
        "let kernels.launch.launch allocate it"
    )


def _check_kernel_layout(spec: KernelSpec, dims: Dims, param: BufferSpec, buf: Any) -> None:
    """A buffer marked as in the kernel's layout must be exactly ``param.shape(dims)``, C-ordered:
    it is passed on as it is, so there is nothing to fix it with."""
    want = tuple(param.shape(dims))
    right_shape = _has(buf, param.dtype, want)
    if right_shape and buf.flags.c_contiguous:
        return
    got = _described(buf) + (", not C-contiguous" if right_shape else "")
    raise LaunchError(
        f"{spec.name}: input '{param.name}' (marked KernelLayout) is {got}, expected a C-contiguous "
        f"{param.dtype}{want}, the kernel's layout for R={dims.R} K={dims.K} N={dims.N}; allocate it "
        "with kernels.pitch.kernel_buffer, or pass the logical layout unmarked"
    )


def _checked_input(spec: KernelSpec, dims: Dims, param: BufferSpec, buf: Any) -> Any:
    """``buf`` checked, C-ordered (a copy only when it was strided) and in the kernel's layout
    (a copy only when it was unmarked and in another layout). Packed W is scanned in the
    layout it came in: the caller's packed buffer before its planes are made, or marked
    planes as they are."""
    marked = isinstance(buf, KernelLayout)
    if marked:
        buf = buf.array
        _check_kernel_layout(spec, dims, param, buf)
    else:
        _check_layout(spec, dims, param, buf)
        buf = module_of(buf).ascontiguousarray(buf)
    if param.dtype == PACKED_DTYPE:
        problem = param.prepare.problem(buf, dims.K, dims.N) if marked else code_problem(buf, dims.K)
        if problem:
            raise LaunchError(f"{spec.name}: input '{param.name}': {problem}")
    if not marked and param.prepare is not None:
        buf = param.prepare(buf, tuple(param.shape(dims)))
    return buf


def launch(spec: KernelSpec, fn: Callable[..., Any], dims: Dims,
           inputs: dict[str, Any], xp: Any = np) -> Any:
    """Run ``spec`` once on ``inputs`` and return its freshly allocated output, seen in
    its logical shape (a view of the pitched rows the kernel writes, ``kernels.pitch``)."""
    if min(dims) < 1:
        raise LaunchError(f"{spec.name}: R, K, N must be >= 1, got {tuple(dims)}; an empty problem has nothing to compute: skip the launch")
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
    # poisoned, so an element never stored shows; a split-K launch adds into its output, so it starts at 0
    fill = 0 if geometry.grid[2] > 1 else OUTPUT_POISON
    out = xp.full(spec.output.shape(dims), fill, dtype=spec.output.dtype)
    fn(geometry.grid, geometry.block, kernel_args(spec, dims, out, inputs),
       shared_mem=geometry.shared_mem)
    return logical_view(spec.output, out, dims)
