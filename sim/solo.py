"""The one-instance simulator loop without simpy: same events, same order, same floats.

A cluster of one instance (``sim.cluster.Cluster`` with one scheduler) has exactly two simpy
processes: the instance loop (``sim.instance.Instance._loop``) and the arrival process
(``Cluster._arrivals``). Their interplay is simple enough to replay in plain Python:

- the instance, at each plan boundary, hands over every arrival due by then (``dispatch_due``),
  asks the scheduler for a plan cut at the first step boundary at/after the next arrival,
  sleeps until the plan ends, and applies the result;
- the arrival process sleeps from one arrival to the next (``timeout(t - now)``) and hands a
  request over when it wakes, which wakes an idle instance or, in the rare case where the
  arrival lands before the plan's last step boundary (float rounding), cuts the running plan.

``run_solo`` advances both in time order and computes every clock value with the same float
expressions simpy would (``now + (t - now)``), so a run gives the same plans, metrics and digest
as the simpy engine, with no simpy event per arrival or per plan. Same-time events of the two
processes may run in either order here: the scheduler state the next plan sees is the same
either way (arrivals are dispatched in index order and ``dispatch_due`` takes every arrival
within ``TIME_EPS_S``). ``tests/test_sim_core_solo.py`` checks the equivalence on scenarios
with arrivals, drafts, preemption, prefix hits and drops.
"""

from __future__ import annotations

from scheduler.request import Request
from scheduler.scheduler import Scheduler
from sim.backend import SimBackend
from sim.cluster import Cluster
from sim.instance import cut_index


def run_solo(scheduler: Scheduler, backend: SimBackend, metrics, requests: list[Request], max_steps: int = 256) -> float:
    """Run ``requests`` (sorted by arrival) through one instance; returns the simulated end time
    (simpy's ``env.now`` after ``env.run()``). Like the Cluster, it reads ``requests`` forward only,
    one index past the last dispatched request at most (streamed workloads rely on it)."""
    sched = scheduler
    reqs = requests
    num = len(reqs)
    eps = Cluster.TIME_EPS_S
    iid = sched.instance_id
    blocks = sched.blocks
    kv_total = blocks.num_blocks
    schedule, complete, add_request = sched.schedule, sched.complete, sched.add_request
    execute, cut_result = backend.execute, backend.cut
    backend.clock = lambda: start
    on_step, on_finish, on_arrival, on_drop = metrics.on_step, metrics.on_finish, metrics.on_arrival, metrics.on_drop

    nxt = 0              # index of the next request to dispatch (Cluster._next)
    # the arrival process: the time of its pending wake-up (None once it has ended), the clock it
    # computed that from, and whether it has started (it starts at t=0, after the instance's first step)
    a_fire: float | None = 0.0
    a_started = False
    a_target = 0         # the request it sleeps towards
    last_event = 0.0     # time of the latest event processed (env.now at the end)

    # what a dispatch does to the instance (Instance.wake): set by dispatch()
    idle = False         # the instance waits for work
    woke_at: float | None = None
    ends = None          # step end times of the running multi-step plan
    cut: int | None = None
    cut_fire = 0.0

    def dispatch(i: int, now: float) -> None:
        """Cluster._dispatch + Instance.submit + Instance.wake for request ``i`` at ``now``."""
        nonlocal nxt, idle, woke_at, cut, cut_fire
        nxt = i + 1
        req = reqs[i]
        on_arrival(req)
        if not add_request(req):
            on_drop(req)
            return
        if idle:
            idle = False
            woke_at = now
        elif ends is not None and cut is None and now <= ends[-2]:
            cut = cut_index(ends, now)
            cut_fire = now + (float(ends[cut]) - now)

    def arrivals_until(limit: float) -> None:
        """Run the arrival process's wake-ups due at or before ``limit`` (Cluster._arrivals)."""
        nonlocal a_fire, a_started, a_target, last_event
        # once an arrival has cut the running plan, the instance wakes at the cut instead
        while a_fire is not None and a_fire <= (limit if cut is None else cut_fire):
            now = a_fire
            if now > last_event:
                last_event = now
            if a_started:
                # woke for the request it slept towards: hand it over unless the instance already did
                if nxt == a_target:
                    dispatch(a_target, now)
                due = now + eps
                while nxt < num and reqs[nxt].arrival_time <= due:
                    dispatch(nxt, now)
            a_started = True
            # the loop head: sleep towards the next undispatched request (or hand it over now)
            while True:
                if nxt >= num:
                    a_fire = None
                    return
                t = reqs[nxt].arrival_time
                if t > now:
                    a_target = nxt
                    a_fire = now + (t - now)
                    break
                dispatch(nxt, now)
                due = now + eps
                while nxt < num and reqs[nxt].arrival_time <= due:
                    dispatch(nxt, now)

    now = start = 0.0
    while True:
        # Instance._loop at a boundary: before(now) = Cluster.dispatch_due(now)
        due = now + eps
        while nxt < num and reqs[nxt].arrival_time <= due:
            dispatch(nxt, now)
        if not sched.has_work:
            idle, woke_at = True, None
            while a_fire is not None and woke_at is None:
                arrivals_until(a_fire)
            if woke_at is None:
                break  # nothing left to arrive: the run is over
            now = woke_at
            continue
        start = now
        plan = schedule(start, max_steps)
        if not plan.decodes and not plan.prefills:
            raise RuntimeError(f"instance {iid}: work queued but nothing schedulable at t={start}")
        result = execute(plan, reqs[nxt].arrival_time if nxt < num else None)
        times = result.step_durations
        n = len(times)
        if n > 1:
            plan_ends = backend.ends
            fire = start + (float(plan_ends[n - 1]) - start)
            if a_fire is not None and a_fire <= fire:
                ends, cut = plan_ends, None
                arrivals_until(fire)
                if cut is not None:
                    # an arrival interrupted the plan before its last step boundary: it stops after step ``cut``
                    fire = cut_fire
                    result = cut_result(result, cut + 1)
                ends, cut = None, None
        else:
            fire = start + float(times[0])
            if a_fire is not None and a_fire <= fire:
                arrivals_until(fire)
        now = fire
        if now > last_event:
            last_event = now
        on_step(iid, start, plan, result, blocks.num_used, kv_total)
        finished = complete(plan, result, now)
        if finished:
            for req in finished:
                on_finish(req)
    return last_event
