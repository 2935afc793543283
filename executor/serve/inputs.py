"""Bounds on a request body before and after ``json.loads``: how many values it may hold, and valid text.

Memory. A body is at most ``max_body_bytes``, but its parsed form can be far larger: ``["a","a",...]``
turns 4 bytes into a ~58-byte str plus an 8-byte list slot. Counting the bytes that open a value
(``,``, ``[``, ``{``) bounds the number of values before anything is parsed, at C speed. The cap
leaves room for the longest useful request: a prompt of ``max_model_len`` token ids (one comma
each) or a chat whose text is all commas, four times over.

Text. JSON may spell a lone UTF-16 surrogate (``"\\ud800"``); Python decodes it into a str that no
encoder accepts, so it must be refused where it enters, naming where it was.
"""

from __future__ import annotations

from typing import Any

from executor.serve import protocol as P

BASE_JSON_VALUES = 65_536   # values any request may hold beyond its prompt (messages, stop strings, options)


def max_json_values(max_model_len: int) -> int:
    """The most values a body may hold for a model of ``max_model_len`` tokens."""
    return 4 * max_model_len + BASE_JSON_VALUES


def check_json_size(raw: bytes, max_model_len: int) -> None:
    """400 ``too_many_values`` if ``raw`` could hold more JSON values than ``max_json_values`` (an upper
    bound: separators inside strings count too, which only errs on the side of refusing sooner)."""
    limit = max_json_values(max_model_len)
    n = raw.count(b",") + raw.count(b"[") + raw.count(b"{")
    if n > limit:
        raise P.APIError(f"request body holds up to {n:,} JSON values; at most {limit:,} for this model "
                         f"(max_model_len {max_model_len:,})", code="too_many_values")


def _bad_text(s: str) -> bool:
    if s.isascii():
        return False
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def find_surrogate(body: Any) -> str | None:
    """Where the first string holding a lone surrogate is ('messages[0].content', '' for the body itself),
    or None. Iterative, so a deeply nested body cannot overflow the stack."""
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            if _bad_text(v):
                return path
        elif isinstance(v, dict):
            for k, x in v.items():
                sub = f"{path}.{k}" if path else str(k)
                if _bad_text(k):
                    return path or sub.encode("utf-8", "replace").decode()
                stack.append((sub, x))
        elif isinstance(v, list):
            stack.extend((f"{path}[{i}]", x) for i, x in enumerate(v))
    return None
