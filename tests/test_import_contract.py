"""The layering contract of DESIGN.md (pyproject.toml [tool.importlinter]) holds, and breaks when it should."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["twinfer", "costmodels", "scheduler", "planner", "sim", "executor", "kernels", "ui"]
LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def lint(repo: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the packages of ``repo`` (its own copy first on the path, not the installed one)."""
    env = {**os.environ, "PYTHONPATH": str(repo)}
    return subprocess.run([sys.executable, "-c", LINT, "--no-cache"], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_repository_keeps_the_contract():
    res = lint(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Contracts: 8 kept, 0 broken." in res.stdout


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory) -> Path:
    """The packages' sources and pyproject.toml in a scratch directory."""
    dst = tmp_path_factory.mktemp("repo")
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__", "data", "*.json", "*.yaml"))
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")
    assert lint(dst).returncode == 0   # the copy is as clean as the repository
    return dst


@pytest.mark.parametrize("module, added, broken", [
    # a top-level import the table forbids
    ("executor/engine.py", "import planner.plan\n", "executor imports neither sim, planner nor ui"),
    # a lazy import inside a function counts too
    ("scheduler/plan.py", "def _lazy():\n    import torch\n", "scheduler imports neither planner, sim, executor, ui nor torch"),
    # an import cycle inside a package (sim.runner imports sim.backend)
    ("sim/backend.py", "def _lazy():\n    import sim.runner\n", "no import cycles inside a package"),
])
def test_a_forbidden_import_breaks_the_contract(repo_copy, module, added, broken):
    path = repo_copy / module
    original = path.read_text()
    path.write_text(original + "\n\n" + added)
    try:
        res = lint(repo_copy)
    finally:
        path.write_text(original)
    assert res.returncode != 0
    assert f"{broken} BROKEN" in res.stdout, res.stdout
