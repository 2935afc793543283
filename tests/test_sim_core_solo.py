"""The one-instance loop without simpy (sim.solo) gives the simpy cluster's results, byte for byte."""

from __future__ import annotations

import pytest

from sim.runner import simulate
from sim.scenario import Scenario, builtin_scenario


def scenario(n: int, mem: float = 0.9, workload: dict | None = None, **sched) -> Scenario:
    data = builtin_scenario().model_dump(mode="json", exclude_none=True)
    data["workload"]["num_requests"] = n
    data["workload"].update(workload or {})
    data["scheduler"].update(sched)
    data["gpu_memory_fraction"] = mem
    return Scenario.model_validate(data)


@pytest.mark.parametrize("sc", [
    scenario(300),                                                   # the default scenario
    scenario(150, draft_len=2),                                      # MTP drafts: drawn, rewound on cuts
    scenario(200, mem=0.6, enable_prefix_caching=False),             # KV pressure: preemptions
    scenario(150, workload={"rate": 100.0}),                         # overload: long queues
    scenario(100, workload={"rate": 0.3}),                           # idle gaps: the instance sleeps and wakes
    scenario(150, max_model_len=1500),                               # drops at admission
    scenario(150, workload={"kind": "agentic", "preset": "agentic", "rate": 3.0}),  # prefix hits
    scenario(150, workload={"kind": "gamma", "cv": 4.0, "rate": 6.0}),              # bursts
    scenario(100, workload={"kind": "constant", "rate": 4.0}, max_num_seqs=8),      # seats run out
], ids=["default", "drafts", "preempt", "overload", "idle", "drops", "agentic", "bursty", "seats"])
def test_solo_loop_equals_simpy(sc):
    fast, ref = simulate(sc), simulate(sc, engine="simpy")
    assert fast.result.model_dump_json() == ref.result.model_dump_json()
    key = lambda r: (r.first_scheduled_time, r.first_token_time, r.finish_time, r.num_preemptions, r.status)  # noqa: E731
    assert [key(r) for r in fast.requests] == [key(r) for r in ref.requests]


def test_unknown_engine_is_an_error():
    with pytest.raises(ValueError, match="engine"):
        simulate(scenario(10), engine="fast")
