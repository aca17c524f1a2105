"""Emulator and graph speed on this machine: a benchmark that prints figures, not a test.

    python bench/emulator_bench.py            # whole hslm set, every row, all kernels
    python bench/emulator_bench.py --set tails

Prints the wall time of each kernel x shape on the CPU PTX emulator (with the
mismatch count, so a fast wrong run is visible), what the launch issued (warp
instructions per mma, global and shared loads per mma: a deterministic measure of
how much work surrounds each tensor-core op, not a GPU time), and the time of one
no-op ``doit verify`` (everything up to date) in a subprocess.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hslm_ptx.formats.floats import same_values  # noqa: E402
from hslm_ptx.runtime.launch import launch_outputs  # noqa: E402
from hslm_ptx.catalog.registry import KERNELS  # noqa: E402
from hslm_ptx.kernel.spec import Dims  # noqa: E402
from hslm_ptx.emu import Module  # noqa: E402
from hslm_ptx.pipeline.core.cli import OneLineParser, run_cli  # noqa: E402
from hslm_ptx.pipeline.core.errors import UserError  # noqa: E402
from hslm_ptx.pipeline.core.shapes import load_set  # noqa: E402


def mismatches(spec, got: dict, want: dict) -> int:
    """Elements of every output that differ from the reference (floats by bits, NaN == NaN)."""
    bad = 0
    for param in spec.output_params:
        a, b = np.asarray(got[param.name]), np.asarray(want[param.name])
        same = same_values(a, b, param.dtype) if param.is_float else a == b
        bad += int(np.count_nonzero(~same))
    return bad


def emulate_set(shape_set: str) -> float:
    total = 0.0
    print(f"{'kernel':<26} {'shape':<16} {'R':>6} {'K':>5} {'N':>5} {'seconds':>8} {'mismatches':>10}"
          f" {'warp instr':>11} {'instr/mma':>9} {'ld.global/mma':>13} {'ld.shared/mma':>13}")
    for name, spec in KERNELS.items():
        fn = Module(code=spec.emit()).get_function(name)
        for shape in load_set(shape_set):
            dims = Dims(shape.R, shape.K, shape.N)
            inputs = spec.make_inputs(dims, np.random.default_rng(0))
            start = time.perf_counter()
            outs = launch_outputs(spec, fn, dims, inputs)
            seconds = time.perf_counter() - start
            total += seconds
            bad = mismatches(spec, outs, spec.expected(dims, inputs))
            st = fn.stats
            mma = max(1, st.by_opcode.get("mma", 0))
            print(f"{name:<26} {shape.name:<16} {dims.R:>6} {dims.K:>5} {dims.N:>5} {seconds:>8.3f} {bad:>10}"
                  f" {st.warp_instructions:>11} {st.per('mma'):>9.1f}"
                  f" {st.by_opcode.get('ld.global', 0) / mma:>13.1f} {st.by_opcode.get('ld.shared', 0) / mma:>13.1f}")
    print(f"emulator total for '{shape_set}': {total:.2f} s")
    return total


def noop_verify() -> float:
    """Seconds of a ``doit verify`` with everything up to date: one run to bring it up to
    date, then the timed one."""
    for _ in range(2):  # the second run's time is the one printed
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "doit", "verify"], cwd=ROOT, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
            raise UserError(f"`doit verify` exited {done.returncode} ({last}); run it in {ROOT} to see why, "
                            "or pass --skip-doit")
    print(f"no-op `doit verify` (everything up to date): {seconds:.2f} s")
    return seconds


def main(argv: list[str]) -> int:
    parser = OneLineParser(prog="python bench/emulator_bench.py", description=__doc__.splitlines()[0])
    parser.add_argument("--set", default="hslm", help="shape set from shapes.yaml (default hslm)")
    parser.add_argument("--skip-doit", action="store_true",
                        help="only time the emulator (otherwise `doit verify` runs twice in this checkout, "
                             "writing artifacts/ and .doit.db as any doit run does)")
    args = parser.parse_args(argv)
    load_set(args.set)  # an unknown set is refused before the table starts
    emulate_set(args.set)
    if not args.skip_doit:
        noop_verify()
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
