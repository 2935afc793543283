"""The Streamlit app's logic through streamlit.testing.v1.AppTest (no browser): it loads, controls
change the recommendation, bad uploads show an error, what-if / compare / export work."""

from __future__ import annotations

from pathlib import Path

import re

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")
from streamlit.testing.v1 import AppTest  # noqa: E402

APP = str(Path(__file__).resolve().parents[1] / "ui" / "app.py")
# seconds per rerun: a guard against a hang, not a speed test. A cold default search (the screen, then 4 candidates
# simulated) takes 30-50 s on a 2-core CI machine with the other test worker busy (benchmarks time it, tests do not)
TIMEOUT = 240


@pytest.fixture(autouse=True)
def _uploads(tmp_path, monkeypatch):
    monkeypatch.setenv("TWINFER_UI_UPLOADS", str(tmp_path / "uploads"))


def _app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception, at.exception
    return at


def _recommendation(at: AppTest) -> str:
    heads = [s.value for s in at.subheader if s.value.startswith("Recommended:")]
    assert heads, [e.value for e in at.error] + [w.value for w in at.warning]
    return heads[0]


def _errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def test_loads_with_a_recommendation_chart_and_no_errors():
    at = _app()
    assert "8 GPUs" in _recommendation(at)
    assert not _errors(at)
    assert len(at.get("plotly_chart")) >= 3  # Pareto, step time, memory
    assert [t.label for t in at.tabs] == ["Pareto", "Where the time goes", "What-if", "Compare", "Export"]
    assert any("no calibration: ±?" in m.value for m in at.markdown)  # honest about the error band
    pol = next(m.value for m in at.markdown if "**policies:**" in m.value).split("**policies:**")[1].split("\n")[0]
    assert re.search(r"async overlap (on|off)", pol) and "True" not in pol and "False" not in pol, pol  # as the CLI says it


def test_changing_the_budget_updates_the_recommendation():
    at = _app()
    before = _recommendation(at)
    at.sidebar.number_input(key="gpus").set_value(16).run()
    assert not at.exception
    after = _recommendation(at)
    assert after != before and "16 GPUs" in after


def test_target_traffic_mode_shows_the_rate_input():
    at = _app()
    at.sidebar.radio(key="mode").set_value("target traffic")
    at.sidebar.slider(key="sim_top").set_value(0)  # screen only: the sizing loop's logic, quickly
    at.run()
    assert not at.exception and not _errors(at)
    assert at.sidebar.number_input(key="rate").value == 5.0
    assert "fewest GPUs" in " ".join(c.value for c in at.caption)


@pytest.mark.parametrize("data, match", [
    (b"{definitely not json", "not valid JSON"),
    (b'{"model_type": "deepseek_v3"}', "config.json"),
])
def test_bad_model_upload_shows_an_error(data, match):
    at = _app()
    at.sidebar.selectbox(key="model").set_value("upload…").run()
    at.sidebar.file_uploader(key="model_upload").set_value(("config.json", data, "application/json")).run()
    assert not at.exception
    assert any(match in e for e in _errors(at)), _errors(at)
    assert not [s for s in at.subheader if s.value.startswith("Recommended:")]


def test_bad_hardware_and_trace_uploads_show_errors():
    at = _app()
    at.sidebar.selectbox(key="hardware").set_value("upload…").run()
    at.sidebar.file_uploader(key="hw_upload").set_value(("gpu.yaml", b"name: x\nhbm_gb: 80\n", "application/x-yaml")).run()
    assert any("bf16_tflops" in e for e in _errors(at)), _errors(at)
    at.sidebar.selectbox(key="hardware").set_value("H200")
    at.sidebar.selectbox(key="workload").set_value("upload…").run()
    at.sidebar.file_uploader(key="trace_upload").set_value(("t.jsonl", b'{"timestamp": "soon"}\n', "application/json")).run()
    assert not at.exception
    assert any("invalid trace" in e for e in _errors(at)), _errors(at)


def test_custom_hardware_form_validates_fields():
    at = _app()
    at.sidebar.selectbox(key="hardware").set_value("custom (form)").run()
    assert not at.exception and not _errors(at)  # nothing searched until the form is submitted
    at.sidebar.number_input(key="hw_hbm_gb").set_value(0.0)  # the catalog requires HBM > 0
    next(b for b in at.sidebar.button if b.label == "Use this GPU").click().run()
    assert not at.exception
    assert any("hbm_gb" in e for e in _errors(at)), _errors(at)


def test_what_if_runs_beside_the_baseline():
    at = _app()
    toggle = next(t for t in at.toggle if t.label == "async CPU/GPU overlap")
    flipped = not toggle.value        # the other side of what the recommended plan runs
    toggle.set_value(flipped)
    next(b for b in at.button if b.label == "Run what-if").click().run()
    assert not at.exception and not _errors(at)
    assert any(f"async_overlap = {flipped}" in m.value for m in at.markdown)
    table = next(df.value for df in at.dataframe if list(df.value.columns)[:3] == ["figure", "baseline", "what-if"])
    # the baseline is the recommended plan's own run: the figure the recommendation shows, to the digit
    shown = next(m.value for m in at.metric if m.label == "output tok/s per GPU")
    base = dict(zip(table["figure"], table["baseline"]))
    assert base["window"] == "steady" and base["output tok/s per GPU"] == shown, (base, shown)
    ttft, tpot = next(m.value for m in at.metric if m.label.startswith("TTFT / TPOT")).split(" / ")
    assert float(base["TTFT p90 (s)"]) == pytest.approx(float(ttft.split()[0]), abs=0.006)
    assert float(base["TPOT p90 (ms)"]) == pytest.approx(float(tpot.split()[0]), abs=0.6)


def test_compare_pins_plans_side_by_side_and_inspects_them():
    at = _app()
    at.button(key="pin").click().run()
    at.sidebar.number_input(key="gpus").set_value(16).run()
    at.button(key="pin").click().run()
    assert not at.exception
    table = next(df.value for df in at.dataframe if "" in df.value.columns and "this search (recommended)" in df.value.columns)
    assert sum("(pinned)" in c for c in table.columns) == 2
    picker = at.selectbox(key="inspect")  # the pinned plans can be inspected too
    assert len(picker.options) == 3
    picker.set_value(picker.options[1]).run()
    assert not at.exception and not _errors(at)


def test_export_offers_plan_yaml_and_csv():
    at = _app()
    names = [b.proto.label for b in at.get("download_button")]
    assert any("plan YAML" in n for n in names) and any("results CSV" in n for n in names)
    assert any("kind: twinfer-plan" in c.value for c in at.code)


def test_no_fit_shows_the_explanation():
    at = _app()
    at.sidebar.selectbox(key="hardware").set_value("H100")
    at.sidebar.number_input(key="gpus").set_value(1).run()
    assert not at.exception
    assert any("No deployment recommended" in w.value for w in at.warning)


def test_slo_is_the_cli_syntax_with_units_and_percentile():
    at = _app()
    at.sidebar.text_input(key="slo").set_value("ttft=2,tpot=50").run()  # once a 50-second TPOT
    assert not at.exception
    assert any("needs its percentile" in e for e in _errors(at))
    assert not [s for s in at.subheader if s.value.startswith("Recommended:")]
    at.sidebar.text_input(key="slo").set_value("ttft_p99=3s,tpot_p99=60ms").run()
    assert not at.exception and not _errors(at)
    _recommendation(at)
    assert any("p99" in m.label for m in at.metric)


def test_compare_table_has_a_meets_slo_row():
    at = _app()
    at.button(key="pin").click().run()
    table = next(df.value for df in at.dataframe if "" in df.value.columns and "this search (recommended)" in df.value.columns)
    row = table[table[""] == "meets SLO"]
    assert len(row) == 1 and row.iloc[0]["this search (recommended)"].startswith("yes (ttft_p90=2s,tpot_p90=50ms)")


def test_what_if_replay_window_is_live_for_a_model_with_window_layers():
    """The replay slider was always disabled; a V4-Flash plan's what-if now runs it (DeepSeek-V3's stays disabled)."""
    at = _app()
    assert next(s for s in at.slider if s.label == "replay window (tokens)").disabled  # DeepSeek-V3: no window
    at.sidebar.slider(key="sim_top").set_value(0)  # the screen's plan: the what-if simulates it all the same
    at.sidebar.selectbox(key="model").set_value("deepseek-v4-flash").run()
    slider = next(s for s in at.slider if s.label == "replay window (tokens)")
    assert not slider.disabled and slider.value == 0  # V4-Flash ships persist
    slider.set_value(64)
    next(b for b in at.button if b.label == "Run what-if").click().run()
    assert not at.exception and not _errors(at)
    assert any("replay_window = 64" in m.value for m in at.markdown), [m.value for m in at.markdown]
