"""The flash split for prefill chunks (kernels/prefill_attention.py) on CPU: the split at the cached prefix and the
log-sum-exp merge, run with the float32/float64 torch partial attention, against ``reference.attention``; the
registry routing (flash declines everything but bottom-right causal without a mask; CPU keeps the reference)."""

from __future__ import annotations

import importlib.util
import textwrap
from types import SimpleNamespace

import pytest
import torch

from kernels import ops, registry
from kernels import prefill_attention as PA
from kernels import reference as ref


def _problem(n: int, cached: int, h: int = 4, dqk: int = 24, dv: int = 16, dtype=torch.float64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    s = n + cached
    q = torch.randn(n, h, dqk, generator=g, dtype=dtype)
    k = torch.randn(s, h, dqk, generator=g, dtype=dtype)
    v = torch.randn(s, h, dv, generator=g, dtype=dtype)
    return q, k, v, torch.arange(cached, s)


@pytest.mark.parametrize("n,cached", [(1, 0), (7, 0), (5, 1), (9, 23), (16, 3), (1, 40)])
def test_split_merge_matches_reference_float64(n, cached):
    q, k, v, pos = _problem(n, cached)
    got = PA.split_causal_attention(q, k, v, 0.3, PA.attention_lse_torch)
    want = ref.attention(q, k, v, pos, 0.3)
    assert torch.allclose(got, want, rtol=0, atol=1e-12), (got - want).abs().max()


def test_split_merge_float32_close_to_reference():
    q, k, v, pos = _problem(33, 70, dtype=torch.float32, seed=1)
    got = PA.split_causal_attention(q, k, v, 0.2, PA.attention_lse_torch)
    assert (got - ref.attention(q, k, v, pos, 0.2)).abs().max() < 2e-6


def test_split_merge_with_large_logits_stays_finite():
    """Scores of magnitude ~1e3: the merge's sigmoid weight must neither overflow nor lose the right answer."""
    q, k, v, pos = _problem(6, 11, seed=2)
    q = q * 60.0
    got = PA.split_causal_attention(q, k, v, 1.0, PA.attention_lse_torch)
    assert torch.isfinite(got).all()
    assert torch.allclose(got, ref.attention(q, k, v, pos, 1.0), atol=1e-10)


def test_partial_lse_is_log_of_softmax_denominator():
    q, k, v, _ = _problem(5, 0, seed=3)
    out, lse = PA.attention_lse_torch(q, k, v, 0.5, causal=False)
    scores = torch.einsum("nhd,shd->nhs", q, k) * 0.5
    assert lse.shape == (5, 4)
    assert torch.allclose(lse, torch.log(torch.exp(scores).sum(-1)), atol=1e-12)
    assert torch.allclose(out, torch.einsum("nhs,shd->nhd", torch.softmax(scores, -1), v), atol=1e-12)


def test_merge_ignores_an_empty_part():
    """A part that saw no key (lse -inf, output 0 as flash leaves it) must get weight exactly 0."""
    o = torch.randn(3, 2, 4, dtype=torch.float64)
    lse = torch.randn(3, 2, dtype=torch.float64)
    empty = torch.full_like(lse, float("-inf"))
    assert torch.equal(PA.merge_attn_states(o, lse, torch.zeros_like(o), empty), o)


def test_merge_swapping_parts_is_symmetric():
    g = torch.Generator().manual_seed(4)
    oa, ob = torch.randn(4, 3, 8, generator=g), torch.randn(4, 3, 8, generator=g)
    la, lb = torch.randn(4, 3, generator=g) * 5, torch.randn(4, 3, generator=g) * 5
    assert torch.allclose(PA.merge_attn_states(oa, la, ob, lb), PA.merge_attn_states(ob, lb, oa, la), atol=1e-6)


def test_merge_output_keeps_bf16_dtype_and_works_in_float32():
    oa, ob = torch.randn(2, 2, 8).bfloat16(), torch.randn(2, 2, 8).bfloat16()
    la, lb = torch.zeros(2, 2), torch.zeros(2, 2)
    got = PA.merge_attn_states(oa, la, ob, lb)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, ((oa.float() + ob.float()) / 2).bfloat16())


@pytest.mark.parametrize("mask,bottom_right,device,dtype,expect", [
    (False, False, "cuda", torch.bfloat16, "bottom-right"),
    (True, True, "cuda", torch.bfloat16, "mask"),
    (False, True, "cpu", torch.bfloat16, "CUDA only"),
])
def test_flash_declines_what_it_cannot_run(mask, bottom_right, device, dtype, expect):
    q, k, v, pos = _problem(4, 4, dtype=dtype)
    key_mask = torch.ones(4, 8, dtype=torch.bool) if mask else None
    why = PA.flash_decline(q, k, v, key_mask, bottom_right)
    assert expect in why
    if device == "cpu":
        with pytest.raises(registry.Unsupported):
            PA.attention_prefill_flash(q, k, v, pos, 0.1, key_mask, bottom_right)


def test_flash_decline_checks_shapes_and_dtype():
    """The host-side checks on a CUDA call (stand-ins carrying a CUDA device, the dtype and the shape: all it reads)."""
    q, k, v, _ = _problem(4, 4, dtype=torch.bfloat16)

    def fake(t):
        return SimpleNamespace(device=torch.device("cuda"), dtype=t.dtype, shape=t.shape)
    assert "fp16/bf16" in PA.flash_decline(fake(q.float()), fake(k.float()), fake(v.float()), None, True)
    assert "GQA" in PA.flash_decline(fake(q), fake(k[:, :2]), fake(v[:, :2]), None, True)
    wide = torch.zeros(4, 4, 264, dtype=torch.bfloat16)
    assert "head dims" in PA.flash_decline(fake(wide), fake(wide), fake(wide), None, True)
    assert "head dims" in PA.flash_decline(fake(q), fake(k), fake(torch.zeros(8, 4, 32, dtype=torch.bfloat16)), None, True)
    assert "queries over" in PA.flash_decline(fake(k), fake(q), fake(v[:4]), None, True)


def test_registry_orders_flash_first_on_cuda_and_keeps_the_reference_on_cpu():
    names = [i.name for i in registry.IMPLS["attention_prefill"]]
    assert names == ["fa3", "flash", "sdpa", "torch"]
    assert [i.name for i in registry.choose("attention_prefill", "cpu").candidates] == ["torch"]


def test_cpu_op_with_the_hint_is_the_reference_bit_for_bit():
    """CPU tokens stay identical: the hint changes nothing on CPU (the reference runs, same arithmetic)."""
    q, k, v, pos = _problem(6, 10, dtype=torch.float32, seed=5)
    ops.reset_used()
    got = ops.attention_prefill(q, k, v, pos, 0.25, None, bottom_right=True)
    assert ops.reset_used()["attention_prefill"] == "torch"
    assert torch.equal(got, ref.attention(q, k, v, pos, 0.25))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("n,cached", [(8, 0), (13, 29), (1, 17)])
def test_flash_prefill_code_path_on_cpu_flash(dtype, tol, n, cached):
    """``flash_prefill`` exactly as CUDA runs it (v padded 16 -> 24, [B,H,S,D] views, LSE [1,H,n], slicing), with
    torch's CPU flash kernel underneath: relative error vs ``reference.attention`` within ``tol``."""
    q, k, v, pos = _problem(n, cached, dtype=dtype, seed=6)
    got = PA.flash_prefill(q, k, v, 0.2)
    want = ref.attention(q, k, v, pos, 0.2)
    assert got.shape == want.shape and got.dtype == dtype and got.is_contiguous()
    assert float((got.double() - want.double()).norm() / want.double().norm()) < tol


MERGE_CHECK = textwrap.dedent('''
    import torch
    from kernels import prefill_attention as PA
    from kernels import triton_attn_merge as TM
    g = torch.Generator().manual_seed(0)
    n, h, d = 37, 20, 128                    # 20 heads: a partial block of 8; outputs as the split hands them over
    for dt, tol in ((torch.float32, 2e-6), (torch.bfloat16, 0.04)):   # the interpreter's bf16 cast is not RTNE
        oa = torch.randn(1, n, h, 192, generator=g).to(dt)[0][..., :d]
        ob = torch.randn(1, n, h, 192, generator=g).to(dt)[0][..., :d]
        la, lb = (torch.randn(1, h, n, generator=g) * 4)[0].t(), (torch.randn(1, h, n, generator=g) * 4)[0].t()
        lb[3, 5] = float("-inf")
        got = TM.merge_attn_states(oa, la, ob, lb)
        want = torch.lerp(oa.double(), ob.double(), torch.sigmoid(lb.double() - la.double())[..., None])
        assert got.dtype == dt and got.is_contiguous() and got.shape == (n, h, d)
        assert (got.double() - want).abs().max() < tol, (dt, (got.double() - want).abs().max())
        assert torch.equal(got[3, 5], oa[3, 5])
    print("ok")
''')


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not importable")
def test_triton_merge_in_the_interpreter(triton_interpreter):
    """kernels/triton_attn_merge.py through Triton's interpreter (a subprocess: it must be on before Triton compiles)."""
    triton_interpreter(MERGE_CHECK, timeout=300)
