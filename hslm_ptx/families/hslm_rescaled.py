"""What the rescaled GEMMs share: the three products of a layer step with the rescale fused
into their epilogue, writing the caller's float type straight from the accumulators
(hslm_ptx/families/hslm_fwd_rescaled.py, hslm_dx_rescaled.py, hslm_dw_rescaled.py: families
``hslm_<product>_<out>`` and ``hslm_<product>_splitk_<out>``, out in f32, f16, bf16).

Each is the int32 product of its ``_s8`` module (same operands, same chunk loop, same
tiles) whose epilogue (``epilogue.Rescale``, ``epilogue.RescaledRows``) stages the
tile's int32 sums through the ring, as split-K does, and stores every element as

- forward, Y (R x N):  (f32(acc) * row_scales[r]) * beta (+ bias[j] where has_bias);
- dX, dX (R x K):      (f32(acc) * row_scales[r]) * beta;
- dW, dW (N x K, nn.Linear's weight layout): (f32(acc) * v[j]) * u[i];

rounded to nearest even at every step (``cvt.rn.f32.s32``, ``mul.rn.f32``,
``add.rn.f32``, then ``cvt.rn.f16.f32`` / ``cvt.rn.bf16.f32``; PTX ISA 9.7.3, 9.7.9.21),
which is ``hslm_ptx.reference.stepmath.rescale_rows`` / ``rescale_cols`` followed by
``hslm_ptx.formats.floats.from_f32``: the references below are exactly that, on the exact int32
product of ``hslm_ptx.reference.products``. beta is read on the device (a pointer), never by the
host. The outputs are contiguous (row pitch = the output's width) in the float type.

Split-K. A split's partial sums must not be rescaled one by one (rounding each and adding
would not give the rounding of the sum), so there are two families per product and type:

- ``hslm_<product>_<out>`` never splits: one CTA per output tile walks the whole
  contraction. Its parameters are the int32 kernel's inputs and the rescale's, nothing
  else (callers need no state between launches);
- ``hslm_<product>_splitk_<out>`` splits where the tile rule says it pays and reduces in
  int32 (``epilogue.emit_split_rescale``): every split adds its int32 sums into
  ``partials`` with red.global.add.s32, takes the tile's arrival ticket, and the CTA that
  arrives last reads the sums back, rescales them once and leaves ``partials`` and
  ``tickets`` at 0 for the next launch (no memset launch): exact, and the same bits
  whatever the split or the order of arrival. The caller allocates the two zeroed once
  and keeps them (``split_workspace``); parameters ``ldo`` and ``kspan`` follow, as in the
  int32 kernels. Where one split is cheaper it launches one, with the unsplit epilogue.

The tile rule (``rule.phase_cost``: the cost model's device us of the launch on the H200,
MODEL figures; lower is better; ``registry.choose`` picks the tile; f32, f16 and bf16 score
alike) at the HSLM shapes and the large ones of shapes.yaml, int32 kernel (with its
splits) against each:

    product shape            int32 us  tile     splits   unsplit tile     splits    splitk tile     splits
    fwd     attn_r27           3.18  32x128n16   1         3.18  32x128n16   1         3.18  32x128n16   1
    fwd     ffn_up_r27         3.14  32x128n16   1         3.14  32x128n16   1         3.14  32x128n16   1
    fwd     ffn_down_r27       3.24  32x128n16   6         3.99  32x128n16   1         3.57  32x128n16   6
    fwd     attn_r1782         3.09  32x128n16   1         3.09  32x128n16   1         3.09  32x128n16   1
    fwd     ffn_up_r1782       3.79  32x128      1         3.79  32x128      1         3.79  32x128      1
    fwd     ffn_down_r1782     3.68  32x128n16   1         3.68  32x128n16   1         3.68  32x128n16   1
    fwd     r8192            229.14  128x128     1       229.14  128x128     1       229.14  128x128     1
    dx      attn_r27           3.18  32x128n16   1         3.18  32x128n16   1         3.18  32x128n16   1
    dx      ffn_up_r27         3.24  32x128n16   6         3.98  32x128n16   1         3.57  32x128n16   6
    dx      ffn_down_r27       3.14  32x128n16   1         3.14  32x128n16   1         3.14  32x128n16   1
    dx      attn_r1782         3.09  32x128n16   1         3.09  32x128n16   1         3.09  32x128n16   1
    dx      ffn_up_r1782       3.68  32x128n16   1         3.68  32x128n16   1         3.68  32x128n16   1
    dx      ffn_down_r1782     3.79  32x128      1         3.79  32x128      1         3.79  32x128      1
    dx      r8192            229.14  128x128     1       229.14  128x128     1       229.14  128x128     1
    dw      attn_r27           2.84  16x128n16   1         2.84  16x128n16   1         2.84  16x128n16   1
    dw      ffn_up_r27         2.84  16x128n16   1         2.84  16x128n16   1         2.84  16x128n16   1
    dw      ffn_down_r27       2.83  16x128n16   1         2.83  16x128n16   1         2.83  16x128n16   1
    dw      attn_r1782         3.52  32x128n16   7         5.90  16x128n16   1         3.85  32x128n16   7
    dw      ffn_up_r1782       4.21  64x128      5         5.85  16x128n16   1         4.53  64x128      5
    dw      ffn_down_r1782     4.18  64x128      5         5.67  32x128n16   1         4.49  64x128      5
    dw      r8192            260.11  256x128     1       260.11  256x128     1       260.11  256x128     1
    dw      hslm_big          27.86  256x128     22      107.38  32x128n16   1        27.86  256x128     22

(``tests/test_fused_epilogue.py`` recomputes every row.) So: forward and dX lose little
without a split (0.74-0.75 us at the one shape of each that splits 6 ways: the split
family gets that back to 0.33 us); dW at R >= 1782 needs the split: unsplit it is
1.4-1.7x the int32 kernel at R = 1782 (1.5-2.4 us more) and 3.9x at R = 65536; split, it
is 0.31-0.33 us over it at R = 1782 (the last CTA's two L2 round trips, where the splits are
not also the reds' bound) and level at R = 65536. Against
the int32 kernel plus a separate rescale pass, the fused launches save that pass's
launch (public measurements put any kernel's launch and teardown at about 2 us of
device time on an H100-class GPU) and the int32 tile's round trip through memory.
"""
from __future__ import annotations

import math
import types
from typing import Any, Callable

import numpy as np

from hslm_ptx.formats.floats import from_f32
from hslm_ptx.kernel.pitch import output_pitch
from hslm_ptx.formats.layout import Plain
from hslm_ptx.kernel.spec import BufferSpec, Dims, KernelSpec, family_name
from hslm_ptx.reference.stepmath import rescale_rows
from hslm_ptx.tile import epilogue, geometry, specs

F32 = np.float32


def f32_vector(name: str, length: Callable[[Dims], int]) -> BufferSpec:
    return BufferSpec(name, "float32", Plain(lambda d: (length(d),)))


def scales(rng: np.random.Generator, n: int) -> np.ndarray:
    """n positive f32 scales with random mantissas over 10 binades (absmax / 127 of
    activations), so products round in every way."""
    return (rng.uniform(1.0, 2.0, n) * 2.0 ** rng.integers(-16, -6, n)).astype(F32)


def row_inputs(rng: np.random.Generator, rows: int) -> dict[str, np.ndarray]:
    """Row scales and beta (mean |W| of a layer, well inside (0, 1))."""
    return {"row_scales": scales(rng, rows), "beta": rng.uniform(0.02, 0.5, 1).astype(F32)}


def split_workspace(rows: Callable[[Dims], int], cols: Callable[[Dims], int],
                    tiles: tuple[geometry.Tile, ...]) -> tuple[tuple[BufferSpec, ...], Callable[[Dims], dict]]:
    """The buffers a split family adds, which the caller keeps between launches, zeroed once
    when allocated and left zeroed by every launch (``epilogue.emit_split_rescale``):
    ``partials`` (int32, rows x output_pitch(cols): the int32 output's layout) and
    ``tickets`` (int32, one per output tile of the grid of the family's ``tiles`` that has
    the most, so one size serves every configuration of the family); and their zeroed arrays."""
    def tickets(d: Dims) -> int:
        return max(math.prod(geometry.output_tiles(rows(d), cols(d), tile)) for tile in tiles)

    def shapes(d: Dims) -> dict[str, tuple[int, ...]]:
        return {"partials": (rows(d), output_pitch(cols(d))), "tickets": (tickets(d),)}

    buffers = tuple(BufferSpec(name, "int32", Plain(lambda d, name=name: shapes(d)[name])) for name in ("partials", "tickets"))
    return buffers, lambda d: {name: np.zeros(shape, np.int32) for name, shape in shapes(d).items()}


def workspace_of(split: bool, rows: Callable[[Dims], int], cols: Callable[[Dims], int],
                 tiles: tuple[geometry.Tile, ...]) -> tuple[tuple[BufferSpec, ...], Callable[[Dims], dict], dict[str, str]]:
    """A split family's workspace buffers (on ``tiles``, the family's), their zeroed inputs,
    and the Rescale fields naming them."""
    if not split:
        return (), lambda d: {}, {}
    buffers, zeros = split_workspace(rows, cols, tiles)
    return buffers, zeros, {"partials": "partials", "tickets": "tickets"}


def rescaled_rows(acc: np.ndarray, inputs: dict[str, np.ndarray], dtype: str,
                  bias: np.ndarray | None = None) -> np.ndarray:
    """The forward and dX references' epilogue: (f32(acc) * row_scales[r]) * beta (+ bias[j]),
    rounded to ``dtype``, as :func:`row_rescale`'s kernels compute it."""
    return from_f32(rescale_rows(acc, inputs["row_scales"], inputs["beta"][0], bias), dtype)


def row_rescale(dtype: str, workspace: tuple[BufferSpec, ...], named: dict[str, str],
                bias: BufferSpec | None = None) -> epilogue.Rescale:
    """The forward and dX epilogue: ``row_scales`` (an f32 per row) and ``beta`` (one f32),
    then ``bias`` where the launch sets ``has_bias``, when the family has one; a split
    family's workspace (:func:`workspace_of`) last, in parameter order."""
    biased = {"bias": bias.name, "has_bias": "has_bias"} if bias else {}
    return epilogue.Rescale(
        dtype, buffers=(f32_vector("row_scales", lambda d: d.R), f32_vector("beta", lambda d: 1),
                        *((bias,) if bias else ()), *workspace),
        row_scales="row_scales", beta="beta", **biased, **named)


def row_rescaled_specs(product: str, int32_module: types.ModuleType, split: bool,
                       rescale: epilogue.Rescale, **operands: Any) -> tuple[KernelSpec, ...]:
    """The family ``hslm_<product>[_splitk]_<out>`` (``rescale.dtype``'s short name):
    ``int32_module``'s product (its
    tiles, its main loop's instruction counts) written through ``rescale``; ``operands``
    are the rest of ``specs.ternary_specs``' arguments."""
    return specs.ternary_specs(family_name(product, rescale.dtype, split=split), int32_module.TILES,
                                     loop_family=int32_module.FAMILY, rescale=rescale, **operands)
