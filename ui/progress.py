"""Progress bars (rich, with an ETA) for commands that run longer than a few seconds, and partial results on Ctrl-C.

The bars go to stderr and never touch a result: a run's figures come from simulated or
engine time, so watching it (a thread that counts finished requests) changes nothing but
the wall time.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

POLL_S = 0.5  # how often a watcher counts finished requests (a 1M-request list takes ~30 ms to scan)
# the planner's batches of jobs (planner.parallel.reporting names them by function), as the CLI and the UI label them
PLANNER_JOBS = {"_screen_job": "screen layouts", "run_job": "simulate candidates", "confirm_plan": "full-scale runs of the plan"}


def progress_bar(console: Console, transient: bool = False) -> Progress:
    """The one bar style: label, bar, done/total, elapsed, ETA."""
    return Progress(TextColumn("[bold]{task.description}[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=transient)


def done_requests(requests: Sequence) -> int:
    """Requests that finished or were dropped (``scheduler.request.Request`` fields)."""
    return sum(1 for r in requests if r.finish_time is not None or r.drop_reason is not None)


@contextmanager
def watch(count: Callable[[], int], total: int, label: str, console: Console, transient: bool = False) -> Iterator[Progress]:
    """A bar for ``total`` units that a thread advances to ``count()`` every POLL_S until the block ends."""
    stop = threading.Event()
    with progress_bar(console, transient) as bar:
        task = bar.add_task(label, total=total)

        def poll() -> None:
            while not stop.wait(POLL_S):
                bar.update(task, completed=count())

        t = threading.Thread(target=poll, name="twinfer-progress", daemon=True)
        t.start()
        try:
            yield bar
        finally:
            stop.set()
            t.join()
            bar.update(task, completed=count())


def partial_metrics(requests: Sequence, num_gpus: int, slo=None):
    """Metrics over the requests finished so far (the same collector a full run uses), for a run cut by Ctrl-C."""
    from scheduler.metrics import MetricsCollector

    col = MetricsCollector()
    for r in requests:
        if r.finish_time is not None:
            col.on_arrival(r)
            col.on_finish(r)
    return col.summarize(num_gpus, slo)
