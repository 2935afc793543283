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
