"""SimBackend: runs a StepPlan in simulated time (cost-model device time, seeded draft acceptance)."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from costmodels.host import decay_at, decay_table, pipeline_step, wall_time
from costmodels.power import PowerGovernor
from costmodels.step_memo import MemoStepCost, StepCost
from scheduler.plan import StepPlan, StepResult
from sim.streams import uniforms


def _zero() -> float:
    return 0.0


def host_coeffs(config) -> tuple[float, ...]:
    """(per step, per scheduled request, per batched token) host seconds of a SchedulerConfig: the
    loop's scheduling and input preparation, which per-rank schedulers share out (host_workers); then
    the share of it async overlap hides (the host profile's ``async_overlap_hides``); then admission, per request
    and per prompt token, charged once to the step of a request's first prompt chunk; then the seconds a step pays
    right after a prefill-bearing step (``host_after_eager_s``), and what the j-th decode step after one pays
    (``host_after_eager_decode_s``, a tuple), and that decay by the prompt step's size where measured
    (``host_after_eager_decode_by_tokens``, (tokens, tuple) pairs)."""
    w = config.host_workers
    return (config.host_step_s, config.host_per_request_s / w, config.host_per_token_s / w, config.async_overlap_hides,
            config.host_admit_s, config.host_admit_per_token_s, config.host_after_eager_s,
            tuple(config.host_after_eager_decode_s),
            tuple((int(t), tuple(v)) for t, v in config.host_after_eager_decode_by_tokens))


_NO_EXTRAS = np.zeros(0)


def loop_cost(cost_model, async_overlap):
    """The step model as the engine's loop runs it: a model that prices a pipelined loop differently
    (``ProfiledStepCost.pipelined``: max(device, host) per step) gives that variant when the loop overlaps."""
    if async_overlap and hasattr(cost_model, "pipelined"):
        return cost_model.pipelined()
    return cost_model


class SimBackend:
    """The simulator's side of the seam: ``execute(plan, stop_at) -> StepResult`` without a GPU.

    Device time comes from the cost model (one vectorised call, or a memo lookup, for a k-step
    decode plan); the loop's host overhead (``host_coeffs``, priced per plan: the plan carries no
    host cost) is added per the async-overlap rule (costmodels/host.py).
    With speculative decoding, each decode's accepted drafts are drawn first (one uniform per
    request and step, counter-based: a pure function of this backend's stream key, the step's
    index among the steps it ran, and the decode's slot; sim/streams.py) so that every step is
    priced at the contexts it really has. A k-step plan therefore gives the same tokens and times
    as k single-step plans, and a plan cut after n steps reads the same numbers as one stopped there.
    """

    def __init__(
        self,
        cost_model: StepCost | MemoStepCost,
        rng: np.random.Generator,
        acceptance_rates: list[float] | tuple[float, ...] = (),
        async_overlap: bool = True,
        kv_load_s_per_block: tuple[float, float] = (0.0, 0.0),
        host_coeffs: tuple[float, ...] = (0.0, 0.0, 0.0),
        replay_correction: Callable[[list], float] | None = None,
    ):
        self.cost = cost_model if isinstance(cost_model, MemoStepCost) else MemoStepCost(loop_cost(cost_model, async_overlap))
        # seconds a plan's resumed chunks are overcharged when their replayed tokens are needed only in the
        # lower layers (costmodels.replay.DepthCorrection); None: every replay runs through every layer
        self.replay_correction = replay_correction
        # seconds to load one KV block back from the host-memory / storage prefix-cache tier
        self.kv_load_s_per_block = kv_load_s_per_block
        # the key of the counter-based acceptance stream (sim/streams.py), seeded from ``rng``
        self._key = int(rng.integers(0, 2**63))
        self._step = 0   # steps this backend has run: the counter of the next step's draws
        # a block of the stream's future rows (steps from _u_base, all slots up to its width): the draws
        # are a pure function of (key, step, slot), so serving them from a block only saves numpy calls
        self._u_block: np.ndarray | None = None
        self._u_base = 0
        # ascending copy of the (non-increasing) marginal acceptance rates: the number of draft
        # positions accepted with uniform u is the number of rates above u
        self._rates_asc = np.sort(np.asarray(acceptance_rates, float))
        # (a 4th coefficient: the share of host work overlap hides, costmodels.host.wall_time's fraction)
        hides = host_coeffs[3] if len(host_coeffs) > 3 else 1.0
        self.async_overlap = hides if async_overlap and hides < 1.0 else async_overlap
        self.host_coeffs = tuple(host_coeffs[:3])
        # admission (per request, per prompt token), charged to the step of a request's first prompt chunk
        self.admit_coeffs = tuple(host_coeffs[4:6]) if len(host_coeffs) > 5 else (0.0, 0.0)
        # seconds the first step after a prefill-bearing plan pays (a measured profile's; 0: none), and whether the
        # last executed plan bore prefill chunks
        self.after_eager_s = float(host_coeffs[6]) if len(host_coeffs) > 6 else 0.0
        # seconds the j-th decode step after a prefill-bearing plan pays (measured; empty: after_eager_s, first
        # step only), and how many decode steps ran since the last prefill-bearing plan (None: none yet)
        self.after_decode = np.asarray(host_coeffs[7] if len(host_coeffs) > 7 else (), float)
        # that decay measured behind prompt steps of several sizes (priced at the last prompt-bearing plan's tokens,
        # costmodels.host.decay_after; empty: after_decode), and those tokens
        self.after_decode_by = decay_table(host_coeffs[8]) if len(host_coeffs) > 8 and host_coeffs[8] else None
        self._prev_tokens = 0
        self._decay: np.ndarray = self.after_decode
        self._since: int | None = None
        self._prev_prefill = False
        self._drawn: tuple[StepPlan, np.ndarray] | None = None  # the plan last priced, its drawn tokens
        # the simulated clock (the loop that drives this backend sets it): plans start at clock()
        self.clock: Callable[[], float] = _zero
        # when the device finishes the last executed plan: a plan starting later follows an idle
        # period, so its first step cannot hide its host work (costmodels/host.py, cold_start)
        self._busy_until = -math.inf
        # end times of the steps of the last executed plan (a list or an array; None for one step)
        self.ends: list[float] | np.ndarray | None = None
        # single-step decode plans read the memo directly where its decode_times is the plain one
        self._decode1 = type(self.cost).decode_times is MemoStepCost.decode_times
        # a pipelined loop (async overlap hiding all host work) is priced launch by launch (costmodels.host.
        # pipeline_step). A step model that splits a step into device and host work (a measured profile's
        # ProfiledStepCost.pipelined: ``step_parts``) prices both; any other model prices the device work and the
        # loop's host work is ``host_time`` (the scheduler config's host coefficients)
        model = self.cost.cost_model
        self._split = bool(getattr(model, "pipelined_loop", False) and hasattr(model, "step_parts"))
        self.lead = self.async_overlap is True
        self._in_flight = False       # lead mode: a plan launched and not yet read back
        self._dev_end = -math.inf     # lead mode: when the device finishes the plan in flight
        self._host_free = -math.inf   # lead mode: when the host may start launching the next plan
        self._plan_start = 0.0        # lead mode: where the last executed plan's first iteration began
        # lead mode: seconds from the clock at ``execute`` to the read-back of the plan in flight before it (that plan's
        # last iteration runs on until this plan is launched); 0 when nothing was in flight
        self.read_back_delay = 0.0
        # the board power limit (costmodels.power, a measured profile's GPU where one is committed): the averaged work
        # of the plans before sets the clock each prompt step runs at; the last executed plan's work, booked when the
        # next one starts (a cut shortens it first): (start, FLOPs and bytes per step, step counter before it). The
        # pipelined loop priced launch by launch only (validate's predict_steps prices the same sequence by the same
        # rule); a synchronous loop's steps stay at the op tables' clock
        pm = getattr(model, "power", None)
        self.governor = PowerGovernor(pm) if pm is not None and self.lead and self._split else None
        self._pending: tuple[float, tuple[float, float], int] | None = None

    def _draw_tokens(self, plan: StepPlan, steps: int) -> np.ndarray | None:
        """Tokens each decode makes in each step: 1 + accepted drafts (None without drafts: all ones)."""
        nd, d = len(plan.decodes), plan.draft_len
        if d == 0 or nd == 0:
            return None
        u = self._uniforms(steps, nd)
        rates = self._rates_asc[-d:]
        tokens = 1 + (len(rates) - np.searchsorted(rates, u, side="right")).astype(np.int64)
        self._drawn = (plan, tokens)
        return tokens

    _U_ROWS = 128   # steps per block of draws

    def _uniforms(self, steps: int, nd: int) -> np.ndarray:
        """``uniforms(key, self._step, steps, nd)``, sliced from the block of draws (refilled when it does not
        cover these steps or slots)."""
        s0, blk = self._step, self._u_block
        i = s0 - self._u_base
        if blk is None or i < 0 or i + steps > len(blk) or nd > blk.shape[1]:
            width = nd if blk is None else max(nd, blk.shape[1])
            blk = self._u_block = uniforms(self._key, s0, max(steps, self._U_ROWS), width)
            self._u_base, i = s0, 0
        return blk[i : i + steps, :nd]

    def host_time(self, plan: StepPlan) -> float:
        """Host seconds per step of ``plan``: the loop's (``loop_host_time``) and the admission of the requests whose
        first prompt chunk it runs (``admit_time``)."""
        h = self.loop_host_time(plan)
        return h + self.admit_time(plan) if plan.prefills else h

    def loop_host_time(self, plan: StepPlan) -> float:
        """The loop's host seconds per step of ``plan``: fixed + per request + per batched token (drafts included)."""
        h0, h_req, h_tok = self.host_coeffs
        chunks = plan.prefills
        n = len(plan.decodes)
        num_tokens = n * (1 + plan.draft_len)
        if chunks:
            num_tokens += chunks[0].num_new_tokens if len(chunks) == 1 else sum(c.num_new_tokens for c in chunks)
        return h0 + h_req * (n + len(chunks)) + h_tok * num_tokens

    def admit_time(self, plan: StepPlan) -> float:
        """Host seconds of admitting the requests whose first prompt chunk ``plan`` runs (``admit_coeffs``; 0 unless a
        measured profile prices it: an engine admits a request, its token checks and prefix-cache block hashes, in the
        iteration it arrives, which runs its first chunk unless every seat is taken)."""
        a0, a_tok = self.admit_coeffs
        h = 0.0
        if plan.prefills and (a0 or a_tok):
            for c in plan.prefills:
                r = c.request
                # its first chunk: nothing computed beyond its prefix hits yet (context_len alone is not enough: a
                # sliding-window replay policy resumes later chunks at a context inside the window, even 0)
                if r.num_computed_tokens == r.num_cached_tokens and r.num_output_tokens == 0 and r.num_preemptions == 0:
                    h += a0 + a_tok * r.prompt_len
        return h

    def device_times(self, plan: StepPlan) -> np.ndarray:
        """Device seconds of each of the plan's steps (draws the plan's draft acceptance)."""
        cost = self.cost
        nd = len(plan.decodes)
        tokens = self._draw_tokens(plan, plan.num_steps)
        if not plan.prefills:
            if tokens is not None and cost.sum_only:
                grown = tokens.sum(axis=1)
                sums = float(plan.decode_context_lens.sum()) + np.concatenate(([0], np.cumsum(grown[:-1])))
                return cost.decode_times_at(nd, plan.draft_len, sums)
            return cost.decode_times(plan.decode_context_lens, plan.num_steps, plan.draft_len)
        if plan.num_steps != 1:
            raise ValueError("a plan with prefill chunks runs exactly one step")
        return np.array([self._mixed_time(plan)])

    def _mixed_time(self, plan: StepPlan) -> float:
        """Device seconds of a (single-step) plan with prefill chunks."""
        chunks = plan.prefills
        if len(chunks) == 1:
            c = chunks[0]
            pn, pc = [c.num_new_tokens], [c.context_len]
        else:
            pn, pc = [c.num_new_tokens for c in chunks], [c.context_len for c in chunks]
        by_sum, cs = self.cost.chunked_sum, plan.decode_context_sum
        if by_sum is not None and cs is not None:   # the contexts matter only through their sum: no copy of them
            t = float(by_sum(len(plan.decodes), cs, plan.draft_len, pn, pc))
        else:
            t = self.cost.chunked_step_time(plan.decode_context_lens, plan.draft_len, pn, pc)
        if self.replay_correction is not None:
            t -= self.replay_correction(chunks)
        if plan.loaded_blocks[0] or plan.loaded_blocks[1]:
            # prefix blocks loaded back from host memory / storage, layer by layer under the step's
            # compute (SGLang HiCache's layer-wise overlap): the step takes the longer of the two
            host_s, storage_s = self.kv_load_s_per_block
            t = max(t, plan.loaded_blocks[0] * host_s + plan.loaded_blocks[1] * storage_s)
        return t

    def step_times(self, plan: StepPlan, cold_start: bool = False, host: float | None = None) -> np.ndarray:
        """Wall seconds of each step: device time plus host overhead (``host``, default ``host_time(plan)``)
        under the async policy."""
        if host is None:
            host = self.host_time(plan)
        if plan.num_steps == 1 and not (plan.draft_len and plan.decodes):
            # one step, nothing to draw: the same numbers with floats instead of small arrays
            return np.array([wall_time(self._first_device(plan), host, self.async_overlap, cold_start)])
        return wall_time(self.device_times(plan), host, self.async_overlap, cold_start)

    def execute(self, plan: StepPlan, stop_at: float | None = None) -> StepResult:
        """Run ``plan`` from ``clock()`` in simulated time (the seam's ``Backend``, scheduler/backend.py);
        with ``stop_at``, stop after the first step that ends at/after it.

        Steps: price the steps up to the cut (cold if the device idled since its last plan), note
        their end times (``self.ends``, for a loop that cuts the plan later) and when the device is
        free again, and report the tokens: the drawn ones with drafts, else None (one each)."""
        if self.lead:
            if self.governor is not None:
                self._book_power(plan)
            return self._execute_lead(plan, stop_at)
        self._drawn = None
        start = self.clock()
        host = self.host_time(plan)
        extras = self.transition_extras(plan)
        if extras.size:
            return self._execute_shifted(plan, start, host, stop_at, extras)
        times, ends = self._times_until(plan, start > self._busy_until, start, stop_at, host)
        return self._finish(plan, start, host, times, ends)

    def _book_power(self, plan: StepPlan) -> None:
        """Add the last executed plan's device work to the power governor (its steps that ran, from its start to when
        the device finished it) and hold ``plan``'s until the next plan starts."""
        g, p = self.governor, self._pending
        if p is not None and self._busy_until > p[0]:
            steps = self._step - p[2]
            if steps > 0:
                g.add(p[0], self._busy_until, p[1][0] * steps, p[1][1] * steps)
        model = self.cost.cost_model
        work = model.step_work(plan.decode_context_lens, plan.draft_len, [c.num_new_tokens for c in plan.prefills],
                               [c.context_len for c in plan.prefills])
        self._pending = (self.clock(), work, self._step)

    def clock_stretch(self) -> float:
        """Factor on the full-clock device time of a prompt-bearing step starting now (1 without a power model)."""
        g = self.governor
        if g is None:
            return 1.0
        return g.model.stretch(g.phi_at(self.clock()), True)

    def _first_parts(self, plan: StepPlan) -> tuple[float, float, bool, float]:
        """(device, host, eager, tail) of ``plan``'s first step in the pipelined loop, as ``_mixed_time`` and the step
        model price it: the resumed chunks' depth correction and prefix blocks loaded back on the device side."""
        chunks = plan.prefills
        d, h, eager, tail = self.cost.cost_model.step_parts(plan.decode_context_lens, plan.draft_len,
                                                             [c.num_new_tokens for c in chunks], [c.context_len for c in chunks])
        if not chunks:
            return d, h, eager, tail
        d *= self.clock_stretch()
        if self.replay_correction is not None:
            d -= self.replay_correction(chunks)
        if plan.loaded_blocks[0] or plan.loaded_blocks[1]:
            host_s, storage_s = self.kv_load_s_per_block
            d = max(d, plan.loaded_blocks[0] * host_s + plan.loaded_blocks[1] * storage_s)
        return d, h, eager, min(tail, d)

    @staticmethod
    def _context_sum(plan: StepPlan) -> int:
        """The plan's decode contexts summed (the plan's own sum where it carries one)."""
        cs = plan.decode_context_sum
        return int(np.add.reduce(plan.decode_context_lens)) if cs is None else cs

    def _first_device(self, plan: StepPlan) -> float:
        """Device seconds of ``plan``'s first step (at its contexts as scheduled, nothing drawn): a step with prefill
        chunks as ``_mixed_time`` prices it, a decode step from the memo (by its contexts' sum where the model
        prices only that). ``step_times``' one-step price and what a pipelined launch starts on the device."""
        if plan.prefills:
            return self._mixed_time(plan)
        if self._decode1 and self.cost.sum_only:
            return float(self.cost.decode_time(len(plan.decodes), plan.draft_len, self._context_sum(plan)))
        return float(self.cost.decode_times(plan.decode_context_lens, 1, plan.draft_len)[0])

    def _last_device(self, plan: StepPlan, steps: int) -> float:
        """Device seconds of the ``steps``-th (last run) step of a multi-step decode plan, at the contexts it runs at."""
        drawn = self._drawn
        if not self._split and self._decode1 and self.cost.sum_only:   # the contexts matter only through their sum
            grown = int(drawn[1][: steps - 1].sum()) if drawn is not None and drawn[0] is plan else (steps - 1) * len(plan.decodes)
            return float(self.cost.decode_time(len(plan.decodes), plan.draft_len, self._context_sum(plan) + grown))
        ctx = np.asarray(plan.decode_context_lens, np.int64)
        if drawn is not None and drawn[0] is plan:
            ctx = ctx + drawn[1][: steps - 1].sum(axis=0)
        else:
            ctx = ctx + (steps - 1)
        if not self._split:
            return float(self.cost.decode_times(ctx, 1, plan.draft_len)[0])
        return self.cost.cost_model.decode_parts(ctx, plan.draft_len)[0]

    def _execute_lead(self, plan: StepPlan, stop_at: float | None) -> StepResult:
        """``execute`` for a pipelined loop priced launch by launch (``lead``): the plan is launched behind the one in
        flight (``costmodels.host.pipeline_step``), which is read back ``read_back_delay`` seconds from now, where
        this plan's first iteration begins; with nothing in flight it starts now, launching cold. Its steps' walls:
        the first runs to the end of its device work (or, with steps behind it in the plan, to the launch of the
        second), the middle ones ``max(device, host)`` as the step model prices a run of like steps, the last to the
        end of its device work: the launch of whatever comes next extends it (the next ``execute``'s
        ``read_back_delay``)."""
        self._drawn = None
        t = self.clock()
        loop_h = self.loop_host_time(plan)
        adm = self.admit_time(plan) if plan.prefills else 0.0
        host = loop_h + adm if plan.prefills else loop_h     # host_time(plan), each part priced once
        if self._split:
            # the step model's host work includes the loop's; the admissions come on top (the engine admits before it
            # launches), and a configured loop dearer than the profile's is what the loop costs
            d1, h1, eager, tail1 = self._first_parts(plan)
            h1 = max(h1, loop_h) + adm
        else:   # device work only (the model has no host side): the loop's host work is host_time's
            d1, h1, eager, tail1 = self._first_device(plan), host, False, 0.0
        h_base = h1
        extras = self.transition_extras(plan)
        if extras.size:   # what a step pays for following a prompt step: host work of its launch (its inputs and
            h1 += float(extras[0])   # sampler, measure_after_eager), which delays the launch, not the device work
        if self._in_flight:
            launched, read_back, end1 = pipeline_step(self._dev_end, self._host_free, h1, d1, eager, tail1)
            start = read_back if read_back > t else t
        else:
            launched, _, end1 = pipeline_step(-math.inf, t, h1, d1, eager, tail1)
            start = t
        self.read_back_delay = start - t
        lead1 = end1 - start if end1 > start else 0.0
        if plan.num_steps == 1:
            # one step (three plans in four): _finish's and _launched's booking inline, with floats
            tokens = self._draw_tokens(plan, 1) if plan.draft_len and plan.decodes else None  # its drafts' acceptance
            self._prev_prefill = bool(plan.prefills)
            self._count_since(plan, 1)
            self.ends = None
            self._busy_until = self._dev_end = start + lead1
            self._step += 1
            self._plan_start = start
            self._in_flight = True
            self._host_free = start if start > launched else launched
            return StepResult(np.array([lead1]), tokens, host_s=host)
        if (stop_at is not None and not plan.draft_len and not plan.prefills and not self._split
                and self._decode1 and self.cost.sum_only):
            # a draft-free decode run cut at the next arrival (most multi-step plans): its walls and ends as floats,
            # the same numbers as the array path below (numpy's cumsum adds in order, one rounding per step)
            times, _ = self._decode_run_until(plan, False, start, stop_at, host)
            m = len(times)
            if m == 1:
                times[0] = lead1
                return self._launched(self._finish(plan, start, host, np.array(times), None), start, max(start, launched))
            times[0] = max(h1, lead1)
            times[m - 1] = self._last_device(plan, m)
            for i in range(1, min(m, extras.size)):   # a run of like steps costs max(device, host) each
                x = h_base + extras.item(i)
                if x > times[i]:
                    times[i] = x
            total, ends = 0.0, []
            for w in times:
                total += w
                ends.append(start + total)
            return self._launched(self._finish(plan, start, host, np.array(times), ends), start, ends[m - 2])
        times, ends = self._times_until(plan, False, start, stop_at, host)
        times = np.array(times, float)
        m = times.size
        if m == 1:
            times[0] = lead1
        else:
            times[0] = max(h1, lead1)
            times[m - 1] = self._last_device(plan, m)
        m = min(times.size, extras.size)
        if m > 1:
            times[1:m] = np.maximum(times[1:m], h_base + extras[1:m])
        n = times.size
        if n > 1:
            ends = start + times.cumsum()
        result = self._finish(plan, start, host, times, ends if n > 1 else None)
        return self._launched(result, start, float(ends[n - 2]) if n > 1 else max(start, launched))

    def _launched(self, result: StepResult, start: float, host_free: float) -> StepResult:
        """Book a plan launched behind the one in flight (lead mode): where its first iteration began, its device work
        in flight until ``_busy_until``, the host free to launch the next from ``host_free``."""
        self._plan_start = start
        self._in_flight = True
        self._dev_end = self._busy_until
        self._host_free = host_free
        return result

    def drain(self) -> None:
        """The loop read back its last plan with nothing launched behind it (it goes idle): the next plan starts cold."""
        self._in_flight = False

    def _finish(self, plan: StepPlan, start: float, host: float, times, ends) -> StepResult:
        """Book ``plan``'s executed steps (``times``, and ``ends`` for more than one): the state the next plan is
        priced from (whether it followed prefill chunks, decode steps since them, when the device is free, the step
        counter) and the result with the drawn tokens."""
        self._prev_prefill = bool(plan.prefills)
        n = len(times)
        self._count_since(plan, n)
        self.ends = ends
        # the same float expression the loop's clock advances by (simpy: now + delay)
        self._busy_until = start + (float(ends[n - 1]) - start) if n > 1 else start + float(times[0])
        self._step += n
        drawn = self._drawn
        tokens = drawn[1][:n] if drawn is not None and drawn[0] is plan else None
        return StepResult(times, tokens, host_s=host)

    def _count_since(self, plan: StepPlan, steps: int) -> None:
        """Decode steps since the last prefill-bearing plan, after ``plan`` ran ``steps`` steps (and, where the decay
        is measured by prompt size, the decay that plan's prompt tokens owe)."""
        if plan.prefills:
            self._since = 0
            if self.after_decode_by is not None:
                self._decay = decay_at(self.after_decode_by, sum(c.num_new_tokens for c in plan.prefills))
        elif self._since is not None:
            self._since += steps

    def transition_extras(self, plan: StepPlan) -> np.ndarray:
        """Seconds each of ``plan``'s first steps pays for following a prefill-bearing step: for a decode-only plan the
        measured decay where the profile has one (``after_eager_decode_s``: the j-th decode step after it; measured by
        prompt size, the one the last prompt-bearing plan's tokens owe), else
        ``transition_s`` on the step right after one; empty when nothing is owed."""
        decay = self._decay
        if not plan.prefills and decay.size:
            if self._since is None or self._since >= decay.size:
                return _NO_EXTRAS
            return decay[self._since:]
        if self._prev_prefill:
            x = self.transition_s(plan)
            if x:
                return np.array([x])
        return _NO_EXTRAS

    def _execute_shifted(self, plan: StepPlan, start: float, host: float, stop_at: float | None,
                         extras: np.ndarray) -> StepResult:
        """``execute`` for a plan whose first steps pay ``extras`` (seconds each, from the first): the steps priced up
        to the unshifted cut (which ends no earlier than the shifted one), shifted (every later end too), then cut
        again after the first step that ends at/after ``stop_at``."""
        times, ends = self._times_until(plan, start > self._busy_until, start, stop_at, host)
        times = np.asarray(times, float).copy()
        m = min(times.size, extras.size)
        times[:m] += extras[:m]
        if ends is not None:
            shift = np.zeros(times.size)
            shift[:m] = extras[:m]
            ends = np.asarray(ends, float) + shift.cumsum()
            if stop_at is not None and times.size > 1 and stop_at < ends[-2]:
                k = int(ends.searchsorted(stop_at, side="left")) + 1
                times, ends = times[:k], ends[:k]
        return self._finish(plan, start, host, times, ends if len(times) > 1 else None)

    def transition_s(self, plan: StepPlan) -> float:
        """Seconds ``plan``'s first step pays for following a prefill-bearing step (``after_eager_s``): the H200's
        decode graph step ran 0.25-0.37 ms and a mixed step 0.37-0.45 ms longer right after an eager step than
        after a decode step, in its inputs and sampler, not its forward (benchmarks/gpu/issue16_h200/
        after_step_probe_e4e32b0); the calibration's grid times every shape after a decode step."""
        return self.after_eager_s

    def cut(self, result: StepResult, steps: int) -> StepResult:
        """``result.first(steps)`` of the last executed plan (an arrival cut it after it was priced); the
        step counter then counts only the steps kept. Only the simulator's cluster loop needs this; the
        draws are counter-based, so the numbers of a cut plan are those of a plan that stopped by ``stop_at``."""
        self._step -= max(0, result.num_steps - steps)
        if self._since is not None and not self._prev_prefill:   # the decode steps cut off did not run
            self._since = max(0, self._since - max(0, result.num_steps - steps))
        if self.lead and self.ends is not None and steps < result.num_steps:
            # the kept last step runs to its iteration's priced end; the next launch goes from its start
            s0 = self._plan_start
            self._dev_end = s0 + (float(self.ends[steps - 1]) - s0)
            self._host_free = float(self.ends[steps - 2]) if steps > 1 else s0
            self._busy_until = self._dev_end
        return result.first(steps)

    def _times_until(self, plan: StepPlan, cold_start: bool, start_s: float, stop_at: float | None,
                     host: float) -> tuple[np.ndarray, object]:
        """``step_times`` cut after the first step that ends at/after ``stop_at`` (all steps if None), and,
        for more than one step, their end times ``start_s + cumsum(times)`` (a list or an array).

        A decode run of a memoised model without drafts is priced step by step up to the cut, so a
        long horizon cut at the next arrival costs only the steps that run (same numbers as pricing
        all of them and cutting).
        """
        if (plan.num_steps > 1 and stop_at is not None and not plan.draft_len and not plan.prefills
                and self._decode1 and self.cost.sum_only):
            times, ends = self._decode_run_until(plan, cold_start, start_s, stop_at, host)
            return np.array(times), ends
        times = self.step_times(plan, cold_start, host)
        n = len(times)
        if n == 1:
            return times, None
        ends = start_s + times.cumsum()
        if stop_at is not None and stop_at < ends[n - 2]:
            n = int(ends.searchsorted(stop_at, side="left")) + 1
            times, ends = times[:n], ends[:n]
        return times, ends

    def _decode_run_until(self, plan: StepPlan, cold_start: bool, start_s: float, stop_at: float,
                          host: float) -> tuple[list[float], list[float]]:
        """_times_until for a draft-free decode run of a sum_only memo: MemoStepCost's interpolation (its
        docstring) and wall_time for one step at a time, with floats, walking the memo's blocks inline (a
        generator for the walk cost 3-5% of the simulator's CPU time); the walls and ends as lists."""
        cost, nd = self.cost, len(plan.decodes)
        cs = plan.decode_context_sum
        u = float(np.add.reduce(plan.decode_context_lens) if cs is None else cs) / nd   # mean context in grid units (g = 1)
        i = int(u)
        frac = u - i
        keep = 1.0 - frac
        B = cost.BLOCK
        b = i // B
        j = i - b * B
        blk = cost._block(nd, 0, b)
        overlap = self.async_overlap
        times: list[float] = []
        ends: list[float] = []
        total = 0.0
        for m in range(plan.num_steps):
            a = blk.item(j)
            if j + 1 < B:
                j += 1
            else:  # the next grid point is the next block's first (as MemoStepCost._table joins them)
                b += 1
                blk = cost._block(nd, 0, b)
                j = 0
            wall = wall_time(a * keep + blk.item(j) * frac, host, overlap, cold_start and m == 0)
            times.append(wall)
            total += wall
            end = start_s + total
            ends.append(end)
            if end >= stop_at:
                break
        return times, ends
