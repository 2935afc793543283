"""ui.service and ui.app_uploads: the app's adapters, without streamlit (search, exports, what-if, uploads)."""

from __future__ import annotations

import csv
import io
import json

import pytest
import yaml

from twinfer.errors import TwinferError
from ui import app_uploads, service


@pytest.fixture(autouse=True)
def _uploads(tmp_path, monkeypatch):
    monkeypatch.setenv("TWINFER_UI_UPLOADS", str(tmp_path / "uploads"))


_PROGRESS: list[float] = []  # what the search's progress callback saw
_LABELS: list[str] = []


@pytest.fixture(scope="module")
def result():
    return service.search({}, lambda f, s: (_PROGRESS.append(f), _LABELS.append(s)))


def test_default_search_recommends_a_plan_within_budget_and_slo(result):
    assert result.status == "ok" and result.plan is not None
    plan = result.plan
    assert 1 <= plan.gpus <= 8 and plan.pools
    pred = plan.predicted
    assert pred["ttft_s"] <= 2.0 and pred["tpot_s"] <= 0.05
    rec = [p for p in result.points if p.recommended]
    assert len(rec) == 1 and rec[0].output_tps_per_gpu == pytest.approx(pred["output_tokens_per_s_per_gpu"])
    assert any(p.on_frontier for p in result.points)
    c = plan.costs  # planner.economics, reshaped
    assert c.usd_per_hour == pytest.approx(c.usd_per_gpu_hour * plan.gpus)
    assert c.tokens_per_day == pytest.approx(pred["output_tokens_per_s_per_gpu"] * plan.gpus * 86400, rel=1e-6)


def test_search_reports_progress_to_the_end(result):
    assert _PROGRESS and _PROGRESS[-1] == 1.0 and _PROGRESS == sorted(_PROGRESS)
    # the bar moves with the planner's jobs (the CLI's bars), not only at the start and the end
    assert any(s.startswith("screen layouts ") for s in _LABELS) and any(s.startswith("simulate candidates ") for s in _LABELS)
    assert any(s.startswith("full-scale runs of the plan ") for s in _LABELS)
    assert len({round(f, 3) for f in _PROGRESS if 0.05 < f < 0.95}) >= 5


def test_plan_yaml_is_a_planner_plan(result, tmp_path):
    from planner.plan import load_plan

    path = tmp_path / "plan.yaml"
    path.write_text(result.plan.yaml)
    plan = load_plan(path)  # the format `twinfer plan --out` writes
    assert plan.gpus_used == result.plan.gpus


def test_results_csv_has_one_row_per_point(result):
    rows = list(csv.DictReader(io.StringIO(service.results_csv(result))))
    assert len(rows) == len(result.points)
    assert sum(r["recommended"] == "True" for r in rows) == 1


def test_breakdown_sums_to_the_step_and_memory_to_hbm(result):
    pool = result.plan.pools[-1]
    bd = service.step_breakdown(result.plan.model, result.plan.hardware, pool.layout, pool.scheduler, 32, 4096)
    assert sum(bd["breakdown_s"].values()) == pytest.approx(bd["step_s"], rel=1e-6)
    assert bd["breakdown_s"]["experts"] > 0 and bd["breakdown_s"]["attention"] > 0
    assert sum(bd["memory_bytes"].values()) == pytest.approx(bd["hbm_bytes"], rel=1e-6)


def test_what_if_applies_changes_and_explains_refusals(result):
    plan = result.plan.plan
    p = service.apply_what_if(plan, {"draft_len": 0, "async_overlap": False, "prefix_hit_rate": 0.5})
    main = next(x for x in p["pools"] if x["role"] in ("mixed", "decode"))
    assert main["scheduler"]["draft_len"] == 0 and main["scheduler"]["async_overlap"] is False
    assert p["workload"]["shared_prefix_len"] > 0
    with pytest.raises(TwinferError, match="ep=3"):
        service.apply_what_if(plan, {"ep": 3})
    with pytest.raises(TwinferError, match="no sliding-window layers"):  # DeepSeek-V3: no window to keep or replay
        service.apply_what_if(plan, {"replay_window": 64})
    if result.plan.mode == "aggregated":
        with pytest.raises(TwinferError, match="aggregated"):
            service.apply_what_if(plan, {"pd_ratio": 2.0})


def test_what_if_replay_window_reaches_the_simulator():
    """The what-if's replay window was disabled 'until the simulator takes a replay length'; it takes one
    (scheduler.replay, `twinfer simulate --replay`): W on every window layer of every pool, 0 keeps the window KV."""
    from planner.plan import Plan
    from sim.runner import simulate

    plan = service.search({"model": "deepseek-v4-flash", "hardware": "B200", "gpus": 2, "simulate_top": 0}).plan.plan
    assert service.replay_window(plan) == 0  # V4-Flash ships persist: the window KV is kept
    changed = service.apply_what_if(plan, {"replay_window": 64})
    assert service.replay_window(changed) == 64
    assert all(p["scheduler"]["replay"]["tokens"] == 64 for p in changed["pools"])

    def prefill_tokens(p):
        sc = Plan.model_validate(p).to_scenario(num_requests=150)
        return simulate(sc).result.metrics.computed_prefill_tokens

    # resumed prompt chunks recompute their last 64 tokens through the window layers
    assert prefill_tokens(changed) > prefill_tokens(plan)


def test_what_if_mtp_changes_per_user_speed(result):
    plan = result.plan.plan
    d = next(x for x in plan["pools"] if x["role"] in ("mixed", "decode"))["scheduler"]["draft_len"]
    out = service.what_if(plan, {"draft_len": 0 if d else 2}, 300)
    base, new = out["rows"]["baseline"]["tok/s per user"], out["rows"]["what-if"]["tok/s per user"]
    assert (new < base) if d else (new > base)


def test_no_fit_explains_and_offers_the_closest_options():
    res = service.search({"model": "deepseek-v3", "hardware": "H100", "gpus": 1})
    assert res.status == "does_not_fit" and res.plan is None
    assert res.message and res.closest


def test_target_traffic_sizes_the_cluster():
    res = service.search({"mode": "traffic", "target_rate": 2.0, "simulate_top": 1, "sim_requests": 200})
    assert res.status == "ok" and "fewest GPUs" in res.reason
    assert res.plan.predicted["request_rate"] >= 2.0


def test_error_band_is_unknown_without_a_calibration():
    # H200 has validation reports, but of a 5-layer stack on its calibrated step model, not of the planner's figures
    assert service.error_band("H200") is None and service.error_band("MI355X") is None


# ---------------------------------------------------------------- uploads
def test_model_upload_round_trips_a_hf_config():
    from costmodels.catalog import _entries

    cfg = json.dumps(_entries()["qwen3-30b-a3b"]["hf_config"]).encode()
    path = app_uploads.save_model_config("qwen3-30b-a3b.json", cfg)
    assert service.model_info(path)["experts"] == 128
    assert app_uploads.save_model_config("qwen3-30b-a3b.json", cfg) == path  # content-addressed


@pytest.mark.parametrize("data, match", [
    (b"{not json", "not valid JSON"),
    (b'{"hello": 1}', "not a Hugging Face config.json"),
    (b'{"model_type": "deepseek_v3"}', "hidden_size|required|missing"),
    (b"", "empty"),
    (b" " + b"x" * app_uploads.MAX_UPLOAD_BYTES, "upload limit"),
], ids=["bad-json", "not-hf", "missing-fields", "empty", "too-big"])
def test_bad_model_uploads_say_why(data, match):
    with pytest.raises(TwinferError, match=match):
        app_uploads.save_model_config("config.json", data)


def test_hardware_upload_and_form():
    from costmodels.hardware import get_hardware

    fields = get_hardware("H200").model_dump(exclude={"measured"}, exclude_none=True)
    fields["name"] = "my-gpu"
    path = app_uploads.save_hardware_yaml("mine.yaml", yaml.safe_dump(fields).encode())
    assert service.hardware_info(path)["name"] == "my-gpu"
    with pytest.raises(TwinferError, match="hbm_gb"):
        app_uploads.save_hardware_mapping({**fields, "hbm_gb": -1})
    with pytest.raises(TwinferError, match="mapping"):
        app_uploads.save_hardware_yaml("x.yaml", b"- just\n- a list\n")


def test_trace_upload_validates_lines():
    good = b'{"timestamp": 0, "input_length": 100, "output_length": 10}\n{"timestamp": 1, "input_length": 50, "output_length": 5}\n'
    assert app_uploads.save_trace("t.jsonl", good, "jsonl").endswith("trace.jsonl")
    with pytest.raises(TwinferError, match="invalid trace"):
        app_uploads.save_trace("t.jsonl", b'{"timestamp": 0, "input_length": -3}\n', "jsonl")


# ---------------------------------------------------------------- figures (pure plotly, no streamlit runtime)
def test_pareto_figure_has_slo_region_frontier_pick_and_band(result):
    pytest.importorskip("streamlit")
    from ui.app_pareto import figure

    fig = figure(result, None)
    names = [t.name for t in fig.data]
    assert "recommended" in names and any("frontier" in (n or "") for n in names)
    assert fig.layout.shapes and fig.layout.shapes[0].x0 == pytest.approx(1 / result.request["tpot_s"])
    assert "no calibration: ±?" in fig.layout.title.text
    assert all(t.error_y.array is None for t in fig.data)
    banded = figure(result, 0.1)  # a calibration band draws error bars on simulated points only
    sim = [t for t in banded.data if (t.name or "").endswith("simulation")]
    assert sim and all(t.error_y.array is not None for t in sim)


def test_the_frontier_runs_through_simulated_points_that_meet_the_slo_and_none_above_the_pick(result):
    """Issue 19: the UI's frontier once ran through unsimulated screen points above the recommended star."""
    pytest.importorskip("streamlit")
    from ui.app_pareto import figure

    front = [p for p in result.points if p.on_frontier]
    assert front and all(p.source == "simulation" and p.meets_slo for p in front)
    rec = next(p for p in result.points if p.recommended)
    assert all(p.output_tps_per_gpu <= rec.output_tps_per_gpu * (1 + 1e-9) for p in front)
    line = next(t for t in figure(result, None).data if (t.name or "").startswith("Pareto frontier"))
    assert sorted(zip(line.x, line.y)) == sorted((p.tps_per_user, p.output_tps_per_gpu) for p in front)
    assert any(p.source == "screen" for p in result.points)  # the screen's points are drawn, just not on the line
    # the shaded TPOT region is on mean tokens/s per user, the SLO on a percentile: the chart says so, and a
    # point's colour (computed at the percentile) is what says whether it meets the SLO
    fig = figure(result, None)
    assert "at p90; colour says who meets it" in fig.layout.annotations[0].text
    for t in fig.data:
        if t.customdata is not None:
            pts = [result.points[i] for i in t.customdata]
            assert [c == "crimson" for c in t.marker.color] == [not p.meets_slo for p in pts]


def test_breakdown_figures_stack_every_category(result):
    pytest.importorskip("streamlit")
    from ui.app_breakdown import figures

    pool = result.plan.pools[-1]
    bd = service.step_breakdown(result.plan.model, result.plan.hardware, pool.layout, pool.scheduler, 16, 2048)
    t, m = figures(bd)
    assert [x.name for x in t.data] == list(bd["breakdown_s"]) and [x.name for x in m.data] == list(bd["memory_bytes"])
