"""Issue 19: every figure names its window. `twinfer simulate` prints the whole run and the steady window under
their names (text and --json), and the steady one is what `plan` quotes."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from ui.cli import app

runner = CliRunner()


def test_simulate_names_both_windows_in_text_and_json():
    r = runner.invoke(app, ["simulate", "-n", "300"], env={"COLUMNS": "120"})
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "throughput and load (whole run: first arrival to last finish)" in text
    assert "steady window: latencies of the requests arriving between the 10th and the 90th percentile arrival" in text
    assert "(whole run)" in text  # the latency table's title says it is the whole run's
    r = runner.invoke(app, ["simulate", "-n", "300", "--json"])
    m = json.loads(r.stdout)["metrics"]
    assert m["steady"]["window"] == "steady" and m["whole_run"]["window"] == "whole_run"
    # the top-level figures are the whole run's (the steady window's differ: it leaves out fill and drain)
    assert m["output_throughput_per_gpu"] == m["whole_run"]["output_throughput_per_gpu"]
    assert m["steady"]["output_throughput_per_gpu"] != m["whole_run"]["output_throughput_per_gpu"]
