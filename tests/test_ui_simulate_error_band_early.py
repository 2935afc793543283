"""``twinfer simulate --error-band FILE``: a missing report is refused before the simulation runs (it was checked only
after it: minutes on a large scenario, then exit 2)."""

from __future__ import annotations

from typer.testing import CliRunner

from twinfer.errors import TwinferError
from ui.cli import app


def test_missing_error_band_file_is_refused_before_simulating(tmp_path, monkeypatch):
    import sim.runner

    def no_run(*a, **k):
        raise AssertionError("simulated before --error-band was checked")

    monkeypatch.setattr(sim.runner, "simulate", no_run)
    r = CliRunner().invoke(app, ["simulate", "-n", "5", "--error-band", str(tmp_path / "missing.json")])
    assert isinstance(r.exception, TwinferError), r.output
    assert "--error-band" in str(r.exception) and "missing.json: no such file" in str(r.exception)


def test_malformed_error_band_file_is_refused_before_simulating(tmp_path, monkeypatch):
    import sim.runner

    def no_run(*a, **k):
        raise AssertionError("simulated before --error-band was checked")

    monkeypatch.setattr(sim.runner, "simulate", no_run)
    for name, text in (("bad.json", "{not json"), ("other.json", '{"model": "x"}'),
                       ("fields.json", '{"model": "x", "levels": "many"}')):
        f = tmp_path / name
        f.write_text(text)
        r = CliRunner().invoke(app, ["simulate", "-n", "5", "--error-band", str(f)])
        assert isinstance(r.exception, TwinferError), (name, r.output)
        assert f"--error-band: {f}: not a twinfer validate report" in str(r.exception)
