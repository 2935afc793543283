"""``twinfer tune --slo``: the one SLO syntax, TPOT at p50 only (what the policy search bounds); the rest refused."""

from __future__ import annotations

import pytest

from planner.slo import parse_slo
from twinfer.errors import TwinferError
from ui.cmd_tune import tune_slo


def test_tune_takes_tpot_p50_in_the_one_syntax():
    assert tune_slo("tpot_p50=50ms") == pytest.approx(0.05)
    assert tune_slo(None) is None
    for text, words in (("tpot_p90=50ms", "p50 only"), ("ttft_p50=1s,tpot_p50=50ms", "p50 only"), ("tpot_p50=50", "needs a unit"),
                        ("ttft_p50=1s", "tpot is required")):
        with pytest.raises(TwinferError, match=words):
            tune_slo(text)


def test_fewer_required_targets_round_trip():
    spec = parse_slo("tpot_p50=20ms", required=("tpot",))
    assert spec.ttft_s is None and parse_slo(spec.text(), required=("tpot",)) == spec and spec.text() == "tpot_p50=20ms"
    assert spec.meets(None, 0.019) and not spec.meets(None, 0.021)
