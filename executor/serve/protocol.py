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

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer, model_validator


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
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    """Fields shared by both endpoints: sampling, stopping, streaming."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    # bounded so that no value can reach a tensor constructor it overflows (a step that raises
    # there would end the engine loop for every request)
    top_k: int | None = Field(None, le=2**31 - 1)
    stop: str | list[str] | None = Field(None, validate_default=True)
    stop_token_ids: list[int] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1, description="torch.Generator takes a 64-bit seed")
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    user: str | None = None
    # accepted for compatibility only at their neutral values
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    best_of: int | None = None
    logprobs: Any = None

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

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> list[str]:
        # one list form downstream; empty strings would match everywhere, so they are dropped
        items = [v] if isinstance(v, str) else list(v or [])
        return [s for s in items if s]

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

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's documented default for completions
    echo: bool = False
    suffix: str | None = None

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

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, v: bool) -> bool:
        if v:
            raise ValueError("echo is not supported")
        return v

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix is not supported")
        return v


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None

    @model_validator(mode="after")
    def _text_only(self) -> "ContentPart":
        if self.type != "text" or self.text is None:
            raise ValueError(f"only text content parts are supported (got type {self.type!r})")
        return self


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    @property
    def text(self) -> str:
        """The message's text: string content, or its text parts joined."""
        if isinstance(self.content, list):
            return "".join(p.text or "" for p in self.content)
        return self.content or ""


class ChatCompletionRequest(_SamplingRequest):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    @property
    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens`` (the new name) wins over the deprecated ``max_tokens``."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def _param_name(loc: tuple) -> str | None:
    """('messages', 0, 'role') -> 'messages[0].role'; pydantic's union-branch tags are dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and (part.startswith(("str", "list[", "int", "function-")) or "[" in part):
            continue  # a union member's name, not a field
        else:
            out += ("." if out else "") + part
    return out or None


def parse_request(model: type[BaseModel], body: Any) -> Any:
    """Validate a decoded JSON body, raising ``APIError`` that names the first bad parameter."""
    if not isinstance(body, dict):
        raise APIError("request body must be a JSON object", param=None)
    try:
        return model.model_validate(body)
    except ValidationError as err:
        errors = err.errors()
        # in a union, the branch our own validator rejected says more than "not a string"
        e = next((x for x in errors if x.get("type") == "value_error"), errors[0])
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
