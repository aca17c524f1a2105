"""The layer step's stand-in kernels (tests/test_layer_step.py, tests/test_layer_stage.py):
the step kernels' specs in their published parameter lists and launch geometry, with no
PTX behind them, installed in the registry for one test so the real orchestration
(hslm_ptx.step.launches) runs on the recording runtime whether or not the kernels are
registered yet; and the HSLM layer shapes both modules run the step on.

Here rather than in one of those test modules, so neither imports the other."""
from __future__ import annotations

import functools

import pytest

from hslm_ptx.formats import planes
from hslm_ptx.catalog import registry
from hslm_ptx.step.launches import sum_partials
from hslm_ptx.kernel.pitch import pitch
from hslm_ptx.formats.layout import Plain
from hslm_ptx.kernel.spec import BufferSpec, KernelSpec, Launch, Param, ScalarSpec

SUFFIXES = ("f32", "f16", "bf16")
FLOATS = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
HSLM = {"attn_r27": (27, 243, 243), "ffn_up_r27": (27, 243, 729), "ffn_down_r27": (27, 729, 243),
        "attn_r1782": (1782, 243, 243), "ffn_up_r1782": (1782, 243, 729), "ffn_down_r1782": (1782, 729, 243)}


def _scalar(name: str) -> ScalarSpec:
    return ScalarSpec(name)


def _buffer(name: str, dtype: str, shape) -> BufferSpec:
    return BufferSpec(name, dtype, Plain(shape))


def standin_spec(name: str, params: tuple[Param, ...], geometry, outputs: tuple[str, ...]) -> KernelSpec:
    def never(*args):
        raise AssertionError(f"stand-in {name} has no PTX, inputs or reference")

    return KernelSpec(name=name, emit=never, geometry=geometry, params=params, make_inputs=never,
                      reference=never, outputs=outputs)


def _grid(rows: int, per: int = 128) -> Launch:
    return Launch((max(1, -(-rows // per)), 1, 1), (256, 1, 1), 0)


def standin_specs() -> list[KernelSpec]:
    """The step kernels with the parameter lists and launch geometry they are published
    with; shapes on the Dims the orchestration declares them on."""
    specs = []
    count = lambda d: d.N * d.K  # noqa: E731  (weight_dims: R=1, K, N)
    for dt in SUFFIXES:
        f = FLOATS[dt]
        specs.append(standin_spec(f"hslm_wsum_{dt}", (
            _buffer("partials", "float32", lambda d: (sum_partials(count(d)),)),
            _buffer("w", f, lambda d: (count(d),)), _scalar("count")),
            lambda d: Launch((sum_partials(count(d)), 1, 1), (256, 1, 1), 0), ("partials",)))
        specs.append(standin_spec(f"hslm_wprep_{dt}", (
            _buffer("planes", "uint32", planes.FRAGMENTS.shape), _buffer("planes_t", "uint32", planes.FRAGMENTS_T.shape),
            _buffer("beta", "float32", lambda d: (1,)), _buffer("w", f, lambda d: (d.N, d.K)),
            _buffer("w_partials", "float32", lambda d: (sum_partials(count(d)),)),
            _scalar("N"), _scalar("K")),
            lambda d: _grid(d.N), ("planes", "planes_t", "beta")))
        specs.append(standin_spec(f"hslm_qrows_{dt}", (
            _buffer("codes", "int8", lambda d: (d.R, pitch(d.K))), _buffer("scales", "float32", lambda d: (d.R,)),
            _buffer("x", f, lambda d: (d.R, d.K)), _scalar("R"), _scalar("C"), _scalar("ld")),
            lambda d: _grid(d.R, 8), ("codes", "scales")))
        specs.append(standin_spec(f"hslm_qcols_{dt}", (
            _buffer("codes_t", "int8", lambda d: (d.K, pitch(d.R))), _buffer("scales", "float32", lambda d: (d.K,)),
            _buffer("sums", "float32", lambda d: (d.K,)), _buffer("x", f, lambda d: (d.R, d.K)),
            _scalar("R"), _scalar("C"), _scalar("ldr")),
            lambda d: _grid(d.K, 32), ("codes_t", "scales", "sums")))
        specs.append(standin_spec(f"hslm_quant_{dt}", (
            _buffer("codes", "int8", lambda d: (d.R, pitch(d.K))), _buffer("row_scales", "float32", lambda d: (d.R,)),
            _buffer("codes_t", "int8", lambda d: (d.K, pitch(d.R))), _buffer("col_scales", "float32", lambda d: (d.K,)),
            _buffer("sums", "float32", lambda d: (d.K,)), _buffer("x", f, lambda d: (d.R, d.K)),
            _scalar("R"), _scalar("C"), _scalar("ld"), _scalar("ldr")),
            lambda d: Launch((-(-d.R // 8) + -(-d.K // 32), 1, 1), (256, 1, 1), 0),
            ("codes", "row_scales", "codes_t", "col_scales", "sums")))
        for wdt in SUFFIXES:
            specs.append(standin_spec(f"hslm_grads_{dt}_{wdt}", (  # dX's and dW's products in one grid
                _buffer("dx", f, lambda d: (d.R, d.K)), _buffer("dy", "int8", lambda d: (d.R, pitch(d.N))),
                _buffer("w", "uint32", planes.FRAGMENTS_T.shape), _buffer("row_scales", "float32", lambda d: (d.R,)),
                _buffer("beta", "float32", lambda d: (1,)),
                _buffer("dw", FLOATS[wdt], lambda d: (d.N, d.K)), _buffer("x_t", "int8", lambda d: (d.K, pitch(d.R))),
                _buffer("dy_t", "int8", lambda d: (d.N, pitch(d.R))), _buffer("u", "float32", lambda d: (d.K,)),
                _buffer("v", "float32", lambda d: (d.N,)),
                _scalar("R"), _scalar("K"), _scalar("N"), _scalar("ldy"), _scalar("ldr")),
                lambda d: Launch((-(-d.K // 128) * (-(-d.R // 32) + -(-d.N // 16)), 1, 1), (256, 1, 1), 0),
                ("dx", "dw")))
            specs.append(standin_spec(f"hslm_fwdw_{dt}_{wdt}", (  # forward of a new weight version
                _buffer("y", f, lambda d: (d.R, d.N)), _buffer("x", f, lambda d: (d.R, d.K)),
                _buffer("w", FLOATS[wdt], lambda d: (d.N, d.K)),
                _buffer("w_partials", "float32", lambda d: (sum_partials(d.N * d.K),)),
                _buffer("bias", f, lambda d: (d.N,)),
                _buffer("codes_t", "int8", lambda d: (d.K, pitch(d.R))), _buffer("scales", "float32", lambda d: (d.K,)),
                _buffer("sums", "float32", lambda d: (d.K,)),
                _buffer("planes", "uint32", planes.FRAGMENTS.shape), _buffer("planes_t", "uint32", planes.FRAGMENTS_T.shape),
                _buffer("beta", "float32", lambda d: (1,)),
                _scalar("R"), _scalar("K"), _scalar("N"), _scalar("ldx"), _scalar("has_bias"), _scalar("C"),
                _scalar("ldr")),
                lambda d: Launch((-(-d.N // 128) * -(-d.R // 32) + -(-d.K // 32) + -(-d.N // 64) * -(-d.K // 64), 1, 1),
                                 (256, 1, 1), 0),
                ("y", "codes_t", "scales", "sums", "planes", "planes_t", "beta")))
            specs.append(standin_spec(f"hslm_bwd_{dt}_{wdt}", (  # the whole backward from float dY
                _buffer("dx", f, lambda d: (d.R, d.K)), _buffer("dy", f, lambda d: (d.R, d.N)),
                _buffer("w", "uint32", planes.FRAGMENTS_T.shape), _buffer("beta", "float32", lambda d: (1,)),
                _buffer("dw", FLOATS[wdt], lambda d: (d.N, d.K)), _buffer("x_t", "int8", lambda d: (d.K, pitch(d.R))),
                _buffer("u", "float32", lambda d: (d.K,)), _buffer("db", "float32", lambda d: (d.N,)),
                _scalar("R"), _scalar("K"), _scalar("N"), _scalar("ldy"), _scalar("ldr")),
                lambda d: Launch((-(-d.K // 128) * (-(-d.R // 32) + -(-d.N // 16)) + -(-d.N // 32), 1, 1),
                                 (256, 1, 1), 0),
                ("dx", "dw", "db")))
        specs.append(standin_spec(f"hslm_fwd_{dt}", (
            _buffer("y", f, lambda d: (d.R, d.N)), _buffer("x", "int8", lambda d: (d.R, pitch(d.K))),
            _buffer("w", "uint32", planes.FRAGMENTS.shape), _buffer("row_scales", "float32", lambda d: (d.R,)),
            _buffer("beta", "float32", lambda d: (1,)), _buffer("bias", f, lambda d: (d.N,)),
            _scalar("R"), _scalar("K"), _scalar("N"), _scalar("ldx"), _scalar("has_bias")),
            lambda d: Launch((-(-d.N // 128), -(-d.R // 32), 1), (128, 1, 1), 0), ("y",)))
        specs.append(standin_spec(f"hslm_fwdq_{dt}", (  # forward quantizing its own rows of x
            _buffer("y", f, lambda d: (d.R, d.N)), _buffer("x", f, lambda d: (d.R, d.K)),
            _buffer("w", "uint32", planes.FRAGMENTS.shape), _buffer("beta", "float32", lambda d: (1,)),
            _buffer("bias", f, lambda d: (d.N,)),
            _scalar("R"), _scalar("K"), _scalar("N"), _scalar("ldx"), _scalar("has_bias")),
            lambda d: Launch((-(-d.N // 128), -(-d.R // 32), 1), (128, 1, 1), 0), ("y",)))
        specs.append(standin_spec(f"hslm_fwdx_{dt}", (  # forward quantizing its rows, with x's columns
            _buffer("y", f, lambda d: (d.R, d.N)), _buffer("x", f, lambda d: (d.R, d.K)),
            _buffer("w", "uint32", planes.FRAGMENTS.shape), _buffer("beta", "float32", lambda d: (1,)),
            _buffer("bias", f, lambda d: (d.N,)),
            _buffer("codes_t", "int8", lambda d: (d.K, pitch(d.R))), _buffer("scales", "float32", lambda d: (d.K,)),
            _buffer("sums", "float32", lambda d: (d.K,)),
            _scalar("R"), _scalar("K"), _scalar("N"), _scalar("ldx"), _scalar("has_bias"), _scalar("C"),
            _scalar("ldr")),
            lambda d: Launch((-(-d.N // 128) * -(-d.R // 32) + -(-d.K // 32), 1, 1), (256, 1, 1), 0),
            ("y", "codes_t", "scales", "sums")))
        specs.append(standin_spec(f"hslm_dx_{dt}", (
            _buffer("dx", f, lambda d: (d.R, d.K)), _buffer("dy", "int8", lambda d: (d.R, pitch(d.N))),
            _buffer("w", "uint32", planes.FRAGMENTS_T.shape), _buffer("row_scales", "float32", lambda d: (d.R,)),
            _buffer("beta", "float32", lambda d: (1,)), _scalar("R"), _scalar("K"), _scalar("N"), _scalar("ldy")),
            lambda d: Launch((-(-d.K // 128), -(-d.R // 32), 1), (128, 1, 1), 0), ("dx",)))
        specs.append(standin_spec(f"hslm_dw_{dt}", (
            _buffer("dw", f, lambda d: (d.N, d.K)), _buffer("x_t", "int8", lambda d: (d.K, pitch(d.R))),
            _buffer("dy_t", "int8", lambda d: (d.N, pitch(d.R))), _buffer("u", "float32", lambda d: (d.K,)),
            _buffer("v", "float32", lambda d: (d.N,)), _scalar("R"), _scalar("K"), _scalar("N"), _scalar("ldr")),
            lambda d: Launch((-(-d.K // 128), -(-d.N // 128), 1), (256, 1, 1), 0), ("dw",)))
    return specs


def install_standins(monkeypatch: pytest.MonkeyPatch, specs: list[KernelSpec] | None = None,
                     keep_registered: bool = False) -> None:
    """Put the stand-in specs in the registry for one test (each its own family);
    ``keep_registered``: only for the families the registry lacks (the real kernels run
    wherever they exist)."""
    # picks are kept per shape (registry.choose): this test's registry gets a cache of its own
    monkeypatch.setattr(registry, "_choose", functools.lru_cache(maxsize=None)(registry._choose.__wrapped__))
    if not keep_registered:  # the stand-ins alone: no real split-K family beside them
        for family in [f for f in registry.FAMILIES if "_splitk_" in f]:
            monkeypatch.delitem(registry.FAMILIES, family)
    for spec in specs or standin_specs():
        if keep_registered and spec.family_name in registry.FAMILIES:
            continue
        monkeypatch.setitem(registry.KERNELS, spec.name, spec)
        monkeypatch.setitem(registry.FAMILIES, spec.family_name, (spec,))
