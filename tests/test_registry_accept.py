"""Dispatch by accept checks: an implementation's ``declines`` check runs once per call signature, the decision is
reused (no re-check, no exception, the declining kernel is not called), a new signature re-decides, and Unsupported
raised by a kernel anyway is remembered for its signature. Vendor libraries absent or pretended (no GPU: the
"cuda" choice is made on a pretend sm_90 device and the kernels are stand-ins called with CPU tensors)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from kernels import ops, registry  # noqa: E402


# the ``hopper`` fixture (a pretended sm_90 device, libraries absent unless found) is in tests/conftest.py


class Kernels:
    """Stand-in kernels by target: each records its calls and returns its implementation's name."""

    def __init__(self, monkeypatch, op):
        self.calls: list[str] = []
        for impl in registry.IMPLS[op]:
            monkeypatch.setitem(registry._fn_cache, impl.target, self._kernel(impl.name))

    def _kernel(self, name):
        def run(*args, **kwargs):
            self.calls.append(name)
            return name
        return run


def counted(monkeypatch, op, name):
    """Wrap ``op``'s implementation ``name``'s check to count its evaluations (the registry entry is replaced)."""
    impls = registry.IMPLS[op]
    i = next(j for j, im in enumerate(impls) if im.name == name)
    seen = []

    def check(*sig):
        seen.append(sig)
        return impls[i].declines(*sig)
    monkeypatch.setitem(registry.IMPLS, op, impls[:i] + [registry.Impl(**{**impls[i].__dict__, "declines": check})] + impls[i + 1:])
    return seen


def _moe(tokens, fp8=True):
    x = torch.zeros(tokens, 256)
    ids = torch.zeros(tokens, 2, dtype=torch.int64)
    w13 = torch.zeros(4, 256, 256, dtype=torch.float8_e4m3fn if fp8 else torch.float32)
    w2 = torch.zeros(4, 256, 128, dtype=w13.dtype)
    s13 = torch.ones(4, 2, 2) if fp8 else None
    return x, torch.ones(tokens, 2), ids, w13, w2, s13, s13


def test_vendor_absent_triton_first_and_its_decline_decided_once(hopper, monkeypatch):
    hopper("triton")
    k = Kernels(monkeypatch, "rms_norm")
    seen = counted(monkeypatch, "rms_norm", "triton")
    w = torch.ones(64)
    bf, f64 = torch.zeros(3, 64, dtype=torch.bfloat16), torch.zeros(3, 64, dtype=torch.float64)
    assert [i.name for i in ops.choice("rms_norm", "cuda").candidates] == ["triton", "torch"]
    assert ops.call("rms_norm", "cuda", bf, w, 1e-6) == "triton" and ops.used["rms_norm"] == "triton"
    assert ops.call("rms_norm", "cuda", f64, w, 1e-6) == "torch" and ops.used["rms_norm"] == "torch"
    assert "triton rms_norm" in ops.fallbacks["rms_norm"] and "float64" in ops.fallbacks["rms_norm"]
    assert len(seen) == 2 and k.calls == ["triton", "torch"]
    for _ in range(3):   # repeated signatures: no check, the declining kernel never called
        assert ops.call("rms_norm", "cuda", f64, w, 1e-6) == "torch"
        assert ops.call("rms_norm", "cuda", bf, w, 1e-6) == "triton"
    assert len(seen) == 2 and k.calls == ["triton", "torch"] + ["torch", "triton"] * 3
    wide = torch.zeros(3, 32768, dtype=torch.bfloat16)   # a new signature re-decides
    assert ops.call("rms_norm", "cuda", wide, torch.ones(32768), 1e-6) == "torch" and len(seen) == 3
    assert "32768" in ops.fallbacks["rms_norm"]
    assert ops.call("rms_norm", "cuda", bf[:, :32], w[:32], 1e-6) == "triton" and len(seen) == 4


def test_unsupported_raised_anyway_is_recorded_once_per_signature(hopper, monkeypatch):
    hopper("triton")
    k = Kernels(monkeypatch, "rms_norm")
    raised = []

    def failing_triton(x, weight, eps=1e-6):
        raised.append(x.shape[-1])
        if x.shape[-1] == 64:   # a case its check does not know about
            raise registry.Unsupported("triton rms_norm: broke at run time")
        return "triton"
    monkeypatch.setitem(registry._fn_cache, registry.IMPLS["rms_norm"][0].target, failing_triton)
    x, w = torch.zeros(2, 64, dtype=torch.bfloat16), torch.ones(64)
    assert [ops.call("rms_norm", "cuda", x, w, 1e-6) for _ in range(4)] == ["torch"] * 4
    assert raised == [64] and k.calls == ["torch"] * 4 and ops.fallbacks["rms_norm"] == "triton: triton rms_norm: broke at run time"
    x2 = torch.zeros(2, 128, dtype=torch.bfloat16)   # another signature still goes to Triton
    assert ops.call("rms_norm", "cuda", x2, torch.ones(128), 1e-6) == "triton" and raised == [64, 128]
    assert ops.call("rms_norm", "cuda", x, w, 1e-6) == "torch" and raised == [64, 128]


def test_a_choice_without_checks_calls_its_first_candidate_and_keys_after_a_decline(hopper, monkeypatch):
    """The CPU choice of mla_decode has no checks: no signature is computed until a kernel raises Unsupported."""
    k = Kernels(monkeypatch, "mla_decode")
    ch = ops.choice("mla_decode", "cpu")
    assert [i.name for i in ch.candidates] == ["torch_batched", "torch"] and not ch.keyed
    sigs = []
    real = ch.signature
    ch.signature = lambda *a, **kw: sigs.append(1) or real(*a, **kw)
    q, kv = torch.zeros(2, 1, 4, 576), torch.zeros(3, 64, 576)
    args = (q, kv, torch.zeros(2, 3, dtype=torch.int32), torch.ones(2, dtype=torch.int32), 0.1, 512)
    assert ops.call("mla_decode", "cpu", *args) == "torch_batched" and not ch.decided and sigs == []
    refused = []

    def refuse(*a, **kw):
        refused.append(1)
        raise registry.Unsupported("no")
    monkeypatch.setitem(registry._fn_cache, ch.candidates[0].target, refuse)
    assert ops.call("mla_decode", "cpu", *args) == "torch" and ch.keyed and refused == [1]
    assert ops.call("mla_decode", "cpu", *args) == "torch" and refused == [1] and k.calls == ["torch_batched", "torch", "torch"]
    assert ops.fallbacks["mla_decode"] == "torch_batched: no" and len(sigs) == 2 and len(ch.decided) == 1


def test_moe_decode_batches_go_to_triton_prefill_to_deepgemm_forced_takes_all(hopper, monkeypatch):
    hopper("deepgemm", "triton")
    k = Kernels(monkeypatch, "moe_experts")
    seen = counted(monkeypatch, "moe_experts", "deepgemm")
    assert ops.call("moe_experts", "cuda", *_moe(64)) == "triton"
    assert "64 tokens < 2048" in ops.fallbacks["moe_experts"]
    assert ops.call("moe_experts", "cuda", *_moe(64)) == "triton"
    assert ops.call("moe_experts", "cuda", *_moe(2047)) == "triton"
    assert ops.call("moe_experts", "cuda", *_moe(2048)) == "deepgemm"
    assert ops.call("moe_experts", "cuda", *_moe(64, fp8=False)) == "triton"
    assert k.calls == ["triton", "triton", "triton", "deepgemm", "triton"] and len(seen) == 4
    monkeypatch.setenv("TWINFER_KERNEL_MOE_EXPERTS", "deepgemm")
    ops.clear_choices()   # an override change: choices and their decisions start over
    assert [i.name for i in ops.choice("moe_experts", "cuda").candidates] == ["deepgemm", "torch"]
    assert ops.call("moe_experts", "cuda", *_moe(64)) == "deepgemm"
    assert ops.call("moe_experts", "cuda", *_moe(64, fp8=False)) == "torch"   # BF16 weights: the reference


def test_dsa_decode_passes_over_flashmla_and_triton(hopper, monkeypatch):
    hopper("flashmla", "triton")
    k = Kernels(monkeypatch, "mla_decode")
    q, kv = torch.zeros(2, 1, 4, 576, dtype=torch.bfloat16), torch.zeros(3, 64, 576, dtype=torch.bfloat16)
    args = (q, kv, torch.zeros(2, 3, dtype=torch.int32), torch.ones(2, dtype=torch.int32), 0.1, 512)
    topk = torch.zeros(2, 1, 8, dtype=torch.int32)
    assert ops.call("mla_decode", "cuda", *args) == "flashmla"
    assert ops.call("mla_decode", "cuda", *args, topk_indices=topk) == "torch_batched"
    assert ops.fallbacks["mla_decode"] == "triton: triton mla_decode: dense attention only"
    assert ops.call("mla_decode", "cuda", q, kv[:, :32], *args[2:]) == "triton"   # page 32: not FlashMLA's
    assert ops.call("mla_decode", "cuda", q.half(), kv.half(), *args[2:]) == "triton"
    assert k.calls == ["flashmla", "torch_batched", "triton", "triton"]


def test_nothing_takes_the_call_names_every_decline(hopper, monkeypatch):
    hopper("triton")
    monkeypatch.setenv("TWINFER_KERNEL_RMS_NORM", "triton")
    ch = registry.Choice("rms_norm", "cuda", [registry.IMPLS["rms_norm"][0]] * 2, "test")   # no reference behind
    monkeypatch.setitem(ops._choices, ("rms_norm", "cuda"), ch)
    with pytest.raises(RuntimeError, match="no implementation of rms_norm.*triton rms_norm.*float64"):
        ops.call("rms_norm", "cuda", torch.zeros(2, 8, dtype=torch.float64), torch.ones(8), 1e-6)


def test_describe_and_choice_reason_unchanged_by_checks(hopper):
    hopper("deepgemm", "triton")
    rows = {(r["op"], r["impl"]): r for r in registry.describe("cuda")}
    assert rows[("moe_experts", "deepgemm")]["chosen"] and rows[("moe_experts", "deepgemm")]["why"].startswith("deepgemm: vendor library")
    assert rows[("rms_norm", "triton")]["chosen"] and not rows[("rms_norm", "torch")]["chosen"]


# --- the checks themselves: what each adapter takes, on CPU inputs shaped as kernels.ops passes them --------------

def _sig(op, *args, **kwargs):
    return registry.SIGNATURES[op](*args, **kwargs)


def _why(op, name, sig):
    return next(i for i in registry.IMPLS[op] if i.name == name).declines(*sig)


def test_copied_constants_equal_the_adapters():
    from kernels import prefill_attention as pa
    from kernels import vendor
    assert registry._FUSED_MOE_MIN_TOKENS == vendor.FUSED_MOE_MIN_TOKENS
    assert registry._FLASH_MAX_HEAD_DIM == pa.FLASH_MAX_HEAD_DIM and set(registry._dtypes(*registry._FLASH_DTYPES)) == set(pa.FLASH_DTYPES)


def test_every_check_has_a_declared_signature():
    checked = {i.op for impls in registry.IMPLS.values() for i in impls[:-1] if i.declines is not None}
    assert checked - set(registry.SIGNATURES) == {"all_to_all"}   # not dispatched through ops (executor/ep.py)


def test_row_wise_checks():
    bf = torch.zeros(4, 256, dtype=torch.bfloat16)
    assert _why("rms_norm", "triton", _sig("rms_norm", bf, torch.ones(256), 1e-6)) == ""
    assert _why("rms_norm", "triton", _sig("rms_norm", bf.t(), torch.ones(4))) != ""        # last stride 256
    assert _why("quant_fp8_act", "triton", _sig("quant_fp8_act", bf)) == ""
    assert "K 200" in _why("quant_fp8_act", "triton", _sig("quant_fp8_act", bf[:, :200]))
    assert _why("quant_fp8_act", "triton", _sig("quant_fp8_act", bf[None])) != ""           # 3-D
    x = torch.zeros(4, 2, 64, dtype=torch.bfloat16)
    assert _why("rope", "triton", _sig("rope", x, torch.arange(4), torch.zeros(8, 64), False)) == ""
    assert _why("rope", "triton", _sig("rope", x[..., :48], torch.arange(4), torch.zeros(8, 48), False)) != ""
    assert _why("rope", "triton", _sig("rope", x, torch.arange(4), torch.zeros(8, 64, dtype=torch.bfloat16), False)) != ""
    h = torch.zeros(4, 512, dtype=torch.bfloat16)
    assert _why("silu_mul", "triton", _sig("silu_mul", h[:, :256], h[:, 256:])) == ""      # strided halves
    assert _why("silu_mul", "triton", _sig("silu_mul", h[:, :256], h[:, :128])) != ""
    assert _why("silu_mul", "triton", _sig("silu_mul", h.double()[:, :256], h.double()[:, 256:])) != ""


def test_gemm_checks():
    e4 = torch.float8_e4m3fn
    xq, wq = torch.zeros(128, 256, dtype=e4), torch.zeros(128, 256, dtype=e4)   # past the decode rows (next test)
    sig = _sig("fp8_gemm", xq, torch.ones(4, 2), wq, torch.ones(1, 2), torch.bfloat16)
    assert _why("fp8_gemm", "deepgemm", sig) == "" and _why("fp8_gemm", "triton", sig) == ""
    assert _why("fp8_gemm", "deepgemm", _sig("fp8_gemm", xq, None, wq, None)) == ""        # default out dtype: bf16
    assert "fp8_gemm" in _why("fp8_gemm", "deepgemm", _sig("fp8_gemm", xq, None, wq, None, torch.float32))
    assert "N 96" in _why("fp8_gemm", "deepgemm", _sig("fp8_gemm", xq, None, wq[:96], None, torch.bfloat16))
    assert _why("fp8_gemm", "triton", _sig("fp8_gemm", xq.float(), None, wq, None, torch.bfloat16)) != ""
    assert _why("grouped_gemm", "triton", _sig("grouped_gemm", torch.zeros(128, 8), None, None)) == ""
    assert _why("grouped_gemm", "triton", _sig("grouped_gemm", torch.zeros(100, 8), None, None)) != ""


def test_mla_checks_and_flashmla_adapter_agree_on_dsa():
    from kernels import vendor
    q, kv = torch.zeros(2, 1, 4, 576, dtype=torch.bfloat16), torch.zeros(3, 64, 576, dtype=torch.bfloat16)
    args = (q, kv, torch.zeros(2, 3, dtype=torch.int32), torch.ones(2, dtype=torch.int32), 0.1, 512)
    dense, sparse = _sig("mla_decode", *args), _sig("mla_decode", *args, topk_indices=torch.zeros(2, 1, 8))
    assert _why("mla_decode", "flashmla", dense) == "" and _why("mla_decode", "triton", dense) == ""
    with pytest.raises(registry.Unsupported) as e:
        vendor.flashmla_decode(*args, topk_indices=torch.zeros(2, 1, 8))
    assert _why("mla_decode", "flashmla", sparse) == str(e.value)
    assert "page 32" in _why("mla_decode", "flashmla", _sig("mla_decode", q, kv[:, :32], *args[2:]))
    odd = _sig("mla_decode", torch.zeros(2, 1, 4, 560, dtype=torch.bfloat16), kv, *args[2:])   # rope dim 48
    assert "rope 48" in _why("mla_decode", "triton", odd)


def test_moe_checks_agree_with_the_deepgemm_adapter(monkeypatch):
    from kernels import vendor
    monkeypatch.setitem(registry._probe_cache, "triton", (True, "triton", "imported triton"))
    monkeypatch.delenv("TWINFER_KERNEL_MOE_EXPERTS", raising=False)
    args = _moe(4)
    with pytest.raises(registry.Unsupported) as e:
        vendor.deepgemm_moe_experts(*args)
    assert _why("moe_experts", "deepgemm", _sig("moe_experts", *args)) == str(e.value)
    assert _why("moe_experts", "deepgemm", _sig("moe_experts", *_moe(vendor.FUSED_MOE_MIN_TOKENS))) == ""
    monkeypatch.setenv("TWINFER_KERNEL_MOE_EXPERTS", "deepgemm")
    assert _why("moe_experts", "deepgemm", _sig("moe_experts", *args)) == ""
    assert "FP8" in _why("moe_experts", "deepgemm", _sig("moe_experts", *_moe(4, fp8=False)))
    assert _why("moe_experts", "triton", _sig("moe_experts", *_moe(4, fp8=False))) == ""
    assert _why("moe_experts", "triton", _sig("moe_experts", *_moe(4))) == ""
    x, *rest = _moe(4)
    assert "2-D" in _why("moe_experts", "triton", _sig("moe_experts", x[None], *rest))


@pytest.mark.parametrize("case", ["ok", "mask", "no_hint", "fp32", "gqa", "wide", "v_wide", "more_q", "no_q", "no_flash"])
def test_flash_prefill_check_agrees_with_flash_decline(case, monkeypatch):
    from kernels import prefill_attention as pa
    monkeypatch.setattr(torch.backends.cuda, "is_flash_attention_available", lambda: case != "no_flash")
    n, s, h, kvh, dqk, dv, dt = 4, 8, 4, 4, 192, 128, torch.bfloat16
    n, s, kvh, dqk, dv, dt = {"fp32": (n, s, kvh, dqk, dv, torch.float32), "gqa": (n, s, 2, dqk, dv, dt),
                              "wide": (n, s, kvh, 264, dv, dt), "v_wide": (n, s, kvh, 64, 128, dt),
                              "more_q": (9, s, kvh, dqk, dv, dt), "no_q": (0, s, kvh, dqk, dv, dt)}.get(case, (n, s, kvh, dqk, dv, dt))

    def fake(*shape):   # flash_decline reads device, dtype and shape only
        return SimpleNamespace(device=torch.device("cuda"), dtype=dt, shape=torch.Size(shape))
    q, k, v = fake(n, h, dqk), fake(s, kvh, dqk), fake(s, kvh, dv)
    mask = torch.ones(n, s, dtype=torch.bool) if case == "mask" else None
    hint = case != "no_hint"
    want = pa.flash_decline(q, k, v, mask, hint)
    got = _why("attention_prefill", "flash", _sig("attention_prefill", q, k, v, None, 0.1, mask, hint))
    assert (got == "") == (want == "") and (case == "ok") == (want == "")
    if case not in ("more_q", "no_q"):   # those two read lengths the signature keeps as one flag
        assert got == want


def _prefill(n=4, s=8, h=4, kvh=4, dqk=192, dv=128, dt=torch.bfloat16):
    return (torch.zeros(n, h, dqk, dtype=dt), torch.zeros(s, kvh, dqk, dtype=dt), torch.zeros(s, kvh, dv, dtype=dt),
            torch.arange(s - n, s), 0.1)


def test_prefill_fa3_first_when_found_flash_split_when_absent_sdpa_without_hint(hopper, monkeypatch):
    """FlashAttention-3 takes bottom-right chunks where its extension imports; without it the flash split does; a
    call without the caller's hint (or with a key mask) goes to the masked SDPA either way."""
    monkeypatch.setattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)
    k = Kernels(monkeypatch, "attention_prefill")
    args = _prefill()
    assert [i.name for i in ops.choice("attention_prefill", "cuda").candidates] == ["flash", "sdpa", "torch"]
    assert ops.call("attention_prefill", "cuda", *args, None, True) == "flash"
    ops.clear_choices()
    hopper("fa3")
    assert [i.name for i in ops.choice("attention_prefill", "cuda").candidates] == ["fa3", "flash", "sdpa", "torch"]
    assert "fa3: vendor library, preferred" in ops.choice("attention_prefill", "cuda").why
    assert ops.call("attention_prefill", "cuda", *args, None, True) == "fa3"
    assert ops.call("attention_prefill", "cuda", *args) == "sdpa"
    assert ops.call("attention_prefill", "cuda", *args, torch.ones(4, 8, dtype=torch.bool), True) == "sdpa"
    assert ops.call("attention_prefill", "cuda", *_prefill(dqk=64, dv=64, kvh=2), None, True) == "fa3"   # GQA
    assert ops.call("attention_prefill", "cuda", *_prefill(dqk=128, dv=64), None, True) == "flash"      # no such build
    assert "fa3: head dims q/k 128, v 64" in ops.fallbacks["attention_prefill"]
    assert k.calls == ["flash", "fa3", "sdpa", "sdpa", "fa3", "flash"]


@pytest.mark.parametrize("case,expect", [
    ("ok", ""), ("gqa", ""), ("equal", ""), ("no_hint", "bottom-right"), ("mask", "no explicit mask"),
    ("fp32", "fp16/bf16"), ("heads", "multiple of KV heads"), ("diff", "head dims"), ("wide", "head dims"),
    ("more_q", "more queries than keys"), ("no_q", "no queries")])
def test_fa3_check_and_adapter_agree(case, expect):
    """The registry's FA3 check on a signature and the adapter's own backstop (which runs the same check on the
    call) decline the same calls with the same words; on CPU the adapter declines what the check takes (sm90 only)."""
    kw = {"gqa": dict(kvh=2), "equal": dict(dqk=128, dv=128), "fp32": dict(dt=torch.float32), "heads": dict(kvh=3),
          "diff": dict(dqk=192, dv=64), "wide": dict(dqk=264, dv=264), "more_q": dict(n=9), "no_q": dict(n=0)}.get(case, {})
    q, k, v, pos, scale = _prefill(**kw)
    mask = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool) if case == "mask" else None
    hint = case != "no_hint"
    why = _why("attention_prefill", "fa3", _sig("attention_prefill", q, k, v, pos, scale, mask, hint))
    assert (expect in why) and (why == "") == (expect == "")
    from kernels import vendor
    with pytest.raises(registry.Unsupported) as e:
        vendor.fa3_prefill(q, k, v, pos, scale, mask, hint)
    assert str(e.value) == (why or "fa3: Hopper (sm90) only")


def test_fa3_is_not_usable_past_hopper(hopper, monkeypatch):
    """FlashAttention-3 is an sm90 kernel: on a newer major the choice skips it and says why (the flash split leads)."""
    hopper("fa3")
    monkeypatch.setattr(registry, "device_capability", lambda device: (10, 0) if device == "cuda" else None)
    ch = ops.choice("attention_prefill", "cuda")
    assert [i.name for i in ch.candidates][0] == "flash" and "fa3: runs on sm_9x only, device is sm_100" in ch.why


def test_deepgemm_declines_narrow_weights_at_decode_rows_to_triton(hopper, monkeypatch):
    """At <= 64 rows a weight of N <= 1024 goes to Triton (split-K) when Triton is there; 65+ rows, wider weights, a
    forced DeepGEMM or no Triton keep DeepGEMM. The warm-up's DeepGEMM list follows the same decision."""
    from kernels import warmup
    e4 = torch.float8_e4m3fn
    hopper("deepgemm", "triton")
    w576, w1536 = torch.zeros(576, 256, dtype=e4), torch.zeros(1536, 256, dtype=e4)
    x64, x65 = torch.zeros(64, 256, dtype=e4), torch.zeros(65, 256, dtype=e4)
    assert "split-K" in _why("fp8_gemm", "deepgemm", _sig("fp8_gemm", x64, None, w576, None))
    assert _why("fp8_gemm", "deepgemm", _sig("fp8_gemm", x65, None, w576, None)) == ""
    assert _why("fp8_gemm", "deepgemm", _sig("fp8_gemm", x64, None, w1536, None)) == ""
    k = Kernels(monkeypatch, "fp8_gemm")
    gemm = lambda x, w: ops.call("fp8_gemm", "cuda", x, None, w, None)   # noqa: E731 - the pretend device's choice
    assert gemm(x64, w576) == "triton" and gemm(x65, w576) == "deepgemm" and gemm(x64, w1536) == "deepgemm"
    assert k.calls == ["triton", "deepgemm", "deepgemm"]
    items = [warmup.WarmItem("fp8_gemm", m, n, 256) for m in (64, 65) for n in (576, 1536)]
    assert [(i.m, i.n) for i in warmup.deepgemm_items(items, "cuda")] == [(64, 1536), (65, 576), (65, 1536)]
    monkeypatch.setenv("TWINFER_KERNEL_FP8_GEMM", "deepgemm")
    assert _why("fp8_gemm", "deepgemm", _sig("fp8_gemm", x64, None, w576, None)) == ""
    monkeypatch.delenv("TWINFER_KERNEL_FP8_GEMM")
    monkeypatch.setitem(registry._probe_cache, "triton", (False, "", "not importable"))
    assert _why("fp8_gemm", "deepgemm", _sig("fp8_gemm", x64, None, w576, None)) == ""
