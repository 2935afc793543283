"""Result files: canonical JSON and its digest, CSV of metrics and of requests, Perfetto trace.

Canonical JSON: keys sorted, no whitespace, floats rounded to 12 significant digits and
written in Python's shortest round-trip form, NaN/inf refused. Rounding hides last-bit
differences of float sums across CPUs/BLAS builds, so equal runs give equal digests.
"""

from __future__ import annotations

import csv
import dataclasses
import enum
import hashlib
import json
import math
from pathlib import Path, PurePath
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from pydantic import BaseModel

from scheduler.request import Request
from scheduler.metrics import StepRecord

FLOAT_DIGITS = 12


def _float(x: float, where: str) -> float:
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"{where or '(top level)'}: {x} is not representable in JSON")
    x = float(f"{x:.{FLOAT_DIGITS}g}")
    return 0.0 if x == 0 else x  # -0.0 and 0.0 print differently


def normalize(obj: Any, where: str = "") -> Any:
    """A plain JSON tree of ``obj`` (pydantic models, dataclasses, numpy, enums, paths)."""
    t = type(obj)  # exact builtin types first (the bulk of a result), as the general checks below treat them
    if t is float:
        return _float(obj, where)
    if t is int or t is str or obj is None:
        return obj
    if t is bool:
        return obj
    if t is list or t is tuple:
        return [normalize(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if t is dict:
        return {str(k): normalize(v, f"{where}.{k}" if where else str(k)) for k, v in obj.items()}
    if isinstance(obj, BaseModel):
        return normalize(obj.model_dump(mode="python"), where)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return normalize(dataclasses.asdict(obj), where)
    if isinstance(obj, Mapping):
        return {str(k): normalize(v, f"{where}.{k}" if where else str(k)) for k, v in obj.items()}
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return _float(obj, where)
    if obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, enum.Enum):
        return normalize(obj.value, where)
    if isinstance(obj, PurePath):
        return str(obj)
    if isinstance(obj, np.ndarray):
        return normalize(obj.tolist(), where)
    if isinstance(obj, (list, tuple)):
        return [normalize(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    raise TypeError(f"{where or '(top level)'}: cannot write {type(obj).__name__} as JSON")


def to_json(result: Any, indent: int | None = None) -> str:
    """Canonical JSON text of ``result`` (``indent`` only for people; digests use none)."""
    sep = (",", ":") if indent is None else (",", ": ")
    return json.dumps(normalize(result), sort_keys=True, separators=sep, indent=indent,
                      allow_nan=False, ensure_ascii=False)


def digest(result: Any, exclude: Sequence[str] = ("digest",)) -> str:
    """sha256 hex of the canonical JSON, without the top-level keys in ``exclude``."""
    tree = normalize(result)
    if isinstance(tree, dict):
        tree = {k: v for k, v in tree.items() if k not in exclude}
    text = json.dumps(tree, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _flatten(tree: Any, prefix: str, rows: list[tuple[str, str]]) -> None:
    if isinstance(tree, dict):
        for k in sorted(tree):
            _flatten(tree[k], f"{prefix}.{k}" if prefix else k, rows)
    elif isinstance(tree, list):
        return  # series (e.g. kv_timeline) are not one metric; they live in the JSON
    else:
        rows.append((prefix, _cell(tree)))


def write_csv(metrics: Any, path: str | Path) -> None:
    """One ``metric,value`` row per scalar metric (nested names dotted, series left out)."""
    rows: list[tuple[str, str]] = []
    _flatten(normalize(metrics), "", rows)
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(("metric", "value"))
        w.writerows(rows)


REQUEST_COLUMNS = (
    "request_id", "arrival_time", "prompt_len", "output_len", "priority", "session_id", "status",
    "drop_reason", "num_output_tokens", "num_cached_tokens", "num_preemptions",
    "first_token_time", "finish_time", "ttft_s", "tpot_s", "e2e_s",
)


def write_requests_csv(requests: Iterable[Request], path: str | Path) -> None:
    """One row per request: inputs, outcome, timestamps and its latencies (blank if none)."""
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(REQUEST_COLUMNS)
        for r in requests:
            ttft = tpot = e2e = None
            if r.first_token_time is not None:
                ttft = r.first_token_time - r.arrival_time
            if r.finish_time is not None:
                e2e = r.finish_time - r.arrival_time
                if r.first_token_time is not None and r.num_output_tokens > 1:
                    tpot = (r.finish_time - r.first_token_time) / (r.num_output_tokens - 1)
            status = r.status.value if isinstance(r.status, enum.Enum) else r.status
            vals = (r.request_id, r.arrival_time, r.prompt_len, r.output_len, r.priority, r.session_id, status,
                    r.drop_reason, r.num_output_tokens, r.num_cached_tokens, r.num_preemptions,
                    r.first_token_time, r.finish_time, ttft, tpot, e2e)
            w.writerow([_cell(_float(v, "") if isinstance(v, float) and math.isfinite(v) else v) for v in vals])


def _slice_name(r: StepRecord) -> str:
    if r.num_prefills and r.num_decodes:
        return "mixed"
    if r.num_prefills:
        return "prefill"
    return "decode" if r.num_steps == 1 else f"decode x{r.num_steps}"


def perfetto_events(step_records: Iterable[StepRecord]) -> dict:
    """Chrome trace-event JSON: a track per instance, a slice per plan, a KV counter per instance."""
    recs = [r if isinstance(r, StepRecord) else StepRecord(**r) for r in step_records]
    pid = 1
    events: list[dict] = [{"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": "twinfer sim"}}]
    for inst in sorted({r.instance_id for r in recs}):
        events.append({"ph": "M", "pid": pid, "tid": inst, "name": "thread_name", "args": {"name": f"instance {inst}"}})
        events.append({"ph": "M", "pid": pid, "tid": inst, "name": "thread_sort_index", "args": {"sort_index": inst}})
    for r in recs:
        ts = r.start_s * 1e6  # trace-event times are microseconds
        args = r._asdict()
        args.pop("instance_id")
        args.pop("start_s")
        events.append({"ph": "X", "pid": pid, "tid": r.instance_id, "name": _slice_name(r),
                       "cat": "plan", "ts": ts, "dur": r.duration_s * 1e6, "args": args})
        if r.kv_total_blocks:
            events.append({"ph": "C", "pid": pid, "tid": r.instance_id, "name": f"kv util instance {r.instance_id}",
                           "ts": ts, "args": {"util": r.kv_used_blocks / r.kv_total_blocks}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_perfetto(step_records: Iterable[StepRecord], path: str | Path) -> None:
    """Write a trace loadable in ui.perfetto.dev (or chrome://tracing)."""
    Path(path).write_text(json.dumps(perfetto_events(step_records), sort_keys=True, separators=(",", ":")),
                          encoding="utf-8")
