"""The app's figures are the CLI's and the planner's, its inputs take every plan the planner makes, and its labels say
what a figure is: the what-if baseline of a plan run on a share of its instances, the PD split control, default prices,
the custom-GPU form, lookup tables in HBM, and the SLO percentile on the tables. Small hand-made plans: no search."""

from __future__ import annotations

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from planner.plan import Plan  # noqa: E402
from ui import service  # noqa: E402

TIMEOUT = 240  # seconds per rerun: a guard against a hang on a loaded 2-core CI machine, not a speed test


@pytest.fixture(autouse=True)
def _uploads(tmp_path, monkeypatch):
    monkeypatch.setenv("TWINFER_UI_UPLOADS", str(tmp_path / "uploads"))


def _disagg_plan(n_pre: int, n_dec: int, run_share: dict | None = None, requests: int = 300, predicted: dict | None = None,
                 slo_percentile: int = 90) -> dict:
    """A small disaggregated Llama-3.1-8B plan on H100s (TP1 instances): fast to simulate."""
    def pool(role: str, n: int, seqs: int) -> dict:
        return {"role": role, "instances": n, "layout": {"tp": 1, "weight_dtype": "bf16"},
                "scheduler": {"max_num_seqs": seqs, "max_num_batched_tokens": 4096}}

    return Plan.model_validate({
        "model": "llama-3.1-8b", "hardware": "H100", "gpus_budget": n_pre + n_dec, "mode": "disaggregated",
        "pools": [pool("prefill", n_pre, 16), pool("decode", n_dec, 64)],
        "workload": {"preset": "chat", "rate": 4.0 * n_dec, "num_requests": requests},
        "slo": {"ttft_s": 2.0, "tpot_s": 0.05}, "slo_percentile": slo_percentile, "run_share": run_share, "predicted": predicted,
    }).model_dump(mode="json")


# ----------------------------------------------------------------------------- what-if baseline of a run_share plan
def test_what_if_baseline_of_a_run_share_plan_is_per_gpu_of_the_whole_plan():
    """A plan run on 1 of its 2 decode instances runs 2 of its 3 prefill instances (1.5, rounded up): 3 of its 5 GPUs at
    half the rate. The planner's figure (and `twinfer simulate --plan`'s comparison line) is the run's output / 0.5 / 5
    GPUs; the what-if baseline showed the run's / 3 GPUs (17% low) and 3 GPUs."""
    from planner.confirm import confirm_plan

    data = _disagg_plan(3, 2, {"instances": 1, "whole_requests": 1000})
    plan = Plan.model_validate(data)
    assert plan.run_instances("prefill") == 2 and plan.run_fraction == 0.5
    row = service.simulate_plan(data, service.what_if_requests(data, 100))
    planner = confirm_plan(plan, 0, plan.workload.rate, plan.slo_percentile)  # how the planner reads the same run
    assert row["GPUs"] == 5
    assert row["output tok/s per GPU"] == pytest.approx(planner.thr_gpu, rel=1e-12)
    assert row["TTFT p90 (s)"] == pytest.approx(planner.ttft_s, rel=1e-12)


def test_what_if_baseline_without_run_share_is_the_runs_own_per_gpu_figure():
    data = _disagg_plan(1, 1, requests=200)
    row = service.simulate_plan(data, 200)
    from sim.runner import simulate

    res = simulate(Plan.model_validate(data).to_scenario(num_requests=200)).result
    assert row["GPUs"] == res.num_gpus == 2
    assert row["output tok/s per GPU"] == res.metrics.steady.output_throughput_per_gpu


# ----------------------------------------------------------------------------- the PD split control
def _controls(plan: dict) -> None:
    import streamlit as st

    from ui import app_whatif, service

    view = service.plan_view(plan)
    changes = app_whatif.controls(view, service.model_info(view.model))
    st.session_state["changes"] = changes
    if changes:
        st.session_state["said"] = app_whatif.describe_changes(view, changes)


def _run_controls(plan: dict) -> AppTest:
    at = AppTest.from_function(_controls, args=(plan,), default_timeout=TIMEOUT).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_an_untouched_2_to_3_split_is_no_change():
    """2 prefill : 3 decode is 0.667; the ratio input held 0.67, read as a change, and ran a what-if unasked."""
    at = _run_controls(_disagg_plan(2, 3))
    assert at.session_state["changes"] == {}


@pytest.mark.parametrize("n_pre, n_dec", [(20, 1), (1, 12)])
def test_every_split_the_planner_makes_opens_the_what_if(n_pre, n_dec):
    """The ratio input took 0.1 to 16: a 20:1 or 1:12 plan raised StreamlitValueAboveMaxError / BelowMinError."""
    at = _run_controls(_disagg_plan(n_pre, n_dec))
    assert at.session_state["changes"] == {}


def test_a_changed_split_reaches_the_plan_exactly():
    plan = _disagg_plan(2, 3)
    at = _run_controls(plan)
    at.number_input[0].set_value(4)
    next(b for b in at.button if b.label == "Run what-if").click().run()
    assert not at.exception
    changes = at.session_state["changes"]
    assert set(changes) == {"pd_ratio"} and "(4 prefill : 3 decode instances)" in at.session_state["said"]
    changed = service.apply_what_if(plan, changes)
    assert [p["instances"] for p in changed["pools"]] == [4, 3]


# ----------------------------------------------------------------------------- sidebar: prices and the custom GPU
def _sidebar() -> None:
    import streamlit as st

    from ui import app_sidebar

    st.session_state["request"] = app_sidebar.render()


def _run_sidebar() -> AppTest:
    at = AppTest.from_function(_sidebar, default_timeout=TIMEOUT).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_prices_left_at_their_defaults_are_the_catalogs_not_the_users():
    """The sidebar sent the catalog's $/GPU-hour as if typed: the plan said 'price_source: user' where `twinfer plan`
    says 'hardware catalog (H200 all-in TCO estimate)'."""
    from costmodels.hardware import get_hardware
    from planner.economics import economics

    at = _run_sidebar()
    req = at.session_state["request"]
    assert req["price_per_gpu_hour"] is None and req["price_per_m_output"] is None
    preq = service._planner_request(service.PlanRequest.model_validate(req), 8)
    e = economics(get_hardware("H200"), preq.prices, 8, 8, 1000.0, 1000.0, 400.0, 0.0)
    assert e.price_source.startswith("hardware catalog") and e.price_per_gpu_hour == get_hardware("H200").price_per_gpu_hour
    at.sidebar.number_input(key="price_H200").set_value(2.5).run()
    assert at.session_state["request"]["price_per_gpu_hour"] == 2.5


def test_an_e2e_target_in_the_slo_reaches_the_plan():
    """'ttft_p90=2s,tpot_p90=50ms,e2e_p90=20s' parsed, and the sidebar sent ttft and tpot only: the plan had no e2e
    target (its goodput 93% where `twinfer plan` with the same --slo says 72%), and nothing said it was dropped."""
    at = _run_sidebar()
    at.sidebar.text_input(key="slo").set_value("ttft_p90=2s,tpot_p90=50ms,e2e_p90=20s").run()
    req = at.session_state["request"]
    assert req["e2e_s"] == 20.0
    preq = service._planner_request(service.PlanRequest.model_validate(req), 8)
    assert preq.slo.e2e_s == 20.0 and preq.slo.ttft_s == 2.0 and preq.slo.tpot_s == 0.05


def test_custom_gpu_form_keeps_the_catalog_fields_it_does_not_show():
    """'custom (form)' starting from GB300, unedited, dropped host memory (240 GB -> 0), the C2C host link (225 -> 64 GB/s),
    the SM count and the exponential rate: a GPU unlike the one it starts from."""
    from costmodels.hardware import get_hardware

    at = _run_sidebar()
    at.sidebar.selectbox(key="hardware").set_value("custom (form)").run()
    start = at.sidebar.selectbox(key="hw_base").value
    next(b for b in at.sidebar.button if b.label == "Use this GPU").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    got, base = get_hardware(at.session_state["request"]["hardware"]), get_hardware(start)
    same = {"name", "sources", "notes", "measured"}
    assert got.name == "custom-gpu"
    assert got.model_dump(exclude=same) == base.model_dump(exclude=same)


# ----------------------------------------------------------------------------- where the memory goes
def test_breakdown_memory_has_the_lookup_tables_a_plan_keeps_in_hbm():
    """A V4.1-Flash plan with its Engram tables in HBM ('tables-hbm'): the KV pool the bar shows is the one the
    simulator fits (24.6 M tokens per DP rank on B200 DEP8), not the one without the tables (33.8 M)."""
    from costmodels.catalog import get_model
    from costmodels.layout import ParallelLayout
    from sim.runner import simulate
    from sim.scenario import Scenario

    m = get_model("deepseek-v4.1-flash")
    lay = ParallelLayout(tp=1, dp=8, ep=8, weight_dtype=m.checkpoint_dtype).model_dump(mode="json")
    sc = Scenario.model_validate({"model": m.name, "hardware": "B200", "layout": lay, "scheduler": {"max_num_seqs": 512},
                                  "workload": {"preset": "chat", "num_requests": 8, "rate": 50},
                                  "effects": {"table_placement": "hbm"}})
    kv = simulate(sc).result.kv
    bd = service.step_breakdown(m.name, "B200", lay, sc.scheduler.model_dump(mode="json"), 64, 4096, {"table_placement": "hbm"})
    mem = bd["memory_bytes"]
    per_rank = mem["KV pool"] / kv.kv_bytes_per_token_per_gpu
    assert abs(per_rank * 8 - kv.capacity_tokens) <= 8 * kv.block_size
    assert mem["lookup tables"] == pytest.approx(m.host_table_bytes / 8)
    assert sum(mem.values()) == pytest.approx(bd["hbm_bytes"])


# ----------------------------------------------------------------------------- the SLO percentile on the tables
def _tables(result: dict) -> None:
    from ui import app_pareto, app_recommend, service

    res = service.SearchResult.model_validate(result)
    app_recommend.render(res, None)
    app_pareto.render(res, None)


def test_tables_name_the_slo_percentile_and_tpot_to_a_tenth_of_a_ms():
    pred = {"source": "simulation", "request_rate": 8.0, "output_tokens_per_s_per_gpu": 900.0, "tokens_per_s_per_user": 60.0,
            "ttft_s": 0.4, "tpot_s": 0.0416}
    plan = service.plan_view(_disagg_plan(1, 1, predicted=pred, slo_percentile=99))
    point = service.Point(label=plan.label, mode=plan.mode, gpus=2, output_tps_per_gpu=900.0, tps_per_user=60.0, ttft_s=0.4,
                          tpot_s=0.0416, request_rate=8.0, meets_slo=True, source="simulation", on_frontier=True, recommended=True)
    req = service.PlanRequest(slo_percentile=99, tpot_s=0.05).model_dump()
    result = service.SearchResult(request=req, status="ok", message="", reason="", points=[point], plan=plan)
    at = AppTest.from_function(_tables, args=(result.model_dump(mode="json"),), default_timeout=TIMEOUT).run()
    assert not at.exception, [e.value for e in at.exception]
    assert next(m.value for m in at.metric if m.label == "TTFT / TPOT p99") == "0.40 s / 41.6 ms"  # the CLI's 41.6, not 42
    cols = list(at.dataframe[0].value.columns)
    assert "TTFT p99 (s)" in cols and "TPOT p99 (ms)" in cols, cols


def test_compare_column_says_switches_and_the_percentile_as_the_recommendation_does():
    """The Compare tab showed 'async overlap True, EPLB False' beside the recommendation's 'on'/'off', and its TTFT/TPOT
    rows named no percentile (pinned plans may be planned at p90 and p99)."""
    from ui import app_compare

    pred = {"source": "simulation", "request_rate": 8.0, "output_tokens_per_s_per_gpu": 900.0, "tokens_per_s_per_user": 60.0,
            "ttft_s": 0.4, "tpot_s": 0.0416}
    col = app_compare.plan_column(service.plan_view(_disagg_plan(1, 1, predicted=pred, slo_percentile=99)))
    assert "async overlap on" in col["policies"] and "EPLB off" in col["policies"], col["policies"]
    assert "True" not in col["policies"] and "False" not in col["policies"]
    assert col["TTFT (s)"] == "0.40 (p99)" and col["TPOT (ms)"] == "41.6 (p99)"
