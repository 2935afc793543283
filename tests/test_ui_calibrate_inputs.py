"""``twinfer calibrate``: inputs refused up front, naming the flag or field (exit 2), before minutes of measuring:
an --out in a folder that does not exist failed only when the profile was written; --max-model-len past the
scheduler's bound was a pydantic 'internal error'."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from twinfer.errors import TwinferError
from ui.cli import app


def test_out_in_a_missing_folder_is_refused_before_measuring(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import executor.calibrate as ec

    def no_measure(*a, **k):
        raise AssertionError("measured before --out was checked")

    monkeypatch.setattr(ec, "calibrate", no_measure)
    out = tmp_path / "missing" / "p.json"
    r = CliRunner().invoke(app, ["calibrate", "-o", str(out), "--quick"])
    assert isinstance(r.exception, TwinferError), r.output
    assert f"--out {out}: no folder {out.parent}" in str(r.exception)


def test_max_model_len_past_the_scheduler_bound_names_the_field(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import executor.engine as engine

    def no_build(*a, **k):
        raise AssertionError("engine built with an out-of-range scheduler config")

    monkeypatch.setattr(engine.LLMEngine, "from_args", no_build)
    r = CliRunner().invoke(app, ["calibrate", "-o", str(tmp_path / "p.json"), "--quick", "--max-model-len", "100000000"])
    assert isinstance(r.exception, TwinferError), r.output
    assert "max_model_len" in str(r.exception) and "16777216" in str(r.exception)
