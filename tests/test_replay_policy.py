"""Per-layer sliding-window replay policy: arithmetic by hand, pricing through the step model, scheduler token counts."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from pydantic import ValidationError

from costmodels.batch import BatchShape
from costmodels.catalog import get_model
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.memory import kv_rates
from costmodels.replay import (
    ReplayPolicy, chunk_cost, compare_policies, effective_replay_policy, kept_window_bytes, one_layer_policies,
    shipped_replay_policy, window_layers,
)
from costmodels.step import StepCostModel
from scheduler.config import SchedulerConfig
from scheduler.plan import StepResult
from scheduler.request import Request
from scheduler.scheduler import Scheduler
from twinfer.errors import TwinferError

V4 = get_model("deepseek-v4-flash")
LAYERS = V4.num_layers  # 43: 0-1 sliding, 2-42 csa/hca alternating (each also attends a 128-token window)


@pytest.fixture(scope="module")
def cost() -> StepCostModel:
    lay = ParallelLayout(tp=1, dp=4, ep=4, weight_dtype="fp8", expert_dtype="fp4", kv_dtype="fp4")
    return StepCostModel(V4, get_hardware("gb300"), lay)


def resolved(**kw):
    return ReplayPolicy(**kw).resolve(V4)


# ------------------------------------------------------------------ arithmetic by hand
def test_tokens_each_layer_recomputes_and_carries():
    assert window_layers(V4) == set(range(LAYERS))
    c = 1000
    # one layer recomputing: it and every layer below it carry the whole context (their outputs are its inputs)
    e = resolved(layers={20: "recompute"}).extra_tokens(c)
    assert e[:21].tolist() == [1000] * 21 and e[21:].tolist() == [0] * 22
    # bounded replay of layer 20 and a recompute of layer 5: layers 0-5 carry 1000, 6-20 carry 64, the rest none
    e = resolved(layers={20: "replay:64", 5: "recompute"}).extra_tokens(c)
    assert e[:6].tolist() == [1000] * 6 and e[6:21].tolist() == [64] * 15 and not e[21:].any()
    # replay W=128 of the sliding layers (0, 1): only they re-run W tokens
    r = resolved(kinds={"sliding": "replay"})
    assert r.layer_tokens(c).tolist() == [128, 128] + [0] * 41
    assert r.extra_tokens(c).tolist() == [128, 128] + [0] * 41
    # the top layer (42, csa) decides for all: its replay is W tokens through every layer
    assert resolved(kinds={"csa": "replay:32"}).extra_tokens(c).tolist() == [32] * LAYERS
    # W clipped to the context; nothing to resume at context 0
    assert resolved(default="replay:128").extra_tokens(50).tolist() == [50] * LAYERS
    assert resolved(default="recompute").extra_tokens(0).tolist() == [0] * LAYERS
    for kw in ({}, {"default": "replay:64"}, {"layers": {3: "recompute"}}, {"layers": {7: "replay:300"}, "kinds": {"hca": "replay:10"}}):
        r = resolved(**kw)
        for ctx in (0, 1, 63, 64, 500, 10_000):
            assert r.carried_tokens(ctx) == int(r.extra_tokens(ctx)[0])   # closed form = suffix max at layer 0


def test_window_bytes_kept_per_sequence_by_hand():
    # V4-Flash FP4 window entry: 448 latent values x 0.5 B + 448/32 one-byte scales + 64 BF16 rope values = 366 B
    entry = 448 * 0.5 + math.ceil(448 / 32) * 1.0 + 64 * 2.0
    per_layer = entry * 128
    assert per_layer == 46_848
    full = kv_rates(V4, "fp4")[1]
    assert full == pytest.approx(LAYERS * per_layer)
    assert kept_window_bytes(V4, "fp4", resolved()) == pytest.approx(full)
    assert kept_window_bytes(V4, "fp4", resolved(default="recompute")) == 0.0
    assert kept_window_bytes(V4, "fp4", resolved(default="replay:32")) == pytest.approx(full * (1 - 32 / 128))
    assert kept_window_bytes(V4, "fp4", resolved(layers={42: "recompute"})) == pytest.approx(full - per_layer)
    assert kept_window_bytes(V4, "fp4", resolved(layers={42: "replay:96"})) == pytest.approx(full - per_layer * 96 / 128)
    assert kept_window_bytes(V4, "fp4", resolved(default="replay:1000")) == 0.0   # W past the window keeps nothing


# ------------------------------------------------------------------ pricing through the step model (no second formula)
@pytest.mark.parametrize("name, layout", [
    ("deepseek-v4-flash", {"tp": 1, "dp": 4, "ep": 4}),
    ("deepseek-v4.1-flash", {"tp": 1, "dp": 4, "ep": 4}),                               # CED decoder layers: chunk tails
    ("deepseek-v4.1-flash", {"tp": 4, "ep": 4, "comm_overlap": "combine_down"}),
    ("deepseek-v3", {"tp": 8}),
])
def test_chunk_cost_is_the_step_model_when_every_layer_carries_the_same_tokens(name, layout):
    m = get_model(name)
    cm = StepCostModel(m, get_hardware("gb300"), ParallelLayout(weight_dtype=m.checkpoint_dtype, kv_dtype=m.default_kv_dtype,
                                                                 expert_dtype=m.checkpoint_expert_dtype, **layout))
    for n, c in ((8192, 16384), (1000, 0), (300, 5000), (100, 40)):
        ref = cm.step(BatchShape.from_lists([n], [c], [False])).time_s
        assert chunk_cost(cm, ReplayPolicy().resolve(m), n, c).seconds == pytest.approx(ref, rel=1e-12)
        # bounded replay of W on every layer = a prefill of n + W tokens over c - W
        w = min(128, c) if m.sliding_window else 0
        ref = cm.step(BatchShape.from_lists([n + w], [c - w], [False])).time_s
        assert chunk_cost(cm, ReplayPolicy(default="replay:128").resolve(m), n, c).seconds == pytest.approx(ref, rel=1e-12)


def test_step_time_monotonic_in_w_and_depth(cost):
    n, c = 8192, 16384
    times = [chunk_cost(cost, resolved(default=f"replay:{w}"), n, c).seconds for w in (1, 16, 64, 128, 512, 4096)]
    assert np.all(np.diff(times) > 0)
    assert chunk_cost(cost, resolved(default="recompute"), n, c).seconds > times[-1]
    # a recompute costs more the higher its layer sits (more layers below it re-run the context)
    depth = [chunk_cost(cost, resolved(layers={j: "recompute"}), n, c).seconds for j in (0, 10, 20, 42)]
    assert np.all(np.diff(depth) > 0)
    assert depth[0] > chunk_cost(cost, resolved(), n, c).seconds
    assert chunk_cost(cost, resolved(layers={42: "recompute"}), n, c).seconds == \
        pytest.approx(chunk_cost(cost, resolved(default="recompute"), n, c).seconds, rel=1e-12)


def test_bounded_replay_of_one_layer_beats_its_recompute_more_with_more_new_tokens(cost):
    base, cand = one_layer_policies(V4, 42, 128)
    rows = compare_policies(cost, base.resolve(V4), cand.resolve(V4), [8192, 16384, 32768, 65536], chunk=8192)
    gains = [r.gain for r in rows]
    assert gains[0] == pytest.approx(1.0)            # one chunk: nothing to resume
    assert np.all(np.diff(gains) > 0) and gains[2] > 1.5
    r = rows[2]   # 32K new tokens in 4 chunks at contexts 0, 8K, 16K, 24K; all 43 layers re-run (top layer)
    assert r.base_extra_tokens == 43 * (8192 + 16384 + 24576) and r.cand_extra_tokens == 43 * 3 * 128


# ------------------------------------------------------------------ policy defaults and errors
def test_defaults_and_the_old_knob():
    assert resolved().is_persist and shipped_replay_policy(V4) == ReplayPolicy()
    v41 = get_model("deepseek-v4.1-flash")
    shipped = shipped_replay_policy(v41).resolve(v41)
    assert set(shipped.modes) == {"replay"} and set(shipped.tokens) == {128}
    p = effective_replay_policy(V4, None, swa_replay_tokens=64)
    assert p.resolve(V4).extra_tokens(1000).tolist() == [64] * LAYERS
    v3 = get_model("deepseek-v3")
    r = ReplayPolicy(default="recompute").resolve(v3)   # no sliding layers: nothing to govern
    assert set(r.modes) == {"none"} and r.carried_tokens(5000) == 0
    assert "replay" not in SchedulerConfig().model_dump()          # scenario dumps (digests) unchanged
    assert SchedulerConfig(replay={"default": "replay:64"}).model_dump()["replay"]["default"] == {"mode": "replay", "tokens": 64}


@pytest.mark.parametrize("replay, field", [
    ({"default": "replay:0"}, "replay.default.tokens"),
    ({"default": "sometimes"}, "replay.default.mode"),
    ({"kinds": {"full": "persist"}}, "replay.kinds.full"),
    ({"layers": {3: "persist:5"}}, "replay.layers.3"),
    ({"tokens": 0}, "replay.tokens"),
    ({"windows": 3}, "replay.windows"),
])
def test_bad_policies_name_the_field(replay, field):
    with pytest.raises(ValidationError) as err:
        SchedulerConfig(replay=replay)
    locs = [".".join(str(x) for x in e["loc"]) for e in err.value.errors()]
    assert any(loc.startswith(field) for loc in locs), locs


def test_bad_layers_name_the_field_and_the_allowed_range():
    with pytest.raises(TwinferError, match=r"replay\.layers: index 43 .* \(0\.\.42\)"):
        SchedulerConfig(replay={"layers": {43: "persist"}}).replay_for(V4)
    no_compressed_windows = V4.model_copy(update={"window_in_compressed_layers": False})
    with pytest.raises(TwinferError, match=r"replay\.layers: layer 5 .*'hca'.* layers with one: 0-1"):
        ReplayPolicy(layers={5: "recompute"}).resolve(no_compressed_windows)
    with pytest.raises(ValidationError, match="swa_replay_tokens"):
        SchedulerConfig(swa_replay_tokens=64, replay={})
    with pytest.raises(ValueError, match="replay_for"):
        Scheduler(SchedulerConfig(replay={}), 100)


def test_cli_errors_exit_2():
    for args, text in ((["--layer", "99"], "replay.layers"), (["--base", "{tokens: -1}"], "tokens"), (["--new", "x"], "--new")):
        res = subprocess.run([sys.executable, "-m", "ui.cli", "replay", *args], capture_output=True, text=True)
        assert res.returncode == 2 and text in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_prompts_past_the_models_context_are_refused_unless_allowed_then_priced_with_a_warning():
    """`replay --new` past the model's context (llama-3.1-8b: 131,072) was priced silently, then with a warning; it is
    refused as `twinfer cost` refuses such a batch (cost's own check), and with --allow-no-fit priced with cost's
    warning, in the table's output and the JSON."""
    from twinfer.errors import DoesNotFitError
    from ui.cmd_replay import run_replay

    with pytest.raises(DoesNotFitError, match=r"prefill:1x131100\+100 holds a prompt of 131,100 tokens"):
        run_replay("llama-3.1-8b", "h200", 1, 1, 1, None, None, 128, None, None, "1000,131000,200000", 8192, 100)
    res = run_replay("llama-3.1-8b", "h200", 1, 1, 1, None, None, 128, None, None, "1000,131000,200000", 8192, 100,
                     allow_no_fit=True)
    assert len(res["rows"]) == 3
    assert len(res["warnings"]) == 2 and "prefill:1x131100+100 holds a prompt of 131,100 tokens" in res["warnings"][0]
    assert "max context of 131,072 tokens" in res["warnings"][1]
    assert run_replay("llama-3.1-8b", "h200", 1, 1, 1, None, None, 128, None, None, "1000", 8192, 0)["warnings"] == []


# ------------------------------------------------------------------ scheduler: prefix hits and chunks
def _finish(sched: Scheduler, plan, now: float):
    res = StepResult(step_durations=np.ones(1), decode_tokens=np.ones((1, len(plan.decodes)), np.int64))
    return sched.complete(plan, res, now + 1)


@pytest.mark.parametrize("policy, context, new", [
    ({}, 1024, 200),                                   # persist: the whole hit is reused
    ({"default": "replay:64"}, 960, 264),              # bounded replay: the hit's last 64 tokens recomputed
    ({"layers": {42: "replay:100"}}, 924, 300),        # one layer replaying 100: every layer below re-runs them
    ({"layers": {0: "recompute"}}, 0, 1224),           # a recompute: the whole prefix again (carried at layer 0)
])
def test_prefix_hit_token_counts(policy, context, new):
    cfg = SchedulerConfig(block_size=64, max_num_seqs=4, max_num_batched_tokens=4096, replay=policy)
    sched = Scheduler(cfg, 200, replay=cfg.replay_for(V4))
    a = Request("a", 0.0, 1024, 1, block_hashes=tuple(range(1, 17)))           # 16 full blocks
    sched.add_request(a)
    plan = sched.schedule(0.0)
    assert [(c.context_len, c.num_new_tokens) for c in plan.prefills] == [(0, 1024)]
    _finish(sched, plan, 0.0)
    b = Request("b", 2.0, 1224, 1, block_hashes=tuple(range(1, 20)))           # a's 16 blocks + 3 more
    sched.add_request(b)
    plan = sched.schedule(2.0)
    (chunk,) = plan.prefills
    assert (chunk.context_len, chunk.num_new_tokens) == (context, new)
    assert chunk.context_len + chunk.num_new_tokens == 1224 and chunk.is_last_chunk
    assert chunk.replayed == 1024 - context          # the tokens of the hit recomputed, at the chunk's head
    assert sched.prefix_hit_tokens == context


@pytest.mark.parametrize("policy, chunks, replays", [
    ({}, [(0, 1024), (1024, 1024), (2048, 952)], [0, 0, 0]),
    ({"default": "replay:64"}, [(0, 1024), (960, 1088), (1984, 1016)], [0, 64, 64]),
    ({"default": "recompute"}, [(0, 1024), (0, 2048), (0, 3000)], [0, 1024, 2048]),
])
def test_chunked_prompt_resumes_per_policy(policy, chunks, replays):
    cfg = SchedulerConfig(block_size=64, max_num_seqs=4, max_num_batched_tokens=1024, replay=policy)
    sched = Scheduler(cfg, 200, replay=cfg.replay_for(V4))
    sched.add_request(Request("p", 0.0, 3000, 2))
    seen, replayed, now = [], [], 0.0
    while len(seen) < 3:
        plan = sched.schedule(now)
        seen += [(c.context_len, c.num_new_tokens) for c in plan.prefills]
        replayed += [c.replayed for c in plan.prefills]
        _finish(sched, plan, now)
        now += 1
    assert seen == chunks and replayed == replays
    assert sched.prefilling == [] and sched.batch.n == 1   # the prompt completed: its first token sampled


def test_v3_scheduling_ignores_any_policy():
    # DeepSeek-V3 has no sliding layers: a recompute policy resolves to nothing and plans are unchanged
    v3 = get_model("deepseek-v3")
    out = []
    for policy in (None, {"default": "recompute"}):
        cfg = SchedulerConfig(block_size=64, max_num_batched_tokens=1024, replay=policy)
        sched = Scheduler(cfg, 200, replay=cfg.replay_for(v3))
        sched.add_request(Request("p", 0.0, 3000, 2))
        plan, seen = sched.schedule(0.0), []
        for t in range(3):
            seen += [(c.context_len, c.num_new_tokens) for c in plan.prefills]
            _finish(sched, plan, float(t))
            plan = sched.schedule(float(t + 1))
        out.append(seen)
    assert out[0] == out[1] == [(0, 1024), (1024, 1024), (2048, 952)]


# ------------------------------------------------------------------ the simulator: layers above the deepest requirement
def test_depth_correction_prices_a_folded_chunk_at_its_layers(cost):
    from costmodels.replay import DepthCorrection
    from scheduler.plan import ScheduledChunk

    assert not DepthCorrection.needed(resolved()) and not DepthCorrection.needed(resolved(default="replay:64"))
    assert not DepthCorrection.needed(resolved(layers={42: "recompute"}))       # the top layer: every layer re-runs
    assert DepthCorrection.needed(resolved(layers={5: "recompute"}))
    assert DepthCorrection.needed(resolved(kinds={"sliding": "replay"}))        # layers 0-1 only
    r = resolved(layers={5: "recompute"})
    fix = DepthCorrection(cost, r)
    n, c = 4096, 12288
    folded = ScheduledChunk(None, n + c, 0, False, c)                            # how the scheduler states it
    whole = cost.step(BatchShape.from_lists([n + c], [0], [False])).time_s        # how the step model prices that
    assert whole - fix([folded]) == pytest.approx(chunk_cost(cost, r, n, c).seconds, rel=1e-12)
    assert fix([ScheduledChunk(None, n, c, False)]) == 0.0                       # nothing replayed: nothing to correct


def test_simulated_prefill_per_policy():
    from sim.runner import simulate
    from sim.scenario import Scenario

    out = {}
    for name, policy in (("persist", {}), ("low", {"layers": {1: "recompute"}}), ("top", {"layers": {42: "recompute"}}),
                         ("replay", {"layers": {42: "replay:128"}})):
        sc = Scenario.model_validate({
            "model": "deepseek-v4-flash", "hardware": "gb300", "layout": {"tp": 4, "ep": 4},
            "scheduler": {"max_num_batched_tokens": 4096, "max_num_seqs": 16, "replay": policy},
            "workload": {"kind": "poisson", "rate": 1000, "num_requests": 6, "input_len": {"kind": "fixed", "value": 12288},
                         "output_len": {"kind": "fixed", "value": 4}}})
        out[name] = simulate(sc, debug=True).result.metrics
    # 6 prompts of 12K tokens in chunks of <= 4K (a chunk shares its step with other prompts' chunks and decodes):
    # the invariants (debug=True) checked every prompt's new tokens; the extra ones are the policy's replays
    extra = {k: out[k].computed_prefill_tokens - 6 * 12288 for k in out}
    assert extra["persist"] == 0 and extra["low"] == extra["top"] >= 6 * (4096 + 8192) - 4096
    assert extra["replay"] % 128 == 0 and 6 * 2 * 128 <= extra["replay"] < 6 * 6 * 128
    busy = [out[k].busy_s for k in ("persist", "replay", "low", "top")]
    assert busy == sorted(busy) and busy[3] > 1.5 * busy[1]
    assert busy[2] < busy[0] + 0.2 * (busy[3] - busy[0])   # layers 0-1 re-running the context: a small part of the top's


def test_simulate_replay_flag():
    from ui.cmd_simulate import effective_scenario
    from ui.cmd_replay import policy_mapping

    sc = effective_scenario(None, model="deepseek-v4-flash", replay=policy_mapping("{layers: {42: recompute}}", "--replay"))
    assert sc.scheduler.replay == ReplayPolicy(layers={42: "recompute"})
    assert effective_scenario(None, replay=policy_mapping("replay:64", "--replay")).scheduler.replay.default.tokens == 64
    res = subprocess.run([sys.executable, "-m", "ui.cli", "simulate", "-n", "5", "--replay", "{layers: {5: recompute}}"],
                         capture_output=True, text=True)   # the default model (DeepSeek-V3) has no sliding window
    assert res.returncode == 2 and "replay.layers: layer 5" in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_default_scenario_unchanged_by_any_policy():
    # the built-in default (DeepSeek-V3: no sliding layers) gives the same metrics whatever the policy, and a
    # scheduler without one dumps without a 'replay' key (its digest is what it was before replay policies)
    from sim.runner import simulate
    from ui.cmd_simulate import effective_scenario

    base = effective_scenario(None, requests=150)
    assert "replay" not in base.model_dump(mode="json")["scheduler"]
    other = base.model_copy(update={"scheduler": base.scheduler.model_copy(update={"replay": ReplayPolicy(default="recompute")})})
    a, b = simulate(base).result, simulate(other).result
    assert a.metrics == b.metrics and a.digest != b.digest   # (the scenario dump names the policy)


def test_depth_correction_at_the_busiest_dp_rank():
    # DEP4: the simulator prices a step at its busiest attention-DP rank (EffectiveStepCost), where one prompt's chunk
    # sits whole; the correction prices the chunk there, so a one-chunk step comes out at the per-layer price on that rank
    from costmodels.calibration_source import profile_for
    from costmodels.effective import EffectiveStepCost
    from costmodels.replay import chunk_cost_at, depth_correction
    from costmodels.step_ops import StepOps
    from scheduler.plan import ScheduledChunk

    m, hw = get_model("deepseek-v4.1-flash"), get_hardware("gb300")
    lay = ParallelLayout(tp=1, dp=4, ep=4, weight_dtype=m.checkpoint_dtype, expert_dtype=m.checkpoint_expert_dtype,
                         kv_dtype=m.default_kv_dtype)
    r = ReplayPolicy(layers={1: "recompute"}).resolve(m)
    fix = depth_correction(m, hw, lay, profile_for(hw, None), r)
    eff = EffectiveStepCost(m, hw, lay, profile_for(hw, None))
    on_rank = StepOps(m, hw, lay, profile_for(hw, None), dp_imbalance=4.0)
    for n, c in ((8192, 8192), (8192, 24576)):
        folded = eff.chunked_step_time(np.zeros(0, np.int64), 0, [n + c], [0])
        got = folded - fix([ScheduledChunk(None, n + c, 0, False, c)])
        assert got == pytest.approx(chunk_cost_at(on_rank, r.extra_tokens(c), n, c).seconds, rel=1e-9)
        assert got < 0.7 * folded                      # layers 0-1 re-running c tokens, not the whole model
    two = [ScheduledChunk(None, 8192 + 8192, 0, False, 8192), ScheduledChunk(None, 4096 + 8192, 4096, False, 8192)]
    assert fix(two) == max(fix(two[:1]), fix(two[1:]))   # chunks on other ranks do not shorten the busiest
    assert depth_correction(m, hw, lay, profile_for(hw, None), ReplayPolicy(default="replay").resolve(m)) is None


@pytest.mark.parametrize("args, words", [
    (["--chunk", "1"], "--chunk 1"),                                     # the default sizes: 262,143 one-token chunks
    (["--new", "1000000000000"], "--new"),                               # 10**12 tokens: 122 million 8192-token chunks
    (["--new", "4097", "--chunk", "1"], "prefills 4,097 chunks; at most 4,096"),
])
def test_a_prompt_of_more_chunks_than_priced_is_refused_up_front(cli_exit_2, args, words):
    """Each chunk is priced on its own, so the chunk count bounds the command's time: far too many is refused at once
    (was: --chunk 1 or --new 10**12 ran for hours)."""
    assert words in cli_exit_2("replay", *args)


def test_a_negative_layer_is_refused_naming_the_flag(cli_exit_2):
    """``--layer -1`` built its policies with ``model_copy`` (no validation): Python's negative indexing read the last
    layer's kind, and the error said layer -1 had no window while listing layers 0-42 as those with one."""
    assert "--layer" in cli_exit_2("replay", "--layer", "-1")
