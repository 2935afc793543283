"""Each executed step records its forward's own time beside the step's (``forward_s``, CUDA events; nan on a CPU),
and validation's step samples carry it, so a decode step's time splits into the graph replay and the rest."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from executor.engine import LLMEngine  # noqa: E402
from executor.replay import replay  # noqa: E402
from sim.validate import StepSample, compact_samples  # noqa: E402


def test_forward_time_is_recorded_per_step_and_per_sample():
    e = LLMEngine.from_args("tiny", device="cpu", dtype="fp64", seed=0,
                            scheduler_config={"block_size": 16, "max_num_batched_tokens": 64, "max_num_seqs": 4})
    res = replay(e, [(0.0, f"r{i}", [3 + i, 5, 7], 3) for i in range(2)])
    assert res.steps and all(math.isnan(s.forward_s) and math.isnan(s.device_s) for s in res.steps)
    assert "forward_s" in e.runner.step_records[-1]
    cols = compact_samples([StepSample(decode_ctx=[5], prefill=[], measured_s=0.01, device_s=0.008, forward_s=0.006),
                            StepSample(decode_ctx=[6], prefill=[], measured_s=0.01)])
    assert cols["forward_s"] == [0.006, None]
