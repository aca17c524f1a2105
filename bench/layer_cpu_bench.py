"""TernaryLinear's CPU step against nn.Linear float32: a benchmark that prints figures, not a test.

    python bench/layer_cpu_bench.py                       # batch 64, 243 -> 729
    python bench/layer_cpu_bench.py --rows 1782 --repeats 400 --threads 1

One forward + backward (y, dX, dW, db) of ``TernaryLinear(K, N)`` on the 'cpu' backend
(hslm_ptx.nn.cpu_step: the kernels' integers through float BLAS) and of ``nn.Linear(K, N)``
float32, with the same weights, input and output gradient; the two are timed
alternately in one run (so both see the same machine load). Each step first changes the
weight in place, as the optimizer would, so TernaryLinear's timing includes preparing
the weight (beta and its ternary codes), which a trainer pays once per step. Prints each
one's median over the repeats, the ratio of the medians, and (``--profile``) torch's
profiler table of TernaryLinear's operators over 20 steps.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hslm_ptx.pipeline.core.cli import OneLineParser, run_cli  # noqa: E402

if TYPE_CHECKING:
    import torch


def import_torch():
    """torch, once the arguments are read (``--help`` and a bad option answer without it)."""
    try:
        import torch
    except ImportError:
        sys.exit("error: bench/layer_cpu_bench.py needs torch, which is not installed: pip install -e '.[torch]'")
    return torch


def step(layer: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor) -> None:
    """One training step's layer work: the weight changed in place (as an optimizer step
    changes it, so TernaryLinear prepares it again: beta and the ternary codes), the
    gradients cleared, forward + backward."""
    import torch

    with torch.no_grad():
        layer.weight.mul_(1.0)  # same values, a new version
    layer.weight.grad = layer.bias.grad = x.grad = None
    layer(x).backward(dy)


def timed(fn: Callable[[], None], repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` calls."""
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def at_least(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``least`` (argparse words the refusal)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} is below {least}")
        return value
    return parse


def main(argv: list[str]) -> int:
    parser = OneLineParser(prog="python bench/layer_cpu_bench.py", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=at_least(1), default=64, help="batch rows R (default 64)")
    parser.add_argument("--in-features", type=at_least(1), default=243, help="K (default 243)")
    parser.add_argument("--out-features", type=at_least(1), default=729, help="N (default 729)")
    parser.add_argument("--repeats", type=at_least(1), default=1000, help="timed steps of each layer (default 1000)")
    parser.add_argument("--threads", type=at_least(0), default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--profile", action="store_true", help="print the operator profile of one step")
    args = parser.parse_args(argv)
    torch = import_torch()
    from hslm_ptx import TernaryLinear

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    R, K, N = args.rows, args.in_features, args.out_features
    ternary, linear = TernaryLinear(K, N), torch.nn.Linear(K, N)
    linear.load_state_dict(ternary.state_dict())
    x = torch.randn(R, K, requires_grad=True)
    dy = torch.randn(R, N)
    layers = {"TernaryLinear (cpu backend)": ternary, "nn.Linear float32": linear}
    for layer in layers.values():  # warm up: BLAS buffers, the operator dispatch caches
        timed(lambda: step(layer, x, dy), 20)
    times = {name: [] for name in layers}
    for _ in range(args.repeats):  # alternate, so both see the same load
        for name, layer in layers.items():
            times[name] += timed(lambda: step(layer, x, dy), 1)
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"forward + backward, batch {R}, {K} -> {N}, {args.repeats} repeats each, "
          f"{torch.get_num_threads()} torch threads")
    for name, median in medians.items():
        print(f"{name:<30} median {median * 1e3:8.3f} ms")
    ratio = medians["TernaryLinear (cpu backend)"] / medians["nn.Linear float32"]
    print(f"ratio TernaryLinear / nn.Linear: {ratio:.2f}x")
    if args.profile:
        with torch.profiler.profile() as prof:
            for _ in range(20):
                step(ternary, x, dy)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
