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


@pytest.fixture(scope="module")
def result():
    return service.search({}, lambda f, s: _PROGRESS.append(f))


def test_default_search_recommends_a_plan_within_budget_and_slo(result):
    assert result.candidates and result.recommended is not None
    c = result.candidates[result.recommended]
    assert c.meets_slo and c.simulated and c.gpus <= 8
    assert c.ttft_p90_s <= 2.0 and c.tpot_p50_s <= 0.05
    assert any(x.on_frontier for x in result.candidates)
    # costs follow from price and throughput
    assert c.costs.usd_per_hour == pytest.approx(c.costs.usd_per_gpu_hour * c.gpus)
    assert c.costs.tokens_per_day == pytest.approx(c.output_tps_per_gpu * c.gpus * 86400, rel=1e-6)


def test_search_reports_progress_to_the_end(result):
    assert _PROGRESS and _PROGRESS[-1] == 1.0 and _PROGRESS == sorted(_PROGRESS)


def test_plan_yaml_holds_a_runnable_scenario(result):
    from sim.scenario import Scenario

    doc = yaml.safe_load(service.plan_yaml(result))
    assert doc["plan"]["gpus"] == result.candidates[result.recommended].gpus
    Scenario.model_validate(doc["scenario"])  # what `twinfer simulate --scenario` would load
    assert doc["provenance"]["search"] == result.backend


def test_results_csv_has_one_row_per_candidate(result):
    rows = list(csv.DictReader(io.StringIO(service.results_csv(result))))
    assert len(rows) == len(result.candidates)
    assert sum(r["recommended"] == "True" for r in rows) == 1


def test_breakdown_sums_to_the_step_and_memory_to_hbm(result):
    bd = service.step_breakdown(result.candidates[result.recommended].scenario, 32, 4096)
    assert sum(bd["breakdown_s"].values()) == pytest.approx(bd["step_s"], rel=1e-6)
    assert bd["breakdown_s"]["experts"] > 0 and bd["breakdown_s"]["attention"] > 0
    assert sum(bd["memory_bytes"].values()) == pytest.approx(bd["hbm_bytes"], rel=1e-6)


def test_what_if_applies_changes_and_rejects_unsupported(result):
    base = result.candidates[result.recommended].scenario
    s = service.apply_what_if(base, {"draft_len": 2, "async_overlap": False, "prefix_hit_rate": 0.5})
    assert s["scheduler"]["draft_len"] == 2 and s["scheduler"]["async_overlap"] is False
    assert s["workload"]["shared_prefix_len"] > 0
    with pytest.raises(TwinferError, match="ep=3"):
        service.apply_what_if(base, {"ep": 3})
    with pytest.raises(TwinferError, match="not available yet"):
        service.apply_what_if(base, {"replay_window": 64})


def test_what_if_mtp_speeds_up_users(result):
    out = service.what_if(result.candidates[result.recommended].scenario, {"draft_len": 2})
    assert out["rows"]["what-if"]["tok/s per user"] > out["rows"]["baseline"]["tok/s per user"]


def test_no_fit_is_a_clear_error():
    with pytest.raises(TwinferError, match="no layout"):
        service.search({"model": "deepseek-v3", "hardware": "H100", "gpus": 2})


def test_error_band_is_unknown_without_a_calibration():
    assert service.error_band("H200") is None


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
])
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
