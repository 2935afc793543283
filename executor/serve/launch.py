"""Start ``twinfer serve`` as a child process and wait until it says where it listens.

Used by the load test (benchmarks/load_test.py) and the tests that talk to a real server. The
server prints ``ready at http://HOST:PORT/v1`` once the engine is built and the port is bound
(``--port 0`` picks a free one); everything it prints is kept in ``ServeProcess.output`` and
drained by a thread, so a chatty server never blocks on a full pipe.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field


@dataclass
class ServeProcess:
    proc: subprocess.Popen
    url: str                      # base URL without /v1
    output: list[str] = field(default_factory=list)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGINT (graceful drain and engine shutdown), then kill after ``timeout_s``; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_serve(args: list[str], timeout_s: float = 240.0, env: dict | None = None) -> ServeProcess:
    """``python -m ui.cli serve *args``; returns once it is ready, raises RuntimeError with its output if it is not."""
    cmd = [sys.executable, "-m", "ui.cli", "serve", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TWINFER_DEBUG": "1", **(env or {})})
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if "ready at" in line:
            url = line.split("ready at ")[1].split()[0].removesuffix("/v1")
            threading.Thread(target=lambda: [seen.append(x) for x in proc.stdout], daemon=True).start()
            return ServeProcess(proc, url, seen)
    proc.kill()
    proc.wait()
    raise RuntimeError("twinfer serve did not start:\n" + "".join(seen))
