"""One TernaryLinear step as launches of this project's kernels, on any runtime.

A step is weight preparation (once per weight version), forward, and backward (dX, dW and
the bias gradient). Every GPU operation in it is one of the step's PTX kernels:

- ``prepare_and_forward``, the first forward of a weight version (a training step's, by
  default): ``hslm_wsum_<wdt>`` (partial sums of |W|), then ``hslm_fwdw_<dt>_<wdt>``: the
  forward GEMM coding its own columns of W from the floats (beta finished from the partials
  in every CTA), x's column codes for dW, and beta and the planes of W and of W^T for dX
  and a kept weight, in one grid: 2 launches, where the tile rule scores the fused
  forward no higher than the preparation and ``hslm_fwdx`` (:func:`forward_launches`:
  every HSLM shape; at the large ones W's floats read by every CTA along M cost more, and
  it is ``prepare_weight`` then ``forward``: 3);
- ``prepare_weight`` alone (an inference forward on a new version, or a weight prepared
  ahead): ``hslm_wsum_<wdt>``, then ``hslm_wprep_<wdt>`` (beta = mean|W|, both plane
  sets): 2 launches;
- ``forward``: ``hslm_fwdx_<out>``, the fused GEMM quantizing its own rows of x, with x's
  column scales and transposed codes (kept for dW) made in the same grid: 1 launch; with
  no weight gradient to come (inference, a frozen weight) ``hslm_fwdq_<out>``, the GEMM
  alone: 1;
- ``backward`` with dX and dW: ``hslm_bwd_<dt>_<wdt>``, the whole backward from float dY
  (dX's CTAs quantize their rows of dY, dW's their columns, a few more CTAs sum dY's
  columns for the bias gradient; hslm_ptx/families/hslm_bwd.py): 1 launch, where the tile
  rule scores it no higher than the two it replaces (:func:`backward_launches`: every HSLM
  shape in bf16 and f16); else ``hslm_quant_<dt>`` on dY (row and column codes, column
  sums), then ``hslm_grads_<dt>_<wdt>`` (both products of the codes in one grid): 2. With
  dX or dW alone: ``hslm_qrows_<dt>`` or ``hslm_qcols_<dt>``, then ``hslm_dx_<out>`` or
  ``hslm_dw_<wdt>``. So a training step with a new weight version is 3 launches at the
  HSLM shapes; at the large ones the tile rule keeps the preparation and the backward's
  quantization apart (:func:`forward_launches`, :func:`backward_launches`): 5; 2 with a
  kept weight (3).

Each fused GEMM has an unsplit family and a split-K one (``hslm_fwd_splitk_<out>`` ...,
which reduces in int32 into a workspace it leaves zeroed); :func:`pick` runs the split one
only where the tile rule scores it lower (dW at R = 1782, forward or dX at R = 27 when the
contraction is 729 deep), and the runtime keeps its workspace between steps, zeroed once.
The grouped backward holds the split families' bodies, each splitting where its rule says;
a part of one split is passed no workspace (any valid pointer, never read).

Each launch is driven by its kernel's :class:`hslm_ptx.kernel.spec.KernelSpec`: the configuration
from :func:`hslm_ptx.catalog.registry.choose`, the grid, block and shared bytes from
``spec.geometry``, the argument order and every buffer's shape and dtype from
``spec.params``. Outputs are allocated at the shapes the specs declare, by the runtime.
This path is lean on purpose: every buffer is either the caller's input
(checked by metadata only: shape and dtype) or one the step's own kernels wrote, so no
buffer is ever scanned and no value is read back to the host. A non-finite input is not
looked for: the kernels propagate NaN (``hslm_ptx.reference.stepmath``), as ``nn.Linear`` does.

Runtimes (:func:`hslm_ptx.runtime.runtime_for`, hslm_ptx/runtime/) say where arrays live and how a kernel runs:

- ``emulator``: numpy arrays, the PTX on the CPU emulator (``hslm_ptx.emu``);
- ``cuda``: CuPy views of tensors from torch's caching allocator (``torch.empty``), launches
  on ``torch.cuda.current_stream()``, so a step can be captured in a CUDA graph;
- :class:`RecordingRuntime`: fake device buffers (shape and dtype, no data) that record what
  a step launches, synchronizes, copies and allocates; the code above runs on it
  unchanged, which is how ``doit layer`` counts a step.

bf16 buffers are held as their uint16 bit patterns (numpy and CuPy have no bfloat16;
``hslm_ptx.formats.floats``), so a uint16 array is read as bf16 here.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, NamedTuple

import numpy as np

from hslm_ptx.cost import model as cost
from hslm_ptx.tile import grouped, rule
from hslm_ptx.families import hslm_bwd, hslm_fwdw, hslm_grads
from hslm_ptx.catalog import registry
from hslm_ptx.formats.floats import FLOAT_DTYPES, storage_dtype
from hslm_ptx.kernel.pitch import pitch
from hslm_ptx.kernel.spec import BufferSpec, Dims, KernelSpec, family_name
from hslm_ptx.reference.stepmath import SUM_BLOCK
from hslm_ptx.runtime.base import Runtime
from hslm_ptx.validate import LaunchError



class PreparedWeight(NamedTuple):
    """A weight version as the GEMMs read it: beta (f32[1], on the device), the planes of W
    (forward) and of W^T (dX), W's shape (N x K, nn.Linear's) and its float type (dW is
    written in it)."""

    beta: Any
    planes: Any
    planes_t: Any
    N: int
    K: int
    dtype: str = "float32"


class SavedActivations(NamedTuple):
    """What forward keeps for dW: X's codes transposed (K x pitch(R)), its column scales u
    (f32[K]) and the row count."""

    x_t: Any
    u: Any
    R: int


# ---- launching a step kernel ---------------------------------------------------------------

def _same_storage(a: str, b: str) -> bool:
    return storage_dtype(a) == storage_dtype(b)


def pick(families: str | tuple[str, ...], dims: Dims) -> KernelSpec:
    """The kernel to run: each registered family's configuration for ``dims``
    (:func:`hslm_ptx.catalog.registry.choose`), the one the tile rule scores lowest across them, the
    first listed on a tie. A product lists its unsplit family first and its split-K one
    second, so a split (and its kept workspace) is used only where the rule says it pays."""
    families = (families,) if isinstance(families, str) else families
    picks = [registry.choose(family, dims) for family in families if family in registry.FAMILIES]
    if not picks:
        raise LaunchError(f"layer step: unknown kernel family '{families[0]}'; known: {', '.join(registry.FAMILIES)}; "
                          "the step needs it in hslm_ptx/catalog/registry.py")
    return min(picks, key=lambda spec: spec.cost(dims) if spec.cost else -math.inf)  # no rule: no choice to make


def _launch(rt: Runtime, family: str | tuple[str, ...], dims: Dims, given: Mapping[str, Any],
            allocate: Iterable[str] = (), scalars: Mapping[str, int] | None = None,
            unused: Iterable[str] = ()) -> dict[str, Any]:
    """Launch the kernel :func:`pick` takes for ``dims`` and return every buffer argument by
    name.

    ``given``: buffers by parameter name, checked by shape and dtype only (each either the
    caller's input or one a step kernel wrote). ``allocate``: buffers made here by the
    runtime, at the shape and dtype the spec declares. Any other buffer the spec has that
    the kernel does not write is a workspace kept by the runtime (:meth:`Runtime.workspace`).
    ``scalars``: u32 values by name; a scalar not given comes from its spec
    (``ScalarSpec.value``: its rule, or the Dims field). ``unused``: buffers the launch does not touch (a bias when there is
    none), passed but not counted."""
    spec = pick(family, dims)
    if spec.max_rows is not None and dims.R > spec.max_rows:
        raise LaunchError(f"{spec.name}: R={dims.R} rows is over {spec.max_rows}, where its int32 sums could "
                          "overflow; split the batch into steps of at most that many rows")
    scalars, unused, allocate = dict(scalars or {}), set(unused), set(allocate)
    buffers, args, touched = {}, [], []
    written = {p.name for p in spec.output_params}
    for param in spec.params:
        if param.is_scalar:
            value = scalars[param.name] if param.name in scalars else param.value(dims)
            args.append(np.dtype(param.dtype).type(value))
            continue
        want = tuple(param.layout.shape(dims))
        if param.name in allocate:
            buf = rt.empty(want, param.dtype)
        elif param.name in given:
            buf = given[param.name]
            if param.name not in unused:
                buf = _checked(spec, dims, param, buf, want)
        elif param.name not in written:
            buf = rt.workspace((spec.name, param.name, want), want, param.dtype)
        else:
            raise LaunchError(f"{spec.name}: output '{param.name}' was not allocated by the layer step")
        buffers[param.name] = buf
        args.append(buf)
        if param.name not in unused:
            touched.append((param.name, buf, param.name in written))
    rt.run(spec, spec.geometry(dims), args, touched)
    return buffers


def _checked(spec: KernelSpec, dims: Dims, param: BufferSpec, buf: Any, want: tuple[int, ...]) -> Any:
    """``buf`` against the spec's shape and storage dtype (metadata only), seen in the spec's
    shape when it holds the same elements in the same order (W N x K read as N*K: a view)."""
    shape, dtype = tuple(getattr(buf, "shape", ())), str(getattr(buf, "dtype", ""))
    contiguous = getattr(getattr(buf, "flags", None), "c_contiguous", True)  # a FakeBuffer has no strides
    if not contiguous:  # a kernel reads rows from the base pointer: a strided view would be garbage
        raise LaunchError(f"{spec.name}: '{param.name}' is a strided view {dtype}{shape}; pass a C-contiguous "
                          "array (ascontiguousarray, or tensor.contiguous())")
    if _same_storage(dtype, param.dtype):
        if shape == want:
            return buf
        if math.prod(shape) == math.prod(want):
            return buf.reshape(want)
    raise LaunchError(f"{spec.name}: '{param.name}' is {dtype}{shape}, expected {param.dtype}{want} "
                      f"for R={dims.R} K={dims.K} N={dims.N}")


def _float_type(rt: Runtime, op: str, name: str, array: Any) -> str:
    dtype = rt.dtype_of(array)
    if dtype not in FLOAT_DTYPES:
        raise LaunchError(f"{op}: {name} is {dtype}; the layer step reads {', '.join(FLOAT_DTYPES)}")
    return dtype


def _matrix(op: str, name: str, array: Any, axes: str) -> tuple[int, int]:
    shape = tuple(array.shape)
    if len(shape) != 2 or 0 in shape:
        raise LaunchError(f"{op}: {name} has shape {shape}, expected a non-empty 2-D array ({axes})")
    return shape


def quant_dims(rows: int, cols: int) -> Dims:
    """The Dims a quantization kernel is declared on: R = rows, K = N = the columns."""
    return Dims(rows, cols, cols)


def weight_dims(N: int, K: int) -> Dims:
    """The Dims the weight-preparation kernels are declared on (W is N x K)."""
    return Dims(1, K, N)


def sum_partials(count: int) -> int:
    """How many partial sums of |W| the first preparation launch writes (its grid)."""
    return max(1, -(-count // SUM_BLOCK))


# ---- the step ------------------------------------------------------------------------------

def prepare_weight(rt: Runtime, w: Any) -> PreparedWeight:
    """beta and the planes of W and W^T from the latent float W (N x K), in two launches:
    per-block partial sums of |W|, then beta and both planes (every CTA of the second sums
    the partials the same way, so all agree on beta): a weight prepared ahead of its
    forwards. A training forward prepares in its own grid instead (:func:`prepare_and_forward`)."""
    N, K = _matrix("prepare_weight", "w", w, "N x K")
    dt = _float_type(rt, "prepare_weight", "w", w)
    first = _launch(rt, family_name("wsum", dt), weight_dims(N, K), {"w": w}, allocate=("partials",),
                    scalars={"count": N * K})
    return _planes(rt, w, first["partials"])


def _planes(rt: Runtime, w: Any, partials: Any) -> PreparedWeight:
    """The second preparation launch: beta and both plane sets from W and its partial sums."""
    N, K = w.shape
    second = _launch(rt, family_name("wprep", rt.dtype_of(w)), weight_dims(N, K), {"w": w, "w_partials": partials},
                     allocate=("planes", "planes_t", "beta"), scalars={"N": N, "K": K})
    return PreparedWeight(second["beta"], second["planes"], second["planes_t"], N, K, rt.dtype_of(w))


def _product(product: str, dt: str) -> tuple[str, str]:
    """A fused GEMM's families: unsplit first, split-K second (see :func:`pick`)."""
    return (family_name(product, dt), family_name(product, dt, split=True))


def _quantize_rows(rt: Runtime, a: Any, dt: str) -> dict[str, Any]:
    """Row scales and codes of ``a`` (rows x cols) in the GEMMs' pitched layout."""
    rows, cols = a.shape
    return _launch(rt, family_name("qrows", dt), quant_dims(rows, cols), {"x": a}, allocate=("codes", "scales"),
                   scalars={"R": rows, "C": cols, "ld": pitch(cols)})


def _quantize_cols(rt: Runtime, a: Any, dt: str) -> dict[str, Any]:
    """Column scales, transposed codes (cols x pitch(rows)) and column sums of ``a``."""
    rows, cols = a.shape
    return _launch(rt, family_name("qcols", dt), quant_dims(rows, cols), {"x": a},
                   allocate=("codes_t", "scales", "sums"), scalars={"R": rows, "C": cols, "ldr": pitch(rows)})


QUANT_OUTPUTS = ("codes", "row_scales", "codes_t", "col_scales", "sums")  # hslm_quant's, after any partials


def _quant_scalars(rows: int, cols: int) -> dict[str, int]:
    """The sizes and both code pitches of a fused quantization of a rows x cols matrix."""
    return {"R": rows, "C": cols, "ld": pitch(cols), "ldr": pitch(rows)}


def _quantize_both(rt: Runtime, a: Any, dt: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`_quantize_rows` and :func:`_quantize_cols` of ``a`` in one launch
    (``hslm_quant_<dt>``), returned as theirs would be."""
    rows, cols = a.shape
    return _quantized(_launch(rt, family_name("quant", dt), quant_dims(rows, cols), {"x": a}, allocate=QUANT_OUTPUTS,
                              scalars=_quant_scalars(rows, cols)))


def _activations(rt: Runtime, op: str, x: Any, in_features: int) -> tuple[int, int, str]:
    """x's rows, columns and kernel suffix, checked against the weight's in_features."""
    R, K = _matrix(op, "x", x, "R x K")
    if K != in_features:
        raise LaunchError(f"{op}: x has {K} columns, the weight has in_features={in_features}")
    return R, K, _float_type(rt, op, "x", x)


def forward(rt: Runtime, x: Any, prepared: PreparedWeight, bias: Any = None,
            keep_columns: bool = True) -> tuple[Any, SavedActivations | None]:
    """y = x (beta W_t)^T (+ bias) in x's float type, and what dW needs later (None
    without ``keep_columns``: no weight gradient to come): 1 launch, the GEMM that
    quantizes its own rows of x, with x's column quantization in the same grid
    (``hslm_fwdx_<dt>``) or without it (``hslm_fwdq_<dt>``)."""
    R, K, dt = _activations(rt, "forward", x, prepared.K)
    if not keep_columns:
        return _quantizing_product(rt, x, prepared, bias), None
    dims, family = Dims(R, K, prepared.N), family_name("fwdx", dt)
    idle = grouped.idle_workspace(pick(family, dims), dims)  # one split: any valid pointer, never read
    given = {"x": x, "w": prepared.planes, "beta": prepared.beta, "bias": prepared.beta if bias is None else bias,
             **{name: prepared.beta for name in idle}}  # no bias: any valid pointer, never read
    out = _launch(rt, family, dims, given, allocate=("y", "codes_t", "scales", "sums"),
                  scalars={"R": R, "K": K, "N": dims.N, "ldx": K, "has_bias": int(bias is not None), "C": K,
                           "ldr": pitch(R)},
                  unused=(*idle, *(("bias",) if bias is None else ())))
    return out["y"], SavedActivations(out["codes_t"], out["scales"], R)


def _quantizing_product(rt: Runtime, x: Any, prepared: PreparedWeight, bias: Any) -> Any:
    """y from float x in one launch: the forward GEMM quantizing its own rows of x."""
    R, K = x.shape
    dt, N = rt.dtype_of(x), prepared.N
    given = {"x": x, "w": prepared.planes, "beta": prepared.beta,
             "bias": prepared.beta if bias is None else bias}  # no bias: any valid pointer, never read
    return _launch(rt, _product("fwdq", dt), Dims(R, K, N), given, allocate=("y",),
                   scalars={"R": R, "K": K, "N": N, "ldx": K, "has_bias": int(bias is not None)},
                   unused=("bias",) if bias is None else ())["y"]


def prepare_and_forward(rt: Runtime, x: Any, w: Any, bias: Any = None) -> tuple[PreparedWeight, Any, SavedActivations]:
    """The first forward of a weight version (in training, every step's): the partial sums
    of |W| (``hslm_wsum_<wdt>``), then one grid (``hslm_fwdw_<dt>_<wdt>``) holding the
    forward GEMM that codes its own columns of W from the floats and quantizes its own rows
    of x, x's column codes for dW, and the preparation of beta and both plane sets (which
    dX and a kept weight's later forwards read): 2 launches, every output the bits of
    :func:`prepare_weight` then :func:`forward`; where :func:`forward_launches` scores
    the fused forward higher, those two (3 launches)."""
    N, K = _matrix("prepare_and_forward", "w", w, "N x K")
    wdt = _float_type(rt, "prepare_and_forward", "w", w)
    R, _, dt = _activations(rt, "prepare_and_forward", x, K)
    if forward_launches(Dims(R, K, N), dt, wdt) == 2:  # the preparation, then the forward on its planes
        prepared = prepare_weight(rt, w)
        y, saved = forward(rt, x, prepared, bias)
        return prepared, y, saved
    sums = _launch(rt, family_name("wsum", wdt), weight_dims(N, K), {"w": w}, allocate=("partials",),
                   scalars={"count": N * K})
    dims, family = Dims(R, K, N), hslm_fwdw.family(dt, wdt)
    idle = grouped.idle_workspace(pick(family, dims), dims)  # one split: any valid pointer, never read
    given = {"x": x, "w": w, "w_partials": sums["partials"], "bias": sums["partials"] if bias is None else bias,
             **{name: sums["partials"] for name in idle}}  # no bias: any valid pointer, never read
    out = _launch(rt, family, dims, given, allocate=("y", "codes_t", "scales", "sums", "planes", "planes_t", "beta"),
                  scalars={"R": R, "K": K, "N": N, "ldx": K, "has_bias": int(bias is not None), "C": K,
                           "ldr": pitch(R)},
                  unused=(*idle, *(("bias",) if bias is None else ())))
    prepared = PreparedWeight(out["beta"], out["planes"], out["planes_t"], N, K, wdt)
    return prepared, out["y"], SavedActivations(out["codes_t"], out["scales"], R)


def _quantized(out: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A fused quantization's outputs as :func:`_quantize_rows` and :func:`_quantize_cols` name theirs."""
    return ({"codes": out["codes"], "scales": out["row_scales"]},
            {"codes_t": out["codes_t"], "scales": out["col_scales"], "sums": out["sums"]})


def backward(rt: Runtime, dy: Any, saved: SavedActivations, prepared: PreparedWeight,
             need_dx: bool = True, need_dw: bool = True, need_db: bool = False) -> tuple[Any, Any, Any]:
    """(dX in dY's float type, dW N x K in the weight's, db as f32 column sums of dY); each
    None when not asked for. With both products: 1 launch (``hslm_bwd_<dt>_<wdt>``) where
    :func:`backward_launches` says so; else 2: the quantization of dY (rows for dX, columns
    for dW and db: one launch when both are asked), then dX and dW in one launch
    (``hslm_grads_<dt>_<wdt>``), or the one of them asked for."""
    R, N = _matrix("backward", "dy", dy, "R x N")
    if (R, N) != (saved.R, prepared.N):
        raise LaunchError(f"backward: dy has shape {(R, N)}, expected ({saved.R}, {prepared.N}) from forward")
    dtype = _float_type(rt, "backward", "dy", dy)
    dt, K = dtype, prepared.K
    dx = dw = db = None
    need_cols = need_dw or need_db
    dims, wdt = Dims(R, K, N), prepared.dtype
    if need_dx and need_dw and backward_launches(dims, dt, wdt) == 1:  # the whole backward from float dY
        family = hslm_bwd.family(dt, wdt)
        idle = grouped.idle_workspace(pick(family, dims), dims)  # a product of one split: any valid pointer
        given = {"dy": dy, "w": prepared.planes_t, "beta": prepared.beta, "x_t": saved.x_t, "u": saved.u}
        out = _launch(rt, family, dims, given | {name: prepared.beta for name in idle}, allocate=("dx", "dw", "db"),
                      scalars={"R": R, "K": K, "N": N, "ldy": N, "ldr": pitch(R)}, unused=idle)
        return out["dx"], out["dw"], out["db"] if need_db else None
    if need_dx and need_cols:
        rows, cols = _quantize_both(rt, dy, dt)
    elif need_dx:
        rows = _quantize_rows(rt, dy, dt)
    elif need_cols:
        cols = _quantize_cols(rt, dy, dt)
    db = cols["sums"] if need_db else None
    dx_given = {"dy": rows["codes"], "w": prepared.planes_t, "row_scales": rows["scales"],
                "beta": prepared.beta} if need_dx else {}
    dw_given = {"x_t": saved.x_t, "dy_t": cols["codes_t"], "u": saved.u, "v": cols["scales"]} if need_dw else {}
    if need_dx and need_dw:  # both products in one launch
        family = hslm_grads.family(dt, wdt)
        idle = grouped.idle_workspace(pick(family, dims), dims)  # a part of one split: any valid pointer
        out = _launch(rt, family, dims, dx_given | dw_given | {name: rows["scales"] for name in idle},
                      allocate=("dx", "dw"), scalars={"R": R, "K": K, "N": N, "ldy": pitch(N), "ldr": pitch(R)},
                      unused=idle)
        return out["dx"], out["dw"], db
    if need_dx:
        dx = _launch(rt, _product("dx", dt), dims, dx_given, allocate=("dx",),
                     scalars={"R": R, "K": K, "N": N, "ldy": pitch(N)})["dx"]
    if need_dw:
        dw = _launch(rt, _product("dw", wdt), dims, dw_given, allocate=("dw",),
                     scalars={"R": R, "K": K, "N": N, "ldr": pitch(R)})["dw"]
    return dx, dw, db


def forward_launches(dims: Dims, dtype: str, weight_dtype: str) -> int:
    """How many launches a new weight version's forward takes after ``hslm_wsum``: 1
    (``hslm_fwdw``, every CTA coding its W columns from the floats) where the tile rule
    scores it no higher than ``hslm_wprep`` then ``hslm_fwdx``, 2 where it does. The fused
    product's score counts W's floats read by every CTA along M (2 or 4 bytes an element,
    where the planes are a quarter byte), so at the HSLM shapes the launch it saves
    outweighs them and at the large ones (R = 8192: W read 64 times over) the planes win.
    The preparation is scored as a stream of its buffers' bytes, as the quantization is in
    :func:`backward_launches`. MODEL figures both: where they are close the first GPU run
    decides."""
    one = pick(hslm_fwdw.family(dtype, weight_dtype), dims)
    two = pick(family_name("fwdx", dtype), dims)
    if one.cost is None or two.cost is None:  # no rule to weigh them by: the one launch
        return 1
    prep = registry.get_kernel(family_name("wprep", weight_dtype))
    prep_us = cost.stream_phases(rule.rule_device(), prep.buffer_bytes(weight_dims(dims.N, dims.K))).device_us
    return 1 if one.cost(dims) <= two.cost(dims) + prep_us else 2


def backward_launches(dims: Dims, dtype: str, weight_dtype: str) -> int:
    """How many launches the backward with both gradients takes on ``dims``: 1 (``hslm_bwd``,
    every CTA quantizing the dY it stages) where the tile rule scores it no higher than
    ``hslm_quant`` on dY then ``hslm_grads``, 2 where it does. The quantizing products'
    scores count dY's floats read twice by every CTA along the other axis, so at the HSLM
    shapes one launch's fixed cost outweighs the re-reads and at the large ones (K = N =
    4096: dY read 32 times over) the two launches win. The quantization is scored as a
    stream of its buffers' bytes (``hslm_ptx.cost.model.stream_phases``). MODEL figures
    both: where they are close the first GPU run decides."""
    one = pick(hslm_bwd.family(dtype, weight_dtype), dims)
    two = pick(hslm_grads.family(dtype, weight_dtype), dims)
    if one.cost is None or two.cost is None:  # no rule to weigh them by: the one launch
        return 1
    quant = registry.get_kernel(family_name("quant", dtype))
    quant_us = cost.stream_phases(rule.rule_device(), quant.buffer_bytes(quant_dims(dims.R, dims.N))).device_us
    return 1 if one.cost(dims) <= two.cost(dims) + quant_us else 2


def step_bytes_minimum(R: int, K: int, N: int, dtype: str, weight_dtype: str, bias: bool) -> int:
    """The bytes a forward + dX + dW step cannot avoid: x, W, the bias and dY read once; y,
    dX, dW and db written once (each in its own float type)."""
    act, wt = storage_dtype(dtype).itemsize, storage_dtype(weight_dtype).itemsize
    reads = R * K * act + N * K * wt + R * N * act + (N * act if bias else 0)
    writes = R * N * act + R * K * act + N * K * wt + (N * act if bias else 0)
    return reads + writes
