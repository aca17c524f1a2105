"""How fast the emulator runs our kernels: ``python -m hslm_ptx.emu_bench``.

A benchmark, not a test: it prints figures and judges nothing. A fixed list of launches
(:data:`LAUNCHES`: every tile configuration of the int8 families on the hslm shape
ffn_up_r1782, and the 27-row dX launch whose small grid makes it the slowest per
instruction) runs once each on the emulator, and per launch it prints the warp
instructions issued, the lockstep steps, the emulator's CPU seconds
(``time.process_time``, so another process on the machine does not count, though it
still slows the caches), warp instructions per CPU second, the CPU seconds of the numpy
integer reference for the same cell (``KernelSpec.expected``), the ratio of the two, and
whether the launch matched the reference by verify's rule (floats by their bits, any NaN
equal to any NaN: :func:`matches`).
The last lines sum the launches named in :data:`HEADLINE`. ``--repeat N`` keeps each
launch's fastest of N runs; ``--only NAME`` runs the launches of one kernel.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable, NamedTuple

import numpy as np

from hslm_ptx.runtime.launch import launch_outputs
from hslm_ptx.emu.machine import Module
from hslm_ptx.catalog.registry import FAMILIES, get_kernel
from hslm_ptx.kernel.spec import Dims
from hslm_ptx.formats.floats import same_values

SHAPES = {"ffn_up_r1782": Dims(1782, 243, 729), "ffn_down_r27": Dims(27, 729, 243),
          "ffn_down_r1782": Dims(1782, 729, 243)}
FAMILIES_TIMED = ("hslm_fwd_s8", "hslm_dx_s8", "hslm_dw_s8")
LAUNCHES: tuple[tuple[str, str], ...] = tuple(
    (spec.name, "ffn_up_r1782") for family in FAMILIES_TIMED for spec in FAMILIES[family]
) + (("hslm_dx_s8_m32", "ffn_down_r27"),
     # the step's fused grids, whose CTAs take different members: the CTA groups' case
     ("hslm_grads_bf16_bf16", "ffn_down_r1782"), ("hslm_bwd_bf16_bf16", "ffn_down_r1782"))
# the launches the headline figure sums (warp instructions over CPU seconds)
HEADLINE = (("hslm_fwd_s8_m32n16", "ffn_up_r1782"), ("hslm_dw_s8_m64", "ffn_up_r1782"),
            ("hslm_fwd_s8", "ffn_up_r1782"), ("hslm_dx_s8_m32", "ffn_down_r27"))


class Timing(NamedTuple):
    kernel: str
    shape: str
    warp_instructions: int
    steps: int
    emulator_s: float
    reference_s: float
    exact: bool

    @property
    def per_second(self) -> float:
        return self.warp_instructions / self.emulator_s

    @property
    def ratio(self) -> float:
        return self.emulator_s / self.reference_s


def _cpu_seconds(run: Callable[[], Any]) -> tuple[float, Any]:
    start = time.process_time()
    value = run()
    return time.process_time() - start, value


def matches(spec: Any, got: dict[str, Any], want: dict[str, Any]) -> bool:
    """Every output equal to the reference by verify's rule: integers by value, floats by
    their bits with any NaN equal to any NaN (:func:`hslm_ptx.formats.floats.same_values`),
    not ``array_equal``'s, for which a NaN the kernel and the reference both produce is a
    mismatch."""
    def same(param: Any, a: np.ndarray, b: np.ndarray) -> bool:
        if a.shape != b.shape:
            return False
        return bool(same_values(a, b, param.dtype).all()) if param.is_float else bool(np.array_equal(a, b))
    return all(same(p, np.asarray(got[p.name]), np.asarray(want[p.name])) for p in spec.output_params)


def time_launch(kernel: str, shape: str, repeat: int = 1) -> Timing:
    """The fastest of ``repeat`` emulator launches of ``kernel`` on ``shape`` (only the
    launch itself is timed: not the parsing, the inputs or the layout copies), and the
    fastest of as many runs of its numpy reference."""
    spec, dims = get_kernel(kernel), SHAPES[shape]
    fn = Module(code=spec.emit()).get_function(kernel)
    inputs = spec.make_inputs(dims, np.random.default_rng(0))
    emulator_s = reference_s = float("inf")
    exact = True
    for _ in range(repeat):
        seconds = []

        def timed(*args, **kwargs):
            seconds.append(_cpu_seconds(lambda: fn(*args, **kwargs))[0])

        def fresh() -> dict[str, Any]:  # a launch may write its inputs (tickets, workspace)
            return {k: np.copy(v) for k, v in inputs.items()}

        spent, want = _cpu_seconds(lambda: spec.expected(dims, fresh()))
        reference_s = min(reference_s, spent)
        got = launch_outputs(spec, timed, dims, fresh())
        emulator_s = min(emulator_s, seconds[0])
        exact &= matches(spec, got, want)
    stats = fn.stats
    return Timing(kernel, shape, stats.warp_instructions, stats.steps, emulator_s,
                  max(reference_s, 1e-6), exact)


def report(rows: list[Timing]) -> str:
    lines = [f"{'kernel':<20} {'shape':<14} {'warp instr':>11} {'steps':>6} {'emu CPU s':>10} "
             f"{'M instr/s':>10} {'ref CPU s':>10} {'emu/ref':>8}  exact"]
    for r in rows:
        lines.append(f"{r.kernel:<20} {r.shape:<14} {r.warp_instructions:>11,} {r.steps:>6} "
                     f"{r.emulator_s:>10.3f} {r.per_second / 1e6:>10.2f} {r.reference_s:>10.4f} "
                     f"{r.ratio:>8.0f}  {'yes' if r.exact else 'NO'}")
    head = [r for r in rows if (r.kernel, r.shape) in HEADLINE]
    if head:
        instructions = sum(r.warp_instructions for r in head)
        seconds = sum(r.emulator_s for r in head)
        slowest = min(head, key=lambda r: r.per_second)
        lines.append(f"headline ({len(head)} of {len(HEADLINE)} launches): {instructions:,} warp "
                     f"instructions in {seconds:.3f} CPU s = {instructions / seconds / 1e6:.2f}M a "
                     f"second; slowest {slowest.kernel} {slowest.shape} "
                     f"{slowest.per_second / 1e6:.2f}M")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hslm_ptx.emu_bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs per launch (the fastest is kept)")
    parser.add_argument("--only", default=None, help="only the launches of this kernel")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        print(f"error: --repeat: {args.repeat}: give a whole number of runs >= 1", file=sys.stderr)
        return 2
    chosen = [(k, s) for k, s in LAUNCHES if args.only in (None, k)]
    if not chosen:
        print(f"error: --only: {args.only}: not a benchmarked kernel; choose one of "
              f"{', '.join(sorted({k for k, _ in LAUNCHES}))}", file=sys.stderr)
        return 2
    rows = []
    for kernel, shape in chosen:
        rows.append(time_launch(kernel, shape, args.repeat))
        print(report(rows[-1:]).splitlines()[1], file=sys.stderr, flush=True)   # progress
    print(report(rows))
    return 0 if all(r.exact for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
