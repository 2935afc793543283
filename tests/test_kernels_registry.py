"""Kernel registry: lazy probing, choices, overrides and fallback on Unsupported."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kernels import ops, registry  # noqa: E402


def test_cpu_picks_reference_for_every_op():
    for op in registry.IMPLS:
        ch = registry.choose(op, "cpu")
        assert ch.candidates and ch.candidates[0].tier == 0, op


def test_env_override_and_bad_override(monkeypatch):
    monkeypatch.setenv("TWINFER_KERNEL_MLA_DECODE", "triton")
    ch = registry.choose("mla_decode", "cpu")   # triton cannot run on cpu: reference, with the reason
    assert ch.candidates[0].tier == 0 and "unusable" in ch.why
    monkeypatch.setenv("TWINFER_KERNEL_MLA_DECODE", "nonsense")
    with pytest.raises(ValueError, match="known implementations"):
        registry.choose("mla_decode", "cpu")


def test_describe_lists_vendor_libraries():
    rows = registry.describe("cpu")
    names = {r["impl"] for r in rows}
    assert {"flashmla", "deepgemm", "flashinfer", "deepep", "triton", "torch"} <= names
    assert all("why" in r for r in rows)


def test_fallback_on_unsupported(monkeypatch):
    def refuse(*a, **k):
        raise registry.Unsupported("no")

    first = registry.Impl("sampling", "fake", 1, ("cpu",), "x:y")
    monkeypatch.setitem(ops._choices, ("sampling", "cpu"),
                        registry.Choice("sampling", "cpu", [first] + registry.IMPLS["sampling"], "test"))
    monkeypatch.setitem(registry._fn_cache, "x:y", refuse)
    logits = torch.randn(2, 5)
    out = ops.sample(logits, torch.zeros(2), torch.full((2,), -1), torch.ones(2), [None, None])
    assert torch.equal(out, logits.argmax(-1)) and ops.used["sampling"] == "torch"
