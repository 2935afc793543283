"""Registry choice on a (pretended) Hopper GPU with vendor libraries present or absent, the DeepGEMM
JIT cache folder, and the warm-up's shape plan. No GPU needed: probes and the device are monkeypatched."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kernels import jit_cache, registry, warmup  # noqa: E402


# the ``hopper`` fixture (a pretended sm_90 device, libraries absent unless found) is in tests/conftest.py


def test_deepgemm_chosen_for_dense_gemm_whenever_importable(hopper):
    hopper("deepgemm", "triton")
    ch = registry.choose("fp8_gemm", "cuda")
    assert [i.name for i in ch.candidates][:2] == ["deepgemm", "triton"]
    assert ch.why.startswith("deepgemm: vendor library") and "imported vllm.third_party.deepgemm" in ch.why


def test_moe_ranks_fused_deepgemm_first_with_triton_next_for_decode(hopper):
    hopper("deepgemm", "triton")
    ch = registry.choose("moe_experts", "cuda")
    assert [i.name for i in ch.candidates][:2] == ["deepgemm", "triton"]   # decode batches fall through to Triton
    assert ch.why.startswith("deepgemm: vendor library") and "decode goes to Triton" in ch.candidates[0].notes
    hopper("deepgemm")   # no Triton: the fused DeepGEMM path serves every batch
    registry._probe_cache["triton"] = (False, "", "not importable (triton: ModuleNotFoundError)")
    assert [i.name for i in registry.choose("moe_experts", "cuda").candidates] == ["deepgemm", "torch"]


@pytest.mark.parametrize("op", ["fp8_gemm", "moe_experts"])
def test_triton_then_torch_when_vendor_absent(hopper, op):
    hopper("triton")
    ch = registry.choose(op, "cuda")
    assert ch.candidates[0].name == "triton" and "skipped deepgemm: not importable" in ch.why
    hopper()   # nothing found
    registry._probe_cache["triton"] = (False, "", "not importable (triton: ModuleNotFoundError)")
    ch = registry.choose(op, "cuda")
    assert ch.candidates[0].name == "torch" and "torch reference" in ch.why


def test_old_gpu_skips_deepgemm_with_reason(hopper, monkeypatch):
    hopper("deepgemm", "triton")
    monkeypatch.setattr(registry, "device_capability", lambda device: (8, 0))
    ch = registry.choose("fp8_gemm", "cuda")
    assert ch.candidates[0].name == "torch" and "needs sm_90+" in ch.why   # triton fp8 needs sm_89


def test_override_to_triton_is_recorded(hopper, monkeypatch):
    hopper("deepgemm", "triton")
    monkeypatch.setenv("TWINFER_KERNEL_MOE_EXPERTS", "triton")
    ch = registry.choose("moe_experts", "cuda")
    assert ch.candidates[0].name == "triton" and ch.why.startswith("forced by override")


def test_describe_marks_deepgemm_chosen(hopper):
    hopper("deepgemm", "triton", "flashmla")
    rows = {(r["op"], r["impl"]): r for r in registry.describe("cuda")}
    assert rows[("fp8_gemm", "deepgemm")]["chosen"] and rows[("moe_experts", "deepgemm")]["chosen"]
    assert not rows[("moe_experts", "triton")]["chosen"] and rows[("moe_experts", "triton")]["usable"]


def test_jit_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("DG_JIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("TWINFER_CACHE_DIR", str(tmp_path / "tw"))
    path, src = jit_cache.jit_cache_dir()
    assert path == tmp_path / "tw" / "deepgemm" and src == "$TWINFER_CACHE_DIR"
    assert jit_cache.ensure_jit_cache().is_dir()
    import os
    assert os.environ["DG_JIT_CACHE_DIR"] == str(path)
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "mine"))
    assert jit_cache.jit_cache_dir() == (tmp_path / "mine", "$DG_JIT_CACHE_DIR")
    monkeypatch.delenv("DG_JIT_CACHE_DIR")
    monkeypatch.delenv("TWINFER_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert jit_cache.jit_cache_dir() == (tmp_path / "xdg" / "twinfer" / "deepgemm", "default")


class Lin(torch.nn.Module):
    def __init__(self, n, k):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(n, k, dtype=torch.float8_e4m3fn), requires_grad=False)
        self.weight_scale_inv = torch.nn.Parameter(torch.ones(n // 128, k // 128), requires_grad=False)


class Exp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w13 = torch.nn.Parameter(torch.zeros(4, 256, 128, dtype=torch.float8_e4m3fn), requires_grad=False)
        self.w13_scale_inv = torch.nn.Parameter(torch.ones(4, 2, 1), requires_grad=False)


def test_warmup_plan_lists_each_fp8_shape_once_per_token_count():
    bf16 = torch.nn.Linear(128, 128)   # not FP8: not planned
    model = torch.nn.Sequential(Lin(256, 128), Lin(256, 128), Lin(128, 256), Exp(), bf16)
    items = warmup.jit_plan(model, (1, 64))
    labels = [i.label() for i in items]
    assert labels == ["fp8_gemm M=1 N=256 K=128", "fp8_gemm M=64 N=256 K=128", "fp8_gemm M=1 N=128 K=256",
                      "fp8_gemm M=64 N=128 K=256", "moe_experts E=4 T=1 2I=256 D=128", "moe_experts E=4 T=64 2I=256 D=128"]
    assert warmup.jit_warmup(model, torch.device("cpu"), (1,)) == []   # CPU: nothing to compile


def test_warmup_token_counts_cover_decode_graphs_and_prefill_sizes():
    assert warmup.token_counts([1, 2, 4, 8], 1000) == (1, 2, 4, 8, 128, 256, 512, 1000)
    assert warmup.token_counts([1, 64], 64) == (1, 64)
    # piecewise graphs' token buckets are compiled too (their capture would otherwise JIT each one serially)
    assert warmup.token_counts([1, 8], 1000, [8, 16, 136, 640]) == (1, 8, 16, 128, 136, 256, 512, 640, 1000)


def test_eager_gemm_rows_cover_every_row_count_past_the_buckets():
    """A step past the largest piecewise bucket runs its GEMMs at its exact row count: the dense GEMMs are warmed at
    every multiple of 64 above the bucket up to the budget (DeepGEMM's tile choice sees M through ceil(M / 64k))."""
    rows = warmup.eager_gemm_rows(8192, [1, 8, 256, 4096])
    assert rows[0] == 4160 and rows[-1] == 8192 and len(rows) == 64 and all(m % 64 == 0 for m in rows)
    assert all(any(0 <= r - m < 64 for r in rows) for m in range(4097, 8193))   # every eager M shares a warmed tile count
    assert warmup.eager_gemm_rows(4096, [1, 4096]) == ()          # the buckets reach the budget: nothing runs eagerly
    assert warmup.eager_gemm_rows(256, ()) == (64, 128, 192, 256)  # no buckets: every prefill step is eager
    # the dense GEMMs take them, the MoE layers do not
    model = torch.nn.Sequential(Lin(256, 128), Exp())
    labels = [i.label() for i in warmup.jit_plan(model, (1,), (64, 128))]
    assert labels == ["fp8_gemm M=1 N=256 K=128", "fp8_gemm M=64 N=256 K=128", "fp8_gemm M=128 N=256 K=128",
                      "moe_experts E=4 T=1 2I=256 D=128"]
