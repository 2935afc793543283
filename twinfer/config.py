"""Loading user files (YAML/JSON) into pydantic models with errors that name the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from twinfer.errors import TwinferError

M = TypeVar("M", bound=BaseModel)


def format_validation_error(err: ValidationError, source: str = "") -> str:
    """One line per problem: 'source: field.path: message (got value)'."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e.get("loc", ())) or "(top level)"
        got = e.get("input")
        got_s = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
        msg = e.get("msg", "invalid")
        if msg.startswith("Value error, "):  # our own validators already name the field
            msg = msg[len("Value error, "):]
            if not e.get("loc"):
                lines.append(f"{source + ': ' if source else ''}{msg}")
                continue
        lines.append(f"{source + ': ' if source else ''}{loc}: {msg}{got_s}")
    return "\n".join(lines)


def validate(model: type[M], data: object, source: str = "") -> M:
    """``model.model_validate(data)`` raising TwinferError with field-naming messages."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise TwinferError(format_validation_error(err, source)) from None


def read_mapping(path: str | Path) -> dict:
    """Read a YAML or JSON file that must hold a mapping."""
    p = Path(path)
    if not p.is_file():
        raise TwinferError(f"{p}: no such file")
    text = p.read_text(encoding="utf-8", errors="replace")
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        raise TwinferError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {err}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise TwinferError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def load_model_file(model: type[M], path: str | Path) -> M:
    """Read a YAML/JSON file into ``model``."""
    return validate(model, read_mapping(path), str(path))
