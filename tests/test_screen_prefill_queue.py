"""The screen's prefill-pool queueing (issue 19): a load-balanced pool of many instances is many servers, not one."""

from __future__ import annotations

import numpy as np
import pytest

from planner.combine import _prefill_wait


class _Points:
    """The prefill columns ``_prefill_wait`` reads: one point, ``slots`` prompts per step of ``step`` s, one step each."""

    def __init__(self, slots: int, step: float, steps: int = 1):
        self.pre_step = np.array([step])
        self.pre_steps_per_req = np.array([steps])
        self.pre_rate = np.array([slots / (step * steps)])


def test_one_server_is_pollaczek_khinchine_md1():
    rho = np.array([0.3, 0.6, 0.85])
    p = _Points(slots=1, step=0.2)
    md1 = rho * 0.2 / (2 * (1 - rho))   # M/D/1 mean wait (Pollaczek-Khinchine), service 0.2 s
    assert _prefill_wait(rho, np.array(1.0), p, 0) == pytest.approx(md1 + 0.5 * rho * 0.2)


def test_more_servers_wait_less_at_the_same_utilisation():
    rho = np.array([0.85])
    p = _Points(slots=8, step=0.2, steps=2)
    waits = [float(_prefill_wait(rho, np.array(float(n)), p, 0)[0]) for n in (1, 2, 5, 10)]
    assert all(a > b for a, b in zip(waits, waits[1:]))
    # 5 instances x 8 slots at 85%: well under one service time (0.4 s) where one M/D/1 server waits 2.83 of them
    assert waits[2] < 0.25 * 0.4 < 2.83 * 0.4
