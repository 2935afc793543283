"""A small run of benchmarks/load_test.py against `twinfer serve` (tiny, dummy, CPU), then Ctrl-C mid-stream.

Concurrent streaming clients, some leaving mid-stream, some sending garbage, some turned away by
a small --max-queue: every request is accounted for (client and server agree), no KV block is
leaked, memory stays flat between waves; SIGINT twice during streams ends each cleanly and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

_spec = importlib.util.spec_from_file_location("load_test", Path(__file__).parent.parent / "benchmarks" / "load_test.py")
load_test = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("load_test", load_test)  # dataclasses look their module up by name
_spec.loader.exec_module(load_test)


def test_load_accounts_for_every_request_and_leaks_nothing():
    args = argparse.Namespace(model="tiny", device="cpu", max_queue=10, max_model_len=1024)
    proc, url = load_test.start_server(args)
    try:
        r = asyncio.run(load_test.run_load(url, requests=54, concurrency=14, waves=3, seed=1, pid=proc.pid,
                                           max_tokens=16, time_limit_s=120, quiet=True))
        assert r["lost"] == 0, r["lost_examples"]
        assert r["accounted"] and r["server_agrees"], r
        assert r["sent"] == 54 and r["completed"] > 0 and r["aborted"] > 0 and r["rejected"] > 0
        assert r["blocks_leaked"] == 0 and r["free_blocks_end"] == r["kv_blocks_total"]
        assert r["rss_growth_after_warmup_mib"] is not None and r["rss_growth_after_warmup_mib"] < 64, r["rss_after_wave_mib"]

        # Ctrl-C twice while streams run (the second during the drain): each still ends with a
        # finish_reason and [DONE], the engine stops, exit status 0 (issue 20, item 3)
        ends: list[tuple] = []
        started = threading.Barrier(4, timeout=120)

        def client(i: int) -> None:
            with httpx.Client(timeout=120) as c:
                with c.stream("POST", url + "/v1/chat/completions", json={
                        "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 500,
                        "stream": True, "ignore_eos": True}) as resp:
                    it = resp.iter_lines()
                    next(it)
                    started.wait()
                    reason, done = None, False
                    for line in it:
                        if line == "data: [DONE]":
                            done = True
                        elif line.startswith("data: "):
                            ev = json.loads(line[6:])
                            for ch in ev.get("choices", []):
                                reason = ch.get("finish_reason") or reason
                    ends.append((reason, done))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        started.wait()
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        for t in threads:
            t.join(timeout=60)
        assert proc.wait(timeout=60) == 0, "".join(proc.output[-20:])
        assert time.monotonic() - t0 < 45
        assert sorted(ends) == [("abort", True)] * 3
    finally:
        if proc.poll() is None:
            proc.kill()
