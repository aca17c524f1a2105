"""All kernels by name, in the order tables and reports list them."""
from __future__ import annotations

from kernels import hslm_dw_s8, hslm_dx_s8, hslm_fwd_s8
from kernels.spec import KernelSpec

KERNELS: dict[str, KernelSpec] = {m.SPEC.name: m.SPEC for m in (hslm_fwd_s8, hslm_dx_s8, hslm_dw_s8)}


def get_kernel(name: str) -> KernelSpec:
    """The kernel called ``name``; an unknown name lists the known ones."""
    try:
        return KERNELS[name]
    except KeyError:
        raise KeyError(f"unknown kernel '{name}'; known: {', '.join(KERNELS)}") from None
