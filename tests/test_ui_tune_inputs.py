"""``twinfer tune``: inputs refused up front, naming the flag (exit 2), instead of an internal error after the search,
a search whose plan cannot be built, or a flag of the other mode silently ignored."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.tune_policies import TuneSpace, ep_layouts

PROFILE = str(Path(__file__).resolve().parents[1] / "profiles" / "h200" / "calibration_deepseek-v3-5layers_fp8.json")
CATALOG = ["-m", "tiny", "--hw", "h200", "-g", "2"]


@pytest.mark.parametrize("args, words", [
    (CATALOG + ["--load", "0"], "--load 0"),                        # was: an internal error after the whole search
    (CATALOG + ["--rate-per-gpu", "0"], "--rate-per-gpu 0"),        # the same
    (CATALOG + ["--objective", "foo"], "--objective 'foo': allowed: output_throughput"),   # was: ignored
    (["--profile", PROFILE, "--objective", "foo"], "--objective 'foo': allowed: output_throughput"),  # was: an internal error
    (CATALOG + ["--objective", "ttft_p50"], "--objective ttft_p50: only with --profile"),  # was: ignored, throughput won
    (CATALOG + ["--trace", "/nonexistent.jsonl"], "--trace: only with --profile"),   # was: ignored, the chat preset ran
    (CATALOG + ["--requests", "10"], "--requests: only with --profile"),
    (CATALOG + ["--max-num-seqs", "8"], "--max-num-seqs: only with --profile"),
    (["--profile", PROFILE, "--gpus", "8"], "--gpus: only without --profile"),       # was: ignored
    (["--profile", PROFILE, "--chunk-tokens", "512"], "--chunk-tokens: only without --profile"),
    (["--profile", PROFILE, "--max-model-len", "100000000"], "max_model_len: Input should be less than or equal to"),  # was: an internal error
    (["--measure", "-n", "4"], "tune: give --gpus N"),   # no mode chosen: was "--requests: only with --profile"
])
def test_bad_or_other_mode_values_exit_2_naming_the_flag(cli_exit_2, args, words):
    err = cli_exit_2("tune", *args)
    assert "internal error" not in err and words in err


def test_widths_past_a_deployments_instances_or_a_layouts_width_are_not_tried():
    """``--gpus 100000`` searched for a minute (2.3 GB) and then failed building the plan ('plan: instances: ... <= 4096
    (got 12500)'); the full-budget width printed a multi-line pydantic error as its reason."""
    options, rejected = ep_layouts("deepseek-v4-flash", "gb300", 100_000, None, TuneSpace())
    assert "12,500 instances of 8 GPUs: more than the 4,096 a deployment holds" in rejected[8]
    assert rejected[100_000] == "wider than the 1,024 GPUs an EP group spans (layout.ep)"
    assert all("\n" not in r for r in rejected.values())
    assert options and all(100_000 // w <= 4096 for w in options)


def test_a_cpu_profiles_ep_hint_names_no_gpu(tmp_path, capsys, monkeypatch):
    """tune -p on a CPU calibration hinted `--hardware H200`: the profile's hardware basis, only the cost model's
    reference there, not where it was measured."""
    import sys

    from costmodels.calibration import CalibrationProfile
    from ui.cli import main

    f = tmp_path / "cpu.json"
    CalibrationProfile.load(PROFILE).model_copy(update={"measured_on": "cpu"}).save(f)
    monkeypatch.setattr(sys, "argv", ["twinfer", "tune", "-p", str(f), "-n", "20"])
    with pytest.raises(SystemExit) as e:
        main()
    out = " ".join(capsys.readouterr().out.split())
    assert e.value.code in (0, None)
    assert "a one-CPU measured profile runs EP1" in out and "--hardware <GPU> --gpus N" in out and "--hardware H200" not in out


def test_measure_on_the_cpu_is_cpu_sized_unless_told():
    """`tune -p CPU_PROFILE --measure` replayed the chat preset's 1,000 requests (1.5k-token prompts, 400-token outputs)
    six times on the CPU: hours. As `run` does, the CPU's measure takes a slice unless every size is given."""
    from ui.cmd_run import CPU_MAX_INPUT, CPU_MAX_OUTPUT
    from ui.cmd_tune import CPU_TUNE_REQUESTS, cpu_measure_sizes

    n, i, o, note = cpu_measure_sizes(None, None, 64)
    assert (n, i, o) == (CPU_TUNE_REQUESTS, CPU_MAX_INPUT, 64) and f"{CPU_TUNE_REQUESTS} requests" in note
    assert cpu_measure_sizes(5, 100, 8) == (5, 100, 8, None)
    assert cpu_measure_sizes(5, None, None)[:3] == (5, CPU_MAX_INPUT, CPU_MAX_OUTPUT)
