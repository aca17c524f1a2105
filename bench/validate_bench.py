"""What the input checks cost on the CPU: a benchmark that prints figures, not a test.

    python bench/validate_bench.py              # hslm shapes, numpy
    python bench/validate_bench.py --set smoke

Per hslm shape: the packed-W scan every launch of forward and dX runs
(hslm_ptx.formats.ternary.code_problem: one pass over the words), the per-code scan it replaced
(unpacking every code, as hslm_ptx.formats.ternary.codes_of does), packing W, making the planes
the kernels read W in (hslm_ptx/formats/planes.py: what launch does to a packed W), and the float
op's own quantization of the activations it guards (the non-finite check reads the
scales that quantization computes: a few rows' worth of work). Medians of repeated
timings; on a GPU the same checks are a few elementwise kernels and one host sync.
"""
from __future__ import annotations

import sys
import timeit
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hslm_ptx.formats import planes  # noqa: E402
from hslm_ptx.reference.quant import quantize  # noqa: E402
from hslm_ptx.kernel.spec import Dims  # noqa: E402
from hslm_ptx.formats.ternary import code_problem, codes_of, pack  # noqa: E402
from hslm_ptx.pipeline.core.cli import OneLineParser, run_cli  # noqa: E402
from hslm_ptx.pipeline.core.shapes import load_set  # noqa: E402


def median_us(fn, repeat: int = 7) -> float:
    """Median microseconds per call of ``fn`` (each repeat runs it enough to take ~20 ms)."""
    number, _ = timeit.Timer(fn).autorange()
    number = max(1, number // 10)
    return float(np.median(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6)


def main(args: list[str]) -> int:
    parser = OneLineParser(prog="python bench/validate_bench.py", description=__doc__.splitlines()[0])
    parser.add_argument("--set", default="hslm", help="shape set from shapes.yaml (default hslm)")
    shapes = load_set(parser.parse_args(args).set)  # an unknown set is refused before the table starts
    print(f"{'shape':<16} {'R':>5} {'K':>4} {'N':>4} {'words':>6} {'W check us':>10} "
          f"{'per-code us':>11} {'pack us':>8} {'planes us':>9} {'quantize x us':>13} {'check/quantize':>14}")
    for shape in shapes:
        print(row(shape))
    return 0


def row(shape) -> str:
    """One table row: the timings for one shape."""
    rng = np.random.default_rng(0)
    t = rng.integers(-1, 2, size=(shape.K, shape.N), dtype=np.int8)
    w = pack(t)
    x = rng.standard_normal((shape.R, shape.K))
    assert code_problem(w, shape.K) is None
    check = median_us(lambda: code_problem(w, shape.K))
    per_code = median_us(lambda: (codes_of(w) == 3).any())
    packing = median_us(lambda: pack(t))
    want = planes.FRAGMENTS.shape(Dims(shape.R, shape.K, shape.N))
    making_planes = median_us(lambda: planes.FRAGMENTS(w, want))
    quantizing = median_us(lambda: quantize(x, axis=1))
    return (f"{shape.name:<16} {shape.R:>5} {shape.K:>4} {shape.N:>4} {w.size:>6} {check:>10.1f} "
            f"{per_code:>11.1f} {packing:>8.1f} {making_planes:>9.1f} {quantizing:>13.1f} {check / quantizing:>14.2f}")

if __name__ == "__main__":
    sys.exit(run_cli(main))
