"""The board power limit as a step-time mechanism (issue 16).

A GPU holds its board power at its limit (the H200's 700 W) by lowering the SM clock. Under prefill-heavy load the
H200 of issue 16's matrix ran its prompt steps at a median 1,603-1,721 MHz (clock event reason 0x4, SW power cap)
where the calibration grid had timed the same shapes near its 1,980 MHz maximum, and those steps took longer than
the grid's; decode-heavy load stays near 500-550 W and at full clock. The twin's op tables are timed near full
clock, so without this mechanism every prompt step under sustained prefill load is priced too short, by an amount
that moves with the load (run 43 and run 44 of the same command: 1,849 vs 1,721 MHz at the knee).

The model, in three parts, each with physical meaning and fitted once (``benchmarks/power_fit.py``, on matrix runs'
nvidia-smi traces; the held-out runs check it):

- **power at full clock**: ``P = idle_w + busy_w * u + w_per_pflops * F + w_per_tbps * B`` over the limiter's
  averaging window: ``u`` the share of time the GPU is busy, ``F`` its FLOP rate (PFLOP/s) and ``B`` its HBM
  traffic (TB/s), the work of each step as the cost model counts it (``StepCostModel.step``'s ops);
- **the clock the limit allows**: the SM-clocked part (``w_per_pflops * F``) scales as ``phi ** gamma`` with the
  clock's fraction ``phi`` of its maximum (dynamic power ~ f V^2); the rest (idle, busy floor, HBM) does not. Where
  ``P`` exceeds ``cap_w``, ``phi = ((cap_w - P + w_F F) / (w_F F)) ** (1 / gamma)``, never below ``min_phi``;
- **how a step's device time follows the clock**: ``t = t_full * (1 + share * (1 / phi - 1))``, ``share`` measured
  per step kind (``clock_share_prompt``, ``clock_share_decode``): the part of the step's device time that runs at
  the SM clock; the rest waits on HBM, the host or fixed latencies.

``PowerGovernor`` keeps the averaged rates along a simulated timeline (an exponential average, time constant
``tau_s``) so the simulator and ``twinfer validate`` price each prompt step at the clock its history allows.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

DATA = Path(__file__).resolve().parent / "data" / "power"


class RefLoop(BaseModel):
    """One step shape run back to back for a few seconds by ``twinfer calibrate`` (``executor.calibrate.
    measure_power_reference``): its composition, its device seconds per step over the first steps (near full clock)
    and over the last half, and the board's power and SM clock over the last half (nvidia-smi, 100 ms)."""

    model_config = ConfigDict(extra="forbid")
    decode_ctx: list[int] = Field(default_factory=list, description="decode rows' contexts")
    prefill: list[tuple[int, int]] = Field(default_factory=list, description="prompt chunks (new, cached tokens)")
    steps: int = Field(..., ge=1)
    step_s_first: float = Field(..., gt=0, description="median device seconds of the first 10 steps")
    step_s_late: float = Field(..., gt=0, description="median device seconds over the last half")
    busy: float = Field(..., gt=0, le=1.0001, description="device seconds over wall seconds of the loop")
    watts: float = Field(..., gt=0, description="median board power over the last half")
    mhz: float = Field(..., gt=0, description="median SM clock over the last half")
    capped: float = Field(0.0, ge=0, le=1, description="share of the last half's samples with the SW power cap holding")


class PowerReference(BaseModel):
    """The board's own power, measured in calibration: H200 boards draw different power for the same work (issue 16:
    the board of run 44 drew 531 W where runs 40, 41 and 43's drew 487-497 W at the same decode-heavy load, and its
    clock fell under the limit where theirs held), so the clock a limit allows is the board's, not the GPU kind's.
    A decode loop (under the limit: the board's busy power at known work) and a prompt loop (over it: the power and
    clock it settles at) pin the board's terms (``PowerModel.for_board``)."""

    model_config = ConfigDict(extra="forbid")
    board: str = Field("", description="nvidia-smi uuid / serial of the board measured")
    limit_w: float | None = Field(None, gt=0, description="the board's power limit (NVML), W")
    idle_w: float = Field(..., gt=0, description="board power idle at full clock before the loops")
    max_mhz: float = Field(..., gt=0, description="the SM clock idle (the boost maximum the tables were timed near)")
    decode: RefLoop
    prompt: RefLoop


class PowerModel(BaseModel):
    """One GPU's board power against its work, its limit, and how device time follows the clock the limit allows."""

    model_config = ConfigDict(extra="forbid")
    gpu: str = Field(..., description="hardware key (costmodels.hardware), e.g. h200")
    max_mhz: float = Field(..., gt=0, description="the SM clock the op tables were timed near (the boost maximum)")
    cap_w: float = Field(..., gt=0, description="board power the limiter holds the average to (W)")
    idle_w: float = Field(..., ge=0, description="board power idle at full clock (W)")
    busy_w: float = Field(..., ge=0, description="added board power while busy, with no FLOP or HBM rate (W)")
    w_per_pflops: float = Field(..., gt=0, description="board power per PFLOP/s of tensor/CUDA-core work at full clock (W)")
    w_per_tbps: float = Field(..., ge=0, description="board power per TB/s of HBM traffic (W)")
    gamma: float = Field(..., gt=0, le=4, description="the SM-clocked power's exponent in the clock fraction")
    tau_s: float = Field(..., gt=0, le=10, description="time constant of the limiter's power average (s); with "
                         "attack_s, of the clock's return to full once the limit no longer holds it (its release)")
    attack_s: float | None = Field(None, gt=0, le=1, description="the limiter's control window (s): the clock a step "
                                   "starts at is the one the last attack_s's average power allows, where lower than "
                                   "the clock still returning (tau_s) from an earlier limit; None: one exponential "
                                   "average (tau_s) prices both")
    clock_share_prompt: float = Field(..., ge=0, le=1, description="share of a prompt-bearing step's device time that follows the SM clock")
    clock_share_decode: float = Field(..., ge=0, le=1, description="share of a decode step's device time that follows the SM clock")
    min_phi: float = Field(0.5, gt=0, le=1, description="the lowest clock fraction the model allows")
    source: str = Field("", description="what the terms were fitted on (runs, command)")
    fit: dict = Field(default_factory=dict, description="fit and held-out figures, for the record")

    def demand_w(self, busy: float, pflops: float, tbps: float) -> float:
        """Board power at full clock at busy share ``busy``, ``pflops`` PFLOP/s and ``tbps`` TB/s."""
        return self.idle_w + self.busy_w * busy + self.w_per_pflops * pflops + self.w_per_tbps * tbps

    def phi(self, busy: float, pflops: float, tbps: float) -> float:
        """The clock's fraction of ``max_mhz`` the limit allows at that average work (1: not limited)."""
        clocked = self.w_per_pflops * pflops
        over = self.demand_w(busy, pflops, tbps) - self.cap_w
        if over <= 0.0 or clocked <= 0.0:
            return 1.0
        room = clocked - over
        if room <= 0.0:
            return self.min_phi
        return max(self.min_phi, (room / clocked) ** (1.0 / self.gamma))

    def phis(self, busy, pflops, tbps):
        """``phi`` over arrays (what a fit evaluates at many moments)."""
        import numpy as np
        return np.vectorize(self.phi, otypes=[float])(busy, pflops, tbps)

    def for_board(self, ref: PowerReference, work) -> "PowerModel | None":
        """This GPU kind's model fitted to one board's reference loops (``work(decode_ctx, 0, new, cached)``: FLOPs and
        bytes of one step, as the twin counts them), or None where the loops cannot be reproduced (the board's power
        is then not modelled: full clock). The decode loop runs under the limit at full clock, so its watts are the
        board's demand there; where the prompt loop was held by the limit, its watts are the limit and its clocked part
        met it at ``phi ** gamma`` of full clock. From the two: the board's busy power and its power per FLOP (both
        loops keep the GPU busy, so an idle reading taken too early, above what the loops allow, is lowered until
        the busy power is 0) and the limit. The prompt steps' clock share stays the kind's: the loop cannot show it
        (its first steps already run under the limit, which answers within ``tau_s``). With the prompt loop not
        limited, the busy power alone, at the kind's power per FLOP. A decode loop the limit held too (a hot board:
        issue 16 run 63's H200 drew 694 W at 1,935 MHz on it) is an equation at the limit like the prompt loop's: its
        clocked part at its own clock's ``phi ** gamma``. The per-byte term, the exponent, the time constant and both clock shares stay the kind's
        (``benchmarks/power_fit.py``, ``benchmarks/power_fast_fit.py``)."""
        d, p = ref.decode, ref.prompt
        fd, bd = work(d.decode_ctx, 0, [a for a, _ in d.prefill], [c for _, c in d.prefill])
        # each loop's rates as it ran (what the governor averages: the work over the time it took)
        f_d, b_d = d.busy * fd / d.step_s_late / 1e15, d.busy * bd / d.step_s_late / 1e12
        upd: dict = {"max_mhz": ref.max_mhz, "source": self.source + f"; board {ref.board or '?'} from its calibration's "
                     "reference loops"}
        idle, w_f = ref.idle_w, self.w_per_pflops
        y_d = d.watts - self.w_per_tbps * b_d            # = idle + busy_w u_d + w_f f_d phi_d ** gamma
        d_held = d.capped >= 0.5
        if not d_held and d.mhz < ref.max_mhz - 30:   # a clock held low by something other than the power limit
            return None
        if d_held:   # the limit held the decode loop too: its clocked part ran at its clock's share of full power
            f_d *= min(1.0, d.mhz / ref.max_mhz) ** self.gamma
            upd["cap_w"] = d.watts
        phi = p.mhz / ref.max_mhz
        if p.capped >= 0.5 and phi < 0.98:
            fp, bp = work(p.decode_ctx, 0, [a for a, _ in p.prefill], [c for _, c in p.prefill])
            f_p, b_p = p.busy * fp / p.step_s_late / 1e15, p.busy * bp / p.step_s_late / 1e12
            y_p = p.watts - self.w_per_tbps * b_p        # = idle + busy_w u_p + w_f f_p phi ** gamma
            g = f_p * phi ** self.gamma
            det = d.busy * g - p.busy * f_d
            if det <= 0:
                return None
            busy_w = ((y_d - idle) * g - (y_p - idle) * f_d) / det
            w_f = (d.busy * (y_p - idle) - p.busy * (y_d - idle)) / det
            if busy_w < 0:   # idle read high: busy power 0, idle and power per FLOP from the two loops
                det0 = g - f_d
                if det0 <= 0:
                    return None
                busy_w, w_f, idle = 0.0, (y_p - y_d) / det0, (y_d * g - y_p * f_d) / det0
            upd["cap_w"] = p.watts
            # the prompt steps' clock share stays the kind's: the loop's first steps are not its full-clock time. The
            # limiter answers within ~0.1 s (``tau_s``), so by the loop's first ten steps (~0.5 s) the clock has
            # already come down; their ratio to the late steps read shares of 0.23-0.40 on the H100 boards of runs
            # 56-64 and 0.09 on run 63's hot H200, where a power probe's loops from rest, first step against settle,
            # read 0.41-0.58 (the kind's 0.5: costmodels/data/power/*.json, fit.limiter)
        else:
            busy_w = (y_d - idle - w_f * f_d) / d.busy
            if busy_w < 0:
                busy_w, idle = 0.0, y_d - w_f * f_d
        if w_f <= 0 or idle <= 0:
            return None
        upd.update(idle_w=idle, busy_w=busy_w, w_per_pflops=w_f)
        return self.model_copy(update=upd)

    def stretch(self, phi: float, prompt: bool) -> float:
        """Factor on a step's full-clock device time at clock fraction ``phi``."""
        if phi >= 1.0:
            return 1.0
        share = self.clock_share_prompt if prompt else self.clock_share_decode
        return 1.0 + share * (1.0 / phi - 1.0)


class PowerGovernor:
    """The limiter's averaged busy share, FLOP and HBM rates along one simulated timeline: ``phi_at(t)`` the clock
    fraction a step starting at ``t`` runs at, ``add(t0, t1, flops, bytes)`` a span of device work (seconds
    ``t0``..``t1``). Spans are added in time order; an idle gap decays the averages.

    Two forms. Without ``attack_s``: one exponential average (``tau_s``) of the work, the clock the one its average
    allows. With ``attack_s`` (an H100's limiter traced through NVML, ``benchmarks/gpu/issue16_h100/clock_trace_*``:
    its clock moves on ~0.1 s control periods, down by 5-8% within one period of load over the limit, back to full
    over ~0.1-0.3 s once under it): the clock a step starts at is the lower of the one the last ``attack_s``'s average
    work allows and the clock returning to full from an earlier limit at time constant ``tau_s``."""

    def __init__(self, model: PowerModel):
        self.model = model
        self.t = None          # time the averages are at
        self.u = 0.0           # busy share
        self.f = 0.0           # PFLOP/s
        self.b = 0.0           # TB/s
        self.spans: list[tuple[float, float, float, float]] = []   # (t0, t1, PF/s, TB/s) within attack_s of t
        self.phi_s, self.phi_t = 1.0, 0.0                           # the clock held (release form), as of phi_t

    def at(self, t: float) -> tuple[float, float, float]:
        """(busy share, PF/s, TB/s) averaged as of ``t`` (decayed over any idle gap since the last span; with
        ``attack_s``, the averages over the window ``t - attack_s`` .. ``t``)."""
        w = self.model.attack_s
        if w is not None:
            lo = t - w
            u = f = b = 0.0
            for a, z, fr, br in self.spans:
                d = min(z, t) - max(a, lo)
                if d > 0:
                    u, f, b = u + d, f + d * fr, b + d * br
            return u / w, f / w, b / w
        if self.t is None or t <= self.t:
            return self.u, self.f, self.b
        k = math.exp(-(t - self.t) / self.model.tau_s)
        return self.u * k, self.f * k, self.b * k

    def _held(self, t: float) -> float:
        """The clock fraction an earlier limit still holds at ``t`` (release form), returning at ``tau_s``."""
        if t <= self.phi_t:
            return self.phi_s
        return 1.0 - (1.0 - self.phi_s) * math.exp(-(t - self.phi_t) / self.model.tau_s)

    def phi_at(self, t: float) -> float:
        """Clock fraction for a step starting at ``t`` (the averages decayed over any idle gap before it)."""
        phi = self.model.phi(*self.at(t))
        if self.model.attack_s is None:
            return phi
        phi = min(phi, self._held(t))
        if t >= self.phi_t:
            self.phi_s, self.phi_t = phi, t
        return phi

    def add(self, t0: float, t1: float, flops: float, nbytes: float) -> None:
        """Device work of ``flops`` FLOPs and ``nbytes`` HBM bytes run from ``t0`` to ``t1``."""
        dt = t1 - t0
        if dt <= 0.0:
            return
        if self.t is not None and t0 < self.t:   # overlapping the last span: fold from where the averages are
            t0 = self.t
            if t1 <= t0:
                return
        if self.model.attack_s is not None:
            # the span's rates over the time it ran; spans older than the window are dropped; the clock the window
            # allows at the span's end is held from there (the limit reached during it)
            self.spans = [s for s in self.spans if s[1] > t1 - self.model.attack_s]
            self.spans.append((t0, t1, flops / dt / 1e15, nbytes / dt / 1e12))
            self.t = t1
            self.phi_at(t1)
            return
        self.u, self.f, self.b = self.at(t0)
        k = math.exp(-(t1 - t0) / self.model.tau_s)
        w = 1.0 - k
        self.u = self.u * k + w
        self.f = self.f * k + w * flops / dt / 1e15
        self.b = self.b * k + w * nbytes / dt / 1e12
        self.t = t1


@lru_cache(maxsize=16)
def power_model(gpu: str) -> PowerModel | None:
    """The committed power model of ``gpu`` (``costmodels/data/power/<gpu>.json``), None where none was measured."""
    f = DATA / f"{gpu.lower()}.json"
    if not f.is_file():
        return None
    return PowerModel.model_validate(json.loads(f.read_text()))
