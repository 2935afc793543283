"""A flag's value out of its range, an unknown flag or command: one line naming it and the --help to read, exit 2
(click's three-line usage block was the one bad input that did not read like the others)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("args,said", [
    (["run", "-n", "0"], "'--requests' / '-n'"),
    (["validate", "-n", "0"], "'--requests' / '-n'"),
    (["tune", "-g", "0"], "'--gpus' / '-g'"),
    (["replay", "--layer", "-1"], "'--layer'"),
    (["simulate", "--bogus"], "--bogus"),
    (["bogus"], "'bogus'"),
])
def test_usage_errors_are_one_line_naming_the_flag(args, said):
    r = subprocess.run([sys.executable, "-m", "ui.cli", *args], capture_output=True, text=True, timeout=120)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], r.stderr
    cmd = " ".join(["twinfer", *args[:1]]) if args[0] != "bogus" else "twinfer"
    assert f"(see '{cmd} --help')" in lines[0] and "Usage:" not in r.stderr
