"""``twinfer calibrate``: a bar with an ETA over the timed step shapes (what takes minutes on a GPU), and Ctrl-C says
that no profile was written. The executor's measuring function is replaced by one that logs as it does."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from ui.cli import app
from ui.cmd_calibrate import STEP_LINE


def test_the_bar_counts_the_executors_step_lines():
    pytest.importorskip("torch")
    import inspect

    import executor.calibrate as ec

    # the line the bar reads is the one executor.calibrate writes (its format string, filled in)
    src = inspect.getsource(ec)
    assert 'log(f"  step {j + 1:3d}/{len(shapes)}: ' in src
    m = STEP_LINE.match(f"  step {2:3d}/{10}: {4:4d} decodes")
    assert m and (int(m[1]), int(m[2])) == (2, 10)


def test_progress_and_ctrl_c(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import executor.calibrate as ec

    def fake(*a, log, **k):
        for j in range(3):
            log(f"  step {j + 1:3d}/5: {1:4d} decodes (ctx ~   30), prefill      0 tok in 0:   1.00 ms")
        raise KeyboardInterrupt

    monkeypatch.setattr(ec, "calibrate", fake)
    out = tmp_path / "p.json"
    r = CliRunner().invoke(app, ["calibrate", "-o", str(out)], env={"COLUMNS": "120"})
    assert r.exit_code == 130, r.output
    assert "interrupted" in r.stderr and "no profile written" in r.stderr and not out.exists()
    assert "step   3/5" in r.stdout
    assert "calibrate: step shapes" in r.stderr and "3/5" in r.stderr and "ETA" in r.stderr
