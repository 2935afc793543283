"""mHC around a block: the torch reference (kernels/reference.py) against the formulas written out, and the Triton
kernels (kernels/triton_mhc.py) against the reference in Triton's interpreter on CPU.

The interpreter test is skipped where Triton is not importable (CI's CPU torch has none; a dev box can put triton
3.6.0 on PYTHONPATH). It runs in a subprocess with ``TRITON_INTERPRET=1``, set before Triton compiles anything.
"""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch

from kernels import reference as R


def _inputs(t=5, n=4, h=64, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, n, h, generator=g, dtype=dtype)
    fn = torch.randn((2 + n) * n, n * h, generator=g, dtype=dtype) * 0.05
    scale = torch.tensor([1.0, 0.7, 1.3], dtype=dtype)
    base = torch.randn((2 + n) * n, generator=g, dtype=dtype) * 0.3
    return x, fn, scale, base


def test_prenorm_gemm_is_the_projection_and_the_squared_norm():
    x, fn, _, _ = _inputs()
    flat = x.reshape(x.shape[0], -1)
    mix, sqr = R.mhc_prenorm_gemm(flat, fn)
    assert torch.allclose(mix, flat @ fn.t()) and torch.allclose(sqr, (flat ** 2).sum(-1))


@pytest.mark.parametrize("iters", [1, 3, 20])
def test_pre_makes_comb_doubly_stochastic_and_weights_the_streams(iters):
    x, fn, scale, base = _inputs()
    t, n, h = x.shape
    mix, sqr = R.mhc_prenorm_gemm(x.reshape(t, -1), fn)
    y, post, comb = R.mhc_pre(x, mix, sqr, scale, base, iters)
    mixes = mix / torch.sqrt(sqr / (n * h) + 1e-6)[:, None]
    pre = torch.sigmoid(mixes[:, :n] * scale[0] + base[:n]) + 1e-6
    assert torch.allclose(y, (pre[:, :, None] * x).sum(1))
    assert torch.allclose(post, 2 * torch.sigmoid(mixes[:, n:2 * n] * scale[1] + base[n:2 * n]))
    # the last step normalises columns: every column sums to 1 (to the eps); the rows get there as iterations go on
    assert torch.allclose(comb.sum(-2), torch.ones(t, n, dtype=x.dtype), atol=1e-5)
    row_err = (comb.sum(-1) - 1).abs().max()
    assert (row_err < 1e-3) if iters == 20 else True
    assert (comb >= 0).all()
    # split-K partials give the same result as one split
    y2, post2, comb2 = R.mhc_pre(x, torch.stack([mix * 0.25, mix * 0.75]), torch.stack([sqr * 0.5, sqr * 0.5]),
                                 scale, base, iters)
    assert torch.allclose(y, y2) and torch.allclose(post, post2) and torch.allclose(comb, comb2)


def test_sinkhorn_rows_converge_with_iterations():
    x, fn, scale, base = _inputs(t=16, seed=3)
    t = x.shape[0]
    mix, sqr = R.mhc_prenorm_gemm(x.reshape(t, -1), fn)
    errs = [float((R.mhc_pre(x, mix, sqr, scale * 4, base, k)[2].sum(-1) - 1).abs().max()) for k in (1, 2, 5, 20)]
    assert errs[0] > errs[1] > errs[2] > errs[3] and errs[3] < errs[0] / 10


def test_post_mixes_the_streams_and_adds_the_block_output():
    x, fn, scale, base = _inputs()
    t, n, h = x.shape
    mix, sqr = R.mhc_prenorm_gemm(x.reshape(t, -1), fn)
    y, post, comb = R.mhc_pre(x, mix, sqr, scale, base, 20)
    out = R.mhc_post(y, x, post, comb)
    for j in range(n):
        want = post[:, j, None] * y + sum(comb[:, k, j, None] * x[:, k] for k in range(n))
        assert torch.allclose(out[:, j], want)


CHECK = textwrap.dedent('''
import torch
from kernels import reference as R
from kernels import triton_mhc as M
g = torch.Generator().manual_seed(0)
for t, n, h, splits, iters in ((3, 4, 96, 1, 20), (7, 4, 1100, 3, 20), (2, 2, 64, 2, 1), (1, 3, 40, 1, 5)):
    x = torch.randn(t, n, h, generator=g).to(torch.bfloat16)
    fn = torch.randn((2 + n) * n, n * h, generator=g) * 0.05
    scale = torch.tensor([1.0, 0.7, 1.3])
    base = torch.randn((2 + n) * n, generator=g) * 0.3
    mix, sqr = R.mhc_prenorm_gemm(x.reshape(t, -1), fn)
    parts = torch.rand(splits, 1, 1, generator=g)
    parts = parts / parts.sum()
    mix_s, sqr_s = (parts * mix).contiguous(), (parts[:, :, 0] * sqr).contiguous()
    y0, p0, c0 = R.mhc_pre(x, mix, sqr, scale, base, iters)
    y1, p1, c1 = M.mhc_pre(x, mix_s, sqr_s, scale, base, iters)
    assert y1.dtype == torch.bfloat16 and y1.shape == (t, h)
    assert (y1.float() - y0.float()).abs().max() <= 0.02 * y0.float().abs().max(), (t, n, h)
    assert torch.allclose(p1, p0, atol=1e-5) and torch.allclose(c1, c0, atol=1e-5), (t, n, h)
    o0 = R.mhc_post(y0, x, p0, c0)
    o1 = M.mhc_post(y0, x, p0, c0)
    assert o1.shape == (t, n, h) and (o1.float() - o0.float()).abs().max() <= 0.02 * o0.float().abs().max(), (t, n, h)
print("ok")
''')


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not importable")
def test_triton_kernels_in_the_interpreter(triton_interpreter):
    triton_interpreter(CHECK)
