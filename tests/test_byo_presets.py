"""Scheduler presets of other engines: each one's defining behaviour, on the real Scheduler and through a scenario."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scheduler.config import SCHEDULER_PRESETS, SchedulerConfig
from scheduler.plan import StepResult
from scheduler.request import Request
from scheduler.scheduler import Scheduler

BUDGET = 256


def drive(cfg: SchedulerConfig, reqs: list[Request], num_blocks: int = 4096, name_all_blocks: bool = False):
    """Run ``reqs`` (arriving at their arrival times) to the end; one row per plan:
    (prompt chunks as (request, new tokens, prompt length), number of decodes, steps)."""
    s = Scheduler(cfg, num_blocks, name_all_blocks=name_all_blocks)
    pending = sorted(reqs, key=lambda r: r.arrival_time)
    now, rows, finished = 0.0, [], 0
    while pending or s.has_work:
        while pending and pending[0].arrival_time <= now:
            assert s.add_request(pending.pop(0))
        plan = s.schedule(now, max_steps=4)
        if not plan.prefills and not plan.decodes:
            now = pending[0].arrival_time
            continue
        rows.append(([(c.request.request_id, c.num_new_tokens, c.request.prompt_len) for c in plan.prefills], len(plan.decodes), plan.num_steps))
        k, nd = plan.num_steps, len(plan.decodes)
        finished += len(s.complete(plan, StepResult(step_durations=np.ones(k), decode_tokens=np.ones((k, nd), np.int64)), now + k))
        now += k
    assert finished == len(reqs)
    return rows


def workload(long_prompt: bool) -> list[Request]:
    """Prompts of 60-230 tokens (each fits the 256-token budget alone, two often do not) arriving while others decode."""
    rng = np.random.default_rng(7)
    reqs = [Request(f"r{i}", 2.0 * i, int(rng.integers(60, 230)), int(rng.integers(5, 30))) for i in range(40)]
    if long_prompt:
        reqs.append(Request("long", 11.0, 3 * BUDGET + 17, 10))  # only a chunking scheduler can take it
    return reqs


def cfg(preset: str | None, **kw) -> SchedulerConfig:
    return SchedulerConfig(preset=preset, block_size=16, max_num_seqs=16, max_num_batched_tokens=BUDGET, **kw)


def mixed(rows) -> list:
    return [r for r in rows if r[0] and r[1]]


def split_prompts(rows) -> set[str]:
    """Requests whose prompt took more than one chunk."""
    return {rid for chunks, _, _ in rows for rid, new, plen in chunks if new < plen}


@pytest.mark.parametrize("name_all_blocks", [False, True])
def test_vllm_v0_never_mixes_prefills_with_decodes_and_never_splits_a_prompt(name_all_blocks):
    rows = drive(cfg("vllm-v0"), workload(long_prompt=False), name_all_blocks=name_all_blocks)
    assert not mixed(rows)                                     # the defining rule: no plan has both
    assert any(d for _, d, _ in rows) and any(c for c, _, _ in rows)
    assert not split_prompts(rows)
    # prefill-first: while a prompt waits and can start, decodes wait (a prompt-only plan follows a decode plan)
    assert any(rows[i][1] and rows[i + 1][0] and not rows[i + 1][1] for i in range(len(rows) - 1))
    assert all(sum(n for _, n, _ in c) <= BUDGET for c, _, _ in rows)


def test_the_same_workload_mixes_under_vllm_v1_and_the_default():
    for preset in ("vllm-v1", None):
        rows = drive(cfg(preset), workload(long_prompt=True))
        assert mixed(rows), preset                             # decodes and prompt chunks share steps
        assert "long" in split_prompts(rows)                   # chunked prefill


def test_sglang_is_prefill_first_but_chunks_prompts():
    rows = drive(cfg("sglang"), workload(long_prompt=True))
    assert not mixed(rows) and "long" in split_prompts(rows)
    assert SchedulerConfig(preset="sglang").async_overlap      # overlap scheduler on by default


def test_trtllm_mixes_whole_prompts_with_decodes():
    rows = drive(cfg("trtllm-attention-dp"), workload(long_prompt=False))
    assert mixed(rows) and not split_prompts(rows)
    # a prompt longer than the token budget cannot be served without chunking: refused up front
    s = Scheduler(cfg("trtllm-attention-dp"), 4096)
    assert "chunked prefill is off" in s.refusal_reason(Request("long", 0.0, 3 * BUDGET, 4))


def test_preset_fills_only_unset_knobs():
    for name, knobs in SCHEDULER_PRESETS.items():
        sc = SchedulerConfig(preset=name)
        assert all(getattr(sc, k) == v for k, v in knobs.items()), name
    sc = SchedulerConfig(preset="vllm-v0", enable_chunked_prefill=True)
    assert sc.enable_chunked_prefill and not sc.mixed_batches  # the explicit field wins, the rest still apply
    assert SchedulerConfig.model_validate(sc.model_dump()) == sc  # a printed scenario loads back the same


def test_trtllm_attention_dp_shares_host_work_over_the_dp_ranks():
    from sim.scenario import scenario_from_dict
    from twinfer.errors import TwinferError

    base = {"model": "qwen3-30b-a3b", "hardware": "H200", "workload": {"preset": "chat", "num_requests": 10}}
    sc = scenario_from_dict({**base, "layout": {"dp": 4, "ep": 4}, "scheduler": {"preset": "trtllm-attention-dp"}})
    assert sc.scheduler.host_workers == 4
    sc = scenario_from_dict({**base, "layout": {"dp": 4, "ep": 4}, "scheduler": {"preset": "trtllm-attention-dp", "host_workers": 2}})
    assert sc.scheduler.host_workers == 2
    with pytest.raises(TwinferError, match="layout.dp >= 2"):
        scenario_from_dict({**base, "layout": {"tp": 4}, "scheduler": {"preset": "trtllm-attention-dp"}})


def test_the_peer_scenario_runs_and_its_policy_moves_the_result():
    from sim.runner import simulate
    from sim.scenario import load_scenario

    path = Path(__file__).resolve().parents[1] / "docs" / "peer" / "vidur-codellama34b-a100" / "scenario.yaml"
    sc = load_scenario(path)
    assert sc.layout.weight_dtype == "bf16" and sc.scheduler.preset == "vllm-v0" and not sc.scheduler.mixed_batches
    v0 = simulate(sc).result.metrics
    v1 = simulate(sc.model_copy(update={"scheduler": SchedulerConfig.model_validate(
        {**sc.scheduler.model_dump(exclude={"preset", "mixed_batches", "enable_chunked_prefill", "async_overlap"}), "preset": "vllm-v1"})})).result.metrics
    assert v0.requests_finished == v1.requests_finished == 256
    assert v0.tpot_s.mean != v1.tpot_s.mean
