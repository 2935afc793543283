"""Global input budgets and input-caused errors at the CLI and in the UI's uploads (issue 20, items 1, 4, 9).

Each bad input must exit 2 with one `error:` line naming the file or field, quickly (refused before
anything large is allocated), never "internal error". The commands run as subprocesses, at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from test_fuzz_helpers import CORPUS
from twinfer.errors import TwinferError

CLI = [sys.executable, "-m", "ui.cli"]
TRACES = CORPUS / "trace_jsonl"


def _cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (arguments, text the one-line error must contain)."""
    (tmp / "not_utf8.jsonl").write_bytes(b'{"timestamp": 0, "input_length": 5, "output_length": 1}\n\xff\xfe\n')
    (tmp / "not_json.json").write_text("this is not json", encoding="utf-8")
    (tmp / "not_a_report.json").write_text('{"x": 1}', encoding="utf-8")
    (tmp / "huge_int.yaml").write_text("workload: {kind: poisson, rate: 1, num_requests: 1" + "0" * 5000 + "}\n",
                                       encoding="utf-8")
    (tmp / "long_run.yaml").write_text("workload: {kind: poisson, rate: 1000000, duration_s: 100000}\n", encoding="utf-8")
    (tmp / "a_dir.jsonl").mkdir()
    few = ["--requests", "20"]
    return {
        "trace-hash-budget": (["simulate", "--trace", str(TRACES / "coarse_hash_ids_on_many_lines_exhaust_memory.jsonl")],
                              "block hashes"),
        "trace-huge-int": (["simulate", "--trace", str(TRACES / "integer_of_5000_digits.jsonl")], "4300 digits"),
        "trace-deep-nesting": (["simulate", "--trace", str(TRACES / "deeply_nested_line.jsonl")], "nested too deeply"),
        "trace-not-utf8": (["simulate", "--trace", str(tmp / "not_utf8.jsonl")], "not_utf8.jsonl:2: not UTF-8"),
        "trace-is-a-directory": (["simulate", "--trace", str(tmp / "a_dir.jsonl")], "a_dir.jsonl"),
        "requests-1e9": (["simulate", "--requests", "1000000000"], "num_requests"),
        "rate-times-duration": (["simulate", "--scenario", str(tmp / "long_run.yaml")], "rate x duration_s"),
        "csv-unwritable": (["simulate", *few, "--csv", str(tmp / "no" / "such" / "dir" / "m.csv")], "m.csv"),
        "perfetto-unwritable": (["simulate", *few, "--perfetto", str(tmp / "a_dir.jsonl")], "a_dir.jsonl"),
        "error-band-not-json": (["simulate", *few, "--error-band", str(tmp / "not_json.json")], "not_json.json"),
        "error-band-not-a-report": (["simulate", *few, "--error-band", str(tmp / "not_a_report.json")], "not_a_report.json"),
        "error-band-missing": (["simulate", *few, "--error-band", str(tmp / "missing.json")], "missing.json: no such file"),
        "scenario-huge-int": (["simulate", "--scenario", str(tmp / "huge_int.yaml")], "huge_int.yaml"),
        "plan-out-unwritable": (["plan", "--gpus", "8", "--hw", "h200", "--slo", "ttft_p90=2s,tpot_p90=50ms",
                                 "--simulate", "0", "--out", str(tmp / "no" / "dir" / "p.yaml")], "p.yaml"),
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inputs")
    cases = _cases(tmp)
    env = {k: v for k, v in os.environ.items() if k != "TWINFER_DEBUG"}

    def run(args):
        return subprocess.run(CLI + args, capture_output=True, text=True, timeout=120, env=env, cwd=tmp)

    with ThreadPoolExecutor(max_workers=4) as pool:
        outs = dict(zip(cases, pool.map(run, [a for a, _ in cases.values()])))
    return {name: (outs[name], cases[name][1]) for name in cases}


CASE_NAMES = [
    "trace-hash-budget", "trace-huge-int", "trace-deep-nesting", "trace-not-utf8", "trace-is-a-directory",
    "requests-1e9", "rate-times-duration", "csv-unwritable", "perfetto-unwritable", "error-band-not-json",
    "error-band-not-a-report", "error-band-missing", "scenario-huge-int", "plan-out-unwritable"]


@pytest.mark.parametrize("name", CASE_NAMES)
def test_bad_input_exits_2_with_one_line_naming_it(results, name):
    proc, needle = results[name]
    err_lines = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert proc.returncode == 2, (name, proc.returncode, proc.stderr[-2000:])
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(err_lines) == 1, proc.stderr
    joined = " ".join(proc.stderr.split())   # rich may wrap a long line
    assert needle in joined, (needle, proc.stderr)


# ----------------------------------------------------------------------------- budgets, in process


def test_trace_hash_budget_is_checked_before_any_hash_is_built(tmp_path):
    from sim.traces import read_trace

    p = tmp_path / "t.jsonl"
    lines = [{"timestamp": i, "input_length": 1 << 20, "output_length": 1, "hash_ids": [i], "hash_block_size": 1 << 20}
             for i in range(40)]
    p.write_text("\n".join(json.dumps(x) for x in lines), encoding="utf-8")
    assert len(read_trace(p, 16, max_block_hashes=40 * 65536)) == 40       # exactly at the budget: fine
    with pytest.raises(TwinferError, match="hash_ids: .* at most 2,621,439"):
        read_trace(p, 16, max_block_hashes=40 * 65536 - 1)
    assert len(read_trace(p, 16, max_requests=2, max_block_hashes=2 * 65536)) == 2   # counted after max_requests


def test_private_block_hashes_share_the_budget():
    import numpy as np

    from sim.traces import MAX_BLOCK_HASHES
    from sim.workload import WorkloadSpec, generate

    spec = WorkloadSpec.model_validate({"kind": "poisson", "rate": 1.0, "num_requests": 3000, "hash_private_blocks": True,
                                        "input_len": {"kind": "fixed", "value": 1 << 20}})
    with pytest.raises(TwinferError, match=f"at most {MAX_BLOCK_HASHES:,}"):
        generate(spec, np.random.default_rng(0), 16)


# ----------------------------------------------------------------------------- the UI's uploads


@pytest.mark.parametrize("fn, name, data", [
    ("save_trace", "t.jsonl", "\n".join(json.dumps({"timestamp": i, "input_length": 1 << 24, "output_length": 1,
                                                    "hash_ids": [1], "hash_block_size": 1 << 24})
                                         for i in range(200)).encode()),
    ("save_trace", "t.jsonl", b'{"timestamp": 1' + b"0" * 5000 + b', "input_length": 5, "output_length": 1}'),
    ("save_trace", "t.jsonl", b'{"timestamp": 0, "input_length": 5, "output_length": 1, "x": ' + b"[" * 50_000 + b"}"),
    ("save_trace", "t.jsonl", b"\xff\xfe"),
    ("save_model_config", "c.json", b'{"model_type": 1' + b"0" * 5000 + b"}"),
    ("save_model_config", "c.json", b"[" * 100_000),
    ("save_hardware_yaml", "h.yaml", b"name: x\nhbm_gb: 1" + b"0" * 5000),
    ("save_hardware_yaml", "h.yaml", b"a: &a [1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
                                     b"c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
                                     b"e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
                                     b"g: [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"),
], ids=["trace-22kb-expands-to-gb", "trace-huge-int", "trace-deep", "trace-not-utf8", "config-huge-int",
        "config-deep", "hardware-huge-int", "hardware-alias-bomb"])
def test_uploads_refuse_with_a_message_naming_the_upload(tmp_path, monkeypatch, fn, name, data):
    monkeypatch.setenv("TWINFER_UI_UPLOADS", str(tmp_path))
    import ui.app_uploads as up

    with pytest.raises(TwinferError) as exc:
        getattr(up, fn)(name, data, *(["jsonl"] if fn == "save_trace" else []))
    assert name in str(exc.value) or "values" in str(exc.value), str(exc.value)
    assert str(tmp_path) not in str(exc.value).splitlines()[0]
