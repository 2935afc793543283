"""A cluster of identical instances behind a router, fed by a pre-generated arrival sequence (and ``submit``)."""

from __future__ import annotations

from typing import Callable, Sequence

import simpy

from scheduler.request import Request
from scheduler.scheduler import Scheduler
from sim.backend import SimBackend
from sim.instance import Instance
from sim.router import Router


class Cluster:
    """N instances, one router, and the simpy process that delivers arrivals.

    Arrivals are known in advance (sorted), so one process sleeps from one arrival time to the
    next. Every instance also pulls arrivals due at its current time before it schedules
    (``dispatch_due``), so an arrival at exactly a step boundary is seen at that boundary no matter
    in which order simpy fires the two same-time events.
    """

    def __init__(
        self,
        env: simpy.Environment,
        schedulers: Sequence[Scheduler],
        make_backend: Callable[[int], SimBackend],
        router: Router,
        metrics,
        requests: list[Request],
        max_steps: int = 256,
    ):
        self.env = env
        self.router = router
        self.metrics = metrics
        self.requests = requests
        self._next = 0  # index of the next request to dispatch
        self.schedulers = list(schedulers)
        # one instance gets every arrival, so its decode runs can stop at the next arrival up front;
        # with several, the router decides at arrival time and interrupts the chosen instance's run
        next_arrival = self.next_arrival_time if len(self.schedulers) == 1 else None
        self.instances = [
            Instance(env, i, s, make_backend(i), metrics, max_steps, before_schedule=self.dispatch_due,
                     next_arrival=next_arrival)
            for i, s in enumerate(self.schedulers)
        ]
        env.process(self._arrivals())

    # A step boundary computed as start + duration can land a rounding error short of the
    # arrival it was cut for; arrivals this close to ``now`` count as arrived.
    TIME_EPS_S = 1e-9

    def dispatch_due(self, now: float) -> None:
        """Route every not yet dispatched request that has arrived by ``now``."""
        reqs = self.requests
        due = now + self.TIME_EPS_S
        while self._next < len(reqs) and reqs[self._next].arrival_time <= due:
            self._dispatch(reqs[self._next])

    def next_arrival_time(self) -> float | None:
        """Arrival time of the next request not yet dispatched."""
        return self.requests[self._next].arrival_time if self._next < len(self.requests) else None

    def _dispatch(self, req: Request) -> None:
        self._next += 1
        self.submit(req)

    def submit(self, req: Request) -> None:
        """Route ``req`` now: a scheduled arrival, or one made during the run (a closed-loop user's next request)."""
        self.metrics.on_arrival(req)
        i = self.router.choose(req, self.schedulers) if len(self.instances) > 1 else 0
        self.instances[i].submit(req)

    def _arrivals(self):
        env, reqs = self.env, self.requests
        while self._next < len(reqs):
            req = reqs[self._next]
            if req.arrival_time > env.now:
                yield env.timeout(req.arrival_time - env.now)
            # dispatch by index, not by comparing times: now + (t - now) may miss t by one ulp
            if self._next < len(reqs) and reqs[self._next] is req:
                self._dispatch(req)
            self.dispatch_due(env.now)
