"""Load test of `twinfer serve`: many concurrent streaming clients, some leaving mid-stream, some sending garbage.

    python benchmarks/load_test.py                         # starts `twinfer serve --model tiny --load-format dummy --device cpu`
    python benchmarks/load_test.py --requests 2000 --concurrency 64 --waves 4
    python benchmarks/load_test.py --url http://127.0.0.1:8000   # a server already running on this machine

Loopback only (a --url must point at 127.0.0.1 / ::1 / localhost), bounded in requests and in time
(--time-limit). Every request must end one of three ways, and is counted by the client:

* completed: the stream ended with a finish_reason (stop / length) and ``[DONE]`` (or a whole 200);
* rejected: an OpenAI-style error body with a reason (400 bad input, 413, 429 queue full, ...);
* aborted: the client itself left mid-stream (the server must abort it and free its KV).

Anything else (a connection error, a 5xx, a stream cut off without ``[DONE]``, a body that is not
OpenAI's) is *lost*, and lost must be 0. The server's own counters (twinfer:request_success,
twinfer:request_rejected) must add up to the same totals. After each wave the server must go
idle with every KV block back: ``twinfer:kv_blocks_held`` returns to 0 (prefix-cache blocks no
request holds are evictable and count as free here), and its RSS, sampled through the run, must
stay flat from wave to wave once warm. Exit status 1 if anything was lost or leaked.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlparse

import httpx

# request kinds and their default mix (fractions of all requests)
DEFAULT_MIX = {"stream": 0.45, "chat_stream": 0.15, "whole": 0.1, "disconnect": 0.15, "garbage": 0.15}

# bodies a careless or hostile client sends; each must get a 4xx with an OpenAI error body
GARBAGE: list[tuple[str, bytes | dict]] = [
    ("malformed", b'{"prompt": "x", "max_tokens": '),
    ("not-json", b"\x00\xff garbage \xfe"),
    ("array", b"[1, 2, 3]"),
    ("nan", b'{"prompt": "x", "temperature": NaN}'),
    ("negative-max-tokens", {"prompt": "x", "max_tokens": -5}),
    ("huge-top-k", {"prompt": "x", "max_tokens": 4, "top_k": 10**30}),
    ("tiny-temperature", {"prompt": "x", "max_tokens": 4, "temperature": 1e-45}),
    ("tiny-top-p", {"prompt": "x", "max_tokens": 4, "top_p": 1e-300}),
    ("huge-seed", {"prompt": "x", "max_tokens": 4, "seed": 2**70}),
    ("over-context", {"prompt": "y" * 5000, "max_tokens": 4}),
    ("bad-token-id", {"prompt": [1, 2, 10**9], "max_tokens": 4}),
    ("wrong-model", {"model": "gpt-9", "prompt": "x"}),
    ("bad-role", {"messages": [{"role": "wizard", "content": "hi"}]}),
    ("n-2", {"prompt": "x", "n": 2}),
]


def rss_mib(pid: int) -> float:
    """Resident memory of a process, MiB (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise SystemExit(f"load_test: {url} is not a loopback address; this test only talks to this machine")


def start_server(args) -> tuple[subprocess.Popen, str]:
    """Start `twinfer serve` (tiny, dummy weights) on a free loopback port; (process, base URL)."""
    from executor.serve.launch import start_serve

    try:
        sp = start_serve(["--model", args.model, "--load-format", "dummy", "--device", args.device, "--host", "127.0.0.1",
                          "--port", "0", "--max-queue", str(args.max_queue), "--max-model-len", str(args.max_model_len),
                          "--dtype", "fp32", "--drain-timeout", "2"], timeout_s=300, env={"TWINFER_DEBUG": ""})
    except RuntimeError as e:
        raise SystemExit(f"load_test: {e}") from None
    sp.proc.output = sp.output
    return sp.proc, sp.url


async def server_counts(c: httpx.AsyncClient, url: str) -> dict:
    """The twinfer:* samples of /metrics: gauges by name, counters by (name, label)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict = {}
    text = (await c.get(url + "/metrics")).text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.name.startswith("twinfer:") or s.name.endswith("_created"):
                continue
            label = s.labels.get("finished_reason") or s.labels.get("reason")
            out[(s.name, label) if label else s.name] = s.value
    return out


async def wait_idle(c: httpx.AsyncClient, url: str, timeout_s: float) -> dict:
    """Poll /metrics until nothing runs, waits or is in flight; the last sample."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = await server_counts(c, url)
        if not (m["twinfer:num_requests_running"] or m["twinfer:num_requests_waiting"]
                or m["twinfer:http_requests_in_flight"] or m["twinfer:kv_blocks_held"]):
            return m
        if time.monotonic() > deadline:
            return m
        await asyncio.sleep(0.1)


@dataclass
class Tally:
    """Outcomes counted by the client."""

    sent: int = 0
    completed: int = 0
    aborted: int = 0
    rejected: Counter = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    tokens: int = 0

    @property
    def n_rejected(self) -> int:
        return sum(self.rejected.values())


def _is_openai_error(body: object) -> str | None:
    """The error's reason (code, else type) if ``body`` is OpenAI's error shape, else None."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        e = body["error"]
        if {"message", "type", "param", "code"} <= set(e) and e["message"]:
            # the label the server counts it under (executor.serve.app.rejection_reason)
            if e["code"]:
                return e["code"]
            if e["param"]:
                return "invalid_" + e["param"].split("[")[0].split(".")[0]
            return e["type"]
    return None


async def _back_off(r: httpx.Response) -> None:
    """A polite client waits as long as Retry-After says before it sends again (holding its slot)."""
    try:
        await asyncio.sleep(min(float(r.headers.get("retry-after", "0")), 5.0))
    except ValueError:
        pass


async def one_request(c: httpx.AsyncClient, url: str, kind: str, rng: random.Random, tally: Tally, args) -> None:
    """Send one request of ``kind`` and count how it ended."""
    tally.sent += 1
    prefix = "You are a terse assistant. " * rng.choice([0, 4, 10])  # shared prefixes: prefix-cache hits
    prompt = prefix + "".join(rng.choice("abcdefghij klmnop") for _ in range(rng.randint(5, 120)))
    max_tokens = rng.randint(8, args.max_tokens)
    try:
        if kind == "garbage":
            name, body = rng.choice(GARBAGE)
            path = "/v1/chat/completions" if name == "bad-role" else "/v1/completions"
            kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else {"json": body}
            r = await c.post(url + path, **kw)
            reason = _is_openai_error(_json(r.content))
            if 400 <= r.status_code < 500 and reason:
                tally.rejected[reason] += 1
            else:
                tally.lost.append(f"garbage {name}: {r.status_code} {r.text[:200]}")
            return
        if kind == "whole":
            r = await c.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens})
            body = _json(r.content)
            if r.status_code == 200 and body["choices"][0]["finish_reason"] in ("stop", "length"):
                tally.completed += 1
                tally.tokens += body["usage"]["completion_tokens"]
            elif r.status_code in (429, 503) and _is_openai_error(body):
                tally.rejected[_is_openai_error(body)] += 1
                await _back_off(r)
            else:
                tally.lost.append(f"whole: {r.status_code} {r.text[:200]}")
            return
        chat = kind == "chat_stream"
        path = "/v1/chat/completions" if chat else "/v1/completions"
        body = ({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
        body.update(max_tokens=max_tokens, stream=True, temperature=rng.choice([0.0, 0.7, 1.0]))
        leave_after = rng.randint(1, 6) if kind == "disconnect" else None
        async with c.stream("POST", url + path, json=body) as r:
            if r.status_code != 200:
                reason = _is_openai_error(_json(await r.aread()))
                if r.status_code in (429, 503) and reason:
                    tally.rejected[reason] += 1
                    await _back_off(r)
                else:
                    tally.lost.append(f"{kind}: {r.status_code}")
                return
            n, reason, done = 0, None, False
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                ev = json.loads(line[6:])
                if "error" in ev:
                    tally.lost.append(f"{kind}: error event {ev['error']}")
                    return
                n += 1
                for ch in ev.get("choices", []):
                    reason = ch.get("finish_reason") or reason
                if leave_after is not None and n >= leave_after and reason is None:
                    tally.aborted += 1  # leaving the `async with` closes the connection mid-stream
                    return
            if done and reason in ("stop", "length"):
                tally.completed += 1
            elif leave_after is not None and done:
                tally.completed += 1  # it finished before this client got round to leaving
            else:
                tally.lost.append(f"{kind}: stream ended with reason={reason} done={done}")
    except (httpx.HTTPError, json.JSONDecodeError, KeyError, IndexError, TypeError) as err:
        tally.lost.append(f"{kind}: {type(err).__name__}: {err}")


def _json(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        return None


async def run_load(url: str, *, requests: int, concurrency: int, waves: int = 1, seed: int = 0, pid: int | None = None,
                   time_limit_s: float = 600.0, mix: dict[str, float] | None = None, max_tokens: int = 64,
                   quiet: bool = False, headers: dict | None = None) -> dict:
    """Drive ``requests`` requests (split into ``waves``) at ``concurrency``; the figures as a dict.
    ``headers`` go with every request (an API key)."""
    check_loopback(url)
    mix = mix or DEFAULT_MIX
    kinds, weights = list(mix), list(mix.values())
    rng = random.Random(seed)
    args = argparse.Namespace(max_tokens=max_tokens)
    tally = Tally()
    rss: list[float] = []
    stop_sampling = asyncio.Event()

    async def sample_rss() -> None:
        while not stop_sampling.is_set():
            if pid:
                rss.append(rss_mib(pid))
            await asyncio.sleep(0.25)

    t0 = time.monotonic()
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0), limits=limits, headers=headers) as c:
        sampler = asyncio.create_task(sample_rss())
        before = await wait_idle(c, url, 30)
        wave_rows = []
        per_wave = [requests // waves + (1 if w < requests % waves else 0) for w in range(waves)]
        for w, n in enumerate(per_wave):
            plan = [rng.choices(kinds, weights)[0] for _ in range(n)]
            seeds = [rng.getrandbits(32) for _ in range(n)]
            sem = asyncio.Semaphore(concurrency)

            async def go(kind: str, s: int) -> None:
                async with sem:
                    if time.monotonic() - t0 > time_limit_s:
                        tally.sent += 1
                        tally.lost.append("not sent: time limit")
                        return
                    await one_request(c, url, kind, random.Random(s), tally, args)

            await asyncio.gather(*(go(k, s) for k, s in zip(plan, seeds)))
            idle = await wait_idle(c, url, 60)
            wave_rows.append({"wave": w + 1, "sent": tally.sent, "kv_blocks_held": idle["twinfer:kv_blocks_held"],
                              "rss_mib": rss_mib(pid) if pid else None})
            if not quiet:
                print(f"  wave {w + 1}/{waves}: {tally.sent} sent, {tally.completed} completed, {tally.n_rejected} rejected, "
                      f"{tally.aborted} aborted, {len(tally.lost)} lost; KV held when idle {idle['twinfer:kv_blocks_held']:.0f}"
                      + (f", RSS {wave_rows[-1]['rss_mib']:.0f} MiB" if pid else ""), file=sys.stderr, flush=True)
        after = await wait_idle(c, url, 60)
        stop_sampling.set()
        await sampler

    def delta(name: str, label: str | None = None) -> float:
        key = (name, label) if label else name
        return after.get(key, 0.0) - before.get(key, 0.0)

    def delta_sum(name: str) -> float:
        return sum(v - before.get(k, 0.0) for k, v in after.items() if isinstance(k, tuple) and k[0] == name)

    total_blocks = after["twinfer:kv_blocks_total"]
    free_start = total_blocks - before["twinfer:kv_blocks_held"]
    free_end = total_blocks - after["twinfer:kv_blocks_held"]
    srv_completed = delta("twinfer:request_success_total", "stop") + delta("twinfer:request_success_total", "length")
    srv_aborted = delta("twinfer:request_success_total", "abort")
    srv_rejected = delta_sum("twinfer:request_rejected_total")
    warm = [r["rss_mib"] for r in wave_rows[1:]] if pid else []                 # after the first wave
    half = [r["rss_mib"] for r in wave_rows[len(wave_rows) // 2:]] if pid else []  # the second half of the run
    return {
        "requests": requests, "concurrency": concurrency, "waves": waves, "wall_s": round(time.monotonic() - t0, 1),
        "sent": tally.sent, "completed": tally.completed, "rejected": tally.n_rejected,
        "rejected_by_reason": dict(sorted(tally.rejected.items())), "aborted": tally.aborted,
        "lost": len(tally.lost), "lost_examples": tally.lost[:5],
        "accounted": tally.completed + tally.n_rejected + tally.aborted + len(tally.lost) == tally.sent,
        "server_completed": srv_completed, "server_aborted": srv_aborted, "server_rejected": srv_rejected,
        "server_agrees": (srv_completed + srv_aborted == tally.completed + tally.aborted and srv_rejected == tally.n_rejected),
        "kv_blocks_total": total_blocks, "free_blocks_start": free_start, "free_blocks_end": free_end,
        "blocks_leaked": free_start - free_end, "cached_unused_blocks_end": after.get("twinfer:kv_blocks_cached_unused"),
        "peak_rss_mib": round(max(rss), 1) if rss else None,
        "rss_after_wave_mib": [round(r["rss_mib"], 1) for r in wave_rows] if pid else None,
        "rss_growth_after_warmup_mib": round(max(warm) - min(warm), 1) if len(warm) >= 2 else None,
        "rss_growth_last_half_mib": (round(max(half) - min(half), 1) if len(half) >= 2 else None),
    }


def print_table(r: dict) -> None:
    rows = [
        ("requests sent", r["sent"]),
        ("completed", r["completed"]),
        ("rejected (with a reason)", r["rejected"]),
        ("aborted by their client", r["aborted"]),
        ("lost", r["lost"]),
        ("server agrees (its own counters)", "yes" if r["server_agrees"] else "NO"),
        ("KV blocks free at start / end", f"{r['free_blocks_start']:.0f} / {r['free_blocks_end']:.0f} of {r['kv_blocks_total']:.0f}"),
        ("KV blocks leaked", f"{r['blocks_leaked']:.0f}"),
        ("peak server RSS", f"{r['peak_rss_mib']:.0f} MiB" if r["peak_rss_mib"] else "-"),
        ("server RSS after each wave", ", ".join(f"{x:.0f}" for x in r["rss_after_wave_mib"]) + " MiB" if r["rss_after_wave_mib"] else "-"),
        ("RSS growth over the second half", f"{r['rss_growth_last_half_mib']} MiB" if r["rss_growth_last_half_mib"] is not None else "-"),
        ("wall time", f"{r['wall_s']} s"),
    ]
    for k, v in rows:
        print(f"{k:<36} {v!s:>24}")
    print("rejections by reason: " + ", ".join(f"{k} {v}" for k, v in r["rejected_by_reason"].items()))
    for ex in r["lost_examples"]:
        print(f"  lost: {ex}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=None, help="a running server on this machine (default: start tiny/dummy/cpu)")
    ap.add_argument("--requests", type=int, default=1200)
    ap.add_argument("--concurrency", type=int, default=48)
    ap.add_argument("--waves", type=int, default=6, help="rounds of requests; the server must be idle and whole after each")
    ap.add_argument("--max-tokens", type=int, default=48, help="most tokens a request asks for")
    ap.add_argument("--max-queue", type=int, default=40, help="the started server's --max-queue (below --concurrency: some 429s)")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=900.0, help="stop sending after this many seconds")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    proc = None
    if args.url:
        url, pid = args.url.rstrip("/"), None
    else:
        proc, url = start_server(args)
        pid = proc.pid
    try:
        r = asyncio.run(run_load(url, requests=args.requests, concurrency=args.concurrency, waves=args.waves, seed=args.seed,
                                 pid=pid, time_limit_s=args.time_limit, max_tokens=args.max_tokens, quiet=args.json))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = None
    if proc is not None:
        r["server_exit_status"] = rc
    print(json.dumps(r)) if args.json else print_table(r)
    bad = r["lost"] or r["blocks_leaked"] or not r["accounted"] or not r["server_agrees"]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
