"""The README's test command ends with pytest's "N passed" line (the repo's pytest config must not silence it)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_test_command() -> str:
    """The line after the test-command marker's fence, as .ci/run reads it."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    at = next(i for i, line in enumerate(lines) if "<!-- test-command" in line)
    fence = next(i for i in range(at + 1, len(lines)) if lines[i].startswith("```"))
    return lines[fence + 1]


def test_readme_pytest_command_prints_the_summary_line(tmp_path):
    cmd = _readme_test_command()
    assert "python -m pytest" in cmd
    args = cmd.split("python -m pytest", 1)[1].split()
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    r = subprocess.run([sys.executable, "-m", "pytest", *args, "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
                        "-p", "no:cacheprovider", str(tmp_path / "test_one.py")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert re.search(r"\b2 passed\b", last), r.stdout
