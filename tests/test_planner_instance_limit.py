"""A plan never holds a pool of more instances than a simulation does (sim.scenario.MAX_INSTANCES): 100,000 x H200
recommended '50000 x TP2' for Llama-3.1-70B, a plan file `twinfer simulate --plan` refuses, and DeepSeek-V3 on
100,000 x GB300 ended in 'internal error: ValidationError ... prefill_instances' after two minutes of simulation."""

from __future__ import annotations

import pytest

from planner.request import PlanRequest
from planner.search import plan_deployment
from sim.scenario import MAX_INSTANCES
from sim.workload import preset
from twinfer.errors import TwinferError


def request(model: str, gpus: int, **kw) -> PlanRequest:
    return PlanRequest.model_validate(dict(model=model, hardware="h200", gpus=gpus, workload=preset("chat"),
                                           slo={"ttft_s": 2.0, "tpot_s": 0.05}, simulate_top=0, **kw))


def test_every_pool_of_a_huge_budget_is_one_a_simulation_holds():
    for modes in (("aggregated",), ("disaggregated",)):   # was 45,728 x TP1 prefill + 848 x DP64 decode
        rep = plan_deployment(request("llama-3.1-8b", 100_000, space={"modes": modes}), workers=1)
        assert rep.status == "ok"
        assert all(pool.instances <= MAX_INSTANCES for pool in rep.recommended.pools), rep.message


def test_a_budget_no_deployment_can_hold_names_the_field_and_the_most_allowed():
    with pytest.raises(TwinferError, match=r"^gpus: 100,000 GPUs .* more than 4,096 instances .* plan at most 32,768 GPUs"):
        plan_deployment(request("llama-3.1-70b", 100_000), workers=1)
