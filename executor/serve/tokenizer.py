"""Tokenizers for the server: byte-level for dummy weights, HF ``tokenizers`` for real checkpoints.

Both decode incrementally: a stream hands out text only once it is complete UTF-8 (and, for
BPE/SentencePiece, once a token's leading space is settled), so a multi-byte character split
over two tokens never reaches the client as two replacement characters.
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Callable, Protocol, Sequence

from twinfer.errors import TwinferError

# the client-facing message shape the chat template sees: {"role": ..., "content": ...}
Message = dict


class IncrementalDecoder(Protocol):
    def step(self, new_ids: Sequence[int]) -> str: ...
    def flush(self) -> str: ...


class Tokenizer(Protocol):
    """What the app needs from a tokenizer."""

    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def encode_chat(self, messages: list[Message]) -> list[int]: ...
    def decoder(self, prompt_ids: Sequence[int] = ()) -> IncrementalDecoder: ...


# ----------------------------------------------------------------------------- chat templates


def builtin_chat_text(messages: list[Message], add_generation_prompt: bool = True) -> str:
    """A minimal role-tagged template for models without one (dummy weights have none)."""
    parts = [f"<|{m['role']}|>\n{m.get('content') or ''}\n" for m in messages]
    if add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)


def render_jinja_template(template: str, messages: list[Message], *, add_generation_prompt: bool = True,
                          **special_tokens: str | None) -> str:
    """Render an HF ``chat_template`` in jinja2's sandbox, as transformers does."""
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:  # jinja2 is not a core dependency
        raise TwinferError("this model's chat template needs jinja2: pip install jinja2") from None

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    def strftime_now(fmt: str) -> str:
        import datetime

        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                **special_tokens)
    except jinja2.TemplateError as err:
        raise ValueError(f"chat template failed: {err}") from None


# ----------------------------------------------------------------------------- byte-level


class _ByteDecoder:
    """UTF-8 bytes in, complete characters out; specials and out-of-range ids print nothing."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def step(self, new_ids: Sequence[int]) -> str:
        return self._utf8.decode(bytes(t for t in new_ids if 0 <= t < 256))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


class ByteTokenizer:
    """Ids 0-255 are bytes; BOS/EOS/PAD sit just above 255, so it fits any vocab >= 259.

    A dummy-weight model samples ids above the specials too: they decode to nothing (like
    special tokens with ``skip_special_tokens``) but still count as completion tokens.
    """

    def __init__(self, vocab_size: int = 512, eos_token_id: int | None = None):
        if vocab_size < 259:
            raise TwinferError(f"byte-level tokenizer needs a vocab of at least 259 ids (256 bytes + BOS/EOS/PAD), model has {vocab_size}")
        self.vocab_size = vocab_size
        # honour the engine's EOS when it is a non-byte id; take the next free ids for the rest
        eos = eos_token_id if eos_token_id is not None and 256 <= eos_token_id < vocab_size else 257
        free = [i for i in range(256, 259 + 1) if i != eos]
        self.eos_token_id = eos
        self.bos_token_id, self.pad_token_id = free[0], free[1]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """BOS then the UTF-8 bytes."""
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def decode(self, ids: Sequence[int]) -> str:
        """The bytes among ``ids`` as UTF-8 (invalid sequences become U+FFFD)."""
        return bytes(t for t in ids if 0 <= t < 256).decode("utf-8", errors="replace")

    def encode_chat(self, messages: list[Message]) -> list[int]:
        """The built-in template, BOS first."""
        return self.encode(builtin_chat_text(messages))

    def decoder(self, prompt_ids: Sequence[int] = ()) -> IncrementalDecoder:
        """A fresh incremental decoder (bytes need no prompt context)."""
        return _ByteDecoder()


# ----------------------------------------------------------------------------- HF tokenizers

# vLLM's detokenizer re-decodes this many prompt tokens so the first output token's leading
# space (SentencePiece) or byte-merge (byte-level BPE) comes out as it would mid-text.
_PROMPT_CONTEXT = 5


class _OffsetDecoder:
    """Incremental detokenization by re-decoding a short window (vLLM's prefix/read offsets)."""

    def __init__(self, decode: Callable[[Sequence[int]], str], prompt_ids: Sequence[int]):
        self._decode = decode
        self._ids = list(prompt_ids[-_PROMPT_CONTEXT:])
        self._prefix = 0                 # start of the window re-decoded for context
        self._read = len(self._ids)      # end of the text already handed out

    def step(self, new_ids: Sequence[int]) -> str:
        self._ids.extend(new_ids)
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        text = self._decode(self._ids[self._prefix:])
        # a trailing U+FFFD means a character is still split across tokens: wait for the rest
        if len(text) > len(prefix_text) and not text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return text[len(prefix_text):]
        return ""

    def flush(self) -> str:
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        text = self._decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return text[len(prefix_text):]


def _token_str(v: object) -> str | None:
    """tokenizer_config.json stores special tokens as strings or as AddedToken dicts."""
    if isinstance(v, dict):
        return v.get("content")
    return v if isinstance(v, str) else None


class HFTokenizer:
    """``tokenizer.json`` via the ``tokenizers`` library, plus ``tokenizer_config.json``'s specials and chat template."""

    def __init__(self, model_dir: str | Path):
        try:
            from tokenizers import Tokenizer as _Tok
        except ImportError:
            raise TwinferError(f"{model_dir} has a tokenizer.json; reading it needs the tokenizers package: pip install tokenizers") from None
        d = Path(model_dir)
        self._tok = _Tok.from_file(str(d / "tokenizer.json"))
        cfg_path = d / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.is_file() else {}
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.bos_token = _token_str(cfg.get("bos_token"))
        self.eos_token = _token_str(cfg.get("eos_token"))
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self.eos_token_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        tmpl = cfg.get("chat_template")
        if tmpl is None and (d / "chat_template.jinja").is_file():   # where transformers >= 4.43 saves it
            tmpl = (d / "chat_template.jinja").read_text(encoding="utf-8")
        if isinstance(tmpl, list):  # named templates: the "default" one serves chat
            tmpl = next((t.get("template") for t in tmpl if t.get("name") == "default"), None)
        self.chat_template: str | None = tmpl

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids; ``add_special_tokens`` lets the tokenizer's post-processor add BOS."""
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Text with special tokens skipped."""
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def encode_chat(self, messages: list[Message]) -> list[int]:
        """The model's chat template (built-in one if it has none); the template places BOS itself."""
        if not self.chat_template:
            return self.encode(builtin_chat_text(messages))
        text = render_jinja_template(self.chat_template, messages, bos_token=self.bos_token or "",
                                     eos_token=self.eos_token or "")
        return self.encode(text, add_special_tokens=False)

    def decoder(self, prompt_ids: Sequence[int] = ()) -> IncrementalDecoder:
        """A fresh incremental decoder primed with the prompt's tail."""
        return _OffsetDecoder(self.decode, prompt_ids)


def load_tokenizer(model: str, *, vocab_size: int, eos_token_id: int | None = None) -> Tokenizer:
    """HF tokenizer when ``model`` is a directory with ``tokenizer.json``; byte-level otherwise."""
    d = Path(model)
    if d.is_dir() and (d / "tokenizer.json").is_file():
        return HFTokenizer(d)
    return ByteTokenizer(vocab_size=vocab_size, eos_token_id=eos_token_id)
