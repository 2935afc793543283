"""``twinfer ui``: serve the Streamlit capacity planner (ui/app.py) on localhost and print its URL."""

from __future__ import annotations

import errno
import importlib.util
import signal
import socket
import subprocess
import sys
from pathlib import Path

import typer

from twinfer.errors import TwinferError

APP = Path(__file__).with_name("app.py")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port_free(host: str, port: int) -> None:
    """Refuse a port something already listens on: Streamlit would pick another or fail after we printed the URL."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Streamlit's server: a TIME_WAIT port is free, a listening one is not
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                raise TwinferError(f"--port {port}: {host}:{port} is in use (or not allowed); pick another, or --port 0 for any free one") from None
            raise TwinferError(f"--host {host!r}: cannot listen there ({e.strerror})") from None


def run_until_signal(cmd: list[str]) -> int:
    """Run ``cmd`` as a child and stop it with us: SIGTERM/SIGINT here terminate it before we return."""
    proc = subprocess.Popen(cmd)
    stopped = []

    def stop(signum, frame) -> None:
        stopped.append(signum)
        proc.terminate()

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        rc = proc.wait()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0 if stopped else rc


def streamlit_command(port: int, host: str = "127.0.0.1", open_browser: bool = False) -> list[str]:
    """The `streamlit run` command line: headless unless asked, no telemetry, 5 MB uploads."""
    from ui.app_uploads import MAX_UPLOAD_BYTES

    return [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.port", str(port), "--server.address", host,
        "--server.headless", "false" if open_browser else "true",
        "--browser.gatherUsageStats", "false",
        "--server.maxUploadSize", str(max(1, MAX_UPLOAD_BYTES // 2**20)),
        "--server.fileWatcherType", "none",  # a served planner does not hot-reload its own code
        "--client.toolbarMode", "viewer",  # no "Deploy" button: this is a local tool
    ]


def register(app: typer.Typer) -> None:
    @app.command("ui")
    def ui(
        port: int = typer.Option(8501, "--port", "-p", help="port to serve on (0: any free port)"),
        host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (0.0.0.0: every interface)"),
        open_browser: bool = typer.Option(False, "--open/--no-open", help="open a browser tab"),
    ) -> None:
        """Open the capacity planner in the browser (Streamlit): model, hardware, traffic, SLO -> plan, cost, Pareto chart."""
        if importlib.util.find_spec("streamlit") is None:  # imported lazily: the CLI must not need it
            raise TwinferError("twinfer ui needs streamlit and plotly: pip install 'twinfer[ui]'")  # cli.main escapes the brackets
        if not 0 <= port <= 65535:
            raise TwinferError(f"--port {port}: must be in 0-65535")
        if port == 0:
            port = free_port(host)
        check_port_free(host, port)
        shown = "localhost" if host in ("127.0.0.1", "0.0.0.0") else host
        print(f"twinfer capacity planner: http://{shown}:{port}  (Ctrl-C to stop)", flush=True)
        rc = run_until_signal(streamlit_command(port, host, open_browser))
        if rc:
            raise typer.Exit(rc)
