"""One launch routine for every kernel and every backend.

``fn`` is anything called as CuPy's RawKernel is: ``fn(grid, block, args,
shared_mem=...)``. ``xp`` is the array module the buffers live in (numpy for the
CPU emulator, cupy on a GPU), so verify, bench and the float ops share this code.

Every input is checked before anything runs, each refusal one LaunchError line:
shape and dtype per parameter (an unpacked W is told the packed shape it needs),
packed weights scanned once for code 3 and non-zero padding (hslm_ptx.formats.ternary), and
strided inputs (Fortran-ordered, transposed, sliced) copied to C order: a kernel reads
a buffer row-major from its base pointer (CuPy passes only that pointer), so a strided
view would be read as garbage; the copy keeps the caller's meaning. A buffer marked
:class:`hslm_ptx.kernel.pitch.KernelLayout` is already in the kernel's layout: it must be
exactly that (shape, dtype, C order) and is passed on as it is. Every output is
pre-filled with its type's poison (:data:`POISON`: a bit pattern no kernel stores), so
an element the kernel never stores shows as a mismatch even where the exact result is
0. Outputs are allocated here, at the kernel's row pitch, and returned as their logical
rows x width views. Float buffers are numpy/CuPy float32 and float16 arrays, and bf16
as its uint16 bit patterns (hslm_ptx.formats.floats).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from hslm_ptx.kernel.pitch import KernelLayout
from hslm_ptx.kernel.spec import BufferSpec, Dims, KernelSpec
from hslm_ptx.validate import LaunchError, check_dims, module_of

GRID_LIMITS = (2**31 - 1, 65535, 65535)  # CUDA's maximum grid size per axis
OUTPUT_POISON = -0x2A2A2A2B  # 0xD5D5D5D5 in every int32 output before a launch: an unwritten element
# the bit pattern each output type is filled with before a launch, as an unsigned integer
# of the element's width: none is a value a kernel stores (int8 codes stop at +-127, a
# planes word of all code 3 is refused, the float patterns are signalling NaNs where the
# kernels' arithmetic gives the canonical quiet NaN, PTX ISA 9.7.4 / 9.7.9.21)
POISON = {"int32": OUTPUT_POISON & 0xFFFFFFFF, "int8": 0x80, "uint32": 0xFFFFFFFF,
          "float32": 0x7FBADBAD, "float16": 0x7DAD, "bfloat16": 0x7FAD}


def kernel_args(spec: KernelSpec, dims: Dims, out: Any, inputs: dict[str, Any]) -> list[Any]:
    """Arguments in PTX parameter order: output buffers, checked C-ordered inputs, u32 scalars.
    ``out`` is the one output's buffer, or a dict of every output's by name.

    An input is either marked :class:`hslm_ptx.kernel.pitch.KernelLayout`, already in the layout
    the kernel reads (rows at a 16-byte aligned pitch for cp.async, transposed for dW):
    the float ops quantize straight into such buffers, and it is checked, never copied;
    or unmarked, in its logical layout (Xq R x K, dYq R x N, also for dW), and copied
    into the kernel's layout here where that differs (``hslm_ptx.kernel.pitch``: one extra pass,
    R x width bytes read and R x pitch written, and one allocation)."""
    args: list[Any] = []
    outs = out if isinstance(out, dict) else {spec.output.name: out}
    written = {p.name for p in spec.output_params}
    for param in spec.params:
        if param.is_scalar:
            args.append(np.dtype(param.dtype).type(param.value(dims)))
        elif param.name in written:
            if param.name not in outs:
                raise LaunchError(f"{spec.name}: output '{param.name}' is missing")
            _check_output(spec, dims, param, outs[param.name])
            args.append(outs[param.name])
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
    want = tuple(param.layout.logical(dims))
    if _has(buf, param.storage, want):
        return
    raise LaunchError(
        f"{spec.name}: input '{param.name}' is {_described(buf)}, expected {param.dtype}{want} "
        f"for R={dims.R} K={dims.K} N={dims.N}; {param.layout.remedy(param.dtype)}"
    )


def _address(buf: Any) -> int:
    """The first byte's address of a numpy or CuPy array."""
    face = getattr(buf, "__cuda_array_interface__", None) or buf.__array_interface__
    return face["data"][0]


def _check_output(spec: KernelSpec, dims: Dims, param: BufferSpec, buf: Any) -> None:
    """The output is written in the kernel's layout (rows at ``hslm_ptx.kernel.pitch.output_pitch``
    words) with 16-byte vector stores: exactly that shape, C-ordered, 16-byte aligned."""
    want = tuple(param.layout.shape(dims))
    if _has(buf, param.storage, want) and buf.flags.c_contiguous and _address(buf) % 16 == 0:
        if not getattr(buf.flags, "writeable", True):
            raise LaunchError(f"{spec.name}: output '{param.name}' is read-only; let hslm_ptx.runtime.launch.launch allocate it")
        return
    raise LaunchError(
        f"{spec.name}: output '{param.name}' is {_described(buf)}, expected a C-contiguous, 16-byte "
        f"aligned {param.dtype}{want} (rows at the kernel's pitch) for R={dims.R} K={dims.K} N={dims.N}; "
        "let hslm_ptx.runtime.launch.launch allocate it"
    )


def _check_kernel_layout(spec: KernelSpec, dims: Dims, param: BufferSpec, buf: Any) -> None:
    """A buffer marked as in the kernel's layout must be exactly ``param.layout.shape(dims)``,
    C-ordered: it is passed on as it is, so there is nothing to fix it with."""
    want = tuple(param.layout.shape(dims))
    right_shape = _has(buf, param.storage, want)
    if right_shape and buf.flags.c_contiguous:
        return
    got = _described(buf) + (", not C-contiguous" if right_shape else "")
    raise LaunchError(
        f"{spec.name}: input '{param.name}' (marked KernelLayout) is {got}, expected a C-contiguous "
        f"{param.dtype}{want}, the kernel's layout for R={dims.R} K={dims.K} N={dims.N}; allocate it "
        "with hslm_ptx.kernel.pitch.kernel_buffer, or pass the logical layout unmarked"
    )


def _checked_input(spec: KernelSpec, dims: Dims, param: BufferSpec, buf: Any) -> Any:
    """``buf`` checked, C-ordered (a copy only when it was strided) and in the kernel's layout
    (a copy only when it was unmarked and in another layout: ``param.layout.into``). The
    contents are checked in the layout they came in (``param.layout.problem``: packed W's
    codes in the caller's packed buffer before its planes are made, or marked planes as
    they are)."""
    marked = isinstance(buf, KernelLayout)
    if marked:
        buf = buf.array
        _check_kernel_layout(spec, dims, param, buf)
    else:
        _check_layout(spec, dims, param, buf)
        buf = module_of(buf).ascontiguousarray(buf)
    problem = param.layout.problem(buf, dims, in_kernel_layout=marked)
    if problem:
        raise LaunchError(f"{spec.name}: input '{param.name}': {problem}")
    if not marked:
        buf = param.layout.into(buf, dims)
    if _address(buf) % 16:  # rows are read by 16-byte cp.async and vector loads from this address
        if marked:
            raise LaunchError(f"{spec.name}: input '{param.name}' (marked KernelLayout) starts at an address "
                              f"that is not 16-byte aligned (offset {_address(buf) % 16}); allocate it with "
                              "hslm_ptx.kernel.pitch.kernel_buffer, or pass the logical layout unmarked")
        buf = buf.copy()  # a view from inside another array: a fresh allocation is aligned
    return buf


def poisoned(param: BufferSpec, dims: Dims, xp: Any = np) -> Any:
    """A fresh buffer of ``param``'s kernel layout holding its type's :data:`POISON`."""
    bits = xp.full(param.layout.shape(dims), POISON[param.dtype], dtype=f"uint{8 * np.dtype(param.storage).itemsize}")
    return bits.view(param.storage)


def launch(spec: KernelSpec, fn: Callable[..., Any], dims: Dims,
           inputs: dict[str, Any], xp: Any = np) -> Any:
    """Run ``spec`` once on ``inputs`` and return its freshly allocated output, seen in
    its logical shape (a view of the pitched rows the kernel writes, ``hslm_ptx.kernel.pitch``);
    for a kernel with several outputs, a dict of them by name (:func:`launch_outputs`)."""
    outs = launch_outputs(spec, fn, dims, inputs, xp)
    return outs[spec.output.name] if len(outs) == 1 else outs


def launch_outputs(spec: KernelSpec, fn: Callable[..., Any], dims: Dims,
                   inputs: dict[str, Any], xp: Any = np) -> dict[str, Any]:
    """Run ``spec`` once on ``inputs``; every output, freshly allocated and poisoned, by
    name, each seen in its logical shape."""
    check_dims(spec.name, dims)  # whole numbers >= 1, each named when not
    if spec.max_rows is not None and dims.R > spec.max_rows:
        raise LaunchError(
            f"{spec.name}: R={dims.R} is over {spec.max_rows}, where int32 accumulation "
            f"could overflow; split the rows (hslm_ptx.arrays does) and sum the chunks in int64"
        )
    geometry = spec.geometry(dims)
    for axis, size, limit in zip("xyz", geometry.grid, GRID_LIMITS):
        if size > limit:
            raise LaunchError(
                f"{spec.name}: R={dims.R} K={dims.K} N={dims.N} needs grid.{axis}={size}, over "
                f"CUDA's {limit}; split the problem into smaller launches"
            )
    # poisoned, so an element never stored shows; a split-K launch adds into its int32 output, so it starts at 0
    split = geometry.grid[2] > 1
    outs = {p.name: xp.zeros(p.layout.shape(dims), dtype=p.storage) if split and p.dtype == "int32"
            else poisoned(p, dims, xp) for p in spec.output_params}
    fn(geometry.grid, geometry.block, kernel_args(spec, dims, outs, inputs),
       shared_mem=geometry.shared_mem)
    return {p.name: p.layout.view(outs[p.name], dims) for p in spec.output_params}
