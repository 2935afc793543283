"""MetricsCollector: per-request latencies, ITL weighting, goodput, KV utilisation, step records."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.plan import ScheduledChunk, StepPlan, StepResult
from scheduler.request import Request, RequestStatus
from scheduler.metrics import SLO, LogHistogram, MetricsCollector, Stat


def _req(i, arrival, first, finish, out, prompt=100, cached=0, preempt=0):
    r = Request(f"r{i}", arrival, prompt, out)
    r.first_token_time, r.finish_time = first, finish
    r.num_output_tokens, r.num_cached_tokens, r.num_preemptions = out, cached, preempt
    return r


def _decode_plan(n, steps=1, draft=0):
    reqs = [Request(f"d{i}", 0.0, 10, 100) for i in range(n)]
    return StepPlan(instance_id=0, decodes=reqs, num_steps=steps, draft_len=draft)


def test_percentiles_hand_worked():
    # numpy linear interpolation on [1, 2, 3, 4]: p50 = 2.5, p90 = 1 + 0.9*3 = 3.7, p99 = 3.97
    s = Stat.of(np.array([4.0, 1.0, 3.0, 2.0]))
    assert (s.count, s.mean, s.p50) == (4, 2.5, 2.5)
    assert s.p90 == pytest.approx(3.7) and s.p99 == pytest.approx(3.97)
    assert Stat.of(np.zeros(0)) == Stat()


def test_request_latencies_and_throughput():
    c = MetricsCollector()
    # arrivals 0,1,2,3; TTFT 1,2,3,4; 11 outputs over 1 s after the first token -> TPOT 0.1
    for i in range(4):
        c.on_finish(_req(i, float(i), 2.0 * i + 1, 2.0 * i + 2, 11, prompt=100, cached=50 * (i % 2)))
    m = c.summarize(num_gpus=2, slo=None, duration_s=10.0)
    assert m.requests_finished == m.requests_arrived == 4 and m.requests_unfinished == 0
    assert (m.ttft_s.mean, m.ttft_s.p50) == (2.5, 2.5)
    assert m.tpot_s.mean == pytest.approx(0.1) and m.e2e_s.mean == pytest.approx(3.5)
    assert (m.input_tokens, m.output_tokens) == (400, 44)
    assert m.input_throughput == 40.0 and m.output_throughput == pytest.approx(4.4)
    assert m.total_throughput_per_gpu == pytest.approx(22.2)
    assert m.request_throughput == 0.4
    assert m.per_user_output_tps_mean == pytest.approx(10.0) and m.per_user_output_tps_p50 == pytest.approx(10.0)
    assert m.prefix_cache_hit_rate == pytest.approx(100 / 400)
    # default duration: first arrival (0) to last finish (8)
    assert c.summarize(1, None).duration_s == 8.0


def test_single_token_requests_have_no_tpot_and_pass_tpot_slo():
    c = MetricsCollector()
    c.on_finish(_req(0, 0.0, 0.5, 0.5, 1))
    m = c.summarize(1, SLO(ttft_s=1.0, tpot_s=0.01))
    assert m.tpot_s.count == 0 and m.requests_meeting_slo == 1


def test_goodput_counting():
    c = MetricsCollector()
    slo = SLO(ttft_s=1.0, tpot_s=0.05, e2e_s=10.0)
    c.on_finish(_req(0, 0.0, 0.5, 0.5 + 0.04 * 10, 11))   # meets all
    c.on_finish(_req(1, 0.0, 1.5, 1.5 + 0.04 * 10, 11))   # TTFT miss
    c.on_finish(_req(2, 0.0, 0.5, 0.5 + 0.06 * 10, 11))   # TPOT miss
    c.on_finish(_req(3, 0.0, 0.9, 0.9 + 0.049 * 200, 201))  # E2E 10.7 miss
    c.on_finish(_req(4, 0.0, 1.0, 1.0 + 0.05 * 10, 11))   # exactly on the bounds: meets
    dropped = Request("x", 0.0, 10, 10)
    dropped.drop_reason = "too_long"
    c.on_drop(dropped)
    c.on_arrival(Request("y", 0.0, 10, 10))  # 7 arrivals announced: 5 finished, 1 dropped, 1 unfinished
    for _ in range(6):
        c.on_arrival(Request("z", 0.0, 10, 10))
    m = c.summarize(1, slo, duration_s=20.0)
    assert m.requests_meeting_slo == 2 and m.goodput == pytest.approx(0.1)
    assert m.goodput_fraction == pytest.approx(2 / 7)
    assert m.requests_arrived == 7 and m.requests_dropped == 1 and m.requests_unfinished == 1
    assert m.dropped_by_reason == {"too_long": 1}


def test_itl_weighting_multi_step():
    c = MetricsCollector()
    plan = _decode_plan(3, steps=2)
    # step 0: 10 ms, 3 decodes; step 1: 30 ms, one request finished in step 0 (0 tokens)
    res = StepResult(np.array([0.01, 0.03]), np.array([[1, 1, 1], [1, 1, 0]]))
    c.on_step(0, 0.0, plan, res, 5, 10)
    m = c.summarize(1, None)
    assert m.itl_s.count == 5
    assert m.itl_s.mean == pytest.approx((3 * 0.01 + 2 * 0.03) / 5)
    assert m.itl_s.p50 == pytest.approx(0.01, rel=0.003) and m.itl_s.p90 == pytest.approx(0.03, rel=0.003)
    assert (m.num_plans, m.num_steps, m.decode_tokens) == (1, 2, 5)
    assert m.mean_batch_requests == 3.0 and m.busy_s == pytest.approx(0.04)


def test_itl_with_mtp_counts_step_over_n():
    c = MetricsCollector()
    plan = _decode_plan(2, steps=1, draft=1)
    res = StepResult(np.array([0.02]), np.array([[2, 1]]))  # request 0 accepted its draft
    c.on_step(0, 0.0, plan, res, 1, 10)
    m = c.summarize(1, None)
    assert m.itl_s.count == 3  # two gaps of 10 ms, one of 20 ms
    assert m.itl_s.mean == pytest.approx((2 * 0.01 + 0.02) / 3)
    assert m.itl_s.p50 == pytest.approx(0.01, rel=0.003)
    assert m.mean_batch_tokens == 4.0


def test_a_recompute_token_is_a_decode_token_whose_itl_spans_the_preemption():
    c = MetricsCollector()
    r = Request("r", 0.0, 100, 10)
    r.num_output_tokens = 4   # its 4th token came at t=1.0, when the plan that preempted it started
    c.on_step(0, 1.0, StepPlan(instance_id=0, decodes=[Request("d", 0.0, 5, 50)], preempted=[r]),
              StepResult(np.array([0.1])), 1, 10)
    # its recompute runs in two chunks (preempted again after the first); the second samples token 5 at t=3.5
    c.on_step(0, 2.0, StepPlan(instance_id=0, prefills=[ScheduledChunk(r, 60, 0, False)], preempted=[r]),
              StepResult(np.array([0.2])), 1, 10)
    fresh = Request("p", 0.0, 20, 10)   # a prompt's last chunk: its first token, not a decode token
    plan = StepPlan(instance_id=0, prefills=[ScheduledChunk(r, 104, 0, True), ScheduledChunk(fresh, 20, 0, True)])
    c.on_step(0, 3.0, plan, StepResult(np.array([0.5])), 1, 10)
    m = c.summarize(1, None)
    assert m.decode_tokens == 2 and m.itl_s.count == 2
    assert m.itl_s.mean == pytest.approx((0.1 + 2.5) / 2)


def test_decodes_waiting_behind_prompt_only_plans_count_the_wait_in_their_next_gap():
    """Prefill-first (``mixed_batches`` off): plans of prompts alone run while the decode batch waits; a request's next
    gap runs from its previous token (a preempted one's: the end of its last decode plan), the wait included."""
    c = MetricsCollector()
    a, b, new = Request("a", 0.0, 10, 100), Request("b", 0.0, 10, 100), Request("n", 0.0, 20, 100)
    c.on_step(0, 0.0, StepPlan(0, decodes=[a, b]), StepResult(np.array([0.1])), 1, 10)        # a, b: tokens at 0.1
    c.on_step(0, 0.1, StepPlan(0, prefills=[ScheduledChunk(new, 20, 0, True)]), StepResult(np.array([0.5])), 1, 10)
    a.num_output_tokens = 2
    # new's first token came at 0.6; b waited 0.5 for its next; a is preempted (its last token: 0.1)
    c.on_step(0, 0.6, StepPlan(0, decodes=[b, new], num_steps=2, preempted=[a]), StepResult(np.array([0.1, 0.1])), 1, 10)
    # a's recompute samples its next token at 1.1, 1.0 after its last; b and new wait 0.3
    c.on_step(0, 0.8, StepPlan(0, prefills=[ScheduledChunk(a, 12, 0, True)]), StepResult(np.array([0.3])), 1, 10)
    c.on_step(0, 1.1, StepPlan(0, decodes=[b, new, a]), StepResult(np.array([0.1])), 1, 10)
    m = c.summarize(1, None)
    gaps = [0.1, 0.1] + [0.6, 0.1, 0.1, 0.1] + [1.0] + [0.4, 0.4, 0.1]
    assert m.decode_tokens == m.itl_s.count == len(gaps)
    assert m.itl_s.mean == pytest.approx(sum(gaps) / len(gaps))
    assert m.itl_s.p99 == pytest.approx(float(np.percentile(gaps, 99)), rel=0.005)   # 0.6 + 0.91 x 0.4


def test_a_handed_over_request_s_first_decode_gap_spans_its_kv_transfer():
    """Disaggregated: a prefill instance made the first token; the first decode token's gap runs from it, through the
    KV transfer and the wait for a seat in the decode batch."""
    c = MetricsCollector()
    x, r = Request("x", 0.0, 10, 100), Request("r", 0.0, 10, 100)
    r.first_token_time = 1.0
    c.on_handover(1, r)   # queued at instance 1, waiting for a seat
    c.on_step(1, 2.0, StepPlan(1, decodes=[x]), StepResult(np.array([0.1])), 1, 10)
    r.status = RequestStatus.RUNNING   # seated: in the next plan
    c.on_step(1, 2.1, StepPlan(1, decodes=[x, r], num_steps=2), StepResult(np.array([0.1, 0.1])), 1, 10)
    m = c.summarize(1, None)
    gaps = [0.1, 0.1, 0.1, 1.2, 0.1]
    assert m.itl_s.count == len(gaps)
    assert m.itl_s.mean == pytest.approx(sum(gaps) / len(gaps))


def test_log_histogram_weighted_quantiles():
    # weights as counts: the samples 0.001 x3 and 0.1, numpy's linear interpolation between order statistics
    h = LogHistogram()
    h.add(np.array([0.001, 0.1]), np.array([3.0, 1.0]))
    assert h.quantile(0.5) == pytest.approx(0.001, rel=0.003)
    assert h.quantile(2 / 3) == pytest.approx(0.001, rel=0.003)
    assert h.quantile(0.75) == pytest.approx(0.001 + 0.25 * 0.099, rel=0.003)
    assert h.quantile(1.0) == pytest.approx(0.1, rel=0.003)
    assert LogHistogram().quantile(0.5) is None


@pytest.mark.parametrize("n", [1, 2, 3, 7, 50, 200, 5000])
def test_log_histogram_quantiles_are_numpys_percentiles_within_a_bin(n):
    """bench's ITL p99 (the histogram) was read against the same gaps' exact percentile (TTFT and TPOT's definition):
    with a few long gaps among many short ones (prompt steps among decodes) the smallest bin reaching the CDF read a
    sample of one mode where numpy interpolates across the gap (50 gaps: 227 ms against 126)."""
    rng = np.random.default_rng(n)
    x = np.concatenate([rng.normal(0.02, 0.001, n - n // 60), rng.normal(0.2, 0.02, n // 60)])
    h = LogHistogram()
    h.add(x, np.ones_like(x))
    for q in (0.0, 0.5, 0.9, 0.99, 1.0):
        assert h.quantile(q) == pytest.approx(float(np.percentile(x, 100 * q)), rel=0.003), q


def test_prefill_and_kv_accounting():
    c = MetricsCollector(record_steps=True, max_step_records=2)
    r = Request("p", 0.0, 1000, 10)
    plan = StepPlan(instance_id=1, prefills=[ScheduledChunk(r, 512, 0, False)], decodes=[Request("d", 0, 5, 5)])
    c.on_step(1, 0.0, plan, StepResult(np.array([0.1]), np.array([[1]])), 30, 100)
    c.on_step(2, 0.05, _decode_plan(1), StepResult(np.array([0.3]), np.array([[1]])), 90, 100)
    c.on_step(1, 0.1, _decode_plan(1), StepResult(np.array([0.1]), np.array([[1]])), 50, 100)
    m = c.summarize(1, None)
    assert m.computed_prefill_tokens == 512 and m.mean_batch_tokens == pytest.approx((513 + 1 + 1) / 3)
    assert m.kv_util_max == 0.9
    assert m.kv_util_mean == pytest.approx((0.3 * 0.1 + 0.9 * 0.3 + 0.5 * 0.1) / 0.5)
    # cluster timeline: (30)/100, (30+90)/200, (50+90)/200
    assert m.kv_timeline == [(0.0, 0.3), (0.05, 0.6), (0.1, 0.7)]
    assert len(c.step_records) == 2 and m.step_records_dropped == 1
    assert c.step_records[0].prefill_tokens == 512 and c.step_records[0].num_decodes == 1


def test_kv_timeline_is_capped():
    c = MetricsCollector(kv_timeline_points=100)
    plan = _decode_plan(1)
    for i in range(10_000):
        c.on_step(0, float(i), plan, StepResult(np.array([1.0]), np.array([[1]])), i % 97, 100)
    tl = c.summarize(1, None).kv_timeline
    assert 50 <= len(tl) <= 100
    assert [t for t, _ in tl] == sorted(t for t, _ in tl)
    assert max(v for _, v in tl) == pytest.approx(0.96)  # peaks survive downsampling


def test_summarize_is_deterministic():
    def run():
        c = MetricsCollector()
        rng = np.random.default_rng(0)
        for i in range(300):
            a = float(rng.random() * 10)
            c.on_finish(_req(i, a, a + rng.random(), a + 1 + rng.random(), int(rng.integers(1, 50))))
            c.on_step(i % 3, a, _decode_plan(2), StepResult(rng.random(1) * 0.05, np.ones((1, 2), int)), 5, 9)
        return c.summarize(8, SLO(ttft_s=0.5, tpot_s=0.05)).model_dump_json()

    assert run() == run()
