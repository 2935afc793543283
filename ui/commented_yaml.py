"""A pydantic object as a complete YAML file with each field's description as a comment above it.

``twinfer hardware --template/--show`` and ``twinfer model --show`` print these: every field is
written (optional ones as ``null``, an absent optional section as a commented example), so the
file loads back into the same object and a user edits it rather than guessing field names.
"""

from __future__ import annotations

import typing

import yaml
from pydantic import BaseModel


def commented_yaml(obj: BaseModel, header: list[str] = ()) -> str:
    """``obj`` as YAML, one ``# description`` line above each field; ``header`` lines first."""
    lines = [f"# {h}" if h else "#" for h in header]
    lines += _fields(type(obj), obj, "")
    return "\n".join(lines) + "\n"


def _fields(cls: type[BaseModel], obj: BaseModel | None, indent: str) -> list[str]:
    out: list[str] = []
    for name, field in cls.model_fields.items():
        desc = field.description or ""
        if desc:
            out.append(f"{indent}# {desc}")
        value = getattr(obj, name) if obj is not None else field.get_default(call_default_factory=True)
        section = _section_type(field.annotation)
        if isinstance(value, BaseModel):
            out.append(f"{indent}{name}:")
            out += _fields(type(value), value, indent + "  ")
        elif value is None and section is not None and obj is not None:
            out.append(f"{indent}{name}: null")
            out.append(f"{indent}# {name}:   (optional section: replace the line above with these, filled in)")
            for sub, sf in section.model_fields.items():
                text = "REQUIRED" if sf.is_required() else _scalar(sf.get_default(call_default_factory=True))
                out.append(f"{indent}#   {sub}: {text}" + (f"   # {sf.description}" if sf.description else ""))
        elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            out.append(f"{indent}{name}:")  # one line per entry (sources, notes): readable and easy to extend
            out += [f"{indent}  - {_scalar(v)}" for v in value]
        else:
            out.append(f"{indent}{name}: {_scalar(value)}")
    return out


def _section_type(annotation) -> type[BaseModel] | None:
    """The BaseModel inside ``X | None`` (an optional nested section), else None."""
    for a in typing.get_args(annotation) or (annotation,):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _scalar(value) -> str:
    """One value in YAML flow style on one line."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 20, sort_keys=False).strip()
    return text[: -len("...")].strip() if text.endswith("...") else text
