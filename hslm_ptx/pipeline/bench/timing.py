"""How long one implementation takes: how many buffer sets and calls, then the timed loops.

Sizing is pure (tested on the CPU): enough buffer sets that the rotated working set
exceeds ``l2_multiple`` times L2 (up to :data:`MAX_SETS`), so large shapes are not
timed out of L2, and enough launches per sample that one sample dwarfs the events'
resolution. Timing runs on the GPU: back-to-back launches on one stream (CUDA events
through cupyx.profiler.benchmark, after warm-up), then the same launches replayed
from one CUDA graph, which removes the CPU launch cost: the gap between the two is
launch overhead.
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Callable

from hslm_ptx.pipeline.bench.baselines import Case
from hslm_ptx.pipeline.bench.record import Method, Timing

MAX_SETS = 256  # rotation cap: tiny shapes stay L2-resident, as they would in a trainer
MAX_CALLS = 20000


def sets_needed(set_bytes: int, l2_bytes: int, l2_multiple: float, cap: int = MAX_SETS) -> int:
    """Buffer sets to rotate so that sets * set_bytes >= l2_multiple * L2 (at most ``cap``)."""
    return max(1, min(cap, math.ceil(l2_multiple * l2_bytes / max(1, set_bytes))))


def calls_per_sample(est_us: float, sets: int, target_us: float, cap: int = MAX_CALLS) -> int:
    """Launches per timed sample: a sample spans >= target_us and visits every set once."""
    need = math.ceil(target_us / est_us) if est_us > 0 else cap
    return max(sets, min(cap, need))


def _time(batch: Callable[[], None], calls: int, m: Method) -> Timing:
    from cupyx.profiler import benchmark  # optional: only a GPU machine has CuPy

    res = benchmark(batch, n_repeat=m.repeats, n_warmup=m.warmup)
    return Timing.of([float(t) * 1e6 / calls for t in res.gpu_times[0]], calls)


def estimate_us(cp: Any, case: Case) -> float:
    """Per-call time of one pass over all sets (after a first pass that warms up)."""
    start, end = cp.cuda.Event(), cp.cuda.Event()
    for s in case.sets:
        case.launch(s)
    start.record()
    for s in case.sets:
        case.launch(s)
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) * 1e3 / len(case.sets)


def time_stream(case: Case, calls: int, m: Method) -> Timing:
    """``calls`` launches back to back on the current stream, cycling through the sets."""
    order = itertools.cycle(case.sets)

    def batch() -> None:
        for _ in range(calls):
            case.launch(next(order))

    return _time(batch, calls, m)


def time_graph(cp: Any, torch: Any, case: Case, calls: int, m: Method) -> Timing:
    """The same ``calls`` launches captured once and replayed: launch overhead removed."""
    launches = [case.sets[c % len(case.sets)] for c in range(calls)]
    if case.capture == "torch":
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # torch's rule: warm up on a side stream first
            for s in case.sets:
                case.launch(s)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            for s in launches:
                case.launch(s)
        torch.cuda.synchronize()
        return _time(graph.replay, calls, m)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            for s in launches:
                case.launch(s)
        finally:
            graph = stream.end_capture()
        return _time(lambda: graph.launch(stream), calls, m)
