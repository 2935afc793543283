"""Export: canonical JSON and digest, CSVs, Perfetto trace-event JSON."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from scheduler.plan import ScheduledChunk, StepPlan, StepResult
from scheduler.request import Request, RequestStatus
from sim.export import (
    REQUEST_COLUMNS,
    digest,
    perfetto_events,
    to_json,
    write_csv,
    write_perfetto,
    write_requests_csv,
)
from scheduler.metrics import SLO, MetricsCollector


def _metrics(record_steps=False):
    c = MetricsCollector(record_steps=record_steps)
    for i in range(5):
        r = Request(f"r{i}", float(i), 100, 10)
        r.first_token_time, r.finish_time, r.num_output_tokens = i + 0.5, i + 1.5, 10
        c.on_finish(r)
    pre = Request("p", 0.0, 300, 4)
    c.on_step(0, 0.0, StepPlan(0, prefills=[ScheduledChunk(pre, 300, 0, True)]), StepResult(np.array([0.2]), np.zeros((1, 0))), 10, 100)
    dec = [Request(f"d{i}", 0.0, 10, 10) for i in range(4)]
    c.on_step(1, 0.1, StepPlan(1, decodes=dec, num_steps=3), StepResult(np.full(3, 0.01), np.ones((3, 4), int)), 20, 100)
    c.on_step(0, 0.2, StepPlan(0, prefills=[ScheduledChunk(pre, 8, 300, False)], decodes=dec[:1]),
              StepResult(np.array([0.05]), np.ones((1, 1), int)), 12, 100)
    return c, c.summarize(4, SLO(ttft_s=1.0, tpot_s=0.2))


def test_canonical_json_sorted_fixed_floats():
    text = to_json({"b": 0.1 + 0.2, "a": [np.float64(1.0), np.int64(3), -0.0], "c": {"z": None, "y": True}})
    assert text == '{"a":[1.0,3,0.0],"b":0.3,"c":{"y":true,"z":null}}'
    assert json.loads(to_json({"x": 1 / 3}))["x"] == float(f"{1 / 3:.12g}")
    with pytest.raises(ValueError, match=r"x\.y: nan"):
        to_json({"x": {"y": math.nan}})


def test_digest_stable_and_ignores_its_own_field():
    _, m = _metrics()
    d1 = digest({"metrics": m, "seed": 1})
    assert d1 == digest({"metrics": _metrics()[1], "seed": 1})
    assert d1 == digest({"metrics": m, "seed": 1, "digest": "whatever"})
    assert d1 != digest({"metrics": m, "seed": 2})
    assert len(d1) == 64
    # a last-bit float difference does not change the digest
    assert digest({"x": 0.1 + 0.2}) == digest({"x": 0.3})


def test_metrics_csv_one_row_per_scalar(tmp_path):
    _, m = _metrics()
    p = tmp_path / "m.csv"
    write_csv(m, p)
    rows = list(csv.reader(p.open()))
    assert rows[0] == ["metric", "value"]
    names = [r[0] for r in rows[1:]]
    assert len(names) == len(set(names)) and names == sorted(names)
    d = dict(rows[1:])
    assert d["requests_finished"] == "5" and d["ttft_s.p50"] == "0.5" and d["slo.ttft_s"] == "1.0"
    assert "kv_timeline" not in d and d["goodput"] != ""


def test_requests_csv(tmp_path):
    done = Request("r0", 1.0, 100, 5, session_id="s1")
    done.first_token_time, done.finish_time, done.num_output_tokens = 1.25, 2.25, 5
    done.status = RequestStatus.FINISHED
    drop = Request("r1", 2.0, 100, 5)
    drop.status, drop.drop_reason = RequestStatus.DROPPED, "kv_too_small"
    p = tmp_path / "r.csv"
    write_requests_csv([done, drop], p)
    rows = list(csv.DictReader(p.open()))
    assert tuple(rows[0]) == REQUEST_COLUMNS
    assert rows[0]["ttft_s"] == "0.25" and rows[0]["tpot_s"] == "0.25" and rows[0]["e2e_s"] == "1.25"
    assert rows[0]["status"] == "finished" and rows[0]["session_id"] == "s1"
    assert rows[1]["drop_reason"] == "kv_too_small" and rows[1]["ttft_s"] == "" and rows[1]["status"] == "dropped"


def test_perfetto_schema(tmp_path):
    c, _ = _metrics(record_steps=True)
    p = tmp_path / "trace.json"
    write_perfetto(c.step_records, p)
    doc = json.loads(p.read_text())
    ev = doc["traceEvents"]
    assert doc["displayTimeUnit"] == "ms"
    for e in ev:
        assert e["ph"] in ("M", "X", "C") and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
    slices = [e for e in ev if e["ph"] == "X"]
    assert [s["name"] for s in slices] == ["prefill", "decode x3", "mixed"]
    assert [s["tid"] for s in slices] == [0, 1, 0]
    assert slices[1]["ts"] == pytest.approx(0.1e6) and slices[1]["dur"] == pytest.approx(0.03e6)
    assert slices[1]["args"]["num_decodes"] == 4 and slices[1]["args"]["decode_tokens"] == 12
    names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"instance 0", "instance 1"}
    counters = [e for e in ev if e["ph"] == "C"]
    assert counters and all(0 <= e["args"]["util"] <= 1 for e in counters)
    assert perfetto_events([]) ["traceEvents"][0]["name"] == "process_name"
