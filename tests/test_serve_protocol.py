"""Request validation and response shapes of the OpenAI protocol models (no torch, no server)."""

from __future__ import annotations

import json

import pytest

from executor.serve import protocol as P


def _err(model, body) -> P.APIError:
    with pytest.raises(P.APIError) as info:
        P.parse_request(model, body)
    return info.value


@pytest.mark.parametrize("prompt, expected", [
    ("hi", "hi"), ([1, 2, 3], [1, 2, 3]), (["hi"], "hi"), ([[4, 5]], [4, 5]),
])
def test_prompt_forms_normalise_to_one_prompt(prompt, expected):
    assert P.parse_request(P.CompletionRequest, {"prompt": prompt}).prompt == expected


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "n": 2}, "n"),
    ({"prompt": "x", "temperature": -0.1}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "top_k": 0}, "top_k"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": 7}, "prompt"),
    ({}, "prompt"),
    ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": "x", "logprobs": 3}, "logprobs"),
    ({"prompt": "x", "presence_penalty": 0.5}, "presence_penalty"),
])
def test_completion_errors_name_the_param(body, param):
    e = _err(P.CompletionRequest, body)
    assert e.status == 400 and e.param == param
    assert e.body()["error"]["type"] == "invalid_request_error"
    assert param in e.body()["error"]["message"]


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user"}]}, "messages[0]"),                       # content is required (OpenAI)
    ({"messages": [{"role": "system", "content": None}, {"role": "user", "content": "x"}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 4}, "n"),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, "max_completion_tokens"),
])
def test_chat_errors_name_the_param(body, param):
    assert _err(P.ChatCompletionRequest, body).param == param


def test_a_message_without_content_is_refused_but_an_assistants_may_be_null():
    e = _err(P.ChatCompletionRequest, {"messages": [{"role": "user"}]})
    assert e.status == 400 and "content is required for a user message" in e.body()["error"]["message"]
    req = P.parse_request(P.ChatCompletionRequest, {"messages": [{"role": "user", "content": ""},
                                                                 {"role": "assistant", "content": None}]})
    assert [m.text for m in req.messages] == ["", ""]


def test_body_must_be_an_object():
    assert _err(P.CompletionRequest, [1, 2]).status == 400


def test_stop_normalises_to_a_list():
    assert P.parse_request(P.CompletionRequest, {"prompt": "x", "stop": "\n"}).stop == ["\n"]
    assert P.parse_request(P.CompletionRequest, {"prompt": "x", "stop": ["a", "b"]}).stop == ["a", "b"]
    assert P.parse_request(P.CompletionRequest, {"prompt": "x"}).stop == []
    assert P.parse_request(P.CompletionRequest, {"prompt": "x", "stop": []}).stop == []


@pytest.mark.parametrize("stop", ["", [""], ["a", ""]])
def test_an_empty_stop_string_is_400_not_dropped(stop):
    # it was dropped silently (the answer ran on as if no stop was asked); vLLM refuses it
    e = _err(P.CompletionRequest, {"prompt": "x", "stop": stop})
    assert e.status == 400 and e.param == "stop" and "must not be empty" in e.message


def test_a_text_part_without_text_names_the_missing_field():
    # it said "only text content parts are supported (got type 'text')"
    e = _err(P.ChatCompletionRequest, {"messages": [{"role": "user", "content": [{"type": "text"}]}]})
    assert e.param == "messages[0].content[0].text" and e.message == "messages[0].content[0].text: field required"
    e = _err(P.ChatCompletionRequest, {"messages": [{"role": "user", "content": [{"type": "image_url", "text": "x"}]}]})
    assert e.param == "messages[0].content[0]" and "only text content parts are supported (got type 'image_url')" in e.message


@pytest.mark.parametrize("prompt, bad", [([1.0, 2.0], "1.0"), ([[3, 2.5]], "2.5"), ([1, True], "True"), (["a", 1], "'a'")])
def test_non_integer_token_ids_are_named_as_such(prompt, bad):
    # [1.0, 2.0] was "prompt: Input should be a valid string" (the union's first branch)
    e = _err(P.CompletionRequest, {"prompt": prompt})
    assert e.param == "prompt" and e.message == f"prompt: prompt token ids must be integers (got {bad})"


def test_chat_refuses_echo_as_completions_does():
    # docs/serve.md lists echo as refused; chat took `echo: true` and ignored it
    e = _err(P.ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}], "echo": True})
    assert e.status == 400 and e.param == "echo" and "echo is not supported" in e.message
    req = P.parse_request(P.ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}], "echo": False})
    assert req.echo is False


def test_chat_max_completion_tokens_wins_and_text_parts_join():
    req = P.parse_request(P.ChatCompletionRequest, {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        "max_tokens": 5, "max_completion_tokens": 7, "stream": True, "stream_options": {"include_usage": True}})
    assert req.requested_max_tokens == 7 and req.messages[0].text == "ab" and req.include_usage


def test_sampling_kwargs_fill_openai_defaults():
    req = P.parse_request(P.CompletionRequest, {"prompt": "x", "seed": 3, "stop_token_ids": [9], "ignore_eos": True})
    assert req.sampling_kwargs(12) == {"max_tokens": 12, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "seed": 3,
                                       "stop_token_ids": [9], "ignore_eos": True}


def test_unknown_fields_are_ignored():
    assert P.parse_request(P.CompletionRequest, {"prompt": "x", "metadata": {"a": 1}}).prompt == "x"


def test_ids_and_sse_framing():
    assert P.new_id("cmpl").startswith("cmpl-") and P.new_id("chatcmpl", "abc") == "chatcmpl-abc"
    chunk = P.CompletionChunk(id="cmpl-1", created=1, model="m", choices=[P.CompletionChoice(text="a")])
    line = P.sse(chunk)
    assert line.startswith("data: ") and line.endswith("\n\n")
    assert json.loads(line[6:])["object"] == "text_completion"
    assert P.SSE_DONE == "data: [DONE]\n\n"
    u = P.UsageInfo.of(3, 4, cached=1)
    assert (u.total_tokens, u.prompt_tokens_details.cached_tokens) == (7, 1)


def test_chat_deltas_carry_only_what_changed():
    def delta(**kw):
        chunk = P.ChatCompletionChunk(id="c", created=1, model="m", choices=[P.ChatStreamChoice(delta=P.DeltaMessage(**kw))])
        return json.loads(P.sse(chunk)[6:])["choices"][0]["delta"]

    assert delta(role="assistant", content="") == {"role": "assistant", "content": ""}
    assert delta(content="x") == {"content": "x"} and delta() == {}


@pytest.mark.parametrize("model, base", [(P.CompletionRequest, {"prompt": "x"}),
                                         (P.ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}]})])
def test_null_means_the_default(model, base):
    # OpenAI's API reference types n as "integer or null" and stream / echo as "boolean or null" (absent and null
    # alike: the default); clients that serialise every field send them so, and must not get a 400
    fields = {"n": None, "stream": None, "ignore_eos": None, "echo": None}
    req = P.parse_request(model, {**base, **fields})
    assert (req.n, req.stream, req.ignore_eos) == (1, False, False)
    assert req.sampling_kwargs(4)["ignore_eos"] is False
    assert _err(model, {**base, "stream": 1}).param == "stream"   # strict still: a number is not a boolean
