"""The fused MoE's Triton layout kernels (kernels/triton_moe_layout.py) on CPU, through Triton's interpreter.

Skipped where Triton is not importable (CI's CPU torch has none; a dev box can put triton 3.6.0 on PYTHONPATH).
The interpreter must be switched on before Triton compiles anything, so the checks run in a subprocess with
``TRITON_INTERPRET=1``. Its FP8 cast mis-rounds values just below a power of two (h18eager), so the kernels are
compared with ``triton_rowwise`` (the same cast, bit-equal to the reference on the H200) rather than with the torch
reference: permute codes/scales bit for bit at every pair's row, MN-major scale strides, SiLU+requantise bit for
bit against the row-wise SiLU and quantisation, the combine against an fp64 weighted sum, and the layout kernels
against ``fused_moe``'s torch layouts (same m_indices and counts, the same set of rows; order inside a run may differ). The bit-exactness against
``reference.quant_fp8_act`` itself is the GPU test's (tests/test_kernels_gpu.py).
"""

from __future__ import annotations

import importlib.util
import textwrap

import pytest

pytest.importorskip("torch")
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton not importable", allow_module_level=True)

CHECK = textwrap.dedent('''
    import torch
    from kernels import fused_moe as F, triton_rowwise as TR
    from kernels import triton_moe_layout as L
    g = torch.Generator().manual_seed(0)
    t, e, k, d, inter = 37, 8, 3, 512, 256
    x = (torch.randn(t, d, generator=g) * 3).bfloat16()
    ids = torch.rand(t, e, generator=g).topk(k, dim=-1).indices
    wts = torch.rand(t, k, generator=g)
    tok = torch.arange(t * k) // k
    dm, _, max_m = F.masked_layout(ids, e)
    dc, m_idx = F.contiguous_layout(ids, e)
    q0, s0 = TR.quant_fp8_act(x)
    for name, dest, rows, rpb in (("masked", dm, e * max_m, max_m), ("contiguous", dc, m_idx.numel(), m_idx.numel())):
        q, s = L.permute_quant(x, dest, rows, rpb)
        fs = s.reshape(-1, s.shape[-1]) if s.dim() == 3 else s
        assert s.stride(-2) == 1 and s.stride(-1) == rpb, (name, s.stride())
        assert torch.equal(q[dest].view(torch.uint8), q0[tok].view(torch.uint8)), name
        assert torch.equal(fs[dest], s0[tok]), name
        h = (torch.randn(rows, 2 * inter, generator=g) * 2).bfloat16()
        b, bs = L.silu_mul_quant(h.view(-1, rpb, 2 * inter) if name == "masked" else h, dest, rpb)
        hq, hs = TR.quant_fp8_act(TR.silu_mul(h[dest][:, :inter], h[dest][:, inter:]))
        fbs = bs.reshape(-1, bs.shape[-1]) if bs.dim() == 3 else bs
        assert torch.equal(b[dest].view(torch.uint8), hq.view(torch.uint8)) and torch.equal(fbs[dest], hs), name
        y = torch.randn(rows, d, generator=g).bfloat16()
        want = (y[dest].double().view(t, k, d) * wts.double()[:, :, None]).sum(1)
        got = L.combine(y.view(-1, rpb, d) if name == "masked" else y, dest, wts, torch.bfloat16)
        err = float((got.double() - want).norm() / want.norm())
        assert got.dtype == torch.bfloat16 and err < 4e-3, (name, err)
    for t, e, k, align in ((37, 8, 3, 128), (300, 32, 6, 64), (1, 8, 2, 128)):
        ids = torch.rand(t, e, generator=g).topk(k, dim=-1).indices
        d0, m0 = F.contiguous_layout(ids, e, align)
        d1, m1 = L.contiguous_layout(ids, e, align)
        assert torch.equal(m0, m1), ("m_indices", t, e, align)
        assert sorted(d1.tolist()) == sorted(d0.tolist()) and (m1[d1.long()] == ids.reshape(-1).int()).all()
        d0, c0, mm0 = F.masked_layout(ids, e)
        d1, c1, mm1 = L.masked_layout(ids, e)
        assert mm0 == mm1 and torch.equal(c0, c1) and c1.dtype == torch.int32
        assert sorted(d1.tolist()) == sorted(d0.tolist()) and ((d1 // mm1).long() == ids.reshape(-1)).all()
    print("ok")
''')


def test_layout_kernels_in_the_interpreter(triton_interpreter):
    triton_interpreter(CHECK)
