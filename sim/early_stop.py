"""Ending a run early: a caller's predicate, asked as each request finishes, may end the event loop.

The planner's full-scale confirmations run until every request has finished, though a run whose SLO
verdict is already certain to be a miss cannot change it (planner.slo_miss says when). ``StopWatch``
wraps the metrics collector the deployment reports to: every event passes through unchanged, and after
a finish is recorded the predicate is asked (O(1) per request in the planner's use). When it says so,
an event at the current simulated time ends ``env.run()`` (the step that finished the request has
completed; what else is due at that instant may still run). The run's result is then partial: the
runner skips its end-of-run checks and records the stop time on ``SimRun.stopped_at_s``.
"""

from __future__ import annotations

from typing import Callable

import simpy
from simpy.core import StopSimulation

from scheduler.request import Request

StopPredicate = Callable[[Request], bool]


class StopWatch:
    """``collector`` as the deployment calls it, ending the run once ``stop(req)`` holds after a finish."""

    def __init__(self, collector, stop: StopPredicate, env: simpy.Environment):
        self.collector, self._stop, self._env = collector, stop, env
        # the hot paths bound once, so only on_finish costs an extra call
        self.on_step, self.on_drop, self.on_arrival = collector.on_step, collector.on_drop, collector.on_arrival
        self._end = env.event()
        self._end.callbacks.append(StopSimulation.callback)   # what env.run(until=event) uses to end the loop
        self.stopped_at_s: float | None = None

    def on_finish(self, req: Request) -> None:
        self.collector.on_finish(req)
        if self.stopped_at_s is None and self._stop(req):
            self.stopped_at_s = float(self._env.now)
            self._end.succeed()

    def __getattr__(self, name):   # anything else (summaries, records, checks) is the collector's
        return getattr(self.collector, name)


def watch(collector, stop: StopPredicate | None, env: simpy.Environment):
    """``collector`` wrapped in a StopWatch when there is a ``stop`` predicate, else itself."""
    return collector if stop is None else StopWatch(collector, stop, env)


def stopped_at(collector) -> float | None:
    """When a StopWatch ended the run (simulated seconds), or None when it ran to the end."""
    return getattr(collector, "stopped_at_s", None) if isinstance(collector, StopWatch) else None
