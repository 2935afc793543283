"""Traces: hashing primitives, Mooncake expansion, line validation, round trips, samples."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.traces import (
    MOONCAKE_BLOCK,
    expand_hash_ids,
    expand_hash_ids_bulk,
    hash_pair,
    hash_pair_np,
    read_trace,
    write_trace,
)
from sim.workload import generate, preset
from twinfer.errors import TwinferError

SAMPLES = Path(__file__).resolve().parents[1] / "sim" / "data" / "traces"


def _common(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _key(r):
    return (r.request_id, r.arrival_time, r.prompt_len, r.output_len, r.block_hashes, r.priority, r.session_id)


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_hash_pair_numpy_matches_python(a, b):
    h = hash_pair(a, b)
    assert 0 <= h < 2**63
    assert int(hash_pair_np(np.array([a], np.uint64), np.array([b], np.uint64))[0]) == h


def test_mooncake_expansion_arithmetic():
    # 1000 tokens, ids [a, b]: 1000 // 16 = 62 full blocks; the first 32 depend only on a
    x = expand_hash_ids([7, 8], MOONCAKE_BLOCK, 16, 1000)
    y = expand_hash_ids([7, 9], MOONCAKE_BLOCK, 16, 1000)
    assert len(x) == 62 and len(set(x)) == 62
    assert _common(x, y) == 512 // 16
    # same ids, shorter prompt: a prefix of the longer one's hashes
    assert expand_hash_ids([7, 8], MOONCAKE_BLOCK, 16, 700) == x[: 700 // 16]
    # exactly 512 tokens: one id -> 32 hashes, the partial-block rule gives none extra
    assert len(expand_hash_ids([7], MOONCAKE_BLOCK, 16, 512)) == 32
    assert len(expand_hash_ids([7], MOONCAKE_BLOCK, 16, 511)) == 31
    # scheduler block bigger than the source block: one hash per two ids
    big = expand_hash_ids([7, 8, 9], MOONCAKE_BLOCK, 1024, 1536)
    assert len(big) == 1
    assert expand_hash_ids([7, 8, 5], MOONCAKE_BLOCK, 1024, 1536) == big
    assert expand_hash_ids([7, 6, 9], MOONCAKE_BLOCK, 1024, 1536) != big
    # fewer ids than blocks: only covered blocks get hashes
    assert len(expand_hash_ids([7], MOONCAKE_BLOCK, 16, 1000)) == 32


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(0, 5), min_size=1, max_size=6),
    st.lists(st.integers(0, 5), min_size=1, max_size=6),
    st.sampled_from([16, 64, 100, 512, 1024]),
)
def test_expansion_shares_exactly_the_common_source_prefix(ids_a, ids_b, bs):
    la, lb = len(ids_a) * MOONCAKE_BLOCK, len(ids_b) * MOONCAKE_BLOCK
    ha, hb = expand_hash_ids_bulk([ids_a, ids_b], [MOONCAKE_BLOCK] * 2, bs, [la, lb])
    common_src = _common(ids_a, ids_b)
    # a block is shared iff every source block it touches is shared
    assert _common(ha, hb) == min(common_src * MOONCAKE_BLOCK // bs, len(ha), len(hb))


def test_mooncake_read(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text(
        '{"timestamp": 1000, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}\n'
        '{"timestamp": 500, "input_length": 600, "output_length": 7, "hash_ids": [0, 2]}\n'
        '{"timestamp": 3000, "input_length": 100, "output_length": 9, "hash_ids": [3]}\n'
    )
    reqs = read_trace(p, 16, "mooncake")
    assert [r.request_id for r in reqs] == ["r0", "r1", "r2"]
    assert [r.arrival_time for r in reqs] == [0.0, 0.5, 2.5]  # ms, sorted, rebased
    assert [r.prompt_len for r in reqs] == [600, 1000, 100]
    assert _common(reqs[0].block_hashes, reqs[1].block_hashes) == 32
    assert len(reqs[0].block_hashes) == 600 // 16
    fast = read_trace(p, 16, "mooncake", time_scale=0.5, max_requests=2)
    assert [r.arrival_time for r in fast] == [0.0, 0.25]


def test_trace_errors_name_file_line_field(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
        '{"timestamp": 1, "input_length": 0, "output_length": 5}\n'
        "\n"
        "not json\n"
        '{"timestamp": 2, "input_length": 5, "output_length": 5, "bogus": 1}\n'
        '{"timestamp": 3, "input_length": 100, "output_length": 5, "hash_ids": [1]}\n'
        "[1, 2]\n"
    )
    with pytest.raises(TwinferError) as e:
        read_trace(p, 16)
    msg = str(e.value)
    assert f"{p}:2: input_length:" in msg
    assert f"{p}:4: not valid JSON" in msg
    assert f"{p}:5: bogus: Extra inputs are not permitted" in msg
    assert f"{p}:6: hash_block_size: required" in msg
    assert f"{p}:7: expected a JSON object" in msg
    assert f"{p}:1" not in msg


def test_mooncake_too_many_ids_is_an_error(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1, 2]}\n')
    with pytest.raises(TwinferError, match=r"m.jsonl:1: .*hash_ids: 3 ids of 512 tokens"):
        read_trace(p, 16, "mooncake")


def test_round_trip_generated_workload(tmp_path):
    reqs = generate(preset("agentic", num_requests=200), np.random.default_rng(5), 16)
    p = tmp_path / "t.jsonl"
    write_trace(reqs, p, 16)
    back = read_trace(p, 16)
    assert [_key(r) for r in back] == [_key(r) for r in reqs]
    # another scheduler block size re-expands the ids: same number of full blocks
    coarse = read_trace(p, 64)
    assert all(len(c.block_hashes) == r.prompt_len // 64 for c, r in zip(coarse, reqs))


def test_write_mooncake_keeps_sharing_at_512(tmp_path):
    reqs = generate(preset("agentic", num_requests=120), np.random.default_rng(2), 16)
    p = tmp_path / "m.jsonl"
    write_trace(reqs, p, 16, fmt="mooncake")
    first = json.loads(p.read_text().splitlines()[0])
    assert first["hash_ids"][0] == 0  # renumbered in order of first appearance
    back = read_trace(p, 16, "mooncake")
    for i in range(0, 120, 7):
        for j in range(i + 1, 120, 5):
            c = _common(reqs[i].block_hashes, reqs[j].block_hashes)
            assert _common(back[i].block_hashes, back[j].block_hashes) == (c // 32) * 32


def test_write_trace_needs_block_size_with_hashes(tmp_path):
    reqs = generate(preset("chat", num_requests=3, shared_prefix_len=64), np.random.default_rng(0), 16)
    with pytest.raises(TwinferError, match="block_size"):
        write_trace(reqs, tmp_path / "x.jsonl")


def test_time_unit_ms(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 2000, "input_length": 10, "output_length": 1}\n'
                 '{"timestamp": 2500, "input_length": 10, "output_length": 1}\n')
    assert [r.arrival_time for r in read_trace(p, 16, time_unit="ms")] == [0.0, 0.5]
    assert [r.arrival_time for r in read_trace(p, 16, rebase=False)] == [2000.0, 2500.0]


# ------------------------------------------------------------ checked-in samples
def write_samples(out: Path) -> None:
    """How the files under sim/data/traces were made (TWINFER_REGEN_SAMPLES=1 rewrites them)."""
    chat = preset("chat", num_requests=40, shared_prefix_len=1024, num_prefix_groups=3,
                  priority_mix={0: 0.8, 1: 0.2})
    write_trace(generate(chat, np.random.default_rng(2026), 64), out / "sample_chat.jsonl", 64)
    agent = preset("agentic", num_requests=80)
    write_trace(generate(agent, np.random.default_rng(2026), 16), out / "sample_mooncake.jsonl", 16, fmt="mooncake")


def test_samples_replay():
    if os.environ.get("TWINFER_REGEN_SAMPLES"):
        write_samples(SAMPLES)
    chat = read_trace(SAMPLES / "sample_chat.jsonl", 64)
    assert len(chat) == 40 and {r.priority for r in chat} == {0, 1}
    assert len({r.block_hashes for r in chat}) == 3  # three shared system prompts
    moon = read_trace(SAMPLES / "sample_mooncake.jsonl", 16, "mooncake")
    assert len(moon) == 80
    assert max(_common(a.block_hashes, b.block_hashes) for a in moon[:20] for b in moon[20:]) >= 4096 // 16
    for f in SAMPLES.iterdir():
        assert f.stat().st_size < 50_000


def test_trace_without_requests_is_an_error_naming_the_file(tmp_path):
    p = tmp_path / "blank.jsonl"
    p.write_text("\n\n")
    with pytest.raises(TwinferError, match="blank.jsonl: the trace holds no requests"):
        read_trace(p, 16)
