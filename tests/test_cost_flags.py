"""``twinfer cost`` flags and the comm mechanisms behind them: draft acceptance, expert/DP imbalance,
refusing a layout that does not fit, combine overlapped with the down GEMM, NVFP4 dispatch payloads."""

import re
import subprocess
import sys

import numpy as np
import pytest

from costmodels.batch import BatchShape
from costmodels.catalog import get_model
from costmodels.comm import DISPATCH_BYTES_PER_VALUE, combine_hidden_under_down
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.step import StepCostModel
from twinfer.config import validate
from twinfer.errors import DoesNotFitError, TwinferError
from ui.cmd_cost import CostConfig, run_cost

DEP8 = {"tp": 1, "dp": 8, "ep": 8}


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ui.cli", "cost", *args], capture_output=True, text=True, timeout=120)


def _op(res_or_ops, word):
    ops = res_or_ops["top_ops"] if isinstance(res_or_ops, dict) else [o.to_dict() for o in res_or_ops]
    hits = [o for o in ops if word in o["name"]]
    assert len(hits) == 1, [o["name"] for o in ops]
    return hits[0]


def _decodes(n, ctx=4096):
    return BatchShape.from_lists([1] * n, [ctx] * n, [True] * n)


# ----------------------------------------------------------------------------- acceptance
def test_tokens_per_step_is_one_plus_the_sum_of_acceptance():
    base = dict(draft_len=2, batch=["decode:32x4096"])
    got = run_cost(CostConfig(**base, acceptance=[0.8, 0.6]))
    every = run_cost(CostConfig(**base, acceptance=[1.0, 1.0]))
    t = got["step_time_s"]
    assert t == every["step_time_s"]  # acceptance changes what a step makes, not what it costs
    assert got["tokens_per_decode_step"] == pytest.approx(2.4)
    assert got["tokens_per_s"] == pytest.approx(32 * 2.4 / t)
    assert got["decode_tokens_per_s_per_user"] == pytest.approx(2.4 / t)
    assert every["tokens_per_s"] == pytest.approx(32 * 3 / t)  # what --draft-len alone used to print


def test_default_acceptance_is_the_simulators():
    from scheduler.config import SchedulerConfig

    res = run_cost(CostConfig(draft_len=3, batch=["decode:8x1024", "prefill:1x2048+1024"]))
    acc = SchedulerConfig(draft_len=3).effective_acceptance_rates()
    assert res["acceptance"] == acc and acc[0] == pytest.approx(0.85)
    # prefill tokens count once each; decodes make 1 + sum(acceptance)
    assert res["tokens_per_s"] == pytest.approx((1024 + 8 * (1 + sum(acc))) / res["step_time_s"])
    assert run_cost(CostConfig())["acceptance"] == []


@pytest.mark.parametrize("args,expect", [
    (["--draft-len", "2", "--acceptance", "0.6,0.8"], "acceptance must be non-increasing"),
    (["--draft-len", "2", "--acceptance", "0.8"], "acceptance has 1 entries but draft_len=2"),
    (["--draft-len", "1", "--acceptance", "1.2"], "acceptance[0]=1.2 must be in [0, 1]"),
    (["--draft-len", "2", "--acceptance", "0.8,x"], "acceptance: expected comma-separated numbers"),
    (["--dp-imbalance", "2"], "dp_imbalance=2.0 must be in [1, dp=1]"),
    (["--tp", "1", "--dp", "8", "--ep", "8", "--dp-imbalance", "0.5"], "dp_imbalance"),
    (["--tp", "1", "--dp", "8", "--ep", "8", "--expert-imbalance", "9"], "expert_imbalance=9.0 must be in [1, ep=8]"),
    (["--tp", "1", "--dp", "8", "--ep", "8", "--expert-imbalance", "0.9"], "expert_imbalance: must be >= 1"),
    (["--tp", "1", "--dp", "8", "--ep", "8", "--expert-imbalance", "hot"], "or zipf / uniform"),
    (["--comm-overlap", "combine_down"], "comm_overlap=combine_down needs ep > 1"),
    (["--tp", "1", "--dp", "8", "--ep", "8", "--comm-overlap", "combine_down", "--two-micro-batch"], "contradicts two_micro_batch"),
    (["--tp", "1", "--dp", "8", "--ep", "8", "--dispatch-dtype", "nvfp4"], "dispatch_dtype=nvfp4 needs fp4 experts"),
    (["--offload-fraction", "1.5"], "offload_fraction"),
    # EP-only knobs at ep=1 are refused as --comm-overlap is (they were priced as in force, or shown unused)
    (["--two-micro-batch"], "--two-micro-batch: two_micro_batch needs ep > 1"),
    (["--eplb", "8"], "--eplb: eplb_redundant_experts=8 needs ep > 1"),
    (["--dispatch-dtype", "bf16"], "--dispatch-dtype: dispatch_dtype=bf16 needs ep > 1"),
    (["-m", "llama-3.1-8b", "--tp", "1", "--dp", "8", "--ep", "8"], "layout.ep: 8 needs a MoE model; llama-3.1-8b is dense"),
    # heads before the memory fit: "does not fit (--allow-no-fit prices it anyway)", then the heads error with it
    (["--tp", "3"], "layout.tp: 3 does not divide deepseek-v3's 128 attention heads"),
    (["--tp", "3", "--allow-no-fit"], "layout.tp: 3 does not divide deepseek-v3's 128 attention heads"),
])
def test_bad_flags_are_clean_errors(args, expect):
    r = _cli(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert expect in r.stderr and "Traceback" not in r.stderr


# ----------------------------------------------------------------------------- imbalance
def test_expert_imbalance_scales_the_dispatch_and_is_reported():
    one = run_cost(CostConfig(**DEP8, dtype="fp8", expert_imbalance=1.0, batch=["decode:512x2048"], top_ops=50))
    two = run_cost(CostConfig(**DEP8, dtype="fp8", expert_imbalance=2.0, batch=["decode:512x2048"], top_ops=50))
    assert one["imbalance"]["expert"] == 1.0 and "balanced routing" in one["imbalance"]["expert_source"]
    assert two["imbalance"]["expert"] == 2.0
    # the busiest rank receives twice the rows: dispatch bytes exactly double, expert FLOPs too
    assert _op(two, "ep_dispatch")["bytes"] == pytest.approx(2 * _op(one, "ep_dispatch")["bytes"])
    assert _op(two, "routed_experts")["flops"] == pytest.approx(2 * _op(one, "routed_experts")["flops"])
    assert two["step_time_s"] > one["step_time_s"]
    default = run_cost(CostConfig(**DEP8, dtype="fp8", batch=["decode:512x2048"]))
    assert default["imbalance"]["expert"] == pytest.approx(1.2) and "default" in default["imbalance"]["expert_source"]


def test_expert_load_model_depends_on_the_batch():
    small = run_cost(CostConfig(**DEP8, dtype="fp8", expert_imbalance="zipf", batch=["decode:16x2048"]))
    big = run_cost(CostConfig(**DEP8, dtype="fp8", expert_imbalance="zipf", batch=["decode:2048x1024"]))
    uni = run_cost(CostConfig(**DEP8, dtype="fp8", expert_imbalance="uniform", batch=["decode:2048x1024"]))
    # sampling noise: fewer assignments, busier straggler; skew keeps zipf above uniform
    assert small["imbalance"]["expert"] > big["imbalance"]["expert"] > uni["imbalance"]["expert"] >= 1.0


def test_dp_imbalance_gives_the_busiest_rank_more_requests():
    m, hw = get_model("deepseek-v3"), get_hardware("h200")
    lay = ParallelLayout(**DEP8, weight_dtype="fp8")
    b = _decodes(256)
    even, skew = StepCostModel(m, hw, lay, dp_imbalance=1.0), StepCostModel(m, hw, lay, dp_imbalance=1.5)
    a1, a2 = _op(even.step(b).ops, "attention_full"), _op(skew.step(b).ops, "attention_full")
    assert a2["bytes"] == pytest.approx(1.5 * a1["bytes"])  # the busiest rank reads 1.5x the mean KV
    res = run_cost(CostConfig(**DEP8, dtype="fp8", dp_imbalance=1.5, batch=["decode:256x4096"]))
    assert res["imbalance"]["dp"] == 1.5


def test_default_dp_imbalance_is_the_batchs_spread_as_the_simulator_prices_it():
    """A request lives on one attention-DP rank: one 4k prompt on DEP8 (H200, FP4 experts) used to be priced split 8
    ways (68 ms) while the simulator charged it whole on one rank (274 ms). Without --dp-imbalance, `cost` prices
    the batch at the spread the simulator gives it."""
    from costmodels.effective import EffectiveStepCost

    def sim_price(res, new, ctx, dec):
        lay = ParallelLayout(**res["layout"])
        return EffectiveStepCost(get_model(res["model"]), get_hardware(res["hardware"]), lay).mixed_step_time(
            np.array(new), np.array(ctx), np.array(dec))

    cfg = dict(**DEP8, dtype="fp8", expert_dtype="fp4", hardware="h200")
    one = run_cost(CostConfig(**cfg, batch=["prefill:1x4096"]))
    assert one["imbalance"]["dp"] == 8.0 and "simulator" in one["imbalance"]["dp_source"]
    assert one["step_time_s"] == pytest.approx(sim_price(one, [4096], [0], [False]), rel=1e-9)
    even = run_cost(CostConfig(**cfg, batch=["prefill:1x4096"], dp_imbalance=1.0))  # the old default, still on request
    assert one["step_time_s"] > 2 * even["step_time_s"]
    # whole requests spread evenly where they can: 64 decodes on 8 ranks stay balanced, 65 put 9 on one rank
    assert run_cost(CostConfig(**cfg, batch=["decode:64x4096"]))["imbalance"]["dp"] == 1.0
    odd = run_cost(CostConfig(**cfg, batch=["decode:65x4096"]))
    assert odd["imbalance"]["dp"] == pytest.approx(9 / (65 / 8), abs=0.01)
    assert odd["step_time_s"] == pytest.approx(sim_price(odd, [1] * 65, [4096] * 65, [True] * 65), rel=1e-9)
    assert run_cost(CostConfig(batch=["prefill:1x4096"]))["imbalance"]["dp"] == 1.0  # dp 1: nothing to spread


def test_app_step_breakdown_prices_the_simulators_dp_split_and_accepted_drafts():
    """The app's 'where the time goes' bar prices a decode step as the plan's simulation does: one decode on a DEP8 pool
    on its rank, the plan's expert load; and tokens/s per user counts the accepted drafts (as `twinfer cost` does)."""
    from costmodels.effective import EffectiveStepCost
    from scheduler.config import SchedulerConfig
    from ui import service

    layout = {**DEP8, "weight_dtype": "fp8", "expert_dtype": "fp4", "kv_dtype": "bf16"}
    sched = {"max_num_seqs": 64, "draft_len": 2}
    bd = service.step_breakdown("deepseek-v3", "H200", layout, sched, 1, 4096)
    sim = EffectiveStepCost(get_model("deepseek-v3"), get_hardware("h200"), ParallelLayout(**layout))
    assert bd["device_s"] == pytest.approx(sim.mixed_step_time(np.array([3]), np.array([4096]), np.array([True])), rel=1e-9)
    per_decode = SchedulerConfig(**sched).expected_tokens_per_decode()
    assert per_decode < 3 and bd["tokens_per_s_per_user"] == pytest.approx(per_decode / bd["step_s"])
    res = run_cost(CostConfig(**DEP8, dtype="fp8", expert_dtype="fp4", draft_len=2, batch=["decode:1x4096"]))
    assert bd["device_s"] == pytest.approx(res["step_time_s"], rel=1e-9)
    # a plan's expert load (Zipf skew, EPLB) prices the experts as the plan's simulation does, not the constant 1.2
    from sim.effects import EffectsSpec, build_step_cost

    eplb = {**layout, "eplb_redundant_experts": 8}
    effects = {"expert_load": {"skew": "zipf", "zipf_s": 0.63}, "eplb": True}
    n = 512
    bd = service.step_breakdown("deepseek-v3", "H200", eplb, sched, n, 4096, effects)
    sim = build_step_cost(get_model("deepseek-v3"), get_hardware("h200"), ParallelLayout(**eplb), EffectsSpec(**effects))
    t = sim.mixed_step_time(np.full(n, 3), np.full(n, 4096), np.ones(n, bool))
    assert bd["device_s"] == pytest.approx(t, rel=1e-9)
    assert bd["device_s"] != pytest.approx(service.step_breakdown("deepseek-v3", "H200", eplb, sched, n, 4096)["device_s"], rel=1e-3)


# ----------------------------------------------------------------------------- fit
def test_not_fitting_is_refused_with_the_shortfall_unless_allowed():
    cfg = dict(hardware="h100", dtype="bf16")
    with pytest.raises(DoesNotFitError, match=r"layout TP8 bf16: does not fit: .* short by [0-9.]+ GiB"):
        run_cost(CostConfig(**cfg))
    res = run_cost(CostConfig(**cfg, allow_no_fit=True))
    assert res["fits"] is False and res["step_time_s"] > 0 and "priced anyway" in res["warnings"][0]
    assert run_cost(CostConfig())["warnings"] == []


def test_allow_no_fit_prints_a_warning():
    r = _cli("--hardware", "h100", "--dtype", "bf16", "--allow-no-fit")
    assert r.returncode == 0 and "WARNING: LAYOUT DOES NOT FIT" in r.stdout


# ----------------------------------------------------------------------------- partial overlap
def test_pipelined_overlap_arithmetic():
    assert combine_hidden_under_down(1.0, 0.5, 4) == pytest.approx(0.5 * 0.75)  # min(a, b) * (1 - 1/chunks)
    assert combine_hidden_under_down(0.2, 0.5, 10) == pytest.approx(0.18)
    assert combine_hidden_under_down(1.0, 0.5, 1) == 0.0 and combine_hidden_under_down(1.0, 0.5, 0.3) == 0.0
    arr = combine_hidden_under_down(np.array([1.0, 0.0]), np.array([2.0, 2.0]), np.array([2.0, 2.0]))
    assert arr.tolist() == [0.5, 0.0]


@pytest.mark.parametrize("batch", [_decodes(512), BatchShape.from_lists([4096], [0], [False])])
def test_combine_down_hides_the_pipelined_part_of_the_combine(batch):
    m, hw = get_model("deepseek-v3"), get_hardware("h200")
    none = StepCostModel(m, hw, ParallelLayout(**DEP8, weight_dtype="fp8"))
    part = StepCostModel(m, hw, ParallelLayout(**DEP8, weight_dtype="fp8", comm_overlap="combine_down"))
    s0, s1 = none.step(batch), part.step(batch)
    c0, c1 = _op(s0.ops, "ep_combine"), _op(s1.ops, "ep_combine")
    down = _op(s0.ops, "routed_experts")["time_s"] / 3  # the down projection: a third of the grouped GEMM
    tokens = float(batch.num_tokens)
    touched = none.e_local * (1 - (1 - 1 / none.e_total) ** (tokens * m.moe.top_k))
    hidden = min(c0["time_s"], down) * (1 - 1 / touched)
    # the down GEMM beside the sends gets the SMs they leave: DeepEP's normal kernels hold 24 of 132, low-latency 0
    hidden /= none.comm_sm_slowdown(bool(batch.num_requests and not batch.is_decode.all()))
    assert "exposed past the down GEMM" in c1["name"] and c1["bytes"] == c0["bytes"]
    assert c1["time_s"] == pytest.approx(c0["time_s"] - hidden)
    assert s0.time_s - s1.time_s == pytest.approx(hidden)
    assert part.step_time(batch) == pytest.approx(s1.time_s)  # the tables hold the same arithmetic
    assert s1.time_s == pytest.approx(sum(s1.breakdown.values()))


def test_comm_overlap_tbo_is_two_micro_batch():
    m, hw = get_model("deepseek-v3"), get_hardware("h200")
    a = StepCostModel(m, hw, ParallelLayout(**DEP8, weight_dtype="fp8", comm_overlap="tbo"))
    b = StepCostModel(m, hw, ParallelLayout(**DEP8, weight_dtype="fp8", two_micro_batch=True))
    assert a.layout.two_micro_batch and a.layout.overlap == "tbo"
    assert a.step_time(_decodes(512)) == b.step_time(_decodes(512))


def test_new_knobs_stay_out_of_the_layout_dump_at_their_defaults():
    plain = ParallelLayout(tp=8).model_dump()
    assert not {"comm_overlap", "dispatch_dtype", "offload_fraction", "offload_scope"} & set(plain)
    dumped = ParallelLayout(**DEP8, comm_overlap="combine_down", offload_fraction=0.25).model_dump(mode="json")
    assert dumped["comm_overlap"] == "combine_down" and dumped["offload_fraction"] == 0.25
    assert ParallelLayout(**dumped) == ParallelLayout(**DEP8, comm_overlap="combine_down", offload_fraction=0.25)
    every = ParallelLayout(tp=8).model_dump(context={"all_fields": True})
    assert every["comm_overlap"] is None and every["offload_scope"] == "routed_experts"


def test_print_scenario_all_lists_the_layout_knobs():
    from typer.testing import CliRunner
    import yaml

    from ui.cli import app

    r = CliRunner().invoke(app, ["simulate", "--print-scenario", "--all"])
    assert r.exit_code == 0, r.output
    assert set(ParallelLayout.model_fields) <= set(yaml.safe_load(r.stdout)["layout"])


# ----------------------------------------------------------------------------- NVFP4 dispatch
def test_nvfp4_payload_is_4_5_bits_per_value():
    assert DISPATCH_BYTES_PER_VALUE["nvfp4"] * 8 == pytest.approx(4.5)  # 4-bit values + an 8-bit scale per 16
    assert DISPATCH_BYTES_PER_VALUE["fp8"] * 8 == pytest.approx(8.25)   # 8-bit values + a 32-bit scale per 128


def test_nvfp4_dispatch_shrinks_only_the_dispatch_bytes():
    m, hw = get_model("deepseek-v4-flash"), get_hardware("gb300")
    assert m.checkpoint_expert_dtype == "fp4"
    lay = dict(**DEP8, weight_dtype="fp8", expert_dtype="fp4")
    fp8 = StepCostModel(m, hw, ParallelLayout(**lay)).step(_decodes(1024))
    nv = StepCostModel(m, hw, ParallelLayout(**lay, dispatch_dtype="nvfp4")).step(_decodes(1024))
    d8, d4 = _op(fp8.ops, "ep_dispatch"), _op(nv.ops, "ep_dispatch")
    assert d4["bytes"] == pytest.approx(d8["bytes"] * (0.5 + 1 / 16) / (1 + 4 / 128))
    assert d4["time_s"] < d8["time_s"]
    assert _op(nv.ops, "ep_combine")["bytes"] == _op(fp8.ops, "ep_combine")["bytes"]  # the combine returns BF16


def test_nvfp4_dispatch_needs_nvidia_fp4_tensor_cores():
    """NVFP4 is NVIDIA's block format: the MI355X's FP4 is MXFP4, and its nvfp4 dispatch was priced (17 -> 18.9 ms)."""
    m = get_model("deepseek-v4-flash")
    lay = validate(ParallelLayout, {**DEP8, "weight_dtype": "fp8", "expert_dtype": "fp4", "dispatch_dtype": "nvfp4"})
    with pytest.raises(TwinferError, match="layout.dispatch_dtype: nvfp4 needs NVIDIA FP4 tensor cores .* H200 has none"):
        StepCostModel(m, get_hardware("h200"), lay)
    with pytest.raises(TwinferError, match="MI355X runs MXFP4, not NVIDIA's NVFP4; allowed on MI355X: bf16, fp8"):
        StepCostModel(m, get_hardware("mi355x"), lay)
    StepCostModel(m, get_hardware("b200"), lay)


def test_an_fp4_kv_cache_on_a_gpu_without_fp4_says_what_it_prices():
    lay = ParallelLayout(tp=8, weight_dtype="fp8", kv_dtype="fp4")
    notes = StepCostModel(get_model("deepseek-v3"), get_hardware("h200"), lay).notes
    assert any(n.startswith("an FP4 KV cache on H200, which has no FP4 tensor cores") for n in notes)
    assert not any("FP4 KV cache" in n for n in StepCostModel(get_model("deepseek-v3"), get_hardware("b200"), lay).notes)


# ----------------------------------------------------------------------------- batch larger than the layout holds
def test_batch_past_the_kv_pool_is_refused_unless_allowed_and_then_priced_with_both_numbers():
    """A batch whose KV cannot be held is refused as a layout that does not fit is (exit 2 at the CLI); with
    --allow-no-fit it is priced, the warning names both numbers and the JSON's ``fits`` / ``batch_fits`` say no
    (``memory.fits`` stays the layout's)."""
    with pytest.raises(DoesNotFitError, match=r"BATCH KV DOES NOT FIT THE KV POOL: the batch holds 134,218,752 KV tokens.*"
                                              r"--allow-no-fit prices it anyway"):
        run_cost(CostConfig(batch=["decode:1024x131072"]))
    res = run_cost(CostConfig(batch=["decode:1024x131072"], allow_no_fit=True))
    assert res["fits"] is False and res["batch_fits"] is False and res["memory"]["fits"] is True
    kv = [w for w in res["warnings"] if "KV POOL" in w]
    assert len(kv) == 1 and kv[0].endswith("(priced anyway: --allow-no-fit)"), res["warnings"]
    assert f"{1024 * 131073:,} KV tokens" in kv[0] and f"{res['memory']['max_kv_tokens_per_dp_rank']:,} per DP rank" in kv[0]
    assert not [w for w in res["warnings"] if "CONTEXT" in w]  # 131,073 <= deepseek-v3's 163,840
    ok = run_cost(CostConfig(batch=["decode:64x4096"]))
    assert ok["warnings"] == [] and ok["fits"] is True and ok["batch_fits"] is True
    out = _cli("-b", "decode:1024x32768")
    assert out.returncode == 2 and "BATCH KV DOES NOT FIT" in out.stderr and "Traceback" not in out.stderr, out.stderr
    out = _cli("-b", "decode:1024x32768", "--allow-no-fit")
    assert out.returncode == 0 and "batch KV fits the pool" in out.stdout and "NO (priced with --allow-no-fit)" in out.stdout


def test_kv_warning_counts_the_busiest_dp_rank():
    pool = run_cost(CostConfig(**DEP8, batch=["decode:8x1024"]))["memory"]["max_kv_tokens_per_dp_rank"]
    n = 2 * pool // 1000  # requests of 1,000 tokens, twice one rank's pool: fit spread over 8 ranks, not all on one
    assert run_cost(CostConfig(**DEP8, batch=[f"decode:{n}x999"]))["warnings"] == []
    res = run_cost(CostConfig(**DEP8, batch=[f"decode:{n}x999"], dp_imbalance=8.0, allow_no_fit=True))
    assert any("busiest DP rank" in w for w in res["warnings"]), res["warnings"]


def test_kv_warning_counts_the_requests_on_the_busiest_rank_where_the_batch_is_placed():
    """Without --dp-imbalance the batch is placed as the step is priced: a rank holds its own requests. A long prompt
    beside one decode per rank puts a work imbalance near 8 on one rank, but that rank's KV is one decode and the
    prompt, well inside its pool (a share of the whole batch's KV at that imbalance would not be)."""
    cfg = dict(**DEP8, hardware="h800", dtype="fp8", expert_dtype="fp4")
    pool = run_cost(CostConfig(**cfg))["memory"]["max_kv_tokens_per_dp_rank"]
    n, m = pool // 2, pool // 3   # 8 decodes of n, one prompt of m: 4.8 pools in all, 0.83 of one on the busiest rank
    res = run_cost(CostConfig(**cfg, batch=[f"decode:8x{n}", f"prefill:1x{m}"]))
    assert res["imbalance"]["dp"] * (8 * n + m) / 8 > pool   # what the share rule would have put on the busiest rank
    assert not [w for w in res["warnings"] if "KV DOES NOT FIT" in w], res["warnings"]
    res = run_cost(CostConfig(**cfg, batch=[f"decode:8x{n}", f"prefill:1x{pool - n // 2}"], allow_no_fit=True))  # does not fit
    kv = [w for w in res["warnings"] if "KV DOES NOT FIT" in w]
    assert len(kv) == 1 and f"{n + 1 + pool - n // 2:,} on its busiest DP rank (as the step is priced)" in kv[0], kv


def test_request_past_the_models_context_is_refused_unless_allowed_and_then_priced_with_a_warning():
    with pytest.raises(DoesNotFitError, match="REQUEST LONGER THAN THE MODEL'S CONTEXT"):
        run_cost(CostConfig(batch=["prefill:1x100000000"]))
    res = run_cost(CostConfig(batch=["prefill:1x100000000"], allow_no_fit=True))
    ctx = [w for w in res["warnings"] if "CONTEXT" in w]
    assert len(ctx) == 1 and "100,000,000" in ctx[0] and "163,840" in ctx[0], res["warnings"]
    assert res["fits"] is False
    out = _cli("-b", "prefill:1x200000")
    assert out.returncode == 2 and "163,840" in out.stderr, out.stderr
    out = _cli("-b", "prefill:1x200000", "--allow-no-fit")
    assert out.returncode == 0, out.stderr
    assert "WARNING" in out.stdout and "163,840" in out.stdout


@pytest.mark.parametrize("layout,expect", [
    ({"tp": 8, "two_micro_batch": True}, "two_micro_batch needs ep > 1"),
    ({"tp": 8, "eplb_redundant_experts": 8}, "eplb_redundant_experts=8 needs ep > 1"),
    ({"tp": 8, "dispatch_dtype": "fp8"}, "dispatch_dtype=fp8 needs ep > 1"),
    ({"tp": 3}, "layout.tp: 3 does not divide deepseek-v3's 128 attention heads"),
])
def test_a_scenario_file_gets_the_layout_rules_cost_has(layout, expect):
    """simulate/plan scenario files go through the same layout validation as `cost`: EP-only knobs at ep=1, heads that
    do not split over tp (before any memory fit), expert parallelism of a dense model, a prefill pool's layout too."""
    from sim.scenario import scenario_from_dict

    base = {"model": "deepseek-v3", "workload": {"rate": 1, "num_requests": 10}}
    with pytest.raises(TwinferError, match=re.escape(expect)):
        scenario_from_dict({**base, "layout": layout})
    with pytest.raises(TwinferError, match=re.escape("layout.ep: 8 needs a MoE model; llama-3.1-8b is dense")):
        scenario_from_dict({**base, "model": "llama-3.1-8b", "layout": {"tp": 1, "dp": 8, "ep": 8}})
    with pytest.raises(TwinferError, match=re.escape("disagg.prefill_layout.tp: 6 does not divide")):
        scenario_from_dict({**base, "layout": {"tp": 8}, "disagg": {"prefill_layout": {"tp": 6}}})
    scenario_from_dict({**base, "layout": {"tp": 1, "dp": 8, "ep": 8, "two_micro_batch": True, "eplb_redundant_experts": 8,
                                           "dispatch_dtype": "fp8"}})   # each in force at ep > 1


def test_two_micro_batches_on_one_request_are_said_not_to_apply():
    """Two micro-batches split a step's requests: a one-request batch runs as one, priced as without the flag, and
    the head table says so rather than printing 'tbo' alone."""
    one = run_cost(CostConfig(**DEP8, dtype="fp8", two_micro_batch=True, batch=["prefill:1x8192"]))
    off = run_cost(CostConfig(**DEP8, dtype="fp8", batch=["prefill:1x8192"]))
    two = run_cost(CostConfig(**DEP8, dtype="fp8", two_micro_batch=True, batch=["prefill:2x8192"]))
    assert one["comm_overlap"] == "tbo" and not one["comm_overlap_applied"]
    assert one["step_time_s"] == off["step_time_s"]
    assert two["comm_overlap_applied"]
    from ui.cmd_cost import _assumption_rows
    assert dict(_assumption_rows(one))["all-to-all overlap"].startswith("tbo (not applied: two micro-batches split")
    assert dict(_assumption_rows(two))["all-to-all overlap"] == "tbo, dispatch fp8"
