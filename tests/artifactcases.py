"""Stage results written into a tmp artifacts tree with whatever verdicts a test needs,
so ledger, seal and gate logic is tested without emitting or running a kernel (the
``fake_artifacts`` fixture of tests/conftest.py hands one out)."""
from __future__ import annotations

from pathlib import Path

from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.artifacts import write_model
from hslm_ptx.pipeline.core.files import sha256_bytes, write_atomic
from hslm_ptx.pipeline.core.models import EmitResult, Mismatch, PtxasArch, PtxasReport, Shape, VerifyReport
from hslm_ptx.pipeline.stages.sass import Body, SassArch, SassReport

SHAPES = {"smoke": (Shape(name="tiny", R=4, K=16, N=8), Shape(name="tail", R=3, K=17, N=5))}


GPU_NAMES = {"sm_80": "A100", "sm_89": "RTX 4090", "sm_90": "H200"}


class FakeArtifacts:
    """Writes the stage results a run would leave, with whatever verdicts a test needs."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def emit(self, kernel: str, source: str = "src", ptx: str = "// ptx\n") -> EmitResult:
        data = ptx.encode()
        write_atomic(config.ptx_path(kernel), data)
        result = EmitResult(kernel=kernel, entry=kernel, ptx_path=str(config.ptx_path(kernel)),
                            ptx_sha256=sha256_bytes(data), ptx_bytes=len(data), source_sha256=source)
        write_model(config.emit_json(kernel), result)
        return result

    def ptxas(self, emitted: EmitResult, problems: dict[str, list[str]] | None = None,
              archs: tuple[str, ...] = ("sm_80", "sm_90"), errors: dict[str, str] | None = None) -> PtxasReport:
        problems, errors = problems or {}, errors or {}
        report = PtxasReport(
            kernel=emitted.kernel, ptx_sha256=emitted.ptx_sha256, ptxas="ptxas", ptxas_version="12.9",
            max_registers=128, max_shared_bytes=49152,
            archs=[PtxasArch(arch=a, registers=40, spill_stores=0, spill_loads=0, shared_bytes=1024,
                             stack_bytes=0, problems=problems.get(a, [])) for a in archs if a not in errors],
            errors=errors)
        write_model(config.ptxas_json(emitted.kernel), report)
        return report

    def verify(self, emitted: EmitResult, shape_set: str, shape: Shape, mismatches: int = 0,
               error: str | None = None, backend: str = "emulator", ptx_sha256: str | None = None,
               arch: str | None = None) -> VerifyReport:
        gpu = backend == "gpu"
        report = VerifyReport(
            kernel=emitted.kernel, shape_set=shape_set, shape=shape.name, R=shape.R, K=shape.K, N=shape.N,
            backend=backend, device=GPU_NAMES.get(arch, "H200") if gpu else "cpu-emulator",
            driver="12.8" if gpu else None, arch=arch if gpu else None, node=f"node-{arch}" if gpu else "here",
            mismatches=mismatches,
            rows_checked=0 if error else shape.R, max_abs_diff=mismatches, seconds=0.01,
            first_mismatch=Mismatch(row=0, col=0, got=1, want=0) if mismatches else None,
            ptx_sha256=ptx_sha256 or emitted.ptx_sha256, error=error)
        write_model(config.verify_json(emitted.kernel, shape_set, shape.name), report)
        return report

    def sass(self, emitted: EmitResult, instructions: int = 84, lsu: int = 16, archs: tuple[str, ...] = ("sm_80", "sm_90"),
             ptx_sha256: str | None = None) -> SassReport:
        """A SASS report whose fast and tail bodies issue ``instructions`` and ``lsu`` (tail:
        twice as many) per 8 IMMA."""
        def body(scale: int) -> Body:
            n, m = instructions * scale, lsu * scale
            return Body(runs=["0x100-0x400"], instructions=n, nops=0, imma=8, lsu=m, classes={"tensor": 8},
                        per_imma=n / 8, lsu_per_imma=m / 8, guarded_global_loads=scale - 1)

        report = SassReport(kernel=emitted.kernel, ptx_sha256=ptx_sha256 or emitted.ptx_sha256, ptxas_version="12.9",
                            nvdisasm_version="13.0", archs=[SassArch(arch=a, instructions=300, loops=[], steady_loop="0x100",
                                                                     fast=body(1), tail=body(2)) for a in archs])
        write_model(config.sass_json(emitted.kernel), report)
        return report

    def all_pass(self, kernel: str, source: str = "src", ptx: str = "// ptx\n") -> EmitResult:
        emitted = self.emit(kernel, source, ptx)
        self.ptxas(emitted)
        self.sass(emitted)
        self.verified(emitted)
        return emitted

    def verified(self, emitted: EmitResult, backend: str = "emulator", arch: str | None = None) -> None:
        """Every shape of the sealed sets passes on ``backend`` (a GPU of ``arch``)."""
        for shape_set, shapes in SHAPES.items():
            for shape in shapes:
                self.verify(emitted, shape_set, shape, backend=backend, arch=arch)
