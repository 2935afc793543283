"""``twinfer plan --ray ADDRESS`` that cannot be reached: one clear error naming --ray (exit 2), at once, never a hang
(ray.init retries an address where nothing listens for minutes) nor an 'internal error'."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from twinfer.errors import TwinferError
from ui.cli import app

ray = pytest.importorskip("ray")

from planner.parallel import Runner  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def no_cluster(monkeypatch):
    """ray as if no cluster were connected; reaching ray.init fails the test instead of waiting on ray's retries."""
    monkeypatch.setattr(ray, "is_initialized", lambda: False)

    def init(*a, **kw):
        raise AssertionError("ray.init reached: it would retry an unreachable address for minutes")
    monkeypatch.setattr(ray, "init", init)


def test_nothing_listening_is_refused_before_ray_init(no_cluster):
    addr = f"127.0.0.1:{_free_port()}"
    with pytest.raises(TwinferError, match=f"--ray {addr}: nothing answers"):
        with Runner(1, addr):
            pass


@pytest.mark.parametrize("err", [ConnectionError("Could not find any running Ray instance."),
                                 ValueError("Invalid address format: garbage")])
def test_ray_init_errors_name_the_flag(monkeypatch, err):
    monkeypatch.setattr(ray, "is_initialized", lambda: False)

    def init(*a, **kw):
        raise err
    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(TwinferError, match=f"--ray auto: {err}"):
        with Runner(1, "auto"):
            pass


def test_cli_bad_ray_address_exits_2(no_cluster):
    addr = f"127.0.0.1:{_free_port()}"
    r = CliRunner().invoke(app, ["plan", "-m", "qwen3-30b-a3b", "--hw", "h200", "-g", "2", "--slo",
                                 "ttft_p90=2s,tpot_p90=50ms", "--simulate", "0", "--ray", addr])
    assert isinstance(r.exception, TwinferError) and "--ray" in str(r.exception)
