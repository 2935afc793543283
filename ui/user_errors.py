"""Exceptions a user's input causes, turned into the one-line message the CLI prints (exit 2).

Loaders raise ``TwinferError`` naming the file and field; this is the net under them for what
the operating system or Python's parsers raise from any file a command reads or writes: an
unwritable ``--csv``/``--perfetto``/``--out`` path, an unreadable or non-UTF-8 file, a number of
more than 4,300 digits (Python's int-parsing limit), input nested past the recursion limit.
Anything else stays an internal error (a bug to report).
"""

from __future__ import annotations

import re
from pathlib import Path

from twinfer.errors import TwinferError


def user_error_message(err: BaseException) -> str | None:
    """The message for an input-caused exception (naming the file where Python says which), else None."""
    if isinstance(err, OSError) and getattr(err, "filename", None):
        what = err.strerror or type(err).__name__
        return f"{err.filename}: {what}"
    if isinstance(err, UnicodeDecodeError):
        return f"an input file is not UTF-8 text ({err.reason} at byte {err.start})"
    if isinstance(err, RecursionError):
        return "an input is nested too deeply (past Python's recursion limit)"
    if isinstance(err, ValueError) and "integer string conversion" in str(err):
        return "an input holds an integer of more than 4,300 digits (Python's limit); no field accepts one"
    return None


def check_out_path(path: Path | None, flag: str) -> None:
    """Refuse, before a long run, an output path that cannot take a file: a missing folder (``check_out_folder``) or
    a directory (it was refused only when written, after the run: "error: /tmp: Is a directory")."""
    check_out_folder(path, flag)
    if path is not None and Path(path).is_dir():
        raise TwinferError(f"{flag} {path}: a directory; give a file path in it")


def check_out_folder(path: Path | None, flag: str = "--out") -> None:
    """Refuse, before a long run, an output file whose folder does not exist (else the run's result is lost at the
    end, when it is written)."""
    if path is not None and not Path(path).parent.is_dir():
        raise TwinferError(f"{flag} {path}: no folder {Path(path).parent} to write it in")


WORKLOAD_FLAGS = {"rate": "--rate", "concurrency": "--concurrency", "trace_path": "--trace"}


def missing_field_hint(msg: str, where: str = "") -> str:
    """``msg`` with the way to give a workload field it says is required (a file without it): set it in the file, or
    pass its flag (``where``: the field's prefix in the file, e.g. "workload.")."""
    for field, flag in WORKLOAD_FLAGS.items():
        if re.search(rf"(^|: ){field}: required", msg):
            return msg + f" (set {where}{field} in the file, or pass {flag})"
    return msg
