"""Connection-level defences uvicorn lacks: a read deadline, a connection cap, and rate-limited logs.

uvicorn times out idle keep-alive connections but not a request that arrives slowly: a client
that trickles its headers (or body) a byte at a time holds a socket, a file descriptor and a
parser forever ("slowloris"); a few hundred of them exhaust the process's descriptors and every
new client is refused. ``GuardedH11Protocol`` is uvicorn's h11 protocol with two additions:

- **read deadline**: from a request's first byte (or the connection's start), its headers and
  body must arrive within ``read_timeout_s``; a request still incomplete then is answered 408
  (headers) or disconnected (body: the app sees the client leave) and the socket closed;
- **connection cap**: past ``max_connections`` open connections a new one is answered 503 with
  ``Retry-After`` and closed at once, so descriptors stay within the process limit.

Headers are bounded by h11 itself (``h11_max_incomplete_event_size``, set by the server).

``RateLimitedLog`` keeps a flood of identical warnings (malformed requests, resets) from
filling the disk: per logger and message template, ``burst`` records per ``window_s``, then one
line saying how many were dropped.
"""

from __future__ import annotations

import json
import logging
import time

from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_READ_TIMEOUT_S = 30.0   # 32 MiB (the body limit) at ~1 MB/s; a slow client gets no longer
DEFAULT_MAX_CONNECTIONS = 8192
FD_RESERVE = 64                 # descriptors kept for the process itself (engine, logs, libraries)

def _raw_error(status: str, message: str, type_: str, code: str, extra: str = "") -> bytes:
    """A whole HTTP/1.1 error response in OpenAI's shape, for answers sent before any app runs."""
    body = json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}}).encode()
    head = (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{extra}connection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n")
    return head.encode() + body


_TIMEOUT_408 = _raw_error("408 Request Timeout", "request not received in time", "invalid_request_error", "timeout")
_BUSY_503 = _raw_error("503 Service Unavailable", "too many open connections", "service_unavailable", "server_busy",
                       "retry-after: 1\r\n")


def connection_cap(requested: int | None = None) -> int:
    """Connections to allow: ``requested`` (default 8192), but never more than the descriptors left.

    Raises the soft RLIMIT_NOFILE to the hard one first (as vLLM does), since the default 1024
    is below what a busy server needs.
    """
    want = requested or DEFAULT_MAX_CONNECTIONS
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
            target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (ValueError, OSError):
                pass
        if soft != resource.RLIM_INFINITY:
            want = min(want, max(8, soft - FD_RESERVE))
    except ImportError:  # not POSIX
        pass
    return want


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a read deadline and a connection cap (see the module doc).

    Settings come from the uvicorn ``Config``: ``twinfer_read_timeout_s``, ``twinfer_max_connections``.
    """

    def __init__(self, config, server_state, app_state, _loop=None):
        super().__init__(config, server_state, app_state, _loop)
        self._read_timeout_s = getattr(config, "twinfer_read_timeout_s", DEFAULT_READ_TIMEOUT_S)
        self._max_connections = getattr(config, "twinfer_max_connections", DEFAULT_MAX_CONNECTIONS)
        self._read_timer = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self._max_connections:
            transport.write(_BUSY_503)
            transport.close()
            return
        self._arm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._read_timer is None and self._between_requests():
            self._arm()   # the first byte of the next request on a kept-alive connection
        super().data_received(data)
        c = self.cycle
        if c is not None and not c.response_complete and not c.more_body:
            self._disarm()  # headers and body are in: the app has the whole request

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(self._read_timeout_s, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        if self._between_requests():  # headers incomplete: nobody is waiting on this request yet
            self.transport.write(_TIMEOUT_408)
        self.transport.close()        # a body still trickling: the app sees the client disconnect


class RateLimitedLog(logging.Filter):
    """Pass at most ``burst`` records per (logger, template) each ``window_s``; then say how many were dropped."""

    def __init__(self, burst: int = 10, window_s: float = 10.0, clock=time.monotonic):
        super().__init__()
        self.burst, self.window_s, self.clock = burst, window_s, clock
        self._seen: dict[tuple[str, str], list] = {}   # key -> [window start, passed, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg)[:200])
        now = self.clock()
        slot = self._seen.get(key)
        if slot is None or now - slot[0] >= self.window_s:
            dropped = slot[2] if slot else 0
            if len(self._seen) > 1000:   # bounded: templates are few, but messages may be formatted
                self._seen.clear()
            self._seen[key] = [now, 1, 0]
            if dropped:
                record.msg = f"{record.msg} [{dropped} similar messages dropped in the last {self.window_s:g} s]"
            return True
        if slot[1] < self.burst:
            slot[1] += 1
            return True
        slot[2] += 1
        return False


LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "asyncio", "twinfer")


def rate_limit_logs(burst: int = 10, window_s: float = 10.0) -> RateLimitedLog:
    """Install one ``RateLimitedLog`` on the loggers a hostile client can make talk."""
    f = RateLimitedLog(burst, window_s)
    for name in LOGGERS:
        lg = logging.getLogger(name)
        for old in [x for x in lg.filters if isinstance(x, RateLimitedLog)]:
            lg.removeFilter(old)
        lg.addFilter(f)
    return f
