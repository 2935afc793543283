"""Measured step-time model of one executor on one GPU: what the twin predicts a step costs.

The roofline cost model (``StepCostModel``) says how long a step's kernels take on an ideal
engine. A real engine also spends host time per step (building inputs, launching kernels one
by one, syncing for sampled tokens, scheduling), which dominates at small batch. A
``StepProfile`` (inside a ``CalibrationProfile``, written by ``twinfer calibrate``) holds:

- ``category_scale``: one factor per op category (attention, dense GEMMs, expert GEMMs, other),
  fitted on measured steps, by which this engine's kernels are slower than the cost model's
  op times (which already use the profile's per-op efficiency tables when it has them);
  ``D = sum_c scale_c * t_c(batch)``.
- ``host``: launch/host time of the runner's step. An eager step launches every kernel from
  Python: ``H = fixed + per_layer * L + per_request * n + per_token * tokens + per_prefill *
  prefill_sequences``, and host and device work overlap: ``runner step = max(H, D) + overlap *
  min(H, D)`` (0: perfect overlap, 1: they add).
- ``graph_sizes``: decode-only steps (no drafts) whose batch fits a captured CUDA graph replay
  the graph of the smallest captured size ``>= n`` (executor/cuda_graphs.py): the GEMMs run on the
  padded batch, the routed experts on the real rows plus one (the padding rows are one repeated
  token; ``model_rev`` >= 1), attention on the real rows, and the host only builds the
  inputs before the replay and samples after it: ``runner step = graph_fixed + graph_per_request
  * n + D(padded)`` (the input build does not overlap the replay).
- ``loop``: the engine loop around the runner (schedule, complete, bookkeeping),
  ``fixed + per_request * n + per_token * tokens``; the simulator charges it as the scheduler's
  host overhead (``SchedulerConfig.host_*``), hidden under the device with async overlap.

Everything is fitted by (non-negative) least squares on relative error from measured steps
(``costmodels.step_fit``); the measured points are kept in the profile so a fit can be redone. The
runner step time it predicts is ``costmodels.profiled.ProfiledStepCost``.
"""

from __future__ import annotations

import math

from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from costmodels.host import partial_overlap
from twinfer.errors import TwinferError

# Revision of the step model (costmodels.profiled.ProfiledStepCost) a fit writes; a profile is priced with the revision
# its terms were fitted with, so a stored profile reproduces its own fit after the model changes.
#   0: padding rows of a CUDA-graph decode priced as random tokens; kv_b_proj in the weight dtype
#   1: padding rows are one repeated token (their experts are one token's: n + 1 distinct tokens route); the
#      executor's kv_b_proj runs in BF16 (executor/mla.py keeps it in the activation dtype)
STEP_MODEL_REV = 1
# the serving host's speed over the calibration's a step model may be moved to (StepProfile.at_host_speed): the H100
# and H200 boards lent here read 0.5-2.1x their calibration's probe (issue 16, runs 48-54)
HOST_SPEED_RANGE = (0.1, 10.0)
# Bounds of the host and engine-loop terms (seconds; HostTerms, LoopTerms), each far past anything measured, so an edited
# or corrupt profile is refused by name instead of priced: a step's fixed terms at most STEP_S_MAX (fitted: at most
# 25 ms, the eager step's fixed issue of runs 1-55); an engine-loop term per request at most PER_REQUEST_S_MAX (the
# runner's per request, chunk or layer: HOST_ITEM_S_MAX; fitted on GPUs: at most 2.4 ms); per token PER_TOKEN_S_MAX
# (the runner's: HOST_TOKEN_S_MAX; fitted on GPUs: at most 1 us); per context token of a graph decode PER_KV_TOKEN_S_MAX
# (fitted: at most 4 ns); admission per prompt token ADMIT_PER_TOKEN_S_MAX (fitted: at most 0.13 us); each step after
# an eager one AFTER_EAGER_S_MAX (fitted: at most 0.5 ms). The engine loop's bounds are the simulator's
# (scheduler.config.SchedulerConfig.host_*), which it becomes. No host term is negative: the simulator would be handed a
# negative delay.
STEP_S_MAX = 1.0
PER_REQUEST_S_MAX = 0.01
# the runner's host terms per request, prefill chunk, layer or sampled row (HostTerms) on a CPU executor hold its compute
# too: the tiny model on a loaded 2-core CPU fitted 33 ms a request and 41 ms a prefill chunk (a calibration that
# failed at PER_REQUEST_S_MAX) and 0.26 ms a token idle; a fit past any bound is held at it and says so (clip_terms),
# never refused
HOST_ITEM_S_MAX = 1.0
HOST_TOKEN_S_MAX = 0.01
PER_TOKEN_S_MAX = 1e-3
PER_KV_TOKEN_S_MAX = 1e-5
ADMIT_PER_TOKEN_S_MAX = 1e-5
AFTER_EAGER_S_MAX = 0.01
AfterEagerSeconds = Annotated[float, Field(ge=0.0, le=AFTER_EAGER_S_MAX)]


def _term(le: float, description: str | None = None):
    """A host or engine-loop term's field: seconds, 0 by default, never negative, at most ``le``."""
    return Field(0.0, ge=0.0, le=le, description=description)


def term_bound(cls: type[BaseModel], name: str) -> float | None:
    """The upper bound of ``cls``'s host or loop term ``name`` (seconds): its field's ``le``, AFTER_EAGER_S_MAX for the
    after-eager lists' items; None for a field with none."""
    f = cls.model_fields.get(name)
    if f is None:
        return None
    les = [m.le for m in f.metadata if getattr(m, "le", None) is not None]
    return les[0] if les else (AFTER_EAGER_S_MAX if name.startswith("after_eager_decode") else None)


def clip_terms(cls: type[BaseModel], values: dict) -> tuple[dict, list[str]]:
    """Measured or fitted seconds for ``cls``'s float terms held in their bounds ([0, le]; lists of seconds too): the
    values, and the names of those that were past a bound (a calibration reports them instead of failing)."""
    out, clipped = dict(values), []
    for k, v in values.items():
        top = term_bound(cls, k)
        if top is None:
            continue
        def hold(x: float, k: str = k, top: float = top) -> float:
            x = float(x)
            y = min(max(x, 0.0), top) if math.isfinite(x) else (top if x > 0 else 0.0)   # NaN: none measured
            if y != x and k not in clipped:
                clipped.append(k)
            return y
        if isinstance(v, float | int) and not isinstance(v, bool):
            out[k] = hold(v)
        elif k == "after_eager_decode_s":
            out[k] = [hold(x) for x in v]
        elif k == "after_eager_decode_by_tokens":
            out[k] = [(t, [hold(x) for x in row]) for t, row in v]
    return out, clipped


FIT_CATEGORIES = ("attention", "prefill_attention", "dense_gemm", "expert_gemm", "other")
# cost-model categories (costmodels.ops.CATEGORIES order) folded into the fitted ones; the attention core (and
# indexer) of decode rows and of prefill chunks are separate: different kernels (paged MLA decode vs SDPA prefill)
CATEGORY_FOLD = {0: 0, 1: 0, 2: 2, 3: 3, 4: 4, 5: 4}


# the host phases of a synchronous runner step (executor.model_runner.ModelRunner.execute), seconds: building the inputs
# (before the forward call), issuing the logits and sampler after it returns, waiting for the sampled tokens (the
# device finishing the forward and sampler), and the bookkeeping after (acceptance, stops, MTP drafting); the step
# records, replays, validation samples and calibration points name them so
HOST_PHASES = ("inputs", "sample", "readback", "post")


class StepPoint(BaseModel):
    """One measured step: its batch (decode contexts, prefill chunks) and times (seconds)."""

    model_config = ConfigDict(extra="forbid")
    num_layers: int
    decode_ctx: list[int] = Field(default_factory=list, description="context length of each decode before the step")
    draft_len: int = 0
    prefill: list[tuple[int, int]] = Field(default_factory=list, description="(new tokens, cached context) per prefill chunk")
    wall_s: float = Field(..., gt=0, description="runner step, median of repeats")
    loop_s: float | None = Field(None, description="engine-loop time around the runner step (schedule + complete), when measured")
    repeats: int = 1
    spread: float = Field(0.0, description="(max - min) / median of the repeats")
    graph_bs: int = Field(0, ge=0, description="captured CUDA-graph batch size the step replayed (0: eager)")
    sm_clock_mhz: float | None = Field(None, description="GPU SM clock read right after the step (NVML), a diagnostic")
    gpu_temp_c: float | None = Field(None, description="GPU temperature read right after the step (NVML), a diagnostic")
    forward_s: float | None = Field(None, description="CUDA-event seconds of the step's forward alone (median of repeats; "
                                    "inputs built, before sampling), a diagnostic beside wall_s")
    forward_host_s: float | None = Field(None, description="host seconds the forward call took to return (median of "
                                         "repeats): its launch issue, plus any wait inside it for the device")
    queued_forward_s: float | None = Field(None, description="the forward's CUDA-event seconds with the GPU held busy by a "
                                           "spin kernel while the host issued it: its device work alone (eager steps; "
                                           "CUDA-graph decodes since ae91d90: the replay without the wait for its launch)")
    queued_launch_s: float | None = Field(None, description="a CUDA-graph decode launched as the pipelined loop launches "
                                          "it (its inputs' copies, the replay, the sampler, the sampled ids' read-back) "
                                          "with the GPU held busy by a spin kernel: the launch's device span, as serving's "
                                          "device_s times it (calibrations since 2026-12-06)")
    queued_host_s: float | None = Field(None, description="host seconds the forward call took under that spin: its "
                                        "launch issue alone (near the spin's length if the forward syncs)")
    host_phases: dict[str, float] | None = Field(None, description="the runner's host phases (seconds, median of repeats "
                                                 "per phase): inputs built before the forward, the sampler's issue "
                                                 "after it, the wait for the sampled tokens, the bookkeeping after; a "
                                                 "diagnostic (HOST_PHASES)")

    @property
    def num_requests(self) -> int:
        return len(self.decode_ctx) + len(self.prefill)

    @property
    def num_tokens(self) -> int:
        return len(self.decode_ctx) * (1 + self.draft_len) + sum(p[0] for p in self.prefill)


class HostTerms(BaseModel):
    """Runner host/launch time per step (seconds)."""

    model_config = ConfigDict(extra="forbid")
    fixed_s: float = _term(STEP_S_MAX)
    per_layer_s: float = _term(HOST_ITEM_S_MAX)
    per_request_s: float = _term(HOST_ITEM_S_MAX)
    per_token_s: float = _term(HOST_TOKEN_S_MAX)
    per_prefill_s: float = _term(HOST_ITEM_S_MAX)
    decode_group_s: float = _term(STEP_S_MAX,
        "step that is not a decode-graph replay and holds decodes: the host issue of the decode group's "
        "attention path, once per layer for all decodes (absorbed query, the paged decode kernel and its "
        "metadata, absorbed output), between graph pieces or in an eager forward; 0 in profiles fitted "
        "before it")
    unbucketed_s: float = _term(STEP_S_MAX,
        "issue a step pays for running wholly eager where the engine has piecewise CUDA graphs but no "
        "token bucket holds the step (beyond the largest): every kernel launched one by one. H200 run 20:"
        " 11-24 ms of issue against 2-3.5 ms bucketed; 0 in profiles fitted before it")
    graph_fixed_s: float = _term(STEP_S_MAX,
        "CUDA-graph decode step: fixed host time (input build, replay launch, sampling)")
    graph_per_request_s: float = _term(HOST_ITEM_S_MAX,
        "CUDA-graph decode step: host time per sequence")
    graph_per_kv_token_s: float = _term(PER_KV_TOKEN_S_MAX,
        "CUDA-graph decode step: host time per context token of its sequences (their block tables, built "
        "and copied per step); 0 in profiles fitted before it")
    serial_s: float = _term(STEP_S_MAX,
        "step that is not a decode-graph replay: host time outside its forward (input build before it, "
        "bookkeeping after it; the sampler is its own table), which a synchronous step cannot overlap "
        "with the device: added to max(host, device). Measured, not fitted to whole steps: wall less "
        "forward less sampler of the calibration's eager points; 0 in profiles fitted before it")
    serial_per_request_s: float = _term(HOST_ITEM_S_MAX,
        "serial host time per request (decodes and prefill chunks)")
    serial_per_prefill_s: float = _term(HOST_ITEM_S_MAX,
        "serial host time per prefill chunk")
    serial_per_token_s: float = _term(HOST_TOKEN_S_MAX,
        "serial host time per prefill token (the chunk's token ids, positions and KV slots built on the "
        "host and copied); 0 in profiles fitted before it")
    sample_issue_s: float = _term(STEP_S_MAX,
        "the sampler's host issue (the logits GEMM and sampling called after the forward, until they "
        "return): fixed seconds, from the calibration points' measured 'sample' host phase; what a "
        "pipelined loop pays on the host to launch a step's sampler. 0 in profiles fitted before it (then"
        " the sampler's eager seconds less its device work)")
    sample_issue_per_row_s: float = _term(HOST_ITEM_S_MAX,
        "the sampler's host issue per sampled row")
    after_eager_s: float = _term(AFTER_EAGER_S_MAX,
        "seconds a step pays right after a prefill-bearing (eager or piecewise) step, beyond the same "
        "step after a decode step: measured apart from the grid (executor.calibrate.measure_after_eager: "
        "the smaller of a decode and a mixed probe's), which times every shape after a decode step; 0 in "
        "profiles calibrated before it")
    after_eager_decode_s: list[AfterEagerSeconds] = Field(default_factory=list, max_length=16, description="seconds the j-th decode "
                                              "step after a prefill-bearing step pays beyond a decode step among decode "
                                              "steps, j = 1..len (executor.calibrate.measure_after_eager: decode steps "
                                              "timed one after another behind an eager step); empty: after_eager_s "
                                              "for the first step only (profiles before it)")
    after_eager_decode_by_tokens: list[tuple[Annotated[int, Field(ge=1)], list[AfterEagerSeconds]]] = Field(
        default_factory=list, max_length=8, description="the same decay measured behind prompt chunks of several sizes: "
        "(chunk tokens, [seconds per decode step]); where present it replaces after_eager_decode_s, priced at the "
        "prompt-bearing step's own token count (costmodels.host.decay_after); empty in profiles calibrated before it")

    def __call__(self, num_layers: float, n_req, n_tok, n_prefill):
        """Eager step host time (a step that is not a decode-graph replay: eager or piecewise graphs). ``n_req``
        counts decodes and prefill chunks, ``n_prefill`` the chunks: the step holds decodes where it exceeds them."""
        n_req, n_prefill = np.asarray(n_req, float), np.asarray(n_prefill, float)
        return (self.fixed_s + self.per_layer_s * num_layers + self.per_request_s * n_req
                + self.per_token_s * np.asarray(n_tok, float) + self.per_prefill_s * n_prefill
                + self.decode_group_s * (n_req > n_prefill))

    def serial(self, n_req, n_prefill, n_prefill_tokens=0):
        """Host time of a step that is not a decode-graph replay, outside its forward (added, never overlapped)."""
        return (self.serial_s + self.serial_per_request_s * np.asarray(n_req, float)
                + self.serial_per_prefill_s * np.asarray(n_prefill, float)
                + self.serial_per_token_s * np.asarray(n_prefill_tokens, float))

    def sample_issue(self, rows):
        """The sampler's host issue over ``rows`` sampled rows (0 where not fitted or no rows)."""
        r = np.asarray(rows, float)
        return np.where(r > 0, self.sample_issue_s + self.sample_issue_per_row_s * r, 0.0)

    def graph(self, n_req, kv_tokens=0.0):
        """CUDA-graph decode step host time (``kv_tokens``: the context tokens of its sequences)."""
        return (self.graph_fixed_s + self.graph_per_request_s * np.asarray(n_req, float)
                + self.graph_per_kv_token_s * np.asarray(kv_tokens, float))


class LoopTerms(BaseModel):
    """Engine-loop time per step around the runner (seconds): the simulator's scheduler host overhead."""

    model_config = ConfigDict(extra="forbid")
    fixed_s: float = _term(STEP_S_MAX)
    per_request_s: float = _term(PER_REQUEST_S_MAX)
    per_token_s: float = _term(PER_TOKEN_S_MAX)
    admit_s: float = _term(PER_REQUEST_S_MAX,
        "admitting one request (the engine's add_request: its Request, sampling state and scheduler "
        "entry), once, in the iteration that admits it; measured by timing add_request over prompt "
        "lengths (executor.calibrate.measure_admission); 0 in profiles calibrated before it")
    admit_per_token_s: float = _term(ADMIT_PER_TOKEN_S_MAX,
        "admission per prompt token (range check and the prefix cache's block hashes)")

    def __call__(self, n_req, n_tok):
        return self.fixed_s + self.per_request_s * np.asarray(n_req, float) + self.per_token_s * np.asarray(n_tok, float)

    def admit(self, prompt_tokens):
        """Host seconds admitting requests of ``prompt_tokens`` tokens (vectorised)."""
        return self.admit_s + self.admit_per_token_s * np.asarray(prompt_tokens, float)


class FitStats(BaseModel):
    """In-sample quality of a fit."""

    points: int = 0
    mape: float | None = None
    p90_abs_err_s: float | None = None
    max_rel_err: float | None = None
    loop_points: int = 0


class StepProfile(BaseModel):
    """The measured step model of one engine (model, layers, dtype) on one device."""

    model_config = ConfigDict(extra="forbid")
    model: str
    num_layers: int = Field(..., ge=1, le=1024, description="layers of the engine measured (the model cut to its first "
                            "num_layers; costmodels.model_spec.ModelSpec's bound)")
    dtype: str = "bf16"
    device: str = "cuda"
    hardware_basis: str = Field("H200", description="hardware catalog entry whose ceilings the cost-model op times use")
    model_rev: int = Field(STEP_MODEL_REV, ge=0, le=STEP_MODEL_REV,
        description="revision of the step model the terms were fitted with (STEP_MODEL_REV); a stored profile without it is 0 "
                    "(CalibrationProfile reads it so)")
    use_op_tables: bool = Field(False, description="device terms from the profile's measured op tables (else analytic defaults)")
    op_tables: list[str] = Field(default_factory=list, description="which of the profile's tables (with use_op_tables; empty: all)")
    category_scale: dict[str, float] = Field(default_factory=lambda: {c: 1.0 for c in FIT_CATEGORIES})
    host: HostTerms = Field(default_factory=HostTerms)
    overlap: float = Field(0.0, ge=0.0, le=1.0)
    prefill_token_s: float = Field(0.0, ge=0.0, description="device seconds per prefill token beyond the category terms (eager steps)")
    eager_scale: float | None = Field(None, gt=0, description="device scale of the steps that are not decode-graph replays "
                                      "(piecewise or eager forwards), fitted to their measured device work (the calibration's "
                                      "spin-held forwards); replaces category_scale for them, prefill attention excepted. None: "
                                      "category_scale serves both kinds (profiles before the measurement)")
    layer_early: float | None = Field(None, ge=0.0, le=1.0, description="steps that are not decode-graph replays: "
                                      "the forward as issue and device work layer by layer in order "
                                      "(costmodels.host.layered_forward), this share of each layer's device work able to "
                                      "start when its issue begins; fitted to the grid's forwards against their measured "
                                      "issue and device work, with ``overlap`` x min(host, device) beyond the flow. None: "
                                      "max(host, device) + overlap x min (older profiles)")
    eager_decode_group_s: float = Field(0.0, ge=0.0, description="device seconds a step that is not a decode-graph replay "
                                        "pays for holding decodes: the decode group's attention path run eagerly between the "
                                        "pieces (absorbed query, paged-decode metadata and kernel, absorbed output) beyond the "
                                        "attention the tables price; measured with eager_scale")
    graph_replay_s: float = Field(0.0, ge=0.0, description="device seconds a decode-graph replay pays beyond its ops' "
                                  "times at the graph scale: the replay's fixed cost on the device (its chain of small "
                                  "kernels' ramps and tails that no op table holds), fitted with the scale to the forwards "
                                  "timed with the GPU held (forward = scale x op times + this), at most a tenth of the "
                                  "smallest of them; 0: the scale alone (older profiles, or no held forwards)")
    launch_device_s: float = Field(0.0, ge=0.0, description="device seconds a pipelined launch of a decode graph runs "
                                   "beyond its forward and its sampler: the inputs' and sampled ids' copies, the rows' "
                                   "gather (fitted to the grid's held launch spans less their held forwards and the "
                                   "sampler table; the synchronous loop's wall fit holds them in its host terms)")
    launch_device_per_row_s: float = Field(0.0, ge=0.0, description="the same, per decode row")
    launch_device_rows: list[tuple[int, float]] = Field(
        default_factory=list, description="the same measured at each decode row count of the grid: (rows, median seconds "
        "of the held launch spans less their held forwards and the sampler table at those rows), linear between row "
        "counts; where present it prices the launch in place of the line above, which cannot follow what the sampler "
        "table misses at single row counts (H100 run 47: +0.11 ms at 2 rows, 0.00 at 1 and 4). May be negative where "
        "the sampler table runs over the launch; empty: the line (profiles before 2026-12-06)")
    graph_sizes: list[int] = Field(default_factory=list, description="decode batch sizes the engine replays as CUDA graphs "
                                   "(a batch pads up to the smallest >= n); empty: every step eager")
    piecewise_sizes: list[int] = Field(default_factory=list, description="token buckets of the engine's piecewise CUDA "
                                       "graphs (a prefill/mixed step of T tokens runs its GEMMs and experts on the smallest "
                                       "bucket >= T; attention on the real rows); empty: those steps run eager, unpadded")
    loop: LoopTerms = Field(default_factory=LoopTerms)
    fit: FitStats = Field(default_factory=FitStats)
    notes: list[str] = Field(default_factory=list)
    points: list[StepPoint] = Field(default_factory=list, description="measured steps the fit used")

    def scales(self) -> np.ndarray:
        return np.array([self.category_scale.get(c, 1.0) for c in FIT_CATEGORIES])

    def at_host_speed(self, ratio: float) -> "StepProfile":
        """The profile on a host ``ratio`` times as slow as the calibration's (0.5: twice as fast): every host term (the
        runner's issue, input build, sampler issue and the steps after an eager one, the engine loop and its
        admissions) times ``ratio``, the device terms as fitted. ``ratio`` is a measurement, not a fit: the same fixed
        host work timed on the serving host over the calibration's (``executor/host_probe.py``; ``twinfer validate``
        times it before every replay)."""
        r = float(ratio)
        if not (np.isfinite(r) and HOST_SPEED_RANGE[0] <= r <= HOST_SPEED_RANGE[1]):
            raise ValueError(f"host_speed: the serving host's probe over the calibration's must be within "
                             f"{HOST_SPEED_RANGE[0]:g}-{HOST_SPEED_RANGE[1]:g}, got {ratio!r}")
        if r == 1.0:
            return self
        h = {}
        for k, v in self.host.model_dump().items():
            if isinstance(v, float):
                h[k] = v * r
            elif k == "after_eager_decode_s":
                h[k] = [x * r for x in v]
            elif k == "after_eager_decode_by_tokens":
                h[k] = [(t, [x * r for x in xs]) for t, xs in v]
            else:
                h[k] = v
        loop = {k: (v * r if isinstance(v, float) else v) for k, v in self.loop.model_dump().items()}
        moved = {}
        for name, cls, terms in (("host", HostTerms, h), ("loop", LoopTerms, loop)):
            try:
                moved[name] = cls(**terms)
            except ValidationError as e:
                bad = ", ".join(f"{name}." + ".".join(str(x) for x in err["loc"]) for err in e.errors())
                raise TwinferError(f"--host-speed {r:g}: that many times the profile's host terms puts {bad} past its "
                                   f"bound (costmodels.step_profile: STEP_S_MAX and the others); this profile moves at "
                                   f"most {self.max_host_speed():.3g}x") from None
        return self.model_copy(update=moved)

    def max_host_speed(self) -> float:
        """The largest ratio ``at_host_speed`` takes for this profile: every host and loop term times it within its
        bound (HOST_SPEED_RANGE's top where no term is near its bound)."""
        top = HOST_SPEED_RANGE[1]
        for terms in (self.host, self.loop):
            for k in type(terms).model_fields:
                v, le = getattr(terms, k), term_bound(type(terms), k)
                xs = ([v] if isinstance(v, float) else v if k == "after_eager_decode_s"
                      else [x for _, row in v for x in row] if k == "after_eager_decode_by_tokens" else [])
                if le is not None and xs and max(xs) > 0:
                    m = max(xs)
                    r = le / m
                    while m * r > le:   # the quotient can round up: the product must stay within the bound
                        r = math.nextafter(r, 0.0)
                    top = min(top, r)
        return top

    def prompt_clock_mhz(self, min_tokens: int = 2048) -> float | None:
        """The SM clock the grid timed its prompt steps at: the median of its points with at least ``min_tokens`` prompt
        tokens (the device-bound ones a prefill-heavy load runs), None where the points carry no clock. Serving under
        sustained prefill-heavy load can run below it (H200 run 44: 1,603-1,721 MHz at the 700 W cap against 1,935):
        the step model prices device work at this clock."""
        mhz = [p.sm_clock_mhz for p in self.points if p.sm_clock_mhz and sum(n for n, _ in p.prefill) >= min_tokens]
        return float(np.median(mhz)) if mhz else None

    def eager_scales(self) -> np.ndarray:
        """Category scales of a step that is not a decode-graph replay: ``eager_scale`` for every category but
        prefill attention (which only such steps run, at its own scale), or ``scales()`` without it."""
        k = self.scales()
        if self.eager_scale is not None:
            k = np.where(np.array([c == "prefill_attention" for c in FIT_CATEGORIES]), k, self.eager_scale)
        return k

    def combine(self, host, device):
        """Eager runner step time from host and device terms (vectorised)."""
        return partial_overlap(host, device, self.overlap)

    def piecewise_bucket(self, num_tokens: int) -> int:
        """Token bucket a step that is not a decode-graph replay pads to (executor/piecewise_graphs.py; 0: eager)."""
        if num_tokens <= 0:
            return 0
        for s in self.piecewise_sizes:
            if s >= num_tokens:
                return int(s)
        return 0

    def graph_bucket(self, num_decodes: int, draft_len: int = 0, num_prefills: int = 0) -> int:
        """Captured batch size a step replays (0: the step runs eager)."""
        if num_prefills or draft_len or num_decodes <= 0:
            return 0
        for s in self.graph_sizes:
            if s >= num_decodes:
                return int(s)
        return 0
