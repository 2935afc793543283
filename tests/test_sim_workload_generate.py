"""Workload generation: arrival statistics, determinism, prefixes, agentic sessions, presets."""

from __future__ import annotations

import time

import numpy as np
import pytest

from sim.workload import PRESETS, WorkloadSpec, expected_tokens, generate, preset
from twinfer.config import validate
from twinfer.errors import TwinferError


def _gen(seed=0, block_size=16, **kw):
    return generate(WorkloadSpec(**kw), np.random.default_rng(seed), block_size)


def _key(r):
    return (r.request_id, r.arrival_time, r.prompt_len, r.output_len, r.block_hashes, r.priority, r.session_id)


@pytest.mark.parametrize("kind, extra, cv", [("poisson", {}, 1.0), ("gamma", {"cv": 3.0}, 3.0), ("constant", {}, 0.0)])
def test_interarrival_statistics(kind, extra, cv):
    reqs = _gen(kind=kind, rate=50.0, num_requests=20_000, **extra)
    t = np.array([r.arrival_time for r in reqs])
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    ia = np.diff(t)
    # mean 1/rate: the standard error of the mean is cv / rate / sqrt(n)
    assert ia.mean() == pytest.approx(1 / 50.0, abs=5 * cv / 50.0 / np.sqrt(ia.size) + 1e-12)
    assert ia.std() / ia.mean() == pytest.approx(cv, abs=0.1 * max(cv, 0.3))


def test_ids_sorted_and_deterministic():
    a = _gen(seed=1, rate=10.0, num_requests=500, shared_prefix_len=100, num_prefix_groups=4)
    b = _gen(seed=1, rate=10.0, num_requests=500, shared_prefix_len=100, num_prefix_groups=4)
    c = _gen(seed=2, rate=10.0, num_requests=500, shared_prefix_len=100, num_prefix_groups=4)
    assert [r.request_id for r in a] == [f"r{i}" for i in range(500)]
    assert [_key(r) for r in a] == [_key(r) for r in b]
    assert [_key(r) for r in a] != [_key(r) for r in c]


def test_lengths_do_not_depend_on_rate():
    # each quantity draws from its own stream: a rate sweep keeps the same lengths
    lo = preset("chat", rate=1.0, num_requests=200)
    hi = preset("chat", rate=100.0, num_requests=200)
    a, b = generate(lo, np.random.default_rng(3), 16), generate(hi, np.random.default_rng(3), 16)
    assert [r.prompt_len for r in a] == [r.prompt_len for r in b]
    assert a[-1].arrival_time > b[-1].arrival_time


def test_duration_and_count_limits():
    by_time = _gen(rate=20.0, duration_s=100.0)
    assert all(r.arrival_time < 100.0 for r in by_time)
    assert len(by_time) == pytest.approx(2000, abs=5 * np.sqrt(2000))
    both = _gen(rate=20.0, duration_s=100.0, num_requests=50)
    assert len(both) == 50
    assert [_key(r) for r in both] == [_key(r) for r in by_time[:50]]


def test_shared_prefix_groups():
    reqs = _gen(rate=10.0, num_requests=400, shared_prefix_len=1000, num_prefix_groups=3,
                input_len={"kind": "uniform", "min": 1, "max": 500})
    assert all(1001 <= r.prompt_len <= 1500 for r in reqs)
    assert {len(r.block_hashes) for r in reqs} == {1000 // 16}  # private blocks unhashed by default
    assert len({r.block_hashes for r in reqs}) == 3
    full = _gen(rate=10.0, num_requests=400, shared_prefix_len=1000, num_prefix_groups=3,
                input_len={"kind": "uniform", "min": 1, "max": 500}, hash_private_blocks=True)
    assert all(len(f.block_hashes) == f.prompt_len // 16 for f in full)
    assert all(f.block_hashes[:62] == r.block_hashes for f, r in zip(full, reqs))
    private = [h for f in full for h in f.block_hashes[62:]]
    assert len(private) == len(set(private))  # private blocks never collide
    assert not set(private) & {h for f in full for h in f.block_hashes[:62]}


def test_agentic_turns_extend_previous_hashes():
    reqs = generate(preset("agentic", num_requests=600), np.random.default_rng(4), 16)
    assert [r.request_id for r in reqs] == [f"r{i}" for i in range(len(reqs))] and len(reqs) == 600
    sessions: dict[str, list] = {}
    for r in reqs:
        sessions.setdefault(r.session_id, []).append(r)
    multi = [s for s in sessions.values() if len(s) > 1]
    assert len(multi) > 10
    for turns in multi:
        assert len({t.priority for t in turns}) == 1
        for a, b in zip(turns, turns[1:]):
            assert b.prompt_len > a.prompt_len + a.output_len
            assert b.block_hashes[: len(a.block_hashes)] == a.block_hashes
            assert len(b.block_hashes) == b.prompt_len // 16
            # arrival after the estimated latency of the previous turn (think time >= 0.1 s)
            assert b.arrival_time >= a.arrival_time + 1.0 + 0.03 * a.output_len + 0.1 - 1e-9
    # different sessions of one prefix group share exactly the system prompt blocks
    firsts = [s[0] for s in sessions.values()]
    common = {sum(1 for _ in iter_common(x.block_hashes, y.block_hashes)) for x in firsts[:30] for y in firsts[:30] if x is not y}
    assert common <= {0, 4096 // 16}
    assert max(r.prompt_len for r in reqs) <= 131072


def iter_common(a, b):
    for x, y in zip(a, b):
        if x != y:
            return
        yield x


def test_agentic_rate_is_requests_per_second():
    spec = preset("agentic", rate=20.0, num_requests=None, duration_s=2000.0, max_prompt_len=None)
    reqs = generate(spec, np.random.default_rng(0), 4096)
    # turns still running at the horizon are cut, so allow a few percent below rate * duration
    assert len(reqs) / 2000.0 == pytest.approx(20.0, rel=0.08)


def test_priority_mix():
    reqs = _gen(rate=10.0, num_requests=10_000, priority_mix={0: 3, 5: 1})
    p = np.array([r.priority for r in reqs])
    assert set(p.tolist()) == {0, 5} and (p == 5).mean() == pytest.approx(0.25, abs=0.02)


def test_expected_tokens():
    spec = preset("chat")
    mi, mo = expected_tokens(spec)
    reqs = generate(preset("chat", num_requests=50_000), np.random.default_rng(0), 1 << 20)
    assert np.mean([r.prompt_len for r in reqs]) == pytest.approx(mi, rel=0.02)
    assert np.mean([r.output_len for r in reqs]) == pytest.approx(mo, rel=0.02)
    assert expected_tokens(preset("summarize"))[0] == pytest.approx(256 + PRESETS["summarize"].input_len.mean())
    ai, ao = expected_tokens(preset("agentic"))
    assert ai > 4096 and 200 < ao < 600


def test_presets_and_overrides():
    assert set(PRESETS) == {"chat", "long-context", "summarize", "agentic", "reasoning"}
    for name in PRESETS:
        assert generate(preset(name, num_requests=20), np.random.default_rng(0), 16)
    assert preset("chat", rate=3.5).rate == 3.5
    with pytest.raises(TwinferError, match="known workload presets: agentic, chat, long-context, reasoning, summarize"):
        preset("nope")
    spec = validate(WorkloadSpec, {"preset": "reasoning", "num_requests": 7})
    assert spec.num_requests == 7 and spec.output_len == PRESETS["reasoning"].output_len
    with pytest.raises(TwinferError, match="preset: unknown 'x'"):
        validate(WorkloadSpec, {"preset": "x"})


@pytest.mark.parametrize("data, words", [
    ({"kind": "poisson", "num_requests": 5}, "rate: required"),
    ({"kind": "poisson", "rate": 1}, "num_requests or duration_s"),
    ({"kind": "gamma", "rate": 1, "num_requests": 5}, "cv: required"),
    ({"kind": "poisson", "rate": 1, "num_requests": 5, "cv": 2}, "cv: only used when kind is gamma"),
    ({"kind": "poisson", "rate": 1, "num_requests": 5, "turns": 3}, "turns: only used when kind is agentic"),
    ({"kind": "trace"}, "trace_path: required"),
    ({"kind": "trace", "trace_path": "x", "rate": 2}, "rate: only used when kind is"),
    ({"kind": "poisson", "rate": -1, "num_requests": 5}, "rate: Input should be greater than 0"),
    ({"kind": "poisson", "rate": 1, "num_requests": 5, "output_len": 0}, "output_len: values must be >= 1"),
    ({"kind": "poisson", "rate": 1, "num_requests": 5, "bogus": 0}, "bogus: Extra inputs are not permitted"),
    ({"kind": "poisson", "rate": 1, "num_requests": 5, "priority_mix": {0: -1}}, "priority_mix: weights must be finite"),
])
def test_spec_validation_names_the_field(data, words):
    with pytest.raises(TwinferError, match=words):
        validate(WorkloadSpec, data, "workload")


def test_trace_kind(tmp_path):
    from sim.traces import write_trace

    reqs = _gen(rate=10.0, num_requests=50, shared_prefix_len=64)
    p = tmp_path / "t.jsonl"
    write_trace(reqs, p, 16)
    back = generate(WorkloadSpec(kind="trace", trace_path=str(p), time_scale=2.0, duration_s=2.0),
                    np.random.default_rng(9), 16)
    assert all(b.arrival_time == pytest.approx(2 * r.arrival_time) for b, r in zip(back, reqs))
    assert all(b.arrival_time < 2.0 for b in back) and len(back) < 50


def _timed(n):
    spec = preset("chat", num_requests=n, rate=1000.0, shared_prefix_len=512, num_prefix_groups=16)
    t0 = time.perf_counter()
    reqs = generate(spec, np.random.default_rng(0), 16)
    dt = time.perf_counter() - t0
    assert len(reqs) == n and reqs[-1].request_id == f"r{n - 1}"
    return dt


def test_generation_is_vectorised():
    assert _timed(200_000) < 4.0  # ~0.6 s here; generous for loaded CI machines


@pytest.mark.slow
def test_a_million_requests_in_seconds():
    assert _timed(1_000_000) < 15.0  # ~3 s here


def test_generated_requests_are_the_ones_the_constructor_builds():
    """new_requests (workload generation's bulk constructor) builds what Request(*row) builds, slot for slot."""
    from scheduler.request import Request, new_requests

    rows = [("r0", 0.5, 10, 20, (1, 2), 0), ("r1", 1.5, 1, 1, (), 3)]
    for row, fast in zip(rows, new_requests(rows)):
        ref = Request(*row)
        assert not hasattr(fast, "__dict__")   # slots only: no per-request dict
        assert [getattr(fast, k) for k in Request.__slots__] == [getattr(ref, k) for k in Request.__slots__]
        assert repr(fast) == repr(ref) and fast != ref and fast == fast
        assert fast.num_computed_tokens == 0 and fast.num_output_tokens == 0 and fast._batch is None
        assert fast.output_token_ids is not ref.output_token_ids and fast.block_ids == []
