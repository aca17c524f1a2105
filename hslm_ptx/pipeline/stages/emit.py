"""emit: run a kernel's Python emitter and pin the PTX it produced by content.

The PTX is rewritten (atomically) on every run; downstream stages depend on its
*content* (hslm_ptx.pipeline.core.checker.ContentChecker), so an edit that emits the same bytes,
e.g. a comment in a kernel module, re-runs emit and nothing after it.
"""
from __future__ import annotations

from hslm_ptx.kernel.spec import KernelSpec
from hslm_ptx.pipeline.core.artifacts import write_model
from hslm_ptx.pipeline.core.files import rel, sha256_bytes, write_atomic
from hslm_ptx.pipeline.core.config import emit_json, ptx_path
from hslm_ptx.pipeline.core.models import EmitResult
from hslm_ptx.pipeline.core.sources import source_sha256


def emit(spec: KernelSpec) -> EmitResult:
    """Write artifacts/ptx/<kernel>.ptx and its EmitResult JSON; returns the result."""
    text = spec.emit()
    if f".entry {spec.name}(" not in text:
        raise ValueError(f"{spec.name}: emitted PTX has no '.entry {spec.name}(' (entry = kernel name)")
    data = text.encode()
    path = ptx_path(spec.name)
    write_atomic(path, data)
    result = EmitResult(
        kernel=spec.name, entry=spec.name, ptx_path=rel(path),
        ptx_sha256=sha256_bytes(data), ptx_bytes=len(data), source_sha256=source_sha256(spec),
    )
    write_model(emit_json(spec.name), result)
    return result
