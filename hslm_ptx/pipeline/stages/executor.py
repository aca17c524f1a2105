"""Where cells run: this machine's cores (``executor=local``) or a Ray cluster (``executor=ray``).

A cell (one verify launch, one arch's SASS count) is a :class:`Job`: a function
importable on every worker and its arguments, plain data in and one record out. The
driver (doit's verify and sass tasks) decides what runs, hashes its inputs and writes
every record; an executor only runs jobs and hands each result back as it finishes, so
the driver writes each record when it arrives and a killed driver loses only the
cells still running.

- ``local``: a process pool of one worker per core of this machine (``os.sched_getaffinity``),
  started once a run, on the first batch with more than one job, by ``forkserver``
  (a fork of the driver would inherit its threads' locks), and sent no more jobs than
  it has workers, so a driver stopped by Ctrl-C waits only for the cells already
  running. One job, or one core, runs in the driver's own process: no pool to start.
- ``ray``: each job is one Ray task (``ray.remote``): a CPU job asks for one CPU, a GPU
  job for one GPU and one unit of the custom resource naming its arch (``sm_90: 1``), so
  a cluster of mixed GPUs runs each arch's jobs on the nodes that declare it. Ray
  schedules the tasks, moves their arguments and records, and retries a task whose
  worker or node died (``max_retries``); a job that raises is not retried: its
  exception is that job's result. Nothing here schedules, retries or moves data.

A job's result comes back as the function's return value or as the exception it
raised (Ray's wrapper removed), never raised here, so one failing cell never stops the
others.
"""
from __future__ import annotations

import atexit
import os
import socket
import threading
from typing import Any, Callable, Iterator, NamedTuple, Protocol, Sequence

from hslm_ptx.pipeline.core.errors import UserError, one_line
from hslm_ptx.runtime.backends import node_name  # noqa: F401  (where a job ran: the records name it)

EXECUTORS = ("local", "ray")
RAY_RETRIES = 3  # system failures (a worker process or its node gone) Ray retries a task for
RAY_HINT = 'pip install -e ".[cluster]"'


class Job(NamedTuple):
    """One cell's work: ``fn(*args)`` on some worker; ``arch`` names the GPU kind it needs."""

    fn: Callable[..., Any]  # a module-level function: a worker imports it by name
    args: tuple
    gpu: bool = False  # it needs a GPU (a CPU job: the emulator, ptxas, nvdisasm)
    arch: str | None = None  # the GPU kind it needs ("sm_90"); None: any


class Executor(Protocol):
    name: str
    workers: int  # how many jobs it runs at once (the cluster's CPUs for ray)

    def run(self, jobs: Sequence[Job]) -> Iterator[tuple[int, Any]]:
        """(index into ``jobs``, its result or the exception it raised), as each finishes."""


def cores() -> int:
    """The cores this process may run on (a container's or taskset's share, not the host's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _single_threaded_numpy() -> None:
    """Worker start: one BLAS thread per worker, the pool already has one worker per core."""
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")


class LocalExecutor:
    """This machine's cores: jobs in a process pool (one job: in this process)."""

    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or cores()
        self._pool = None
        self._lock = threading.Lock()  # the driver's threads (tools/gpu_verify.py, a doit -n run) share one pool

    def _started(self):
        with self._lock:
            if self._pool is None:
                import multiprocessing
                from concurrent.futures import ProcessPoolExecutor

                context = multiprocessing.get_context("forkserver")
                _single_threaded_numpy()  # before the server starts: its children inherit the environment
                context.set_forkserver_preload(["hslm_ptx.pipeline.stages.verify", "hslm_ptx.catalog.registry", "hslm_ptx.runtime.launch"])  # imported once, in the server
                self._pool = ProcessPoolExecutor(self.workers, mp_context=context)
                atexit.register(self.close)  # shut down before the interpreter takes the pool's module apart
            return self._pool

    def run(self, jobs: Sequence[Job]) -> Iterator[tuple[int, Any]]:
        if len(jobs) <= 1 or self.workers == 1:
            for index, job in enumerate(jobs):
                yield index, _call(job.fn, *job.args, local=True)
            return
        from concurrent.futures import FIRST_COMPLETED, wait
        from concurrent.futures.process import BrokenProcessPool

        pool, waiting, running = self._started(), list(enumerate(jobs))[::-1], {}
        try:
            while waiting or running:
                while waiting and len(running) < self.workers:  # no more sent than run: an interrupt waits on few
                    index, job = waiting.pop()
                    try:
                        running[pool.submit(_call, job.fn, *job.args, local=True)] = index
                    except BrokenProcessPool as exc:  # a worker died since: this job's result, a fresh pool next
                        self._pool = None
                        yield index, exc
                if not running:
                    continue
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    error = future.exception()
                    if isinstance(error, BrokenProcessPool):  # a worker was killed: a fresh pool for the next batch
                        self._pool = None
                    yield running.pop(future), error if error is not None else future.result()
        finally:
            for future in running:  # the driver stopped (Ctrl-C, SIGTERM): what was sent and not started stays so
                future.cancel()

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(cancel_futures=True)


class RayExecutor:
    """A Ray cluster: each job one Ray task with the resources its kind asks for."""

    name = "ray"

    def __init__(self, address: str) -> None:
        try:
            import ray
        except ImportError:
            raise UserError(f"executor=ray: the ray package is not installed; {RAY_HINT}") from None
        self.ray = ray
        if not ray.is_initialized():
            check_reachable(address)
            try:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise UserError(f"executor=ray address={address}: no Ray cluster there ({one_line(exc)}); "
                                "start one with `ray start --head` or set address= / RAY_ADDRESS") from None
        self.address = address
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remote = ray.remote(max_retries=RAY_RETRIES, retry_exceptions=False)(_call)

    def options(self, job: Job) -> dict:
        """What a job asks the scheduler for: a CPU, or a GPU and its arch's resource."""
        if not job.gpu:
            return {"num_cpus": 1}
        return {"num_cpus": 1, "num_gpus": 1, **({"resources": {job.arch: 1}} if job.arch else {})}

    def run(self, jobs: Sequence[Job]) -> Iterator[tuple[int, Any]]:
        ray = self.ray
        pending = {self._remote.options(**self.options(job)).remote(job.fn, *job.args): i for i, job in enumerate(jobs)}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    index = pending.pop(ref)
                    try:
                        yield index, ray.get(ref)
                    except ray.exceptions.RayTaskError as exc:  # the job raised: its own exception
                        yield index, exc.cause if isinstance(exc.cause, BaseException) else exc
                    except ray.exceptions.RayError as exc:  # retries spent (worker or node gone every time)
                        yield index, exc
        finally:
            for ref in pending:  # the driver stops early (Ctrl-C): the cluster stops them too
                ray.cancel(ref)


def _call(fn: Callable[..., Any], *args: Any, local: bool = False) -> Any:
    """A job on a worker; a local job's exception is returned, not raised (the pool would
    re-raise it with its traceback on the driver)."""
    if not local:
        return fn(*args)
    try:
        return fn(*args)
    except Exception as exc:  # the job's result, judged by the driver
        return exc


def check_reachable(address: str) -> None:
    """Refuse a ``host:port`` nothing listens on, in seconds: ray.init would retry it for minutes."""
    host, _, port = address.rpartition(":")
    if address in ("auto", "local") or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
    except OSError as exc:
        raise UserError(f"executor=ray address={address}: nothing answers there ({one_line(exc)}); "
                        "start a cluster with `ray start --head` or set address= / RAY_ADDRESS") from None


_EXECUTORS: dict[tuple[str, str], Executor] = {}
_MADE = threading.Lock()


def default_address() -> str:
    return os.environ.get("RAY_ADDRESS") or "auto"


def executor(name: str = "local", address: str = "") -> Executor:
    """The run's executor (one per process: doit's threads share it)."""
    if name not in EXECUTORS:
        raise UserError(f"executor={name}: expected one of {', '.join(EXECUTORS)}")
    key = (name, (address or default_address()) if name == "ray" else "")
    with _MADE:
        if key not in _EXECUTORS:
            _EXECUTORS[key] = LocalExecutor() if name == "local" else RayExecutor(key[1])
        return _EXECUTORS[key]


def parse_devices(text: str) -> tuple[str, ...]:
    """``devices=sm_89,sm_90`` -> ("sm_89", "sm_90"); each name an arch (sm_<digits>)."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    for name in names:
        if not (name.startswith("sm_") and name[3:].rstrip("a").isdigit()):
            raise UserError(f"devices={text}: '{name}' is not an arch; give e.g. devices=sm_89,sm_90")
    return names
