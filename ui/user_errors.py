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


def check_arrival_flags(flags: dict[str, object], base_kind: str | None = None, base: str = "the scenario's workload") -> None:
    """Refuse arrival flags that contradict each other or the workload they apply to, one message per conflict, the
    same in every command that takes them (``twinfer simulate``, ``twinfer plan``): "FLAG: why; what to do".

    ``flags``: flag -> value (None: not given) of --workload, --trace, --trace-format, --rate, --concurrency,
    --think-time-s. ``base_kind``: the kind of the workload the flags apply to where none of them replaces it (a
    scenario's, a plan's, a config file's), named ``base`` in the messages."""
    given = {k for k, v in flags.items() if v is not None}
    if "--trace-format" in given and "--trace" not in given:
        raise TwinferError("--trace-format: only with --trace PATH")
    if {"--workload", "--trace"} <= given:
        raise TwinferError("--workload and --trace: both set the workload (a preset generates its requests, --trace replays "
                           "a file's); give one of them")
    if "--trace" in given:
        kind, src = "trace", "--trace"
    elif "--workload" in given:
        kind, src = "preset", "--workload"
    else:
        kind, src = base_kind, base
    closed_flag = next((f for f in ("--concurrency", "--think-time-s") if f in given), None)
    if kind == "trace":
        what = ("--trace replays the file's own arrival times" if src == "--trace" else
                f"{src} is a trace, which replays its file's own arrival times")
        if closed_flag:
            alt = ", or drop --trace for a closed loop of generated requests" if src == "--trace" else ""
            raise TwinferError(f"{closed_flag}: a trace cannot run as a closed loop ({what}; a closed loop sends each user's "
                               f"next request when the last one ends); drop {closed_flag}{alt}")
        if "--rate" in given:
            alt = ", or drop --trace for generated arrivals at that rate" if src == "--trace" else ""
            raise TwinferError(f"--rate: a trace has no arrival rate to set ({what}); drop --rate{alt}; the workload's "
                               "time_scale (in a scenario or plan file) replays a trace faster or slower (0.5: twice as fast)")
    if "--rate" in given and (closed_flag or kind == "closed"):
        who = f"{closed_flag} makes the workload one" if closed_flag else f"{src} is kind: closed"
        fix = (f"drop --rate, or drop {closed_flag} for open arrivals at that rate" if closed_flag else
               "drop --rate (--concurrency sets its users)")
        raise TwinferError(f"--rate: a closed loop has no arrival rate ({who}: its users set the load); {fix}")
