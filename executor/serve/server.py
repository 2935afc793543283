"""Running the app under uvicorn: in the foreground for the CLI, or in a thread for tests.

The listening socket is bound before uvicorn starts, so port 0 (any free port) works and the
caller learns the real URL without racing another process for a guessed port.

Shutdown (SIGTERM, SIGINT / Ctrl-C, or ``stop()``): the app drains (``app.state.drain``: new
requests, on new or open connections, get 503 with Retry-After while the listener stays open, so a
load balancer sees "busy" rather than "refused"; in-flight requests get the drain timeout to finish,
the rest are aborted and their streams end with finish_reason 'abort' and ``[DONE]``), then the
listener closes, uvicorn closes the connections and the lifespan stops the engine. The process
then exits 0: a graceful stop is not a crash (uvicorn would otherwise re-raise the signal after it
finished). A second signal cuts the grace period short but still ends every stream properly and
stops the engine (uvicorn's own second Ctrl-C cancels streams mid-chunk and skips the engine's
shutdown); only a third leaves without waiting.

Connections: see ``executor.serve.guard`` (read deadline, connection cap, rate-limited logs).
"""

from __future__ import annotations

import asyncio
import errno
import socket
import threading
import time
from typing import Callable

import uvicorn

from executor.serve.guard import DEFAULT_READ_TIMEOUT_S, GuardedH11Protocol, connection_cap, rate_limit_logs
from twinfer.errors import TwinferError

MAX_HEADER_BYTES = 16 * 1024   # request line + headers (h11's default, stated); past it: 400 and close


def bind_socket(host: str, port: int, listen: bool = True) -> socket.socket:
    """A listening TCP socket on host:port (port 0 picks a free one); a port in use or a host we cannot listen
    on is a user error naming the flag (TwinferError), not an internal OSError. ``listen=False`` only reserves
    the port (connections are refused, not queued, until ``listen_on(sock)``)."""
    if not 0 <= port <= 65535:   # else bind() raises OverflowError, an internal error to the CLI
        raise TwinferError(f"--port {port}: allowed: 0 to 65535 (0 picks a free port)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno in (errno.EADDRINUSE, errno.EACCES):
            raise TwinferError(f"--port {port}: {host}:{port} is in use (or not allowed); pick another, or --port 0 for any "
                               "free one") from None
        raise TwinferError(f"--host {host!r}: cannot listen there ({e.strerror})") from None
    sock.set_inheritable(True)
    return listen_on(sock) if listen else sock


def listen_on(sock: socket.socket) -> socket.socket:
    """Start accepting connections on a bound socket (another server may have taken the port meanwhile)."""
    try:
        sock.listen(2048)
    except OSError as e:
        port = sock.getsockname()[1]
        sock.close()
        raise TwinferError(f"--port {port}: taken by another server while the engine was built ({e.strerror}); "
                           "pick another, or --port 0") from None
    return sock


def url_of(sock: socket.socket) -> str:
    """http://host:port of a bound socket (IPv6 hosts bracketed)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _DrainingServer(uvicorn.Server):
    """uvicorn.Server that stops accepting, then drains the app, before its own shutdown."""

    def __init__(self, config: uvicorn.Config, drain: Callable | None):
        super().__init__(config)
        self._drain = drain
        self.signals = 0      # shutdown signals received
        self.hurry = False    # a second one: skip the grace period (streams still end properly)

    def handle_exit(self, sig, frame) -> None:
        # runs in the signal handler: set flags only
        self.signals += 1
        if self.signals == 1:
            self.should_exit = True
        elif self.signals == 2:
            self.hurry = True
        else:
            self.force_exit = True
        # a drained stop is a clean exit (status 0), not a death by the signal uvicorn would re-raise
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list):
            captured.clear()

    async def shutdown(self, sockets=None) -> None:
        if self._drain is not None:  # the listener stays open: new requests get 503 + Retry-After
            try:
                await self._drain(should_stop=lambda: self.hurry or self.force_exit)
            except Exception:  # noqa: BLE001 - shutting down regardless
                pass
        await super().shutdown(sockets)


def _server(app, log_level: str, read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
            max_connections: int | None = None) -> uvicorn.Server:
    # one event loop in one process: the engine's asyncio task lives beside the HTTP handlers
    cap = connection_cap(max_connections)
    config = uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_graceful_shutdown=5,
                            access_log=log_level == "debug", http=GuardedH11Protocol,
                            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                            # requests (tasks) beyond the connections cannot exist; +1: uvicorn refuses at >=
                            limit_concurrency=cap + 1)
    config.twinfer_read_timeout_s, config.twinfer_max_connections = read_timeout_s, cap
    rate_limit_logs()
    return _DrainingServer(config, getattr(getattr(app, "state", None), "drain", None))


def serve_forever(app, sock: socket.socket, *, log_level: str = "info",
                  on_ready: Callable[[], None] | None = None, read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
                  max_connections: int | None = None) -> None:
    """Run until Ctrl-C; ``on_ready`` is called once the app (and its engine) has started."""
    server = _server(app, log_level, read_timeout_s, max_connections)

    async def main() -> None:
        async def announce() -> None:
            while not server.started:
                if server.should_exit:
                    return
                await asyncio.sleep(0.05)
            if on_ready:
                on_ready()

        watcher = asyncio.create_task(announce())
        try:
            await server.serve(sockets=[sock])
        finally:
            watcher.cancel()

    asyncio.run(main())


class BackgroundServer:
    """The app served from a daemon thread (tests, notebooks); ``stop()`` shuts it down."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                 read_timeout_s: float = DEFAULT_READ_TIMEOUT_S, max_connections: int | None = None):
        self._sock = bind_socket(host, port)
        self.url = url_of(self._sock)
        self._server = _server(app, log_level, read_timeout_s, max_connections)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def start(self, timeout_s: float = 60.0) -> "BackgroundServer":
        """Start and wait until uvicorn reports the app started."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server at {self.url} did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Ask uvicorn to exit and wait for the thread."""
        self._server.should_exit = True
        self._thread.join(timeout=15)
        self._sock.close()

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
