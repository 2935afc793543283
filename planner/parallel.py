"""Run planner jobs in parallel with results in submission order: in-process, a process pool, or Ray.

Every job is a pure function of its arguments (seeded, no shared state), so the executor
changes only the wall time, never the results or their order: ``map_ordered`` returns
``[fn(x) for x in items]`` however it runs them.
"""

from __future__ import annotations

import os
import socket
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Sequence, TypeVar

from twinfer.errors import TwinferError

T = TypeVar("T")
R = TypeVar("R")


# who hears of finished jobs: (job function name, done, total); set by a CLI for its progress bar
_progress: Callable[[str, int, int], None] | None = None


@contextmanager
def reporting(hook: Callable[[str, int, int], None]) -> Iterator[None]:
    """Call ``hook(job_name, done, total)`` as every ``Runner.map`` in this block finishes jobs (results unchanged)."""
    global _progress
    prev, _progress = _progress, hook
    try:
        yield
    finally:
        _progress = prev


def _tell(fn: Callable, done: int, total: int) -> None:
    report(getattr(fn, "__name__", "jobs"), done, total)


def report(name: str, done: int, total: int) -> None:
    """Tell the block's hook (if any) that ``done`` of ``total`` units of ``name`` are finished: for planner work
    that runs in this process outside ``Runner.map`` (the full-scale confirmations)."""
    if _progress is not None:
        _progress(name, done, total)


def default_workers() -> int:
    """Worker processes by default: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


class Runner:
    """Where planner jobs run: ``workers == 1`` in this process, more in a process pool, or on a Ray cluster."""

    def __init__(self, workers: int = 1, ray_address: str | None = None):
        if workers < 1:
            raise TwinferError(f"workers={workers}: must be >= 1")
        self.workers = workers
        self.ray_address = ray_address
        self._pool: ProcessPoolExecutor | None = None
        self._ray = None
        if ray_address:
            try:
                import ray  # noqa: F401
            except ImportError:
                raise TwinferError(
                    f"--ray {ray_address}: the 'ray' package is not installed here; install it (pip install 'ray[default]') "
                    "or run without --ray to use local worker processes"
                ) from None
            self._ray = ray

    def describe(self) -> str:
        if self._ray is not None:
            return f"Ray cluster at {self.ray_address}"
        return "this process" if self.workers == 1 else f"{self.workers} worker processes"

    def __enter__(self) -> "Runner":
        if self._ray is not None:
            if not self._ray.is_initialized():
                _connect_ray(self._ray, self.ray_address)
        elif self.workers > 1:
            self._pool = ProcessPoolExecutor(max_workers=self.workers)
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def map(self, fn: Callable[..., R], items: Sequence[T], *args) -> list[R]:
        """``[fn(x, *args) for x in items]``, computed wherever this runner runs jobs, in item order."""
        items = list(items)
        if not items:
            return []
        _tell(fn, 0, len(items))
        if self._ray is not None:
            remote = self._ray.remote(_call)
            refs = [remote.remote(fn, x, args) for x in items]
            waiting = list(refs)
            while waiting:  # only to report progress: results are read in submission order below
                ready, waiting = self._ray.wait(waiting, num_returns=len(waiting), timeout=0.5)
                _tell(fn, len(refs) - len(waiting), len(refs))
            return list(self._ray.get(refs))
        if self._pool is None or len(items) == 1:
            out = []
            for x in items:
                out.append(fn(x, *args))
                _tell(fn, len(out), len(items))
            return out
        chunk = max(1, len(items) // (4 * self.workers))
        out = []
        for r in self._pool.map(_call, [fn] * len(items), items, [args] * len(items), chunksize=chunk):
            out.append(r)
            _tell(fn, len(out), len(items))
        return out


def _connect_ray(ray, address: str) -> None:
    """``ray.init(address)`` with what goes wrong said as a user error naming ``--ray``: an explicit host:port where
    nothing listens is refused at once (ray.init would retry it for minutes); a bad address, or no cluster for
    'auto', in ray's words."""
    where = address.removeprefix("ray://")
    host, sep, port = where.rpartition(":")
    if sep and host and port.isdigit():
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
        except OSError as e:
            raise TwinferError(f"--ray {address}: nothing answers at {where} ({e.strerror or e}); start the cluster "
                               "there (ray start --head) or give its address") from None
    try:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    except (OSError, ValueError, RuntimeError) as e:  # ConnectionError, bad address format, missing ray[client]
        raise TwinferError(f"--ray {address}: {e}") from None


def _call(fn, x, args):
    return fn(x, *args)


def chunks(items: Iterable[T], n: int) -> list[list[T]]:
    """Split ``items`` into ``n`` nearly equal consecutive lists (order kept)."""
    items = list(items)
    k, m = divmod(len(items), max(n, 1))
    out, i = [], 0
    for j in range(max(n, 1)):
        step = k + (1 if j < m else 0)
        if step:
            out.append(items[i:i + step])
        i += step
    return out
