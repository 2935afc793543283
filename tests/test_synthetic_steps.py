"""Synthetic steps and the eager-shape warm-up (executor/synthetic_steps.py), the matrix script's class options, and
the pinned prefill SDPA backends: on the CPU with the tiny model (no timing is asserted)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")

from executor.synthetic_steps import (drop_plan, routing_probe, synthetic_plan, token_buckets, warm_shapes,  # noqa: E402
                                      warm_steps)

ROOT = Path(__file__).resolve().parents[1]


def test_token_buckets_cover_both_divisibility_classes():
    b = token_buckets(8192)
    assert b[0] == 1 and b[-1] == 8192 and all(1 <= x <= 8192 for x in b)
    for p in (16, 64, 256, 1024, 4096):
        assert p in b and any(x % 16 and abs(x - p) <= 1 for x in b)   # the other Triton divisibility class next to it
    assert token_buckets(100)[-1] == 100 and max(token_buckets(100)) == 100


def test_warm_shapes_fit_the_engine_and_reach_its_limits():
    max_tokens, max_ctx, max_batch = 8192, 8192, 128
    shapes = warm_shapes(max_tokens, max_ctx, max_batch)
    for dc, pf in shapes:
        assert pf and all(n >= 1 and n + c < max_ctx for n, c in pf)
        assert sum(n for n, _ in pf) + len(dc) <= max_tokens and len(dc) <= max_batch
    assert max(len(pf) for _, pf in shapes) == 16                                  # many chunks in one step
    assert max(n + c for _, pf in shapes for n, c in pf) >= max_ctx - 2            # a chunk over the whole window
    assert max(len(dc) for dc, _ in shapes) == max_batch                            # decodes beside a chunk
    assert max(sum(n for n, _ in pf) for _, pf in shapes) >= max_tokens - 3        # the step budget
    # odd and even chunk lengths in one step (both divisibility classes of a chunk's length)
    assert any(len({n % 2 for n, _ in pf}) == 2 for _, pf in shapes)
    longer = warm_shapes(8192, 16384, 64)
    assert max(n + c for _, pf in longer for n, c in pf) > 8192


@pytest.fixture(scope="module")
def tiny_engine():
    from executor.calibrate import build_engine
    return build_engine("tiny", None, "cpu", "fp32", 8, 128, num_kv_blocks=40)


def test_synthetic_plan_samples_seeded_and_forgets_its_requests(tiny_engine):
    runner = tiny_engine.runner
    toks = []
    for _ in range(2):
        plan = synthetic_plan(tiny_engine, [20, 30], [(8, 4)], "t_", temperature=1.0)
        sts = [runner.states[r.request_id] for r in plan.decodes + [c.request for c in plan.prefills]]
        assert all(s.params.temperature == 1.0 and s.generator is not None for s in sts)
        toks.append(runner.execute(plan).sampled_token_ids)
        drop_plan(tiny_engine, plan)
        assert not runner.states
    assert toks[0] == toks[1]                                     # seeded per request: the same tokens again
    greedy = synthetic_plan(tiny_engine, [20], [], "g_")          # temperature 0: nothing registered (runner default)
    assert not runner.states and greedy.decodes


def test_warm_steps_runs_each_shape_twice_and_leaves_no_state(tiny_engine):
    lines = []
    rows = warm_steps(tiny_engine, [([], [(9, 0)]), ([12], [(5, 3), (4, 0)])], log=lines.append, temperature=1.0)
    assert [(r["decodes"], r["tokens"], r["chunks"], r["cached"]) for r in rows] == [(0, 9, 1, 0), (1, 9, 2, 3)]
    assert all(r["first_s"] > 0 and r["second_s"] > 0 for r in rows)
    assert len(lines) == 4 and "[2/2]" in lines[2] and not tiny_engine.runner.states


def _matrix_script():
    spec = importlib.util.spec_from_file_location("device_matrix_mod", ROOT / "scripts" / "device_matrix.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_matrix_class_options(capsys):
    m = _matrix_script()
    assert m._class_requests("reasoning=64", ["chat", "reasoning"], 96) == {"chat": 96, "reasoning": 64}
    with pytest.raises(SystemExit) as e:
        m._class_requests("reasoning=x", ["reasoning"], 96)
    assert e.value.code == 2 and "--class-requests 'reasoning=x'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        m._check_classes(["longctx"], 8192)
    assert e.value.code == 2 and "--max-model-len" in capsys.readouterr().err
    m._check_classes(["longctx", "chat"], 16384)
    with pytest.raises(SystemExit):
        m._check_classes(["nope"], 8192)
    # the longctx preset reaches past the calibration grid's contexts (decode rows to ~6k, cached chunks to 6144)
    import numpy as np

    from sim.workload import generate, preset
    name, over = m.PRESET["longctx"]
    reqs = m._clamp(generate(preset(name, num_requests=8, **over), np.random.default_rng(0), 64), *m.CLASSES["longctx"], 16384, 64)
    assert min(r.prompt_len for r in reqs) >= 8500 and max(r.prompt_len + r.output_len for r in reqs) < 16384


def test_prefill_sdpa_has_no_cudnn_backend_and_matches_the_reference():
    import torch
    from torch.nn.attention import SDPBackend

    from kernels import reference as ref
    from kernels.torch_fast import PREFILL_SDPA_BACKENDS, attention_sdpa
    assert SDPBackend.CUDNN_ATTENTION not in PREFILL_SDPA_BACKENDS and PREFILL_SDPA_BACKENDS[0] == SDPBackend.EFFICIENT_ATTENTION
    g = torch.Generator().manual_seed(0)
    q = torch.randn(5, 4, 24, generator=g, dtype=torch.float64)
    k = torch.randn(9, 4, 24, generator=g, dtype=torch.float64)
    v = torch.randn(9, 4, 16, generator=g, dtype=torch.float64)   # v head dim differs from q/k (MLA: 192 vs 128)
    pos = torch.arange(4, 9)
    assert torch.allclose(attention_sdpa(q, k, v, pos, 0.2), ref.attention(q, k, v, pos, 0.2), atol=1e-12)


def test_routing_probe_counts_experts_of_grid_and_serving_decodes(tiny_engine):
    out = routing_probe(tiny_engine, log=lambda s: None, batch=8, steps=4)
    n_exp = max(m.cfg.n_routed_experts for m in tiny_engine.runner.model.modules() if hasattr(m, "last_ids"))
    assert set(out) == {"grid_random_tokens", "serving_greedy", "serving_temperature_1", "serving_measured_temperature"}
    assert all(1 <= v <= n_exp for v in out.values()) and not tiny_engine.runner.states
