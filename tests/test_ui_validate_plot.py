"""``twinfer validate --plot``: the format the suffix names, HTML with plotly.js inside (offline), clear errors up front."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
from typer.testing import CliRunner

from twinfer.errors import TwinferError
from ui.cli import app
from ui.cmd_validate import check_plot_path, write_plot

pytest.importorskip("plotly")


def _report():
    levels = [NS(name="low", rel_error={"output_throughput": 0.02, "tpot_p50": -0.05, "ttft_p50": 0.1, "ttft_p90": None})]
    samples = {"low": [NS(measured_s=0.010, predicted_s=0.011), NS(measured_s=0.020, predicted_s=0.019)]}
    rep = NS(levels=levels, step_overall={"mape": 0.07}, model="tiny", num_layers=2, dtype="fp32", provenance={}, device="cpu")
    return rep, samples


def test_html_embeds_plotly_no_cdn(tmp_path):
    rep, samples = _report()
    out = tmp_path / "v.html"
    assert write_plot(rep, samples, out) == str(out)
    text = out.read_text(encoding="utf-8")
    assert not re.search(r"<script[^>]*\bsrc=", text) and len(text) > 1_000_000  # no script loaded from anywhere: plotly.js inside


def test_unknown_format_and_missing_kaleido_are_clear_errors_before_any_run(tmp_path, monkeypatch):
    with pytest.raises(TwinferError, match=r"unknown format '\.bmp'; allowed: \.html"):
        check_plot_path(tmp_path / "v.bmp")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "kaleido" else real(name, *a))
    with pytest.raises(TwinferError, match=r"\.png image needs kaleido.*allowed: \.html"):
        check_plot_path(tmp_path / "v.png")
    check_plot_path(tmp_path / "v.html")  # always possible with plotly
    # through the command: refused before the profile is even read
    r = CliRunner().invoke(app, ["validate", "--profile", str(tmp_path / "missing.json"), "--plot", str(tmp_path / "v.png"), "--sim-only"])
    assert r.exit_code != 0 and "needs kaleido" in str(r.exception)


@pytest.mark.skipif(importlib.util.find_spec("kaleido") is None, reason="kaleido not installed")
def test_png_is_a_png_or_says_why(tmp_path):
    rep, samples = _report()
    out = tmp_path / "v.png"
    msg = write_plot(rep, samples, out)
    if msg == str(out):
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:  # kaleido present but no browser here: the HTML instead, and the message says so
        assert "could not write" in msg and Path(tmp_path / "v.html").exists()


def test_validate_shows_a_progress_bar(tmp_path):
    prof = str(Path(__file__).resolve().parents[1] / "profiles" / "h200" / "calibration_deepseek-v3-5layers_fp8.json")
    r = CliRunner().invoke(app, ["validate", "--model", "deepseek-v3", "--num-layers", "5", "--profile", prof, "-n", "12",
                                 "--max-input-len", "256", "--max-output-len", "8", "--sim-only", "--levels", "0.5,2"],
                           env={"COLUMNS": "120"})
    assert r.exit_code == 0, r.output
    assert "validate" in r.stderr and "2/2" in r.stderr and "ETA" in r.stderr


def test_plot_with_sim_only_is_refused_not_silently_skipped(tmp_path):
    """A --sim-only run has no measured steps to plot: it once exited 0 without writing the --plot file."""
    import subprocess
    import sys

    prof = str(Path(__file__).resolve().parents[1] / "profiles" / "h200" / "calibration_deepseek-v3-5layers_fp8.json")
    r = subprocess.run([sys.executable, "-m", "ui.cli", "validate", "--model", "deepseek-v3", "--num-layers", "5", "--profile", prof,
                        "-n", "4", "--sim-only", "--plot", str(tmp_path / "v.html")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--sim-only measures nothing" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "v.html").exists()
