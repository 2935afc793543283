"""``twinfer run`` and ``twinfer kernels`` on CPU: a short workload through the real executor."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from ui.cli import app  # noqa: E402


def test_run_tiny_workload(tmp_path):
    steps, out = tmp_path / "steps.jsonl", tmp_path / "run.json"
    res = CliRunner().invoke(app, ["run", "--model", "tiny", "--requests", "4", "--max-input-len", "80",
                                   "--max-output-len", "5", "--rate", "50", "--block-size", "16",
                                   "--step-log", str(steps), "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["metrics"]["requests_finished"] == 4
    assert data["metrics"]["output_tokens"] == 20
    recs = [json.loads(line) for line in steps.read_text().splitlines()]
    assert recs and all(r["wall_s"] > 0 and "backends" in r for r in recs)
    assert any(r["num_decodes"] for r in recs) and any(r["num_prefills"] for r in recs)


def test_kernels_lists_ops():
    res = CliRunner().invoke(app, ["kernels", "--device", "cpu", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)["rows"]
    assert any(r["op"] == "mla_decode" and r["chosen"] and r["impl"].startswith("torch") for r in rows)
