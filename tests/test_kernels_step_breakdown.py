"""The decode-step breakdown's bookkeeping on CPU (the timing itself needs CUDA graphs): which calls a
forward records, which of them partition it, and that the per-kind table adds up to the pieces."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from benchmarks.gpu import step_breakdown as sb  # noqa: E402
from executor.engine import LLMEngine  # noqa: E402
from executor.forward_batch import SeqInput, build_forward_batch  # noqa: E402
from kernels import ops  # noqa: E402


@pytest.fixture(scope="module")
def recorded():
    e = LLMEngine.from_args("tiny", device="cpu", dtype="fp32", seed=0, max_model_len=256)
    r = e.runner
    seqs = [SeqInput([5 + i], 40 + i, [2 * i, 2 * i + 1], True) for i in range(3)]
    batch = build_forward_batch(seqs, r.page_size, r.kv.null_page, r.device)
    calls = sb.record_calls(r.model, batch, r.kv)
    return r.model, calls


def test_records_modules_and_vendor_ops_but_not_gemms_twice(recorded):
    model, calls = recorded
    names = [c["name"] for c in calls]
    n_layers = len(model.model.layers)
    assert names[0] == "model.embed_tokens" and names[-1] == "model.norm"
    assert sum(n.startswith("ops.mla_decode#") for n in names) == n_layers
    assert not any(n.startswith("ops.fp8_gemm") for n in names)
    assert ops.call.__name__ == "call" and ops.call.__module__ == "kernels.ops"   # the wrapper is gone


def test_pieces_partition_the_forward(recorded):
    model, calls = recorded
    pieces = [p["name"] for p in sb.pieces_of(calls, model)]
    n = len(model.model.layers)
    per_layer = ["input_layernorm", "self_attn", "post_attention_layernorm", "mlp"]
    assert pieces == ["model.embed_tokens"] + [f"model.layers.{i}.{c}" for i in range(n) for c in per_layer] + ["model.norm"]
    # every recorded call replays alone with the inputs it saw (what alone_ms captures into a graph)
    c = next(c for c in calls if c["name"] == "model.layers.0.self_attn")
    with torch.inference_mode():
        assert c["fn"](*c["args"], **c["kwargs"]).shape == c["args"][0].shape


def test_by_kind_adds_up_to_the_pieces_with_glue_named(recorded):
    model, calls = recorded
    rows = [{"name": c["name"], "kind": c["kind"], "ms": 1.0 + 0.01 * i} for i, c in enumerate(calls)]
    pieces = sb.pieces_of(calls, model)
    table = sb.by_kind(rows, pieces)
    total = sum(r["ms"] for r in rows if r["name"] in {p["name"] for p in pieces})
    assert sum(table.values()) == pytest.approx(total, abs=1e-2)
    assert "glue in MLAAttention" in table and "op:mla_decode" in table and "RMSNorm" in table
    assert table["op:mla_decode"] == pytest.approx(sum(r["ms"] for r in rows if r["kind"] == "op:mla_decode"), abs=1e-3)


class FakeEvent:
    """CUDA events on CPU: each elapsed_time is 2 ms."""

    def __init__(self, enable_timing=True):
        pass

    def record(self):
        pass

    def elapsed_time(self, other):
        return 2.0


def test_breakdown_report_adds_up_with_every_op_at_one_ms(monkeypatch):
    """The whole report on CPU (eager forward, no graph): each op 'alone' is 1 ms, each event pair 2 ms."""
    monkeypatch.setattr(sb, "alone_ms", lambda fn, iters=20, flush=None: (fn(), 1.0)[1])
    monkeypatch.setattr(sb, "L2_FLUSH_BYTES", 16)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    e = LLMEngine.from_args("tiny", device="cpu", dtype="fp32", seed=0, max_model_len=256)
    seqs = [SeqInput([5 + i], 40 + i, [2 * i, 2 * i + 1], True) for i in range(3)]
    res = sb.breakdown(e, seqs, ctx=40, iters=2)
    n = len(e.runner.model.model.layers)
    s = res["sum_alone"]
    assert s["pieces"] == 4 * n + 2 and s["pieces_missing"] == 0
    assert s["forward_ms"] == pytest.approx(4 * n + 2 + 2 * n)          # pieces + residual adds, 1 ms each
    assert s["step_ms"] == pytest.approx(s["forward_ms"] + 2)          # + logits + argmax
    assert res["forward_graph_ms"] == 2.0 and res["graph"] is False and "error" in res["in_graph"]
    assert res["ratio_forward_graph_to_sum_alone"] == pytest.approx(2.0 / s["forward_ms"], abs=1e-3)
    assert res["gaps"]["host_ms"] == pytest.approx(res["step_wall_ms"] - 2.0 - 2.0, abs=1e-3)
    assert sum(res["by_kind"].values()) == pytest.approx(4 * n + 2, abs=1e-2)
    assert all(r["ms"] == 1.0 for r in res["ops"])
    import json
    assert json.loads(json.dumps(res))["sum_alone"] == s   # the section goes into serving_step's JSON as is
