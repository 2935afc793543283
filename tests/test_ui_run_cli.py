"""``twinfer run`` on CPU: a CPU-sized default, --json on stdout (--out for a file), a progress bar."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from ui.cli import app  # noqa: E402
from ui.cmd_run import CPU_MAX_INPUT, CPU_MAX_OUTPUT, CPU_REQUESTS  # noqa: E402


def test_cpu_sized_default_progress_and_out_file(tmp_path):
    out = tmp_path / "run.json"
    r = CliRunner().invoke(app, ["run", "--model", "tiny", "--device", "cpu", "-n", "2", "--max-output-len", "2", "--block-size", "16",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    assert data["run"]["requests"] == 2 and data["metrics"]["output_tokens"] == 4
    assert data["metrics"]["input_tokens"] <= 2 * CPU_MAX_INPUT  # the prompt clamp applies though only -n was given
    assert f"prompts <= {CPU_MAX_INPUT}" in r.stderr and "2/2" in r.stderr and "ETA" in r.stderr  # the note and the final bar
    assert "requests finished" in r.stdout
    assert CPU_REQUESTS <= 16 and CPU_MAX_OUTPUT <= 32


def test_json_prints_only_json_on_stdout():
    r = CliRunner().invoke(app, ["run", "--model", "tiny", "--device", "cpu", "-n", "1", "--max-output-len", "1", "--block-size", "16",
                                 "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["metrics"]["requests_finished"] == 1


def test_json_is_a_flag_not_a_path(tmp_path):
    r = CliRunner().invoke(app, ["run", "--json", str(tmp_path / "x.json")])
    assert r.exit_code == 2 and not (tmp_path / "x.json").exists()


def test_ctrl_c_prints_the_finished_requests_figures(monkeypatch):
    """A run cut by Ctrl-C exits 130 with the figures of the requests it finished (not only counts)."""
    import executor.replay as rp

    loop = rp._loop

    def cut_after_first(engine, items, *rest):
        loop(engine, items[:1], *rest)   # the first request runs to the end, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(rp, "_loop", cut_after_first)
    r = CliRunner().invoke(app, ["run", "--model", "tiny", "--device", "cpu", "-n", "3", "--max-output-len", "2", "--block-size", "16"])
    assert r.exit_code == 130, r.output
    assert "interrupted after" in r.stderr and "partial figures over the 1 finished requests" in r.stderr
    assert "TTFT ms mean/p50/p90/p99" in r.stderr and "Traceback" not in r.output


def test_dropped_requests_say_why_and_the_record_holds_the_engines_limit(tmp_path):
    """A prompt past --max-model-len is dropped with its reason printed under the table (whole, not cut mid-phrase), and
    the JSON records the scheduler as the engine runs it (the model length it enforced, not the option's default)."""
    out = tmp_path / "run.json"
    r = CliRunner().invoke(app, ["run", "--model", "tiny", "--device", "cpu", "-n", "4", "--max-input-len", "96", "--max-output-len", "2",
                                 "--max-model-len", "64", "--block-size", "16", "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    m = data["metrics"]
    assert data["run"]["scheduler"]["max_model_len"] == 64
    assert m["requests_dropped"] >= 1 and m["requests_finished"] + m["requests_dropped"] == 4
    reason = next(iter(m["dropped_by_reason"]))
    assert reason.endswith("max_model_len is 64 (prompt + at least one output token)"), reason
    assert "dropped" in r.stdout and "max_model_len is 64" in r.stdout


@pytest.mark.parametrize("args,file_max,finished", [([], 2, 2), (["-n", "3"], 2, 3), ([], None, 3)])
def test_a_trace_workload_runs_on_the_cpu_its_count_as_max_requests(tmp_path, args, file_max, finished):
    """A trace workload file could not run on the CPU at all: the CPU-sized default (and any -n) was set as
    num_requests, which a trace refuses ("num_requests: a trace takes max_requests"), a field the user never wrote.
    -n is a trace's max_requests; the CPU default caps a file's own count without raising it."""
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 0.05 * i, "input_length": 10 + i, "output_length": 2}) + "\n"
                             for i in range(3)))
    wl = tmp_path / "w.yaml"
    wl.write_text(f"kind: trace\ntrace_path: {trace}\n" + (f"max_requests: {file_max}\n" if file_max else ""))
    r = CliRunner().invoke(app, ["run", "--model", "tiny", "--device", "cpu", "-w", str(wl), "--block-size", "16",
                                 "--json", *args])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["metrics"]["requests_finished"] == finished


def test_a_workload_file_that_does_not_exist_is_named_as_a_missing_file(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "ui.cli", "run", "--model", "tiny", "--device", "cpu", "-w",
                        str(tmp_path / "nosuch.yaml")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "nosuch.yaml: no such file" in r.stderr, r.stderr


def test_the_step_log_is_strict_json_with_unmeasured_times_null(tmp_path):
    """On the CPU the device and forward times are not measured (NaN), which the step log wrote as NaN: not JSON."""
    log = tmp_path / "steps.jsonl"
    r = CliRunner().invoke(app, ["run", "--model", "tiny", "--device", "cpu", "-n", "1", "--max-output-len", "2",
                                 "--block-size", "16", "--step-log", str(log), "--json"])
    assert r.exit_code == 0, r.output

    def refuse(c):
        raise ValueError(c)
    lines = [json.loads(line, parse_constant=refuse) for line in log.read_text().splitlines()]
    assert lines and all(x["device_s"] is None for x in lines)


def test_a_request_past_a_kv_pool_smaller_than_the_context_names_the_pool():
    """--num-kv-blocks 1 dropped every request with "max_model_len is 64", a flag the user never gave: the engine had
    set the context to what the pool holds, and now says so."""
    r = CliRunner().invoke(app, ["run", "--model", "tiny", "--device", "cpu", "-n", "1", "--num-kv-blocks", "1",
                                 "--block-size", "64"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "max_model_len is 64, the KV pool's (num_kv_blocks=1 of 64 tokens)" in text, text


def test_a_workload_files_bad_count_is_named_on_a_cpu_sized_run(tmp_path):
    """On the CPU the default count capped the file's own with int(), before validation: `num_requests: lots` was an
    internal error (ValueError) and 2.5 was cut to 2."""
    from twinfer.errors import TwinferError
    from ui.cmd_run import _load_workload

    for bad in ("lots", 2.5):
        f = tmp_path / "w.yaml"
        f.write_text(f"kind: poisson\nrate: 1\nnum_requests: {bad}\n")
        with pytest.raises(TwinferError, match="num_requests"):
            _load_workload(str(f), None, None, CPU_REQUESTS)
    f.write_text("kind: poisson\nrate: 1\nnum_requests: 3\n")
    assert _load_workload(str(f), None, None, CPU_REQUESTS).num_requests == 3
