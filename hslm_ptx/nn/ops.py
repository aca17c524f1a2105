"""The TernaryLinear step as torch operators: ``hslm::linear`` and ``hslm::linear_backward``.

Both are ``torch.library.custom_op`` operators with fake implementations (shapes and
dtypes only) and registered autograd, so ``torch.compile(fullgraph=True)`` traces a model
of TernaryLinear layers as two opaque operators per layer, with no graph break, and
AOTAutograd builds the backward graph from them. The operators run one of three backends:

- ``cpu`` (CPU tensors): hslm_ptx.nn.cpu_step, the kernels' integers through float BLAS;
- ``emulator`` (CPU tensors): hslm_ptx.step.launches on numpy arrays, the PTX on the emulator;
- ``cuda`` (CUDA tensors): hslm_ptx.step.launches on CuPy views of torch-allocated tensors,
  launching on torch's current stream (so a step can be captured in a CUDA graph).

The prepared weight (beta and the ternary codes or planes) is made by every forward by
default: no counter torch keeps says reliably that a weight changed (fused optimizers,
edits through ``weight.data`` and numpy views leave ``weight._version`` as it was), so
forward reads the weight as it is now. The preparation is kept for that forward's
backward (keyed on the weight's storage, held weakly so the cache never keeps a weight
alive, its view, dtype and backend), which therefore reads the codes its forward used.

A cached weight is the caller's choice (``cache_weight=True``: ``TernaryLinear(...,
cache_weight=True)``): forward then reuses the kept preparation while the weight's stamp
is unchanged: its ``_version`` (in-place edits through autograd, ``load_state_dict``),
its ``data_ptr`` and view (``.to()``, ``weight.data = ...``), and the count of optimizer
steps taken by any ``torch.optim.Optimizer`` (a global step hook, so fused optimizers are
seen). What the stamp cannot see (an edit through ``weight.data`` or a numpy view, a
custom optimizer that is not a ``torch.optim.Optimizer``) needs :func:`forget_prepared_weights`
or ``TernaryLinear.refresh_weight()``. While a CUDA stream is being captured, forward
always prepares (so the graph holds the preparation kernels and a replay after an
optimizer step uses the new weights).
"""
from __future__ import annotations

import functools
import weakref
from typing import Any

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from hslm_ptx.formats.floats import FLOAT_DTYPES
from hslm_ptx.nn import cpu_step as layer_cpu
from hslm_ptx.runtime import runtime_for
from hslm_ptx.step import launches

BACKENDS = ("cpu", "emulator", "cuda")
BACKEND_DEVICE = {"cpu": "cpu", "emulator": "cpu", "cuda": "cuda"}
STEP_DTYPES = tuple(getattr(torch, name) for name in FLOAT_DTYPES)  # torch names its float types as numpy does
_DTYPE_NAMES = {getattr(torch, name): name for name in FLOAT_DTYPES}


@functools.lru_cache(maxsize=None)
def runtime(backend: str) -> Any:
    """The hslm_ptx.step.launches runtime of a backend, made once."""
    return runtime_for(BACKEND_DEVICE[backend], backend)


# ---- tensors <-> the runtime's arrays ----------------------------------------------------

def to_array(backend: str, tensor: torch.Tensor) -> Any:
    """A numpy (emulator) or CuPy (cuda) view of a contiguous tensor, no copy; bf16 as its
    uint16 bit patterns (hslm_ptx.formats.floats: numpy and CuPy have no bfloat16)."""
    tensor = tensor.detach().contiguous()
    if backend == "cuda":
        return runtime(backend).view(tensor, _DTYPE_NAMES.get(tensor.dtype))
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


def to_tensor(backend: str, array: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The tensor over a runtime array, no copy; ``dtype`` bfloat16 reads uint16 bits as bf16."""
    if backend == "cuda":
        return runtime(backend).tensor(array, "bfloat16" if dtype == torch.bfloat16 else str(array.dtype))
    array = np.asarray(array)
    if array.dtype == np.uint16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


# ---- the prepared-weight cache -----------------------------------------------------------

_PREPARED: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
OPTIMIZER_STEPS = {"count": 0}  # steps of any torch.optim.Optimizer (part of every cached stamp)


def _optimizer_stepped(optimizer: Any, args: Any, kwargs: Any) -> None:
    """A global step hook: any optimizer step may have changed any weight, fused ones
    without touching ``_version``, so every kept preparation is stale from now on."""
    OPTIMIZER_STEPS["count"] += 1


register_optimizer_step_post_hook(_optimizer_stepped)


def forget_prepared_weights(weight: torch.Tensor | None = None) -> None:
    """Drop the kept preparations of ``weight`` (every weight's when None): after a change
    the cached stamp cannot see (an edit through ``weight.data`` or a numpy view)."""
    if weight is None:
        _PREPARED.clear()
    else:
        _PREPARED.pop(weight.untyped_storage(), None)


def _capturing(weight: torch.Tensor) -> bool:
    return weight.is_cuda and torch.cuda.is_current_stream_capturing()


def prepared_weight(weight: torch.Tensor, backend: str, reuse: bool) -> Any:
    """The weight's preparation for ``backend``: the kept one when ``reuse`` and its stamp
    is the weight's current stamp, else made now and kept. A weight made under
    ``torch.inference_mode`` has no version counter: it is prepared every time."""
    kept = _kept(weight, backend) if reuse else None
    return kept if kept is not None else _keep(weight, backend, _prepare(weight, backend))


def _slot(weight: torch.Tensor, backend: str) -> tuple[dict | None, tuple, tuple]:
    """(the cache's slots of the weight's storage, the view's key, its stamp); no slots
    for an inference tensor, which has no version counter."""
    try:
        version = weight._version
    except RuntimeError:  # an inference tensor
        return None, (), ()
    view = (weight.storage_offset(), tuple(weight.shape), weight.stride(), weight.dtype, backend)
    stamp = (version, weight.data_ptr(), weight.device, OPTIMIZER_STEPS["count"])
    return _PREPARED.setdefault(weight.untyped_storage(), {}), view, stamp


def _kept(weight: torch.Tensor, backend: str) -> Any:
    """The kept preparation of the weight if its stamp is the current one, or None."""
    slots, view, stamp = _slot(weight, backend)
    entry = None if slots is None else slots.get(view)
    return entry[1] if entry is not None and entry[0] == stamp else None


def _keep(weight: torch.Tensor, backend: str, prepared: Any) -> Any:
    slots, view, stamp = _slot(weight, backend)
    if slots is not None:
        slots[view] = (stamp, prepared)
    return prepared


def _prepare(weight: torch.Tensor, backend: str) -> Any:
    if backend == "cpu":
        return layer_cpu.prepare_weight(weight)
    return launches.prepare_weight(runtime(backend), to_array(backend, weight))


# ---- shapes the operators return -----------------------------------------------------------

def _degenerate(R: int, K: int, N: int) -> bool:
    """A step with an empty dimension: no product to launch (the layer_step kernels take
    non-empty matrices), so every backend computes it with hslm_ptx.nn.cpu_step."""
    return R == 0 or K == 0 or N == 0


def saved_shape(backend: str, R: int, K: int) -> tuple[int, int]:
    """The shape of x's column codes kept for dW: R x K on the CPU backend and for empty
    steps, the GEMM's transposed pitched layout K x pitch(R) from hslm_ptx.step.launches."""
    if backend == "cpu" or _degenerate(R, K, 1):
        return (R, K)
    from hslm_ptx.kernel.pitch import pitch

    return (K, pitch(R))


# ---- the operators -------------------------------------------------------------------------

@torch.library.custom_op("hslm::linear", mutates_args=())
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, backend: str,
           keep_for_dw: bool, cache_weight: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """y = x (beta W_t)^T + bias for x R x K (y in x's dtype), and x's column codes and
    scales kept for dW (empty when ``keep_for_dw`` is False: no weight gradient to come).
    The weight is prepared now unless ``cache_weight`` and its kept stamp is current."""
    R, K = x.shape
    N = weight.shape[0]
    with torch.autocast(x.device.type, enabled=False):  # the step's arithmetic is fixed
        if backend == "cpu" or _degenerate(R, K, N):
            return _cpu_forward(x, weight, bias, keep_for_dw, cache_weight)
        rt, xs = runtime(backend), to_array(backend, x)
        bias_array = None if bias is None else to_array(backend, bias.to(x.dtype))
        prepared = _kept(weight, backend) if cache_weight and not _capturing(weight) else None
        if prepared is None and keep_for_dw:  # a training forward on a weight to prepare: prepare_and_forward
            prepared, y, saved = launches.prepare_and_forward(rt, xs, to_array(backend, weight), bias_array)
            _keep(weight, backend, prepared)
        else:
            prepared = prepared if prepared is not None else prepared_weight(weight, backend, reuse=False)
            y, saved = launches.forward(rt, xs, prepared, bias_array, keep_columns=keep_for_dw)
        if not keep_for_dw:
            return to_tensor(backend, y, x.dtype), *_nothing_kept(x)
        return (to_tensor(backend, y, x.dtype), to_tensor(backend, saved.x_t),
                to_tensor(backend, saved.u))


def _nothing_kept(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty((0, 0), dtype=torch.int8), x.new_empty((0,), dtype=torch.float32)


def _cpu_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, keep_for_dw: bool,
                 cache_weight: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hslm_ptx.nn.cpu_step's forward; for an empty CUDA step, on CPU copies, moved back."""
    device = x.device
    if device.type != "cpu":
        x, weight = x.cpu(), weight.cpu()
        bias = None if bias is None else bias.cpu()
    prepared = (prepared_weight(weight, "cpu", reuse=cache_weight) if device.type == "cpu"
                else layer_cpu.prepare_weight(weight))
    y, saved = layer_cpu.forward(x, prepared, bias, keep_columns=keep_for_dw)
    if saved is None:
        return y.to(device), *_nothing_kept(y.to(device))
    return y.to(device), saved.codes.to(device), saved.scales.to(device)


@linear.register_fake
def _linear_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, backend: str,
                 keep_for_dw: bool, cache_weight: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    R, K = x.shape
    y = x.new_empty((R, weight.shape[0]))
    if not keep_for_dw:
        return y, *_nothing_kept(x)
    return y, x.new_empty(saved_shape(backend, R, K), dtype=torch.int8), x.new_empty((K,), dtype=torch.float32)


@torch.library.custom_op("hslm::linear_backward", mutates_args=())
def linear_backward(dy: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, weight: torch.Tensor,
                    backend: str, need_dx: bool, need_dw: bool,
                    need_db: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx R x K in dy's dtype, dw N x K in the weight's, db f32[N]); an empty tensor for
    each one not asked for."""
    R, N = dy.shape
    K = weight.shape[1]
    with torch.autocast(dy.device.type, enabled=False):
        if backend == "cpu" or _degenerate(R, K, N):
            dx, dw, db = _cpu_backward(dy, codes, scales, weight, need_dx, need_dw, need_db)
        else:
            step, rt = launches, runtime(backend)
            saved = step.SavedActivations(to_array(backend, codes), to_array(backend, scales), R)
            arrays = step.backward(rt, to_array(backend, dy), saved, prepared_weight(weight, backend, reuse=True),
                                   need_dx, need_dw, need_db)
            dx, dw, db = (None if a is None else to_tensor(backend, a, dtype)
                          for a, dtype in zip(arrays, (dy.dtype, weight.dtype, torch.float32)))
    return (dy.new_empty((0,)) if dx is None else dx, dy.new_empty((0,), dtype=weight.dtype) if dw is None else dw,
            dy.new_empty((0,), dtype=torch.float32) if db is None else db)  # outputs may not alias


def _cpu_backward(dy: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, weight: torch.Tensor,
                  need_dx: bool, need_dw: bool, need_db: bool) -> tuple[Any, Any, Any]:
    device = dy.device
    if device.type != "cpu":
        dy, codes, scales, weight = dy.cpu(), codes.cpu(), scales.cpu(), weight.cpu()
    prepared = (prepared_weight(weight, "cpu", reuse=True) if device.type == "cpu" and need_dx
                else layer_cpu.prepare_weight(weight) if need_dx else None)
    dx, dw, db = layer_cpu.backward(dy, layer_cpu.SavedColumns(codes, scales), prepared,
                                    need_dx, need_dw, need_db)
    return tuple(None if g is None else g.to(device) for g in (dx, None if dw is None else dw.to(weight.dtype), db))


@linear_backward.register_fake
def _linear_backward_fake(dy: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, weight: torch.Tensor,
                          backend: str, need_dx: bool, need_dw: bool,
                          need_db: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    R, N = dy.shape
    K = weight.shape[1]
    return (dy.new_empty((R, K) if need_dx else (0,)),
            dy.new_empty((N, K) if need_dw else (0,), dtype=weight.dtype),
            dy.new_empty((N,) if need_db else (0,), dtype=torch.float32))


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    x, weight, bias, backend, keep_for_dw, _ = inputs
    _, codes, scales = output
    ctx.mark_non_differentiable(codes, scales)
    ctx.save_for_backward(codes, scales, weight)
    ctx.backend, ctx.kept_for_dw = backend, keep_for_dw
    ctx.bias_dtype = None if bias is None else bias.dtype


def _backward(ctx: Any, dy: torch.Tensor, _codes: Any, _scales: Any) -> tuple[Any, Any, Any, None, None, None]:
    codes, scales, weight = ctx.saved_tensors
    need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
    if need_dw and not ctx.kept_for_dw:
        raise RuntimeError("hslm::linear: the weight's gradient was asked for, but forward ran with "
                           "keep_for_dw=False and kept nothing for it; pass keep_for_dw=True when the "
                           "weight requires a gradient")
    dx, dw, db = linear_backward(dy, codes, scales, weight, ctx.backend, need_dx, need_dw,
                                 bool(need_db and ctx.bias_dtype is not None))
    return (dx if need_dx else None, dw if need_dw else None,
            db.to(ctx.bias_dtype) if need_db and ctx.bias_dtype is not None else None, None, None, None)


def _refuse_double_backward(ctx: Any, *grads: Any) -> None:
    raise RuntimeError("TernaryLinear: double backward is not supported (the int8 step's gradients are "
                       "straight-through estimates with no derivative of their own); take one backward")


linear.register_autograd(_backward, setup_context=_setup_context)
linear_backward.register_autograd(_refuse_double_backward, setup_context=lambda ctx, inputs, output: None)

