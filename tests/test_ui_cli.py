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


def _cli(*args, **kw):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "ui.cli", *args], capture_output=True, text=True, timeout=120, **kw)


def test_busy_port_is_exit_2_without_a_url():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = _cli("ui", "--port", str(port))
    assert r.returncode == 2 and f"--port {port}" in r.stderr and "in use" in r.stderr and "http://" not in r.stdout


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_sigterm_stops_streamlit_too():
    import signal
    import subprocess
    import sys
    import time

    port = cmd_ui.free_port()
    p = subprocess.Popen([sys.executable, "-m", "ui.cli", "ui", "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for _ in range(600):  # until Streamlit listens (a cold start takes seconds on a busy box)
            if _listening(port) or p.poll() is not None:
                break
            time.sleep(0.2)
        assert _listening(port), p.stderr.read() if p.poll() is not None else "streamlit did not start"
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 0
        for _ in range(100):  # the child's socket closes as it exits
            if not _listening(port):
                break
            time.sleep(0.1)
        assert not _listening(port)
    finally:
        if p.poll() is None:
            p.kill()


def test_missing_optional_packages_give_the_install_hint():
    # the brackets in 'twinfer[executor]' must survive rich markup; the hint is an error (2), not an internal error (1)
    code = "import sys; sys.modules['torch'] = None; sys.argv = ['twinfer', *sys.argv[1:]]; from ui.cli import main; main()"
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", code, "run", "-n", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "pip install 'twinfer[executor]'" in r.stderr and "internal error" not in r.stderr
    code = code.replace("'torch'", "'httpx'")
    r = subprocess.run([sys.executable, "-c", code, "bench", "-n", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "pip install 'twinfer[serve]'" in r.stderr and "internal error" not in r.stderr


def test_ui_install_hint_keeps_its_brackets(monkeypatch):
    import subprocess
    import sys

    code = ("import importlib.util as u, sys; real = u.find_spec; u.find_spec = lambda n, *a: None if n == 'streamlit' else real(n, *a); "
            "sys.argv = ['twinfer', 'ui']; from ui.cli import main; main()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "pip install 'twinfer[ui]'" in r.stderr
