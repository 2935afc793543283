"""``twinfer serve --port BUSY``: exit 2 naming the flag, before the engine is built (it was an internal OSError,
exit 1, after loading the model); the port is reserved, not listening, while the engine builds."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from twinfer.errors import TwinferError
from ui.cli import app

pytest.importorskip("uvicorn")


def test_busy_port_is_exit_2_before_the_engine(monkeypatch):
    import ui.cmd_serve as cs

    built = []
    monkeypatch.setattr(cs, "build_engine", lambda *a, **k: built.append(1))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = CliRunner().invoke(app, ["serve", "--model", "tiny", "--load-format", "dummy", "--device", "cpu", "--port", str(port)])
    # a TwinferError: ui.cli.main prints it as one line and exits 2 (tests/test_ui_cli.py checks that path)
    assert isinstance(r.exception, TwinferError) and f"--port {port}: 127.0.0.1:{port} is in use" in str(r.exception)
    assert not built  # refused before the (minutes long, on a GPU) engine build


def test_a_reserved_port_refuses_connections_until_it_listens():
    from executor.serve.server import bind_socket, listen_on

    sock = bind_socket("127.0.0.1", 0, listen=False)
    port = sock.getsockname()[1]
    try:
        with socket.socket() as c:
            assert c.connect_ex(("127.0.0.1", port)) != 0  # refused: a client is not left hanging in a backlog
        listen_on(sock)
        with socket.socket() as c:
            assert c.connect_ex(("127.0.0.1", port)) == 0
    finally:
        sock.close()


@pytest.mark.parametrize("model", ["tiny", "qwen3-30b-a3b"])
def test_catalog_model_without_dummy_weights_is_exit_2_before_the_engine(monkeypatch, model):
    # --load-format auto (the default) reads a checkpoint folder; a catalog name has none. It was said only after the
    # engine build, and for a large model the build first failed on memory with a hint serve has no flag for
    import ui.cmd_serve as cs

    built = []
    monkeypatch.setattr(cs, "build_engine", lambda *a, **k: built.append(1))
    r = CliRunner().invoke(app, ["serve", "--model", model, "--device", "cpu", "--port", "0"])
    assert isinstance(r.exception, TwinferError) and "--load-format dummy" in str(r.exception)
    assert not built


def test_serve_and_bench_take_m_for_model_as_the_other_commands_do():
    r = CliRunner().invoke(app, ["serve", "-m", "no-such-folder", "--device", "cpu", "--port", "0"])
    assert isinstance(r.exception, TwinferError) and "--model 'no-such-folder'" in str(r.exception)
    r = CliRunner().invoke(app, ["bench", "-m", "tiny", "--rate", "0"])
    assert isinstance(r.exception, TwinferError) and "--rate must be > 0" in str(r.exception)


@pytest.mark.parametrize("port", ["70000", "-5"])
def test_port_out_of_range_is_exit_2_naming_the_range(monkeypatch, port):
    # bind() raised OverflowError: exit 1, "internal error"
    import ui.cmd_serve as cs

    built = []
    monkeypatch.setattr(cs, "build_engine", lambda *a, **k: built.append(1))
    r = CliRunner().invoke(app, ["serve", "--model", "tiny", "--load-format", "dummy", "--device", "cpu", "--port", port])
    assert isinstance(r.exception, TwinferError) and f"--port {port}: allowed: 0 to 65535" in str(r.exception)
    assert not built


def test_unknown_log_level_is_exit_2_before_the_engine(monkeypatch):
    # it was uvicorn's KeyError 'loud' (exit 1) after the model had loaded
    import uvicorn.config

    import ui.cmd_serve as cs

    assert set(cs.LOG_LEVELS) == set(uvicorn.config.LOG_LEVELS)   # the CLI's list is uvicorn's
    built = []
    monkeypatch.setattr(cs, "build_engine", lambda *a, **k: built.append(1))
    r = CliRunner().invoke(app, ["serve", "--model", "tiny", "--load-format", "dummy", "--device", "cpu", "--port", "0",
                                 "--log-level", "loud"])
    assert isinstance(r.exception, TwinferError) and "--log-level must be one of critical, error, warning" in str(r.exception)
    assert not built


def test_max_model_len_below_two_is_exit_2(monkeypatch):
    # 1 started a server that refused every request (a one-token prompt leaves no room for a token out)
    import ui.cmd_serve as cs

    built = []
    monkeypatch.setattr(cs, "build_engine", lambda *a, **k: built.append(1))
    r = CliRunner().invoke(app, ["serve", "--model", "tiny", "--load-format", "dummy", "--device", "cpu", "--port", "0",
                                 "--max-model-len", "1"])
    assert r.exit_code == 2 and "--max-model-len" in r.output and "greater than or equal to 2" in r.output
    assert not built
