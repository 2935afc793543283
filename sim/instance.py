"""One serving instance in the simulator: a simpy process looping scheduler -> backend -> scheduler."""

from __future__ import annotations

from bisect import bisect_left
from typing import Callable

import numpy as np
import simpy

from scheduler.plan import StepResult
from scheduler.request import Request
from scheduler.scheduler import Scheduler
from sim.backend import SimBackend


def cut_index(ends, now: float) -> int:
    """Index of the first step of a running multi-step plan ending at/after ``now`` (where an arrival cuts it)."""
    return bisect_left(ends, now) if isinstance(ends, list) else int(ends.searchsorted(now, side="left"))


class Instance:
    """A model replica: its Scheduler, its SimBackend and the simpy process that drives them.

    The loop asks for plans of up to ``max_steps`` decode steps and sleeps until the plan ends.
    A multi-step plan stops at the first step boundary at/after the next arrival (the executor too
    only sees a new request between steps), so a long decode run never delays an arrival by more
    than one step: a lone instance knows the next arrival up front (``next_arrival``); in a
    cluster, the arrival routed here interrupts the sleep and the plan is cut at that boundary.

    A pipelined engine (the backend's ``async_overlap``) schedules and launches the plan that runs after the
    current one while the device still runs the current one (the executor's ``LLMEngine.step_overlapped``,
    SGLang's overlap scheduler). So a request handed over while the engine is busy is not in the plan that
    starts at the next boundary (that plan was scheduled when the previous step started) but in the one after:
    the scheduler queues it at once (routers see its load) and starts no waiting request that arrived after the
    step that just ended had started (``Scheduler.admit_before``). An engine with nothing scheduled behind the step
    that ends starts cold and takes every waiting request.
    """

    def __init__(
        self,
        env: simpy.Environment,
        instance_id: int,
        scheduler: Scheduler,
        backend: SimBackend,
        metrics,
        max_steps: int = 256,
        before_schedule: Callable[[float], None] | None = None,
        next_arrival: Callable[[], float | None] | None = None,
    ):
        self.env = env
        self.instance_id = instance_id
        self.scheduler = scheduler
        self.backend = backend
        self.metrics = metrics
        self.max_steps = max_steps
        # called with env.now before every schedule(): lets the cluster hand over arrivals due
        # exactly now, whatever order simpy fires same-time events in
        self._before_schedule = before_schedule
        # when given (all arrivals come here), plans stop at the first step boundary at/after the
        # next arrival up front, instead of being interrupted when it comes
        self._next_arrival = next_arrival
        self._wake: simpy.Event | None = None     # set while idle
        # pipelined engine: the start of the step that just ended (when the real engine scheduled the plan now due)
        self._lag = bool(backend.async_overlap)
        self._last_start = -np.inf
        self._idle = True       # nothing executing or scheduled: the next plan is scheduled with everything queued
        self._ends: list[float] | np.ndarray | None = None  # step end times of the running multi-step plan
        self._cut: int | None = None              # index of the step the running plan stops after
        self.process = env.process(self._loop_lead() if getattr(backend, "lead", False) else self._loop())

    def submit(self, req: Request) -> None:
        """Hand ``req`` to this instance now: queue it and make sure the loop sees it next step (a pipelined engine
        that is busy: the step after next, see the class docs)."""
        if not self.scheduler.add_request(req):
            self.metrics.on_drop(req)
            return
        self.wake()

    def wake(self) -> None:
        """Make the loop look at its scheduler now (after something was queued there): wake it if idle,
        else cut a running multi-step plan at the current step boundary."""
        if self._wake is not None:
            wake, self._wake = self._wake, None
            wake.succeed()
        elif self._ends is not None and self._cut is None:
            ends, now = self._ends, self.env.now
            if now <= ends[-2]:  # some step after the current one is left: stop at the current one
                self._cut = cut_index(ends, now)
                self.process.interrupt()

    def _loop(self):
        """schedule -> execute -> complete, sleeping in simulated time while the plan runs."""
        env, sched, backend, metrics = self.env, self.scheduler, self.backend, self.metrics
        iid = self.instance_id
        blocks = sched.blocks
        kv_total = blocks.num_blocks
        backend.clock = lambda: env.now
        # bound once: this loop runs once per plan
        before, next_arrival = self._before_schedule, self._next_arrival
        complete, execute = sched.complete, backend.execute
        on_step, on_finish, timeout = metrics.on_step, metrics.on_finish, env.timeout
        on_plan = getattr(metrics, "on_plan", None)
        while True:
            if before is not None:
                before(env.now)
            if not sched.has_work:
                self._idle = True
                self._wake = env.event()
                yield self._wake
                continue
            start = env.now
            plan = self._schedule(start)
            result = execute(plan, next_arrival() if next_arrival is not None else None)
            times = result.step_durations
            if len(times) > 1:
                result = yield from self._sleep_through(result, start)
            else:
                self._last_start = start
                yield timeout(float(times[0]))
            if on_plan is not None:
                on_plan(iid, start, plan, result)
            kv_used = blocks.num_used
            finished = complete(plan, result, env.now)   # (keeps only the tokens delivered in result)
            on_step(iid, start, plan, result, kv_used, kv_total)
            if finished:
                for req in finished:
                    on_finish(req)

    def _loop_lead(self):
        """``_loop`` for a pipelined engine priced launch by launch (the backend's ``lead``, costmodels.host.
        pipeline_step), in the executor's order (``LLMEngine.step_overlapped``): when the device finishes a plan, the
        scheduler takes its tokens and the loop schedules and launches the next plan behind it; only once that
        launch is done is the finished plan read back (its tokens, first tokens and finishes dated then, its last
        step's wall running to then). The next plan is scheduled with the arrivals the real engine had when it
        launched it (``Scheduler.admit_before``, as in ``_loop``)."""
        env, sched, backend, metrics = self.env, self.scheduler, self.backend, self.metrics
        iid = self.instance_id
        blocks = sched.blocks
        kv_total = blocks.num_blocks
        backend.clock = lambda: env.now
        before, next_arrival = self._before_schedule, self._next_arrival
        complete, execute = sched.complete, backend.execute
        on_plan = getattr(metrics, "on_plan", None)
        on_step, on_finish, timeout = metrics.on_step, metrics.on_finish, env.timeout
        # the plan whose device work just ended, not yet read back (None: none), its result, start and the requests
        # whose first token it made (four locals, not a tuple: this loop runs once per plan)
        p_plan = p_res = p_firsts = None
        p_start = 0.0
        finished: list[Request] = []
        while True:
            if before is not None:
                before(env.now)
            if p_plan is not None:
                if on_plan is not None:
                    on_plan(iid, p_start, p_plan, p_res)
                finished = complete(p_plan, p_res, env.now)
            if not sched.has_work:
                if p_plan is not None:
                    on_step(iid, p_start, p_plan, p_res, blocks.num_used, kv_total)
                    for r in finished:
                        on_finish(r)
                    p_plan = p_res = p_firsts = None
                backend.drain()
                self._idle = True
                self._wake = env.event()
                yield self._wake
                continue
            plan = self._schedule(env.now)
            firsts = [c.request for c in plan.prefills if c.is_last_chunk and c.request.first_token_time is None] \
                if plan.prefills else ()
            result = execute(plan, next_arrival() if next_arrival is not None else None)
            delay = backend.read_back_delay
            if delay > 0:
                yield timeout(delay)
            if p_plan is not None:   # read back: report the previous plan (later by the delay: _read_late)
                if delay > 0:
                    p_res = self._read_late(p_res, delay, p_firsts, finished)
                on_step(iid, p_start, p_plan, p_res, blocks.num_used, kv_total)
                for r in finished:
                    on_finish(r)
            start = env.now
            times = result.step_durations
            if len(times) > 1:
                result = yield from self._sleep_through(result, start)
            else:
                self._last_start = start
                yield timeout(float(times[0]))
            p_plan, p_res, p_start, p_firsts = plan, result, start, firsts

    def _schedule(self, now: float):
        """The plan due now. It was scheduled when the step that just ended started: requests that arrived later wait
        a step (``Scheduler.admit_before``), unless nothing was scheduled behind that step (the engine then starts
        cold with all)."""
        sched = self.scheduler
        lagged = self._lag and not self._idle and sched.has_work_by(self._last_start)
        self._idle = False
        sched.admit_before = self._last_start if lagged else None
        plan = sched.schedule(now, self.max_steps)
        sched.admit_before = None
        if not plan.decodes and not plan.prefills:
            raise RuntimeError(f"instance {self.instance_id}: work queued but nothing schedulable at t={now}")
        return plan

    def _sleep_through(self, result, start: float):
        """Sleep through a multi-step plan's steps from ``start``; an arrival (``wake``) cuts it at the current step
        boundary. Returns its result as run (cut where it was) and notes where its last step started."""
        env, backend = self.env, self.backend
        ends = backend.ends
        n = len(result.step_durations)
        self._ends, self._cut = ends, None
        last = n - 1
        try:
            yield env.timeout(float(ends[n - 1]) - start)
        except simpy.Interrupt:
            cut = last = self._cut
            yield env.timeout(float(ends[cut]) - env.now)
            result = backend.cut(result, cut + 1)
        self._ends = None
        self._last_start = float(ends[last - 1]) if last > 0 else start
        return result

    def _read_late(self, result: StepResult, delay: float, firsts, finished: list[Request]) -> StepResult:
        """A plan read back ``delay`` seconds after its device work ended (the launch of the next plan ran on): its
        last step's wall runs to now, and so do the times of the first tokens and finishes it made."""
        now = self.env.now
        d = np.array(result.step_durations, float)
        d[-1] += delay
        for r in firsts:
            if r.first_token_time is not None:
                r.first_token_time = now
        for r in finished:
            r.finish_time = now
        return StepResult(d, result.decode_tokens, result.sampled_token_ids, result.finished_early, result.host_s)
