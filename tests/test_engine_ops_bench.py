"""The engine-ops benchmark (benchmarks/gpu/engine_ops.py): its CPU smoke mode runs every section through the
registry's choice and reports it against the best implementation timed; the summary flags a choice under 0.9x."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")


def test_engine_ops_smoke_runs_every_op_through_its_choice(tmp_path):
    from benchmarks.gpu import engine_ops as eo

    out = tmp_path / "e.json"
    eo.main(["--out", str(out), "--smoke"])
    res = json.loads(out.read_text())
    ops_seen = {r["op"] for r in res["rows_out"]}
    assert ops_seen == {"fp8_gemm", "moe_experts", "mla_decode", "attention_prefill", "quant_fp8_act", "rms_norm", "rope",
                        "silu_mul", "sampling"}, ops_seen
    for r in res["rows_out"]:
        assert "error" not in r, r
        assert r["choice"] in r["impls"] and r["choice_over_best"] == 1.0, r   # one implementation on the CPU
        ch = r["impls"][r["choice"]]
        assert ch["ms"] > 0 and "error" not in ch
        if r["op"] not in ("sampling",):
            assert ch["rel_err"] < 0.05, r   # against the fp32 reference (FP8 activation rounding for the quantiser)
    assert res["summary"][-1] == "below 0.9x at decode/prefill shapes: 0"
    with pytest.raises(SystemExit):
        eo.main(["--out", str(out), "--smoke", "--rows", "0"])


def test_engine_ops_summary_flags_a_slow_choice():
    from benchmarks.gpu.engine_ops import summary

    def row(m, choice_ms, other_ms):
        return {"op": "fp8_gemm", "m": m, "n": 7168, "k": 2048, "choice": "triton", "best": "deepgemm",
                "choice_over_best": round(other_ms / choice_ms, 3), "choice_over_best_vendor": round(other_ms / choice_ms, 3),
                "impls": {"triton": {"tier": 1, "ms": choice_ms, "tflops": 393.0, "frac_fp8_peak": 0.3, "frac_copy": 0.5},
                          "deepgemm": {"tier": 2, "ms": other_ms, "tflops": 1441.0}}}

    lines = summary([row(64, 0.010, 0.0095), row(4096, 0.100, 0.060), row(512, 0.1, 0.05)])
    assert lines[0].startswith("FP8 ceiling 1441 TFLOP/s: deepgemm fp8_gemm m=64")   # a kernel beat the measured 1310
    assert lines[2].endswith("0.50 copy") and lines[3].endswith("0.27 FP8")           # decode rows: bandwidth; prefill: FP8
    assert lines[-2] == "worst choice/best per op and band: fp8_gemm decode 0.950, fp8_gemm other 0.500, fp8_gemm prefill 0.600"
    assert lines[-1].startswith("below 0.9x at decode/prefill shapes: 1") and "m=4096 n=7168: triton 0.6 of deepgemm" in lines[-1]
