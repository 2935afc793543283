"""``twinfer validate``: replay the same requests through the real executor and through the simulator
configured with a calibration profile, at several load levels, and report how far the twin is off."""

from __future__ import annotations

import datetime as dt
import json
import math
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import typer

from costmodels.step_profile import HOST_SPEED_RANGE
from twinfer.errors import TwinferError
from ui.progress import progress_bar


def register(app: typer.Typer) -> None:
    """Add ``validate`` to the CLI."""
    app.command("validate", help="Replay a trace on the executor and in the simulator (with a calibration profile); "
                                 "print per-step and end-to-end errors at several load levels; write a JSON report and a plot.")(validate)


def load_requests(trace: Optional[str], workload: str, requests: Optional[int], block_size: int, seed: int,
                  max_input_len: Optional[int], max_output_len: Optional[int], max_model_len: int):
    """Requests from a trace (JSONL) or a workload preset/file, lengths clamped to what the engine holds."""
    return clamp_requests(read_requests(trace, workload, requests, block_size, seed), block_size, max_input_len,
                          max_output_len, max_model_len)[0]


def read_requests(trace: Optional[str], workload: str, requests: Optional[int], block_size: int, seed: int):
    """Requests from a trace (JSONL) or a workload preset/file, as drawn (``clamp_requests`` fits them)."""
    if trace:
        from sim.traces import read_trace
        reqs = read_trace(trace, block_size, "jsonl")
        if requests:
            reqs = reqs[:requests]
    else:
        from sim.workload import generate
        from ui.cmd_run import _load_workload
        reqs = generate(_load_workload(workload, requests, None), np.random.default_rng(seed), block_size)
    if not reqs:
        raise TwinferError("no requests to replay")
    return reqs


def clamp_requests(reqs, block_size: int, max_input_len: Optional[int], max_output_len: Optional[int], max_model_len: int):
    """``reqs`` sorted by arrival from t = 0, prompts cut to ``max_input_len`` and outputs to ``max_output_len`` (asked
    for), then prompt + output to ``max_model_len`` - 1 (the context; one token for the prompt's end). Returns the
    requests, how many of them the context clipped and the longest prompt + output the flags asked for (the context
    that would fit every request: that + 1)."""
    t0 = min(r.arrival_time for r in reqs)
    out, clipped, longest = [], 0, 0
    for r in sorted(reqs, key=lambda r: r.arrival_time):
        p_asked = min(r.prompt_len, max_input_len or r.prompt_len)
        o_asked = min(r.output_len, max_output_len or r.output_len)
        p = min(p_asked, max_model_len - 2)
        o = max(1, min(o_asked, max_model_len - p - 1))
        clipped += (p, o) != (p_asked, o_asked)
        longest = max(longest, p_asked + o_asked)
        r.arrival_time -= t0
        r.prompt_len, r.output_len = p, o
        r.block_hashes = r.block_hashes[: p // block_size]
        out.append(r)
    return out, clipped, longest


def context_clip_note(clipped: int, total: int, longest: int, max_model_len: int, workload: str) -> str | None:
    """None where every request fits ``--max-model-len``; a note (said and recorded in the report) where some are
    clipped to it; refused (exit 2) where most are: the figures would be of other requests than the workload's (a
    long-context workload at the default 4,096 ran as 4,094-token prompts with one output token: no TPOT at all)."""
    if not clipped:
        return None
    from ui.cmd_bench import clipped_note

    fit = longest + 1
    if 2 * clipped > total:
        raise TwinferError(f"--max-model-len {max_model_len}: {clipped} of {total} requests of {workload!r} do not fit it "
                           f"(the longest is {longest:,} tokens, prompt and output); give --max-model-len {fit} to fit "
                           "every one, or --max-input-len/--max-output-len to shorten them on purpose")
    return (clipped_note(clipped, total, f"--max-model-len {max_model_len}") + f" (prompt + output; the longest is "
            f"{longest:,} tokens: --max-model-len {fit} fits every one); the figures are of the clipped requests")


def sim_config(base, profile):
    """The simulator's scheduler config: the engine's, with the measured loop as host overhead (overlapped with the
    device or not as the engine's loop is: ``base.async_overlap``)."""
    from costmodels.step_fit import loop_scheduler_terms
    return base.model_copy(update={**loop_scheduler_terms(profile.step), "async_overlap": base.async_overlap})


def predict_step(cost, profile, decode_ctx, prefill, draft_len=0, overlap: bool | float = False,
                 after_eager: bool = False, since_eager: int = 0, eager_tokens: int = 0, admitted: int = 0,
                 admitted_tokens: int = 0) -> float:
    """Predicted engine-loop iteration as the simulator charges it: the overlap rule (costmodels.host.wall_time) over
    the runner step and the loop overhead (``overlap``: the scheduler config's ``overlap()``; False: added), plus the
    profile's measured cost of following a prefill-bearing step (sim.backend): where ``after_eager`` (the step right
    after one), ``after_eager_s``; for a decode step that is the ``since_eager``-th decode step after one (1: right
    after), the measured decay ``after_eager_decode_s`` where the profile has it (measured behind prompt steps of
    several sizes, ``after_eager_decode_by_tokens``: the one ``eager_tokens``, that prompt step's tokens, owe, as
    ``sim.backend`` prices it). ``admitted`` requests of ``admitted_tokens`` prompt tokens in all, admitted in this
    iteration: their admission, at the profile's measured price as the simulator's loop charges it (bounded as
    ``loop_scheduler_terms`` passes it on; the simulator charges it to the step of each request's first chunk, the
    measured iteration pays it where the request arrived, so the iteration's own admissions are what it is compared
    with). A pipelined loop (``overlap``
    truthy) prices the runner step as the simulator does (``sim.backend.loop_cost``: max(device, host) per step); with
    ``overlap`` True the after-prompt cost is host work of the launch (measured in the runner's input build and
    sampler), hidden as the loop's is, where a synchronous loop adds it."""
    from costmodels.host import wall_time
    from sim.backend import loop_cost
    runner = loop_cost(cost, bool(overlap)).chunked_step_time(np.asarray(decode_ctx, np.int64), draft_len,
                                                              [a for a, _ in prefill], [c for _, c in prefill])
    loop, extra = _loop_terms(profile, decode_ctx, prefill, draft_len, after_eager, since_eager, eager_tokens, admitted,
                              admitted_tokens)
    if overlap is True:   # the pipelined loop: host work of the launch, hidden under the device's as the rest is
        return float(wall_time(float(runner), loop + extra, True))
    return float(wall_time(float(runner), loop, overlap)) + extra


def _loop_terms(profile, decode_ctx, prefill, draft_len, after_eager, since_eager, eager_tokens, admitted,
                admitted_tokens, terms: dict | None = None) -> tuple[float, float]:
    """``predict_step``'s terms beside the runner step: the loop's host seconds with the iteration's admissions, and
    what the step pays for following a prompt step. ``terms``: ``loop_scheduler_terms(profile.step)`` where the
    caller has them (one replay's steps share them)."""
    n = len(decode_ctx) + len(prefill)
    tok = len(decode_ctx) * (1 + draft_len) + sum(a for a, _ in prefill)
    if terms is None:
        from costmodels.step_fit import loop_scheduler_terms
        terms = loop_scheduler_terms(profile.step)    # as the simulator's scheduler config takes them (bounded)
    decay = terms["host_after_eager_decode_s"]
    if terms["host_after_eager_decode_by_tokens"]:
        from costmodels.host import decay_after
        decay = list(decay_after(terms["host_after_eager_decode_by_tokens"], eager_tokens))
    if decay and not prefill:
        j = since_eager if since_eager else (1 if after_eager else 0)
        extra = float(decay[j - 1]) if 1 <= j <= len(decay) else 0.0
    else:
        extra = float(terms["host_after_eager_s"]) if after_eager else 0.0
    loop = float(profile.step.loop(n, tok)) + _admissions(terms, admitted, admitted_tokens)
    return loop, extra


def _admissions(terms: dict, admitted: int, admitted_tokens: int) -> float:
    """Host seconds of admitting ``admitted`` requests of ``admitted_tokens`` prompt tokens in all, at the profile's
    price as the simulator's scheduler config takes it (``terms``: ``loop_scheduler_terms``, bounded)."""
    return terms["host_admit_s"] * admitted + terms["host_admit_per_token_s"] * admitted_tokens


def predict_steps(cost, profile, steps, overlap: bool | float = False, cold=None, idle=None) -> np.ndarray:
    """``predict_step`` for each step of one replay, in order (objects with ``decode_ctx``, ``prefill``, ``draft_len``
    and optionally ``admitted``/``admitted_tokens``), as the simulator charges them. A pipelined loop whose step
    model splits a step into device and host work (``overlap`` True, a measured profile: ``SimBackend.lead``) is
    priced launch by launch, as the simulator's loop runs it (``costmodels.host.pipelined_walls``): an iteration
    runs to the end of the host's launch of the next step or of its own device work, whichever is later; ``cold``
    (each step: launched with nothing in flight, ``sim.validate.read_backs``; default: only the first) marks where
    the engine had idled. Otherwise each step alone (``predict_step``).

    Launch by launch, the host work of launching a step is its runner's and loop's (``step_parts``) and two more:
    what it pays for following a prompt step (the profile's after-eager terms: measured in the runner's input build
    and sampler, not its forward, so the launch takes longer and the device work does not), and the admissions the
    engine made before launching it. A measured step's ``admitted`` are the arrivals of the engine call that read it
    back, which admits them before it launches the next step (``executor.replay``: admit, launch N+1, read N back):
    they delay the next launch (a step launched cold was admitted for before its own launch, outside every measured
    iteration). Issue 16, runs 35-40: charged on the device side, the after-eager terms made the
    decode steps behind a prompt step end later than measured and the prompt step's launch (which the decode step
    before it waits for) shorter; the split between the two iterations was off by 1-2 ms where their sum was right.

    Where the step model has a power model (``ProfiledStepCost.power``, ``costmodels.power``), each prompt-bearing
    step's device work is priced at the clock the work before it allows, as the simulator prices it (``SimBackend``'s
    governor: each step's work booked from when it was priced to where its device work ended; ``idle``: seconds the
    engine idled before each cold step, ``sim.validate.idle_gaps``, over which the average decays)."""
    from costmodels.host import pipelined_walls
    from sim.backend import loop_cost
    since, toks = steps_since_prefill(steps), last_prefill_tokens(steps)
    pc = loop_cost(cost, True) if overlap is True else None
    if pc is None or not (getattr(pc, "pipelined_loop", False) and hasattr(pc, "step_parts")):
        return np.array([predict_step(cost, profile, s.decode_ctx, s.prefill, s.draft_len, overlap,
                                      j > 0 and bool(steps[j - 1].prefill), since[j], toks[j],
                                      int(getattr(s, "admitted", 0) or 0), int(getattr(s, "admitted_tokens", 0) or 0))
                         for j, s in enumerate(steps)])
    n = len(steps)
    from costmodels.step_fit import loop_scheduler_terms
    terms = loop_scheduler_terms(profile.step)
    d, h, eager, tail, admit = np.zeros(n), np.zeros(n), np.zeros(n, bool), np.zeros(n), np.zeros(n)
    for j, s in enumerate(steps):
        loop, extra = _loop_terms(profile, s.decode_ctx, s.prefill, s.draft_len, j > 0 and bool(steps[j - 1].prefill),
                                  since[j], toks[j], 0, 0, terms)
        dj, hj, ej, tj = pc.step_parts(np.asarray(s.decode_ctx, np.int64), s.draft_len, [a for a, _ in s.prefill],
                                       [c for _, c in s.prefill])
        d[j], h[j], eager[j], tail[j] = dj, max(hj, loop) + extra, ej, min(tj, dj)
        admit[j] = _admissions(terms, int(getattr(s, "admitted", 0) or 0), int(getattr(s, "admitted_tokens", 0) or 0))
    if cold is None:
        cold = np.zeros(n, bool)
        cold[:1] = True
    cold = np.asarray(cold, bool)
    # admitted before the next step's launch; a step launched with nothing in flight was admitted for before its own
    # launch, where its iteration had not begun (what the engine measures from: ``LLMEngine._read_back``)
    h[1:] += np.where(cold[:-1], 0.0, admit[:-1])
    pm = getattr(pc, "power", None)
    if pm is None:
        return pipelined_walls(d, h, eager, cold, tail)
    from costmodels.power import PowerGovernor
    gov = PowerGovernor(pm)
    work = [pc.step_work(s.decode_ctx, s.draft_len, [a for a, _ in s.prefill], [c for _, c in s.prefill]) for s in steps]
    prompt = [bool(s.prefill) for s in steps]
    last: list = [None]   # (when the step before was priced, its index)

    def device_at(i: int, t: float, prev_end: float) -> float:
        if last[0] is not None and prev_end > last[0][0]:   # the step before, from its pricing to its device end
            gov.add(last[0][0], prev_end, *work[last[0][1]])
        last[0] = (t, i)
        return float(d[i]) * pm.stretch(gov.phi_at(t), True) if prompt[i] else float(d[i])

    return pipelined_walls(d, h, eager, cold, tail, device_at, idle)


def replay_idle_gaps(steps):
    """Seconds the engine idled before each step of one replay that started cold (``sim.validate.idle_gaps``); None
    where a step lacks its launch start."""
    from sim.validate import idle_gaps
    if not steps or any(getattr(s, "start_s", None) is None for s in steps):
        return None
    return idle_gaps(np.array([s.start_s for s in steps], float), np.array([s.iter_s for s in steps], float), [1] * len(steps))


def replay_cold_starts(steps):
    """Which steps of one replay (objects with ``start_s``, ``iter_s``) a pipelined engine launched with nothing in
    flight (``sim.validate.read_backs``); None where a step lacks its launch start."""
    from sim.validate import read_backs
    if not steps or any(getattr(s, "start_s", None) is None for s in steps):
        return None
    return read_backs(np.array([s.start_s for s in steps], float), np.array([s.iter_s for s in steps], float),
                      [1] * len(steps))[1]


def last_prefill_tokens(steps) -> list[int]:
    """For each step of a replay (objects with ``prefill``: (new, cached) pairs): the prompt tokens of the last
    prefill-bearing step before it (0 before any), what the decay after it is priced at."""
    out, last = [], 0
    for s in steps:
        out.append(last)
        if s.prefill:
            last = int(sum(a for a, _ in s.prefill))
    return out


def steps_since_prefill(steps) -> list[int]:
    """For each step of a replay (objects with ``prefill``): how many steps after the last prefill-bearing one it
    runs (1: right after), 0 before any and for a prefill-bearing step itself."""
    out, since = [], None
    for s in steps:
        if s.prefill:
            out.append(0)
            since = 0
        else:
            since = None if since is None else since + 1
            out.append(since or 0)
    return out


def eager_issue_drift(steps, cost, profile, min_steps: int = 5) -> float | None:
    """How much slower (+) or faster (-) serving's eager steps issued their forward than the calibration measured: the
    median over the replay's prefill-bearing single steps that recorded their forward call's host seconds
    (``forward_host_s``) of that over the model's issue term at the step's batch (``ProfiledStepCost.host_time``),
    minus 1. None with fewer than ``min_steps`` such steps or where the profile did not measure the issue apart
    (``eager_scale`` unset: its host terms were inferred from wall times). The twin of ``decode_host_drift`` for the
    steps the piecewise forward issues eagerly (H200 run 21: serving's mixed steps issued in 3.76 ms where the
    calibration grid's took 5.4)."""
    if getattr(profile.step, "eager_scale", None) is None or not hasattr(cost, "host_time"):
        return None
    ratios = []
    for s in steps:
        fh = getattr(s, "forward_host_s", float("nan"))
        if getattr(s, "num_steps", 1) != 1 or not s.prefill or not fh == fh or fh <= 0:
            continue
        nd, pc = len(s.decode_ctx), len(s.prefill)
        model = cost.host_time(nd + pc, nd * (1 + getattr(s, "draft_len", 0)) + sum(a for a, _ in s.prefill), pc)
        if model > 0:
            ratios.append(fh / model)
    return float(np.median(ratios)) - 1.0 if len(ratios) >= min_steps else None


def decode_host_model_s(cost, st, n: int, ctx_tokens: float) -> float:
    """The model's part of a decode-graph step outside its forward, what (iteration - forward) measures: the step
    profile ``st``'s graph host terms at ``n`` requests over ``ctx_tokens`` context tokens, ``cost``'s sampler and the
    profile's loop."""
    return float(st.host.graph(n, ctx_tokens)) + cost.sample_s(n) + float(st.loop(n, n))


def _check_profile_model(prof, model: str) -> None:
    """A profile's step model prices the model it measured: validating another, its errors would be the mismatch."""
    if prof.step.model != model:
        raise TwinferError(f"--model {model}: the profile measured {prof.step.model}; validate the model it measured "
                           f"(drop --model) or measure {model} first (--calibrate)")


def parse_host_speed(value: str | float) -> tuple[str, float]:
    """``--host-speed``: ("probe", 1) | ("issue", 1) | ("calibration", 1) | ("fixed", ratio); anything else is an error
    naming it."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        text = str(value)
    else:
        text = str(value).strip().lower()
        if text in ("probe", "issue", "calibration"):
            return text, 1.0
    try:
        r = float(text)
    except ValueError:
        r = float("nan")
    lo, hi = HOST_SPEED_RANGE
    if not (np.isfinite(r) and lo <= r <= hi):
        raise TwinferError(f"--host-speed {value}: expected calibration, probe, issue or a number from {lo:g} to {hi:g} "
                           "(the serving host's time for the same host work over the calibration's)")
    return "fixed", r


def probe_vs_calibration(probes: list[float | None], profile, key: str = "host_probe_s") -> list[float | None] | None:
    """Each replay's host probe over the calibration's (median of the probes it recorded) minus 1; None when the
    profile recorded none. ``key`` ``issue_probe_s``: the issue probe's (a replay's None where it timed none)."""
    from costmodels.calibration import host_probe_reference

    ref = host_probe_reference(profile.provenance, key)
    if ref is None or not any(p is not None for p in probes):
        return None
    return [None if p is None else round(p / ref - 1.0, 4) for p in probes]


def decode_host_drift(steps, cost, profile, min_steps: int = 20) -> float | None:
    """How much slower (+) or faster (-) the host part of serving's decode graph steps ran than the calibrated model
    says: the median over the replay's single decode-graph steps that timed their forward (and lie past what a
    prefill-bearing step costs the steps after it: ``after_eager_s``, ``after_eager_decode_s``) of (iteration - forward) over the model's part of the step outside the
    forward (the graph host terms at the step's batch and context, the sampler, the loop), minus 1. ``steps``:
    ReplayStep-like (``iter_s``, ``forward_s``, ``graph_bs``, ``decode_ctx``, ``prefill``). None with fewer than
    ``min_steps`` such steps or where the profile fitted no graph host. The forward is the GPU's and matched the grid
    within 0.4% in H200 runs 17-19; this part is the host's, whose speed a model fitted on the calibration's host
    cannot know (run 19: one class's decode steps -2.8 / -8.9 / -7.4% against the model in three consecutive replays)."""
    st = profile.step
    if not (st.host.graph_fixed_s or st.host.graph_per_request_s) or getattr(cost, "sample", None) is None:
        return None   # no graph host fitted, or the sampler priced inside the device categories (older profiles)
    ratios = []
    since = steps_since_prefill(steps)
    settle = max(1, len(st.host.after_eager_decode_s))   # the steps the measured decay after a prefill covers
    for j, s in enumerate(steps):
        fwd = getattr(s, "forward_s", float("nan"))
        if getattr(s, "num_steps", 1) != 1 or s.graph_bs <= 0 or s.prefill or not s.decode_ctx or not fwd == fwd:
            continue
        if 1 <= since[j] <= settle:
            continue
        ratios.append((s.iter_s - fwd) / decode_host_model_s(cost, st, len(s.decode_ctx), float(np.sum(s.decode_ctx))))
    return float(np.median(ratios)) - 1.0 if len(ratios) >= min_steps else None


PLOT_FORMATS = {".html": "plotly, self-contained (works offline)", ".png": "kaleido", ".svg": "kaleido", ".pdf": "kaleido"}


MAX_LEVELS = 20   # each level is a full simulation (and replays): a long --levels string ran for hours


def parse_levels(text: str) -> list[float]:
    """--levels as positive fractions of the predicted capacity; anything else is the user's error (exit 2)."""
    try:
        fracs = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fracs = []
    if not fracs or any(not 0 < f < math.inf for f in fracs):
        raise TwinferError(f"--levels {text[:200]!r}: expected comma-separated finite positive fractions of the predicted "
                           "capacity, e.g. 0.3,0.8,2.0")
    if len(fracs) > MAX_LEVELS:
        raise TwinferError(f"--levels: {len(fracs)} levels; at most {MAX_LEVELS} (each is a full simulation and replay)")
    return fracs


def check_trace_path(trace: Optional[str]) -> None:
    """A --trace that exists but is not a regular file (a device, pipe, folder) named as such: it read "no such trace
    file" for /dev/null."""
    from twinfer.config import not_a_file

    what = not_a_file(trace) if trace else None
    if what:
        raise TwinferError(f"--trace {trace}: {what}; give a twinfer JSONL trace file")


def sim_only_labels(prof, model: Optional[str], dtype: Optional[str], device: Optional[str]) -> tuple[str, str, str]:
    """(model, dtype, device) a --sim-only report names: the profile's dtype and device, which are what the simulator
    predicts (it prices the profile's measured step model and builds nothing); a --dtype/--device naming something
    else is refused (an H200 fp8 profile's predictions were reported as "device cpu", the executor's default, or as
    "dtype xx"); so is a --model other than the profile's (a report named tiny over DeepSeek-V3's figures)."""
    st = prof.step
    for flag, given, own in (("--dtype", dtype, st.dtype), ("--device", device, st.device)):
        if given is not None and given != own:
            raise TwinferError(f"{flag} {given}: --sim-only predicts what the profile measured ({own}); drop {flag} "
                               f"or give {own}")
    if model is not None and model != st.model:   # the figures would be the profile's model's under another name
        raise TwinferError(f"--model {model}: --sim-only predicts the model the profile measured ({st.model}); drop "
                           "--model, or measure that model (twinfer calibrate, or validate --calibrate)")
    return st.model, st.dtype, st.device


def check_plot_path(path: Path) -> None:
    """Refuse, before any run, a --plot this machine cannot write: an unknown suffix, no plotly, an image without kaleido."""
    import importlib.util

    allowed = ", ".join(f"{k} ({v})" for k, v in PLOT_FORMATS.items())
    suffix = path.suffix.lower()
    if suffix not in PLOT_FORMATS:
        raise TwinferError(f"--plot {path}: unknown format {suffix or '(no suffix)'!r}; allowed: {allowed}")
    if importlib.util.find_spec("plotly") is None:
        raise TwinferError(f"--plot {path}: plotting needs plotly: pip install 'twinfer[ui]'")
    if suffix != ".html" and importlib.util.find_spec("kaleido") is None:
        raise TwinferError(f"--plot {path}: a {suffix} image needs kaleido (pip install 'kaleido>=1', which drives a local "
                           f"Chrome/Chromium); without it give a .html path; allowed: {allowed}")


def plot_figure(report, samples_by_level: dict):
    """The plotly figure: per-step predicted vs measured (log-log, with the diagonal) and end-to-end errors per level."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    metrics = ["output_throughput", "tpot_p50", "ttft_p50", "ttft_p90"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        f"per-step predicted vs measured (ms): MAPE {report.step_overall.get('mape', 0) * 100:.1f}%", "end-to-end error (%)"))
    top = max((x.measured_s for s in samples_by_level.values() for x in s), default=1e-3) * 1e3 * 1.1
    for name, s in samples_by_level.items():
        fig.add_trace(go.Scatter(x=[x.measured_s * 1e3 for x in s], y=[x.predicted_s * 1e3 for x in s], mode="markers", name=name), 1, 1)
    fig.add_trace(go.Scatter(x=[1, max(1.0, top)], y=[1, max(1.0, top)], mode="lines", line={"dash": "dash", "color": "black"},
                             name="predicted = measured"), 1, 1)
    for lv in report.levels:
        fig.add_trace(go.Bar(x=metrics, y=[100 * (lv.rel_error.get(k) or 0) for k in metrics], name=lv.name), 1, 2)
    fig.update_xaxes(type="log", title_text="measured step (ms)", row=1, col=1)
    fig.update_yaxes(type="log", title_text="predicted step (ms)", row=1, col=1)
    fig.update_yaxes(title_text="predicted vs measured (%)", row=1, col=2)
    fig.update_layout(title=f"twinfer validate: {report.model} ({report.num_layers} layers, {report.dtype}) on "
                            f"{report.provenance.get('gpu', report.device)}", width=1300, height=520)
    return fig


def write_plot(report, samples_by_level: dict, path: Path) -> str:
    """Write the plot in the format ``path``'s suffix names; returns what was written.

    HTML embeds plotly.js (no CDN: the file opens offline). An image goes through kaleido; if
    that fails here (no Chrome), the HTML is written next to it and the message says why.
    """
    fig = plot_figure(report, samples_by_level)
    if path.suffix.lower() == ".html":
        fig.write_html(str(path), include_plotlyjs=True)
        return str(path)
    try:
        fig.write_image(str(path))
        return str(path)
    except Exception as e:  # noqa: BLE001 - kaleido's failures (no browser, timeouts) have many types
        html = path.with_suffix(".html")
        fig.write_html(str(html), include_plotlyjs=True)
        return f"could not write {path} ({type(e).__name__}: {e}); wrote {html} instead"


def validate(
    trace: Optional[str] = typer.Option(None, "--trace", "-t", help="twinfer JSONL trace (default: the --workload preset)"),
    workload: str = typer.Option("chat", "--workload", "-w", help="workload preset or file when no --trace"),
    requests: Optional[int] = typer.Option(None, "--requests", "-n", min=1, help="requests per load level"),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="model the executor runs (default: the profile's; "
                                        "tiny with --calibrate)"),
    num_layers: Optional[int] = typer.Option(None, "--num-layers", min=1),
    profile: Path = typer.Option(..., "--profile", "-p", help="calibration profile JSON (twinfer calibrate)"),
    device: Optional[str] = typer.Option(None, "--device", help="cpu or cuda [cpu; --sim-only: the profile's]"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="bf16 | fp32 | fp8 | fp64 [fp32 on cpu, bf16 on cuda; "
                                        "--sim-only: the profile's]"),
    levels: str = typer.Option("0.3,0.8,2.0", "--levels", help="load levels as fractions of the predicted capacity (low, knee, past saturation)"),
    max_num_seqs: int = typer.Option(64, "--max-num-seqs", min=1),
    max_batched_tokens: int = typer.Option(8192, "--max-batched-tokens", min=1),
    max_model_len: int = typer.Option(4096, "--max-model-len", min=16),
    max_input_len: Optional[int] = typer.Option(None, "--max-input-len", min=1),
    max_output_len: Optional[int] = typer.Option(None, "--max-output-len", min=1),
    num_kv_blocks: Optional[int] = typer.Option(None, "--num-kv-blocks", min=2),
    seed: int = typer.Option(0, "--seed"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="write the JSON report here"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="plot file: .html (self-contained, offline) or .png/.svg/.pdf (needs kaleido)"),
    sim_only: bool = typer.Option(False, "--sim-only", help="only print the simulator's predictions (no executor)"),
    calibrate_first: bool = typer.Option(False, "--calibrate", help="first calibrate the same engine in this process and write "
                                         "the profile to --profile (no drift between calibration and validation runs)"),
    warm: bool = typer.Option(True, "--warm/--no-warm", help="an unmeasured replay of the trace first (JIT, clocks)"),
    async_overlap: bool = typer.Option(False, "--async-overlap/--no-async-overlap", help="pipelined executor loop (step N+1 "
                                       "scheduled while the device runs step N), predicted with the same overlap rule"),
    runs: int = typer.Option(1, "--runs", min=1, max=50, help="replays of each load level on the executor: the errors use the "
                             "median of each figure, and its spread over the runs is reported"),
    power_limit: bool = typer.Option(True, "--power-limit/--no-power-limit", help="price prompt steps at the clock the "
                                     "GPU's board power limit allows (costmodels/data/power, where the profile's GPU has a "
                                     "model; pipelined loop) or at the op tables' full clock"),
    host_speed: str = typer.Option("calibration", "--host-speed", help="the host the predictions are priced on: "
                                   "calibration (the calibration's host), probe (each level at the speed a fixed host probe "
                                   "read before its replays, over the calibration's; docs/twin.md says where that holds), "
                                   "issue (the same with a fixed mixed step's forward issue timed, GPU held; profiles "
                                   "calibrated since it was recorded), or a ratio of the calibration's host time (0.5: "
                                   "twice as fast)"),
) -> None:
    """Validate the twin on this device."""
    from rich.console import Console

    from costmodels.calibration import CalibrationProfile
    from costmodels.profiled import ProfiledStepCost
    from scheduler.config import SchedulerConfig, token_budget_for
    from sim.validate import saturation_rps
    from twinfer.config import validate as validate_model
    from ui.cmd_calibrate import check_cpu_dtype
    from ui.user_errors import check_out_path

    if plot is not None:
        check_plot_path(plot)
        if sim_only:  # the plot sets measured steps against predicted ones: a sim-only run has nothing to draw
            raise TwinferError(f"--plot {plot}: plots measured vs predicted steps; --sim-only measures nothing (drop one of them)")
    fracs = parse_levels(levels)
    parse_host_speed(host_speed)   # a bad value fails before the engine build
    check_out_path(out, "--out")
    check_out_path(plot, "--plot")
    check_trace_path(trace)
    if device is not None and device not in ("cpu", "cuda"):
        raise TwinferError(f"--device {device}: expected cpu or cuda")
    if calibrate_first:
        check_cpu_dtype(device or "cpu", dtype)
    if not calibrate_first and not profile.exists():  # before the engine build (minutes on a GPU)
        raise TwinferError(f"--profile {profile}: no such file (make one with twinfer calibrate, or add --calibrate)")
    prof = None if calibrate_first else CalibrationProfile.load(profile)
    if prof is not None and prof.step is None:
        raise TwinferError(f"{profile}: no measured step model in this profile (make one with twinfer calibrate)")
    if calibrate_first and sim_only:
        raise TwinferError("--calibrate needs the executor (drop --sim-only)")
    if sim_only:   # the profile's model, dtype and device: what the simulator predicts and the report names
        model, dtype, device = sim_only_labels(prof, model, dtype, device)
    else:   # what the engine runs in, and so what the report names (it named the profile's: fp8 for an fp32 CPU run)
        device = device or "cpu"
        dtype = dtype or ("bf16" if device == "cuda" else "fp32")
    if model is None:   # the model the profile measured
        model = prof.step.model if prof is not None else "tiny"
    if prof is not None:   # before the engine build (minutes on a GPU)
        _check_profile_model(prof, model)
    con = Console()
    block_size = 64
    base_cfg = validate_model(SchedulerConfig, dict(max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                              max_num_batched_tokens=token_budget_for(max_num_seqs, max_batched_tokens), block_size=block_size,
                              async_overlap=async_overlap), "scheduler options")
    blocks = num_kv_blocks or max_num_seqs * (-(-max_model_len // block_size)) + 64
    # the requests before the engine build (minutes on a GPU): most of them past --max-model-len is refused
    reqs, clipped, longest = clamp_requests(read_requests(trace, workload, requests, block_size, seed), block_size,
                                            max_input_len, max_output_len, max_model_len)
    clip_note = context_clip_note(clipped, len(reqs), longest, max_model_len, trace or workload)
    engine = None
    if not sim_only:
        from executor.calibrate import build_engine
        t0 = time.perf_counter()
        engine = build_engine(model, num_layers, device, dtype, max_num_seqs,
                              max_model_len, num_kv_blocks=blocks, seed=seed, max_batched_tokens=max_batched_tokens)
        if engine.max_model_len < max_model_len:  # the engine would drop every longer request the simulator serves
            raise TwinferError(f"--max-model-len {max_model_len}: the engine holds {engine.max_model_len} tokens a request "
                               f"({model}'s context or the KV blocks); give --max-model-len {engine.max_model_len} or less")
        if device == "cuda":
            engine.warmup()
        con.print(f"engine built and warmed in {time.perf_counter() - t0:.1f} s")
    if calibrate_first:
        if engine is None:
            raise TwinferError("--calibrate needs the executor (drop --sim-only)")
        from executor.calibrate import calibrate as measure
        prof = measure(model, num_layers, device, dtype, engine=engine, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                       command="twinfer " + " ".join(sys.argv[1:]), log=lambda x: con.print(x, highlight=False))
        prof.save(profile)
        con.print(f"profile (measured in this process, same engine): {profile}")
    if prof.step is None:
        raise TwinferError(f"{profile}: no measured step model in this profile (make one with twinfer calibrate)")
    _check_profile_model(prof, model)
    cost = ProfiledStepCost(prof, num_layers=num_layers, power=power_limit)
    L = cost.num_layers
    if clip_note:
        con.print(f"[yellow]note:[/] {clip_note}", highlight=False)
    cap = saturation_rps(cost, sim_config(base_cfg, prof), blocks, reqs)
    con.print(f"predicted capacity {cap:.2f} requests/s ({len(reqs)} requests, {L} layers, {blocks} KV blocks of {block_size})")
    for note in cost.notes:   # the board's power limit, where the profile measured its reference loops (costmodels.power)
        if note.startswith("board power limit") or "power reference" in note:
            con.print(note, highlight=False)

    try:
        rep, samples_by_level = run_levels(cost, prof, reqs, base_cfg, blocks, fracs, engine, seed=seed, device=device,
                                           model=model, dtype=dtype, workload=trace or workload, profile_path=str(profile),
                                           capacity=cap, warm=warm, log=con, runs=runs, host_speed=host_speed)
    except KeyboardInterrupt:  # each level's table is printed as it finishes: those above are the partial results
        Console(stderr=True).print("[yellow]interrupted: the levels printed above are complete; no report and no plot written "
                  "(their errors need every level)[/]", highlight=False)
        raise typer.Exit(130) from None
    if clip_note:
        rep.notes.append(clip_note)
    if plot is not None and samples_by_level:
        con.print(f"plot: {write_plot(rep, samples_by_level, plot)}")
    if out is not None:
        Path(out).write_text(json.dumps(rep.model_dump(), indent=1) + "\n", encoding="utf-8")
        con.print(f"report: {out}")


def run_levels(cost, prof, reqs, base_cfg, blocks: int, fracs: list[float], engine=None, *, seed: int = 0, device: str = "cpu",
               model: str = "", dtype: str = "", workload: str = "", profile_path: str = "", capacity: float | None = None,
               warm: bool = True, log=None, runs: int = 1, level_warm: bool = False, temperature: float | None = None,
               host_speed: str | float = "calibration"):
    """Simulate (and, with an engine, replay) the requests at each load level; the report and the step samples per level.

    ``level_warm``: each level's trace is replayed once unmeasured before its ``runs`` measured replays (a
    methodology choice, stated in the report's notes). ``temperature``: what the replays sample with (None: what
    the profile's calibration sampled with, its provenance's ``sampling_temperature``; greedy if not recorded).

    ``host_speed``: the host the predictions are priced on (``StepProfile.at_host_speed``). ``"calibration"``
    (default): the calibration's host. ``"probe"``: each level on the host speed its replays read, the median of the
    host probe timed before each replay over the calibration's (executor/host_probe.py; the latencies measured are not
    used), the calibration's host where the profile recorded no probes or nothing is replayed. Not the default: on the
    H100 runs 45-54 it took run 54's step MAPE from 1.7-8.6% to 1.4-2.3% per level (a host 2x faster in serving than in
    calibration, probe and eager issue alike) but moved run 53's chat past saturation from 2.6% to 6.6% (a probe 68%
    slower before replays whose eager issue was within 14% of calibration's): a probe of a few milliseconds before a
    replay does not always read the host the replay runs on (docs/twin.md). ``"issue"``: the same with the issue probe
    (``executor.calibrate.issue_probe``: a fixed mixed step's forward issue with the GPU held, the launch path the
    input-build probe does not time), where the profile recorded it. A number: that ratio of the calibration's host
    time at every level."""
    from rich.console import Console

    from costmodels.calibration import host_probe_reference, host_speed_note
    from sim.validate import (STEP_SHIFT, LevelReport, StepSample, ValidationReport, check_targets, compact_samples,
                              copy_requests, error_bands, median_runs, metric_values, natural_rate, rel_errors,
                              saturation_rps, simulate_requests, step_comparison, step_sensitivity)

    con = log or Console()
    mode, fixed_speed = parse_host_speed(host_speed)
    cal_probe = prof.calibration_host_probe_s()
    moving = host_speed_note((prof.provenance or {}).get("host_probe_s"))
    if moving:   # the host terms come from a host whose speed moved (H100 runs 48, 51, 52): say so before the levels
        con.print(f"[yellow]warning:[/] {moving}", highlight=False)
    scfg = sim_config(base_cfg, prof)
    cap = capacity or saturation_rps(cost, scfg, blocks, reqs)
    r0 = natural_rate(reqs)
    names = {0: "low", 1: "knee", 2: "past saturation"} if len(fracs) == 3 else {}
    L = cost.num_layers
    prompts = {}
    if engine is not None:
        from executor.calibrate import issue_probe_or_none
        from executor.host_probe import host_probe
        from executor.replay import fresh_engine, host_counters, replay
        from ui.cmd_run import synth_prompt
        if temperature is None:   # sample as the profile's calibration did (profiles before it recorded this: greedy)
            temperature = float(prof.provenance.get("sampling_temperature", 0.0))
        vocab = engine.vocab_size
        bs = base_cfg.block_size
        prompts = {r.request_id: synth_prompt(r.block_hashes, r.prompt_len, bs, vocab, r.request_id, seed) for r in reqs}
        if warm:  # one unmeasured pass at saturation: kernel specialisations of this trace's shapes, clocks up
            t0 = time.perf_counter()
            replay(fresh_engine(engine, base_cfg), [(0.0, r.request_id, prompts[r.request_id], r.output_len) for r in reqs], temperature, seed=seed)
            # and each prompt alone (one output token; idle gaps are skipped): the single-chunk prefill shapes of low load
            replay(fresh_engine(engine, base_cfg), [(1e3 * i, r.request_id, prompts[r.request_id], 1) for i, r in enumerate(reqs)],
                   temperature, seed=seed)
            con.print(f"warm-up replay (unmeasured) {time.perf_counter() - t0:.1f} s")
    reports: list[LevelReport] = []
    samples_by_level: dict[str, list[StepSample]] = {}
    all_samples: list[StepSample] = []
    # one unit per level simulated plus one per replay: the replays are what take minutes
    bar = progress_bar(Console(stderr=True))
    task = bar.add_task("validate", total=len(fracs) * (1 + (max(1, runs) + level_warm if engine is not None else 0)))
    bar.start()
    cal_issue = host_probe_reference(prof.provenance, "issue_probe_s")
    probed = engine is not None and ((mode == "probe" and cal_probe is not None) or
                                     (mode == "issue" and cal_issue is not None))

    at_speed = {1.0: (cost, prof, scfg)}

    def priced(speed: float):
        """(cost, profile, simulator config) on a host ``speed`` times as slow as the calibration's (built once a speed)."""
        if speed not in at_speed:
            from costmodels.profiled import ProfiledStepCost
            prof_h = prof.at_host_speed(speed)
            power = cost.power if getattr(cost, "power", None) is not None else False
            at_speed[speed] = (ProfiledStepCost(prof_h, num_layers=cost.num_layers, power=power), prof_h,
                               sim_config(base_cfg, prof_h))
        return at_speed[speed]

    def predict_level(speed: float, scale: float):
        cost_h, _, scfg_h = priced(speed)
        pred = metric_values(simulate_requests(cost_h, scfg_h, blocks, copy_requests(reqs, scale), seed=seed))
        # how far each figure moves with every step 2% longer or shorter: where that exceeds a figure's target, the
        # figure sits on a step of its distribution and no step model of that accuracy holds it to the target
        return pred, step_sensitivity(cost_h, scfg_h, blocks, reqs, scale, pred, seed=seed)

    for i, f in enumerate(fracs):
        name = names.get(i, f"{f:g}x")
        rate = f * cap
        scale = (r0 / rate) if np.isfinite(r0) and rate > 0 else 1.0
        speed = 1.0 if mode in ("probe", "issue") else fixed_speed
        if not probed:
            pred, sens = predict_level(speed, scale)
        bar.advance(task)
        meas: dict | None = None   # nothing measured without an engine: every figure None (below)
        step: dict = {}
        bins: list = []
        wall = 0.0
        run_figs: list[dict] = []
        spread: dict = {}
        if engine is not None:
            items = [(r.arrival_time * scale, r.request_id, prompts[r.request_id], r.output_len) for r in reqs]
            samples = []
            steps_all = []
            if level_warm:   # the level's own shapes once, unmeasured
                replay(fresh_engine(engine, base_cfg), items, temperature, seed=seed)
                bar.advance(task)
            counters0 = host_counters(engine.runner.device)
            drift: list[float | None] = []
            issue: list[float | None] = []
            t0_unix: list[float] = []
            probes: list[float] = []
            issue_probes: list[float | None] = []
            replays = []
            for _ in range(max(1, runs)):
                probes.append(host_probe(engine.runner))   # the host's speed before this replay (executor/host_probe.py)
                issue_probes.append(issue_probe_or_none(engine, con.print))   # and its forward issue's (None off CUDA)
                t0_unix.append(round(time.time(), 3))
                res = replay(fresh_engine(engine, base_cfg), items, temperature, seed=seed)
                drift.append(decode_host_drift(res.steps, cost, prof))
                issue.append(eager_issue_drift(res.steps, cost, prof))
                bar.advance(task)
                wall += res.wall_s
                run_figs.append(metric_values(res.metrics))
                steps_all += res.steps
                replays.append(res)
            if probed:   # the host speed the replays' probes read (each timed before its replay), then the prediction
                got = [x for x in (probes if mode == "probe" else issue_probes) if x is not None]
                speed = float(np.median(got)) / (cal_probe if mode == "probe" else cal_issue) if got else 1.0
                # (a probe read past what the profile's host terms can be moved to: held there, the replays kept)
                speed = min(speed, prof.step.max_host_speed() if prof.step is not None else speed)
                speed = min(max(speed, HOST_SPEED_RANGE[0]), HOST_SPEED_RANGE[1])
                pred, sens = predict_level(speed, scale)
            cost_h, prof_h, scfg_h = priced(speed)
            for res in replays:
                predicted = predict_steps(cost_h, prof_h, res.steps, scfg_h.overlap(), replay_cold_starts(res.steps),
                                          replay_idle_gaps(res.steps))
                samples += [StepSample(decode_ctx=s.decode_ctx, prefill=s.prefill, draft_len=s.draft_len, measured_s=s.iter_s,
                                       predicted_s=float(predicted[j]), graph_bs=s.graph_bs, start_s=s.start_s, runner_s=s.runner_s, device_s=s.device_s,
                                       forward_s=s.forward_s, forward_host_s=s.forward_host_s,
                                       host_phases=s.host_phases or None, admit_s=s.admit_s, admitted=s.admitted,
                                       admitted_tokens=s.admitted_tokens, schedule_s=s.schedule_s, complete_s=s.complete_s)
                            for j, s in enumerate(res.steps) if s.num_steps == 1]
            if len(run_figs) > 1:
                meas, spread = median_runs(run_figs)
            else:
                meas, run_figs = run_figs[0], []
            step, bins = step_comparison(samples)
            samples_by_level[name] = samples
            all_samples += samples
            clocks = [s.sm_clock_mhz for s in steps_all if s.sm_clock_mhz is not None]
            prompt_clocks = [s.sm_clock_mhz for s in steps_all if s.sm_clock_mhz is not None and s.prefill]
            diag = {"steps": len(samples), "outliers_2x": sum(x.measured_s > 2 * x.predicted_s for x in samples),
                    "kernels": res.kernels,
                    # per replay: the decode steps' host part against the calibration's (decode_host_drift)
                    "decode_host_vs_calibration": [None if d is None else round(d, 4) for d in drift],
                    # per replay: the eager steps' forward issue against the calibration's measured issue terms
                    "eager_issue_vs_calibration": [None if d is None else round(d, 4) for d in issue],
                    # per replay: the Unix time its engine clock (the samples' start_s) started from, within the
                    # replay's set-up: lines the steps up with host samplers (scripts/device_matrix.sh's cpu_stat.txt)
                    "replay_t0_unix": t0_unix,
                    # per replay: a fixed host-only probe's median seconds, and against the calibration's (the median of
                    # its start / after-grid / end probes; none in profiles before they were recorded)
                    "host_probe_s": [round(p, 8) for p in probes],
                    "host_probe_vs_calibration": probe_vs_calibration(probes, prof),
                    # per replay: the issue probe's median seconds (a fixed mixed step's forward issue, GPU held) and
                    # against the calibration's (executor/host_probe.py: issue_probe)
                    "issue_probe_s": [None if p is None else round(p, 8) for p in issue_probes],
                    "issue_probe_vs_calibration": probe_vs_calibration(issue_probes, prof, "issue_probe_s"),
                    # the host speed the level's predictions were priced on (host terms x this; 1: the calibration's)
                    "host_speed_priced": round(speed, 4)}
            # over the measured replays: allocator device allocations / GC collections while serving (run 9's
            # host-bound steps ran 24-36% longer than the same shapes in the calibration grid)
            diag.update({k: v - counters0.get(k, 0) for k, v in host_counters(engine.runner.device).items()})
            if clocks:
                diag.update(sm_clock_mhz_mean=float(np.mean(clocks)), sm_clock_mhz_min=float(np.min(clocks)),
                            sm_clock_mhz_max=float(np.max(clocks)), sm_clock_samples=len(clocks))
            if prompt_clocks:   # the clock prompt steps ran at, against the grid's (a power-capped GPU runs them slower)
                diag.update(prompt_sm_clock_mhz=float(np.median(prompt_clocks)), prompt_sm_clock_samples=len(prompt_clocks),
                            grid_prompt_sm_clock_mhz=prof.step.prompt_clock_mhz() if prof.step is not None else None)
        else:
            diag = {"host_speed_priced": round(speed, 4)} if speed != 1.0 else {}
        if meas is None:
            meas = {k: None for k in pred}
        reports.append(LevelReport(name=name, rate_rps=rate, fraction_of_capacity=f, requests=len(reqs), measured=meas, predicted=pred,
                                   rel_error=rel_errors(pred, meas), step=step, step_bins=bins, measured_wall_s=wall,
                                   runs=run_figs, spread=spread, sensitivity=sens,
                                   diagnostics=diag, samples=compact_samples(samples_by_level.get(name, []))))
        _print_level(con, reports[-1])
    bar.stop()

    overall, overall_bins = step_comparison(all_samples) if all_samples else ({}, [])
    rep = ValidationReport(
        model=model, num_layers=L, dtype=dtype, device=device, profile=profile_path, provenance=dict(prof.provenance),
        scheduler=scfg.model_dump(), num_kv_blocks=blocks, workload=workload, predicted_capacity_rps=cap,
        levels=reports, step_overall={**overall, "bins": overall_bins}, command="twinfer " + " ".join(sys.argv[1:]),
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        notes=[(f"dummy weights; {L}-layer {model}; " if engine is not None else
                f"simulator only (--sim-only): nothing measured; predicts the {L}-layer {model} ({dtype}, {device}) the "
                "profile measured; ")
               + "the simulator charges the profile's runner step plus its measured engine loop "
               f"(async_overlap {'on: pipelined loop' if base_cfg.async_overlap else 'off: synchronous loop'})"]
        + (["per-step errors are on the measured batch compositions"
            + ("; a pipelined loop's step time runs from one read-back to the next, so each step also carries the "
               "launch of the step after it (an eager prefill's ~launch lands on the step before it): judge per-step "
               "errors on the synchronous loop (--no-async-overlap), end-to-end figures on either" if base_cfg.async_overlap else ""),
            "an unmeasured warm-up replay of the trace runs first" if warm else "no warm-up replay"] if engine is not None else [])
        + (["each level's trace is replayed once unmeasured before its measured replays (methodology: no measured replay "
            "pays a first-use cost of the level's step shapes)"] if (engine is not None and level_warm) else [])
        + ([f"replays sample at temperature {temperature:g} (seeded), as calibration did"] if engine is not None else [])
        + ([moving] if moving else [])
        + ([(f"each level is priced on the host speed its replays read: the host terms times the median of the "
             f"{'host' if mode == 'probe' else 'issue'} probes timed before its replays over the calibration's "
             "(diagnostics.host_speed_priced); the device terms as calibrated") if probed else
            (f"priced on a host {fixed_speed:g} times as slow as the calibration's (host terms x {fixed_speed:g})"
             if fixed_speed != 1.0 else "priced on the calibration's host speed")] if engine is not None or fixed_speed != 1.0 else [])
        + [f"sensitivity: how far each predicted figure moves when every step runs {STEP_SHIFT * 100:g}% longer or shorter (the same "
           "arrivals; the step model's own error on held-out serving is about that); a figure marked ! moves by more "
           "than its target, so a miss there says as much about where the figure sits in its distribution as about "
           "the step model"],
    )
    if engine is not None:
        rep.bands = error_bands(reports, overall)
        rep.targets = check_targets(reports, overall)
        if device == "cuda":
            from executor.calibrate import device_provenance
            rep.provenance = {**rep.provenance, "validated_on": device_provenance(device)}
        _print_summary(con, rep)
    return rep, samples_by_level


def _fmt(k: str, v) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if k == "output_throughput" else f"{v * 1e3:.1f}"


def _print_level(con, lv) -> None:
    from rich.table import Table

    from sim.validate import STEP_SHIFT, on_a_step

    runs = f", median of {len(lv.runs)} runs" if lv.runs else ""
    tab = Table(title=f"{lv.name}: {lv.rate_rps:.2f} req/s ({lv.fraction_of_capacity:g} x predicted capacity), {lv.requests} requests{runs}")
    shift = f"steps \u00b1{STEP_SHIFT * 100:g}%"
    sens = getattr(lv, "sensitivity", None) or {}   # (reports written before 2026-12-06 have none)
    cols = ("metric", "measured", "predicted", "error") + (("run spread",) if lv.runs else ()) + ((shift,) if sens else ())
    for c in cols:
        tab.add_column(c, justify="right" if c != "metric" else "left")
    for k in ("output_throughput", "tpot_p50", "tpot_p90", "ttft_p50", "ttft_p90", "itl_p50", "e2e_p50"):
        e = lv.rel_error.get(k)
        unit = " tok/s" if k == "output_throughput" else " ms"
        row = [k + unit, _fmt(k, lv.measured.get(k)), _fmt(k, lv.predicted.get(k)), "-" if e is None else f"{e * 100:+.1f}%"]
        if lv.runs:
            sp = lv.spread.get(k)
            row.append("-" if sp is None else f"{sp * 100:.1f}%")
        if sens:   # the predicted figure's move with every step STEP_SHIFT longer or shorter
            sv = sens.get(k)
            row.append("-" if sv is None else f"\u00b1{sv * 100:.1f}%" + (" !" if on_a_step(sv, k) else ""))
        tab.add_row(*row)
    if lv.step and lv.step.get("mape") is not None:   # None: no single-step sample had a prediction
        tab.add_row("per-step MAPE / p90 abs err", "", "", f"{lv.step['mape'] * 100:.1f}% / {lv.step['p90_abs_err_s'] * 1e3:.2f} ms")
    drift = [d for d in (lv.diagnostics or {}).get("decode_host_vs_calibration") or [] if d is not None]
    if drift:   # the host's speed against the calibration's: what a step model fitted there cannot know
        tab.add_row("decode host vs calibration", "", "", " / ".join(f"{d * 100:+.1f}%" for d in drift))
    iss = [d for d in (lv.diagnostics or {}).get("eager_issue_vs_calibration") or [] if d is not None]
    if iss:
        tab.add_row("eager issue vs calibration", "", "", " / ".join(f"{d * 100:+.1f}%" for d in iss))
    probe = (lv.diagnostics or {}).get("host_probe_vs_calibration") or []
    if probe:   # a fixed piece of host work timed before each replay (executor/host_probe.py), against the calibration's
        tab.add_row("host probe vs calibration", "", "", " / ".join(f"{d * 100:+.1f}%" for d in probe))
    iprobe = [d for d in (lv.diagnostics or {}).get("issue_probe_vs_calibration") or [] if d is not None]
    if iprobe:   # a fixed mixed step's forward issue timed before each replay, against the calibration's
        tab.add_row("issue probe vs calibration", "", "", " / ".join(f"{d * 100:+.1f}%" for d in iprobe))
    d = lv.diagnostics or {}
    if d.get("prompt_sm_clock_mhz") and d.get("grid_prompt_sm_clock_mhz"):
        # the step model prices device work at the clock the grid measured it at; under a sustained prefill-heavy load
        # the GPU can reach its power cap and run lower (H200 run 44: prompt steps 7% short at 1,721 vs 1,935 MHz)
        serving, grid = d["prompt_sm_clock_mhz"], d["grid_prompt_sm_clock_mhz"]
        tab.add_row("prompt steps' SM clock vs the grid's", "", "",
                    f"{serving:,.0f} vs {grid:,.0f} MHz ({(serving / grid - 1) * 100:+.1f}%)")
    con.print(tab)


def _print_summary(con, rep) -> None:
    from rich.table import Table

    tab = Table(title="per-step predicted vs measured (all levels)")
    for c in ("group", "bin", "steps", "measured ms", "predicted ms", "MAPE", "p90 abs err ms"):
        tab.add_column(c, justify="right" if c not in ("group", "bin") else "left")
    for b in rep.step_overall.get("bins", []):
        tab.add_row(b["group"], b["bin"], str(b["n"]), f"{b['measured_mean_s'] * 1e3:.2f}", f"{b['predicted_mean_s'] * 1e3:.2f}",
                    f"{b['mape'] * 100:.1f}%", f"{b['p90_abs_err_s'] * 1e3:.2f}")
    con.print(tab)
    for k, t in rep.targets.items():
        v = t["value"]
        con.print(f"target {k}: {'-' if v is None else f'{v * 100:.1f}%'} (<= {t['target'] * 100:.0f}%) "
                  + ("[green]met[/]" if t["met"] else "[red]missed[/]"))
