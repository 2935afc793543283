"""Issue 19 (table widths): in an 80-column terminal no table cuts a name the user types back (an op for
TWINFER_KERNEL_<OP>, an implementation, a cost op) to '…'; long cells fold instead."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from ui.cli import app


def _out(*args: str) -> str:
    r = CliRunner().invoke(app, list(args), env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert "…" not in r.output, r.output
    assert max(len(line) for line in r.output.splitlines()) <= 80
    return r.output


def test_kernels_table_keeps_op_and_implementation_names_whole():
    pytest.importorskip("torch")
    from kernels import registry

    firsts = {tuple(line.split()[:2]) for line in _out("kernels").splitlines() if line.strip()}
    rows = registry.describe("cpu")
    assert {(r["op"], r["impl"]) for r in rows} <= firsts


def test_cost_top_ops_fold_instead_of_cutting():
    text = _out("cost")
    assert "top ops" in text and "attn_allreduce(tp" in text
