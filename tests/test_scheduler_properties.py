"""Property tests of the scheduler driven by a tiny synchronous loop (no simpy, no cost model).

Invariants: every request finishes or is dropped with a reason; tokens are conserved; KV
blocks never exceed capacity and only evictable prefix-cache blocks remain at the end; time
never goes backwards; preemption happens under KV pressure and still conserves tokens; a
backend that stops multi-step plans early changes nothing of the above.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.config import SchedulerConfig
from scheduler.plan import StepResult
from scheduler.request import Request, RequestStatus
from scheduler.scheduler import Scheduler

SETTINGS = settings(derandomize=True, deadline=None, max_examples=60,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def make_requests(rng: np.random.Generator, n: int, block_size: int, shared: bool) -> list[Request]:
    """Requests with random lengths; with ``shared``, prompts share prefixes from 3 groups."""
    t = np.cumsum(rng.exponential(0.05, n))
    out = []
    for i in range(n):
        p = int(rng.integers(1, 6 * block_size))
        hashes: tuple[int, ...] = ()
        if shared:
            g = int(rng.integers(0, 3))
            hashes = tuple(1000 * g + j for j in range(p // block_size))
        out.append(Request(f"r{i}", float(t[i]), p, int(rng.integers(1, 4 * block_size)), block_hashes=hashes,
                           priority=int(rng.integers(0, 3))))
    return out


def drive(sched: Scheduler, reqs: list[Request], rng: np.random.Generator, max_steps: int, early_stop: bool,
          rates: list[float]):
    """Run the scheduler to completion; returns (finished, dropped, tokens produced, preemptions seen)."""
    cfg = sched.config
    now, i = 0.0, 0
    finished: list[Request] = []
    dropped: list[Request] = []
    produced = 0
    step_s = 0.01
    max_used = 0
    last_now = -1.0
    guard = 0
    while i < len(reqs) or sched.has_work:
        guard += 1
        assert guard < 200_000, "no progress"
        while i < len(reqs) and reqs[i].arrival_time <= now:
            if not sched.add_request(reqs[i]):
                assert reqs[i].status is RequestStatus.DROPPED and reqs[i].drop_reason
                dropped.append(reqs[i])
            i += 1
        if not sched.has_work:
            if i == len(reqs):
                break
            now = reqs[i].arrival_time
            continue
        plan = sched.schedule(now, max_steps)
        assert not plan.is_empty, "work queued but nothing scheduled"
        assert plan.num_batched_tokens <= cfg.max_num_batched_tokens
        assert len(plan.decodes) + len(plan.prefills) <= cfg.max_num_seqs
        if plan.num_steps > 1:
            assert not plan.prefills
            left = min(r.output_len - r.num_output_tokens for r in plan.decodes)
            assert (plan.num_steps - 1) * (1 + plan.draft_len) < left  # nobody finishes before the last step
        used = sched.blocks.num_used
        assert used <= sched.blocks.num_blocks
        max_used = max(max_used, used)
        steps = plan.num_steps
        if early_stop and steps > 1:
            steps = int(rng.integers(1, steps + 1))
        nd = len(plan.decodes)
        if plan.draft_len:
            u = rng.random((steps, nd))
            acc = (u[..., None] < np.asarray(rates)[None, None, :]).sum(-1)
            tokens = 1 + acc
        else:
            tokens = np.ones((steps, nd), np.int64)
        before = sum(r.num_output_tokens for r in plan.decodes) + sum(c.request.num_output_tokens for c in plan.prefills)
        res = StepResult(step_durations=np.full(steps, step_s), decode_tokens=tokens)
        now += steps * step_s
        assert now >= last_now
        last_now = now
        done = sched.complete(plan, res, now)
        after = sum(r.num_output_tokens for r in plan.decodes) + sum(c.request.num_output_tokens for c in plan.prefills)
        produced += after - before
        for r in done:
            assert r.status is RequestStatus.FINISHED
            assert r.num_output_tokens == r.output_len
            assert r.first_token_time is not None and r.arrival_time <= r.first_token_time <= r.finish_time
        finished += done
    return finished, dropped, produced, max_used


@st.composite
def scenarios(draw):
    bs = draw(st.sampled_from([4, 8, 16]))
    draft = draw(st.integers(0, 2))
    max_seqs = draw(st.integers(1, 12))
    budget = draw(st.integers(max_seqs * (1 + draft), max_seqs * (1 + draft) + 12 * bs))
    cfg = SchedulerConfig(
        block_size=bs, max_num_seqs=max_seqs, max_num_batched_tokens=budget,
        enable_chunked_prefill=draw(st.booleans()), long_prefill_threshold=draw(st.sampled_from([0, bs, 3 * bs])),
        policy=draw(st.sampled_from(["fcfs", "priority"])), enable_prefix_caching=draw(st.booleans()),
        draft_len=draft, max_model_len=draw(st.sampled_from([10 * bs, 1000])),
    )
    blocks = draw(st.integers(3, 40))
    return dict(cfg=cfg, blocks=blocks, n=draw(st.integers(1, 40)), seed=draw(st.integers(0, 2**31)),
                max_steps=draw(st.sampled_from([1, 4, 64])), early=draw(st.booleans()),
                shared=draw(st.booleans()), named=draw(st.booleans()))


@SETTINGS
@given(scenarios())
def test_requests_finish_tokens_conserved_kv_bounded(sc):
    cfg = sc["cfg"]
    rng = np.random.default_rng(sc["seed"])
    reqs = make_requests(rng, sc["n"], cfg.block_size, sc["shared"])
    sched = Scheduler(cfg, sc["blocks"], name_all_blocks=sc["named"])
    finished, dropped, produced, max_used = drive(sched, reqs, rng, sc["max_steps"], sc["early"],
                                                  cfg.effective_acceptance_rates())
    # every request finished or was dropped with a reason
    assert len(finished) + len(dropped) == len(reqs)
    assert {r.request_id for r in finished}.isdisjoint({r.request_id for r in dropped})
    for r in dropped:
        assert r.drop_reason
    # tokens conserved
    assert produced == sum(r.output_len for r in finished)
    # KV back to zero apart from evictable cached prefix blocks
    b = sched.blocks
    assert b.num_held == 0 and b.num_reserved == 0
    assert b.num_used == (b.cache.num_unused if b.cache is not None else 0)
    assert b.num_free == b.num_blocks
    assert all(x == 0 for x in b.ref)
    assert sched.outstanding_tokens == 0
    st_ = sched.stats()
    assert st_.num_running == 0 and st_.num_waiting == 0
    assert st_.num_finished == len(finished)


@SETTINGS
@given(st.integers(0, 2**31), st.sampled_from([0, 1]), st.booleans())
def test_preemption_under_kv_pressure_conserves_tokens(seed, draft, named):
    """Few blocks, many long requests: preemption must happen and every token is still accounted for."""
    bs = 4
    cfg = SchedulerConfig(block_size=bs, max_num_seqs=8, max_num_batched_tokens=64, draft_len=draft,
                          enable_prefix_caching=False)
    rng = np.random.default_rng(seed)
    reqs = [Request(f"r{i}", 0.0, int(rng.integers(4, 12)), int(rng.integers(20, 40))) for i in range(10)]
    sched = Scheduler(cfg, 16, name_all_blocks=named)  # 64 tokens of KV for ~10 x 40-token requests
    finished, dropped, produced, max_used = drive(sched, reqs, rng, 8, True, cfg.effective_acceptance_rates())
    assert sched.num_preemptions > 0
    assert not dropped
    assert produced == sum(r.output_len for r in finished) == sum(r.output_len for r in reqs)
    assert max_used <= 16
    assert sum(r.num_preemptions for r in reqs) == sched.num_preemptions
