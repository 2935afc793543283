"""Fuzz the serving path from JSON to the sampler: whatever a request body holds, it is either a
400 (APIError / SamplingParams ValidationError) or something every later stage can run.

The class of bug this guards: a value that passes validation and then raises inside an engine
step (``top_k=10**30`` overflowing a tensor, ``temperature=1e-45`` overflowing the logits,
``top_p=1e-300`` rounding to 0), which ends the engine loop for every client.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

torch = pytest.importorskip("torch")

from executor.request_state import RequestState  # noqa: E402
from executor.sampling_params import SamplingParams  # noqa: E402
from executor.serve import protocol as P  # noqa: E402
from kernels import ops  # noqa: E402

FUZZ = settings(max_examples=300, derandomize=True, deadline=None, database=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

_float = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.floats(min_value=0, max_value=3),
                   st.sampled_from([0.0, 5e-324, 1e-300, 1e-45, 1e-38, 1e-8, 1e-4, 1e-6, 0.999999, 1.0, 2.0, 1e4, 1e38, 1e308]))
_int = st.one_of(st.integers(-3, 100), st.integers(-(2**70), 2**70),
                 st.sampled_from([-1, 0, 1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30]))
_any = st.one_of(_float, _int, st.booleans(), st.none(), st.text(max_size=5), st.lists(_int, max_size=3))

_body = st.fixed_dictionaries(
    {"prompt": st.one_of(st.text(min_size=1, max_size=20), st.lists(st.integers(0, 600), min_size=1, max_size=5), _any)},
    optional={"temperature": st.one_of(_float, _any), "top_p": st.one_of(_float, _any), "top_k": st.one_of(_int, _any),
              "seed": st.one_of(_int, _any), "max_tokens": st.one_of(_int, _any), "stop": _any,
              "stop_token_ids": st.lists(_int, max_size=3) | _any, "ignore_eos": _any, "n": _any, "stream": _any,
              "presence_penalty": _any, "logprobs": _any, "best_of": _any, "echo": _any},
)


@FUZZ
@given(body=_body)
def test_what_validation_accepts_the_sampler_can_run(body):
    try:
        req = P.parse_request(P.CompletionRequest, body)
    except P.APIError as err:
        assert err.status == 400 and err.message
        return
    max_tokens = req.max_tokens if isinstance(req.max_tokens, int) else 16
    try:
        params = SamplingParams(**req.sampling_kwargs(max_tokens))
    except ValidationError:
        return  # the app answers 400 naming the field (executor.serve.app._sampling_params)
    # what the model runner does with it, for two requests in one batch
    states = [RequestState.create(f"r{i}", params, 257, 0, torch.device("cpu")) for i in range(2)]
    logits = torch.randn(2, 512) * 30
    temp = torch.tensor([s.params.temperature for s in states])
    top_k = torch.tensor([s.params.top_k for s in states])
    top_p = torch.tensor([s.params.top_p for s in states])
    if params.temperature == 0:
        out = logits.argmax(-1)
    else:
        out = ops.sample(logits, temp, top_k, top_p, [s.generator for s in states])
    assert out.shape == (2,) and bool(((out >= 0) & (out < 512)).all())


_PARAMS = ("temperature", "top_p", "top_k", "seed", "max_tokens", "stop", "stop_token_ids", "ignore_eos", "n", "stream",
           "presence_penalty", "logprobs", "best_of", "echo", "prompt", "tools", "min_tokens", "repetition_penalty",
           "logit_bias", "response_format", "stream_options", "user", "model")


@FUZZ
@given(body=st.dictionaries(st.sampled_from(_PARAMS), _any | st.dictionaries(st.text(max_size=3), _any, max_size=2),
                            max_size=6).map(lambda d: {"prompt": "x", **d}))
def test_every_refused_field_is_named(body):
    """Issue 20 item 10: a refused field is always named (`param` set to it, never null), and a JSON
    boolean is never taken as an integer."""
    try:
        req = P.parse_request(P.CompletionRequest, body)
    except P.APIError as err:
        assert err.param is not None, (body, err.message)
        root = err.param.split("[")[0].split(".")[0]
        assert root in body, (err.param, body)
        return
    for name in ("max_tokens", "top_k", "seed", "n", "best_of"):
        assert not isinstance(body.get(name), bool) or body[name] is None, (name, body)
    assert not isinstance(req.max_tokens, bool)
