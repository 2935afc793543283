"""Loading user files (YAML/JSON) into pydantic models with errors that name the field."""

from __future__ import annotations

import collections.abc
import functools
import json
import math
import types
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, RootModel, ValidationError

from twinfer.errors import TwinferError

M = TypeVar("M", bound=BaseModel)


# what a file's top-level ``kind:`` says it is, for a file given where another type was expected
FILE_KINDS = {"twinfer-plan": "a twinfer plan file", "tuned-policy": "a tuned-policy file (twinfer tune --plan-out)"}
# what each model a user file is read into is called in messages (others: the class name in words)
MODEL_NOUNS = {"CalibrationProfile": "a calibration profile", "Hardware": "a hardware file", "ModelSpec": "a model file",
               "Scenario": "a scenario file", "Plan": "a twinfer plan file", "WorkloadSpec": "a workload",
               "SchedulerConfig": "a scheduler config", "PlanRequest": "a plan request"}
# how many of the other problems' fields the one line names after the first problem
MORE_NAMED = 4


def _noun(title: str) -> str:
    """``CalibrationProfile`` -> "a calibration profile"."""
    if title in MODEL_NOUNS:
        return MODEL_NOUNS[title]
    words = "".join(f" {c.lower()}" if c.isupper() else c for c in title).strip()
    return f"{'an' if words[:1] in 'aeiou' else 'a'} {words}" if words else "this file type"


def _wrong_kind(err: ValidationError, source: str) -> str | None:
    """A direct message for a file whose ``kind:`` names another file type than the one expected, else None."""
    for e in err.errors():
        if tuple(e.get("loc", ())) == ("kind",) and e.get("type") in ("extra_forbidden", "literal_error"):
            got = e.get("input")
            if isinstance(got, str) and got in FILE_KINDS:
                return f"{source or 'the input'} is {FILE_KINDS[got]} (kind: {got}), not {_noun(err.title)}"
    return None


def _problem(e: dict, source: str) -> tuple[str, str]:
    """One problem as ('field.path', 'source: field.path: message (got value)')."""
    where = f"{source}: " if source else ""
    loc_t = tuple(e.get("loc", ()))
    if loc_t and loc_t[-1] == "[key]":   # a mapping key outside the allowed ones: name the key, not '.[key]'
        loc_t = loc_t[:-2] + (f"key {loc_t[-2]!r}",) if len(loc_t) >= 2 else loc_t[:-1]
    loc = ".".join(str(p) for p in loc_t) or "(top level)"
    got = e.get("input")
    got_s = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
    msg = e.get("msg", "invalid")
    if isinstance(got, float) and not math.isfinite(got):   # NaN fails every bound: name what is wrong with it
        return loc, f"{where}{loc}: {got} is not allowed; numbers must be finite"
    if msg.startswith("Value error, "):  # our own validators already name the field
        msg = msg[len("Value error, "):]
        if not e.get("loc"):
            return loc, f"{where}{msg}"
    if "(got " in msg:   # a nested file's own error already shows its value (not the file name again)
        got_s = ""
    return loc, f"{where}{loc}: {msg}{got_s}"


def format_validation_error(err: ValidationError, source: str = "") -> str:
    """One line: the first problem ('source: field.path: message (got value)') and, where there are more, '(and N more:
    field, field, ...)' naming up to MORE_NAMED of their fields. A file whose ``kind:`` names another file type (a plan
    given as a calibration profile) is said to be that, not listed field by field."""
    wrong = _wrong_kind(err, source)
    if wrong is not None:
        return wrong
    problems = [_problem(e, source) for e in err.errors()]
    if not problems:
        return f"{source + ': ' if source else ''}invalid"
    first = problems[0][1]
    rest = list(dict.fromkeys(loc for loc, _ in problems[1:]))
    if len(problems) > 1:
        named = ", ".join(rest[:MORE_NAMED]) + (", ..." if len(rest) > MORE_NAMED else "")
        first += f" (and {len(problems) - 1} more: {named})"
    return " ".join(first.split("\n"))   # a validator's own message on one line too


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


def _members(tp: Any) -> list:
    """The types a field annotation allows: Annotated stripped, unions flattened."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    if get_origin(tp) in (Union, types.UnionType):
        return [m for a in get_args(tp) for m in _members(a)]
    if get_origin(tp) is Literal:   # Literal[1] takes True as 1 too: its values' types
        return list(dict.fromkeys(type(v) for v in get_args(tp)))
    return [tp]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _takes_bool_as_number(members: list) -> bool:
    """Whether pydantic (lax) would read a YAML/JSON boolean as a number here: an int or float is allowed and a bool
    is not (nor anything that takes any value)."""
    if any(m is bool or m is Any or m is object for m in members):
        return False
    return any(isinstance(m, type) and issubclass(m, (int, float)) and not issubclass(m, bool) for m in members)


@functools.lru_cache(maxsize=256)
def _field_types(model: type[BaseModel]) -> dict[str, Any]:
    """Key a file may give -> annotation, for each field (by its name and its alias)."""
    out: dict[str, Any] = {}
    for name, f in model.model_fields.items():
        out[name] = f.annotation
        for alias in (f.alias, f.validation_alias):
            if isinstance(alias, str):
                out[alias] = f.annotation
    return out


_NESTED = (bool, dict, list)   # the values bools_as_numbers looks into: a string or number holds no boolean


def bools_as_numbers(tp: Any, data: object, path: tuple = ()) -> list[tuple[tuple, bool, str]]:
    """Where ``data`` (parsed YAML/JSON) holds a boolean that ``tp`` would take as a number (``rate: true`` read as
    1.0): (path, the boolean, "a number" or "an integer"). Walks fields, mappings and lists by their annotations; a
    value of a union of several models is checked against those whose fields hold all its keys (else against all of
    them), and only what every one of them would take as a number is named."""
    members = _members(tp)
    if isinstance(data, bool):
        if _takes_bool_as_number(members):
            ints = all(not (isinstance(m, type) and issubclass(m, float)) for m in members)
            want = ("an integer" if ints else "a number") + (" or null" if type(None) in members else "")
            return [(path, data, want)]
        return []
    found: list[tuple[tuple, bool, str]] | None = None

    def meet(got: list) -> None:
        nonlocal found
        found = got if found is None else [x for x in found if x in got]

    if isinstance(data, dict):
        models = [m for m in members if _is_model(m)]
        holding = [m for m in models if all(k in _field_types(m) for k in data)]
        for m in holding or models:   # keys no field has (a preset a before-validator expands) are the model's own
            if issubclass(m, RootModel):
                meet(bools_as_numbers(m.model_fields["root"].annotation, data, path))
                continue
            fields = _field_types(m)
            meet([x for k, v in data.items() if k in fields and isinstance(v, _NESTED)
                  for x in bools_as_numbers(fields[k], v, path + (k,))])
        for m in members:
            if get_origin(m) in (dict, collections.abc.Mapping) and len(get_args(m)) == 2:
                vt = get_args(m)[1]
                meet([x for k, v in data.items() if isinstance(v, _NESTED) for x in bools_as_numbers(vt, v, path + (k,))])
    elif isinstance(data, list):
        for m in members:
            origin, args = get_origin(m), get_args(m)
            if origin in (list, set, frozenset, collections.abc.Sequence) and len(args) == 1:
                meet([x for i, v in enumerate(data) if isinstance(v, _NESTED)
                      for x in bools_as_numbers(args[0], v, path + (i,))])
            elif origin is tuple and args:
                each = [args[0]] * len(data) if len(args) == 2 and args[1] is Ellipsis else list(args)
                meet([x for i, (a, v) in enumerate(zip(each, data)) if isinstance(v, _NESTED)
                      for x in bools_as_numbers(a, v, path + (i,))])
    return found or []


def check_strict_numbers(model: type[BaseModel], data: object, source: str = "") -> None:
    """Refuse a YAML/JSON boolean where ``model`` wants a number (pydantic reads ``true`` as 1 there), naming the field."""
    got = bools_as_numbers(model, data)
    if not got:
        return
    where = f"{source}: " if source else ""
    path, val, want = got[0]
    loc = ".".join(str(p) for p in path) or "(top level)"
    more = ""
    if len(got) > 1:
        others = [".".join(str(p) for p in g[0]) for g in got[1:]]
        more = f" (and {len(others)} more: {', '.join(others[:MORE_NAMED])}{', ...' if len(others) > MORE_NAMED else ''})"
    raise TwinferError(f"{where}{loc}: {str(val).lower()} is a boolean, not a number; give {want}{more}")


def validate(model: type[M], data: object, source: str = "") -> M:
    """``model.model_validate(data)`` raising TwinferError with field-naming messages; a boolean where a number is
    wanted is refused (``check_strict_numbers``), not read as 1 or 0."""
    check_strict_numbers(model, data, source)
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
