"""CUDA graphs for decode steps (executor/cuda_graphs.py).

CPU: bucketing, static-input padding (a padded decode forward gives the same rows as the
unpadded one: padding only touches the null page), the graph-safe MoE pieces, and that CPU
engines stay eager. GPU (``-m gpu``): greedy tokens with graphs equal eager ones.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from executor import cuda_graphs as cg  # noqa: E402
from executor.engine import LLMEngine, SamplingParams  # noqa: E402
from executor.forward_batch import SeqInput, build_forward_batch  # noqa: E402
from executor.kv_cache import KVCache  # noqa: E402
from executor.moe import expert_counts, moe_experts_dense  # noqa: E402
from kernels import reference as ref  # noqa: E402

CPU = torch.device("cpu")


def test_capture_sizes_capped_by_max_num_seqs():
    assert cg.capture_sizes(128) == [1, 2, 4] + list(range(8, 129, 8))
    assert cg.capture_sizes(44) == [1, 2, 4, 8, 16, 24, 32, 40, 44]
    assert cg.capture_sizes(1024)[-3:] == [480, 496, 512] and len(cg.capture_sizes(1024)) == 3 + 32 + 16
    assert cg.capture_sizes(128, (1, 2, 4, 8, 16, 32, 64, 128)) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert cg.capture_sizes(1) == [1]
    assert cg.capture_sizes(6, (4, 1, 2, 2)) == [1, 2, 4]


def test_bucket_for_pads_up_to_the_next_size():
    sizes = [1, 2, 4, 8, 16, 32, 48]
    assert [cg.bucket_for(n, sizes) for n in (1, 2, 3, 5, 8, 9, 33, 48)] == [1, 2, 4, 8, 8, 16, 48, 48]
    assert cg.bucket_for(49, sizes) is None    # above the largest graph: eager
    assert cg.bucket_for(0, sizes) is None
    assert cg.bucket_for(3, []) is None


def _decode_batch(page: int, null: int, ctx=(5, 40, 17)):
    seqs = [SeqInput([3 + i], c, list(range(i * 4, i * 4 + -(-(c + 1) // page))), True) for i, c in enumerate(ctx)]
    return build_forward_batch(seqs, page, null, CPU)


def test_graphable_only_plain_decode_batches():
    b = _decode_batch(16, 99)
    assert cg.is_graphable(b)
    mtp = build_forward_batch([SeqInput([1, 2], 4, [0], True)], 16, 99, CPU)
    assert not cg.is_graphable(mtp)
    mixed = build_forward_batch([SeqInput([1], 4, [0], True), SeqInput([5, 6, 7], 0, [1], False)], 16, 99, CPU)
    assert not cg.is_graphable(mixed)
    assert not cg.graphs_supported(CPU)


def test_static_fill_pads_rows_and_table():
    b = _decode_batch(16, 99)
    st = cg.StaticInputs.allocate(8, 6, CPU)
    st.block_table.fill_(-5)   # stale contents must be overwritten
    st.fill(b, 4, 99, 16)
    v = st.batch(4, 16)
    assert v.num_decodes == 4 and v.decode_sq == 1 and not v.prefills
    assert v.input_ids.tolist() == b.input_ids.tolist() + [0]
    assert v.positions.tolist() == b.positions.tolist() + [0]
    assert v.slot_mapping.tolist() == b.slot_mapping.tolist() + [99 * 16]
    assert v.decode_seq_lens.tolist() == b.decode_seq_lens.tolist() + [1]
    w = b.decode_block_table.shape[1]
    assert torch.equal(v.decode_block_table[:3, :w], b.decode_block_table)
    assert (v.decode_block_table[:3, w:] == 99).all() and (v.decode_block_table[3] == 99).all()
    with pytest.raises(ValueError):
        st.fill(b, 2, 99, 16)


def test_padded_static_forward_matches_eager_rows():
    """What a graph replays (padded static buffers) computes the same rows as the eager batch."""
    e = LLMEngine.from_args("tiny", device="cpu", dtype="fp64", seed=0, num_kv_blocks=16, scheduler_config={"block_size": 16})
    assert e.runner.graphs is None
    kv = KVCache(e.cfg, 16, 16, CPU, torch.float64)
    g = torch.Generator().manual_seed(0)
    for t in (kv.latent, kv.index_k, kv.k, kv.v):
        if t is not None:
            t.copy_(torch.randn(t.shape, generator=g, dtype=t.dtype))
    b = _decode_batch(16, kv.null_page)
    with torch.inference_mode():
        want = e.runner.model(b, kv)   # writes the real rows' KV; the padded run rewrites the same slots
        snapshot = [t.clone() for t in (kv.latent, kv.index_k, kv.k, kv.v) if t is not None]
        st = cg.StaticInputs.allocate(8, 8, CPU)
        st.fill(b, 8, kv.null_page, 16)
        got = e.runner.model(st.batch(8, 16), kv)
    # not bit-equal: the MoE router's GEMM rounds differently for 8 rows than for 3 (~1e-8 here)
    torch.testing.assert_close(got[:3], want, rtol=1e-6, atol=1e-6)
    # padding wrote only the null page
    for before, after in zip(snapshot, [t for t in (kv.latent, kv.index_k, kv.k, kv.v) if t is not None]):
        torch.testing.assert_close(after[:, : kv.null_page], before[:, : kv.null_page], rtol=1e-6, atol=1e-6)


def test_graph_safe_moe_pieces_match_reference():
    g = torch.Generator().manual_seed(1)
    t, e, d, inter, k = 5, 6, 16, 8, 2
    x = torch.randn(t, d, generator=g, dtype=torch.float64)
    w13 = torch.randn(e, 2 * inter, d, generator=g, dtype=torch.float64) / 4
    w2 = torch.randn(e, d, inter, generator=g, dtype=torch.float64) / 4
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    w = torch.rand(t, k, generator=g, dtype=torch.float64)
    torch.testing.assert_close(moe_experts_dense(x, w, ids, w13, w2), ref.moe_experts(x, w, ids, w13, w2))
    assert expert_counts(ids, e).tolist() == torch.bincount(ids.reshape(-1), minlength=e).tolist()


def test_cpu_engine_runs_eager_and_logs_it():
    e = LLMEngine.from_args("tiny", device="cpu", dtype="fp64", seed=0, num_kv_blocks=16, cuda_graphs=True)
    assert e.runner.graphs is None and not e.runner.enable_cuda_graphs(8, 64)
    recs = []
    e.step_log = recs.append
    e.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    assert recs and all(r["cuda_graph"] is False and r["graph_bs"] == 0 for r in recs)


def _no_indexer(model):
    """``tiny`` without its DSA indexer: dense MLA like DeepSeek-V3 (DSA models are not captured)."""
    for m in model.modules():
        if getattr(m, "indexer", None) is not None:
            m.indexer = None
    return model


def test_dsa_models_are_not_captured():
    e = LLMEngine.from_args("tiny", device="cpu", dtype="fp64", seed=0, num_kv_blocks=16)
    assert "indexer" in cg.unsupported_reason(e.runner.model)
    assert cg.unsupported_reason(_no_indexer(e.runner.model)) is None


@pytest.mark.gpu
def test_gpu_dsa_model_decodes_through_the_pieces():
    """A DSA model takes no whole-forward decode graph (the indexer's top-k over each step's KV lengths): its decode
    steps replay the piecewise graphs instead (tests/test_executor_piecewise.py checks their outputs)."""
    e = LLMEngine.from_args("tiny", device="cuda", dtype="bf16", seed=0, max_model_len=256)
    assert e.runner.graphs is None and "indexer" in e.runner.graphs_off_reason
    assert e.runner.piecewise is not None and e.runner.piecewise.captured and e.runner.piecewise_off_reason is None
    recs = []
    e.step_log = recs.append
    e.generate([[5, 6, 7] * 30], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    decodes = [r for r in recs if not r["num_prefills"]]
    assert decodes and all(r["piecewise_bs"] and not r["cuda_graph"] for r in decodes)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 3, 8])
def test_gpu_graph_greedy_tokens_equal_eager(n):
    """Same decode batch, graph replay vs eager forward: hidden states close, greedy tokens equal
    (except exact near-ties: padding and the static block-table width change split-K rounding)."""
    sc = {"block_size": 64, "max_num_seqs": 8, "max_num_batched_tokens": 2048}
    e = LLMEngine.from_args("tiny", device="cuda", dtype="bf16", seed=0, scheduler_config=sc, max_model_len=512,
                            model_transform=_no_indexer, cuda_graphs=True, piecewise_graphs=False)   # pieces: test_executor_piecewise
    g = e.runner.graphs
    assert g is not None and not g.failed, g.failed
    assert g.captured == [1, 2, 4, 8]
    kv, model = e.runner.kv, e.runner.model
    gen = torch.Generator(device="cuda").manual_seed(n)
    for t in (kv.latent, kv.index_k):
        if t is not None:
            t.copy_(torch.randn(t.shape, generator=gen, device="cuda", dtype=torch.float32).to(t.dtype))
    ctx = [7 + 37 * i for i in range(n)]
    seqs = [SeqInput([11 * i + 3], c, list(range(5 * i, 5 * i + -(-(c + 1) // 64))), True) for i, c in enumerate(ctx)]
    b = build_forward_batch(seqs, 64, kv.null_page, torch.device("cuda"))
    with torch.inference_mode():
        want_h = model(b, kv)
        got_h, size = g.run(b)
        assert size == cg.bucket_for(n, g.captured)
        torch.testing.assert_close(got_h.float(), want_h.float(), rtol=5e-2, atol=5e-2)
        # logits from the hidden states in the model's own dtype (compute_logits casts to fp32)
        lw, lg = model.compute_logits(want_h), model.compute_logits(got_h)
    top2 = lw.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.05
    assert torch.equal(lw.argmax(-1)[clear], lg.argmax(-1)[clear])


@pytest.mark.gpu
def test_gpu_engine_decodes_through_graphs():
    sc = {"block_size": 64, "max_num_seqs": 8, "max_num_batched_tokens": 2048}
    ps = [[(5 * i + j) % 500 for j in range(20 + 9 * i)] for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    recs = {}
    for eager in (True, False):
        e = LLMEngine.from_args("tiny", device="cuda", dtype="bf16", seed=0, scheduler_config=sc, max_model_len=512,
                                enforce_eager=eager, model_transform=_no_indexer, cuda_graphs=True)
        recs[eager] = []
        e.step_log = recs[eager].append
        outs = e.generate(ps, params)
        assert [len(o) for o in outs] == [8, 8, 8]
    assert not any(r["cuda_graph"] or r["piecewise_bs"] for r in recs[True])
    graph_steps = [r for r in recs[False] if r["cuda_graph"]]
    assert graph_steps and all(r["num_prefills"] == 0 and r["graph_bs"] == 4 for r in graph_steps)
    # piecewise graphs are on by default next to the decode graphs: prompt steps replay them
    from executor.piecewise_graphs import enabled_by_env
    assert all(r["piecewise_bs"] >= r["num_tokens"] for r in recs[False] if r["num_prefills"]) or not enabled_by_env()
