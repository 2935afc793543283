"""Unit tests of the block manager, the prefix cache, the scheduler config and scheduling rules."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from scheduler.block_manager import BlockManager
from scheduler.config import SchedulerConfig
from scheduler.plan import StepResult
from scheduler.request import Request, RequestStatus
from scheduler.scheduler import Scheduler


def run_plan(sched: Scheduler, plan, now: float, steps: int | None = None, tokens=None, early=()):
    """Complete ``plan`` as if a backend ran ``steps`` steps of 1 s each."""
    k = plan.num_steps if steps is None else steps
    nd = len(plan.decodes)
    tok = np.ones((k, nd), np.int64) if tokens is None else np.asarray(tokens, np.int64)
    res = StepResult(step_durations=np.ones(k), decode_tokens=tok, finished_early=set(early))
    return sched.complete(plan, res, now + k)


# ------------------------------------------------------------------ block manager / prefix cache
def test_block_manager_allocate_release_reserve():
    bm = BlockManager(8, 4, enable_prefix_caching=False)
    a = bm.allocate(3)
    assert a == [0, 1, 2] and bm.num_free == 5 and bm.num_used == 3
    bm.reserve(4)
    assert bm.num_free == 1 and bm.num_used == 7
    with pytest.raises(RuntimeError):
        bm.allocate(2)
    bm.release(a)
    bm.unreserve(4)
    assert bm.num_free == 8 and bm.num_used == 0 and bm.num_held == 0


def test_prefix_cache_hits_pins_and_evicts_lru_leaves():
    bm = BlockManager(6, 4)
    cache = bm.cache
    ids = bm.allocate(3)
    for i, (h, b) in enumerate(zip((11, 12, 13), ids)):
        assert cache.insert(ids[i - 1] if i else -1, h, b)
    assert not cache.insert(-1, 11, 99)              # same content already cached
    assert cache.match((11, 12, 13, 14), 10) == ids
    assert cache.match((11, 99), 10) == ids[:1]
    assert cache.match((11, 12, 13), 2) == ids[:2]   # capped
    bm.release(ids)                                  # cached, unused: still allocated, evictable
    assert bm.num_used == 3 and bm.num_free == 6 and cache.num_unused == 3
    bm.pin(ids[:2])                                  # a hit on the first two blocks
    assert bm.num_free == 4
    got = bm.allocate(4)                             # must evict the unused leaf (13), not the pinned ones
    assert ids[2] in got and cache.match((11, 12, 13), 3) == ids[:2]
    bm.release(ids[:2])
    bm.release(got)
    assert bm.num_free == 6 and cache.num_unused == 2
    assert len(cache.evict(10)) == 2 and cache.num_cached == 0


# ------------------------------------------------------------------ config
@pytest.mark.parametrize("kw, field", [
    ({"block_size": 0}, "block_size"),
    ({"max_num_seqs": 300, "max_num_batched_tokens": 256}, "max_num_seqs"),
    ({"draft_len": 2, "acceptance_rates": [0.9]}, "acceptance_rates"),
    ({"draft_len": 1, "acceptance_rates": [1.5]}, "acceptance_rates"),
    ({"draft_len": 2, "acceptance_rates": [0.5, 0.8]}, "non-increasing"),
    ({"policy": "lifo"}, "policy"),
    ({"bogus": 1}, "bogus"),
])
def test_config_errors_name_the_field(kw, field):
    with pytest.raises(ValidationError) as e:
        SchedulerConfig(**kw)
    assert field in str(e.value)


def test_default_acceptance_and_host_overhead():
    cfg = SchedulerConfig(draft_len=2)
    assert cfg.effective_acceptance_rates() == pytest.approx([0.85, 0.85**2])
    assert cfg.expected_tokens_per_decode() == pytest.approx(1 + 0.85 + 0.7225)
    small, big = SchedulerConfig().host_overhead_s(16, 16), SchedulerConfig().host_overhead_s(128, 128)
    assert 2e-3 <= small < big <= 5e-3


# ------------------------------------------------------------------ scheduling rules
def test_drops_requests_that_can_never_fit():
    s = Scheduler(SchedulerConfig(block_size=4, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=100), 10)
    too_long = Request("a", 0.0, 100, 20)   # no room for one output token in max_model_len
    too_big = Request("b", 0.0, 30, 20)     # 50 tokens > 40 KV tokens
    ok = Request("c", 0.0, 20, 10)
    assert not s.add_request(too_long) and "max_model_len" in too_long.drop_reason
    assert not s.add_request(too_big) and "KV blocks" in too_big.drop_reason
    assert s.add_request(ok) and s.num_waiting == 1
    assert too_long.status is RequestStatus.DROPPED and s.stats().num_dropped == 2


def test_an_output_past_the_context_window_is_cut_there_as_the_executor_cuts_it():
    """A prompt with room for its first output token is served, its output cut at max_model_len (the executor's
    LLMEngine.add_request; vLLM / SGLang finish it with reason "length"); it was refused."""
    s = Scheduler(SchedulerConfig(block_size=4, max_num_seqs=4, max_num_batched_tokens=128, max_model_len=100), 64)
    r = Request("a", 0.0, 90, 20)
    assert s.add_request(r) and r.output_len == 10 and r.drop_reason is None
    last = Request("b", 0.0, 99, 5)
    assert s.add_request(last) and last.output_len == 1


def test_chunked_prefill_budget_decode_first_and_first_token():
    cfg = SchedulerConfig(block_size=4, max_num_seqs=4, max_num_batched_tokens=10)
    s = Scheduler(cfg, 100)
    a, b = Request("a", 0.0, 25, 3), Request("b", 0.0, 6, 3)
    s.add_request(a)
    s.add_request(b)
    p = s.schedule(0.0)
    assert [(c.request.request_id, c.num_new_tokens) for c in p.prefills] == [("a", 10)]
    run_plan(s, p, 0.0)
    p = s.schedule(1.0)
    assert [(c.request.request_id, c.num_new_tokens) for c in p.prefills] == [("a", 10)]
    run_plan(s, p, 1.0)
    p = s.schedule(2.0)   # a's last 5 tokens, then b's first 5
    assert [(c.request.request_id, c.num_new_tokens, c.is_last_chunk) for c in p.prefills] == [("a", 5, True), ("b", 5, False)]
    run_plan(s, p, 2.0)
    assert a.num_output_tokens == 1 and a.first_token_time == 3.0 and b.first_token_time is None
    p = s.schedule(3.0)   # decode first (1 token), then b's last prompt token
    assert p.decodes == [a] and [(c.request.request_id, c.num_new_tokens) for c in p.prefills] == [("b", 1)]
    assert p.num_batched_tokens == 2


def test_long_prefill_threshold_caps_chunks():
    s = Scheduler(SchedulerConfig(block_size=4, max_num_seqs=8, max_num_batched_tokens=64, long_prefill_threshold=8), 100)
    s.add_request(Request("a", 0.0, 30, 2))
    s.add_request(Request("b", 0.0, 30, 2))
    p = s.schedule(0.0)
    assert [c.num_new_tokens for c in p.prefills] == [8, 8]


def test_fcfs_and_priority_order():
    for policy, expect in (("fcfs", ["x", "y", "z"]), ("priority", ["z", "x", "y"])):
        s = Scheduler(SchedulerConfig(block_size=4, max_num_seqs=1, max_num_batched_tokens=64, policy=policy), 100)
        for rid, prio in (("x", 1), ("y", 1), ("z", 0)):
            s.add_request(Request(rid, 0.0, 4, 1, priority=prio))
        order = []
        t = 0.0
        while s.has_work:
            p = s.schedule(t)
            order += [c.request.request_id for c in p.prefills]
            run_plan(s, p, t)
            t += 1
        assert order == expect


def test_multi_step_horizon_respects_min_remaining_and_kv():
    s = Scheduler(SchedulerConfig(block_size=4, max_num_seqs=8, max_num_batched_tokens=64), 100)
    s.add_request(Request("a", 0.0, 4, 11))
    s.add_request(Request("b", 0.0, 4, 6))
    run_plan(s, s.schedule(0.0, 100), 0.0)     # prefill: one token each
    p = s.schedule(1.0, 100)
    assert not p.prefills and p.num_steps == 5  # b has 5 tokens left: it may finish only at the last step
    assert list(p.decode_context_lens) == [4, 4]
    done = run_plan(s, p, 1.0)
    assert [r.request_id for r in done] == ["b"] and b_finish(done) == 6.0
    p = s.schedule(6.0, 3)                     # capped by max_steps
    assert p.num_steps == 3
    run_plan(s, p, 6.0, steps=1)                # the backend stops after one step
    assert s.batch.reqs[0].num_output_tokens == 7
    # unused reservations were handed back: a holds what single steps would hold
    a = s.batch.reqs[0]
    assert a.num_computed_tokens == 10 and len(a.block_ids) == 3   # ceil(10 / 4)


def b_finish(done):
    return done[0].finish_time


def test_multi_step_limited_by_free_kv():
    s = Scheduler(SchedulerConfig(block_size=4, max_num_seqs=8, max_num_batched_tokens=64, enable_prefix_caching=False), 4)
    s.add_request(Request("a", 0.0, 4, 12))
    run_plan(s, s.schedule(0.0), 0.0)
    p = s.schedule(1.0, 100)                   # 4 blocks = 16 tokens: ctx 4 -> at most 12 more tokens
    assert p.num_steps == 11                    # 11 left -> horizon 11, KV for 4+11=15 tokens fits
    s2 = Scheduler(SchedulerConfig(block_size=4, max_num_seqs=8, max_num_batched_tokens=64, enable_prefix_caching=False), 3)
    s2.add_request(Request("a", 0.0, 4, 8))
    run_plan(s2, s2.schedule(0.0), 0.0)
    p2 = s2.schedule(1.0, 100)
    assert p2.num_steps == 7 and s2.blocks.num_used == 3


def test_spec_decode_tokens_and_cap():
    s = Scheduler(SchedulerConfig(block_size=4, max_num_seqs=8, max_num_batched_tokens=64, draft_len=2), 100)
    r = Request("a", 0.0, 4, 5)
    s.add_request(r)
    run_plan(s, s.schedule(0.0), 0.0)
    p = s.schedule(1.0, 10)
    assert p.num_steps == 2 and p.draft_len == 2 and p.num_batched_tokens == 3   # 4 left: (k-1)*3 < 4
    res = StepResult(np.ones(2), np.array([[3], [3]]))
    done = s.complete(p, res, 3.0)
    assert done == [r] and r.num_output_tokens == 5                               # 1 + 3 + 1 (drafts capped)
    assert res.decode_tokens.tolist() == [[3], [1]]                               # the result keeps what was delivered


def test_abort_waiting_and_running_and_finished_early():
    s = Scheduler(SchedulerConfig(block_size=4, max_num_seqs=8, max_num_batched_tokens=64), 100)
    a, b, c = Request("a", 0.0, 4, 10), Request("b", 0.0, 4, 10), Request("c", 0.0, 4, 10)
    for r in (a, b, c):
        s.add_request(r)
    assert s.abort("c") is c and c.status is RequestStatus.DROPPED and c.drop_reason == "aborted"
    p = s.schedule(0.0)
    assert s.abort("b") is b and b.status is RequestStatus.RUNNING   # in flight: dropped at complete()
    run_plan(s, p, 0.0)
    assert b.status is RequestStatus.DROPPED and s.num_running == 1
    p = s.schedule(1.0)
    done = run_plan(s, p, 1.0, early={"a"})
    assert done == [a] and a.num_output_tokens == 2 and a.status is RequestStatus.FINISHED
    assert not s.has_work and s.blocks.num_held == 0 and s.outstanding_tokens == 0
    assert s.abort("nope") is None


def test_preempts_latest_arrival_and_recomputes():
    s = Scheduler(SchedulerConfig(block_size=4, max_num_seqs=2, max_num_batched_tokens=64, enable_prefix_caching=False), 4)
    early, late = Request("e", 0.0, 6, 6), Request("l", 1.0, 6, 6)
    s.add_request(early)
    s.add_request(late)
    t = 0.0
    while s.has_work:
        p = s.schedule(t)
        if p.preempted:
            assert p.preempted == [late]
        run_plan(s, p, t)
        t += 1
    assert late.num_preemptions >= 1 and early.num_preemptions == 0
    assert late.num_output_tokens == 6 and early.num_output_tokens == 6


def test_request_counters_read_through_the_decode_batch():
    s = Scheduler(SchedulerConfig(block_size=4, max_num_seqs=8, max_num_batched_tokens=64), 100)
    r = Request("a", 0.0, 4, 10)
    s.add_request(r)
    run_plan(s, s.schedule(0.0), 0.0)
    assert r._batch is s.batch
    run_plan(s, s.schedule(1.0, 3), 1.0)
    assert r.num_output_tokens == 4 and r.num_computed_tokens == 7 and r.remaining_output == 6
    assert "num_output_tokens=4" in repr(r)


def test_simulator_plans_read_decode_contexts_lazily_and_only_while_in_flight():
    """The simulator's scheduler hands out decode contexts on demand: read between schedule() and
    complete() they equal the executor-mode (eager) plan's; a first read after complete() raises."""
    cfg = SchedulerConfig(block_size=16, max_num_batched_tokens=256, max_num_seqs=8)
    plans = {}
    for name_all in (True, False):
        s = Scheduler(cfg, 64, name_all_blocks=name_all)
        for i, (p, o) in enumerate([(40, 5), (7, 9), (100, 3)]):
            s.add_request(Request(f"r{i}", 0.0, p, o))
        seen = []
        t = 0.0
        while s.has_work:
            plan = s.schedule(t, max_steps=4)
            seen.append((plan.decode_context_lens.tolist(), plan.decode_context_sum, plan.num_steps))
            t += 0.01 * plan.num_steps
            s.complete(plan, StepResult(np.full(plan.num_steps, 0.01), np.ones((plan.num_steps, len(plan.decodes)), np.int64)), t)
        plans[name_all] = seen
        assert plan.decode_context_lens is not None   # read before complete(): kept
    assert plans[True] == plans[False] and any(len(c) > 1 for c, _, _ in plans[False])
    for ctx, total, _ in plans[False]:
        assert sum(ctx) == total
    s = Scheduler(cfg, 64, name_all_blocks=False)
    s.add_request(Request("a", 0.0, 10, 6))
    s.complete(p := s.schedule(0.0), StepResult(np.array([0.01]), np.zeros((1, 0), np.int64)), 0.01)
    late = s.schedule(0.01, max_steps=3)
    s.complete(late, StepResult(np.full(late.num_steps, 0.01), np.ones((late.num_steps, 1), np.int64)), 0.05)
    with pytest.raises(RuntimeError, match="between schedule"):
        late.decode_context_lens


def test_refusals_are_counted_by_what_they_share_not_each_requests_figures():
    """A run's drop counts once had one line per prompt length (`simulate --plan` printed one 'dropped 1: prompt_len
    + output_len = N exceeds max_model_len=4096' per refused request). A reason keeps the request's own figures after
    THIS_REQUEST; runs count refusals by what precedes it."""
    from scheduler.metrics import MetricsCollector
    from scheduler.request import drop_kind

    s = Scheduler(SchedulerConfig(block_size=4, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=100), 10)
    reqs = [Request(f"r{i}", 0.0, 100 + i, 20) for i in range(5)]   # no room for a first token: refused
    for r in reqs:
        assert not s.add_request(r)
    assert len({r.drop_reason for r in reqs}) == 5 and "(this request: 120 tokens)" in reqs[0].drop_reason
    assert {drop_kind(r.drop_reason) for r in reqs} == {"prompt_len + output_len exceeds max_model_len=100"}
    m = MetricsCollector()
    for r in reqs:
        m.on_drop(r)
    assert m._dropped == {"prompt_len + output_len exceeds max_model_len=100": 5}
