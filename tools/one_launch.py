"""Launch kernels once each on the GPU through CuPy: the program the sanitizers and
Nsight Compute watch.

    python3 tools/one_launch.py KERNEL SHAPE
    python3 tools/one_launch.py --list KERNEL     (the kernels KERNEL names, one a line)

KERNEL: a kernel name, several joined by commas, or ``all``. SHAPE: a shape name from
shapes.yaml (``attn_r27`` or ``hslm/attn_r27``) or ``RxKxN`` (``27x243x729``). Inputs
are the verify cell's (same seed); each launch goes through hslm_ptx.runtime.launch.launch_outputs,
is synchronized and every output compared with the reference as verify compares it, one
line per kernel. After a sticky CUDA error (a kernel fault) the kernels left run in a
fresh process (a child: the sanitizers and ncu follow it). CuPy's memory pool
is switched off, so each buffer is its own allocation and memcheck sees its real end. Exit 0 when every
output is exact, 1 otherwise, 2 on bad arguments or no GPU. ``--list`` is how many
launches a profiler watching ``all`` should expect (tools/on-device.sh's ncu --launch-count).
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

import numpy as np  # noqa: E402

from hslm_ptx.runtime import backends  # noqa: E402
from hslm_ptx.runtime.launch import launch_outputs  # noqa: E402
from hslm_ptx.catalog.registry import KERNELS  # noqa: E402
from hslm_ptx.kernel.spec import Dims  # noqa: E402
from hslm_ptx.pipeline.core.errors import UserError  # noqa: E402
from hslm_ptx.pipeline.core.cli import OneLineParser, run_cli  # noqa: E402
from hslm_ptx.pipeline.bench.device import is_sticky  # noqa: E402
from hslm_ptx.pipeline.core.models import Shape  # noqa: E402
from hslm_ptx.pipeline.core.shapes import load_shape_sets  # noqa: E402
from hslm_ptx.pipeline.stages.verify import compare_outputs, one_line, resolve_backend, seed  # noqa: E402



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


REPRESENTATIVE = re.compile(r"_f(16|32)(_|$)")  # an f16 or f32 variant of a configuration


def representatives() -> list[str]:
    """Each configuration once: every kernel but the f16 and f32 variants of one whose int32
    or bf16 variant is listed. The variants differ only in the epilogue's converts and the
    element width of the stores, which the emulator verifies cell by cell on every shape;
    the sanitizers, a second look on the device, take one of each."""
    return [name for name in KERNELS if not REPRESENTATIVE.search(name)]


def pick_kernels(text: str) -> list[str]:
    names = (list(KERNELS) if text == "all" else representatives() if text == "representative"
             else text.split(","))
    unknown = [n for n in names if n not in KERNELS]
    if unknown:
        raise UserError(f"kernel '{unknown[0]}': unknown; known: {', '.join(KERNELS)}, all or representative")
    return names


def parser() -> OneLineParser:
    p = OneLineParser(prog="python3 tools/one_launch.py",
                      description="Launch kernels once each on the GPU and check them exactly.")
    p.add_argument("kernels", metavar="KERNEL", help="a kernel name, several joined by commas, all, or representative (each configuration once)")
    p.add_argument("shape", metavar="SHAPE", nargs="?",
                   help="a shapes.yaml name (attn_r27 or hslm/attn_r27) or RxKxN (27x243x729)")
    p.add_argument("--list", action="store_true", help="print the kernels KERNEL names, one a line, and stop")
    return p


def main(argv: list[str]) -> int:
    opts = parser().parse_args(argv)
    names = pick_kernels(opts.kernels)
    if opts.list:
        print("\n".join(names))
        return 0
    if opts.shape is None:
        raise UserError("SHAPE: missing; give a shapes.yaml name or RxKxN (see --help)")
    shape = find_shape(opts.shape)
    backend = resolve_backend("gpu")
    xp = backends.array_module(backend)
    xp.cuda.set_allocator(None)  # plain cudaMalloc per buffer: the sanitizers see exact bounds
    dims = Dims(shape.R, shape.K, shape.N)
    bad = 0
    for index, name in enumerate(names):
        spec = KERNELS[name]
        inputs = spec.make_inputs(dims, np.random.default_rng(seed(name, shape)))
        try:
            fn = backends.load_ptx(backend, spec.emit(), name)
            outs = launch_outputs(spec, fn, dims, {k: xp.asarray(v) for k, v in inputs.items()}, xp)
            got = {output: backends.to_host(value) for output, value in outs.items()}
            counts, _, _ = compare_outputs(spec, got, spec.expected(dims, inputs))
            exact = not any(counts.values())
            line = "exact" if exact else f"MISMATCH ({sum(counts.values())} values)"
        except Exception as exc:  # the driver's or the launch's error, as one line
            exact, line = False, f"error: {one_line(exc)}"
        bad += not exact
        print(f"{name} {shape.name} R={dims.R} K={dims.K} N={dims.N}: {line}", flush=True)
        if is_sticky(line) and index + 1 < len(names):  # this process's CUDA context is lost
            rest = names[index + 1:]
            print(f"sticky CUDA error: the {len(rest)} kernels left run in a fresh process", flush=True)
            status = subprocess.run([sys.executable, str(Path(__file__).resolve()), ",".join(rest),
                                     opts.shape]).returncode
            return 1 if bad or status else 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
