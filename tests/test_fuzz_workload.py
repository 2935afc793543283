"""Fuzz workload specs and trace lines with extreme numbers, then draw requests from them.

A spec can pass validation and still fail while requests are drawn (an arrival count that
overflows, a length mean that overflows exp, a uniform bound past int64): the only acceptable
outcomes are requests that make sense, or a TwinferError naming the field.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.traces import read_trace
from sim.workload import WorkloadSpec, generate
from twinfer.config import validate
from twinfer.errors import TwinferError

FUZZ = settings(max_examples=150, derandomize=True, deadline=None, database=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

_num = st.one_of(
    st.floats(min_value=-1e308, max_value=1e308, allow_nan=False),
    st.sampled_from([0, 1, 2, 1e-300, 5e-324, 1e-9, 0.5, 1e9, 1e12, 1e15, 1e300, 2**31, 2**53, 2**63, 10**30, -1]),
    st.integers(min_value=-(2**70), max_value=2**70),
)
_pos = st.one_of(_num, st.floats(min_value=1e-6, max_value=1e6), st.integers(1, 10_000))


@st.composite
def _dist(draw):
    kind = draw(st.sampled_from(["fixed", "uniform", "lognormal", "lognormal_median", "normal", "empirical", "bare"]))
    if kind == "bare":
        return draw(_pos)
    if kind == "fixed":
        return {"kind": "fixed", "value": draw(_pos)}
    if kind == "uniform":
        return {"kind": "uniform", "min": draw(_pos), "max": draw(_pos)}
    if kind == "lognormal":
        d = {"kind": "lognormal", "mean": draw(_pos), "sigma": draw(_pos)}
    elif kind == "lognormal_median":
        d = {"kind": "lognormal", "median": draw(_pos), "p90": draw(_pos)}
    elif kind == "normal":
        d = {"kind": "normal", "mean": draw(_num), "std": draw(_pos)}
    else:
        return {"kind": "empirical", "values": draw(st.lists(_pos, min_size=0, max_size=4)),
                **({"weights": draw(st.lists(_pos, max_size=4))} if draw(st.booleans()) else {})}
    if draw(st.booleans()):
        d["min"] = draw(_pos)
    if draw(st.booleans()):
        d["max"] = draw(_pos)
    return d


@st.composite
def _workload(draw):
    kind = draw(st.sampled_from(["poisson", "gamma", "constant", "agentic"]))
    d: dict = {"kind": kind, "rate": draw(_pos)}
    if draw(st.booleans()) or True:
        d["num_requests"] = draw(st.one_of(st.integers(1, 40), _pos))
    if draw(st.booleans()):
        d["duration_s"] = draw(_pos)
    if kind == "gamma":
        d["cv"] = draw(_pos)
    for f in ("input_len", "output_len"):
        if draw(st.booleans()):
            d[f] = draw(_dist())
    if draw(st.booleans()):
        d["shared_prefix_len"] = draw(st.one_of(st.integers(0, 5000), _pos))
        d["num_prefix_groups"] = draw(st.one_of(st.integers(1, 8), _pos))
    if draw(st.booleans()):
        d["hash_private_blocks"] = True
    if draw(st.booleans()):
        d["priority_mix"] = draw(st.dictionaries(st.integers(-(2**40), 2**40), _pos, max_size=3))
    if kind == "agentic":
        for f in ("turns", "think_time_s"):
            if draw(st.booleans()):
                d[f] = draw(_dist())
        for f in ("est_ttft_s", "est_tpot_s", "max_prompt_len"):
            if draw(st.booleans()):
                d[f] = draw(_pos)
    return d


def _draw_requests(spec: WorkloadSpec, block_size: int):
    if spec.num_requests is None or spec.num_requests > 40:
        spec = spec.model_copy(update={"num_requests": 40})
    return generate(spec, np.random.default_rng(0), block_size)


@FUZZ
@given(data=_workload(), block_size=st.sampled_from([1, 16, 64]))
def test_workloads_draw_sane_requests_or_say_why(data, block_size):
    try:
        spec = validate(WorkloadSpec, data, "workload")
        reqs = _draw_requests(spec, block_size)
    except TwinferError as err:
        assert str(err).strip()
        return
    t = [r.arrival_time for r in reqs]
    assert all(math.isfinite(x) and x >= 0 for x in t) and t == sorted(t)
    assert all(r.prompt_len >= 1 and r.output_len >= 1 for r in reqs)
    assert all(len(r.block_hashes) <= r.prompt_len // block_size for r in reqs)


_line = st.fixed_dictionaries(
    {"timestamp": _num, "input_length": _num, "output_length": _num},
    optional={"hash_ids": st.lists(st.one_of(st.integers(-5, 2**64 + 5), _num), max_size=5),
              "hash_block_size": _num, "priority": _num, "session_id": st.text(max_size=5) | _num},
)


@FUZZ
@given(lines=st.lists(_line, min_size=1, max_size=4), fmt=st.sampled_from(["jsonl", "mooncake"]),
       block_size=st.sampled_from([1, 16, 64]), scale=st.sampled_from([1.0, 1e-6, 1e6]))
def test_trace_lines_with_extreme_numbers_read_or_say_why(lines, fmt, block_size, scale):
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "t.jsonl"
        p.write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
        try:
            reqs = read_trace(p, block_size, fmt, time_scale=scale)
        except TwinferError as err:
            assert str(err).strip()
            return
    assert all(math.isfinite(r.arrival_time) and r.arrival_time >= 0 for r in reqs)
    assert all(len(r.block_hashes) <= r.prompt_len // block_size for r in reqs)
