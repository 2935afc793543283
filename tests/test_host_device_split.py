"""The host/device split of an eager step, and the per-step path's host-to-device copies that must not wait.

On CPU: FA3's cumulative lengths are made once per chunk shape and reused; ``host_to_device`` leaves a tensor where it
is; the sampler reads its knobs on the host; the runner records how long each forward call took to return; the
calibration's one-line summary of the measured split is the arithmetic it states. The GPU side (the spin-kernel
measurement itself) runs in ``twinfer calibrate`` on a device and is archived with each matrix run.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from costmodels.step_profile import StepPoint  # noqa: E402


def test_cu_seqlens_made_once_per_shape():
    from kernels.vendor import cu_seqlens

    a = cu_seqlens(5, 12, torch.device("cpu"))
    assert a.dtype == torch.int32 and a.tolist() == [0, 5, 0, 12]
    assert cu_seqlens(5, 12, torch.device("cpu")) is a          # every layer and later step of this shape share it
    assert cu_seqlens(6, 12, torch.device("cpu")).tolist() == [0, 6, 0, 12]


def test_host_to_device_keeps_a_tensor_already_there():
    from kernels.reference import host_to_device

    t = torch.arange(4)
    assert host_to_device(t, torch.device("cpu")) is t


def test_sampler_with_host_knobs_matches_greedy_and_seeded_draws():
    from kernels.reference import sample

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    temp = torch.tensor([0.0, 0.7, 1.3])
    k, p = torch.tensor([-1, 5, -1]), torch.tensor([1.0, 1.0, 0.9])
    g = [None, torch.Generator().manual_seed(3), torch.Generator().manual_seed(4)]
    out = sample(logits, temp, k, p, g)
    assert out[0] == logits[0].argmax()
    assert logits[1].argsort(descending=True)[:5].tolist().count(int(out[1])) == 1   # within row 1's top-5
    g2 = [None, torch.Generator().manual_seed(3), torch.Generator().manual_seed(4)]
    assert torch.equal(sample(logits, temp, k, p, g2), out)                           # the same seeds, the same tokens


def test_runner_records_forward_host_seconds():
    from executor.calibrate import build_engine
    from executor.synthetic_steps import drop_plan, synthetic_plan

    engine = build_engine("tiny", None, "cpu", "fp32", 8, 128, num_kv_blocks=40)
    plan = synthetic_plan(engine, [20, 30], [(16, 0)], "hd_")
    try:
        engine.runner.execute(plan)
    finally:
        drop_plan(engine, plan)
    rec = engine.runner.step_records[0]
    assert 0 < rec["forward_host_s"] <= rec["wall_s"]


def test_queued_forward_is_absent_off_cuda():
    from executor.calibrate import build_engine, queued_forward

    engine = build_engine("tiny", None, "cpu", "fp32", 8, 128, num_kv_blocks=40)
    assert queued_forward(engine.runner, lambda: None, 0.01) == {}


def _pt(host, dev, fwd):
    return StepPoint(num_layers=2, prefill=[(64, 0)], wall_s=fwd * 1.2, forward_s=fwd, queued_host_s=host, queued_forward_s=dev)


def test_queued_split_line_states_its_arithmetic():
    from executor.calibrate import queued_split_text

    pts = [_pt(0.004, 0.006, 0.0066), _pt(0.008, 0.005, 0.008), _pt(0.003, 0.010, 0.011),
           StepPoint(num_layers=2, decode_ctx=[5], wall_s=0.002, graph_bs=1)]   # a graph step: not measured apart
    line = queued_split_text(pts)
    ratio = np.array([0.0066 / 0.006, 0.008 / 0.008, 0.011 / 0.010])
    assert "1 of 3 host-bound" in line
    assert f"median {np.median(ratio):.3f}" in line
    assert queued_split_text(pts[3:]) == ""
