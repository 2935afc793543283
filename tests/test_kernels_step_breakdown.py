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
