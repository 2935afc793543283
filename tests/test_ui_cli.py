"""`twinfer ui`: the streamlit command line it runs, and a clear error without streamlit."""

from __future__ import annotations

import importlib.util

from typer.testing import CliRunner

from ui import cmd_ui
from ui.cli import app


def test_streamlit_command_is_headless_local_and_quiet():
    cmd = cmd_ui.streamlit_command(8765)
    assert cmd[1:4] == ["-m", "streamlit", "run"] and cmd[4].endswith("ui/app.py")
    flags = dict(zip(cmd[5::2], cmd[6::2]))
    assert flags["--server.port"] == "8765" and flags["--server.address"] == "127.0.0.1"
    assert flags["--server.headless"] == "true" and flags["--browser.gatherUsageStats"] == "false"
    assert flags["--server.maxUploadSize"] == "5"


def test_free_port_is_bindable():
    import socket

    port = cmd_ui.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_help_lists_the_options():
    out = CliRunner().invoke(app, ["ui", "--help"])
    assert out.exit_code == 0 and "--port" in out.output and "capacity planner" in out.output


def test_without_streamlit_it_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "streamlit" else real(name, *a))
    out = CliRunner().invoke(app, ["ui"])
    assert out.exit_code != 0 and "twinfer[ui]" in str(out.exception)
