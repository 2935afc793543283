"""The tiny model end to end through the shared Scheduler on CPU.

Greedy tokens from the engine (chunked prefill, mixed batches, preemption, prefix-cache
hits, MTP drafting, multi-step decode) must equal teacher-forced greedy tokens of one
full forward over prompt + output: float64 makes the comparison exact.
"""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")

from executor.async_engine import AsyncLLMEngine  # noqa: E402
from executor.engine import LLMEngine, SamplingParams, block_hashes  # noqa: E402
from executor.forward_batch import SeqInput, build_forward_batch  # noqa: E402
from executor.kv_cache import KVCache  # noqa: E402
from executor.model_runner import accepted_prefix  # noqa: E402

CPU = torch.device("cpu")
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def engine(**sched) -> LLMEngine:
    sc = {"block_size": 16, "max_num_batched_tokens": 48, "max_num_seqs": 6}
    sc.update(sched.pop("sc", {}))
    return LLMEngine.from_args("tiny", device="cpu", dtype="fp64", seed=0, scheduler_config=sc, **sched)


def teacher_forced(e: LLMEngine, prompt: list[int], out: list[int]) -> list[int]:
    """Greedy next tokens of one full forward over prompt + out[:-1] at the output positions."""
    seq = prompt + out[:-1]
    pages = -(-len(seq) // 16)
    kv = KVCache(e.cfg, pages, 16, CPU, torch.float64)
    b = build_forward_batch([SeqInput(seq, 0, list(range(pages)), False)], 16, kv.null_page, CPU)
    with torch.inference_mode():
        h = e.runner.model(b, kv)
        return e.runner.model.compute_logits(h[len(prompt) - 1:]).argmax(-1).tolist()


def prompts(seed=0, lens=(5, 70, 100)) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (n,), generator=g).tolist() for n in lens]


def check(e, ps, outs):
    for p, o in zip(ps, outs):
        assert len(o) == GREEDY.max_tokens
        assert o == teacher_forced(e, p, o)


def test_chunked_prefill_and_mixed_batches():
    e = engine()
    ps = prompts()
    outs = e.generate(ps, GREEDY)
    check(e, ps, outs)
    assert not e.has_unfinished() and e.stats().generation_tokens_total == 18


def test_preemption_recomputes_to_the_same_tokens():
    e = engine(num_kv_blocks=12)
    ps = prompts(1, (60, 70, 50))
    outs = e.generate(ps, GREEDY)
    assert e.scheduler.num_preemptions > 0
    check(e, ps, outs)


def test_prefix_cache_hit_gives_the_same_tokens():
    e = engine()
    base = prompts(2, (50,))[0]
    first = e.generate([base + [1, 2, 3]], GREEDY)[0]
    second = e.generate([base + [1, 2, 3], base + [9]], GREEDY)
    assert e.stats().prefix_cache_hits >= 48
    assert second[0] == first
    check(e, [base + [1, 2, 3], base + [9]], second)


@pytest.mark.parametrize("draft_len", [1, 3])
def test_mtp_drafts_keep_greedy_output(draft_len):
    e = engine(sc={"draft_len": draft_len})
    ps = prompts(3)
    outs = e.generate(ps, GREEDY)
    check(e, ps, outs)


def test_correct_drafts_are_accepted_and_save_steps():
    """Drafts set to the true continuation are all accepted: 1 + k tokens per decode step."""
    ps = prompts(4, (20,))
    want = engine().generate(ps, SamplingParams(temperature=0, max_tokens=9, ignore_eos=True))[0]
    e = engine(sc={"draft_len": 2})
    runner = e.runner
    orig_execute = runner.execute  # set each decode's drafts to the true continuation

    def execute(plan):
        for r in plan.decodes:
            n = len(r.output_token_ids)
            runner.states[r.request_id].drafts = want[n: n + 2]
        return orig_execute(plan)

    runner.execute = execute
    steps = []
    e.step_observer = lambda start, plan, result: steps.append(result)
    out = e.generate(ps, SamplingParams(temperature=0, max_tokens=9, ignore_eos=True))[0]
    assert out == want
    dec = [int(r.decode_tokens.sum()) for r in steps if r.decode_tokens.size]
    assert max(dec) == 3                      # 1 + 2 accepted drafts
    assert len(steps) <= 1 + 3                # prefill (first token) + 8 tokens in <= 3 decode steps


def test_accepted_prefix():
    assert accepted_prefix([5, 6, 7], [5, 6, 1, 2]) == 2
    assert accepted_prefix([], [3]) == 0
    assert accepted_prefix([1], [2, 1]) == 0


def test_multi_step_decode_plans():
    e = engine(decode_steps=4)
    ps = prompts(5, (10, 12))
    results = []
    e.step_observer = lambda start, plan, result: results.append((plan.num_steps, result.num_steps))
    outs = e.generate(ps, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    assert any(n > 1 for n, _ in results)
    for p, o in zip(ps, outs):
        assert len(o) == 10 and o == teacher_forced(e, p, o)


def test_stop_tokens_and_eos():
    e = engine()
    p = prompts(6, (8,))[0]
    free = e.generate([p], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    stop = free[3]
    out = e.generate([p], SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop], ignore_eos=True))[0]
    assert out == free[: free.index(stop) + 1]
    e.add_request("x", p, SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop]))
    outs = []
    while e.has_unfinished():
        outs += e.step()
    assert outs[-1].finished and outs[-1].finish_reason == "stop"


def test_seeded_sampling_is_reproducible_and_batch_independent():
    sp = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, max_tokens=6, seed=7, ignore_eos=True)
    ps = prompts(7, (9, 30))
    a = engine().generate(ps, sp)
    b = engine().generate([ps[0]], sp)
    assert a[0] == b[0]


def test_add_request_validation_and_abort():
    e = engine()
    with pytest.raises(ValueError, match="empty"):
        e.add_request("a", [], GREEDY)
    with pytest.raises(ValueError, match="vocabulary"):
        e.add_request("a", [10**6], GREEDY)
    with pytest.raises(ValueError, match="max_model_len"):
        e.add_request("a", [1] * e.max_model_len, GREEDY)
    e.add_request("a", [1, 2, 3], SamplingParams(max_tokens=50, temperature=0))
    e.step()
    e.abort("a")
    outs = e.step()
    assert outs[-1].finish_reason == "abort" and not e.has_unfinished()
    assert e.stats().num_running == 0


def test_block_hashes_chain():
    h = block_hashes(list(range(40)), 16)
    assert len(h) == 2 and block_hashes(list(range(32)) + [0] * 5, 16) == h
    assert block_hashes([9] + list(range(1, 40)), 16)[1] != h[1]
    import numpy as np
    assert block_hashes(np.arange(40), 16) == h and block_hashes(list(range(15)), 16) == ()   # an array hashes alike


def test_admission_names_bad_token_ids():
    from twinfer.errors import TwinferError
    e = engine()
    v = e.vocab_size
    for bad, says in (([1, v], f"token id {v} outside the vocabulary"), ([3, -1, 2], "token id -1 outside"),
                      ([1, 2.5], "got 2.5"), ([1, 2 ** 70], f"got {2 ** 70}"), (["7"], "got '7'"),
                      ([[1, 2], [3, 4]], r"flat list .* got \[1, 2\]"), ([[1], [2, 3]], r"got \[1\]")):
        with pytest.raises(TwinferError, match=says):
            e.add_request(f"r{len(says)}{bad!r}", bad)
    assert not e.has_unfinished()


def test_async_engine_streams_and_aborts():
    async def main():
        eng = AsyncLLMEngine(engine())
        await eng.start()

        async def one(rid, n, abort_after=None):
            got, last = [], None
            async for o in eng.generate(rid, list(range(1, n)), SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)):
                got += o.new_token_ids
                last = o
                if abort_after and len(got) >= abort_after:
                    await eng.abort(rid)
            return len(got), last.finish_reason

        res = await asyncio.gather(one("a", 10), one("b", 40), one("c", 20, abort_after=2))
        with pytest.raises(ValueError):
            async for _ in eng.generate("d", [], GREEDY):
                pass
        await eng.shutdown()
        return res

    res = asyncio.run(main())
    assert res[0] == (8, "length") and res[1] == (8, "length") and res[2][1] == "abort"


def test_runner_is_the_backend_and_stops_at_stop_at():
    """The engine drives the runner through the seam; ``stop_at`` (perf_counter seconds) cuts a multi-step
    plan after its first step that ends at/after it, and the scheduler completes the cut plan."""
    import time

    from scheduler.backend import Backend

    e = engine(decode_steps=4)
    assert e.backend is e.runner
    backend: Backend = e.backend
    req = e.add_request("a", prompts(lens=(20,))[0], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))
    e.step()                                   # the prompt: one step, one token
    assert len(req.output_token_ids) == 1
    plan = e.scheduler.schedule(e.now(), max_steps=4)
    assert plan.num_steps == 4 and plan.decodes == [req]
    result = backend.execute(plan, stop_at=time.perf_counter())   # already past: one step only
    assert result.num_steps == 1 and result.decode_tokens.shape == (1, 1)
    e.scheduler.complete(plan, result, e.now())
    assert len(req.output_token_ids) == 2
    plan = e.scheduler.schedule(e.now(), max_steps=3)
    result = backend.execute(plan)
    assert result.num_steps == 3
    e.scheduler.complete(plan, result, e.now())
    assert len(req.output_token_ids) == 5


@pytest.mark.parametrize("draft_len", [0, 2])
def test_max_model_len_is_what_the_kv_cache_holds(draft_len):
    # 12 blocks of 16 hold 192 tokens (less the drafts' slots): a longer context could never be admitted, so
    # the engine (and /v1/models, and serve's context-length check) must not advertise the default 4096
    e = engine(num_kv_blocks=12, sc={"draft_len": draft_len})
    assert e.max_model_len == 12 * 16 - draft_len
    assert e.scheduler.config.max_model_len == e.max_model_len
    out = e.generate([[1] * (e.max_model_len - 3)], SamplingParams(max_tokens=50, temperature=0, ignore_eos=True))
    assert len(out[0]) == 3   # the longest request it advertises runs (to its end), instead of being refused
    assert engine().max_model_len == 4096   # the default KV cache holds the model's context
