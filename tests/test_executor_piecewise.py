"""Piecewise CUDA graphs (executor/piecewise_graphs.py) and the MLA split they rest on (executor/mla.py).

CPU: ``project``/``attend``/``output`` through separate buffers equal the layer's forward bit for bit; the piece runner
in no-capture mode (the same pieces, run eagerly through the static buffers, padded to a bucket) gives the eager
forward's hidden states (bit-identical without padding, fp64-close with it), the same tokens through the engine, and
writes no KV outside the batch's own slots and the null page; the same for a DSA model (``tiny`` with its indexer: its
per-token part inside the pieces, its top-k eager between them). GPU (``-m gpu``): the captured pieces against eager.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from costmodels.model_spec import ModelSpec, MoEConfig  # noqa: E402
from executor import piecewise_graphs as pg  # noqa: E402
from executor.engine import LLMEngine, SamplingParams  # noqa: E402
from executor.forward_batch import build_forward_batch, synthetic_seqs  # noqa: E402
from executor.kv_cache import KVCache  # noqa: E402
from executor.model_config import ExecModelConfig  # noqa: E402
from executor.weights import build_model  # noqa: E402
from twinfer.errors import TwinferError  # noqa: E402

CPU = torch.device("cpu")
PAGE = 16


def _no_indexer(model):
    """``tiny`` without its DSA indexer: dense MLA like DeepSeek-V3."""
    for m in model.modules():
        if getattr(m, "indexer", None) is not None:
            m.indexer = None
    return model


def _engine(dsa: bool = False, **kw) -> LLMEngine:
    """``tiny`` on the CPU; ``dsa``: with its DSA indexer (top-k 64 of 4 heads), else dense MLA."""
    return LLMEngine.from_args("tiny", device="cpu", dtype="fp64", seed=0, model_transform=None if dsa else _no_indexer,
                               num_kv_blocks=96, scheduler_config={"block_size": PAGE, **kw.pop("sc", {})}, **kw)


def _randomise_kv(kv: KVCache, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for t in (kv.latent, kv.index_k):
        if t is not None:
            t.copy_(torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.dtype))


def _batch(decode_ctx: list[int], prefills: list[tuple[int, int]], sq: int = 1, vocab: int = 500, page_size: int = PAGE):
    """Decodes at ``decode_ctx`` (``sq`` queries each) then prompt chunks (new, cached), each on its own pages."""
    return synthetic_seqs(decode_ctx, prefills, sq, vocab, page_size, seed=len(decode_ctx) * 31 + len(prefills))


SHAPES = {   # name -> (decode contexts, prompt chunks (new, cached), queries per decode)
    "prefill, no padding": ([], [(32, 0)], 1),
    "prefill, padded": ([], [(27, 0)], 1),
    "mixed": ([5, 40, 17], [(20, 9), (6, 0)], 1),
    "mixed over cached context": ([33], [(45, 70)], 1),
    "MTP decodes (s_q 3) + chunk": ([12, 50], [(9, 3)], 3),
    "decodes only": ([7, 19, 64, 3, 100], [], 1),
}
# with the DSA indexer (top-k 64): these rows see more than 64 keys, so its top-k and sparse attention run
DSA_SHAPES = {
    "decodes past top-k": ([7, 100, 64, 130], [], 1),
    "chunk past top-k + decodes": ([90, 12], [(20, 60), (30, 0)], 1),
    "MTP decodes past top-k + chunk": ([80, 50], [(9, 70)], 3),
}


@pytest.mark.parametrize("dtype", ["fp64", "fp8"])
@pytest.mark.parametrize("shape", ["short contexts", "past the indexer's top-k"])
@pytest.mark.parametrize("queries", [None, True])
def test_split_through_buffers_equals_layer_forward(dtype, shape, queries):
    """``project`` -> q copied into a padded static buffer -> ``attend`` writing into a static ``out`` -> ``output``:
    bit-identical to ``MLAAttention.forward``, and the same KV written (``tiny`` keeps its DSA indexer: ``project``
    writes its keys and, ``queries`` True as in a piece or where rows need a top-k, its queries; ``attend`` selects)."""
    e = LLMEngine.from_args("tiny", device="cpu", dtype=dtype, seed=0, num_kv_blocks=32, scheduler_config={"block_size": PAGE})
    model, kv = e.runner.model, e.runner.kv
    _randomise_kv(kv)
    seqs, _ = _batch([5, 40], [(20, 9), (6, 0)]) if shape == "short contexts" else _batch([5, 100], [(20, 70)])
    b = build_forward_batch(seqs, PAGE, kv.null_page, CPU)
    for layer in model.model.layers:
        attn = layer.self_attn
        x = layer.input_layernorm(model.model.embed_tokens(b.input_ids) * 1.7)
        with torch.inference_mode():
            kv_before = [t.clone() for t in (kv.latent, kv.index_k) if t is not None]
            want = attn(x, b, kv)
            kv_want = [t.clone() for t in (kv.latent, kv.index_k) if t is not None]
            for t, s in zip([t for t in (kv.latent, kv.index_k) if t is not None], kv_before):
                t.copy_(s)
            q_nope, q_pe, idx = attn.project(x, b, kv, indexer_queries=queries)
            assert (idx is None) == (queries is None and shape == "short contexts")
            t = x.shape[0]
            q = torch.full((t + 5, attn.h, attn.dn + attn.dr), float("nan"), dtype=q_nope.dtype)
            q[:t, :, : attn.dn], q[:t, :, attn.dn:] = q_nope, q_pe
            out = torch.full((t + 5, attn.h, attn.dv), float("nan"), dtype=q_nope.dtype)
            ret = attn.attend(q[:t, :, : attn.dn], q[:t, :, attn.dn:], b, kv, idx, out=out[:t])
            got = attn.output(out[:t])
        assert ret.data_ptr() == out.data_ptr()
        assert torch.equal(got, want)
        for a, w in zip([t for t in (kv.latent, kv.index_k) if t is not None], kv_want):
            assert torch.equal(a, w)


def _piece_runner(**kw) -> LLMEngine:
    e = _engine(**kw)
    assert e.runner.enable_piecewise_graphs(512, sizes=(1, 2, 4, 8, 16, 32, 48, 64, 96), capture=False, log=lambda s: None)
    return e


@pytest.mark.parametrize("shape", [(s, False) for s in SHAPES] + [(s, True) for s in list(SHAPES)[-3:] + list(DSA_SHAPES)],
                         ids=lambda p: f"{p[0]}{', DSA' if p[1] else ''}")
def test_no_capture_pieces_match_eager_forward(shape):
    """The pieces over padded static buffers give the eager forward's rows; KV writes (the latents, and a DSA model's
    indexer keys) land only in the batch's slots (same values as eager) and the null page."""
    shape, dsa = shape
    e = _piece_runner(dsa=dsa)
    runner, kv = e.runner, e.runner.kv
    dec, pre, sq = {**SHAPES, **DSA_SHAPES}[shape]
    seqs, used_pages = _batch(dec, pre, sq)
    b = build_forward_batch(seqs, PAGE, kv.null_page, CPU)
    _randomise_kv(kv, 1)
    with torch.inference_mode():
        want = runner.model(b, kv).clone()
        kv_eager = [t.clone() for t in (kv.latent, kv.index_k) if t is not None]
        _randomise_kv(kv, 1)
        got, size = runner.piecewise.run(b)
    assert size == pg.bucket_for(b.num_tokens, runner.piecewise.captured) and got.shape == want.shape
    if size == b.num_tokens:   # no padding: the very same ops on the very same rows
        assert torch.equal(got, want)
    else:   # padding changes GEMM row blocking (the existing decode-graph test sees ~1e-8 too)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    lw, lg = runner.model.compute_logits(want), runner.model.compute_logits(got)
    assert torch.equal(lw.argmax(-1), lg.argmax(-1))
    # pages outside the batch: untouched (bit for bit); the batch's pages: what eager wrote
    fresh = [t.clone() for t in (kv.latent, kv.index_k) if t is not None]
    _randomise_kv(kv, 1)
    for now, rand, eager in zip(fresh, [t for t in (kv.latent, kv.index_k) if t is not None], kv_eager):
        assert torch.equal(now[:, used_pages: kv.null_page], rand[:, used_pages: kv.null_page])
        torch.testing.assert_close(now[:, :used_pages], eager[:, :used_pages], rtol=1e-6, atol=1e-6)


def test_padding_rows_stay_out_of_real_rows():
    """Garbage in the static buffers' padding rows (a previous, larger step) changes nothing in the real rows."""
    e = _piece_runner()
    runner, kv = e.runner, e.runner.kv
    _randomise_kv(kv, 2)
    seqs, _ = _batch([9], [(30, 4)])
    b = build_forward_batch(seqs, PAGE, kv.null_page, CPU)
    with torch.inference_mode():
        first, size = runner.piecewise.run(b)
        first = first.clone()
        buf = runner.piecewise.buf
        assert size == 32 and b.num_tokens == 31
        for t in (buf.x, buf.q, buf.out, buf.hidden):
            t[b.num_tokens:].fill_(1e30)
        again, _ = runner.piecewise.run(b)
    # equal up to the reference MoE's per-expert GEMMs, whose row blocks change with where the padding rows route
    torch.testing.assert_close(again, first, rtol=1e-12, atol=1e-12)
    assert (buf.index[:, b.num_tokens:size] == buf.pad[:, b.num_tokens:size]).all()
    assert buf.index[2, b.num_tokens] == kv.null_page * PAGE


def _spy_drafts(runner, out: list):
    """Wrap ``runner._propose``: after each call, every request's drafts (the MTP layer's proposals) into ``out``."""
    propose = runner._propose

    def spy(*a, **kw):
        propose(*a, **kw)
        out.append({rid: list(st.drafts) for rid, st in sorted(runner.states.items())})
    return spy


@pytest.mark.parametrize("dsa", [False, True])
def test_engine_tokens_equal_with_no_capture_pieces(dsa):
    """Greedy generation (prompt chunks, mixed steps, MTP drafts) through the pieces gives the eager engine's tokens;
    the step log names the bucket each step replayed. DSA: prompts past the indexer's top-k (64), decodes included."""
    prompts = [[(7 * i + 3 * j) % 480 + 2 for j in range((60 + 17 * i) if dsa else (11 + 13 * i))] for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    sc = {"draft_len": 2, "max_num_seqs": 4, "max_num_batched_tokens": 40, "long_prefill_threshold": 24}
    outs, recs, drafts, pieced_drafts = {}, {}, {}, 0
    for pieces in (False, True):
        e = _piece_runner(sc=sc, dsa=dsa) if pieces else _engine(sc=sc, dsa=dsa)
        drafts[pieces] = []
        e.runner._propose = _spy_drafts(e.runner, drafts[pieces])
        if pieces:
            run_mtp = e.runner.piecewise.run_mtp

            def counted(*a, _run=run_mtp):
                nonlocal pieced_drafts
                h = _run(*a)
                pieced_drafts += h is not None
                return h
            e.runner.piecewise.run_mtp = counted
        recs[pieces] = []
        e.step_log = recs[pieces].append
        outs[pieces] = e.generate(prompts, params)
    assert outs[True] == outs[False]
    # the same drafts step for step: the MTP drafts (through the pieces there) are the eager ones
    assert drafts[True] == drafts[False] and any(any(d) for d in drafts[True])
    assert pieced_drafts > 0
    assert all(r["piecewise_bs"] == 0 for r in recs[False])
    pieced = [r for r in recs[True] if r["piecewise_bs"]]
    assert pieced and any(r["num_prefills"] for r in pieced) and any(r["decode_sq"] == 3 for r in pieced)
    assert all(r["piecewise_bs"] >= r["num_tokens"] for r in pieced)
    if dsa:   # decode-only steps too: no whole-forward decode graph takes a DSA model
        assert any(not r["num_prefills"] for r in pieced)


@pytest.mark.parametrize("dsa", [False, True])
@pytest.mark.parametrize("rows", ["main step's rows", "a draft chain step"])
def test_no_capture_mtp_pieces_match_mtp_forward(dsa, rows):
    """MTP layer 0's draft forward through its two pieces (padded static buffers, attention eager between them)
    gives ``model.mtp_forward``'s hidden states and KV writes: over a mixed MTP step's rows (past the indexer's top-k
    with ``dsa``), and over a chain step of one token per sequence (its own positions: RoPE rows gathered anew)."""
    e = _piece_runner(dsa=dsa, sc={"draft_len": 1})   # without drafts the engine builds no MTP layer
    runner, kv, model = e.runner, e.runner.kv, e.runner.model
    assert runner.piecewise.num_mtp == model.num_mtp == 1
    if rows == "a draft chain step":
        seqs, used_pages = _batch([70, 9, 100], [], 1)
    else:
        seqs, used_pages = _batch([80, 50], [(9, 70)], 3)
    b = build_forward_batch(seqs, PAGE, kv.null_page, CPU)
    g = torch.Generator().manual_seed(5)
    prev = torch.randn(b.num_tokens, model.model.embed_tokens.weight.shape[1], generator=g, dtype=torch.float64)
    _randomise_kv(kv, 3)
    with torch.inference_mode():
        runner.piecewise.run(build_forward_batch(*_batch([5], [(40, 0)])[:1], PAGE, kv.null_page, CPU))  # other rows first
        _randomise_kv(kv, 3)
        want = model.mtp_forward(0, b, prev, kv).clone()
        kv_eager = [t.clone() for t in (kv.latent, kv.index_k)]
        _randomise_kv(kv, 3)
        got = runner.piecewise.run_mtp(0, b, prev)
        assert got.data_ptr() == runner.piecewise.buf.mtp_out.data_ptr()
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)   # padded: MoE row blocks change (as above)
        for now, eager in zip((kv.latent, kv.index_k), kv_eager):
            torch.testing.assert_close(now[:, :used_pages], eager[:, :used_pages], rtol=1e-6, atol=1e-6)
        assert runner.piecewise.run_mtp(1, b, prev) is None   # one MTP layer: a second one runs eagerly


def test_batches_over_the_largest_bucket_run_eager():
    e = _piece_runner()
    seqs, _ = _batch([], [(97, 0)])
    b = build_forward_batch(seqs, PAGE, e.runner.kv.null_page, CPU)
    with torch.inference_mode():
        assert e.runner.piecewise.run(b) is None
        h, graph_bs, piece_bs = e.runner.forward(b)
    assert (graph_bs, piece_bs) == (0, 0) and h.shape[0] == 97


def test_unsupported_models_and_cpu_capture():
    dsa = LLMEngine.from_args("tiny", device="cpu", dtype="fp64", seed=0, num_kv_blocks=8)
    assert dsa.runner.enable_piecewise_graphs(64, capture=False) and dsa.runner.piecewise_off_reason is None
    spec = ModelSpec(name="toy-qwen3-moe", family="qwen3_moe", num_layers=2, hidden_size=64, vocab_size=100,
                     num_attention_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128, attention="gqa",
                     moe=MoEConfig(n_routed_experts=4, top_k=2, moe_intermediate_size=32, first_k_dense=0), max_context=256)
    gqa = build_model(ExecModelConfig.build(spec), CPU, "fp32", "dummy", seed=0)
    assert "no project/attend/output split" in pg.unsupported_reason(gqa)
    e = _engine()
    assert e.runner.piecewise is None   # CPU engines: no capture at start
    assert not e.runner.enable_piecewise_graphs(64) and e.runner.piecewise_off_reason == "not a CUDA device"


def test_token_sizes_and_switch(monkeypatch):
    assert pg.token_sizes(8192)[-1] == 4096 and pg.token_sizes(8192)[:4] == [1, 2, 4, 8]
    assert pg.token_sizes(300) == [s for s in pg.DEFAULT_TOKEN_SIZES if s < 300] + [300]
    assert len(pg.DEFAULT_TOKEN_SIZES) == len(set(pg.DEFAULT_TOKEN_SIZES)) == 63
    monkeypatch.delenv(pg.ENV, raising=False)
    assert pg.enabled_by_env() is True
    for v, want in (("0", False), ("off", False), ("1", True), ("On", True), ("", True)):
        monkeypatch.setenv(pg.ENV, v)
        assert pg.enabled_by_env() is want
    monkeypatch.setenv(pg.ENV, "maybe")
    with pytest.raises(TwinferError, match="TWINFER_PIECEWISE_GRAPHS"):
        pg.enabled_by_env()


# ----------------------------------------------------------------------------- GPU


def _gpu_engine(pieces: bool, dsa: bool = False, draft_len: int = 0) -> LLMEngine:
    sc = {"block_size": 64, "max_num_seqs": 8, "max_num_batched_tokens": 512, "draft_len": draft_len}
    return LLMEngine.from_args("tiny", device="cuda", dtype="bf16", seed=0, scheduler_config=sc, max_model_len=1024,
                               num_kv_blocks=256, model_transform=None if dsa else _no_indexer, cuda_graphs=True,
                               piecewise_graphs=pieces)


@pytest.fixture(scope="module")
def gpu_pieces():
    """One engine with decode graphs and piecewise graphs captured (capture takes a while: shared by the tests)."""
    return _gpu_engine(True)


@pytest.fixture(scope="module")
def gpu_dsa_pieces():
    """``tiny`` with its DSA indexer: piecewise graphs captured, no whole-forward decode graphs (the indexer)."""
    return _gpu_engine(True, dsa=True)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["prefill, padded", "mixed", "mixed over cached context", "MTP decodes (s_q 3) + chunk"]
                         + [f"DSA: {s}" for s in DSA_SHAPES])
def test_gpu_captured_pieces_match_eager(gpu_pieces, gpu_dsa_pieces, shape):
    """Replayed pieces vs the eager forward on the same batch: hidden states close, greedy tokens equal where the
    top-2 margin is clear (padding changes GEMM tiling), and the same hidden states as the no-capture pieces. DSA
    shapes: the indexer's keys and queries inside the pieces, its top-k (64 keys of up to 640) eager between them."""
    dsa = shape.startswith("DSA: ")
    e = gpu_dsa_pieces if dsa else gpu_pieces
    if dsa:
        shape = shape[5:]
        assert e.runner.graphs is None and "DSA indexer" in e.runner.graphs_off_reason
    pw = e.runner.piecewise
    assert pw is not None and not pw.failed, pw.failed
    assert pw.captured == pg.token_sizes(512) and all(len(g) == len(e.runner.model.model.layers) + 1 for g in pw.graphs.values())
    kv, model = e.runner.kv, e.runner.model
    gen = torch.Generator(device="cuda").manual_seed(3)
    for t in (kv.latent, kv.index_k):
        if t is not None:
            t.copy_(torch.randn(t.shape, generator=gen, device="cuda").to(t.dtype))
    dec, pre, sq = {**SHAPES, **DSA_SHAPES}[shape]
    seqs, _ = _batch(dec, [(n * 8, c * 8) for n, c in pre], sq, page_size=64)   # chunks of 48..360 tokens
    b = build_forward_batch(seqs, 64, kv.null_page, torch.device("cuda"))
    with torch.inference_mode():
        want = model(b, kv).float()
        got, size = pw.run(b)
        got = got.float().clone()
        pw.use_graphs = False
        try:
            eager_pieces, _ = pw.run(b)
        finally:
            pw.use_graphs = True
        torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-2)
        torch.testing.assert_close(got, eager_pieces.float(), rtol=1e-3, atol=1e-3)   # the graphs replay the same kernels
        lw, lg = model.compute_logits(want.to(torch.bfloat16)), model.compute_logits(got.to(torch.bfloat16))
    assert size == pg.bucket_for(b.num_tokens, pw.captured)
    top2 = lw.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.05
    assert torch.equal(lw.argmax(-1)[clear], lg.argmax(-1)[clear])


@pytest.mark.gpu
@pytest.mark.parametrize("dsa", [False, True])
def test_gpu_captured_mtp_pieces_match_mtp_forward(dsa):
    """MTP layer 0's two captured pieces (attention eager between them) vs ``model.mtp_forward`` on the same rows:
    an MTP step's rows, then a chain step of one token per sequence at its own positions. An engine that drafts
    (``draft_len`` 1) captures them; one that does not, not."""
    assert _gpu_engine(True, dsa=dsa).runner.piecewise.num_mtp == 0
    e = _gpu_engine(True, dsa=dsa, draft_len=1)
    pw, kv, model = e.runner.piecewise, e.runner.kv, e.runner.model
    assert pw.num_mtp == 1 and sorted(pw.mtp_graphs) == pw.captured
    gen = torch.Generator(device="cuda").manual_seed(4)
    for t in (kv.latent, kv.index_k):
        if t is not None:
            t.copy_(torch.randn(t.shape, generator=gen, device="cuda").to(t.dtype))
    for dec, pre, sq in (([80, 50], [(72, 560)], 3), ([70, 9, 100, 300], [], 1)):
        seqs, _ = _batch(dec, pre, sq, page_size=64)
        b = build_forward_batch(seqs, 64, kv.null_page, torch.device("cuda"))
        prev = torch.randn(b.num_tokens, model.model.embed_tokens.weight.shape[1], generator=gen, device="cuda",
                           dtype=torch.bfloat16)
        with torch.inference_mode():
            want = model.mtp_forward(0, b, prev, kv).float()
            got = pw.run_mtp(0, b, prev).float()
        torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-2)


@pytest.mark.gpu
def test_gpu_engine_uses_pieces_for_prompt_steps(gpu_pieces):
    prompts = [[(5 * i + j) % 500 for j in range(20 + 9 * i)] for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    recs = {}
    for pieces, e in ((False, _gpu_engine(False)), (True, gpu_pieces)):
        recs[pieces] = []
        e.step_log = recs[pieces].append
        outs = e.generate(prompts, params)
        assert [len(o) for o in outs] == [8, 8, 8]
    assert not any(r["piecewise_bs"] for r in recs[False])
    prompt_steps = [r for r in recs[True] if r["num_prefills"]]
    assert prompt_steps and all(r["piecewise_bs"] >= r["num_tokens"] for r in prompt_steps)
    assert any(r["cuda_graph"] for r in recs[True])   # decode-only steps still replay the whole-forward graphs
