"""Stand-in cupyx.profiler.benchmark: two timed calls, repeated to n_repeat samples (host time)."""
import time
import types

import numpy as np


def benchmark(func, n_repeat, n_warmup):
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        func()
        times.append(time.perf_counter() - t0 + 1e-9)
    return types.SimpleNamespace(gpu_times=np.array([[times[i % 2] for i in range(n_repeat)]]))
