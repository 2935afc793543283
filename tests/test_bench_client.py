"""The benchmark client's pieces: arrivals, ramps, synthetic prompts, context fitting, summaries (no server, no torch)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from executor import bench_client as bc
from executor.serve.tokenizer import ByteTokenizer


def test_rescale_arrivals_keeps_shape_and_sets_rate():
    items = [bc.BenchItem(i, t, 10, 5) for i, t in enumerate([0.0, 1.0, 1.5, 4.0])]
    out = bc.rescale_arrivals(items, rate=3.0)
    times = [it.arrival_time for it in out]
    assert times[-1] == pytest.approx(1.0)  # (n - 1) / rate
    assert np.allclose(np.array(times) / times[-1], [0, 0.25, 0.375, 1.0])
    assert [it.arrival_time for it in bc.rescale_arrivals(items[:1], 2.0)] == [0.0]


def test_ramp_time_is_continuous_and_monotone():
    ts = np.linspace(0, 10, 1001)
    us = np.array([bc.ramp_time(t, 4.0) for t in ts])
    assert np.all(np.diff(us) > 0) and us[0] == 0
    assert bc.ramp_time(2.0, 4.0) == pytest.approx(4.0) and bc.ramp_time(6.0, 4.0) == pytest.approx(8.0)
    assert bc.ramp_time(3.3, 0.0) == 3.3


def test_prompts_share_words_exactly_where_blocks_are_shared():
    cal = bc.Calibration(per_word=4.0, overhead=1.0)  # a byte tokenizer: " the" is 4 tokens, plus BOS
    maker = bc.PromptMaker("text", block_size=16, calibration=cal)
    a = maker.prompt(bc.BenchItem(0, 0, 129, 1, block_hashes=(11, 22)))
    b = maker.prompt(bc.BenchItem(1, 0, 129, 1, block_hashes=(11, 33)))
    c = maker.prompt(bc.BenchItem(2, 0, 129, 1))
    wa, wb, wc = a.split(), b.split(), c.split()
    assert len(wa) == 32 and len(ByteTokenizer().encode(a)) == 128  # 32 words: 31 spaces + 96 letters + BOS
    assert wa[:4] == wb[:4] and wa[4:8] != wb[4:8] and wa[:4] != wc[:4]
    assert maker.prompt(bc.BenchItem(0, 0, 129, 1, block_hashes=(11, 22))) == a  # deterministic
    warm = maker.prompt(bc.BenchItem(0, 0, 129, 1, block_hashes=(11, 22)), salt=1)
    assert warm.split()[:4] != wa[:4]  # warmup copies share nothing with the measured prompts


def test_id_prompts_have_the_exact_length():
    maker = bc.PromptMaker("ids", block_size=4)
    ids = maker.prompt(bc.BenchItem(3, 0, 37, 1, block_hashes=(1 << 62, 5)))
    assert len(ids) == 37 and all(32 <= t < 127 for t in ids)
    other = maker.prompt(bc.BenchItem(4, 0, 20, 1, block_hashes=(1 << 62, 6)))
    assert ids[:4] == other[:4] and ids[4:8] != other[4:8]


def test_fit_context_clips_to_the_server_limit():
    items = [bc.BenchItem(0, 0, 100, 10), bc.BenchItem(1, 0, 500, 10), bc.BenchItem(2, 0, 5, 900)]
    out, n = bc.fit_context(items, 256)
    assert n == 2 and out[0] == items[0]
    assert (out[1].prompt_len, out[1].output_len) == (246, 10)
    assert (out[2].prompt_len, out[2].output_len) == (1, 255)


def test_items_from_workload_requests():
    pytest.importorskip("sim.workload")
    from sim import workload as wl

    spec = wl.preset("chat", num_requests=5, rate=50.0)
    items = bc.items_from_requests(wl.generate(spec, np.random.default_rng(0), 16))
    assert [it.index for it in items] == list(range(5)) and items[0].arrival_time == 0.0
    assert all(it.prompt_len >= 1 and it.output_len >= 1 for it in items)


def test_summarize_numbers():
    recs = [bc.RequestRecord(i, 0.0, prompt_len=10, output_len=3, prompt_tokens=11, output_tokens=3, ttft_s=0.1 * (i + 1),
                             tpot_s=0.01, e2e_s=0.2, itl_s=[0.01, 0.01], success=True) for i in range(4)]
    recs.append(bc.RequestRecord(9, 0.0, prompt_len=10, output_len=3, success=False, error="boom"))
    s = bc.summarize(bc.BenchRun(recs, duration_s=2.0, model="m", url="u", prompt_mode="text"))
    assert (s["completed"], s["failed"], s["input_tokens"], s["output_tokens"]) == (4, 1, 44, 12)
    assert s["request_throughput"] == 2.0 and s["output_throughput"] == 6.0 and s["total_token_throughput"] == 28.0
    assert s["ttft_mean_s"] == pytest.approx(0.25) and s["ttft_p50_s"] == pytest.approx(0.25)
    assert s["itl_p99_s"] == pytest.approx(0.01) and s["e2e_p90_s"] == pytest.approx(0.2)


def test_a_stream_the_server_aborted_is_a_failed_request():
    # a server that drains (twinfer serve on SIGTERM) or drops a request ends its stream cleanly, with
    # finish_reason "abort" and [DONE]: the request did not get its tokens and must not count as finished
    import asyncio

    import httpx

    def chunk(text, reason=None, usage=None):
        choices = [] if usage else [{"index": 0, "text": text, "finish_reason": reason}]
        return "data: " + json.dumps({"id": "cmpl-1", "choices": choices, "usage": usage}) + "\n\n"

    def handler(request):
        body = chunk("a") + chunk("b") + chunk("", "abort") + chunk("", usage={"prompt_tokens": 3, "completion_tokens": 2})
        return httpx.Response(200, text=body + "data: [DONE]\n\n", headers={"content-type": "text/event-stream"})

    async def send():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await bc.send_one(client, "http://x", "m", "hi", 8, bc.RequestRecord(0, 0.0, output_len=8), 0.0)

    rec = asyncio.run(send())
    assert rec.finish_reason == "abort" and rec.output_tokens == 2
    assert not rec.success and "abort" in rec.error
    run = bc.BenchRun([rec], 1.0, "m", "http://x", "text")
    assert bc.summarize(run)["failed"] == 1


def test_timeout_s_bounds_the_whole_request_not_each_read(monkeypatch):
    # a server that keeps streaming tokens, each well within the timeout, never tripped the per-read
    # timeout --timeout-s was: the request ran to its end however long it took
    import asyncio

    import httpx

    async def tokens():
        for _ in range(100):   # 100 chunks 10 ms apart: at least a second in all
            await asyncio.sleep(0.01)
            yield ("data: " + json.dumps({"id": "cmpl-1", "choices": [{"index": 0, "text": "a"}]}) + "\n\n").encode()
        yield b"data: [DONE]\n\n"

    def handler(request):
        return httpx.Response(200, content=tokens(), headers={"content-type": "text/event-stream"})

    monkeypatch.setattr(bc, "make_client", lambda timeout_s: httpx.AsyncClient(
        transport=httpx.MockTransport(handler), timeout=httpx.Timeout(timeout_s)))
    run = asyncio.run(bc.run_benchmark("http://x", [bc.BenchItem(0, 0.0, 4, 100)], model="m", prompt_mode="ids",
                                       timeout_s=0.2))
    rec = run.records[0]
    assert not rec.success and rec.error.startswith("TimeoutError: not complete within the per-request timeout of 0.2 s")
    assert rec.ttft_s is not None and rec.finish_reason is None   # cut mid-stream, not before it began
