"""Every command's --help shows every default: bracketed defaults in help texts survive (no rich markup eats them),
and typer's own [default: X] is there for options with a value default."""

from __future__ import annotations

import re

import pytest
import typer.main
from typer.testing import CliRunner

from ui.cli import app

COMMAND = typer.main.get_command(app)
NAMES = sorted(COMMAND.commands)


def _help(name: str) -> str:
    r = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "120"})
    assert r.exit_code == 0, r.output
    return " ".join(r.output.split())


@pytest.mark.parametrize("name", NAMES)
def test_help_shows_every_default(name):
    text = _help(name)
    for p in COMMAND.commands[name].params:
        if p.name == "help" or not getattr(p, "help", None):
            continue
        for bracket in re.findall(r"\[[^\]]+\]", p.help):  # e.g. [gb300], [zipf:0.63], [the scenario's]
            assert " ".join(bracket.split()) in text, (p.opts, bracket)
        if p.default not in (None, False, ()) and not p.required and getattr(p, "show_default", True) is not False:
            assert "[default: " in text


def test_the_defaults_users_asked_about():
    plan = _help("plan")
    assert "[gb300]" in plan and "[deepseek-v3]" in plan and "[zipf:0.63]" in plan
    assert "[the scenario's]" in _help("simulate") and "on cpu]" in _help("run")
