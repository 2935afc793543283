"""GPU tiers vs the torch reference on fresh random inputs (skipped without CUDA).

Bounds: BF16 outputs of FP32-accumulated kernels land near 4e-3 relative error; we allow
1e-2 (METHOD.md: bf16 operands give 1e-3..1e-2). FP8 kernels are compared with the FP8
reference on the same quantised operands, so only accumulation order and the bf16 output
rounding differ.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

from kernels import reference as R  # noqa: E402
from kernels import registry  # noqa: E402

BF16_TOL = 1e-2


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _need(lib):
    ok, _, why = registry.probe_library(lib)
    if not ok:
        pytest.skip(f"{lib}: {why}")


@pytest.fixture
def g():
    return torch.Generator(device="cuda").manual_seed(torch.seed() % 2**31)   # fresh inputs every run


@pytest.mark.parametrize("m,n,k", [(64, 2048, 7168), (300, 576, 1536), (1024, 7168, 2048)])
def test_triton_fp8_gemm(g, m, n, k):
    from kernels.triton_fp8_gemm import fp8_gemm
    x = torch.randn(m, k, device="cuda", generator=g)
    w = torch.randn(n, k, device="cuda", generator=g) * 0.02
    xq, xs = R.quant_fp8_act(x)
    wq, ws = R.quant_fp8_weight(w)
    want = R.fp8_gemm_blockscaled(xq, xs, wq, ws, torch.float32)
    out = fp8_gemm(xq, xs, wq, ws)
    assert torch.isfinite(out).all() and rel(out, want) < BF16_TOL


@pytest.mark.parametrize("m,n,k,cfg", [(1, 576, 7168, (64, 64, 4, 3, 8)), (37, 2112, 7168, (64, 256, 4, 4, 4)),
                                       (64, 7168, 2048, (64, 128, 4, 3, 3)), (200, 1536, 7168, (128, 256, 8, 3, 2)),
                                       (1000, 24576, 1536, (64, 256, 4, 4, 1)), (129, 7168, 16384, (128, 128, 8, 4, 7))])
def test_triton_fp8_gemm_tuned_tiles_and_split_k(g, m, n, k, cfg):
    """Every tile shape and split-K the tuner may pick (benchmarks/gpu/tune_fp8_gemm.py), uneven splits included
    (7 over 128 K blocks), against the reference."""
    from kernels.triton_fp8_gemm import fp8_gemm
    x = torch.randn(m, k, device="cuda", generator=g)
    w = torch.randn(n, k, device="cuda", generator=g) * 0.02
    xq, xs = R.quant_fp8_act(x)
    wq, ws = R.quant_fp8_weight(w)
    want = R.fp8_gemm_blockscaled(xq, xs, wq, ws, torch.float32)
    out = fp8_gemm(xq, xs, wq, ws, torch.bfloat16, config=cfg)
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    assert torch.isfinite(out).all() and rel(out, want) < BF16_TOL


def test_deepgemm_fp8_gemm(g):
    _need("deepgemm")
    from kernels.vendor import deepgemm_fp8_gemm
    x = torch.randn(256, 7168, device="cuda", generator=g)
    w = torch.randn(2048, 7168, device="cuda", generator=g) * 0.02
    xq, xs = R.quant_fp8_act(x)
    wq, ws = R.quant_fp8_weight(w)
    assert rel(deepgemm_fp8_gemm(xq, xs, wq, ws), R.fp8_gemm_blockscaled(xq, xs, wq, ws, torch.float32)) < BF16_TOL


@pytest.mark.parametrize("t,fp8", [(8, False), (300, False), (8, True), (300, True)])
def test_triton_moe_experts(g, t, fp8):
    from kernels.triton_grouped_gemm import moe_experts
    e, d, i, k = 32, 1024, 256, 6
    x = torch.randn(t, d, device="cuda", generator=g).bfloat16()
    w13 = torch.randn(e, 2 * i, d, device="cuda", generator=g) / 32
    w2 = torch.randn(e, d, i, device="cuda", generator=g) / 16
    logits = torch.randn(t, e, device="cuda", generator=g)
    wt, ids = R.route_softmax_topk(logits, k)
    if fp8:
        q13 = [R.quant_fp8_weight(w) for w in w13]
        q2 = [R.quant_fp8_weight(w) for w in w2]
        args = (torch.stack([a for a, _ in q13]), torch.stack([a for a, _ in q2]),
                torch.stack([s for _, s in q13]), torch.stack([s for _, s in q2]))
        want = R.moe_experts(x.float(), wt, ids, *args)
    else:
        args = (w13.bfloat16(), w2.bfloat16())
        want = R.moe_experts(x.float(), wt, ids, w13.bfloat16().float(), w2.bfloat16().float())
    out = moe_experts(x, wt, ids, *args)
    assert torch.isfinite(out).all() and rel(out, want) < 2e-2


def _mla_inputs(g, b, s_q, h, max_len, page=64, rank=512, dr=64):
    lens = torch.randint(max_len // 2, max_len + 1, (b,), device="cuda", generator=g).to(torch.int32)
    pages = (max_len + page - 1) // page
    n_pages = b * pages + 4
    cache = torch.randn(n_pages, page, rank + dr, device="cuda", generator=g).bfloat16()
    table = torch.randperm(n_pages, device="cuda", generator=g)[: b * pages].view(b, pages).to(torch.int32)
    q = torch.randn(b, s_q, h, rank + dr, device="cuda", generator=g).bfloat16()
    return q, cache, table, lens


@pytest.mark.parametrize("s_q,h", [(1, 128), (2, 16), (1, 4)])
def test_triton_mla_decode(g, s_q, h):
    from kernels.triton_mla_decode import mla_decode
    q, cache, table, lens = _mla_inputs(g, 8, s_q, h, 700)
    want = R.mla_decode_paged(q.float(), cache.float(), table, lens, 0.04, 512)
    assert rel(mla_decode(q, cache, table, lens, 0.04, 512), want) < BF16_TOL


def test_flashmla_decode(g):
    _need("flashmla")
    from kernels.vendor import flashmla_decode
    q, cache, table, lens = _mla_inputs(g, 8, 2, 128, 700)
    want = R.mla_decode_paged(q.float(), cache.float(), table, lens, 0.04, 512)
    assert rel(flashmla_decode(q, cache, table, lens, 0.04, 512), want) < BF16_TOL


@pytest.mark.parametrize("dtype,tol", [("fp32", 1e-3), ("bf16", 0.15)])
def test_tiny_engine_on_cuda_matches_one_shot_forward(dtype, tol):
    """The tiny model through the shared Scheduler on the GPU kernels: a chunked + paged forward
    agrees with a one-shot forward on the same device. fp32 checks the plumbing tightly; in bf16
    the DSA top-k and expert routing make discrete choices that bf16 noise can flip, so the
    bound only catches gross errors."""
    from executor.engine import LLMEngine, SamplingParams
    from executor.forward_batch import SeqInput, build_forward_batch
    from executor.kv_cache import KVCache
    e = LLMEngine.from_args("tiny", device="cuda", dtype=dtype, num_kv_blocks=64,
                            scheduler_config={"block_size": 64, "max_num_batched_tokens": 96, "max_num_seqs": 4, "draft_len": 1})
    outs = e.generate([list(range(1, 200)), list(range(5, 40))], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert [len(o) for o in outs] == [8, 8]
    model, dev = e.runner.model, torch.device("cuda", 0)
    tdt = torch.float32 if dtype == "fp32" else torch.bfloat16
    seq = list(range(1, 200)) + outs[0][:-1]
    with torch.inference_mode():
        kv = KVCache(e.cfg, 4, 64, dev, tdt)
        full = model.compute_logits(model(build_forward_batch([SeqInput(seq, 0, [0, 1, 2, 3], False)], 64, kv.null_page, dev), kv))
        kv2 = KVCache(e.cfg, 4, 64, dev, tdt)
        model(build_forward_batch([SeqInput(seq[:150], 0, [3, 1, 0, 2], False)], 64, kv2.null_page, dev), kv2)
        part = model.compute_logits(model(build_forward_batch([SeqInput(seq[150:], 150, [3, 1, 0, 2], True)], 64, kv2.null_page, dev), kv2))
    assert rel(part, full[150:]) < tol
    if dtype == "fp32":   # greedy tokens equal teacher-forced argmax of the one-shot forward
        assert full[198:].argmax(-1).tolist() == outs[0]


def _fp8_moe(g, t, e=32, d=1024, i=256, k=6):
    x = torch.randn(t, d, device="cuda", generator=g).bfloat16()
    q13 = [R.quant_fp8_weight(w) for w in torch.randn(e, 2 * i, d, device="cuda", generator=g) / 32]
    q2 = [R.quant_fp8_weight(w) for w in torch.randn(e, d, i, device="cuda", generator=g) / 16]
    wt, ids = R.route_softmax_topk(torch.randn(t, e, device="cuda", generator=g), k)
    return x, wt, ids, torch.stack([a for a, _ in q13]), torch.stack([a for a, _ in q2]), \
        torch.stack([s for _, s in q13]), torch.stack([s for _, s in q2])


@pytest.mark.parametrize("t", [1, 64, 128, 129, 600])   # masked up to 128 tokens, contiguous above
def test_deepgemm_fused_moe(g, t):
    _need("deepgemm")
    from kernels.vendor import deepgemm_fused_moe
    x, wt, ids, w13, w2, s13, s2 = _fp8_moe(g, t)
    want = R.moe_experts(x.float(), wt, ids, w13, w2, s13, s2)
    out = deepgemm_fused_moe(x, wt, ids, w13, w2, s13, s2)
    assert torch.isfinite(out).all() and rel(out, want) < 2e-2


def test_deepgemm_fused_moe_captures_in_a_cuda_graph(g):
    _need("deepgemm")
    from kernels.vendor import deepgemm_fused_moe
    for t in (32, 300):             # masked and contiguous layouts
        x, wt, ids, w13, w2, s13, s2 = _fp8_moe(g, t)
        eager = deepgemm_fused_moe(x, wt, ids, w13, w2, s13, s2)   # JIT outside capture
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            out = deepgemm_fused_moe(x, wt, ids, w13, w2, s13, s2)
        ids.copy_(ids.flip(0))          # new routing, same static buffers: the replay must follow it
        graph.replay()
        torch.cuda.synchronize()
        assert rel(out, deepgemm_fused_moe(x, wt, ids, w13, w2, s13, s2)) < 1e-3 and rel(out, eager) > 1e-3


@pytest.mark.parametrize("m,k,stride", [(1, 7168, 7168), (37, 1536, 1536), (300, 512, 576), (4096, 2048, 2048)])
def test_triton_quant_fp8_act_bit_equal(g, m, k, stride):
    """The fused quantisation equals the reference on the same GPU bit for bit: codes and scales (the scale is ATen's
    CUDA ``amax / 448``, a multiply by fp32(1/448)); rows may be a column slice (stride > k)."""
    _need("triton")
    from kernels.triton_rowwise import quant_fp8_act
    x = (torch.randn(m, stride, device="cuda", generator=g) * 3).to(torch.bfloat16)[:, :k]
    q, s = quant_fp8_act(x)
    q0, s0 = R.quant_fp8_act(x)
    assert torch.equal(s, s0)
    assert torch.equal(q.view(torch.uint8), q0.view(torch.uint8))


# --- the fused MoE's layout kernels (kernels/triton_moe_layout.py) ---------------------------------------------------

def _layouts(ids, e):
    """(name, dest, rows, rows_per_batch) of both DeepGEMM layouts for these routing ids."""
    from kernels import fused_moe as F
    dm, _, max_m = F.masked_layout(ids, e)
    dc, m_idx = F.contiguous_layout(ids, e)
    return [("masked", dm, e * max_m, max_m), ("contiguous", dc, m_idx.numel(), m_idx.numel())]


def test_triton_moe_permute_quant_bit_equal(g):
    """Each token quantised once and copied to its k rows: codes and scales bit-equal to ``reference.quant_fp8_act`` of
    the token on the same GPU; scales stored MN-major (DeepGEMM's SM90 layout, so it skips its transpose)."""
    _need("triton")
    from kernels.triton_moe_layout import permute_quant
    t, e, k, d = 300, 32, 6, 1024
    x = (torch.randn(t, d, device="cuda", generator=g) * 3).bfloat16()
    ids = torch.rand(t, e, device="cuda", generator=g).topk(k, dim=-1).indices
    q0, s0 = R.quant_fp8_act(x)
    tok = torch.arange(t * k, device="cuda") // k
    for name, dest, rows, rpb in _layouts(ids, e):
        q, s = permute_quant(x, dest, rows, rpb)
        flat_s = s.reshape(-1, s.shape[-1]) if s.dim() == 3 else s
        assert s.stride(-2) == 1, name
        assert torch.equal(q[dest].view(torch.uint8), q0[tok].view(torch.uint8)), name
        assert torch.equal(flat_s[dest], s0[tok]), name


def test_triton_moe_silu_quant_and_combine(g):
    """SiLU-and-mul + re-quantisation on the pairs' rows against the torch glue (fp32 SiLU, bf16 rounding, reference
    quantisation: codes equal but for rare last-bit exp differences), and the combine against an fp64 weighted sum
    (bf16 output: rel < 4e-3)."""
    _need("triton")
    from kernels import fused_moe as F
    from kernels.triton_moe_layout import combine, silu_mul_quant
    t, e, k, inter, d = 300, 32, 6, 256, 1024
    ids = torch.rand(t, e, device="cuda", generator=g).topk(k, dim=-1).indices
    wts = torch.rand(t, k, device="cuda", generator=g)
    for name, dest, rows, rpb in _layouts(ids, e):
        h = (torch.randn(rows, 2 * inter, device="cuda", generator=g) * 2).bfloat16()
        q, s = silu_mul_quant(h, dest, rpb)
        q0, s0 = F.TORCH_GLUE.silu_quant(h, dest, rpb)
        flat_s = s.reshape(-1, s.shape[-1]) if s.dim() == 3 else s
        assert float(((flat_s[dest] - s0[dest]).abs() / s0[dest]).max()) < 8e-3, name
        assert float((q[dest].view(torch.uint8) != q0[dest].view(torch.uint8)).float().mean()) < 1e-3, name
        y = torch.randn(rows, d, device="cuda", generator=g).bfloat16()
        want = (y[dest].double().view(t, k, d) * wts.double()[:, :, None]).sum(1)
        assert rel(combine(y, dest, wts, torch.bfloat16), want) < 4e-3, name


@pytest.mark.parametrize("t,align", [(64, 128), (4096, 128), (4096, 64)])
def test_triton_moe_layouts_match_torch(g, t, align):
    """The layout kernels (count, rows, place by atomics) against fused_moe's torch layouts at DeepSeek-V3's routing
    (256 experts, top-8): same m_indices and counts, the same rows (order inside an expert's run may differ)."""
    _need("triton")
    from kernels import fused_moe as F
    from kernels import triton_moe_layout as L
    e, k = 256, 8
    ids = torch.rand(t, e, device="cuda", generator=g).topk(k, dim=-1).indices
    d0, m0 = F.contiguous_layout(ids, e, align)
    d1, m1 = L.contiguous_layout(ids, e, align)
    assert torch.equal(m0, m1) and torch.equal(d0.sort().values.int(), d1.sort().values)
    assert (m1[d1.long()] == ids.reshape(-1).int()).all()
    d0, c0, mm = F.masked_layout(ids, e)
    d1, c1, mm1 = L.masked_layout(ids, e)
    assert mm == mm1 and torch.equal(c0, c1) and torch.equal(d0.sort().values.int(), d1.sort().values)


@pytest.mark.parametrize("t", [64, 129, 600])
def test_deepgemm_fused_moe_triton_glue(g, t):
    """The fused path with the Triton layout kernels: vs ``reference.moe_experts`` (rel < 2e-2: bf16 GEMM outputs between
    the FP8 stages) and vs the same path with torch glue (rel < 5e-3: same GEMM inputs but for rare SiLU last bits, the
    combine's fp32 weights)."""
    _need("deepgemm")
    _need("triton")
    from kernels import fused_moe as F
    from kernels.vendor import deepgemm_fused_moe
    x, wt, ids, w13, w2, s13, s2 = _fp8_moe(g, t)
    want = R.moe_experts(x.float(), wt, ids, w13, w2, s13, s2)
    out = deepgemm_fused_moe(x, wt, ids, w13, w2, s13, s2, glue=F.triton_glue())
    old = deepgemm_fused_moe(x, wt, ids, w13, w2, s13, s2, glue=F.TORCH_GLUE)
    assert torch.isfinite(out).all() and rel(out, want) < 2e-2 and rel(out, old) < 5e-3


def _mla_chunk(g, n: int, cached: int):
    """One DeepSeek-V3 MLA prefill chunk on the GPU, as ``MLAAttention.prefill_attend`` hands it over: 128 heads, q/k
    192, v 128, bf16; its n queries are the last n of n + cached keys. (q, k, v, positions, scale)."""
    h, dqk, dv, s = 128, 192, 128, n + cached
    q = torch.randn(n, h, dqk, device="cuda", generator=g).bfloat16()
    k = torch.randn(s, h, dqk, device="cuda", generator=g).bfloat16()
    v = torch.randn(s, h, dv, device="cuda", generator=g).bfloat16()
    return q, k, v, torch.arange(cached, s, device="cuda"), dqk ** -0.5


@pytest.mark.parametrize("n,cached", [(64, 0), (1000, 3000), (4096, 0), (517, 5003)])
def test_flash_split_prefill_attention(g, n, cached):
    """MLA prefill chunk (128 heads, q/k 192, v 128, bf16; queries the last n of n + cached keys) through the flash
    split + LSE merge (kernels/prefill_attention.py) vs ``reference.attention`` (fp32 math on the same bf16 inputs):
    rel < BF16_TOL (1e-2; the bf16 output rounding alone is ~3e-3). Routed by the registry with the caller's hint,
    declined without it, and no host sync inside (sync debug mode raises on one). The split is called directly (the
    registry puts FlashAttention-3 first where it loads: the fallback is tested here all the same)."""
    from kernels import ops
    from kernels.prefill_attention import flash_decline
    q, k, v, pos, scale = _mla_chunk(g, n, cached)
    if flash_decline(q, k, v, None, True):
        pytest.skip(flash_decline(q, k, v, None, True))
    from kernels.prefill_attention import attention_prefill_flash
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = attention_prefill_flash(q, k, v, pos, scale, None, bottom_right=True)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    ops.reset_used()
    ops.attention_prefill(q, k, v, pos, scale, None, bottom_right=True)
    assert ops.reset_used()["attention_prefill"] in ("fa3", "flash")   # FA3 ranks first where it loads
    want = R.attention(q, k, v, pos, scale)
    assert out.shape == want.shape and out.dtype == torch.bfloat16 and out.is_contiguous()
    assert torch.isfinite(out).all() and rel(out, want) < BF16_TOL
    ops.attention_prefill(q, k, v, pos, scale)           # no hint: the masked SDPA path
    assert ops.reset_used()["attention_prefill"] == "sdpa"


@pytest.mark.parametrize("n,cached", [(64, 0), (1000, 3000), (4096, 0), (517, 5003)])
def test_fa3_prefill_attention(g, n, cached):
    """MLA prefill chunk (128 heads, q/k 192, v 128, bf16; the last n of n + cached keys) through one FlashAttention-3
    varlen call (kernels.vendor.fa3_prefill, vLLM's sm90 build) vs ``reference.attention`` (fp32 math on the same bf16
    inputs): rel < BF16_TOL, v at its own width (no padding), chosen first by the registry with the caller's hint, and
    no host sync inside (sync debug mode raises on one)."""
    _need("fa3")
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("FlashAttention-3 is sm90 only")
    from kernels import ops
    q, k, v, pos, scale = _mla_chunk(g, n, cached)
    ops.reset_used()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = ops.attention_prefill(q, k, v, pos, scale, None, bottom_right=True)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert ops.reset_used()["attention_prefill"] == "fa3"
    want = R.attention(q, k, v, pos, scale)
    assert out.shape == want.shape and out.dtype == torch.bfloat16
    assert torch.isfinite(out).all() and rel(out, want) < BF16_TOL


def test_triton_attn_merge_matches_torch_merge(g):
    """The one-launch Triton LSE merge (kernels/triton_attn_merge.py) vs the torch-ops merge on the split's own strided
    views (flash's [1, n, H, 192] output sliced to 128, LSE [1, H, n] transposed), 128 heads, bf16: both compute in
    fp32, so they differ by bf16 output rounding at most (rel < 2e-3)."""
    _need("triton")
    from kernels.prefill_attention import merge_attn_states
    from kernels.triton_attn_merge import merge_attn_states as triton_merge
    n, h = 1000, 128
    oa = torch.randn(1, n, h, 192, device="cuda", generator=g).bfloat16()[0][..., :128]
    ob = torch.randn(1, n, h, 192, device="cuda", generator=g).bfloat16()[0][..., :128]
    la = (torch.randn(1, h, n, device="cuda", generator=g) * 4)[0].t()
    lb = (torch.randn(1, h, n, device="cuda", generator=g) * 4)[0].t()
    got, want = triton_merge(oa, la, ob, lb), merge_attn_states(oa, la, ob, lb)
    assert got.is_contiguous() and rel(got, want) < 2e-3


def test_calibration_graph_device_time_of_a_gemm(g):
    """``executor.calibrate._graph_device_time`` (the MoE points' ``device_s``): a bf16 4096^3 matmul in a CUDA graph
    takes 0.05-5 ms on any recent GPU (about 0.2 ms on an H200); a call that cannot be captured (a host sync) gives
    None instead of raising."""
    from executor.calibrate import _graph_device_time
    a = torch.randn(4096, 4096, device="cuda", generator=g).bfloat16()
    t = _graph_device_time(lambda: a @ a, torch.device("cuda"))
    assert t is not None and 5e-5 < t < 5e-3
    assert _graph_device_time(lambda: (a @ a).sum().item(), torch.device("cuda")) is None


def test_calibration_queued_device_time_hides_the_launch(g):
    """``executor.calibrate._queued_device_time`` (the prefill chunks' ``device_s``): 50 small launches per call, timed
    behind a spin kernel, cost their device time only, well under their eager wall time (each launch ~5-10 us of host,
    a few us of device)."""
    import time

    from executor.calibrate import _queued_device_time
    a = torch.randn(256, device="cuda", generator=g)

    def many():
        for _ in range(50):
            a.mul_(1.0)
    many()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    many()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    dev = _queued_device_time(many, torch.device("cuda"), wall)
    assert dev is not None and 0 < dev < wall
