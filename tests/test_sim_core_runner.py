"""Scenario loading, run_scenario determinism and digests, the default scenario, capacity."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.metrics import MetricsCollector
from sim.export import to_json
from sim.runner import estimate_capacity, run_scenario, scenario_requests, simulate
from sim.scenario import Scenario, builtin_scenario, load_scenario, scenario_from_dict
from twinfer.errors import DoesNotFitError, TwinferError


def small(n: int = 150, **updates) -> Scenario:
    """The default scenario shrunk to ``n`` requests (arriving at its rate)."""
    data = builtin_scenario("default").model_dump(mode="json", exclude_none=True)
    data["workload"]["num_requests"] = n
    data.update(updates)
    return Scenario.model_validate(data)


def test_default_scenario_is_deepseek_on_8xh200_at_70pct_of_capacity():
    s = builtin_scenario()
    assert (s.model, s.hardware, s.layout.gpus, s.layout.weight_dtype) == ("deepseek-v3", "H200", 8, "fp8")
    assert 1500 <= s.workload.num_requests <= 3000
    cap = estimate_capacity(s)
    assert 0.6 <= s.workload.rate / cap.requests_per_s <= 0.8, cap.explanation


def test_run_finishes_everything_and_is_byte_identical_per_seed():
    a, b = run_scenario(small()), run_scenario(small())
    assert a.metrics.requests_finished == 150 and a.metrics.requests_dropped == 0
    assert a.digest == b.digest and len(a.digest) == 64
    assert to_json(a) == to_json(b)
    assert a.seed == 0 and a.twinfer_version and a.scenario["model"] == "deepseek-v3"
    c = run_scenario(small(seed=1))
    assert c.digest != a.digest


def test_digest_covers_config_not_only_metrics():
    a = run_scenario(small(60))
    b = run_scenario(small(60, name="renamed"))
    assert a.metrics == b.metrics and a.digest != b.digest


def test_time_and_latencies_are_sane():
    run = simulate(small(100))
    for r in run.requests:
        assert r.arrival_time <= r.first_scheduled_time <= r.first_token_time <= r.finish_time
        assert r.num_output_tokens == r.output_len
    m = run.result.metrics
    assert 0 < m.ttft_s.p50 < 5 and 0.01 < m.tpot_s.p50 < 0.5
    assert m.output_tokens == sum(r.output_len for r in run.requests)


def test_multi_instance_routers_all_finish():
    for router in ("round_robin", "least_outstanding", "prefix_aware"):
        res = run_scenario(small(120, instances=3, router={"kind": router}))
        assert res.metrics.requests_finished == 120 and res.num_gpus == 24


@pytest.mark.parametrize("data, needle", [
    ({"scheduler": {"max_num_seqs": 0}}, "scheduler.max_num_seqs"),
    ({"layout": {"tp": 3, "ep": 2}}, "layout"),
    ({"model": "gpt-17"}, "model"),
    ({"hardware": "Z9000"}, "hardware"),
    ({"instances": 0}, "instances"),
    ({"workload": {"kind": "poisson", "rate": -1, "num_requests": 5}}, "workload.rate"),
    ({"router": "random"}, "router"),
    ({"scheduler": {"draft_len": 1, "acceptance_rates": [1.2]}}, "scheduler"),
    ({"typo_field": 1}, "typo_field"),
    ({"slo": {"ttft_s": 0, "tpot_s": 0.1}}, "slo.ttft_s"),
])
def test_bad_scenarios_name_the_field(tmp_path, data, needle):
    base = {"workload": {"preset": "chat", "rate": 1.0, "num_requests": 10}}
    base.update(data)
    f = tmp_path / "s.yaml"
    import yaml

    f.write_text(yaml.safe_dump(base))
    with pytest.raises(TwinferError) as e:
        load_scenario(f)
    assert needle in str(e.value) and str(f) in str(e.value)


def test_bad_files():
    with pytest.raises(TwinferError, match="no such file"):
        load_scenario("/nonexistent/s.yaml")
    with pytest.raises(TwinferError, match="mtp"):
        scenario_from_dict({"model": "llama-3.1-8b", "scheduler": {"draft_len": 1},
                            "workload": {"preset": "chat", "rate": 1.0, "num_requests": 5}})


def test_layout_that_does_not_fit_says_so():
    s = small(10, layout={"tp": 1, "weight_dtype": "fp8"})
    with pytest.raises(DoesNotFitError, match="does not fit"):
        run_scenario(s)


def test_requests_that_never_fit_are_dropped_with_reason():
    s = small(50, scheduler={"max_num_seqs": 256, "max_num_batched_tokens": 8192, "max_model_len": 1024})
    m = run_scenario(s).metrics
    assert m.requests_dropped > 0 and m.requests_dropped + m.requests_finished == 50
    assert all("max_model_len" in k for k in m.dropped_by_reason)


def test_memoised_decode_times_match_the_cost_model():
    from sim.backend import MemoStepCost
    from sim.runner import build_cost_model

    cm = build_cost_model(builtin_scenario())
    memo = MemoStepCost(cm)
    assert memo.sum_only
    rng = np.random.default_rng(0)
    for _ in range(20):
        n, d, k = int(rng.integers(1, 257)), int(rng.integers(0, 3)), int(rng.integers(1, 600))
        ctx = rng.integers(1, 30000, n)
        np.testing.assert_allclose(memo.decode_times(ctx, k, d), cm.decode_times(ctx, k, d), rtol=1e-5)


@pytest.mark.parametrize("sched, mem", [
    ({"draft_len": 2}, 0.9),                                                    # MTP: drafts past a last token
    ({"draft_len": 8}, 0.9),
    ({"enable_prefix_caching": False}, 0.6),                                    # KV pressure: preemptions
    ({"enable_prefix_caching": False, "draft_len": 3}, 0.6),
    ({"enable_prefix_caching": False, "draft_len": 3, "async_overlap": False}, 0.6),   # the unpipelined loop
    # prefill-first (SGLang, vLLM v0): the decodes wait while prompt-only plans run
    ({"mixed_batches": False}, 0.9),
    ({"mixed_batches": False, "async_overlap": False}, 0.9),
    ({"mixed_batches": False, "draft_len": 2}, 0.9),
    ({"mixed_batches": False, "enable_prefix_caching": False}, 0.6),
    ({"mixed_batches": False, "enable_prefix_caching": False, "draft_len": 3, "async_overlap": False}, 0.6),
])
def test_every_output_token_after_the_first_is_one_decode_token_and_one_itl_gap(sched, mem):
    data = small(160).model_dump(mode="json", exclude_none=True)
    data["scheduler"].update(sched)
    run = simulate(Scenario.model_validate(data).model_copy(update={"gpu_memory_fraction": mem}))
    m = run.result.metrics
    assert (m.preemptions > 0) == (mem < 0.9)
    assert m.decode_tokens + m.requests_finished == m.output_tokens
    assert m.itl_s.count == m.decode_tokens
    # each gap is the time since the request's previous token (across a preemption or prompt-only plans too): they add up to its stream
    streamed = sum(r.finish_time - r.first_token_time for r in run.requests)
    assert m.itl_s.mean * m.itl_s.count == pytest.approx(streamed, rel=1e-9)


class _StreamCollector(MetricsCollector):
    """The collector, keeping every ITL sample it adds, next to the gaps a reader of each request's stream sees,
    followed token by token from the plans (one update per request per step: slow, plain)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.added, self.streamed, self._last = [], [], {}
        add = self._itl.add
        self._itl.add = lambda v, w: (self.added.append((np.ravel(v).copy(), np.ravel(w).copy())), add(v, w))

    def on_step(self, iid, start, plan, result, used, total):
        super().on_step(iid, start, plan, result, used, total)
        ends = start + np.cumsum(result.step_durations)
        tok = result.decode_tokens
        for j, r in enumerate(plan.decodes):
            last = self._last[r]
            for s, end in enumerate(ends.tolist()):
                n = 1 if tok is None else int(tok[s, j])
                if n:
                    self.streamed += [(end - last) / n] * n   # (a step's tokens share its gap evenly)
                    last = end
            self._last[r] = last
        for c in plan.prefills:
            if c.is_last_chunk:
                if c.request in self._last:   # a recompute's token
                    self.streamed.append(ends[0] - self._last[c.request])
                self._last[c.request] = ends[0]

    def samples(self) -> np.ndarray:
        self._flush_itl()
        v, w = (np.concatenate(x) for x in zip(*self.added))
        return np.sort(np.repeat(v, w.astype(np.int64)))


@pytest.mark.parametrize("sched", [
    {"mixed_batches": False},
    {"mixed_batches": False, "draft_len": 3},
    {"mixed_batches": False, "draft_len": 3, "async_overlap": False},
    {"draft_len": 3},
])
def test_each_itl_sample_is_the_gap_since_the_request_s_previous_token(sched, monkeypatch):
    import sim.runner
    data = small(160).model_dump(mode="json", exclude_none=True)
    data["scheduler"].update(sched, enable_prefix_caching=False)
    monkeypatch.setattr(sim.runner, "MetricsCollector", _StreamCollector)
    run = simulate(Scenario.model_validate(data).model_copy(update={"gpu_memory_fraction": 0.6}), debug=False)
    assert run.result.metrics.preemptions > 0
    col = run.collector
    np.testing.assert_allclose(col.samples(), np.sort(col.streamed), rtol=0, atol=1e-12)


@pytest.mark.parametrize("pools", ["one", "disagg"])
def test_requests_past_the_models_context_are_refused_as_the_executor_refuses_them(pools):
    """Qwen3-30B-A3B reads 40,960 tokens (max_position_embeddings). The executor's engine caps max_model_len there;
    the simulator once served 60k-token prompts on it (the scheduler's default 131,072) while `twinfer cost` warned
    the same request was past the model's context. A prompt that fits has its output cut at the window, as the
    executor cuts it (it was refused)."""
    lens = [60_000, 20_000, 40_900]  # prompt + 100 output: over, under, prompt fits and 60 of its outputs
    data = {"model": "qwen3-30b-a3b", "hardware": "H100", "layout": {"tp": 1},
            "workload": {"kind": "poisson", "rate": 0.1, "num_requests": 3,
                         "input_len": {"kind": "fixed", "value": 1000}, "output_len": {"kind": "fixed", "value": 100}}}
    if pools == "disagg":
        data["disagg"] = {"prefill_layout": {"tp": 1}}
    sc = Scenario.model_validate(data)
    reqs = scenario_requests(sc)
    for r, n in zip(reqs, lens):
        r.prompt_len = n
    run = simulate(sc, requests=reqs)
    m = run.result.metrics
    assert (m.requests_finished, m.requests_dropped) == (2, 1), m.dropped_by_reason
    assert all("max_model_len=40960" in why for why in m.dropped_by_reason), m.dropped_by_reason
    assert m.output_tokens == 100 + 60


def test_the_default_max_model_len_is_the_models_context_above_131072():
    """DeepSeek-V3 reads 163,840 tokens (max_position_embeddings). The scheduler's default max_model_len was 131,072,
    so the simulator, the planner's slices and plans dropped every 150k-token prompt a DeepSeek-V3 engine (vLLM,
    SGLang: max_model_len defaults to the model's context) serves. Unset, it is the model's context now."""
    lens = [150_000, 170_000]   # + 100 output: within DeepSeek-V3's context, past it
    sc = Scenario.model_validate({
        "model": "deepseek-v3", "hardware": "h200", "layout": {"tp": 8},
        "workload": {"kind": "poisson", "rate": 0.05, "num_requests": 2,
                     "input_len": {"kind": "fixed", "value": 1000}, "output_len": {"kind": "fixed", "value": 100}}})
    assert sc.scheduler.max_model_len is None
    reqs = scenario_requests(sc)
    for r, n in zip(reqs, lens):
        r.prompt_len = n
    m = simulate(sc, requests=reqs).result.metrics
    assert (m.requests_finished, m.requests_dropped) == (1, 1), m.dropped_by_reason
    assert all("max_model_len=163840" in why for why in m.dropped_by_reason), m.dropped_by_reason
