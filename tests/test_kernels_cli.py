"""``twinfer kernels``: the measured fraction of the ceiling per implementation from the committed op tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
from typer.testing import CliRunner  # noqa: E402

from benchmarks.gpu.cli import app  # noqa: E402
from kernels import measured  # noqa: E402

H200 = Path(__file__).resolve().parents[1] / "costmodels" / "data" / "op_tables" / "h200"


def _rows(*args):
    res = CliRunner().invoke(app, ["kernels", "--device", "cpu", "--json", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_h200_rows_carry_measured_fractions():
    out = _rows("--gpu", "H200")
    by = {(r["op"], r["impl"]): r["measured"] for r in out["rows"]}
    assert by[("fp8_gemm", "deepgemm")].startswith("decode 0.") and "prefill" in by[("fp8_gemm", "deepgemm")]
    assert by[("moe_experts", "deepgemm")].startswith("decode ")
    assert by[("mla_decode", "triton")] == "not in the measured table"
    assert "CUDA graphs" in out["measured"]


def test_unmeasured_gpu_says_so():
    out = _rows("--gpu", "B200")
    assert out["measured"] == "no measured table for B200"
    assert {r["measured"] for r in out["rows"]} == {"no measured table"}


def test_fraction_is_the_binding_resource(tmp_path):
    (tmp_path / "dense_gemm_fp8.csv").write_text(
        "lib,name,m,n,k,device_us,eager_us,tflops,tbs,rel_err,copies\n"
        "x,a,1,128,128,1,1,10,2.0,0,1\n"        # memory-bound: 2.0 / 4.0
        "x,a,8192,128,128,1,1,500,0.1,0,1\n"    # compute-bound: 500 / 1000
        "x,a/tp2,1,128,128,1,1,10,4.0,0,1\n")   # TP shards are not the TP1 summary
    fr = measured.fractions(tmp_path, peak_tflops=1000.0, copy_tbs=4.0)
    assert fr[("fp8_gemm", "x")]["decode"] == 0.5 and fr[("fp8_gemm", "x")]["prefill"] == 0.5
    assert fr[("fp8_gemm", "x")]["shapes"] == 2


def test_deepgemm_beats_triton_in_committed_h200_table():
    fr = measured.fractions(H200, 1310.0, 4.11)
    assert fr[("fp8_gemm", "deepgemm")]["prefill"] > fr[("fp8_gemm", "triton")]["prefill"]


def test_a_gpu_name_the_catalog_lacks_exits_2_naming_it(cli_exit_2):
    """`kernels --gpu bogus` said "no measured table for bogus" and exit 0, as for a catalog GPU without tables."""
    err = cli_exit_2("kernels", "--device", "cpu", "--gpu", "bogus")
    assert "--gpu 'bogus': unknown hardware 'bogus'" in err and "H200" in err


def test_cuda_without_a_cuda_device_warns_that_nothing_can_be_chosen(capsys, monkeypatch):
    import sys

    import torch

    from ui.cli import main
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    monkeypatch.setattr(sys, "argv", ["twinfer", "kernels", "--device", "cuda", "--json"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code in (0, None)
    got = capsys.readouterr()
    assert "torch sees no CUDA device here" in " ".join(got.err.split())
    assert not any(r["chosen"] for r in json.loads(got.out)["rows"])
