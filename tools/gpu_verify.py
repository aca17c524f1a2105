"""Verify every kernel on the GPU from its emitted PTX: no ptxas, no doit.

    python3 tools/gpu_verify.py [SET ...]        (default: smoke tails hslm)
    python3 tools/gpu_verify.py --emit-only      (the PTX the bench and one_launch.py load)

Emits each kernel's PTX, then runs every verify cell (pipeline.verify.verify_cell,
backend gpu: the same inputs, reference and report files as `doit verify
backend=gpu`) and prints one line per cell. A failing cell never stops the others:
whatever it raises is that cell's error. After a sticky CUDA error (a kernel fault:
the process's CUDA context is lost and every later call would fail with it) the cells
left run in a fresh process, which carries the count on. Exit 0 when every cell is
exact, 1 when any is not, 2 when it cannot start (no GPU, an unknown set).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from kernels.registry import KERNELS  # noqa: E402
from pipeline.bench_cli import OneLineParser, run_cli  # noqa: E402
from pipeline.bench_device import is_sticky  # noqa: E402
from pipeline.config import VERIFY_SETS  # noqa: E402
from pipeline.emit import emit  # noqa: E402
from pipeline.shapes import select_sets  # noqa: E402
from pipeline.verify import one_line, resolve_backend, verdict, verify_cell  # noqa: E402

MAX_FRESH_PROCESSES = 8  # sticky errors after which the cells left are reported, not run


def parser() -> OneLineParser:
    p = OneLineParser(prog="python3 tools/gpu_verify.py",
                      description="Verify every kernel on the GPU from its emitted PTX (no ptxas, no doit).")
    p.add_argument("sets", nargs="*", metavar="SET", help=f"shape sets (default: {' '.join(VERIFY_SETS)})")
    p.add_argument("--emit-only", action="store_true", help="emit every kernel's PTX and stop")
    # what a fresh process after a sticky error is given: where to carry on, and the count so far
    p.add_argument("--from-cell", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--failed-before", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--fresh", type=int, default=0, help=argparse.SUPPRESS)
    return p


def fresh_process(opts: argparse.Namespace, next_cell: int, failed: int) -> int:
    """Run this script for the cells from ``next_cell`` on in a new process (a new CUDA
    context) and return its exit status: this process's context is lost."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *opts.sets, "--from-cell", str(next_cell),
           "--failed-before", str(failed), "--fresh", str(opts.fresh + 1)]
    sys.stdout.flush()
    return subprocess.run(cmd).returncode


def main(argv: list[str]) -> int:
    opts = parser().parse_args(argv)
    if opts.emit_only:
        for spec in KERNELS.values():
            print(f"emitted {emit(spec).ptx_path}", flush=True)
        return 0
    backend = resolve_backend("gpu")
    sets = select_sets(tuple(opts.sets) or VERIFY_SETS)
    cells = [(spec, shape_set, shape) for shape_set, shapes in sets.items() for shape in shapes
             for spec in KERNELS.values()]
    if opts.from_cell == 0:
        for spec in KERNELS.values():
            result = emit(spec)
            print(f"emitted {result.ptx_path} sha256 {result.ptx_sha256[:12]}", flush=True)
    failed = opts.failed_before
    for index in range(opts.from_cell, len(cells)):
        spec, shape_set, shape = cells[index]
        sticky = False
        if opts.fresh >= MAX_FRESH_PROCESSES:
            ok, line = False, (f"{spec.name} {shape_set}/{shape.name}: not run: the CUDA context was "
                               f"lost {opts.fresh} times, no more fresh processes")
        else:
            try:
                report = verify_cell(spec, shape_set, shape, backend)
                ok, line, sticky = report.passed, verdict(report), is_sticky(report.error)
            except Exception as exc:  # whatever a cell raises is that cell's error
                ok, line, sticky = False, f"{spec.name} {shape_set}/{shape.name}: {one_line(exc)}", is_sticky(exc)
        failed += not ok
        print(line if ok else f"FAILED {line}", flush=True)
        if sticky and index + 1 < len(cells):
            print(f"sticky CUDA error: this process's CUDA context is lost; the {len(cells) - index - 1} "
                  "cells left run in a fresh process", flush=True)
            return fresh_process(opts, index + 1, failed)
    print(f"{len(cells)} cells on {backend}: {f'{failed} FAILED' if failed else 'all exact'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
