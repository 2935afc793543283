"""Attack benchmark: every failure of issue 20 tried again, against `twinfer serve` and the CLI.

    python benchmarks/attack.py                  # ~3 min on 2 cores: starts tiny/dummy/cpu servers itself
    python benchmarks/attack.py --quick          # fewer rounds (the test suite's smoke run)
    python benchmarks/attack.py --json

Loopback only: it starts its own servers (`twinfer serve --model tiny --load-format dummy --device
cpu`, an API key set, ``--read-timeout 3 --max-connections 256``) on 127.0.0.1 and never talks
to another host. Bounded: each attack has its own deadline, the whole run ``--time-limit``; the
client side holds at most a few hundred sockets and a few 32 MiB bodies.

An attack is *ok* when the server answers as documented (a 4xx with OpenAI's error body naming the
parameter, 408/503 with Retry-After, a closed socket, exit status 2 with one ``error:`` line) and
stays healthy. A request is *lost* if it ends any other way (5xx, a stream cut without ``[DONE]``,
a connection error where an answer was due); KV blocks *leaked* are those still held when the
server is idle. RSS is the server's, after a warm-up and after every server attack.
Exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Awaitable, Callable

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from load_test import rss_mib, run_load, server_counts, wait_idle  # noqa: E402

KEY = "attack-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
READ_TIMEOUT_S = 3
MAX_CONNECTIONS = 256
CLI = [sys.executable, "-m", "ui.cli"]


class Target:
    """A started server: its URL, process and captured output."""

    def __init__(self, sp):
        self.sp, self.url, self.proc = sp, sp.url, sp.proc
        self.host, self.port = sp.url.removeprefix("http://").rsplit(":", 1)

    def rss(self) -> float:
        return rss_mib(self.proc.pid)

    def log_lines(self) -> int:
        return len(self.sp.output)


def start_target(max_model_len: int = 1024) -> Target:
    from executor.serve.launch import start_serve

    sp = start_serve(["--model", "tiny", "--load-format", "dummy", "--device", "cpu", "--host", "127.0.0.1",
                      "--port", "0", "--max-queue", "40", "--max-model-len", str(max_model_len), "--dtype", "fp32",
                      "--drain-timeout", "30", "--read-timeout", str(READ_TIMEOUT_S),
                      "--max-connections", str(MAX_CONNECTIONS)],
                     timeout_s=300, env={"TWINFER_DEBUG": "", "TWINFER_API_KEY": KEY})
    return Target(sp)


def _err(r: httpx.Response) -> dict | None:
    try:
        e = r.json().get("error")
    except (ValueError, AttributeError):
        return None
    return e if isinstance(e, dict) and {"message", "type", "param", "code"} <= set(e) else None


def expect_4xx(r: httpx.Response, status: int, *, param: str | None = "", code: str | None = "") -> list[str]:
    """[] if ``r`` is ``status`` with OpenAI's error body (and the given param/code), else what is wrong."""
    e = _err(r)
    if r.status_code != status or e is None:
        return [f"lost: {r.status_code} {r.text[:160]!r} (wanted {status} with an error body)"]
    out = []
    if param != "" and e["param"] != param:
        out.append(f"param {e['param']!r}, wanted {param!r}")
    if code != "" and e["code"] != code:
        out.append(f"code {e['code']!r}, wanted {code!r}")
    return out


# ----------------------------------------------------------------------------- server attacks


async def bodies(t: Target, c: httpx.AsyncClient) -> list[str]:
    """Bad bodies: each a 400 naming the parameter (items 8, 10, issue 19's refused fields)."""
    u, fails = t.url + "/v1/completions", []
    raw = {"content-type": "application/json", **AUTH}
    cases: list[tuple[str, dict | bytes, str | None, str | None]] = [
        ("surrogate-prompt", b'{"prompt": "a\\ud800b", "max_tokens": 2}', "prompt", "invalid_encoding"),
        ("surrogate-stop", b'{"prompt": "a", "stop": ["\\udfff"]}', "stop[0]", "invalid_encoding"),
        ("invalid-utf8", b'{"prompt": "\xc3\x28"}', None, "invalid_json"),
        ("int-5000-digits", b'{"prompt": "a", "max_tokens": 1' + b"0" * 5000 + b"}", None, "invalid_json"),
        ("deep-nesting", b'{"prompt": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", None, ""),
        ("bool-max-tokens", {"prompt": "a", "max_tokens": True}, "max_tokens", None),
        ("bool-seed", {"prompt": "a", "seed": False}, "seed", None),
        ("bool-prompt-id", {"prompt": [1, True]}, "prompt", None),
        ("stream-string", {"prompt": "a", "stream": "yes"}, "stream", None),
        ("stream-int", {"prompt": "a", "stream": 1}, "stream", None),
        ("string-max-tokens", {"prompt": "a", "max_tokens": "5"}, "max_tokens", None),
        ("tools", {"prompt": "a", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "unsupported_parameter"),
        ("response-format", {"prompt": "a", "response_format": {"type": "json_object"}}, "response_format", "unsupported_parameter"),
        ("logit-bias", {"prompt": "a", "logit_bias": {"5": 100}}, "logit_bias", "unsupported_parameter"),
        ("repetition-penalty", {"prompt": "a", "repetition_penalty": 1.3}, "repetition_penalty", "unsupported_parameter"),
        ("min-tokens", {"prompt": "a", "min_tokens": 4}, "min_tokens", "unsupported_parameter"),
        ("guided-json", {"prompt": "a", "guided_json": {"type": "object"}}, "guided_json", "unsupported_parameter"),
        ("stop-65", {"prompt": "a", "stop": ["zz"] * 65}, "stop", None),
        ("stop-ids-2000", {"prompt": "a", "stop_token_ids": list(range(2000))}, "stop_token_ids", None),
    ]
    for name, body, param, code in cases:
        kw = {"content": body, "headers": raw} if isinstance(body, bytes) else {"json": body, "headers": AUTH}
        r = await c.post(u, **kw)
        fails += [f"{name}: {x}" for x in expect_4xx(r, 400, param=param if param is not None else "", code=code)]
    r = await c.post(t.url + "/v1/chat/completions", headers=raw,
                     content=b'{"messages": [{"role": "user", "content": "\\ud83d"}]}')
    fails += [f"surrogate-chat: {x}" for x in expect_4xx(r, 400, param="messages[0].content")]
    return fails


async def stop_flood(t: Target, c: httpx.AsyncClient) -> list[str]:
    """Item 2: eight requests with a million stop strings each: 400 at once, /health stays fast."""
    body = json.dumps({"prompt": "a", "max_tokens": 4, "stop": ["xy"] * 1_000_000}).encode()
    hdr = {"content-type": "application/json", **AUTH}
    lat: list[float] = []

    async def probe() -> None:
        for _ in range(20):
            t0 = time.perf_counter()
            await c.get(t.url + "/health")
            lat.append(time.perf_counter() - t0)
            await asyncio.sleep(0.05)

    rs = await asyncio.gather(probe(), *(c.post(t.url + "/v1/completions", content=body, headers=hdr) for _ in range(8)))
    fails = [f"stop-flood: {x}" for r in rs[1:] for x in expect_4xx(r, 400)]
    lat.sort()
    if lat[len(lat) // 2] > 0.25:
        fails.append(f"stop-flood: /health median {lat[len(lat) // 2] * 1000:.0f} ms during the flood")
    return fails


async def value_bomb(t: Target, c: httpx.AsyncClient) -> list[str]:
    """A 30 MiB body of one-character strings (~450 MB as Python objects): refused before parsing."""
    n = 7_500_000
    body = b'{"prompt": "a", "stop": [' + b'"a",' * n + b'"a"]}'
    hdr = {"content-type": "application/json", **AUTH}
    rs = await asyncio.gather(*(c.post(t.url + "/v1/completions", content=body, headers=hdr) for _ in range(4)))
    return [f"value-bomb: {x}" for r in rs for x in expect_4xx(r, 400, code="too_many_values")]


async def auth_probes(t: Target, _c: httpx.AsyncClient) -> list[str]:
    """Item 11: the API and its docs need the key; /health does not."""
    async with httpx.AsyncClient(timeout=30) as c:   # no default key
        return await _auth_probes(t, c)


async def _auth_probes(t: Target, c: httpx.AsyncClient) -> list[str]:
    fails = []
    for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect", "/metrics", "/v1/models"):
        for hdr in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            r = await c.get(t.url + path, headers=hdr)
            if r.status_code != 401:
                fails.append(f"auth {path} {hdr}: {r.status_code}")
    if (await c.get(t.url + "/openapi.json", headers=AUTH)).status_code != 200:
        fails.append("auth: /openapi.json refused with the key")
    if (await c.get(t.url + "/health")).status_code != 200:
        fails.append("auth: /health not open")
    return fails


async def disconnects(t: Target, c: httpx.AsyncClient) -> list[str]:
    """Item 5: non-streaming clients that leave, and clients that leave mid-upload: aborts, never internal errors."""
    before = await server_counts(c, t.url)
    n = 12
    body = {"prompt": "a", "max_tokens": 400, "ignore_eos": True}

    async def leave() -> None:
        try:
            await c.post(t.url + "/v1/completions", json=body, headers=AUTH, timeout=0.3)
        except httpx.TimeoutException:
            return

    async def leave_mid_upload() -> None:
        _, w = await asyncio.open_connection(t.host, int(t.port))
        w.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"authorization: Bearer " + KEY.encode() + b"\r\ncontent-length: 5000\r\n\r\n{\"prompt\": ")
        await w.drain()
        await asyncio.sleep(0.2)
        w.close()

    await asyncio.gather(*(leave() for _ in range(n)), *(leave_mid_upload() for _ in range(n)))
    after = await wait_idle(c, t.url, 30)
    fails = []
    ie = after.get(("twinfer:request_rejected_total", "internal_error"), 0) - before.get(("twinfer:request_rejected_total", "internal_error"), 0)
    if ie:
        fails.append(f"disconnects: {ie:.0f} internal errors")
    ab = after.get(("twinfer:request_success_total", "abort"), 0) - before.get(("twinfer:request_success_total", "abort"), 0)
    done = sum(after.get(("twinfer:request_success_total", k), 0) - before.get(("twinfer:request_success_total", k), 0)
               for k in ("stop", "length"))
    if ab + done != n:
        fails.append(f"disconnects: {ab:.0f} aborts + {done:.0f} finished for {n} vanished clients")
    cd = after.get(("twinfer:request_rejected_total", "client_disconnected"), 0) - before.get(("twinfer:request_rejected_total", "client_disconnected"), 0)
    if cd != n:
        fails.append(f"disconnects: {cd:.0f} mid-upload disconnects counted, wanted {n}")
    return fails


async def request_id_reuse(t: Target, c: httpx.AsyncClient, rounds: int) -> list[str]:
    """Item 6: reuse an X-Request-Id right after disconnecting from it."""
    fails = []
    body = {"prompt": "a", "max_tokens": 200, "ignore_eos": True, "stream": True}
    for i in range(rounds):
        hdr = {**AUTH, "X-Request-Id": f"retry{i % 3}"}
        async with c.stream("POST", t.url + "/v1/completions", json=body, headers=hdr) as r:
            async for _ in r.aiter_lines():
                break
        r = await c.post(t.url + "/v1/completions", json={"prompt": "a", "max_tokens": 2}, headers=hdr)
        if r.status_code != 200:
            fails.append(f"request-id reuse {i}: {r.status_code} {r.text[:120]}")
    return fails


async def _hold(t: Target, first: bytes, trickle: bytes, every_s: float, limit_s: float) -> tuple[float, bytes]:
    """Open a connection, send ``first``, then a byte of ``trickle`` every ``every_s`` until the server closes it;
    (seconds until closed, what the server sent)."""
    t0 = time.monotonic()
    try:
        rd, w = await asyncio.open_connection(t.host, int(t.port))
    except OSError:
        return 0.0, b"(refused)"
    got = b""
    try:
        w.write(first)
        await w.drain()
        i = 0
        while time.monotonic() - t0 < limit_s:
            try:
                data = await asyncio.wait_for(rd.read(4096), timeout=every_s)
                if not data:
                    break
                got += data
                continue
            except asyncio.TimeoutError:
                pass
            if i < len(trickle):
                w.write(trickle[i:i + 1])
                i += 1
                try:
                    await w.drain()
                except (ConnectionError, OSError):
                    break
    except (ConnectionError, OSError):
        pass
    finally:
        w.close()
    return time.monotonic() - t0, got


async def slowloris(t: Target, c: httpx.AsyncClient, n: int) -> list[str]:
    """Item 7: ``n`` clients trickling headers (and some a body): each cut off by the read deadline, the cap
    answers the rest 503, the server serves again right after, and its log stays short."""
    log0 = t.log_lines()
    heads = [(_hold(t, b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n", b"x-slow: " + b"a" * 200, 0.5, 30))
             for _ in range(n)]
    body_first = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"authorization: Bearer " + KEY.encode() + b"\r\ncontent-length: 200\r\n\r\n{")
    bodies_ = [_hold(t, body_first, b'"prompt": "' + b"a" * 150, 0.5, 30) for _ in range(n // 6)]
    res = await asyncio.gather(*heads, *bodies_)
    fails = []
    slow = [s for s, _ in res if s > READ_TIMEOUT_S + 3]
    if slow:
        fails.append(f"slowloris: {len(slow)} connections held past the {READ_TIMEOUT_S} s deadline (max {max(slow):.1f} s)")
    answers = Counter((got.split(b" ", 2)[1].decode() if got.startswith(b"HTTP/1.1 ") else "closed") for _, got in res)
    if set(answers) - {"408", "503", "closed"}:
        fails.append(f"slowloris: unexpected answers {dict(answers)}")
    ok = False
    for _ in range(20):   # served again at once
        r = await c.post(t.url + "/v1/completions", json={"prompt": "a", "max_tokens": 2}, headers=AUTH)
        if r.status_code == 200:
            ok = True
            break
        await asyncio.sleep(0.25)
    if not ok:
        fails.append("slowloris: the server did not serve again after the attack")
    grew = t.log_lines() - log0
    if grew > 200:
        fails.append(f"slowloris: {grew} log lines")
    return fails


async def connection_flood(t: Target, c: httpx.AsyncClient) -> list[str]:
    """Connections past the cap get 503 + Retry-After and are closed; the held ones time out; service resumes."""
    held = []
    for _ in range(MAX_CONNECTIONS):
        try:
            held.append(await asyncio.open_connection(t.host, int(t.port)))
        except OSError as e:
            return [f"flood: could not open connection {len(held)}: {e}"]
    await asyncio.sleep(0.3)
    extra = []
    for _ in range(20):
        rd, w = await asyncio.open_connection(t.host, int(t.port))
        try:
            extra.append(await asyncio.wait_for(rd.read(4096), timeout=5))
        except asyncio.TimeoutError:
            extra.append(b"")
        w.close()
    fails = []
    bad = [x[:60] for x in extra if not (x.startswith(b"HTTP/1.1 503") and b"retry-after" in x.lower())]
    if bad:
        fails.append(f"flood: {len(bad)} of 20 connections past the cap not answered 503 + Retry-After: {bad[:2]}")
    for _, w in held:
        w.close()
    for _ in range(40):
        try:
            r = await c.post(t.url + "/v1/completions", json={"prompt": "a", "max_tokens": 2}, headers=AUTH)
            if r.status_code == 200:
                return fails
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.25)
    return fails + ["flood: the server did not serve again"]


async def big_headers(t: Target, c: httpx.AsyncClient) -> list[str]:
    _, got = await _hold(t, b"GET /health HTTP/1.1\r\nhost: x\r\n" + b"x-big: " + b"a" * 20_000, b"a" * 10, 0.2, 10)
    return [] if got.startswith(b"HTTP/1.1 4") or got == b"" else [f"big headers: {got[:80]!r}"]


async def load(t: Target, c: httpx.AsyncClient, requests: int) -> tuple[list[str], dict]:
    """Streaming load with a third of the clients leaving (the load test's mix), three waves."""
    r = await run_load(t.url, requests=requests, concurrency=48, waves=3, pid=t.proc.pid, quiet=True,
                       mix={"stream": 0.35, "chat_stream": 0.15, "whole": 0.1, "disconnect": 0.3, "garbage": 0.1},
                       headers=AUTH)
    fails = [f"load: lost {x}" for x in r["lost_examples"]] if r["lost"] else []
    if not r["server_agrees"]:
        fails.append("load: server counters disagree with the client")
    return fails, r


# ----------------------------------------------------------------------------- drain with a second signal


def drain_twice(rounds: int) -> tuple[list[str], int]:
    """Item 3: SIGINT, a 503 (with Retry-After) for a new request while draining, then SIGINT again: every
    stream ends with finish_reason 'abort' and [DONE], the process exits 0 soon after. ``rounds`` servers."""
    fails, streams_total = [], 0
    for k in range(rounds):
        t = start_target(max_model_len=4096)
        got: list[tuple[bool, str | None]] = []

        async def run() -> None:
            async with httpx.AsyncClient(timeout=60) as c:
                async def stream() -> None:
                    body = {"prompt": "a", "max_tokens": 3000, "ignore_eos": True, "stream": True}
                    done, reason = False, None
                    try:
                        async with c.stream("POST", t.url + "/v1/completions", json=body, headers=AUTH) as r:
                            async for line in r.aiter_lines():
                                if line == "data: [DONE]":
                                    done = True
                                elif line.startswith("data: "):
                                    for ch in json.loads(line[6:]).get("choices", []):
                                        reason = ch.get("finish_reason") or reason
                    except (httpx.HTTPError, ValueError) as e:
                        reason = f"{type(e).__name__}"
                    got.append((done, reason))

                tasks = [asyncio.create_task(stream()) for _ in range(16)]
                await asyncio.sleep(2.0)
                t.proc.send_signal(signal.SIGINT)
                await asyncio.sleep(0.5)
                r = await c.post(t.url + "/v1/completions", json={"prompt": "a", "max_tokens": 2}, headers=AUTH)
                if r.status_code != 503 or r.headers.get("retry-after") is None:
                    fails.append(f"drain {k}: a request while draining got {r.status_code}, not 503 + Retry-After")
                t.proc.send_signal(signal.SIGINT)
                await asyncio.gather(*tasks)

        t0 = time.monotonic()
        asyncio.run(run())
        try:
            rc = t.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            t.proc.kill()
            rc = "hung"
        streams_total += len(got)
        cut = [g for g in got if not (g[0] and g[1] == "abort")]
        if cut:
            fails.append(f"drain {k}: {len(cut)} of {len(got)} streams not ended with abort + [DONE]: {cut[:3]}")
        if rc != 0:
            fails.append(f"drain {k}: exit status {rc}")
        if time.monotonic() - t0 > 25:
            fails.append(f"drain {k}: took {time.monotonic() - t0:.0f} s after the signals")
        tb = sum("Traceback" in line for line in t.sp.output)
        if tb:
            fails.append(f"drain {k}: {tb} tracebacks in the server log")
    return fails, streams_total


# ----------------------------------------------------------------------------- CLI and UI inputs


def cli_attacks(tmp: Path) -> dict[str, list[str]]:
    """Items 1, 4, 9: each exits 2 with one error line naming the file or field, in bounded memory."""
    corpus = Path(__file__).resolve().parents[1] / "tests" / "fuzz_corpus" / "trace_jsonl"
    (tmp / "not_utf8.jsonl").write_bytes(b"\xff\xfe\n")
    (tmp / "not_json.json").write_text("nope", encoding="utf-8")
    (tmp / "dir.jsonl").mkdir(exist_ok=True)
    few = ["--requests", "20"]
    cases = {
        "cli-trace-hash-bomb": (["simulate", "--trace", str(corpus / "coarse_hash_ids_on_many_lines_exhaust_memory.jsonl")], "hash"),
        "cli-trace-huge-int": (["simulate", "--trace", str(corpus / "integer_of_5000_digits.jsonl")], "4300"),
        "cli-trace-deep": (["simulate", "--trace", str(corpus / "deeply_nested_line.jsonl")], "nested"),
        "cli-trace-not-utf8": (["simulate", "--trace", str(tmp / "not_utf8.jsonl")], "UTF-8"),
        "cli-trace-unreadable": (["simulate", "--trace", str(tmp / "dir.jsonl")], "dir.jsonl"),
        "cli-requests-1e9": (["simulate", "--requests", "1000000000"], "num_requests"),
        "cli-csv-unwritable": (["simulate", *few, "--csv", str(tmp / "no" / "dir" / "m.csv")], "m.csv"),
        "cli-perfetto-unwritable": (["simulate", *few, "--perfetto", str(tmp / "dir.jsonl")], "dir.jsonl"),
        "cli-error-band-not-json": (["simulate", *few, "--error-band", str(tmp / "not_json.json")], "not_json.json"),
        "cli-error-band-missing": (["simulate", *few, "--error-band", str(tmp / "missing.json")], "missing.json"),
    }
    out = {}
    env = {k: v for k, v in os.environ.items() if k != "TWINFER_DEBUG"}
    for name, (args, needle) in cases.items():
        p = subprocess.run(CLI + args, capture_output=True, text=True, timeout=120, env=env, cwd=tmp)
        errs = [x for x in p.stderr.splitlines() if x.startswith("error:")]
        fails = []
        if p.returncode != 2 or len(errs) != 1 or needle not in " ".join(p.stderr.split()) or "Traceback" in p.stderr:
            fails.append(f"{name}: exit {p.returncode}: {p.stderr.strip()[-300:]!r}")
        out[name] = fails
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    if peak > 1024:
        out["cli-memory"] = [f"a CLI attack peaked at {peak:.0f} MiB"]
    else:
        out["cli-memory"] = []
    return out


def upload_attack(tmp: Path) -> list[str]:
    """Item 1 (UI): a 22 KB trace upload whose hash ids would expand to GBs is refused; memory stays small."""
    code = ("import json, os, resource; os.environ['TWINFER_UI_UPLOADS'] = %r\n"
            "from ui.app_uploads import save_trace\nfrom twinfer.errors import TwinferError\n"
            "lines = '\\n'.join(json.dumps({'timestamp': i, 'input_length': 1 << 24, 'output_length': 1, 'hash_ids': [i],"
            " 'hash_block_size': 1 << 24}) for i in range(200))\n"
            "try:\n    save_trace('t.jsonl', lines.encode(), 'jsonl'); print('ACCEPTED')\n"
            "except TwinferError as e:\n    print('REFUSED', len(lines))\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)\n") % str(tmp / "uploads")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = p.stdout.split()
    if p.returncode or "REFUSED" not in lines:
        return [f"upload: {p.stdout[-200:]} {p.stderr[-300:]}"]
    peak = int(lines[-1])
    return [f"upload: peak {peak} MiB"] if peak > 512 else []


# ----------------------------------------------------------------------------- the run


async def server_attacks(t: Target, args, results: dict[str, list[str]], figures: dict) -> None:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=16)
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0), limits=limits, headers=AUTH) as c:
        for _ in range(2):   # warm-up: allocator and torch caches for the shapes the attacks use
            await load(t, c, 60)
        await wait_idle(c, t.url, 30)
        figures["rss_before_mib"] = round(t.rss(), 1)
        steps: list[tuple[str, Callable[[], Awaitable[list[str]]]]] = [
            ("bad-bodies", lambda: bodies(t, c)),
            ("stop-flood", lambda: stop_flood(t, c)),
            ("value-bomb", lambda: value_bomb(t, c)),
            ("auth-probes", lambda: auth_probes(t, c)),
            ("disconnects", lambda: disconnects(t, c)),
            ("request-id-reuse", lambda: request_id_reuse(t, c, args.reuse_rounds)),
            ("slowloris", lambda: slowloris(t, c, args.slow_clients)),
            ("connection-flood", lambda: connection_flood(t, c)),
            ("big-headers", lambda: big_headers(t, c)),
        ]
        for name, step in steps:
            t0 = time.monotonic()
            try:
                results[name] = await asyncio.wait_for(step(), timeout=120)
            except Exception as e:  # noqa: BLE001 - an attack that breaks the client is a failure, reported
                results[name] = [f"{name}: {type(e).__name__}: {e}"]
            print(f"  {name}: {'ok' if not results[name] else results[name][:2]} ({time.monotonic() - t0:.1f} s, "
                  f"server RSS {t.rss():.0f} MiB)", file=sys.stderr, flush=True)
        fails, r = await load(t, c, args.load_requests)
        results["load"] = fails
        figures["load"] = {k: r[k] for k in ("sent", "completed", "rejected", "aborted", "lost", "blocks_leaked")}
        idle = await wait_idle(c, t.url, 60)
        figures["kv_blocks_held_idle"] = idle["twinfer:kv_blocks_held"]
        figures["internal_errors"] = idle.get(("twinfer:request_rejected_total", "internal_error"), 0)
        figures["rss_after_mib"] = round(t.rss(), 1)
        figures["lost"] = r["lost"] + sum(x.startswith(("lost", "load: lost")) or ": lost" in x
                                          for v in results.values() for x in v)
        figures["leaked"] = figures["kv_blocks_held_idle"] + r["blocks_leaked"]
        figures["server_log_lines"] = t.log_lines()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds: 1 drain run, 60 slow clients, 120 load requests")
    ap.add_argument("--drain-rounds", type=int, default=None)
    ap.add_argument("--slow-clients", type=int, default=None)
    ap.add_argument("--reuse-rounds", type=int, default=None)
    ap.add_argument("--load-requests", type=int, default=None)
    ap.add_argument("--time-limit", type=float, default=900.0, help="the whole run's deadline (a watchdog exits 1)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    q = args.quick
    args.drain_rounds = args.drain_rounds or (1 if q else 3)
    args.slow_clients = args.slow_clients or (60 if q else 300)
    args.reuse_rounds = args.reuse_rounds or (10 if q else 50)
    args.load_requests = args.load_requests or (120 if q else 600)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4096)), hard))
    signal.signal(signal.SIGALRM, lambda *_: (print("attack: time limit reached", file=sys.stderr), os._exit(1)))
    signal.alarm(int(args.time_limit))

    t_start = time.monotonic()
    results: dict[str, list[str]] = {}
    figures: dict = {}
    with tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(tmpd)
        print("CLI and upload attacks ...", file=sys.stderr, flush=True)
        results.update(cli_attacks(tmp))
        results["upload-hash-bomb"] = upload_attack(tmp)
        print("server attacks (tiny/dummy/cpu) ...", file=sys.stderr, flush=True)
        t = start_target()
        try:
            asyncio.run(server_attacks(t, args, results, figures))
        finally:
            t.sp.stop()
        print(f"drain with a second SIGINT x{args.drain_rounds} ...", file=sys.stderr, flush=True)
        results["drain-second-sigint"], figures["drain_streams"] = drain_twice(args.drain_rounds)

    failed = {k: v for k, v in results.items() if v}
    by_kind = Counter({k: len(v) for k, v in failed.items()})
    growth = (figures["rss_after_mib"] - figures["rss_before_mib"]) / figures["rss_before_mib"]
    summary = {
        "attacks_tried": len(results), "ok": len(results) - len(failed), "failures_by_kind": dict(by_kind),
        "failures": sum(by_kind.values()), "lost": figures["lost"], "leaked_kv_blocks": figures["leaked"],
        "internal_errors": figures["internal_errors"], "rss_before_mib": figures["rss_before_mib"],
        "rss_after_mib": figures["rss_after_mib"], "rss_growth": round(growth, 3), "load": figures["load"],
        "drain_streams_checked": figures["drain_streams"], "server_log_lines": figures["server_log_lines"],
        "wall_s": round(time.monotonic() - t_start, 1), "examples": {k: v[:3] for k, v in failed.items()},
    }
    if abs(growth) > 0.10:
        summary["failures"] += 1
        summary["failures_by_kind"]["rss-growth"] = 1
    if args.json:
        print(json.dumps(summary))
    else:
        for k in sorted(results):
            print(f"{k:<28} {'ok' if not results[k] else 'FAILED: ' + '; '.join(results[k][:2])}")
        print(f"\nattacks tried {summary['attacks_tried']}, ok {summary['ok']}, failures {summary['failures']} "
              f"{dict(summary['failures_by_kind']) or ''}")
        print(f"lost {summary['lost']}, leaked KV blocks {summary['leaked_kv_blocks']:.0f}, internal errors "
              f"{summary['internal_errors']:.0f}; load: {summary['load']}")
        print(f"server RSS before {summary['rss_before_mib']} MiB, after {summary['rss_after_mib']} MiB "
              f"({summary['rss_growth'] * 100:+.1f}%); drain streams checked {summary['drain_streams_checked']}; "
              f"server log {summary['server_log_lines']} lines; wall {summary['wall_s']} s")
    sys.exit(1 if summary["failures"] or summary["lost"] or summary["leaked_kv_blocks"] else 0)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
