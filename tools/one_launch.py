"""Launch kernels once each on the GPU through CuPy: the program the sanitizers and
Nsight Compute watch.

    python3 tools/one_launch.py KERNEL SHAPE

KERNEL: a kernel name, several joined by commas, or ``all``. SHAPE: a shape name from
shapes.yaml (``attn_r27`` or ``hslm/attn_r27``) or ``RxKxN`` (``27x243x729``). Inputs
are the verify cell's (same seed); each launch goes through kernels.launch.launch, is
synchronized and compared with the reference, one line per kernel. CuPy's memory pool
is switched off, so each buffer is its own allocation and memcheck sees its real end. Exit 0 when every
output is exact, 1 otherwise, 2 on bad arguments or no GPU.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

import numpy as np  # noqa: E402

from kernels import backends  # noqa: E402
from kernels.launch import launch  # noqa: E402
from kernels.registry import KERNELS  # noqa: E402
from kernels.spec import Dims  # noqa: E402
from pipeline.errors import UserError  # noqa: E402
from pipeline.bench_cli import run_cli  # noqa: E402
from pipeline.models import Shape  # noqa: E402
from pipeline.shapes import load_shape_sets  # noqa: E402
from pipeline.verify import one_line, resolve_backend, seed  # noqa: E402

USAGE = "usage: python3 tools/one_launch.py KERNEL|k1,k2|all SHAPE|SET/SHAPE|RxKxN"


def find_shape(text: str) -> Shape:
    """A shape by name (first set that has it, or SET/NAME) or written as RxKxN."""
    literal = re.fullmatch(r"(\d+)x(\d+)x(\d+)", text)
    if literal:
        R, K, N = (int(v) for v in literal.groups())
        return Shape(name=text, R=R, K=K, N=N)
    set_name, _, name = text.rpartition("/")
    for found_set, shapes in load_shape_sets().items():
        if set_name in ("", found_set):
            for shape in shapes:
                if shape.name == name:
                    return shape
    raise UserError(f"shape '{text}': not in shapes.yaml and not RxKxN (e.g. 27x243x729)")


def pick_kernels(text: str) -> list[str]:
    names = list(KERNELS) if text == "all" else text.split(",")
    unknown = [n for n in names if n not in KERNELS]
    if unknown:
        raise UserError(f"kernel '{unknown[0]}': unknown; known: {', '.join(KERNELS)}, or all")
    return names


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(USAGE, file=sys.stderr)
        return 2
    names, shape = pick_kernels(argv[0]), find_shape(argv[1])
    backend = resolve_backend("gpu")
    xp = backends.array_module(backend)
    xp.cuda.set_allocator(None)  # plain cudaMalloc per buffer: the sanitizers see exact bounds
    dims = Dims(shape.R, shape.K, shape.N)
    bad = 0
    for name in names:
        spec = KERNELS[name]
        inputs = spec.make_inputs(dims, np.random.default_rng(seed(name, shape)))
        try:
            fn = backends.load_ptx(backend, spec.emit(), name)
            out = launch(spec, fn, dims, {k: xp.asarray(v) for k, v in inputs.items()}, xp)
            got = backends.to_host(out)
            exact = np.array_equal(got.astype(np.int64), spec.reference(dims, inputs).astype(np.int64))
            line = "exact" if exact else "MISMATCH"
        except Exception as exc:  # the driver's or the launch's error, as one line
            exact, line = False, f"error: {one_line(exc)}"
        bad += not exact
        print(f"{name} {shape.name} R={dims.R} K={dims.K} N={dims.N}: {line}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
