"""Verify every kernel on the GPU from its emitted PTX: no ptxas, no doit.

    python3 tools/gpu_verify.py [SET ...]        (default: smoke tails hslm)

Emits each kernel's PTX, then runs every verify cell (pipeline.verify.verify_cell,
backend gpu: the same inputs, reference and report files as `doit verify
backend=gpu`) and prints one line per cell. A failing cell never stops the others.
Exit 0 when every cell is exact, 1 when any is not, 2 when it cannot start (no GPU,
an unknown set).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from kernels.registry import KERNELS  # noqa: E402
from pipeline.errors import ArtifactError  # noqa: E402
from pipeline.bench_cli import run_cli  # noqa: E402
from pipeline.config import VERIFY_SETS  # noqa: E402
from pipeline.emit import emit  # noqa: E402
from pipeline.shapes import select_sets  # noqa: E402
from pipeline.verify import one_line, resolve_backend, verdict, verify_cell  # noqa: E402


def main(argv: list[str]) -> int:
    backend = resolve_backend("gpu")
    sets = select_sets(tuple(argv) or VERIFY_SETS)
    for spec in KERNELS.values():
        result = emit(spec)
        print(f"emitted {result.ptx_path} sha256 {result.ptx_sha256[:12]}", flush=True)
    failed = total = 0
    for shape_set, shapes in sets.items():
        for shape in shapes:
            for spec in KERNELS.values():
                total += 1
                try:
                    report = verify_cell(spec, shape_set, shape, backend)
                    ok, line = report.passed, verdict(report)
                except (ArtifactError, OSError, ValueError) as exc:  # a cell that could not be judged
                    ok, line = False, f"{spec.name} {shape_set}/{shape.name}: {one_line(exc)}"
                failed += not ok
                print(line if ok else f"FAILED {line}", flush=True)
    print(f"{total} cells on {backend}: {f'{failed} FAILED' if failed else 'all exact'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
