"""Host/engine profiles (issue 17): each engine style's host step time and the share of it async overlap hides.

The overlap rule stays one function (costmodels.host.wall_time); a profile only sets its inputs. Checked here:
the partial-overlap arithmetic by hand, every profile sourced and in range, presets picking their engine's
profile under explicit fields, field-named errors, the simulator pricing a plan with the profile's share, and the
default configuration's dump (and so the default digest) untouched.
"""

from __future__ import annotations

import numpy as np
import pytest

from costmodels.host import D_REF, HOST_PROFILES, exposed_host, host_profile, wall_time
from scheduler.config import SCHEDULER_PRESETS, SchedulerConfig
from twinfer.config import validate
from twinfer.errors import TwinferError


def test_partial_overlap_by_hand():
    # hides 0.25 of 4 ms host under a 3 ms device step: max(3, 1) + 3 = 6 ms; a 0.5 ms device step: max(0.5, 1) + 3
    assert wall_time(3e-3, 4e-3, 0.25) == pytest.approx(6e-3)
    assert wall_time(0.5e-3, 4e-3, 0.25) == pytest.approx(4e-3)
    assert exposed_host(3e-3, 4e-3, 0.25) == pytest.approx(3e-3)
    # the ends of the range are the two old rules, bit for bit
    for d, h in ((3e-3, 4e-3), (5e-3, 1e-3)):
        assert wall_time(d, h, 1.0) == wall_time(d, h, True) == max(d, h)
        assert wall_time(d, h, False) == wall_time(d, h, 0) == d + h
        assert exposed_host(d, h, True) == max(0.0, h - d) and exposed_host(d, h, False) == h
    # arrays, with a cold first step (nothing hides before the device has work)
    w = wall_time(np.array([3e-3, 3e-3, 0.5e-3]), 4e-3, 0.25, cold_start=True)
    assert w == pytest.approx([7e-3, 6e-3, 4e-3])


def test_every_profile_is_sourced_and_in_range():
    assert {"twinfer-default", "twinfer-executor-measured", "vllm-v0", "vllm-v1", "sglang", "trtllm"} <= set(HOST_PROFILES)
    for name, p in HOST_PROFILES.items():
        assert p.step_s > 0 and p.per_request_s > 0 and p.per_token_s > 0, name
        assert 0 < p.overlap_hides <= 1, name
        assert len(p.source) > 80, name   # a sentence naming where the figures come from
    d = HOST_PROFILES["twinfer-default"]
    assert (d.step_s, d.per_request_s, d.per_token_s, d.overlap_hides) == (2.0e-3, 20e-6, 0.5e-6, 1.0)
    # the published shares the profiles encode, at their reference decode step (128 requests, D_REF 12 ms)
    host = {n: p.at(128, 128) for n, p in HOST_PROFILES.items()}
    assert host["vllm-v0"] > host["vllm-v1"] > host["sglang"]
    with pytest.raises(ValueError, match="host_profile 'tgi': expected one of twinfer-default"):
        host_profile("tgi")


def test_presets_pick_their_engines_profile_under_explicit_fields():
    engine_of = {"vllm-v0": "vllm-v0", "vllm-v1": "vllm-v1", "sglang": "sglang", "trtllm-attention-dp": "trtllm"}
    assert set(engine_of) == set(SCHEDULER_PRESETS)
    for preset, engine in engine_of.items():
        c = SchedulerConfig(preset=preset)
        p = HOST_PROFILES[engine]
        assert c.host_profile == engine
        assert (c.host_step_s, c.host_per_request_s, c.host_per_token_s, c.async_overlap_hides) == \
            (p.step_s, p.per_request_s, p.per_token_s, p.overlap_hides)
    c = SchedulerConfig(preset="vllm-v0", host_per_request_s=1e-6, async_overlap=True)
    assert c.host_per_request_s == 1e-6 and c.host_step_s == HOST_PROFILES["vllm-v0"].step_s
    assert c.overlap() == 0.25
    c = SchedulerConfig(preset="sglang", host_profile="twinfer-executor-measured")   # a profile of its own
    assert c.host_step_s == HOST_PROFILES["twinfer-executor-measured"].step_s and not c.mixed_batches
    assert SchedulerConfig(host_profile="vllm-v0", async_overlap=False).overlap() is False
    assert SchedulerConfig().overlap() is True


def test_bad_values_name_the_field():
    with pytest.raises(TwinferError, match=r"scheduler: host_profile: Input should be 'twinfer-default'"):
        validate(SchedulerConfig, {"host_profile": "tgi"}, "scheduler")
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(TwinferError, match="async_overlap_hides"):
            validate(SchedulerConfig, {"async_overlap_hides": bad}, "scheduler")


def test_default_dump_has_no_new_keys_and_a_profile_dump_loads_back():
    d = SchedulerConfig().model_dump()
    assert "host_profile" not in d and "async_overlap_hides" not in d   # default digest unchanged
    c = SchedulerConfig(preset="vllm-v0")
    again = SchedulerConfig.model_validate(c.model_dump())
    assert again == c and again.model_dump()["host_profile"] == "vllm-v0"


def test_the_simulator_prices_a_plan_with_the_profiles_share():
    from scheduler.plan import ScheduledChunk, StepPlan
    from scheduler.request import Request
    from sim.backend import SimBackend, host_coeffs

    class FlatCost:   # 3 ms per decode step, 5 ms per mixed step, whatever the batch
        num_layers = 1

        def decode_times(self, ctx, steps, draft_len=0):
            return np.full(steps, 3e-3)

        def chunked_step_time(self, ctx, draft_len, new, cached):
            return 5e-3

    reqs = [Request(f"r{i}", 0.0, 100, 10) for i in range(8)]
    plan = StepPlan(0, [ScheduledChunk(reqs[0], 64, 0, False)], reqs[1:], np.full(7, 100), 1)
    for name, ov in (("vllm-v0", True), ("vllm-v0", False), ("vllm-v1", True), ("twinfer-default", True)):
        sc = SchedulerConfig(host_profile=name, async_overlap=ov)
        be = SimBackend(FlatCost(), np.random.default_rng(0), async_overlap=sc.async_overlap, host_coeffs=host_coeffs(sc))
        host = be.host_time(plan)
        assert host == pytest.approx(sc.host_overhead_s(8, 64 + 7))
        expect = wall_time(5e-3, host, sc.overlap())
        assert be.step_times(plan)[0] == pytest.approx(expect)
        if name == "vllm-v0" and ov:   # 0.25 hidden: max(5, h/4) + 3h/4 by hand
            assert expect == pytest.approx(max(5e-3, host / 4) + 0.75 * host)


@pytest.mark.parametrize("name,published", [("vllm-v1", 0.308), ("sglang", 0.10), ("vllm-v0", 0.12)])
def test_profiles_reproduce_their_published_overlap_gain_at_the_reference_step(name, published):
    """Each sourced profile, at the reference decode step its figures were scaled by (128 requests, D_REF), gains
    from async overlap what its source measured: vLLM V1 async scheduling +30.8% (vllm PR #32618), SGLang's
    zero-overhead scheduler 1.1x (SGLang v0.4 blog), vLLM v0's async output processor +12% (vllm PR #7049)."""
    p = HOST_PROFILES[name]
    h = p.at(128, 128)
    gain = (D_REF + h) / wall_time(D_REF, h, p.overlap_hides) - 1
    assert gain == pytest.approx(published, abs=0.03)


def test_simulate_with_a_preset_uses_its_profile():
    """`twinfer simulate` on a scenario with a preset: the scenario's scheduler carries the engine's host terms,
    and the result moves with them (vLLM V1's lighter host step, overlap off: more tokens/s than the default)."""
    from sim.runner import simulate
    from sim.scenario import scenario_from_dict

    base = {"model": "qwen3-30b-a3b", "hardware": "H200", "layout": {"tp": 1},
            "workload": {"preset": "chat", "num_requests": 24, "rate": 1000.0}}
    tput = {}
    for preset in (None, "vllm-v1"):
        sched = {"async_overlap": False, **({"preset": preset} if preset else {})}
        sc = scenario_from_dict({**base, "scheduler": sched})
        assert sc.scheduler.host_profile == preset
        if preset:
            assert sc.scheduler.host_step_s == HOST_PROFILES["vllm-v1"].step_s
        tput[preset] = simulate(sc).result.metrics.output_throughput
    assert tput["vllm-v1"] > tput[None]
