"""Sliding-window state on resume: per layer, persist its window KV, replay the last W tokens, or recompute.

Sliding-window layers (and the uncompressed window of V4's csa/hca layers) need the KV of the
last ``sliding_window`` tokens to continue a sequence. When a sequence resumes — a prefix-cache
hit, the next chunk of a chunked prompt, a paused agentic turn — each such layer can

- ``persist``: its window KV was kept with the sequence (``window`` entries per layer kept per
  sequence, nothing recomputed);
- ``replay`` W (bounded replay): only ``window - W`` entries were kept and the last W tokens are
  recomputed (DeepSeek-V4.1's "SWA bounded replay": vLLM PR #56227 replays the hit's last 128 tokens,
  keeping none of the window; SGLang PR #31713 rebuilds V4's window exactly from
  ``W + (layers - 1) * W`` trailing tokens, the receptive field of stacked windows);
- ``recompute``: nothing of the window was kept and the layer recomputes over the whole earlier
  context (the costly baseline: an engine that cannot restore the state falls back to
  re-prefilling, e.g. SGLang's truncating match when the SWA pages are gone).

Our reading of what a layer's recompute needs: a layer's input for token t is the residual stream
after the layers below it, and no engine keeps hidden states (4096 x hc_mult 4 x 2 B = 32 KiB per
token per layer, far more than the window KV they would replace). So x extra tokens at layer L
are x extra tokens through every layer 0..L (full forward: their attention reads the caches the
lower layers hold; their KV writes are redundant), and layer j carries
``e_j = max(x_i for i >= j)`` extra tokens. The layers above the deepest requirement carry none.

``ReplayTradeoff`` / ``replay_tradeoff`` (one W for the whole model) remain for the existing callers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from twinfer.errors import TwinferError

from costmodels.layout import DType
from costmodels.memory import kv_rates
from costmodels.model_spec import ModelSpec
from costmodels.ops import CATEGORIES
from costmodels.step_ops import ATT, IDX, KV_UP, SAMPLED, TOKENS, StepOps

ReplayMode = Literal["persist", "replay", "recompute"]
WindowKind = Literal["sliding", "csa", "hca", "sparse"]
MODES = ("persist", "replay", "recompute")
DEFAULT_REPLAY_TOKENS = 128  # DeepSeek-V4.1's replay length = its 128-token window (vLLM PR #56227)


class LayerReplay(BaseModel):
    """What one layer (or every layer of a kind) does with its window state when a sequence resumes.

    Also written as a string: ``persist``, ``recompute``, ``replay`` (the policy's ``tokens``) or
    ``replay:W``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: ReplayMode = Field(..., description="persist (window KV kept), replay (recompute the last W tokens) or "
                             "recompute (recompute over the whole earlier context)")
    tokens: int | None = Field(None, ge=1, le=1 << 20, description="W, tokens replayed (mode replay only); "
                               "null: the policy's tokens")

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data):
        """``'replay:64'`` -> mode replay, tokens 64 (a malformed W is left to the field's error)."""
        if isinstance(data, str):
            mode, _, w = data.strip().partition(":")
            return {"mode": mode, "tokens": w} if w else {"mode": mode}
        return data

    @model_validator(mode="after")
    def _tokens_only_for_replay(self) -> "LayerReplay":
        if self.tokens is not None and self.mode != "replay":
            raise ValueError(f"tokens={self.tokens} is only for mode 'replay' (mode is {self.mode!r})")
        return self

    def __str__(self) -> str:
        return self.mode if self.tokens is None else f"{self.mode}:{self.tokens}"


PERSIST = LayerReplay(mode="persist")


class ReplayPolicy(BaseModel):
    """Per-layer window policy on resume. Precedence: ``layers[i]`` over ``kinds[kind]`` over ``default``.

    Only layers with window state (``sliding`` layers; ``csa``/``hca``/``sparse`` layers of a model with
    ``window_in_compressed_layers``) are governed; other layers have nothing to keep or replay."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default: LayerReplay = Field(PERSIST, description="rule for window layers not named in kinds or layers")
    tokens: int = Field(DEFAULT_REPLAY_TOKENS, ge=1, le=1 << 20,
                        description="W of 'replay' rules that give none (tokens recomputed per resume)")
    kinds: dict[WindowKind, LayerReplay] = Field(default_factory=dict,
                                                 description="rule per layer kind (sliding, csa, hca, sparse)")
    layers: dict[int, LayerReplay] = Field(default_factory=dict, description="rule per layer (0-based index)")

    @model_validator(mode="after")
    def _check_layers(self) -> "ReplayPolicy":
        for i in self.layers:
            if i < 0:
                raise ValueError(f"layers: index {i} must be >= 0")
        return self

    def rule(self, layer: int, kind: str) -> LayerReplay:
        """The rule of ``layer`` (of ``kind``) before the model's window layers are known."""
        r = self.layers.get(layer)
        if r is None:
            r = self.kinds.get(kind)  # type: ignore[call-overload]
        return self.default if r is None else r

    def resolve(self, model: ModelSpec) -> "ResolvedReplay":
        """Per-layer (mode, W) on ``model``; layers without window state get ``none``. A ``layers`` index past
        the model or naming a layer without a window is an error naming the field."""
        kinds = model.kinds()
        windowed = window_layers(model)
        for i in sorted(self.layers):
            if i >= model.num_layers:
                raise TwinferError(f"replay.layers: index {i} is past {model.name}'s {model.num_layers} layers "
                                 f"(0..{model.num_layers - 1})")
            if i not in windowed:
                raise TwinferError(f"replay.layers: layer {i} of {model.name} is a {kinds[i]!r} layer with no sliding "
                                 f"window; layers with one: {_ranges(sorted(windowed))}")
        modes, tokens = [], []
        for i, kind in enumerate(kinds):
            r = self.rule(i, kind) if i in windowed else None
            modes.append("none" if r is None else r.mode)
            tokens.append(0 if r is None or r.mode != "replay" else (r.tokens or self.tokens))
        return ResolvedReplay(model.name, int(model.sliding_window or 0), tuple(modes), tuple(tokens))

    def __str__(self) -> str:
        parts = [f"default {_show(self.default, self.tokens)}"]
        parts += [f"{k} {_show(r, self.tokens)}" for k, r in sorted(self.kinds.items())]
        parts += [f"layer {i} {_show(r, self.tokens)}" for i, r in sorted(self.layers.items())]
        return ", ".join(parts)


def _show(r: LayerReplay, w: int) -> str:
    return f"replay:{r.tokens or w}" if r.mode == "replay" else r.mode


def _ranges(idx: list[int]) -> str:
    """'0-1, 42' for [0, 1, 42]."""
    out, start = [], None
    for k, i in enumerate(idx):
        if start is None:
            start = i
        if k + 1 == len(idx) or idx[k + 1] != i + 1:
            out.append(str(start) if start == i else f"{start}-{i}")
            start = None
    return ", ".join(out) or "none"


def window_layers(model: ModelSpec) -> set[int]:
    """Layers holding sliding-window state: ``sliding`` layers, and the compressed kinds (csa, hca, sparse) when
    they keep a window (``window_in_compressed_layers``: V4-Flash's 43 layers, V4.1-Flash's 40)."""
    if not model.sliding_window:
        return set()
    return {i for i, k in enumerate(model.kinds())
            if k == "sliding" or (model.window_in_compressed_layers and k != "full")}


@dataclass(frozen=True)
class ResolvedReplay:
    """A ReplayPolicy on one model: per layer its mode (``none``: no window state) and W (replay only)."""

    model: str
    window: int
    modes: tuple[str, ...]
    tokens: tuple[int, ...]

    @property
    def is_persist(self) -> bool:
        """Nothing is ever recomputed (every window layer persists, or the model has none)."""
        return all(m in ("none", "persist") for m in self.modes)

    def layer_tokens(self, context: int) -> np.ndarray:
        """x_i: tokens layer i itself must recompute to resume at ``context`` cached tokens."""
        c = max(0, int(context))
        x = np.zeros(len(self.modes), np.int64)
        for i, (m, w) in enumerate(zip(self.modes, self.tokens)):
            x[i] = c if m == "recompute" else min(w, c) if m == "replay" else 0
        return x

    def extra_tokens(self, context: int) -> np.ndarray:
        """e_j: extra tokens layer j carries (its own x_j, or the inputs of a layer above it: suffix max)."""
        x = self.layer_tokens(context)
        return np.maximum.accumulate(x[::-1])[::-1] if x.size else x

    @cached_property
    def _deepest(self) -> tuple[bool, int]:
        """(some layer recomputes, the largest W of the replaying layers)."""
        return "recompute" in self.modes, max((t for m, t in zip(self.modes, self.tokens) if m == "replay"), default=0)

    def carried_tokens(self, context: int) -> int:
        """Extra tokens the step carries at layer 0: e_0 = max_i x_i (closed form; the scheduler calls it per chunk)."""
        c = max(0, int(context))
        recompute, w = self._deepest
        return c if recompute else min(w, c)

    def kept_fraction(self) -> np.ndarray:
        """Share of each layer's window KV kept with a paused sequence: 1 persist, (window - W)/window replay, 0 recompute."""
        out = np.ones(len(self.modes))
        for i, (m, w) in enumerate(zip(self.modes, self.tokens)):
            if m == "recompute":
                out[i] = 0.0
            elif m == "replay":
                out[i] = max(0.0, 1.0 - w / self.window) if self.window else 0.0
        return out


def shipped_replay_policy(model: ModelSpec) -> ReplayPolicy:
    """The policy a model is served with by default.

    DeepSeek-V4.1: SWA bounded replay of its 128-token window on every window layer (the V4.1 tech
    report's encoder-side replay as vLLM PR #56227 and tokenspeed PR #1594 implement it: the SWA
    caches leave prefix caching). Every other model (V4-Flash included): its window KV persists with
    the sequence (SGLang's SWA pool, ATOM's paged SWA), which is what the scheduler did before
    per-layer policies."""
    if model.name.lower().startswith("deepseek-v4.1"):
        return ReplayPolicy(default=LayerReplay(mode="replay"), tokens=int(model.sliding_window or DEFAULT_REPLAY_TOKENS))
    return ReplayPolicy()


def effective_replay_policy(model: ModelSpec, policy: ReplayPolicy | None, swa_replay_tokens: int = 0) -> ReplayPolicy:
    """The policy in force: the one given, else ``swa_replay_tokens`` > 0 as bounded replay of that W on every
    window layer (the meaning that knob always had), else the model's shipped policy."""
    if policy is not None:
        return policy
    if swa_replay_tokens > 0:
        return ReplayPolicy(default=LayerReplay(mode="replay"), tokens=int(swa_replay_tokens))
    return shipped_replay_policy(model)


@dataclass(frozen=True)
class ReplayTradeoff:
    """What replay length ``replay_tokens`` costs and saves per resumable sequence (unsharded, whole model)."""

    replay_tokens: int           # tokens recomputed on every resume / prefix hit
    window_tokens: int           # the model's sliding window (0: no sliding layers, nothing to trade)
    kept_window_bytes: float     # window KV kept per paused sequence
    full_window_bytes: float     # the same with no replay (W = 0)

    @property
    def saved_bytes(self) -> float:
        return self.full_window_bytes - self.kept_window_bytes


def replay_tradeoff(model: ModelSpec, kv_dtype: DType, replay_tokens: int) -> ReplayTradeoff:
    """KV kept and tokens recomputed per paused sequence for replay length ``replay_tokens`` (clipped to the window)."""
    window = int(model.sliding_window or 0)
    full = kv_rates(model, kv_dtype)[1] if window else 0.0
    w = max(0, min(int(replay_tokens), window))
    kept = full * (1.0 - w / window) if window else 0.0
    return ReplayTradeoff(replay_tokens=w, window_tokens=window, kept_window_bytes=kept, full_window_bytes=full)


# ---------------------------------------------------------------------------------------------- cost
@dataclass(frozen=True)
class ChunkCost:
    """Device time of one request's prefill chunk under a replay policy, on the busiest GPU (no two-micro-batch overlap)."""

    seconds: float
    breakdown: dict[str, float]
    new_tokens: int              # n: tokens whose KV the chunk adds
    context: int                 # c: tokens cached before the chunk
    layer_tokens: tuple[int, ...]  # n + e_j: tokens layer j processes


def chunk_cost(ops: StepOps, replay: ResolvedReplay, new_tokens: int, context: int, tables=None) -> ChunkCost:
    """One prefill chunk of ``new_tokens`` over ``context`` cached tokens, layer j carrying n + e_j tokens
    at context c - e_j (``ResolvedReplay.extra_tokens``), priced by ``StepOps``' op families on each run of
    layers with the same e (the families the step model sums, restricted to those layers: no second formula;
    with every layer at one e this is exactly the step model's prefill of n + e tokens over c - e).

    ``tables`` (``costmodels.replay_table.ExecTables``, measured op tables of the executor's model): the chunk is
    priced from them instead, as the executor's eager forward (``replay_table.table_chunk_cost``; its breakdown
    holds device seconds per unit and ``host_wait``, the seconds the device waited on the host). ``tables`` may
    also be a ``costmodels.replay_grid.ReplayGrid`` (the forward's pieces measured on a grid of shapes on that
    model, interpolated and queued; breakdown ``host``, ``device``, ``host_wait``, ``extrapolated_pieces``)."""
    n, c = int(new_tokens), int(context)
    if tables is not None:
        return _table_chunk(tables, ops.model, replay, [(n, c)])
    return chunk_cost_at(ops, replay.extra_tokens(c) if replay.modes else np.zeros(ops.n_layers, np.int64), n, c)


def _table_chunk(tables, model: ModelSpec, replay: ResolvedReplay, parts: list[tuple[int, int]]) -> ChunkCost:
    if hasattr(tables, "chunk_seconds"):   # a ``replay_grid.ReplayGrid`` measured on ``model``
        tables.check_model(model)
        t, ext = tables.chunk_seconds([k == "sliding" for k in model.kinds()], replay, parts)
        breakdown = {"host": t.host_s, "device": t.device_s, "host_wait": t.wait_s, "extrapolated_pieces": float(ext)}
    else:
        from costmodels.replay_table import table_prefill_cost
        t = table_prefill_cost(tables, model, replay, parts)
        breakdown = {**t.by_unit, "host_wait": t.seconds - t.device_s}
    n, c = parts[0] if len(parts) == 1 else (sum(p[0] for p in parts), parts[0][1])
    e = replay.extra_tokens(parts[-1][1]) if replay.modes else np.zeros(model.num_layers, np.int64)
    return ChunkCost(t.seconds, breakdown, n, c, tuple(int(parts[-1][0] + x) for x in e))


def chunk_cost_at(ops: StepOps, e: np.ndarray, n: int, c: int) -> ChunkCost:
    """``chunk_cost`` for given per-layer extra tokens ``e`` (non-increasing)."""
    v = np.zeros(7)
    for extra in sorted(set(e.tolist())):
        _add_layers(ops, v, [j for j in range(ops.n_layers) if e[j] == extra], n + extra, c - extra)
    _add_once(ops, v, n + int(e[0]) if e.size else n)
    t = float(ops.prefetched(float(v[:6].sum())))   # offloaded weights streamed in (identity without offload)
    return ChunkCost(t, {k: float(v[i]) for i, k in enumerate(CATEGORIES)}, n, c, tuple(int(n + x) for x in e))


class DepthCorrection:
    """What a step priced as its plan states the chunks overcharges: the scheduler folds a resumed chunk's replayed
    tokens (``ScheduledChunk.replayed`` = e_0) into its new tokens, i.e. through every layer, while the policy may
    need them only in the lower layers (e_j < e_0 above the deepest recomputing layer). Per resumed chunk:
    ``chunk_cost`` with e_0 everywhere minus ``chunk_cost`` with the policy's e_j, evaluated on the chunk alone
    (exact for a step of that one chunk; with other work batched in, the GEMM-efficiency interaction is left out).
    Zero, and never evaluated, for policies whose every resume runs through every layer.

    ``busiest_rank``: the step is priced at its busiest attention-DP rank, where a chunk sits whole on one rank
    (``EffectiveStepCost``'s DP split): ``ops`` then prices a chunk at that rank (``dp_imbalance = dp``) and the
    plan's correction is its largest chunk's (the chunks of other ranks do not shorten the busiest one's); else
    chunks spread evenly over ranks and their corrections add."""

    MEMO = 4096

    def __init__(self, ops: StepOps, replay: ResolvedReplay, busiest_rank: bool = False, grid=None):
        self.ops, self.replay, self.busiest_rank, self.grid = ops, replay, busiest_rank, grid
        self._memo: dict[tuple[int, int], float] = {}

    @staticmethod
    def needed(replay: ResolvedReplay) -> bool:
        """Some resume needs fewer tokens in the top layer than at layer 0."""
        top_mode, top_w = (replay.modes[-1], replay.tokens[-1]) if replay.modes else ("none", 0)
        if replay.is_persist or top_mode == "recompute":
            return False
        recompute, w = replay._deepest
        return recompute or top_mode != "replay" or top_w < w

    def __call__(self, chunks) -> float:
        total = best = 0.0
        for ch in chunks:
            r = ch.replayed
            if r <= 0:
                continue
            key = (ch.num_new_tokens - r, ch.context_len + r)
            s = self._memo.get(key)
            if s is None:
                n, c = key
                e = self.replay.extra_tokens(c)
                if self.grid is not None:   # the measured pieces (``replay_grid``) where the profile carries them
                    m = self.ops.model
                    s = (self.grid.step_seconds(m, self.replay, n, c, [r] * len(e)).seconds
                         - self.grid.step_seconds(m, self.replay, n, c).seconds)
                else:
                    s = chunk_cost_at(self.ops, np.full_like(e, r), n, c).seconds - chunk_cost_at(self.ops, e, n, c).seconds
                if len(self._memo) >= self.MEMO:
                    self._memo.clear()
                self._memo[key] = s
            total += s
            best = max(best, s)
        return best if self.busiest_rank else total


def _add_layers(ops: StepOps, v: np.ndarray, layers: list[int], tokens: int, ctx: int) -> None:
    """Add the per-layer families of ``layers`` over a prefill chunk of ``tokens`` on ``ctx`` cached tokens, as the
    step model prices them: a CED model's decoder layers (``StepOps.ced``) see only the chunk's tail
    (``ced_tail_chunks``), every other layer the whole chunk; attention per layer group (``att_layer``)."""
    m = ops.model
    dec = [j for j in layers if ops.ced and m.ced_decoder(j)]
    enc = [j for j in layers if not (ops.ced and m.ced_decoder(j))]
    if enc:
        _add_part(ops, v, enc, tokens, ctx, "")
    if dec:
        tn, tc = ops.ced_tail_chunks(np.array([tokens]), np.array([ctx]), np.zeros(1, bool))
        _add_part(ops, v, dec, int(tn[0]), int(tc[0]), "decoder_")


def _add_part(ops: StepOps, v: np.ndarray, layers: list[int], tokens: int, ctx: int, tag: str) -> None:
    """The families of ``layers`` (all seeing the same chunk) at ``tokens`` on ``ctx``: GEMM rows by their group's share
    of these layers, routed experts, norms, collectives (combine-down overlap as the step applies it), attention."""
    m = ops.model
    n_moe = sum(1 for j in layers if m.is_moe_layer(j))
    chosen = set(layers)
    x = np.array([float(tokens)])
    tok = x * ops.share
    kv_up = float(ctx + tokens) if (m.attention == "mla" and m.mla.kv_up_proj and m.indexer is None) else float(tokens)
    for src, pts in ((TOKENS, x), (KV_UP, np.array([kv_up]))):
        fam = ops.gemms(src, pts)
        # each row's share of these layers (StepOps.g_layers: a row may cover only some layers of its group)
        fam.time = fam.time * ops.row_share(src, chosen.__contains__)[:, None]
        fam.add_to(v, None)
    ex = ops.experts(x, n_moe, f"{tag}routed_experts", True)   # a prefill chunk: the contiguous layout
    co = ops.collectives(tok, len(layers), n_moe, True, tag)
    ops.overlap_combine_down(ex, co, x)
    for fam in (ex, co, ops.elementwise(tok, len(layers), n_moe)):
        fam.add_to(v, None)
    per_group: dict[int, int] = {}
    for j in layers:
        per_group[ops.att_layer[j]] = per_group.get(ops.att_layer[j], 0) + 1
    new, cc, no_dec = np.array([tokens]), np.array([ctx]), np.zeros(1, bool)
    for g, cnt in sorted(per_group.items()):
        r = ops._attn_one(ops.att_groups[g][0], new, cc, no_dec, ops.share)
        v[ATT] += cnt * r[2]
        v[IDX] += cnt * r[5]


def _add_once(ops: StepOps, v: np.ndarray, tokens0: int) -> None:
    """Add what a prefill runs once: embedding (+ its all-reduce, pipeline sends) of the tokens entering layer 0,
    and the one sampled token (lm_head, sampling), as ``StepOps.nonattn`` counts them for a prefill chunk."""
    tok = np.array([float(tokens0)]) * ops.share
    one = np.array([1.0])
    for fam in (ops.embedding(tok), ops.embedding_allreduce(tok), ops.pp_sends(tok), ops.gemms(SAMPLED, one),
                ops.sampling(one * ops.share, 0)):
        fam.add_to(v, None)


def prompt_chunks(prompt: int, chunk: int, cached: int = 0) -> list[tuple[int, int]]:
    """(new tokens, context) of each chunk of a ``prompt``-token prefill after ``cached`` prefix-hit tokens."""
    out, c = [], int(cached)
    while c < prompt:
        n = min(chunk, prompt - c)
        out.append((n, c))
        c += n
    return out


def prefill_seconds(ops: StepOps, replay: ResolvedReplay, prompt: int, chunk: int, cached: int = 0, tables=None) -> float:
    """Device seconds to prefill a ``prompt`` (``cached`` tokens already held) in chunks of ``chunk`` under ``replay``:
    every chunk resumes at its context (the first after a hit too), so its layers carry the policy's extra tokens.
    ``tables``: priced from the executor's measured op tables, the chunks as one eager stream (``chunk_cost``)."""
    if tables is not None:
        return _table_chunk(tables, ops.model, replay, prompt_chunks(prompt, chunk, cached)).seconds
    return sum(chunk_cost(ops, replay, n, c).seconds for n, c in prompt_chunks(prompt, chunk, cached))


def kept_window_bytes(model: ModelSpec, kv_dtype: DType, replay: ResolvedReplay) -> float:
    """Window KV kept per paused sequence (unsharded, whole model): each layer's fixed window bytes
    (``memory.kv_rates``, shared caches once) times its kept share."""
    keep = replay.kept_fraction()
    return float(sum(kv_rates(model, kv_dtype, [i])[1] * keep[i] for i in range(model.num_layers)))


@dataclass(frozen=True)
class PolicyComparison:
    """Prefill of one prompt size under a base policy and a candidate (seconds on the busiest GPU)."""

    new_tokens: int
    chunks: int
    base_s: float
    cand_s: float
    base_extra_tokens: int   # extra layer-tokens the base recomputes over the whole prefill (sum over layers and chunks)
    cand_extra_tokens: int

    @property
    def gain(self) -> float:
        """Prefill throughput of the candidate over the base's (1.0: no change)."""
        return self.base_s / self.cand_s if self.cand_s > 0 else float("inf")


def compare_policies(ops: StepOps, base: ResolvedReplay, cand: ResolvedReplay, new_tokens: list[int], chunk: int,
                     cached: int = 0) -> list[PolicyComparison]:
    """Per prompt size (new tokens after ``cached`` hit tokens, prefilled in chunks of ``chunk``): both policies' times."""
    rows = []
    for n in new_tokens:
        parts = prompt_chunks(cached + n, chunk, cached)
        extra = [sum(int(r.extra_tokens(c).sum()) for _, c in parts) for r in (base, cand)]
        rows.append(PolicyComparison(n, len(parts), prefill_seconds(ops, base, cached + n, chunk, cached),
                                     prefill_seconds(ops, cand, cached + n, chunk, cached), extra[0], extra[1]))
    return rows


def one_layer_policies(model: ModelSpec, layer: int, tokens: int, around: ReplayPolicy | None = None) -> tuple[ReplayPolicy, ReplayPolicy]:
    """(layer ``layer`` recomputes, layer ``layer`` replays ``tokens``), every other layer as in ``around``
    (default: the model's shipped policy)."""
    around = around or shipped_replay_policy(model)
    base = around.model_copy(update={"layers": {**around.layers, layer: LayerReplay(mode="recompute")}})
    cand = around.model_copy(update={"layers": {**around.layers, layer: LayerReplay(mode="replay", tokens=tokens)}})
    return base, cand


def depth_correction(model: ModelSpec, hw, layout, calibration, replay: ResolvedReplay,
                     dp_balance: bool = True) -> DepthCorrection | None:
    """The simulator's ``DepthCorrection`` for ``replay`` on this model, hardware, layout and calibration; None where
    every resume runs through every layer (nothing to correct). ``dp_balance``: the simulator prices attention-DP
    steps at their busiest rank (``EffectiveStepCost``, its default), so with ``layout.dp`` > 1 a chunk is priced
    whole on its rank. Where ``calibration`` carries a replay grid measured on this model
    (``costmodels.replay_grid.for_profile``), the correction is priced from its measured pieces; else analytically."""
    if not DepthCorrection.needed(replay):
        return None
    per_rank = dp_balance and layout.dp > 1
    ops = StepOps(model, hw, layout, calibration, dp_imbalance=float(layout.dp) if per_rank else 1.0)
    from costmodels.replay_grid import for_profile
    grid = for_profile(calibration)
    return DepthCorrection(ops, replay, busiest_rank=per_rank, grid=grid if grid is not None and grid.matches(model) else None)
