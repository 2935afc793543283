"""``twinfer tune --gpus N`` in an 80-column terminal: its tables fold headers instead of cutting them or the figures."""

from __future__ import annotations

from typer.testing import CliRunner

from ui.cli import app


def test_tune_tables_fit_80_columns_uncut():
    args = ["tune", "-m", "tiny", "--hw", "h200", "-g", "2", "--ep-widths", "1,2", "--batch-per-rank", "16",
            "--chunk-tokens", "2048", "--sim-requests", "100", "--plan-requests", "200"]
    r = CliRunner().invoke(app, args, env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    table = r.stdout.split("best per policy combination", 1)[1].split("best per policy value", 1)[0]
    assert "…" not in table, table  # once "tok/…", "repl…" and "+88.…"
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    for head in ("replay", "/GPU", "base", "feasible"):
        assert head in table, head
    assert "%" in table and "yes" in table
