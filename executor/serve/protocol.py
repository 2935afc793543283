"""OpenAI-compatible request/response models for /v1/completions and /v1/chat/completions.

Requests are parsed with ``parse_request`` which turns every validation problem into an
``APIError`` naming the offending parameter, so the app can answer 400 with OpenAI's
error body. Unknown fields are ignored (clients send many optional ones); fields we
cannot honour are refused rather than silently ignored.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError,
                      ValidationInfo, field_validator, model_serializer, model_validator)

# JSON's true/false are not numbers: strict types refuse `"max_tokens": true` (pydantic's lax mode
# would take it as 1), and a number is not a string. Floats still take integers (1 means 1.0).

MAX_STOP_STRINGS = 64          # stop strings per request (OpenAI allows 4; vLLM has no bound)
MAX_STOP_CHARS = 16_384        # their total length: each generated token is checked against all of them
MAX_STOP_TOKEN_IDS = 1024      # stop_token_ids per request


class APIError(Exception):
    """An error the client caused (or a server state it must know about), with OpenAI's fields.

    ``headers`` go out with the response (e.g. ``Retry-After`` on 429 and 503).
    """

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int = 400, type: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.type = message, param, code, status, type
        self.headers = headers or {}

    def body(self) -> dict:
        """The JSON body OpenAI's clients parse: ``{"error": {message, type, param, code}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# ----------------------------------------------------------------------------- requests


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


# the values of unimplemented fields that change nothing (what a client library sends by default)
_NEUTRAL: dict[str, tuple] = {
    "repetition_penalty": (None, 1, 1.0), "min_tokens": (None, 0), "logit_bias": (None, {}),
    "response_format": (None, {"type": "text"}), "tools": (None, []), "tool_choice": (None, "none"),
    "functions": (None, []), "function_call": (None, "none"), "guided_json": (None,), "guided_regex": (None,),
    "guided_choice": (None,), "guided_grammar": (None,),
}
_NEUTRAL_TEXT = {k: " or ".join("null" if v is None else repr(v) for v in vals) for k, vals in _NEUTRAL.items()}


class _SamplingRequest(BaseModel):
    """Fields shared by both endpoints: sampling, stopping, streaming."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = None
    temperature: StrictFloat | None = Field(None, ge=0.0)
    top_p: StrictFloat | None = Field(None, gt=0.0, le=1.0)
    # bounded so that no value can reach a tensor constructor it overflows (a step that raises
    # there would end the engine loop for every request)
    top_k: StrictInt | None = Field(None, le=2**31 - 1)
    stop: StrictStr | list[StrictStr] | None = Field(None, validate_default=True)
    stop_token_ids: list[StrictInt] | None = Field(None, max_length=MAX_STOP_TOKEN_IDS)
    seed: StrictInt | None = Field(None, ge=-(2**63), le=2**64 - 1, description="torch.Generator takes a 64-bit seed")
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False
    user: StrictStr | None = None
    # accepted for compatibility only at their neutral values
    presence_penalty: StrictFloat | None = None
    frequency_penalty: StrictFloat | None = None
    best_of: StrictInt | None = None
    logprobs: Any = None
    # answer-changing fields this server does not implement: refused unless neutral, never ignored
    repetition_penalty: StrictFloat | None = None
    min_tokens: StrictInt | None = None
    logit_bias: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    # completions' echo (prompt in the answer) and vLLM's chat echo (the last message) alike: not implemented
    echo: StrictBool = False


    @field_validator("n", "stream", "ignore_eos", "echo", mode="before", check_fields=False)
    @classmethod
    def _null_is_default(cls, v: Any, info: ValidationInfo) -> Any:
        # OpenAI's API types these "integer or null" / "boolean or null": null, like absence, means the default
        return cls.model_fields[info.field_name].default if v is None else v

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int | None) -> int | None:
        if v is not None and v != -1 and v < 1:
            raise ValueError("top_k must be -1 (disabled) or >= 1")
        return v

    @field_validator("n")
    @classmethod
    def _n(cls, v: int) -> int:
        if v != 1:
            raise ValueError(f"only n=1 is supported (got n={v})")
        return v

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v: int | None) -> int | None:
        if v not in (None, 1):
            raise ValueError("best_of is not supported (only 1)")
        return v

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, v: float | None) -> float | None:
        if v not in (None, 0, 0.0):
            raise ValueError("penalties are not supported (only 0)")
        return v

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, v: Any) -> Any:
        if v not in (None, False, 0):
            raise ValueError("logprobs are not supported")
        return v

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, v: bool) -> bool:
        if v:
            raise ValueError("echo is not supported")
        return v

    @field_validator("stream_options", mode="before")
    @classmethod
    def _stream_options_need_stream(cls, v: Any, info: ValidationInfo) -> Any:
        # as vLLM: options for a stream that will not be sent are a client bug, not something to ignore.
        # A `stream` that failed its own check is missing from info.data: its error is the one to report
        if v and not info.data.get("stream", True):
            raise ValueError("Stream options can only be defined when `stream=True`")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> list[str]:
        # one list form downstream. An empty string would match everywhere: refused as vLLM does (dropping it
        # silently answered as if the client had not asked for a stop)
        items = [v] if isinstance(v, str) else list(v or [])
        if len(items) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings (got {len(items)})")
        if not all(items):
            raise ValueError("stop strings must not be empty (got \"\")")
        total = sum(len(s) for s in items)
        if total > MAX_STOP_CHARS:
            raise ValueError(f"stop strings may total at most {MAX_STOP_CHARS} characters (got {total})")
        return items

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_ids(cls, v: list[int] | None) -> list[int] | None:
        if v and any(not 0 <= t < 2**63 for t in v):
            raise ValueError("stop_token_ids must be token ids in [0, 2**63)")
        return v

    @property
    def include_usage(self) -> bool:
        """Whether a streaming response ends with a usage-only chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling_kwargs(self, max_tokens: int) -> dict:
        """Keyword arguments for the engine's ``SamplingParams`` (OpenAI defaults filled in)."""
        return {
            "max_tokens": max_tokens,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "top_k": -1 if self.top_k is None else self.top_k,
            "seed": self.seed,
            "stop_token_ids": list(self.stop_token_ids or []),
            "ignore_eos": self.ignore_eos,
        }


class CompletionRequest(_SamplingRequest):
    """POST /v1/completions."""

    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]
    max_tokens: StrictInt | None = Field(16, ge=1)  # OpenAI's documented default for completions
    suffix: StrictStr | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _integer_ids(cls, v: Any) -> Any:
        # said before the union is tried: its branches would each fail on 1.0, and the first one (a string) named
        # only "Input should be a valid string"
        rows = v[:1] if isinstance(v, list) and v and isinstance(v[0], list) else [v]
        for row in rows:
            # a list of token ids: one that holds a number holds only integers (a list of strings is text prompts)
            if isinstance(row, list) and any(isinstance(t, (int, float)) and not isinstance(t, bool) for t in row):
                bad = next((t for t in row if not isinstance(t, int) or isinstance(t, bool)), None)
                if bad is not None:
                    raise ValueError(f"prompt token ids must be integers (got {bad!r})")
        return v

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: Any) -> str | list[int]:
        # batches of prompts would need n choices per response; one prompt per request keeps
        # one engine request per HTTP request
        if isinstance(v, list) and v and isinstance(v[0], (str, list)):
            if len(v) != 1:
                raise ValueError(f"only one prompt per request is supported (got {len(v)})")
            v = v[0]
        if isinstance(v, list):
            if not v:
                raise ValueError("prompt token list is empty")
            if any(t < 0 for t in v):
                raise ValueError("prompt token ids must be non-negative")
        return v

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix is not supported")
        return v


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: StrictStr
    text: StrictStr   # a text part without its text is a missing field (messages[i].content[j].text), not a wrong type

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, v: Any) -> Any:
        # checked before the fields, so that an image part is refused for its type, not for lacking `text`
        if isinstance(v, dict) and isinstance(v.get("type"), str) and v["type"] != "text":
            raise ValueError(f"only text content parts are supported (got type {v['type']!r})")
        return v


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[ContentPart] | None = None
    name: StrictStr | None = None

    @model_validator(mode="after")
    def _content_given(self) -> "ChatMessage":
        # as OpenAI's API: every message but an assistant's (whose content may be null beside tool calls) has content
        if self.content is None and self.role != "assistant":
            raise ValueError(f"content is required for a {self.role} message (a string or a list of text parts; "
                             "only an assistant message may leave it null)")
        return self

    @property
    def text(self) -> str:
        """The message's text: string content, or its text parts joined."""
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatCompletionRequest(_SamplingRequest):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: StrictInt | None = Field(None, ge=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    top_logprobs: StrictInt | None = Field(None, ge=0)

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, v: int | None, info: ValidationInfo) -> int | None:
        # vLLM's rule (0 asks for nothing); `logprobs: true` itself is refused as unsupported, and a `logprobs`
        # that failed its check is missing from info.data: its error is the one to report
        if v and not info.data.get("logprobs", True):
            raise ValueError("when using `top_logprobs`, `logprobs` must be set to true")
        return v

    @property
    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens`` (the new name) wins over the deprecated ``max_tokens``."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


_UNION_TAGS = {"str", "int", "float", "bool", "none"}


def _is_union_tag(part: str) -> bool:
    """pydantic's names for union members in an error location: 'str', 'list[int]', 'function-after[...]'."""
    return part in _UNION_TAGS or "[" in part or part.startswith("function-")


def _param_name(loc: tuple) -> str | None:
    """('messages', 0, 'role') -> 'messages[0].role'; pydantic's union-branch tags are dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and _is_union_tag(part):
            continue  # a union member's name, not a field
        else:
            out += ("." if out else "") + part
    return out or None


def _refuse_unimplemented(body: dict) -> None:
    """400 for a field that would change the answer and that this server does not implement."""
    for name, neutral in _NEUTRAL.items():
        value = body.get(name)
        # `in` compares with ==, and True == 1: a bool is never one of the neutral values
        if name in body and (isinstance(value, bool) or value not in neutral):
            raise APIError(f"{name}: not supported by this server (only {_NEUTRAL_TEXT[name]}; got {value!r:.80})",
                           param=name, code="unsupported_parameter")


def parse_request(model: type[BaseModel], body: Any) -> Any:
    """Validate a decoded JSON body, raising ``APIError`` that names the first bad parameter."""
    if not isinstance(body, dict):
        raise APIError("request body must be a JSON object", param=None)
    _refuse_unimplemented(body)
    try:
        return model.model_validate(body)
    except ValidationError as err:
        errors = err.errors()
        # in a union, the branch our own validator rejected says more than "not a string"; else the branch that got
        # deepest into the value (a text part missing its `text`, not the string branch's "not a string")
        e = next((x for x in errors if x.get("type") == "value_error"),
                 max(errors, key=lambda x: len(x.get("loc", ()))))
        param = _param_name(tuple(e.get("loc", ())))
        msg = str(e.get("msg", "invalid value")).removeprefix("Value error, ")
        got = e.get("input")
        if e.get("type") == "missing":
            msg = "field required"
        elif not isinstance(got, (dict, list)) and "(got " not in msg:
            msg += f" (got {got!r})"
        raise APIError(f"{param}: {msg}" if param else msg, param=param) from None


# ----------------------------------------------------------------------------- responses


def new_id(prefix: str, base: str | None = None) -> str:
    """``cmpl-<hex>`` / ``chatcmpl-<hex>``, or ``<prefix>-<base>`` when the client sent X-Request-Id."""
    return f"{prefix}-{base or uuid.uuid4().hex}"


def now_s() -> int:
    """Unix seconds for the ``created`` field (wall clock is right here: it is what clients expect)."""
    return int(time.time())


FinishReason = Literal["stop", "length", "abort"] | None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def of(cls, prompt: int, completion: int, cached: int = 0) -> "UsageInfo":
        """Usage with the total filled in."""
        return cls(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: FinishReason = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessageOut
    logprobs: None = None
    finish_reason: FinishReason = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo | None = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler):
        # OpenAI's deltas carry only what changed: {"content": "x"}, and {} on the final chunk
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatStreamChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    logprobs: None = None
    finish_reason: FinishReason = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


class CompletionChunk(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


def sse(payload: BaseModel | dict) -> str:
    """One server-sent event line pair: ``data: <json>\\n\\n``."""
    import json

    data = payload.model_dump_json(exclude_unset=False) if isinstance(payload, BaseModel) else json.dumps(payload)
    return f"data: {data}\n\n"


SSE_DONE = "data: [DONE]\n\n"
