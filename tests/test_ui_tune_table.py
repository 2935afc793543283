"""``twinfer tune --gpus N`` in an 80-column terminal: its tables fold headers instead of cutting them or the figures."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from ui.cli import app


@pytest.fixture
def tiny_chat(tmp_path):
    """Chat traffic capped to tiny's 4,096-token context (a longer request is refused, as the executor refuses it)."""
    path = tmp_path / "tiny_chat.yaml"
    path.write_text(yaml.safe_dump({"preset": "chat",
                                    "input_len": {"kind": "lognormal", "mean": 1500, "sigma": 0.8, "min": 16, "max": 3072},
                                    "output_len": {"kind": "lognormal", "mean": 400, "sigma": 0.7, "min": 8, "max": 1024}}))
    return str(path)


def test_tune_tables_fit_80_columns_uncut(tiny_chat):
    args = ["tune", "-m", "tiny", "--hw", "h200", "-g", "2", "-w", tiny_chat, "--ep-widths", "1,2", "--batch-per-rank", "16",
            "--chunk-tokens", "2048", "--sim-requests", "100", "--plan-requests", "200"]
    r = CliRunner().invoke(app, args, env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    table = r.stdout.split("best per policy combination", 1)[1].split("best per policy value", 1)[0]
    assert "…" not in table, table  # once "tok/…", "repl…" and "+88.…"
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    for head in ("replay", "/GPU", "base", "feasible"):
        assert head in table, head
    assert "%" in table and "yes" in table


def test_ctrl_c_prints_how_far_it_got_and_the_best_so_far(monkeypatch, tiny_chat):
    """A Ctrl-C during the policy search (the third simulation here): exit 130, the count and the best finished run."""
    import planner.tune_policies as tp

    real, calls = tp.simulate_policy, []

    def cut_at_the_third(ctx, p, rate_per_gpu=None):
        calls.append(p)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(ctx, p, rate_per_gpu)

    monkeypatch.setattr(tp, "simulate_policy", cut_at_the_third)
    args = ["tune", "-m", "tiny", "--hw", "h200", "-g", "2", "-w", tiny_chat, "--ep-widths", "1,2", "--batch-per-rank", "16",
            "--chunk-tokens", "2048", "--sim-requests", "100", "--plan-requests", "200"]
    r = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert r.exit_code == 130, r.output
    text = " ".join(r.stderr.split())  # status and partial results on stderr, as plan, simulate and run
    assert "interrupted after 2 of at most" in text and "no winner and no plan" in text
    assert "best so far (simulated, not run at full scale): EP" in text and "output tok/s/GPU" in text
