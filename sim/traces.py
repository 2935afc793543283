"""Request traces: block hashes, reading (twinfer JSONL, Mooncake JSONL) and writing.

Block hashes. ``Request.block_hashes[i]`` identifies the first ``(i + 1) * block_size``
prompt tokens, so equal prefixes give equal leading hashes. Hashes are 63-bit values of a
splitmix64-style mix (never Python's ``hash()``, which is salted per process):

* a trace's ``hash_ids`` (one per ``S``-token source block, Mooncake: S = 512) chain into
  prefix hashes ``P[k] = pair(P[k-1], id[k])``; scheduler block ``i`` ends at token
  ``e = (i+1)*block_size`` inside source block ``j = (e-1)//S`` at offset ``o = e - j*S``
  and gets ``pair(P[j], o)``. That identifies the prefix for any ratio of the two block
  sizes (512 // 16 = 32 hashes per Mooncake id). Only full scheduler blocks get a hash, so
  a last partial block gets none; sharing finer than a source block cannot be seen, so
  the mapping never invents a hit.
* generated prompts (``sim.workload``) hash *private* content (a request's own tokens, an
  agentic session's conversation) as ``pair(anchor, position)``: the anchor mixes the
  chain hash where the prompt diverged with the stream's id. That equals a chain because
  private content never appears under another prefix, and it vectorises.

Twinfer's JSONL trace, one request per line::

    {"timestamp": 0.25, "input_length": 1800, "output_length": 300,
     "hash_ids": [...], "hash_block_size": 16, "session_id": "s3", "priority": 0}

``timestamp`` in seconds (``time_unit="ms"`` reads milliseconds); ``hash_ids`` optional and
needs ``hash_block_size``: ids of that block size equal to the scheduler's are taken as the
block hashes themselves (an exact round trip of ``write_trace``), others are expanded as above.
Mooncake's JSONL has ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``
(512-token blocks).
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Iterable, Literal, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from scheduler.request import Request
from twinfer.config import is_file
from twinfer.errors import TwinferError

MOONCAKE_BLOCK = 512  # tokens per Mooncake hash id (Mooncake FAST'25 trace README)
MASK64 = (1 << 64) - 1
MASK63 = (1 << 63) - 1
ROOT_HASH = 0x2545F4914F6CDD1D  # parent of a prompt's first block; any fixed constant works
_GOLDEN = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # splitmix64 finaliser (Steele et al. 2014)
TraceFormat = Literal["jsonl", "mooncake"]
_MAX_ERRORS = 20


# ---------------------------------------------------------------- hashing primitives
def _fmix(x: int) -> int:
    x ^= x >> 30
    x = (x * _M1) & MASK64
    x ^= x >> 27
    x = (x * _M2) & MASK64
    return x ^ (x >> 31)


def hash_pair(a: int, b: int) -> int:
    """Deterministic 63-bit hash of the pair (a, b) (e.g. parent hash, content id)."""
    return _fmix(_fmix((a ^ _GOLDEN) & MASK64) ^ (b & MASK64)) & MASK63


def _fmix_np(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # splitmix64 multiplies mod 2^64 on purpose
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(_M1)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(_M2)
        return x ^ (x >> np.uint64(31))


def hash_pair_np(a, b) -> np.ndarray:
    """Vectorised ``hash_pair`` over uint64 arrays (broadcasting); returns uint64."""
    a = np.asarray(a, dtype=np.uint64)
    b = np.asarray(b, dtype=np.uint64)
    return _fmix_np(_fmix_np(a ^ np.uint64(_GOLDEN)) ^ b) & np.uint64(MASK63)


def positional_hashes(anchors: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[list[int]]:
    """Per stream r, ``[pair(anchors[r], i) for i in range(starts[r], ends[r])]``, vectorised."""
    counts = np.maximum(np.asarray(ends, np.int64) - np.asarray(starts, np.int64), 0)
    first = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    total = int(counts.sum())
    pos = np.arange(total, dtype=np.int64) - np.repeat(first, counts) + np.repeat(np.asarray(starts, np.int64), counts)
    flat = hash_pair_np(np.repeat(np.asarray(anchors, np.uint64), counts), pos.astype(np.uint64)).tolist()
    return [flat[f : f + c] for f, c in zip(first.tolist(), counts.tolist())]


def _chain_prefix(flat: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Prefix chain per line: P[k] = pair(P[k-1], id[k]); sequential in k, vectorised over lines."""
    offs = np.concatenate(([0], np.cumsum(lens)[:-1])).astype(np.int64)
    out = np.empty_like(flat)
    if flat.size == 0:
        return out
    order = np.argsort(-lens, kind="stable")
    neg_sorted = -lens[order]  # ascending
    for k in range(int(lens.max())):
        m = int(np.searchsorted(neg_sorted, -k, side="left"))  # lines longer than k
        idx = offs[order[:m]] + k
        parent = np.uint64(ROOT_HASH) if k == 0 else out[idx - 1]
        out[idx] = hash_pair_np(parent, flat[idx])
    return out


def expand_hash_ids_bulk(
    ids: Sequence[Sequence[int]], src_blocks: Sequence[int], block_size: int, prompt_lens: Sequence[int]
) -> list[tuple[int, ...]]:
    """Map per-line source-block hash ids onto the scheduler's ``block_size`` (see module doc)."""
    n_lines = len(ids)
    if n_lines == 0:
        return []
    lens = np.fromiter((len(x) for x in ids), np.int64, n_lines)
    flat = np.fromiter(itertools.chain.from_iterable(ids), np.uint64, int(lens.sum()))
    prefix = _chain_prefix(flat, lens)
    src = np.asarray(src_blocks, np.int64)
    plen = np.asarray(prompt_lens, np.int64)
    n = np.minimum(plen // block_size, (lens * src) // block_size)
    first = np.concatenate(([0], np.cumsum(n)[:-1])).astype(np.int64)
    line_of = np.repeat(np.arange(n_lines), n)
    i = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(first, n)
    end = (i + 1) * block_size
    s = src[line_of]
    j = (end - 1) // s
    offs = np.concatenate(([0], np.cumsum(lens)[:-1])).astype(np.int64)
    flat_h = hash_pair_np(prefix[offs[line_of] + j], (end - j * s).astype(np.uint64)).tolist()
    return [tuple(flat_h[f : f + c]) for f, c in zip(first.tolist(), n.tolist())]


def expand_hash_ids(hash_ids: Sequence[int], src_block: int, block_size: int, prompt_len: int) -> tuple[int, ...]:
    """Block hashes of one prompt whose ``src_block``-token blocks carry ``hash_ids``."""
    return expand_hash_ids_bulk([hash_ids], [src_block], block_size, [prompt_len])[0]


# ---------------------------------------------------------------- line schemas
# bounds: a line's numbers must not blow up what is built from it (a 10**12-token prompt with
# one 10**12-token hash id would expand into ~10**10 block hashes)
MAX_LINE_TOKENS = 1 << 24   # scheduler.max_model_len's upper bound: no request can be longer
MAX_TIMESTAMP = 1e13        # seconds or ms: ~300 years in ms
# global budgets: each line may be fine and the file still too big for memory. A block hash is a
# Python int in a tuple (~40 bytes), a request ~1 KB while read and simulated; the Mooncake arxiv
# trace (23,608 requests, ~7,600 tokens each) needs ~11 million 16-token hashes.
MAX_BLOCK_HASHES = 20_000_000   # ~0.8 GB of hashes, across all requests built at once
MAX_TRACE_REQUESTS = 5_000_000  # ~5 GB while a trace is read; longer runs stream (benchmarks/soak_sim.py)


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    timestamp: float = Field(ge=0, le=MAX_TIMESTAMP, allow_inf_nan=False)
    input_length: int = Field(ge=1, le=MAX_LINE_TOKENS)
    output_length: int = Field(ge=1, le=MAX_LINE_TOKENS)
    hash_ids: list[int] = Field(default_factory=list)

    def _check_ids(self, block: int) -> None:
        cap = math.ceil(self.input_length / block)
        if len(self.hash_ids) > cap:
            raise ValueError(
                f"hash_ids: {len(self.hash_ids)} ids of {block} tokens but input_length "
                f"{self.input_length} has only {cap} blocks"
            )
        if any(h < 0 or h > MASK64 for h in self.hash_ids):
            raise ValueError("hash_ids: ids must be in [0, 2**64)")


class TraceLine(_Line):
    """One line of twinfer's JSONL trace."""

    hash_block_size: int | None = Field(None, ge=1, le=MAX_LINE_TOKENS)
    session_id: str | None = Field(None, max_length=1024)
    priority: int = Field(0, ge=-(2**31), le=2**31)

    @model_validator(mode="after")
    def _ids(self):
        if self.hash_ids:
            if self.hash_block_size is None:
                raise ValueError("hash_block_size: required when hash_ids are given")
            self._check_ids(self.hash_block_size)
        return self


class MooncakeLine(_Line):
    """One line of a Mooncake trace (timestamp in ms, 512-token hash ids)."""

    @model_validator(mode="after")
    def _ids(self):
        self._check_ids(MOONCAKE_BLOCK)
        return self


# ---------------------------------------------------------------- reading
def _line_errors(err: ValidationError, where: str) -> list[str]:
    """'file:line: field: message (got value)'; our own checks already start with the field."""
    out = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e.get("loc", ()))
        msg = e.get("msg", "invalid").removeprefix("Value error, ")
        got = e.get("input")
        got_s = "" if (not loc or isinstance(got, (dict, list))) else f" (got {got!r})"
        out.append(f"{where}: {loc + ': ' if loc else ''}{msg}{got_s}")
    return out


def _parse_lines(path: Path, fmt: TraceFormat) -> list[_Line]:
    """Validate every line; raise one TwinferError listing 'file:line: field: message'."""
    model = MooncakeLine if fmt == "mooncake" else TraceLine
    lines: list[_Line] = []
    errors: list[str] = []
    try:
        with path.open("rb") as f:   # bytes: a bad encoding is reported at its own line
            for lineno, raw in enumerate(f, start=1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    errors.append(f"{path}:{lineno}: not UTF-8 text ({err.reason} at byte {err.start + 1} of the line)")
                    continue
                if not text.strip():
                    continue  # blank lines (e.g. a trailing newline) hold no request
                if len(lines) >= MAX_TRACE_REQUESTS:
                    raise TwinferError(f"{path}: more than {MAX_TRACE_REQUESTS:,} requests; at most that many are read "
                                       f"at once (split the trace, or stream it)")
                _parse_line(text, f"{path}:{lineno}", model, lines, errors)
                if len(errors) > _MAX_ERRORS:
                    break
    except OSError as err:
        raise TwinferError(f"{path}: cannot read: {err.strerror or err}") from None
    if errors:
        more = " (stopped after the first errors)" if len(errors) > _MAX_ERRORS else ""
        raise TwinferError(f"{path}: invalid trace{more}:\n" + "\n".join(errors[:_MAX_ERRORS]))
    return lines


def _parse_line(text: str, where: str, model: type[_Line], lines: list[_Line], errors: list[str]) -> None:
    """Append the line's record to ``lines`` or its problems to ``errors``."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        errors.append(f"{where}: not valid JSON: {err.msg}")
        return
    except ValueError as err:  # e.g. an integer of more than 4,300 digits
        errors.append(f"{where}: not valid JSON: {str(err).split(';')[0]}")
        return
    except RecursionError:
        errors.append(f"{where}: not valid JSON: nested too deeply")
        return
    if not isinstance(data, dict):
        errors.append(f"{where}: expected a JSON object, got {type(data).__name__}")
        return
    try:
        lines.append(model.model_validate(data))
    except ValidationError as err:
        errors.extend(_line_errors(err, where))


def read_trace(
    path: str | Path,
    block_size: int,
    fmt: TraceFormat = "jsonl",
    *,
    time_scale: float = 1.0,
    time_unit: Literal["s", "ms"] | None = None,
    max_requests: int | None = None,
    rebase: bool = True,
    max_block_hashes: int = MAX_BLOCK_HASHES,
) -> list[Request]:
    """Requests of a trace file, sorted by arrival, ids ``r0, r1, ...``.

    Arrival = (timestamp - first timestamp if ``rebase``) * unit * ``time_scale`` (0.5 replays
    twice as fast). ``time_unit`` defaults to seconds for jsonl and ms for mooncake.
    ``max_requests`` keeps the earliest ones. ``max_block_hashes``: the budget of block hashes over
    the whole trace (a smaller one bounds an upload's memory).
    """
    p = Path(path)
    if not is_file(p):
        raise TwinferError(f"{p}: no such trace file")
    if fmt not in ("jsonl", "mooncake"):
        raise TwinferError(f"trace_format: unknown {fmt!r}; known: jsonl, mooncake")
    if block_size < 1:
        raise TwinferError(f"block_size: must be >= 1 (got {block_size})")
    if time_scale <= 0:
        raise TwinferError(f"time_scale: must be > 0 (got {time_scale})")
    lines = _parse_lines(p, fmt)
    if not lines:  # a run on it would report nothing as if it had worked
        raise TwinferError(f"{p}: the trace holds no requests (the file is empty or has only blank lines)")
    unit = {"s": 1.0, "ms": 1e-3}[time_unit or ("ms" if fmt == "mooncake" else "s")]
    order = sorted(range(len(lines)), key=lambda k: (lines[k].timestamp, k))  # stable on ties
    if max_requests is not None:
        order = order[:max_requests]
    lines = [lines[k] for k in order]
    t0 = lines[0].timestamp if (rebase and lines) else 0.0

    _check_hash_budget(p, lines, block_size, max_block_hashes)
    hashes: list[tuple[int, ...]] = [()] * len(lines)
    expand = []  # lines whose ids must be mapped onto block_size
    for k, ln in enumerate(lines):
        if not ln.hash_ids:
            continue
        src = MOONCAKE_BLOCK if fmt == "mooncake" else ln.hash_block_size
        if fmt == "jsonl" and src == block_size:
            hashes[k] = tuple(ln.hash_ids[: ln.input_length // block_size])  # already block hashes
        else:
            expand.append((k, src))
    if expand:
        out = expand_hash_ids_bulk(
            [lines[k].hash_ids for k, _ in expand], [s for _, s in expand], block_size,
            [lines[k].input_length for k, _ in expand],
        )
        for (k, _), h in zip(expand, out):
            hashes[k] = h

    reqs = []
    for k, ln in enumerate(lines):
        sess = getattr(ln, "session_id", None)
        prio = getattr(ln, "priority", 0)
        t = (ln.timestamp - t0) * unit * time_scale
        reqs.append(Request(f"r{k}", t, ln.input_length, ln.output_length, hashes[k], prio, sess))
    return reqs


def _check_hash_budget(path: Path, lines: list[_Line], block_size: int, budget: int = MAX_BLOCK_HASHES) -> None:
    """Refuse, before building any, a trace whose block hashes together exceed ``MAX_BLOCK_HASHES``
    (each line is bounded, but a few hundred long lines with one coarse hash id each are not)."""
    total = sum(ln.input_length // block_size for ln in lines if ln.hash_ids)
    if total > budget:
        raise TwinferError(f"{path}: hash_ids: the trace's prompts need {total:,} {block_size}-token block hashes "
                           f"in all; at most {budget:,} (fewer or shorter requests, max_requests, or no hash_ids)")


# ---------------------------------------------------------------- writing
def write_trace(
    requests: Iterable[Request], path: str | Path, block_size: int | None = None, fmt: TraceFormat = "jsonl"
) -> None:
    """Save requests as a trace that ``read_trace`` replays.

    ``block_size`` is the one the requests' block hashes were built with (needed when any
    request has hashes). ``fmt="mooncake"`` writes 512-token ids (``block_size`` must divide
    512): a fully hashed 512-block is named by the hash of its last sub-block, so prefix
    sharing at 512-token granularity survives, other blocks are unique to their request;
    ids are then renumbered 0, 1, 2, ... in order of first appearance, as Mooncake's are.
    """
    reqs = list(requests)
    if block_size is None and any(r.block_hashes for r in reqs):
        raise TwinferError("write_trace: block_size is required when requests carry block_hashes")
    if fmt == "mooncake" and block_size is not None and MOONCAKE_BLOCK % block_size:
        raise TwinferError(f"block_size: {block_size} must divide {MOONCAKE_BLOCK} to write a Mooncake trace")
    renumber: dict[int, int] = {}
    with Path(path).open("w", encoding="utf-8") as f:
        for n, r in enumerate(reqs):
            if fmt == "mooncake":
                ids = _mooncake_ids(r, n, block_size or MOONCAKE_BLOCK)
                rec = {
                    "timestamp": round(r.arrival_time * 1e3, 3),
                    "input_length": r.prompt_len,
                    "output_length": r.output_len,
                    "hash_ids": [renumber.setdefault(h, len(renumber)) for h in ids],
                }
            else:
                rec = {"timestamp": r.arrival_time, "input_length": r.prompt_len, "output_length": r.output_len}
                if r.block_hashes:
                    rec["hash_ids"] = list(r.block_hashes)
                    rec["hash_block_size"] = block_size
                if r.session_id is not None:
                    rec["session_id"] = r.session_id
                if r.priority:
                    rec["priority"] = r.priority
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")


_TAG_FRESH = 0x46524553  # blocks with no shareable hash when writing Mooncake traces


def _mooncake_ids(r: Request, n: int, block_size: int) -> list[int]:
    """One id per 512-token block of the prompt (the last may be partial)."""
    per = MOONCAKE_BLOCK // block_size
    ids = []
    for k in range(math.ceil(r.prompt_len / MOONCAKE_BLOCK)):
        last = (k + 1) * per - 1
        ids.append(r.block_hashes[last] if last < len(r.block_hashes) else hash_pair(hash_pair(_TAG_FRESH, n), k))
    return ids
