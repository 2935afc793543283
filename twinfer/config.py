"""Loading user files (YAML/JSON) into pydantic models with errors that name the field."""

from __future__ import annotations

import json
import math
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
        if isinstance(got, float) and not math.isfinite(got):   # NaN fails every bound: name what is wrong with it
            lines.append(f"{source + ': ' if source else ''}{loc}: {got} is not allowed; numbers must be finite")
            continue
        if msg.startswith("Value error, "):  # our own validators already name the field
            msg = msg[len("Value error, "):]
            if not e.get("loc"):
                lines.append(f"{source + ': ' if source else ''}{msg}")
                continue
        if "(got " in msg:   # a nested file's own error already shows its value (not the file name again)
            got_s = ""
        lines.append(f"{source + ': ' if source else ''}{loc}: {msg}{got_s}")
    return "\n".join(lines)


# Bounds on what a user file may hold once parsed: YAML aliases can make a few lines stand for an
# exponentially large document ("billion laughs"), which validation would then walk.
MAX_DEPTH = 64
MAX_VALUES = 1_000_000


def check_data(data: object, source: str = "") -> None:
    """Refuse NaN/inf numbers (YAML's .nan/.inf, Python JSON's NaN/Infinity: no field wants them),
    nesting deeper than MAX_DEPTH and documents of more than MAX_VALUES values (counting every
    use of a YAML alias), naming where."""
    where = f"{source}: " if source else ""
    count = 0
    stack: list[tuple[object, tuple, int]] = [(data, (), 0)]
    while stack:
        node, path, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise TwinferError(f"{where}the document holds more than {MAX_VALUES:,} values (YAML aliases expanding?)")
        if isinstance(node, float) and not math.isfinite(node):
            loc = ".".join(str(p) for p in path) or "(top level)"
            raise TwinferError(f"{where}{loc}: {node} is not allowed; numbers must be finite")
        if isinstance(node, (dict, list, tuple)):
            if depth >= MAX_DEPTH:
                loc = ".".join(str(p) for p in path) or "(top level)"
                raise TwinferError(f"{where}{loc}: nested more than {MAX_DEPTH} levels deep")
            items = node.items() if isinstance(node, dict) else enumerate(node)
            stack.extend((v, path + (k,), depth + 1) for k, v in items)


def validate(model: type[M], data: object, source: str = "") -> M:
    """``model.model_validate(data)`` raising TwinferError with field-naming messages."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise TwinferError(format_validation_error(err, source)) from None


def is_file(path: str | Path) -> bool:
    """``Path.is_file`` that says False, not OSError, for names the OS refuses (too long, ...)."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def is_dir(path: str | Path) -> bool:
    """``Path.is_dir`` that says False, not OSError, for names the OS refuses."""
    try:
        return Path(path).is_dir()
    except (OSError, ValueError):
        return False


def exists(path: str | Path) -> bool:
    """``Path.exists`` that says False, not OSError, for names the OS refuses."""
    try:
        return Path(path).exists()
    except (OSError, ValueError):
        return False


def not_a_file(path: str | Path) -> str | None:
    """What ``path`` is when it exists but is not a regular file ("a directory", "not a regular file (a device, pipe
    or socket)"); None when it is a file or does not exist. Such a path is named as what it is, not as missing or as
    an unknown name (and a device is never read: /dev/zero has no end)."""
    if is_file(path) or not exists(path):
        return None
    return "a directory" if is_dir(path) else "not a regular file (a device, pipe or socket)"


def read_mapping(path: str | Path) -> dict:
    """Read a YAML or JSON file that must hold a mapping."""
    p = Path(path)
    if not is_file(p):
        what = not_a_file(p)
        raise TwinferError(f"{p}: no such file" if what is None else
                           f"{p}: a directory, not a file" if what == "a directory" else
                           f"{p}: {what}; give a YAML or JSON file")
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise TwinferError(f"{p}: cannot read: {err.strerror or err}") from None
    kind = "JSON" if p.suffix == ".json" else "YAML"
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, ValueError) as err:  # ValueError: JSON errors, and YAML/JSON ints past 4,300 digits
        raise TwinferError(f"{p}: not valid {kind}: {str(err).split('; use sys.')[0]}") from None
    except RecursionError:
        raise TwinferError(f"{p}: not valid {kind}: nested too deeply") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise TwinferError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    check_data(data, str(p))
    return data


def load_model_file(model: type[M], path: str | Path) -> M:
    """Read a YAML/JSON file into ``model``."""
    return validate(model, read_mapping(path), str(path))
