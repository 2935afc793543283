"""Host (CPU) work of a serving step against its device work: the one async-overlap rule.

A serving loop does host work every step (schedule, build inputs, launch, complete). Without
async overlap the CPU prepares a step, then the GPU runs it: ``device + host``. With async
overlap (SGLang's zero-overhead scheduler, vLLM async scheduling) the CPU prepares step N+1
while the GPU runs step N, so a step costs ``max(device, host)``; only the first step after an
idle period (``cold_start``) cannot hide its preparation. The planner's screen, capacity
estimates and the UI price a step with :func:`wall_time`; the simulator prices a loop that hides
all of its host work launch by launch (:func:`pipeline_step`: the host launches N+1 before it
reads N back), which over a run of like steps is the same ``max(device, host)``.

A measured runner (``StepProfile``) overlaps its own launch work with the kernels only in part:
:func:`partial_overlap` is the same rule with the exposed fraction fitted between 0 (async
overlap) and 1 (they add).

An engine's overlap may hide only part of its host work (vLLM v0's async output processor
overlaps output processing, not scheduling): ``async_overlap`` may be that fraction ``f`` in
(0, 1], and then a step costs ``max(device, f * host) + (1 - f) * host`` (``True`` is ``f = 1``).
Host profiles (:data:`HOST_PROFILES`) give each engine style its host step time and ``f``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def wall_time(device_s, host_s: float, async_overlap: bool | float, cold_start: bool = False):
    """Wall seconds of a step (a float) or of each step of a run (an array; only its first can start cold).

    ``async_overlap``: False/0 (host and device add), True/1 (host hides under device), or the fraction
    of host work the engine's overlap can hide."""
    if not async_overlap:
        return device_s + host_s
    if async_overlap is not True and async_overlap < 1.0:
        return _partly_hidden(device_s, host_s, float(async_overlap), cold_start)
    if not isinstance(device_s, np.ndarray):
        if cold_start:
            return device_s + host_s
        return device_s if device_s >= host_s else host_s
    wall = np.maximum(device_s, host_s)
    if cold_start and len(wall):
        wall[0] = device_s[0] + host_s
    return wall


def pipeline_step(in_flight_end: float, host_free: float, host_s: float, device_s: float,
                  eager: bool, tail_s: float = 0.0) -> tuple[float, float, float]:
    """One launch of a pipelined loop, which launches step N+1 before it reads step N back (the executor's
    ``LLMEngine.step_overlapped``, SGLang's overlap scheduler): ``(launched, read_back, end)``.

    The host starts launching N+1 at ``host_free`` (the read-back of N-1; with nothing in flight before N, the end
    of N's own launch) and spends ``host_s`` on it (bookkeeping, scheduling, inputs, issue): launched at
    ``host_free + host_s``. Only then does it wait for N, the step in flight, whose device work ends at
    ``in_flight_end`` (``-inf``: nothing in flight): N is read back at ``read_back = max(launched, in_flight_end)``.
    N+1's device work (``device_s``) starts behind N's. A captured CUDA graph starts when its launch is done, so it
    ends at ``max(in_flight_end, launched) + device_s``; an eager step's kernels run as they are issued, so it ends
    at ``max(start + device_s, launched + tail_s)``, ``start = max(in_flight_end, host_free)``, ``tail_s`` the device
    work issued last (the sampler's, after the forward): the device may run part of an eager step while the host
    still issues it, inside N's iteration, but not what is issued at the end of its launch.

    So an iteration (read-back N-1 to read-back N) costs ``max(host of launching N+1, what is left of N's device
    work)``: a decode step before a prompt step pays that prompt step's launch, and the prompt step's own iteration
    is shorter than its device work by what ran during that launch. Over a run of like steps this is
    ``max(device, host)`` (:func:`wall_time`); the sums over a sequence agree, the split between neighbours does not
    (H200, issue 16 runs 31-33: decode -> prompt iterations 7.5 ms where the decode's device work is 3.4 ms)."""
    launched = host_free + host_s
    read_back = launched if launched >= in_flight_end else in_flight_end
    start = in_flight_end if in_flight_end >= host_free else host_free
    if eager:
        end, last = start + device_s, launched + tail_s
        return launched, read_back, end if end >= last else last
    return launched, read_back, read_back + device_s


def pipelined_walls(device_s, host_s, eager, cold, tail_s=None, device_at=None, idle_s=None) -> np.ndarray:
    """Iteration walls of a sequence of steps run by a pipelined loop (:func:`pipeline_step`), each from the
    previous read-back (or, for a step launched with nothing in flight, ``cold``, from the start of its own launch)
    to its own read-back. ``device_s``/``host_s``: each step's device work and the host work of launching it;
    ``eager``: not a captured-graph replay; ``tail_s``: each step's device work issued last (0 where None). A step
    with nothing launched behind it (the last, or one before a cold step) is read back when its device work ends.

    ``device_at(i, t, prev_end)``, where given, prices step ``i``'s device work when the simulator's loop would
    (``sim.backend.SimBackend``): at ``t``, the end of the device work before it (or the start of its own launch when
    cold, ``idle_s[i]`` seconds after the read-back before it), ``prev_end`` where that device work ended (the power
    governor books it then: ``costmodels.power``); ``device_s`` is then unused."""
    d, h = np.asarray(device_s, float), np.asarray(host_s, float)
    n = h.size
    tl = np.zeros(n) if tail_s is None else np.asarray(tail_s, float)
    eager, cold = np.asarray(eager, bool), np.asarray(cold, bool)
    idle = np.zeros(n) if idle_s is None else np.asarray(idle_s, float)
    walls = np.zeros(n)
    if n == 0:
        return walls
    ninf = -np.inf

    def dev(i: int, t: float, prev_end: float) -> float:
        return float(d[i]) if device_at is None else float(device_at(i, t, prev_end))

    begin = 0.0                       # where the current step's iteration began
    launched, _, end = pipeline_step(ninf, 0.0, float(h[0]), dev(0, 0.0, ninf), bool(eager[0]), float(tl[0]))
    host_free = launched              # a cold step: the host launches the next one right after its own
    for i in range(n):
        if i + 1 < n and not cold[i + 1]:
            launched, read_back, nxt_end = pipeline_step(end, host_free, float(h[i + 1]), dev(i + 1, end, end), bool(eager[i + 1]),
                                                         float(tl[i + 1]))
        else:
            read_back = end
        walls[i] = read_back - begin
        if i + 1 < n:
            if cold[i + 1]:           # the next starts on an idle engine: its own launch starts its iteration
                begin = read_back + idle[i + 1]   # (relative clock: what matters is that it starts no earlier)
                launched, _, nxt_end = pipeline_step(ninf, begin, float(h[i + 1]), dev(i + 1, begin, end), bool(eager[i + 1]),
                                                     float(tl[i + 1]))
                host_free = launched
            else:
                begin, host_free = read_back, read_back
            end = nxt_end
    return walls


def _partly_hidden(device_s, host_s: float, hides: float, cold_start: bool):
    """:func:`wall_time` when overlap hides only ``hides`` of the host work: the rest runs between steps."""
    exposed = (1.0 - hides) * host_s
    if not isinstance(device_s, np.ndarray):
        return device_s + host_s if cold_start else max(device_s, hides * host_s) + exposed
    wall = np.maximum(device_s, hides * host_s) + exposed
    if cold_start and len(wall):
        wall[0] = device_s[0] + host_s
    return wall


def exposed_host(device_s: float, host_s: float, async_overlap: bool | float) -> float:
    """Host seconds a (warm) step adds to its device time under the rule of :func:`wall_time`."""
    if not async_overlap:
        return host_s
    if async_overlap is not True and async_overlap < 1.0:
        return max(0.0, async_overlap * host_s - device_s) + (1.0 - async_overlap) * host_s
    return max(0.0, host_s - device_s)


def partial_overlap(host_s, device_s, exposed: float):
    """``max(H, D) + exposed * min(H, D)``: host and device work overlapping in part (vectorised);
    ``exposed`` 0 is :func:`wall_time` with async overlap, 1 without."""
    h, d = np.asarray(host_s, float), np.asarray(device_s, float)
    return np.maximum(h, d) + exposed * np.minimum(h, d)


def layered_forward(host_s: float, device_layers, early: float) -> float:
    """Seconds of a forward whose layers the host issues one after another while the device runs what was issued:
    ``host_s`` of issue spread evenly over the layers, ``device_layers`` the device seconds of each layer in forward
    order; a layer's first ``early`` share of device work (its leading CUDA-graph piece) can start as soon as its issue
    begins, the rest once its issue is done (the eager attention between the pieces). A two-stage flow in layer
    order: a layer whose device work is shorter than its issue leaves the device waiting, which a later layer with
    more device work cannot give back. ``max(H, D)`` over the whole forward assumes it can; with DeepSeek-V3's
    first three dense layers at ~136 rows (~0.2 ms of device work against ~0.7 ms of issue with decodes beside a
    chunk) the H200's grid forwards ran 1.3-1.9 ms past their device work (runs 20-21)."""
    d = np.asarray(device_layers, float)
    if d.size == 0:
        return float(host_s)
    h = float(host_s) / d.size
    t = issued = 0.0
    for dl in d:
        t = max(t, issued) + early * dl
        issued += h
        t = max(t, issued) + (1.0 - early) * dl
    return float(t)


def flow_forward(host_s: float, device_s: float, fractions, early: float, overlap: float) -> float:
    """A forward that is not a decode-graph replay, as the executor twin prices it: ``device_s`` shared over the layers
    by ``fractions`` and run as the layered flow (:func:`layered_forward`), plus ``overlap`` x min(issue, device) that
    the forward pays beyond the flow (its start and end); the fit (``costmodels.step_fit``) and the model
    (``ProfiledStepCost.eager_forward``) both price it here."""
    return (layered_forward(host_s, float(device_s) * np.asarray(fractions, float), early)
            + overlap * min(float(host_s), float(device_s)))


def decay_table(by_tokens) -> tuple[np.ndarray, np.ndarray]:
    """(measured chunk sizes ascending, decay rows ``[size, step]`` zero-padded to the longest) of ``by_tokens``
    ((chunk tokens, [seconds per decode step]) pairs): what :func:`decay_after` interpolates, built once per profile."""
    pts = sorted((int(t), np.asarray(v, float)) for t, v in by_tokens)
    width = max((v.size for _, v in pts), default=0)
    rows = np.array([np.pad(v, (0, width - v.size)) for _, v in pts]).reshape(len(pts), width)
    return np.array([t for t, _ in pts], float), rows


def decay_after(by_tokens, tokens: float) -> np.ndarray:
    """Seconds the j-th decode step after a prompt-bearing step of ``tokens`` prompt tokens pays (j = 1..len), from
    decays measured behind chunks of several sizes (``by_tokens``: (chunk tokens, [seconds per decode step]) pairs):
    linear in the prompt tokens between the two measured sizes around it, the nearest one's outside them (no
    extrapolation); an empty array when nothing was measured. The executor calibration measures them
    (``executor.calibrate.measure_after_eager``); H200 runs 26-27: the decode step right after a 2-8k-token prompt
    step paid 0.4-0.7 ms more than one after a <= 512-token step."""
    return decay_at(decay_table(by_tokens), tokens)


def decay_at(table: tuple[np.ndarray, np.ndarray], tokens: float) -> np.ndarray:
    """:func:`decay_after` on a :func:`decay_table` built once (the simulator prices every prompt-bearing plan)."""
    xs, rows = table
    if not xs.size:
        return np.zeros(0)
    i = int(np.searchsorted(xs, tokens))
    if i == 0:
        return rows[0].copy()
    if i == xs.size:
        return rows[-1].copy()
    w = (float(tokens) - xs[i - 1]) / (xs[i] - xs[i - 1])
    return rows[i - 1] * (1.0 - w) + rows[i] * w


# ----------------------------------------------------------------------------- host profiles per engine style

@dataclass(frozen=True)
class HostProfile:
    """One engine style's host (CPU) time per step and what its async overlap hides.

    ``step_s + per_request_s * requests + per_token_s * tokens`` is the host work of one step (the scheduler
    config's ``host_step_s``, ``host_per_request_s``, ``host_per_token_s``); ``overlap_hides`` is the share of
    it that the engine's async overlap runs under the device (``async_overlap_hides``)."""

    step_s: float
    per_request_s: float
    per_token_s: float
    overlap_hides: float
    source: str

    def at(self, requests: int, tokens: int) -> float:
        """Host seconds of one step of ``requests`` requests and ``tokens`` batched tokens."""
        return self.step_s + self.per_request_s * requests + self.per_token_s * tokens


# Absolute host seconds need a device time to scale the published shares by: where a source gives only
# "host work is X of the step" or "overlap gained Y", we ASSUME the reference decode step of those write-ups,
# Llama-3-8B-class at 128 running requests on one H100, takes D_REF = 12 ms on the GPU (16 GB of BF16
# weights + KV at ~3 TB/s achieved is ~5 ms; their steps ran eager kernels, sampling and logits too).
# The split into fixed / per request / per token follows twinfer's own measured loop (most of it per
# request, a small fixed part, little per token). Confidence: the shares are published, the absolute
# scale is ours.
D_REF = 12e-3

HOST_PROFILES: dict[str, HostProfile] = {
    "twinfer-default": HostProfile(
        2.0e-3, 20e-6, 0.5e-6, 1.0,
        "twinfer's default since the first simulator (scheduler/config.py DEFAULT_HOST_*): 2 ms + 20 us/request "
        "+ 0.5 us/token, ~4.6 ms at a 128-request decode step (engine write-ups: 1-5 ms of scheduling and "
        "preparation per step); full hiding under async overlap"),
    "twinfer-executor-measured": HostProfile(
        0.34e-3, 5.7e-6, 0.055e-6, 1.0,
        "measured: twinfer's own engine loop on the H200 (profiles/h200/calibration_deepseek-v3-5layers_fp8_run7.json "
        "step.loop: 0.34 ms + 5.7 us/request + 0.055 us/token, twinfer calibrate, docs/twin.md); the pipelined "
        "loop (executor/overlap.py) schedules and launches step N+1 before reading step N back, so all of it "
        "can hide; benchmarks/gpu/async_overlap.py measures the gain"),
    "vllm-v0": HostProfile(
        3.0e-3, 45e-6, 0.5e-6, 0.25,
        "vLLM v0.5.3 (blog.vllm.ai/2024/09/05/perf-update.html): Llama-3-8B on one H100 spent 29% of the time "
        "scheduling, gathering results and preparing inputs, 38% on the GPU (the API server's 33% runs in its "
        "own process since v0.6), so host ~0.76 x device: ~9 ms at D_REF, 3 ms + 45 us/request + 0.5 us/token. "
        "Overlap: v0.6's async output processor (vllm-project/vllm PR #7049, +12% throughput) hides output "
        "processing only: 1.76 / (1.76 - x) = 1.12 gives x = 0.19 of device = 0.25 of host"),
    "vllm-v1": HostProfile(
        1.5e-3, 15e-6, 0.2e-6, 1.0,
        "vLLM V1 with --async-scheduling (vllm-project/vllm PR #19970: the scheduler runs one step ahead with "
        "output placeholders): PR #32618 measured +30.8% output throughput from async scheduling (Qwen3-30B-A3B "
        "FP8, decode-heavy 128 x 512 tokens, with pipeline parallelism), and vllm-project/tpu-inference PR #924 "
        "+39% req/s (Llama-3.2-1B): host ~0.3 x device, ~3.6 ms at D_REF: 1.5 ms + 15 us/request + 0.2 us/token; "
        "hides all of it (PR #27914: the overlap is in decode steps; prompt steps' host work is small beside "
        "their device time)"),
    "sglang": HostProfile(
        0.6e-3, 4e-6, 0.1e-6, 1.0,
        "SGLang v0.4 zero-overhead batch scheduler (lmsys.org/blog/2024-12-04-sglang-v0-4): overlap gave 1.1x "
        "throughput and an Nsight profile shows no GPU idle between consecutive decode batches, so host ~0.1 x "
        "device, fully hidden: ~1.2 ms at D_REF, 0.6 ms + 4 us/request + 0.1 us/token. WukLab "
        "(mlsys.wuklab.io/posts/scheduling_overhead) also finds SGLang's scheduling overhead far below vLLM v0's"),
    "trtllm": HostProfile(
        0.6e-3, 4e-6, 0.1e-6, 1.0,
        "TensorRT-LLM PyTorch backend overlap scheduler (on by default; nvidia.github.io/TensorRT-LLM "
        "features/overlap-scheduler: step n+1 launched before step n's stop checks and responses) publishes no "
        "per-step host figure; ASSUMED equal to SGLang's, whose design its documentation cites. Low confidence"),
}
HOST_PROFILE_NAMES = tuple(HOST_PROFILES)


def host_profile(name: str) -> HostProfile:
    """The named profile; a ValueError naming the allowed names otherwise."""
    try:
        return HOST_PROFILES[name]
    except KeyError:
        raise ValueError(f"host_profile {name!r}: expected one of {', '.join(HOST_PROFILE_NAMES)}") from None
