"""The fused MoE's permutation, layouts and combine (kernels.fused_moe) against reference.moe_experts on CPU.

The grouped GEMMs are the torch references of DeepGEMM's masked and contiguous kernels, so
these tests check everything around the GEMMs: which rows each token-expert pair lands in,
the per-expert counts, padding, the SiLU/re-quantisation between the GEMMs and the weighted sum.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kernels import fused_moe as F  # noqa: E402
from kernels import reference as R  # noqa: E402


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _problem(t, e=8, k=2, d=256, inter=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, d, generator=g)
    w13q, s13 = zip(*[R.quant_fp8_weight(torch.randn(2 * inter, d, generator=g) * 0.05) for _ in range(e)])
    w2q, s2 = zip(*[R.quant_fp8_weight(torch.randn(d, inter, generator=g) * 0.05) for _ in range(e)])
    ids = torch.rand(t, e, generator=g).topk(k, dim=-1).indices
    wts = torch.rand(t, k, generator=g)
    return x, wts, ids, torch.stack(w13q), torch.stack(w2q), torch.stack(s13), torch.stack(s2)


def test_masked_layout_rows_are_unique_and_counted():
    ids = torch.tensor([[3, 1], [1, 0], [3, 2], [1, 3]])
    dest, masked_m, max_m = F.masked_layout(ids, 4)
    assert max_m == 128 and masked_m.tolist() == [1, 3, 1, 3]
    assert len(set(dest.tolist())) == ids.numel()
    # each pair sits in its expert's block, in the first masked_m rows, in token order
    assert (dest // max_m).tolist() == ids.reshape(-1).tolist()
    assert [int(d) % max_m for d, e in zip(dest, ids.reshape(-1)) if e == 1] == [0, 1, 2]


def test_contiguous_layout_pads_each_run_to_the_alignment():
    ids = torch.tensor([[2, 0], [2, 1], [0, 2]])
    dest, m_idx = F.contiguous_layout(ids, 3, align=4)
    assert m_idx.numel() % 4 == 0 and m_idx.numel() >= 6 + 3 * 3
    assert m_idx[:12].tolist() == [0, 0, -1, -1, 1, -1, -1, -1, 2, 2, 2, -1]
    assert (m_idx[dest.long()] == ids.reshape(-1).int()).all()
    assert (m_idx[12:] == -1).all()


@pytest.mark.parametrize("t", [1, 5, 40])
def test_masked_path_matches_reference(t):
    x, wts, ids, w13, w2, s13, s2 = _problem(t)
    got = F.moe_masked(x, wts, ids, w13, w2, s13, s2, F.ref_masked_gemm)
    want = R.moe_experts(x, wts, ids, w13, w2, s13, s2)
    assert _rel(got, want) < 2e-2     # bf16 GEMM outputs between the FP8 stages


@pytest.mark.parametrize("t", [3, 200])
def test_contiguous_path_matches_reference(t):
    x, wts, ids, w13, w2, s13, s2 = _problem(t, seed=1)
    got = F.moe_contiguous(x, wts, ids, w13, w2, s13, s2, F.ref_contiguous_gemm)
    want = R.moe_experts(x, wts, ids, w13, w2, s13, s2)
    assert _rel(got, want) < 2e-2


def test_layout_choice_by_batch(monkeypatch):
    seen = []
    x, wts, ids, w13, w2, s13, s2 = _problem(F.MASKED_MAX_TOKENS + 1, seed=2)
    masked = lambda *a: seen.append("masked") or F.ref_masked_gemm(*a)            # noqa: E731
    contig = lambda *a: seen.append("contiguous") or F.ref_contiguous_gemm(*a)    # noqa: E731
    F.moe_experts(x[:4], wts[:4], ids[:4], w13, w2, s13, s2, masked, contig)
    F.moe_experts(x, wts, ids, w13, w2, s13, s2, masked, contig)
    assert seen == ["masked", "masked", "contiguous", "contiguous"]


def test_wrong_pair_placement_would_be_caught():
    """The test above can fail: swapping two experts' weights moves the answer far off."""
    x, wts, ids, w13, w2, s13, s2 = _problem(6, seed=3)
    got = F.moe_masked(x, wts, ids, w13.flip(0), w2, s13.flip(0), s2, F.ref_masked_gemm)
    assert _rel(got, R.moe_experts(x, wts, ids, w13, w2, s13, s2)) > 0.1


def test_contiguous_path_at_alignment_64_matches_reference():
    """DeepGEMM's contiguous layout at a smaller alignment (its BLOCK_M on SM90 follows it): same answer."""
    x, wts, ids, w13, w2, s13, s2 = _problem(60, seed=4)
    got = F.moe_contiguous(x, wts, ids, w13, w2, s13, s2, F.ref_contiguous_gemm, align=64)
    dest, m_idx = F.contiguous_layout(ids, w13.shape[0], 64)
    assert m_idx.numel() % 64 == 0 and (m_idx[dest] == ids.reshape(-1).int()).all()
    assert _rel(got, R.moe_experts(x, wts, ids, w13, w2, s13, s2)) < 2e-2


def test_glue_steps_get_the_layouts_rows():
    """The path hands each layout step the pair rows and the buffer sizes of its layout (what the Triton kernels index)."""
    calls = []

    def rec(name, fn):
        return lambda *a: calls.append((name, a)) or fn(*a)
    glue = F.Glue(*(rec(n, f) for n, f in zip(F.Glue._fields, F.TORCH_GLUE)))
    x, wts, ids, w13, w2, s13, s2 = _problem(150, seed=5)
    want = F.moe_experts(x, wts, ids, w13, w2, s13, s2, F.ref_masked_gemm, F.ref_contiguous_gemm)
    got = F.moe_experts(x, wts, ids, w13, w2, s13, s2, F.ref_masked_gemm, F.ref_contiguous_gemm, glue)
    assert torch.equal(got, want) and [c[0] for c in calls] == ["contiguous_layout", "permute", "silu_quant", "combine"]
    dest, m_idx = F.contiguous_layout(ids, w13.shape[0])
    (_, (_, d1, rows, rpb)), (_, (h, d2, rpb2)), (_, (y, d3, w, dt)) = calls[1:]
    assert torch.equal(d1, dest) and torch.equal(d2, dest) and torch.equal(d3, dest)
    assert rows == rpb == rpb2 == m_idx.numel() and h.shape[0] == y.shape[0] == rows and dt == x.dtype
    calls.clear()
    F.moe_experts(x[:9], wts[:9], ids[:9], w13, w2, s13, s2, F.ref_masked_gemm, F.ref_contiguous_gemm, glue)
    _, max_m = F.masked_layout(ids[:9], w13.shape[0])[1:]
    assert calls[0][0] == "masked_layout" and calls[1][1][2:] == (w13.shape[0] * max_m, max_m) and calls[2][1][2] == max_m


def test_registry_adapter_declines_decode_batches_to_triton(monkeypatch):
    """``moe_experts=deepgemm`` serves prefill batches; decode batches go to the next candidate (Triton) unless forced
    or Triton is absent (then the next one would be the torch reference loop)."""
    from kernels import registry, vendor
    x, wts, ids, w13, w2, s13, s2 = _problem(4, seed=6)
    monkeypatch.setitem(registry._probe_cache, "triton", (True, "triton", "imported triton"))
    monkeypatch.delenv("TWINFER_KERNEL_MOE_EXPERTS", raising=False)
    with pytest.raises(registry.Unsupported, match="Triton MoE is faster at decode"):
        vendor.deepgemm_moe_experts(x, wts, ids, w13, w2, s13, s2)
    monkeypatch.setenv("TWINFER_KERNEL_MOE_EXPERTS", "deepgemm")   # forced: goes on to the fused path (CUDA only)
    with pytest.raises(registry.Unsupported, match="CUDA only"):
        vendor.deepgemm_moe_experts(x, wts, ids, w13, w2, s13, s2)
    monkeypatch.delenv("TWINFER_KERNEL_MOE_EXPERTS")
    monkeypatch.setitem(registry._probe_cache, "triton", (False, "", "not importable (triton: ModuleNotFoundError)"))
    with pytest.raises(registry.Unsupported, match="CUDA only"):
        vendor.deepgemm_moe_experts(x, wts, ids, w13, w2, s13, s2)
    x, wts, ids, w13, w2, s13, s2 = _problem(vendor.FUSED_MOE_MIN_TOKENS, seed=6)
    monkeypatch.setitem(registry._probe_cache, "triton", (True, "triton", "imported triton"))
    with pytest.raises(registry.Unsupported, match="CUDA only"):   # a prefill batch is taken
        vendor.deepgemm_moe_experts(x, wts, ids, w13, w2, s13, s2)
