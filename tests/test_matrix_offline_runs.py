"""The offline matrix scripts read a class-set run's options (window, per-class requests, replay count) and split
three concatenated replays; CPU only, no GPU data needed."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# How close an archived run's re-simulation at HEAD reads the device's printed figures: to the printed digit, except
# on the H100 runs, whose re-simulation prices prefill's KV streaming from the H200's FlashMLA table moved to the H100
# (op_table.transferred): since 2026-12-07 its roofline moves and its time over it stays, which moves those runs'
# figures by up to 0.1 point from what the device printed with the rule before.
DIGIT = 0.0006
H100_DIGIT = 0.0015


def _digit(run: Path) -> float:
    """The tolerance for ``run`` (a run folder or its unpacked copy): by the GPU its matrix file names."""
    gpu = json.loads((run / "matrix_deepseek-v3-5layers_fp8.json").read_text()).get("provenance", {}).get("gpu", "")
    return H100_DIGIT if "H100" in gpu else DIGIT
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_run_options_come_from_the_matrix_command(tmp_path):
    import matrix_offline as mo
    import step_residuals as sr
    assert mo.run_max_model_len(tmp_path) == 8192 and mo.run_class_requests(tmp_path) == {} and sr.run_replays(tmp_path) == 2
    cmd = ("python3 scripts/device_matrix.py --out /o --requests 96 --runs 3 --classes chat,longctx --max-model-len 16384 "
           "--class-requests longctx=24,chat=80 --no-async-overlap")
    (tmp_path / "matrix_x.json").write_text(json.dumps({"command": cmd}))
    assert mo.run_max_model_len(tmp_path) == 16384 and mo.run_requests(tmp_path) == 96 and sr.run_replays(tmp_path) == 3
    assert mo.run_class_requests(tmp_path) == {"longctx": 24, "chat": 80}
    assert mo.kv_blocks(16384) == 128 * 256 + 64 and mo.BLOCKS == mo.kv_blocks(8192)
    reqs = mo.class_requests("longctx", 24, 16384)
    assert len(reqs) == 24 and min(r.prompt_len for r in reqs) >= 8500 and max(r.prompt_len for r in reqs) <= 12000


def test_three_concatenated_replays_are_numbered():
    import step_residuals as sr
    one = {"decodes": [0, 1, 2, 2], "decode_ctx_mean": [0, 10, 11, 12], "prefill_tokens": [100, 50, 0, 0],
           "prefill_chunks": [1, 1, 0, 0], "prefill_ctx": [0, 0, 0, 0], "graph_bs": [0, 0, 2, 2]}
    s = {k: v * 3 for k, v in one.items()}
    s["measured_s"] = [0.01] * 12
    assert sr.replay_numbers(s, 3) == [1] * 4 + [2] * 4 + [3] * 4
    assert sr.replay_boundary(s) in (4, 8)
    assert sr.replay_numbers(s, 1) == [1] * 12


def test_eager_split_prints_issue_against_the_model_host(capsys):
    import numpy as np
    import step_residuals as sr

    from costmodels.calibration import CalibrationProfile
    from costmodels.hardware import get_hardware
    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_profile import HostTerms, StepProfile

    st = StepProfile(model="deepseek-v3", num_layers=4, dtype="fp8", device="cuda",
                     host=HostTerms(fixed_s=4e-3, per_prefill_s=1e-3, decode_group_s=2e-3))
    prof = CalibrationProfile.default(get_hardware("H200")).model_copy(update={"step": st})
    cost = ProfiledStepCost(prof, st)
    nan = float("nan")
    c = {k: np.array(v, float) for k, v in {
        "decodes": [3, 0, 2], "decode_ctx_mean": [100, 0, 50], "prefill_tokens": [200, 300, 0], "prefill_chunks": [1, 1, 0],
        "prefill_ctx": [0, 0, 0], "forward_s": [0.02, 0.02, 0.004], "forward_host_s": [0.0071, 0.0052, 0.001]}.items()}
    sr.eager_split(c, cost, prof)
    out = capsys.readouterr().out
    assert "mixed <=512 tok" in out and "issue   7.10 vs H   7.00" in out      # 4 + 1 + 2 ms: the model's H
    assert "prefill <=512 tok" in out and "issue   5.20 vs H   5.00" in out
    c["forward_host_s"][:] = nan                                               # runs before 20: nothing printed
    sr.eager_split(c, cost, prof)
    assert capsys.readouterr().out == ""


def test_loop_split_prints_the_loop_parts(capsys):
    import numpy as np
    import step_residuals as sr

    from costmodels.step_profile import LoopTerms, StepProfile

    class P:
        step = StepProfile(model="deepseek-v3", num_layers=4, loop=LoopTerms(fixed_s=2e-4, per_request_s=1e-5))
    c = {k: np.array(v) for k, v in {
        "cls": ["a"] * 4, "decodes": [2, 2, 2, 0], "prefill_chunks": [0, 0, 0, 1], "prefill_tokens": [0, 0, 0, 64],
        "measured_s": [0.0060, 0.0062, 0.0061, 0.02], "runner_s": [0.0055, 0.0057, 0.0056, 0.019],
        "admit_s": [0.0, 0.0001, 0.0, 0.0003], "schedule_s": [0.0001] * 4, "complete_s": [0.0002] * 4}.items()}
    sr.loop_split(c, P)
    out = capsys.readouterr().out
    assert "a          decode        3 steps: loop  0.50 = admit  0.00 + schedule  0.10 + complete  0.20" in out
    assert "model  0.22" in out and "prefill" not in out.split("\n", 1)[1]     # fewer than 3 prefill steps: no line


def test_async_gain_on_the_committed_bench():
    """Issue 23's target on the committed H200 async bench (after the per-step syncs went), with the committed H200
    profile (the same engine's calibration, fitted at HEAD, its sampler's device work timed apart in another process):
    the simulator's throughput gain from async overlap within 5 points of the measured one at every load: +0.5 / +1.9 /
    +7.0% against +0.5 / +3.3 / +11.7%. Past saturation it is the closest call (4.7 points); with the sampler's eager
    seconds all counted as device work it was +5.7% (6.0 points short)."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    import async_overlap_offline as aoo

    rows = aoo.main([str(ROOT / "benchmarks/gpu/issue23_h200/run_async_301c879/async_overlap.json"),
                     str(ROOT / "profiles/h200/calibration_deepseek-v3-5layers_fp8.json")])
    assert [r["level"] for r in rows] == ["low", "knee", "past saturation"]
    assert all(abs(r["simulator"] - r["measured"]) < 0.05 for r in rows)


def _unpacked(run: str, dst: Path) -> Path:
    """A copy of an archived H200 matrix run with its packed reports unpacked (what scripts/matrix_offline.py reads)."""
    import shutil
    import tarfile

    from sim.timeline_check import reports_archive

    src = ROOT / "benchmarks" / "gpu" / "issue16_h200" / run
    dst.mkdir()
    for f in src.glob("*.json"):
        shutil.copy(f, dst / f.name)
    with tarfile.open(reports_archive(src)) as t:
        t.extractall(dst, filter="data")
    return dst


def test_held_out_runs_22_and_23_at_head(tmp_path, capsys):
    """The twin at HEAD on H200 runs 22 (synchronous loop) and 23 (pipelined loop), each fitted on its own calibration
    only (agentic, summarize, reasoning at three loads; the model was built on runs 20-21). Run 23 with the sampler's
    device work measured in another process (run 25) merged into its calibration: every figure within issue 16's
    targets but reasoning's TTFT past saturation (p50 -9.7%, p90 -12.2%; -4.6 / -9.4% before the after-prompt terms
    were priced as host work of the launch, where its low load's TTFT p50 went from -7.4% to -0.5%). Run 22: throughput
    and TPOT within target; reasoning's TTFT misses by up to 1.3 points (its first-token
    mixed steps, docs/twin.md), pinned here so that a change that widens it fails."""
    import matrix_offline as mo

    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    import sampler_split

    r23 = _unpacked("run23_async_agentic_summarize_reasoning_1fc801e", tmp_path / "r23")
    cal = r23 / "calibration_deepseek-v3-5layers_fp8.json"
    sampler_split.merge(str(cal), str(ROOT / "benchmarks/gpu/issue23_h200/sampler_split_37e066b/sampler_split.json"), str(cal))
    w23 = mo.main([str(r23), "--refit", "auto"])
    assert abs(w23["output_throughput"][0]) <= 0.05 and abs(w23["tpot_p50"][0]) <= 0.05
    assert abs(w23["ttft_p50"][0]) <= 0.10 and abs(w23["ttft_p90"][0]) <= 0.123
    assert w23["ttft_p90"][1] == "reasoning past saturation"
    w22 = mo.main([str(_unpacked("run22_agentic_summarize_reasoning_215088b", tmp_path / "r22")), "--sync", "--refit", "auto"])
    assert abs(w22["output_throughput"][0]) <= 0.05 and abs(w22["tpot_p50"][0]) <= 0.05
    assert abs(w22["ttft_p50"][0]) <= 0.12 and abs(w22["ttft_p90"][0]) <= 0.12
    assert w22["ttft_p50"][1].startswith("reasoning")


def test_held_out_run_26_at_head(tmp_path):
    """H200 run 26 (reasoning, chat, longctx; synchronous loop), calibrated at 479edd3 with the Linear timed at every
    token bucket, fitted on its own calibration only, every class held out. Throughput within 5.5%, TTFT p50 within
    target; TPOT misses by up to 2.4 points (chat low: its decode steps' host part ran 5-28% above the calibration's
    in most replays) and reasoning's TTFT p90 past saturation by 2.9 (its first-token mixed steps, host-bound, over-
    predicted: their issue ran faster in serving than in the grid). Pinned at those figures, so that a change that
    widens any of them fails (docs/twin.md, run 26)."""
    import matrix_offline as mo

    w = mo.main([str(_unpacked("run26_reasoning_chat_longctx_479edd3", tmp_path / "r26")), "--sync", "--refit", "auto"])
    _worst_within(w, 0.056, 0.075, 0.05, 0.13)
    assert w["ttft_p90"][1].startswith("reasoning") and w["tpot_p50"][1].startswith("chat")


def test_held_out_run_27_at_head(tmp_path):
    """H200 run 27 (agentic, summarize, reasoning: run 22's classes; synchronous loop), calibrated at 8f50a69, the first
    calibration that times the model's own FP8 GEMM shapes at every token bucket, every class held out. Re-fitted from
    its own calibration points (``--refit auto``, what the calibration itself now fits: at 8f50a69 its in-process fit
    priced GEMMs from the committed op table while its predictions priced them from its own table, and that mix met
    every target). Consistently fitted: throughput within 1.9%, TTFT p90 within 6.1%; TPOT misses at agentic's knee
    (-8.7%, decode steps under-predicted) and TTFT p50 at summarize's knee (-10.8%). Pinned at those figures, so that
    a change that widens any of them fails (docs/twin.md, run 27)."""
    import matrix_offline as mo

    w = mo.main([str(_unpacked("run27_agentic_summarize_reasoning_8f50a69", tmp_path / "r27")), "--sync", "--refit", "auto"])
    _worst_within(w, 0.02, 0.088, 0.109, 0.062)
    assert w["tpot_p50"][1].startswith("agentic") and w["ttft_p50"][1].startswith("summarize")



def test_held_out_runs_28_and_29_at_head(tmp_path):
    """H200 runs 28 (agentic, summarize, chat at 5a62520) and 29 (agentic, chat, reasoning at 266caf6: admission
    measured as serving admits), synchronous loop, each fitted in-process on its own calibration (consistently since
    65c3c5c), every class held out; re-predicted here from the archives exactly as the device printed them.
    Run 28: throughput within 0.9%, TTFT within 7.2%; TPOT misses at chat's knee (-6.5%) and summarize's (-6.3%).
    Run 29: TTFT within 9.0%; throughput misses past saturation on reasoning (-5.2%), TPOT at agentic's knee (-10.3%;
    its three replays spread 8.9%) and reasoning's knee (+8.1%: its decode host part ran 14-21% under the model in
    every replay, the calibration's grid host 30-50% slower than run 28's at the same batch). Pinned at those
    figures, so that a change that widens any of them fails (docs/twin.md, runs 28-29)."""
    import matrix_offline as mo

    w = mo.main([str(_unpacked("run28_agentic_summarize_chat_5a62520", tmp_path / "r28")), "--sync"])
    _worst_within(w, 0.01, 0.066, 0.073, 0.057)
    assert w["tpot_p50"][1].startswith("chat")
    w = mo.main([str(_unpacked("run29_agentic_chat_reasoning_266caf6", tmp_path / "r29")), "--sync"])
    _worst_within(w, 0.053, 0.104, 0.086, 0.091)
    assert w["tpot_p50"][1].startswith("agentic") and w["output_throughput"][1].startswith("reasoning")

def test_held_out_run_30_chat_on_the_deepgemm_engine(tmp_path):
    """H200 run 30 (chat at e100c64): the registry's default kernels (DeepGEMM dense GEMMs, Triton for the narrow
    ones at decode rows), synchronous loop, fitted in-process on its own calibration, chat held out; re-predicted from
    the archive as the device printed it. Throughput within 4.2%, TTFT p50 within 7.1%, step MAPE 4.9%; TPOT p50
    -6.2..-8.4% and TTFT p90 -11.0% past saturation: chat's decode steps ran 2-9% above the calibration grid at the
    same batch, at every distance from the last prompt step (docs/twin.md, run 30). Pinned at those figures."""
    import matrix_offline as mo

    w = mo.main([str(_unpacked("run30_chat_deepgemm_e100c64", tmp_path / "r30")), "--sync"])
    _worst_within(w, 0.043, 0.085, 0.072, 0.111)
    assert all(v[1].startswith("chat") for v in w.values())


def _worst_within(worst: dict, throughput: float, tpot_p50: float, ttft_p50: float, ttft_p90: float) -> None:
    """``matrix_offline.main``'s worst relative error of each end-to-end figure, over every class and level, within
    its pinned bound."""
    bounds = {"output_throughput": throughput, "tpot_p50": tpot_p50, "ttft_p50": ttft_p50, "ttft_p90": ttft_p90}
    for key, bound in bounds.items():
        assert abs(worst[key][0]) <= bound, (key, worst[key], bound)


def _level_step_mape(run: Path, sync: bool, refit: str | None = None) -> dict[tuple[str, str], float]:
    """Per class and level: the per-step MAPE over all replays' steps, the step model at HEAD on the run's own profile
    (what validate's ``step`` figure and the log's "per-step MAPE" line report)."""
    import numpy as np
    import step_residuals as sr

    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_fit import errors, run_profile

    prof = run_profile(run, refit)
    cost = ProfiledStepCost(prof)
    out = {}
    for cls, levels in sr.load_samples(run).items():
        for lv, s in levels.items():
            p = sr.predict(cost, prof, s, sync, sr.replay_numbers(s, sr.run_replays(run)))
            out[(cls, lv)] = errors(p, np.array(s["measured_s"]))["mape"]
    return out


def test_held_out_runs_31_and_32_on_the_pipelined_loop(tmp_path):
    """H200 runs 31 (agentic, chat, reasoning at 5ab1ab5) and 32 (summarize, and longctx beyond the calibration grid:
    prompts 8.5-12k, at 10e491e): the pipelined loop, serving's default (``--async-overlap``), Triton GEMMs, each
    fitted in-process on its own calibration, every class held out; re-predicted from the archives with the loop
    priced launch by launch (``costmodels.host.pipeline_step``). Run 31 meets every target in all nine cells (worst:
    throughput -2.8%, TPOT p50 +4.5%, TTFT p50 -4.1%, TTFT p90 -7.6%, step MAPE 4.5%); at the run's own commit, priced
    step by step, agentic past saturation's step MAPE missed (5.45%). Run 32: every figure within target (summarize's
    knee step MAPE 4.6%: 5.15% with the after-prompt terms on the device side, 7.3% priced step by step); longctx's
    knee TTFT p50, -11.7% priced step by step (its first chunks' iterations ran short by the decode work they
    overlapped), is -3.2% (docs/twin.md, runs 31-35).
    Pinned at those figures, so that a change that widens any of them fails."""
    import matrix_offline as mo

    r31 = _unpacked("run31_async_agentic_chat_reasoning_5ab1ab5", tmp_path / "r31")
    w = mo.main([str(r31)])
    _worst_within(w, 0.029, 0.046, 0.042, 0.077)
    m = _level_step_mape(r31, sync=False)
    assert len(m) == 9 and max(m.values()) <= 0.0457 and max(m, key=m.get) == ("chat", "knee")
    r32 = _unpacked("run32_async_summarize_longctx_10e491e", tmp_path / "r32")
    w = mo.main([str(r32)])
    _worst_within(w, 0.015, 0.029, 0.033, 0.079)
    assert w["ttft_p90"][1] == "summarize knee"
    m = _level_step_mape(r32, sync=False)
    assert len(m) == 6 and max(m.values()) <= 0.0465 and max(m, key=m.get) == ("summarize", "knee")
    assert sorted(m.values())[-2] <= 0.035


def test_held_out_run_33_pipelined_on_the_default_kernels(tmp_path):
    """H200 run 33 (chat, agentic at 6ae37da): the pipelined loop on the registry's default kernels (DeepGEMM dense
    GEMMs), fitted in-process on its own calibration (its CUDA-graph forwards timed on an idle GPU only), both classes
    held out, priced launch by launch. Throughput within 1.0%, TTFT p90 within 3.6%; TPOT p50 +5.5% at agentic's knee,
    TTFT p50 -9.1% past saturation; step MAPE chat 4.6 / 9.8 / 8.6%, agentic 3.5 / 5.1 / 5.1%. Its decode steps ran
    6-16% under the idle grid at the same batch: the idle forward holds the GPU's wait for the launch (run 34, whose
    calibration also timed the forwards held, is the one that shows it). Pinned at those figures."""
    import matrix_offline as mo

    r33 = _unpacked("run33_async_deepgemm_chat_agentic_6ae37da", tmp_path / "r33")
    w = mo.main([str(r33)])
    _worst_within(w, 0.011, 0.056, 0.092, 0.037)
    m = _level_step_mape(r33, sync=False)
    assert len(m) == 6 and max(m.values()) <= 0.099 and max(m, key=m.get) == ("chat", "knee")
    assert m[("agentic", "low")] <= 0.035 and m[("chat", "low")] <= 0.048 and m[("agentic", "knee")] <= 0.053


def test_held_out_run_34_with_the_held_forward_fit(tmp_path):
    """H200 run 34 (chat, agentic at b24ed5a, DeepGEMM): the first calibration that timed its CUDA-graph forwards
    with the GPU held busy too. Refitted as a calibration at HEAD fits (the device scale pinned to the held forwards:
    1.11 where the idle ones gave 1.16; the sampler's host issue from the points' measured phase) and priced launch by
    launch, both classes held out: all 30 targets met (worst: throughput +1.0%, TPOT p50 -2.2%, TTFT p50 -4.7%, TTFT
    p90 -5.8%, step MAPE 4.9% at chat's past saturation; before the graph replay's fixed device cost was fitted with
    the scale, 2026-12-06: +0.6 / -1.7 / -5.2 / -5.1%). The fit the device made (idle forwards) misses TPOT p50 at
    agentic's knee (+6.2%) and step MAPE in four cells (7.7% worst). Pinned at those figures."""
    import matrix_offline as mo

    r34 = _unpacked("run34_async_deepgemm_chat_agentic_reasoning_b24ed5a", tmp_path / "r34")
    w = mo.main([str(r34), "--refit", "auto"])
    _worst_within(w, 0.011, 0.023, 0.048, 0.059)
    m = _level_step_mape(r34, sync=False, refit="auto")
    assert len(m) == 6 and max(m.values()) <= 0.0495 and max(m, key=m.get) == ("chat", "past saturation")
    w = mo.main([str(r34)])
    assert 0.055 <= abs(w["tpot_p50"][0]) <= 0.063
    m = _level_step_mape(r34, sync=False)
    assert max(m.values()) <= 0.077 and sum(v > 0.05 for v in m.values()) == 4


def test_held_out_run_35_priced_launch_by_launch(tmp_path):
    """H200 run 35 (summarize, reasoning, longctx at ac0197c, Triton): the first run whose device calibration fitted
    the held forwards and whose simulator priced the pipelined loop launch by launch, every class held out. 44 of 45
    targets met as the device printed them (worst: throughput +3.2%, TPOT p50 -5.0%, i.e. -4.98, TTFT p50 -9.1%,
    TTFT p90 -7.5%); step MAPE within 5% but at summarize's knee (7.0%: a decode step before a prompt step waits 11.2 ms
    for that step's launch where the model has 6.5). At HEAD, with the after-prompt terms priced as host work of the
    launch: summarize's knee 6.0%, and longctx's TPOT p50 past saturation -5.1% (throughput +3.3%, TTFT p50 -9.7%, TTFT
    p90 -8.0%). Pinned at those figures."""
    import matrix_offline as mo

    r35 = _unpacked("run35_async_summarize_reasoning_longctx_ac0197c", tmp_path / "r35")
    w = mo.main([str(r35)])
    _worst_within(w, 0.034, 0.0515, 0.098, 0.081)
    m = _level_step_mape(r35, sync=False)
    assert len(m) == 9 and max(m.values()) <= 0.0605 and max(m, key=m.get) == ("summarize", "knee")
    assert sorted(m.values())[-2] <= 0.037


def test_held_out_run_36_and_the_samplers_host_issue(tmp_path):
    """H200 run 36 (summarize, agentic at 42271d0, Triton), held out, as the device printed it: 29 of 30 targets
    (worst: throughput +0.9%, TPOT p50 -2.7%, TTFT p50 -3.7%, TTFT p90 -8.5%; step MAPE 6.4% at agentic's knee). Its
    pipelined launches were timed on the host: agentic's prompt steps launched in 7.0-10.2 ms where the model had
    4.1-5.2 (the sampler's issue, 0.8-1.6 ms, was priced at ~0.05). Refitted with the sampler's measured issue, the
    agentic knee reads 6.1% and summarize's knee 4.4 -> 3.8%. Pinned at those figures."""
    import matrix_offline as mo

    r36 = _unpacked("run36_async_summarize_agentic_42271d0", tmp_path / "r36")
    w = mo.main([str(r36)])
    _worst_within(w, 0.010, 0.028, 0.038, 0.086)
    m = _level_step_mape(r36, sync=False)
    assert max(m.values()) <= 0.0645 and max(m, key=m.get) == ("agentic", "knee") and sorted(m.values())[-2] <= 0.046
    m = _level_step_mape(r36, sync=False, refit="auto")
    assert max(m.values()) <= 0.0617 and max(m, key=m.get) == ("agentic", "knee") and m[("summarize", "knee")] <= 0.039


def test_held_out_run_37_with_the_samplers_issue_fitted_on_the_device(tmp_path):
    """H200 run 37 (chat, agentic at 9ee6a1a on the registry's default DeepGEMM engine), held out, the first
    calibration to fit the sampler's host issue on the device (0.79 ms + 10.3 us a row): 27 of 30 targets as the
    device printed them (worst: throughput +1.0%, TPOT p50 -2.5%, TTFT p50 +5.0%, TTFT p90 -5.0%); step MAPE over 5%
    at chat's knee (5.9%) and agentic's knee and past saturation (7.8%, 5.5%), where the host ran 1.2-1.45x its
    calibrated speed at the same batch (benchmarks/gpu/issue16_h200/host_speed_4a4e880). At HEAD (the after-prompt terms
    priced as host work of the launch) those cells read 5.8 / 6.9 / 5.2%. Pinned at those figures."""
    import matrix_offline as mo

    r37 = _unpacked("run37_async_deepgemm_chat_agentic_9ee6a1a", tmp_path / "r37")
    w = mo.main([str(r37)])
    _worst_within(w, 0.011, 0.026, 0.051, 0.051)
    m = _level_step_mape(r37, sync=False)
    assert len(m) == 6 and max(m.values()) <= 0.0700 and max(m, key=m.get) == ("agentic", "knee")
    assert sorted(m.values())[-2] <= 0.0585 and min(m.values()) <= 0.033


def test_held_out_run_38_on_the_triton_engine_with_the_samplers_issue(tmp_path):
    """H200 run 38 (summarize, reasoning, longctx beyond the grid at 4a4e880, Triton), held out, the second calibration
    to fit the sampler's host issue on the device (0.66 ms + 6.1 us a row) and the first on the Triton engine: 44 of
    45 targets as the device printed them (worst: throughput +2.5%, TPOT p50 -4.7%, TTFT p50 -4.5%, TTFT p90 -8.6%;
    step MAPE 5.2% at summarize's knee, 7.0% in its first replay and 4.3 / 4.2% in the others). Run 35, the same
    classes before the term, missed the same cell at 7.0%. At HEAD (the after-prompt terms priced as host work of the
    launch) summarize's knee reads 4.8%, its TTFT p90 -9.5%. Pinned at those figures."""
    import matrix_offline as mo

    r38 = _unpacked("run38_async_summarize_reasoning_longctx_4a4e880", tmp_path / "r38")
    w = mo.main([str(r38)])
    _worst_within(w, 0.026, 0.048, 0.051, 0.096)
    m = _level_step_mape(r38, sync=False)
    assert len(m) == 9 and max(m.values()) <= 0.0485 and max(m, key=m.get) == ("summarize", "knee")
    assert sorted(m.values())[-2] <= 0.0435


def test_async_gain_over_alternating_rounds_held_out():
    """Issue 23's async target on a held-out H200 run with five alternating off/on rounds per level (run_async_rounds_
    a84afba; the committed profile, unchanged since before the run): the simulator's gain within 5 points of the
    measured median and inside its interval at the knee (+2.0% against +1.6% [+1.3, +2.6]) and past saturation (+7.7%
    against +6.5% [+5.6, +13.9]). Single-round runs of the same bench had spread +4.2..+15.3% past saturation."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    import async_overlap_offline as aoo

    rows = aoo.main([str(ROOT / "benchmarks/gpu/issue23_h200/run_async_rounds_a84afba/async_overlap.json"),
                     str(ROOT / "profiles/h200/calibration_deepseek-v3-5layers_fp8.json")])
    assert [r["level"] for r in rows] == ["knee", "past saturation"]
    for r in rows:
        assert abs(r["simulator"] - r["measured"]) < 0.05
        assert r["ci95"][0] <= r["simulator"] <= r["ci95"][1]


def test_a_packed_run_folder_is_read_through_a_temporary_unpacked_copy(tmp_path):
    """Runs whose per-class reports travel in reports.tgz or reports.tar.xz (all since run 10; runs 5-9 packed since) are read as they
    lie: the offline scripts get a temporary copy with the archive unpacked; a loose folder is read in place; a folder
    with neither is refused by name."""
    import tarfile

    import pytest

    from sim.timeline_check import unpacked_run

    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "samples_chat_m.json").write_text("{}")
    assert unpacked_run(loose) == loose
    packed = tmp_path / "packed"
    packed.mkdir()
    (packed / "calibration_m.json").write_text('{"a": 1}')
    (tmp_path / "samples_chat_m.json").write_text('{"low": {}}')
    with tarfile.open(packed / "reports.tgz", "w:gz") as t:
        t.add(tmp_path / "samples_chat_m.json", arcname="samples_chat_m.json")
    got = unpacked_run(packed)
    assert got != packed and (got / "samples_chat_m.json").read_text() == '{"low": {}}'
    assert (got / "calibration_m.json").read_text() == '{"a": 1}' and not any(packed.glob("samples_*"))
    # repacked as xz (scripts/repack_reports.py): the same members, read the same way, the gzip gone
    import repack_reports
    before, after = repack_reports.repack(packed)
    assert before > 0 and after > 0 and not (packed / "reports.tgz").exists() and (packed / "reports.tar.xz").is_file()
    again = unpacked_run(packed)
    assert again != got and (again / "samples_chat_m.json").read_text() == '{"low": {}}'
    assert repack_reports.repack(packed) is None
    with pytest.raises(FileNotFoundError, match="not a matrix run folder"):
        unpacked_run(tmp_path / "loose" / "nothing")
    r8 = unpacked_run(ROOT / "benchmarks" / "gpu" / "issue16_h200" / "run8_reasoning_longctx_178a4af")
    assert sorted(f.name.split("_")[1] for f in r8.glob("samples_*.json")) == ["longctx", "reasoning"]


def test_read_backs_follow_the_pipelined_loop():
    """A pipelined iteration runs from the previous read-back to its own; a step launched at or after the previous
    read-back (nothing in flight), or a replay's first, starts cold from its own launch."""
    import numpy as np
    import step_residuals as sr

    start = np.array([0.0, 0.002, 0.006, 0.050, 0.0])
    wall = np.array([0.004, 0.003, 0.005, 0.004, 0.001])
    rb, cold = sr.read_backs(start, wall, [1, 1, 1, 1, 2])
    assert np.allclose(rb, [0.004, 0.007, 0.012, 0.054, 0.001])
    assert cold.tolist() == [True, False, False, True, True]


def test_pipelined_parts_are_what_the_pipelined_model_charges():
    """``ProfiledStepCost.pipelined_parts``: the pipelined loop's charge of a step is the max of its (device, host)
    parts, a graph decode's and an eager prompt step's alike (the split step_residuals reads iteration boundaries
    with)."""
    import numpy as np

    from costmodels.calibration import CalibrationProfile
    from costmodels.hardware import get_hardware
    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_profile import HostTerms, StepProfile

    st = StepProfile(model="deepseek-v3", num_layers=4, dtype="fp8", device="cuda", graph_sizes=[8],
                     host=HostTerms(fixed_s=4e-3, per_prefill_s=1e-3, graph_fixed_s=0.5e-3))
    prof = CalibrationProfile.default(get_hardware("H200")).model_copy(update={"step": st})
    pc = ProfiledStepCost(prof, st).pipelined()
    for new, ctx, dec in (([1, 1, 1], [100, 200, 300], [True] * 3), ([512, 1], [0, 900], [False, True])):
        d, h = pc.pipelined_parts(np.array(new), np.array(ctx), np.array(dec))
        assert d > 0 and h > 0 and pc.mixed_step_time(new, ctx, dec) == max(d, h)
    d, h = pc.pipelined_parts(np.array([512]), np.array([0]), np.array([False]))
    assert h >= 5e-3          # the eager issue's fixed and per-prefill host terms


def test_the_pipelined_matrix_as_one_report_and_one_plot(tmp_path, capsys):
    """benchmarks/matrix_report.py joins runs 31-33 (three device calls, each calibrated once) into one table, one JSON
    report and one heatmap: 21 cells; every throughput, TPOT p50 and TTFT p90 within target, TTFT p50 in 20 (longctx's
    knee), step MAPE in 14 (worst: run 33 chat's knee, 11.1%); a folder without a matrix report and an image without
    kaleido are refused by name (exit 2)."""
    import pytest

    import matrix_report as mr

    runs = [str(ROOT / "benchmarks" / "gpu" / "issue16_h200" / r) for r in
            ("run31_async_agentic_chat_reasoning_5ab1ab5", "run32_async_summarize_longctx_10e491e",
             "run33_async_deepgemm_chat_agentic_6ae37da")]
    m = mr.main(runs + ["--json", str(tmp_path / "m.json"), "--plot", str(tmp_path / "m.html")])
    assert len(m["cells"]) == 21 and all(r["loop"] == "pipelined" for r in m["runs"])
    assert [r["fp8_gemm"] for r in m["runs"]] == ["triton", "triton", "deepgemm"]
    met = {k: (v["met"], v["cells"]) for k, v in m["met"].items()}
    assert met == {"output_throughput": (21, 21), "tpot_p50": (21, 21), "ttft_p50": (20, 21), "ttft_p90": (21, 21),
                   "step_mape": (14, 21)}
    w = m["worst"]
    assert (w["ttft_p50"]["class"], w["ttft_p50"]["level"]) == ("longctx", "knee") and abs(w["ttft_p50"]["value"] + 0.117) < 1e-3
    assert (w["step_mape"]["class"], w["step_mape"]["level"]) == ("chat", "knee") and w["step_mape"]["run"].startswith("run33")
    assert json.loads((tmp_path / "m.json").read_text())["met"] == m["met"]
    fig = mr.figure(m)
    hm = fig.data[0]
    assert len(hm.y) == 7 and len(hm.x) == 15 and all(len(r) == 15 for r in hm.z)
    assert max(v for r in hm.z for v in r if v is not None) == 2.0          # colour capped at twice the target
    row = [f"{y}" for y in hm.y].index("run33 chat")
    assert hm.text[row][[f"{x}" for x in hm.x].index("knee<br>step MAPE")] == "11.1"
    assert (tmp_path / "m.html").stat().st_size > 100_000       # plotly.js embedded: opens offline
    out = capsys.readouterr().out
    assert "step MAPE 14/21" in out and "11.1%*" in out
    with pytest.raises(SystemExit) as e:
        mr.main([str(tmp_path)])
    assert e.value.code == 2


def test_matrix_report_marks_misses_whose_prediction_moves_past_the_target_with_steps_two_percent_off(tmp_path, capsys):
    import matrix_report as mr

    err = {"output_throughput": 0.001, "tpot_p50": -0.071, "ttft_p50": 0.004, "ttft_p90": -0.016}
    lv = lambda name, e, s: {"name": name, "rel_error": e, "step": {"mape": 0.02}, "sensitivity": s}  # noqa: E731
    doc = {"command": "x", "async_overlap": True, "classes": {"longctx": {"levels": [
        lv("low", err, {"output_throughput": 0.001, "tpot_p50": 0.079, "ttft_p50": 0.039, "ttft_p90": 0.024}),
        lv("knee", {**err, "tpot_p50": -0.06}, {"tpot_p50": 0.023}),
        lv("past saturation", {**err, "tpot_p50": 0.0}, {})]}}}
    (tmp_path / "matrix_x.json").write_text(json.dumps(doc))
    m = mr.main([str(tmp_path)])
    assert m["met"]["tpot_p50"] == {"met": 1, "cells": 3, "target": 0.05, "misses_on_a_step": 1}
    out = capsys.readouterr().out
    lines = {ln.split()[2]: ln for ln in out.splitlines()[1:4]}
    assert "-7.1%*!" in lines["low"] and "-6.0%* " in lines["knee"] and "!" not in lines["knee"] + lines["past"]
    assert "misses marked ! (the prediction moves past its target with steps 2% off): 1" in out


def test_held_graph_forwards_pin_the_device_scale_to_the_replays_device_work(tmp_path):
    """A calibration whose CUDA-graph points also timed their forwards with the GPU held busy (queued_forward_s,
    calibrations since ae91d90) is fitted to those: the device work alone, as the pipelined loop runs it. Here run 31's
    calibration with each graph forward less the launch wait H200 measured (0.14 ms, benchmarks/gpu/issue16_h200/
    graph_launch_gap_ae91d90): the pinned device scale falls by about that share and the graph host terms take it up,
    against the refit that sets them aside (``--idle-graph-forwards``, the fit before 2026-12-04), which is the old
    default fit to the digit. Setting them aside without a refit, or where there are none, is refused by name."""
    import shutil

    import pytest

    import matrix_offline as mo

    from costmodels.step_fit import idle_graph_forwards, run_profile

    src = ROOT / "benchmarks" / "gpu" / "issue16_h200" / "run31_async_agentic_chat_reasoning_5ab1ab5"
    d = tmp_path / "r31"
    d.mkdir()
    cal = next(src.glob("calibration_*.json"))
    raw = json.loads(cal.read_text())
    n = 0
    for p in raw["step"]["points"]:
        if p.get("graph_bs", 0) > 0 and p.get("forward_s") and not p.get("prefill"):
            p["queued_forward_s"] = p["forward_s"] - 1.4e-4
            n += 1
    (d / cal.name).write_text(json.dumps(raw))
    held = run_profile(d, "auto")
    idle = run_profile(d, "auto", idle_graph=True)
    # set aside, the held forwards leave the fit as it was without them
    assert idle.step.category_scale == run_profile(src, "auto").step.category_scale
    assert n > 100 and idle_graph_forwards(held)[1] == n
    k0, k1 = idle.step.category_scale["attention"], held.step.category_scale["attention"]
    assert 0.9 * k0 < k1 < 0.995 * k0
    # the held fit's graph forwards (scale x op times + the replay's fixed cost, fitted together since 2026-12-06)
    # are the idle fit's less about the launch wait taken out (0.14 ms): 0.19 ms on average over the graph points
    import numpy as np

    from costmodels.profiled import ProfiledStepCost
    ch, ci = ProfiledStepCost(held, power=False), ProfiledStepCost(idle, power=False)
    assert idle.step.graph_replay_s == 0.0 and 0.0 < held.step.graph_replay_s < 1e-4
    gap = [float(ci.graph_categories(np.asarray(p.decode_ctx), p.graph_bs, logits=False) @ ci.k)
           - float(ch.graph_categories(np.asarray(p.decode_ctx), p.graph_bs, logits=False) @ ch.k) - held.step.graph_replay_s
           for p in held.step.points if p.graph_bs > 0 and p.forward_s and not p.prefill and p.decode_ctx]
    assert 1.0e-4 < float(np.mean(gap)) < 3.0e-4
    assert held.step.host.graph_fixed_s > idle.step.host.graph_fixed_s
    with pytest.raises(ValueError, match="give a refit"):
        run_profile(d, None, idle_graph=True)
    with pytest.raises(ValueError, match="no CUDA-graph point"):
        run_profile(src, "auto", idle_graph=True)
    shutil.copy(next(src.glob("matrix_*.json")), d)
    with pytest.raises(SystemExit) as e:
        mo.main([str(src), "--idle-graph-forwards"])
    assert e.value.code == 2


def test_the_step_models_device_side_and_the_hosts_speed_on_run_38(tmp_path, capsys):
    """Where run 38's step misses come from (held out, Triton engine, summarize / reasoning / longctx beyond the
    grid). The model's device work against each step's CUDA events: within 3.3% MAPE per class and level over all
    steps, 5.5% at worst over the prompt-bearing ones (longctx past saturation). The host's speed, as the sampler's
    issue over its calibrated term per 2 s of serving: two speeds about 1.5x apart, switching within a replay; at
    summarize's knee the steps in windows near the calibrated speed miss by 3.9%, those in the slow windows by 6.5%."""
    import numpy as np
    import step_residuals as sr

    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_fit import run_profile

    r38 = _unpacked("run38_async_summarize_reasoning_longctx_4a4e880", tmp_path / "r38")
    prof = run_profile(r38, None)
    samples = sr.load_samples(r38)
    dev = sr.device_errors(samples, ProfiledStepCost(prof))
    assert len(dev) == 27
    assert max(e["mape"] for (_, _, k), e in dev.items() if k == "all") <= 0.034
    assert max(e["mape"] for e in dev.values()) <= 0.056
    c = sr.columns(samples, ProfiledStepCost(prof), prof, False, False, sr.run_replays(r38))
    hs = sr.host_speed_windows(samples, c, prof, sr.run_replays(r38))
    knee = hs[("summarize", "knee")]
    assert knee["mape_near"] < 0.04 < 0.06 < knee["mape_slow"] and 0.3 < knee["slow_share"] < 0.7
    speeds = np.concatenate([v["windows"] for v in hs.values()])
    assert speeds.min() < 1.0 and speeds.max() > 1.6
    assert "near calibrated speed" in capsys.readouterr().out


def test_held_out_run_39_meets_every_target_on_the_triton_engine(tmp_path):
    """H200 run 39 (agentic, summarize, chat at 55bb53d, Triton, the engine without an MTP layer when it does not
    draft), held out: 45 of 45 targets as the device printed them (worst: throughput +0.6%, TPOT p50 -2.7%, TTFT p50
    +2.8%, TTFT p90 -4.8%, step MAPE 4.48%), with the host at 0.60-1.23x its calibrated speed throughout. At HEAD (the
    after-prompt terms priced as host work of the launch): TTFT p50 -3.2%, TTFT p90 -8.8% at agentic's knee, step MAPE
    4.17% at agentic's low load."""
    import matrix_offline as mo

    r39 = _unpacked("run39_async_triton_agentic_summarize_chat_55bb53d", tmp_path / "r39")
    w = mo.main([str(r39)])
    _worst_within(w, 0.007, 0.028, 0.032, 0.089)
    m = _level_step_mape(r39, sync=False)
    assert len(m) == 9 and max(m.values()) <= 0.0420 and max(m, key=m.get) == ("agentic", "low")


def test_held_out_run_40_on_the_deepgemm_engine(tmp_path):
    """H200 run 40 (chat, agentic at 55bb53d on the registry's default DeepGEMM engine), held out: 27 of 30 targets as
    the device printed them; every end-to-end figure within target (worst: throughput -0.4%, TPOT p50 +4.1%, TTFT p50
    +5.1%, TTFT p90 +4.9%); step MAPE over 5% at chat's low and knee levels and agentic's knee (5.3 / 6.5 / 5.5%), where
    the model's device work is within 3% of the CUDA events and the host ran up to 1.64x its calibrated speed. At HEAD,
    with the after-prompt terms priced as host work of the launch and each iteration's admissions before the launch they
    delay: 29 of 30 (worst: throughput +0.8%, TPOT p50 -1.6%, TTFT p50 -5.0%, TTFT p90 -4.3%; step MAPE 5.1% at chat's
    knee, the other five 3.8-4.6%)."""
    import matrix_offline as mo

    r40 = _unpacked("run40_async_deepgemm_chat_agentic_55bb53d", tmp_path / "r40")
    w = mo.main([str(r40)])
    _worst_within(w, 0.008, 0.017, 0.050, 0.043)
    m = _level_step_mape(r40, sync=False)
    assert len(m) == 6 and max(m.values()) <= 0.0515 and max(m, key=m.get) == ("chat", "knee")
    assert sorted(m.values())[-2] <= 0.047


def test_held_out_runs_41_to_43_after_the_launch_split(tmp_path):
    """H200 runs 41-43 at 3e64e23, the first held-out calls with the after-prompt terms priced as host work of the
    launch and each iteration's admissions before the launch they delay, each fitted once on its own calibration,
    every class held out, as the device printed them. Run 41 (chat, agentic, DeepGEMM; runs 37 and 40's command):
    30 of 30, step MAPE 2.3-3.0% with the host at 0.85-1.29x its calibrated speed. Run 42 (summarize, reasoning,
    longctx beyond the grid, Triton; runs 35 and 38's): 44 of 45, summarize's knee step MAPE 5.2% (its host 1.19-1.40x
    through the level). Run 43 (summarize, agentic, DeepGEMM): 28 of 30, step MAPE 5.0% / 5.9% at the knees (host
    beyond 1.2x in half their steps). Every end-to-end figure within target in all 21 cells."""
    import matrix_offline as mo

    r41 = _unpacked("run41_async_deepgemm_chat_agentic_3e64e23", tmp_path / "r41")
    _worst_within(mo.main([str(r41)]), 0.007, 0.020, 0.078, 0.064)
    m = _level_step_mape(r41, sync=False)
    assert len(m) == 6 and max(m.values()) <= 0.030
    r42 = _unpacked("run42_async_triton_summarize_reasoning_longctx_3e64e23", tmp_path / "r42")
    _worst_within(mo.main([str(r42)]), 0.018, 0.048, 0.038, 0.068)
    m = _level_step_mape(r42, sync=False)
    assert len(m) == 9 and max(m.values()) <= 0.052 and max(m, key=m.get) == ("summarize", "knee")
    assert sorted(m.values())[-2] <= 0.041
    r43 = _unpacked("run43_async_deepgemm_summarize_agentic_3e64e23", tmp_path / "r43")
    _worst_within(mo.main([str(r43)]), 0.015, 0.026, 0.059, 0.082)
    m = _level_step_mape(r43, sync=False)
    assert len(m) == 6 and max(m.values()) <= 0.059 and max(m, key=m.get) == ("agentic", "knee")
    assert m[("summarize", "knee")] <= 0.0501 and sorted(m.values())[-3] <= 0.043


def test_held_out_run_44_after_the_attention_shares_per_step_work(tmp_path):
    """H200 run 44 at 907dba7 (summarize, agentic; DeepGEMM; run 43's command), the first held-out call with the MLA
    attention sharing its per-step work across layers (FlashMLA metadata, key slots, absorption weights: the prompt
    step's forward issue 1.19-1.30x faster, ``prompt_launch.json``), fitted once on its own calibration, as the device
    printed it: 27 of 30. Agentic meets all 15 (step MAPE 2.9-3.5%, its knee 5.9% in run 43). Summarize misses TPOT p50
    -8.5% and step MAPE 5.45% at its knee and TTFT p50 -18.2% past saturation: its prompt steps ran at a median 1721
    and 1603 MHz there, power-capped, against the grid's 1935, and are predicted 7.4% / 4.4% short (3.6% at low load,
    1938 MHz); the host ran 0.73-1.15x its calibrated speed there, so the host no longer explains the misses."""
    import matrix_offline as mo
    import step_residuals as sr

    from costmodels.step_fit import run_profile

    r44 = _unpacked("run44_async_deepgemm_summarize_agentic_907dba7", tmp_path / "r44")
    w = mo.main([str(r44)])
    _worst_within(w, 0.040, 0.086, 0.183, 0.083)
    assert w["tpot_p50"][0] < -0.08 and w["ttft_p50"][0] < -0.18   # the misses, pinned where they are
    m = _level_step_mape(r44, sync=False)
    assert len(m) == 6 and max(m.values()) <= 0.0546 and max(m, key=m.get) == ("summarize", "knee")
    assert max(v for (cls, _), v in m.items() if cls == "agentic") <= 0.035
    clocks = sr.clock_bias(r44, sr.load_samples(r44), run_profile(r44, None))
    knee, low = clocks[("summarize", "knee")], clocks[("summarize", "low")]
    assert knee["prompt_mhz"] < 1750 < 1900 < low["prompt_mhz"]
    assert knee["prompt_bias"] < -0.07 < low["prompt_bias"] < -0.03 and abs(knee["decode_bias"]) < 0.03
    assert clocks[("summarize", "past saturation")]["prompt_mhz"] < 1650


def _printed_rows(out: str) -> dict[tuple[str, str], list[float]]:
    """matrix_offline's printed table: {(class, level): [throughput, TPOT p50, TTFT p50, TTFT p90] (fractions)}."""
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 6 and all(p.endswith("%") for p in parts[-4:]) and parts[0] != "worst:":
            level = " ".join(parts[1:-4])
            rows[(parts[0], level)] = [float(p[:-1]) / 100 for p in parts[-4:]]
    return rows


def test_held_out_run_45_on_an_h100(tmp_path, capsys):
    """Run 45 at aadbeb3: the matrix on an H100 80GB HBM3 (the device tool lent one for an H200 call), summarize,
    agentic and longctx beyond the grid, Triton, pipelined loop, calibrated once on that H100, as the device printed
    it: 42 of 45, step MAPE 1.5-2.5% in every cell. The misses are TPOT p50 over-predicted at the two knees and
    longctx's low load (+6.2 / +6.3 / +7.0%), from decode steps' device work over-predicted in every cell. Its
    calibration measured the board's reference loops (the first: the prompt loop held at 692 W, 1,845 MHz), so at HEAD
    the twin prices the power limit on this board (the H100 kind's terms carried from the H200, fitted to the loops):
    only the past-saturation levels move, where the clock fell (summarize's prompt steps at 1,872 MHz), toward the
    measurement; the device printed the full-clock figures (``--no-power-limit``)."""
    import matrix_offline as mo
    import step_residuals as sr

    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_fit import run_profile
    from sim.timeline_check import unpacked_run

    r45 = unpacked_run(ROOT / "benchmarks" / "gpu" / "issue16_h100" / "run45_async_triton_summarize_agentic_longctx_aadbeb3")
    capsys.readouterr()
    w = mo.main([str(r45)])
    head = _printed_rows(capsys.readouterr().out)
    _worst_within(w, 0.014, 0.072, 0.064, 0.062)
    assert w["tpot_p50"][0] > 0.06                      # the misses, pinned where they are: over-predicted
    m = _level_step_mape(r45, sync=False)
    assert len(m) == 9 and max(m.values()) <= 0.025
    prof = run_profile(r45, None)
    assert prof.step.hardware_basis == "H100" and prof.power_ref is not None
    ref = prof.power_ref
    assert ref.decode.capped == 0 and ref.decode.mhz == 1980 and ref.prompt.capped == 1.0 and ref.prompt.mhz < 1900
    pm = ProfiledStepCost(prof).power
    assert pm is not None and pm.gpu == "h100" and pm.cap_w == ref.prompt.watts
    # the board's idle power the loops imply (its reading, 293 W, was taken too soon after the calibration's work):
    # within 10 W of the 134 W the power probe read idle on the same board a minute later
    assert abs(pm.idle_w - 134) < 10
    full_w = mo.main([str(r45), "--no-power-limit"])   # as the device printed it
    full = _printed_rows(capsys.readouterr().out)
    _worst_within(full_w, 0.011, 0.071, 0.061, 0.046)
    assert len(head) == len(full) == 9
    for key in full:   # the power limit moves the prompt-heavy cells; at low load the clock held
        if key[1] == "low" and key[0] != "longctx":
            assert all(abs(a - b) <= 0.002 for a, b in zip(head[key], full[key]))
        else:
            assert all(abs(a - b) <= 0.082 for a, b in zip(head[key], full[key]))
    # on this board the limiter's ~0.1 s response (costmodels/data/power, fit.limiter) over-prices sustained prompt
    # load: past saturation TTFT p90 +6.1 / +4.5% (summarize / longctx) where full clock under-prices it (-1.3 / -3.6%);
    # within target either way (run 46's board, the other way: test_held_out_run_46_on_a_second_h100_board)
    for cls in ("summarize", "longctx"):
        assert head[(cls, "past saturation")][3] > 0.04 and full[(cls, "past saturation")][3] < -0.01
    dev = sr.device_errors(sr.load_samples(r45), ProfiledStepCost(prof))
    assert all(0.0 < e["bias"] < 0.025 for (_, _, kind), e in dev.items() if kind == "decode")


def test_run_45_refit_prices_its_fit_as_it_predicts(tmp_path):
    """Run 45's device fit priced the FP8 GEMMs from the committed H200 op table (the calibration's analytic defaults
    said ``measured_on`` H200, so its own GEMM table, timed on the H100, did not apply), and its saved profile predicts
    from its own table: the graph forwards' device scale 1.076 over-priced the held forwards it was fitted to (1.045 on
    the pricing that predicts), the decode steps' device work +0.9-2.3% in every cell. Fixed in calibrate (the fit sees
    the GPU it ran on) and in the offline refit (which fitted an H100 profile on the H200's ceilings). A refit from the
    run's own points is the fit a calibration at HEAD makes: its graph scale is the held forwards' least-squares scale
    on the pricing that predicts."""
    import numpy as np
    import pytest

    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_fit import _graph_forwards, forward_fit, run_profile
    from sim.timeline_check import unpacked_run

    r45 = unpacked_run(ROOT / "benchmarks" / "gpu" / "issue16_h100" / "run45_async_triton_summarize_agentic_longctx_aadbeb3")
    stored, refit = run_profile(r45, None), run_profile(r45, "auto")
    assert refit.step.hardware_basis == stored.step.hardware_basis == "H100"

    def held_scale(prof):
        cost = ProfiledStepCost(prof, power=False)
        pts = [p for p in prof.step.points if p.wall_s > 0]
        fw = np.zeros((len(pts), 5))
        for i, p in enumerate(pts):
            if p.graph_bs > 0 and p.forward_s and p.decode_ctx and not p.prefill and not p.draft_len:
                fw[i] = cost.graph_categories(np.asarray(p.decode_ctx, np.int64), p.graph_bs, logits=False)
        assert len(_graph_forwards(pts, fw)[0]) == 51
        scales, replay = forward_fit(pts, fw, (0.5, 2.0))
        return scales[0], replay

    k_stored, k_refit = stored.step.category_scale["dense_gemm"], refit.step.category_scale["dense_gemm"]
    # the stored fit's variant against the held forwards on the pricing that predicts: the scale alone, 1.045 (a
    # replay term fits negative there, -0.15 ms, so none)
    assert k_stored == pytest.approx(1.0764, abs=1e-3) and held_scale(stored) == (pytest.approx(1.0449, abs=1e-3), 0.0)
    assert held_scale(refit) == (pytest.approx(k_refit, rel=1e-6), pytest.approx(refit.step.graph_replay_s, rel=1e-6))
    # fitted as a calibration at HEAD fits (with the graph replay's fixed device cost, 0.17 ms), run 45 meets all 45
    # targets where the device's fit met 42: TPOT p50 at the knees +6.3 / +6.2 -> -0.6 / -1.7%, longctx low +7.0 -> -4.0%
    import matrix_offline as mo

    assert refit.step.graph_replay_s == pytest.approx(1.74e-4, rel=0.05)
    w = mo.main([str(r45), "--refit", "auto"])
    _worst_within(w, 0.016, 0.041, 0.077, 0.062)


def test_held_out_run_46_on_a_second_h100_board(tmp_path, capsys):
    """Run 46 at e26a76c: run 45's matrix on another H100 board, the first calibration to fit the graph replay's fixed
    device cost (0.167 ms beside scale 1.073; run 45 refitted: 0.174 ms, 1.073) and the board's power limit from its own
    reference loops on the device. 44 of 45 held out (run 45: 42), the device's figures to the digit: the one miss is
    longctx low TPOT p50 -7.1% (decode device work 1-3% under at 1-16 rows). The power limit moves only the
    past-saturation cells, toward the measurement."""
    import matrix_offline as mo

    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_fit import run_profile
    from sim.timeline_check import unpacked_run

    r46 = unpacked_run(ROOT / "benchmarks" / "gpu" / "issue16_h100" / "run46_async_triton_summarize_agentic_longctx_e26a76c")
    prof = run_profile(r46, None)
    assert prof.step.hardware_basis == prof.measured_on == "H100"
    assert abs(prof.step.graph_replay_s - 1.67e-4) < 5e-6 and abs(prof.step.category_scale["dense_gemm"] - 1.073) < 1e-3
    pm = ProfiledStepCost(prof).power
    assert pm is not None and abs(pm.cap_w - 698.76) < 0.01
    capsys.readouterr()
    w = mo.main([str(r46)])
    head = _printed_rows(capsys.readouterr().out)
    _worst_within(w, 0.016, 0.072, 0.036, 0.050)
    assert w["tpot_p50"][1] == "longctx low" and w["tpot_p50"][0] < -0.07
    misses = sum(abs(v) > lim for row in head.values() for v, lim in zip(row, (0.05, 0.05, 0.10, 0.10)))
    assert len(head) == 9 and misses == 1
    mo.main([str(r46), "--no-power-limit"])
    full = _printed_rows(capsys.readouterr().out)
    for key in full:   # past saturation the limit moves summarize and longctx toward the measurement (sum of |errors|
        # 11.1 -> 2.7, 12.8 -> 4.9 points); the knees move by up to 2.6 points, the low loads of summarize and agentic not
        if key[1] == "past saturation" and key[0] in ("summarize", "longctx"):
            assert sum(map(abs, head[key])) < sum(map(abs, full[key])) - 0.05
        elif key[1] == "low" and key[0] != "longctx":
            assert all(abs(a - b) <= 0.002 for a, b in zip(head[key], full[key]))
        else:
            assert all(abs(a - b) <= 0.03 for a, b in zip(head[key], full[key]))


def test_held_out_run_47_on_a_third_h100_board_and_the_figures_on_a_step(capsys):
    """Run 47 at e315bcc: the matrix on a third H100 board, the first calibration to time each graph point's whole
    pipelined launch with the GPU held. 45 of 45 held out, the device's figures to the digit; the launch holds 0.012 ms
    of device work beyond its forward and sampler. Run 46's miss (longctx low TPOT p50 -7.1%) is met here (-1.9%) with
    the same step errors: the p50 of 12 requests sits on a step of its distribution, which ``--sensitivity`` marks (the
    prediction moves by more than 5% with every step 2% longer or shorter) on both boards."""
    import matrix_offline as mo

    from costmodels.step_fit import run_profile
    from sim.timeline_check import unpacked_run

    h100 = ROOT / "benchmarks" / "gpu" / "issue16_h100"
    r47 = unpacked_run(h100 / "run47_async_triton_summarize_agentic_longctx_e315bcc")
    st = run_profile(r47, None).step
    assert abs(st.graph_replay_s - 1.92e-4) < 5e-6 and abs(st.category_scale["dense_gemm"] - 1.071) < 1e-3
    assert abs(st.launch_device_s - 1.21e-5) < 1e-6 and st.launch_device_per_row_s == 0.0
    assert sum(p.queued_launch_s is not None for p in st.points) == 51
    capsys.readouterr()
    w = mo.main([str(r47)])
    head = _printed_rows(capsys.readouterr().out)
    device = json.loads((r47 / "matrix_deepseek-v3-5layers_fp8.json").read_text())["classes"]
    for (cls, level), row in head.items():   # the device's matrix, within 1 / 9 points: the limiter's ~0.1 s response
        lv = next(x for x in device[cls]["levels"] if x["name"] == level)   # moved past saturation (fit.limiter)
        for f, v in zip(("output_throughput", "tpot_p50", "ttft_p50", "ttft_p90"), row):
            assert abs(v - lv["rel_error"][f]) <= (0.01 if level == "low" else 0.09), (cls, level, f)
    _worst_within(w, 0.016, 0.020, 0.051, 0.047)
    assert len(head) == 9
    marked = {}
    for run in (r47, unpacked_run(h100 / "run46_async_triton_summarize_agentic_longctx_e26a76c")):
        mo.main([str(run), "--sensitivity"])
        out = capsys.readouterr().out
        line = next(x for x in out.splitlines() if x.startswith("longctx    low"))
        marked[run.name[:5]] = line
    assert "-1.8% (\u00b18.1) !" in marked["run47"] and "-7.1% (\u00b18.0) !" in marked["run46"]
    assert "misses: 1 where the figure moves by more than its target" in out and "0 elsewhere" in out
    # the launch priced per row count as the grid's held launches measured it (a refit: the profile on the device
    # has the line alone): 0.11 ms at 2 rows, where the sampler table runs short; the matrix within the same bounds
    tab = dict(run_profile(r47, "auto").step.launch_device_rows)
    assert abs(tab[2] - 1.1e-4) < 1e-5 and abs(tab[1]) < 2e-5 and abs(tab[4]) < 2e-5 and len(tab) == 17
    capsys.readouterr()
    _worst_within(mo.main([str(r47), "--refit", "auto"]), 0.012, 0.022, 0.047, 0.044)


def test_held_out_run_48_chat_and_long_decode_on_a_fourth_h100_board(capsys):
    """Run 48 at d0d8745: chat and reasoning on a fourth H100 board, the first calibration to price a graph launch per
    row count as its held launches measured it (chosen on run 47's serving data, held out here). 30 of 30, the device's
    figures to the digit, no figure past its target with steps 2% off; against the line fitted to the same spans, the
    per-row launch brings the low-load decode steps' device work closer to the CUDA events'."""
    import matrix_offline as mo
    import step_residuals as sr

    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_fit import run_profile
    from sim.timeline_check import unpacked_run

    r48 = unpacked_run(ROOT / "benchmarks" / "gpu" / "issue16_h100" / "run48_async_triton_chat_reasoning_d0d8745")
    prof = run_profile(r48, None)
    tab = dict(prof.step.launch_device_rows)
    assert abs(tab[2] - 1.07e-4) < 2e-6 and abs(tab[3] - 5.4e-5) < 2e-6 and abs(tab[1]) < 1e-5 and len(tab) == 17
    assert abs(prof.step.graph_replay_s - 1.73e-4) < 5e-6 and abs(prof.step.category_scale["dense_gemm"] - 1.072) < 1e-3
    capsys.readouterr()
    w = mo.main([str(r48), "--sensitivity"])
    out = capsys.readouterr().out
    device = json.loads((r48 / "matrix_deepseek-v3-5layers_fp8.json").read_text())["classes"]
    for line in out.splitlines()[1:7]:
        cls, level = line[:10].strip(), line[11:28].strip()
        lv = next(x for x in device[cls]["levels"] if x["name"] == level)
        got = [float(c.split("%")[0]) / 100 for c in line[28:].split(")")[:4]]
        for f, v in zip(("output_throughput", "tpot_p50", "ttft_p50", "ttft_p90"), got):
            assert abs(v - lv["rel_error"][f]) <= _digit(r48), (cls, level, f)
    _worst_within(w, 0.014, 0.026, 0.041, 0.058)
    assert "misses: 0 where the figure moves by more than its target with steps \u00b12% (marked !), 0 elsewhere" in out
    samples = {"reasoning": {"low": json.loads(next(r48.glob("samples_reasoning_*.json")).read_text())["low"]}}
    table = sr.device_errors(samples, ProfiledStepCost(prof))[("reasoning", "low", "decode")]
    line = sr.device_errors(samples, ProfiledStepCost(prof, prof.step.model_copy(update={"launch_device_rows": []})))
    line = line[("reasoning", "low", "decode")]
    assert table["mape"] < line["mape"] - 0.003 and abs(table["bias"]) < abs(line["bias"]) - 0.003


def _sensitivity_rows_match_the_device(out: str, device: dict, digit: float = DIGIT) -> dict[tuple[str, str], str]:
    """``matrix_offline --sensitivity``'s printed rows, each checked against the device's matrix (``device``: its
    ``classes``) to the printed digit: {(class, level): line}."""
    rows = {}
    for line in out.splitlines():
        if line[:10].strip() in device and line[11:28].strip() in ("low", "knee", "past saturation"):
            cls, level = line[:10].strip(), line[11:28].strip()
            lv = next(x for x in device[cls]["levels"] if x["name"] == level)
            got = [float(x) / 100 for x in re.findall(r"([+-]\d+\.\d)% \(", line)]
            assert len(got) == 4, line
            for f, v in zip(("output_throughput", "tpot_p50", "ttft_p50", "ttft_p90"), got):
                assert abs(v - lv["rel_error"][f]) <= digit, (cls, level, f)
            rows[(cls, level)] = line
    return rows


def _held_out_sensitivity(run: Path, capsys, cells: int, worst: tuple[float, float, float, float], marked_misses: int = 0,
                          unmarked_misses: int = 0, moved: float | None = None):
    """``matrix_offline RUN --sensitivity`` on an archived run: ``cells`` rows, each the device's table to the printed
    digit (``moved``: within that of it, for a run whose figures a later model change moved), the worst figures within
    ``worst`` (throughput, TPOT p50, TTFT p50, TTFT p90), ``marked_misses`` misses in marked cells and
    ``unmarked_misses`` elsewhere. Returns (the printed output, its rows by (class, level))."""
    import matrix_offline as mo

    capsys.readouterr()
    w = mo.main([str(run), "--sensitivity"])
    out = capsys.readouterr().out
    rows = _sensitivity_rows_match_the_device(out, json.loads((run / "matrix_deepseek-v3-5layers_fp8.json").read_text())["classes"],
                                              _digit(run) if moved is None else moved)
    assert len(rows) == cells
    _worst_within(w, *worst)
    assert (f"misses: {marked_misses} where the figure moves by more than its target with steps \u00b12% (marked !), "
            f"{unmarked_misses} elsewhere") in out
    return out, rows


def _step_target(run: Path, cls: str) -> tuple[dict, dict]:
    """A class's step-MAPE target as the device checked it (its report's ``targets``) and per level
    (``sim.validate.check_targets`` on the report's levels)."""
    from sim.validate import ValidationReport, check_targets

    rep = ValidationReport.model_validate_json((run / f"validation_{cls}_deepseek-v3-5layers_fp8.json").read_text())
    return rep.targets["step_mape"], check_targets(rep.levels, rep.step_overall)["step_mape"]


def test_held_out_run_49_on_a_fifth_h100_board(capsys):
    """Run 49 at 7bb5f0b: summarize, agentic and longctx on a fifth H100 board (another VBIOS). 44 of 45 held out, the
    device's figures to the digit; the one miss (longctx low TPOT p50 -6.1%, as on runs 45 and 46) sits in a cell whose
    prediction moves by 7.6% with every step 2% off, while its decode steps at 1-2 rows run 0.04-0.05 ms (1.2-1.4%)
    over the model: the p50 of 12 requests on a step of its distribution."""
    from costmodels.step_fit import run_profile
    from sim.timeline_check import unpacked_run

    r49 = unpacked_run(ROOT / "benchmarks" / "gpu" / "issue16_h100" / "run49_async_triton_summarize_agentic_longctx_7bb5f0b")
    st = run_profile(r49, None).step
    assert abs(st.graph_replay_s - 1.62e-4) < 5e-6 and abs(st.category_scale["dense_gemm"] - 1.073) < 1e-3
    assert len(st.launch_device_rows) == 17
    _, rows = _held_out_sensitivity(r49, capsys, 9, (0.015, 0.062, 0.060, 0.059), marked_misses=1, moved=0.09)
    assert "-6.0% (\u00b17.7) !" in rows[("longctx", "low")]


def test_held_out_run_50_longctx_with_24_requests_and_chat_on_a_sixth_h100_board(capsys):
    """Run 50 at 7bb5f0b: longctx with 24 requests and chat on a sixth H100 board. 17 of 18 held out, the device's
    figures to the digit; with 24 requests longctx low TPOT p50 is off its step (-1.7%, +-2.1% for steps 2% off, where
    12 requests sat at +-7.6-8.1%); the one miss (knee TPOT p50 -5.1%) is the cell now on a step (+-9.0%)."""
    from sim.timeline_check import unpacked_run

    r50 = unpacked_run(ROOT / "benchmarks" / "gpu" / "issue16_h100" / "run50_async_triton_longctx_chat_7bb5f0b")
    _, rows = _held_out_sensitivity(r50, capsys, 6, (0.017, 0.026, 0.086, 0.069), moved=0.09)
    assert "!" not in rows[("longctx", "low")]
    # the knee's miss (TPOT p50 -5.1% on the device) is met at HEAD: the steps after the first chunk of each long prompt
    # priced at the clock the long step left (costmodels/data/power, fit.limiter)
    assert "-1.6% (" in rows[("longctx", "knee")]


def test_run_51_dense_moe_table_priced_per_touched_expert():
    """Run 51 at d9e76bd timed the MoE layer at 2-48 tokens (one random routing each) and the sampler at every row
    count of a 1-16-row step. Priced per expected expert (as on the device) the denser MoE table fitted serving's decode
    steps worse than its points at the earlier counts alone; per expert each draw touched (``MoELayerTable.touched``,
    the table rebuilt from the run's points) it fits them best, and the 5-10-row hump of runs 47-50 is gone."""
    import numpy as np
    import step_residuals as sr

    import costmodels.step_fit as sf
    from costmodels.profiled import ProfiledStepCost
    from sim.timeline_check import unpacked_run

    run = unpacked_run(ROOT / "benchmarks" / "gpu" / "issue16_h100" / "run51_async_triton_chat_agentic_d9e76bd")
    prof = sf.run_profile(run, None)
    assert prof.tables["moe_layer"].touched is None and len(prof.tables["moe_layer"].tokens) == 23
    assert abs(prof.step.graph_replay_s) < 1e-9 and abs(prof.step.category_scale["dense_gemm"] - 1.044) < 1e-3

    # both tables rebuilt from the points (the refit keeps a stored MoE table), all of them or the earlier counts alone
    tables = {k: v for k, v in prof.tables.items() if k not in ("sample", "moe_layer")}
    dense = sf.refit_profile(prof.model_copy(update={"tables": tables}), "auto")
    sparse = sf.run_profile(run, "auto", sparse_tables=True)
    assert dense.tables["moe_layer"].touched is not None and len(sparse.tables["moe_layer"].tokens) == 12
    samples = {"chat": sr.load_samples(run)["chat"]}
    as_run = sr.device_errors(samples, ProfiledStepCost(sf.run_profile(run, "auto")))
    per_touched = sr.device_errors(samples, ProfiledStepCost(dense))
    for lv in ("low", "knee", "past saturation"):
        key = ("chat", lv, "decode")
        assert per_touched[key]["mape"] < as_run[key]["mape"] - 0.004, (lv, per_touched[key], as_run[key])
        assert per_touched[key]["mape"] < 0.012
    # the hump: chat low's decode steps at 5-9 rows against 3-4 rows, serving less the model (median)
    s = samples["chat"]["low"]
    cost = ProfiledStepCost(dense).pipelined()
    res: dict[int, list[float]] = {}
    for i, n in enumerate(s["decodes"]):
        if s["prefill_tokens"][i] or not s["graph_bs"][i] or (i and s["prefill_tokens"][i - 1]):
            continue
        res.setdefault(n, []).append(s["measured_s"][i] - max(cost.decode_parts(np.full(n, s["decode_ctx_mean"][i]))[:2]))
    hump = np.median([np.median(res[n]) for n in range(5, 10)]) - np.median([np.median(res[n]) for n in (3, 4)])
    assert abs(hump) < 2.5e-5, hump    # 0.072 ms as the device priced it


def test_held_out_run_52_the_moe_table_per_touched_expert_on_an_eighth_h100_board():
    """Run 52 at a6e3b2b: the first calibration whose MoE table records each count's routing draw (chosen on run 51),
    agentic on an eighth H100 board; the call ran out of device time in the reasoning class, and the agentic report
    did not come back (its medians recovered from the matrix at the run's own commit, ``--recover``). Held out: the
    decode steps' device work per touched expert against the same points per expected expert, at every level."""
    import step_residuals as sr

    import costmodels.step_fit as sf
    from costmodels.calibration import MoELayerTable
    from costmodels.profiled import ProfiledStepCost
    from sim.timeline_check import unpacked_run

    run = unpacked_run(ROOT / "benchmarks" / "gpu" / "issue16_h100" / "run52_async_triton_agentic_reasoning_a6e3b2b")
    prof = sf.run_profile(run, None)
    mt = prof.tables["moe_layer"]
    assert mt.touched is not None and len(mt.tokens) == 23
    assert abs(prof.step.graph_replay_s) < 1e-9 and abs(prof.step.category_scale["dense_gemm"] - 1.0455) < 1e-3
    samples = sr.load_samples(run)
    expected = sf.refit_profile(prof.model_copy(update={"tables": {
        **prof.tables, "moe_layer": MoELayerTable(**{**mt.model_dump(), "touched": None})}}), "auto")
    touched = sr.device_errors(samples, ProfiledStepCost(prof))
    plain = sr.device_errors(samples, ProfiledStepCost(expected))
    for lv in ("low", "knee", "past saturation"):
        key = ("agentic", lv, "decode")
        assert touched[key]["mape"] < 0.011 and touched[key]["mape"] < plain[key]["mape"] - 0.002, (lv, touched[key], plain[key])


def test_held_out_run_53_chat_and_long_decode_at_2c8ed9c_on_a_ninth_h100_board(capsys):
    """Run 53 at 2c8ed9c: chat and reasoning (the whole long-decode class) with the denser tables and the MoE table per
    touched expert, on a ninth H100 board. 30 of 30 held out, the device's figures to the digit. Its calibration's
    host probes agree within 7% (no moving-host note); serving's host read 60-110% slower than calibration's at chat
    low, where the prompt-bearing steps run under the model (mixed-step bias +11-15%) and step MAPE is 4.5%."""
    from costmodels.calibration import host_speed_note
    from costmodels.step_fit import run_profile
    from sim.timeline_check import unpacked_run

    r53 = unpacked_run(ROOT / "benchmarks" / "gpu" / "issue16_h100" / "run53_async_triton_chat_reasoning_2c8ed9c")
    prof = run_profile(r53, None)
    # the fit takes a replay term here (1.060 x op times + 0.255 ms), where runs 51-52 with the same tables took none
    assert prof.tables["moe_layer"].touched is not None and abs(prof.step.graph_replay_s - 2.55e-4) < 5e-6
    assert abs(prof.step.category_scale["dense_gemm"] - 1.060) < 1e-3
    assert host_speed_note(prof.provenance["host_probe_s"]) is None
    _held_out_sensitivity(r53, capsys, 6, (0.008, 0.022, 0.065, 0.038))


def test_held_out_run_54_on_a_tenth_h100_board_two_knees_miss_their_step_mape(capsys):
    """Run 54 at 2c8ed9c: summarize, agentic and longctx (24 requests) on a tenth H100 board, whose calibrating host ran
    at half the serving host's speed (probes 264-342 us, serving 45-53% under). Every end-to-end figure met, to the digit
    of the device's table; the summarize and agentic knees' step MAPE (8.6%, 5.3%) miss, which the per-level target now
    says (the device's own check pooled each class's steps and said met)."""
    from sim.timeline_check import unpacked_run

    r54 = unpacked_run(ROOT / "benchmarks" / "gpu" / "issue16_h100" / "run54_async_triton_summarize_agentic_longctx_2c8ed9c")
    # the limiter's ~0.1 s response (fit.limiter) moved the knees and past saturation: longctx's knee TTFT p50 +9.4 ->
    # +11.2%, a miss (this run's calibrating host ran at half the serving host's speed)
    _held_out_sensitivity(r54, capsys, 9, (0.010, 0.020, 0.113, 0.042), unmarked_misses=1, moved=0.09)
    step = {}
    for cls in ("summarize", "agentic", "longctx"):
        device, per_level = _step_target(r54, cls)
        assert device["met"]            # as the device checked it: the class's steps pooled
        step[cls] = (per_level["value"], per_level["met"])    # each level's own, as the issue's target reads
    assert abs(step["summarize"][0] - 0.0855) < 5e-4 and not step["summarize"][1]
    assert abs(step["agentic"][0] - 0.0532) < 5e-4 and not step["agentic"][1]
    assert step["longctx"][1]


def test_held_out_run_55_chat_and_agentic_on_an_eleventh_h100_board(capsys):
    """Run 55 at 380fa33: chat and agentic on an eleventh H100 board (another VBIOS). 30 of 30 held out, the device's
    figures to the digit, every level's step MAPE within 1.5-2.7%, though the calibration's end probe read 60% slow
    (the moving-host note, here a false alarm: the probes around the grid agreed)."""
    from costmodels.calibration import host_speed_note
    from costmodels.step_fit import run_profile
    from sim.timeline_check import unpacked_run

    r55 = unpacked_run(ROOT / "benchmarks" / "gpu" / "issue16_h100" / "run55_async_triton_chat_agentic_380fa33")
    assert "60% apart" in host_speed_note(run_profile(r55, None).provenance["host_probe_s"])
    _held_out_sensitivity(r55, capsys, 6, (0.006, 0.038, 0.037, 0.041), moved=0.09)
    for cls in ("chat", "agentic"):
        per_level = _step_target(r55, cls)[1]
        assert per_level["met"] and per_level["value"] < 0.028


def test_held_out_run_56_run_54s_classes_at_cc2f558_on_a_twelfth_h100_board(capsys):
    """Run 56 at cc2f558: run 54's command (summarize, agentic, longctx with 24 requests) on a twelfth H100 board. 45 of
    45 held out, the device's figures to the digit, every level's step MAPE 1.5-2.1% (per level, as the issue's target
    reads): run 54's knee misses (8.6%, 5.3%) came from its slow calibrating host, not the step model."""
    from costmodels.step_fit import run_profile
    from sim.timeline_check import unpacked_run

    r56 = unpacked_run(ROOT / "benchmarks" / "gpu" / "issue16_h100" / "run56_async_triton_summarize_agentic_longctx_cc2f558")
    st = run_profile(r56, None).step
    assert abs(st.graph_replay_s) < 1e-9 and abs(st.category_scale["dense_gemm"] - 1.045) < 1e-3
    _held_out_sensitivity(r56, capsys, 9, (0.013, 0.014, 0.085, 0.052), moved=0.09)
    for cls in ("summarize", "agentic", "longctx"):
        device, per_level = _step_target(r56, cls)
        assert device["met"] and per_level["met"] and per_level["value"] < 0.022, (cls, per_level)


def test_held_out_run_57_chat_and_long_decode_with_the_issue_probe_on_a_thirteenth_h100_board(capsys):
    """Run 57 at 6d26274: chat and reasoning on a thirteenth H100 board, the first calibration and replays with the
    issue probe (a fixed mixed step's forward issue, GPU held). 30 of 30 held out, the device's figures to the digit,
    every level's step MAPE 1.1-1.6%; a quiet host: the issue probe within 2.5% of the calibration's at every replay, as
    the replays' own eager issue (within 4.5%)."""
    from costmodels.calibration import host_probe_reference
    from costmodels.step_fit import run_profile
    from sim.timeline_check import unpacked_run

    r57 = unpacked_run(ROOT / "benchmarks" / "gpu" / "issue16_h100" / "run57_async_triton_chat_reasoning_6d26274")
    prof = run_profile(r57, None)
    assert abs(prof.step.category_scale["dense_gemm"] - 1.049) < 1e-3
    assert abs(host_probe_reference(prof.provenance, "issue_probe_s") - 2.4245e-3) < 1e-6
    _held_out_sensitivity(r57, capsys, 6, (0.005, 0.012, 0.041, 0.034))
    for cls in ("chat", "reasoning"):
        per_level = _step_target(r57, cls)[1]
        assert per_level["met"] and per_level["value"] < 0.017
        rep = json.loads((r57 / f"validation_{cls}_deepseek-v3-5layers_fp8.json").read_text())
        for lv in rep["levels"]:
            issue = lv["diagnostics"]["issue_probe_vs_calibration"]
            assert len(issue) == 3 and max(abs(x) for x in issue) < 0.026, issue


def test_held_out_run_58_on_a_host_that_moves_after_calibration(capsys):
    """Run 58 at ea057c7: chat and reasoning with 16 busy loops on the 16-core host from the calibration's end (a host
    that moves between calibration and serving). 23 of 24 end-to-end figures held out within target, the device's
    figures to the digit; the replays' eager issue ran -1 to +38% slow, the issue probe before them read -18 to +221%:
    it does not follow a loaded host replay by replay (--host-speed stays calibration by default)."""
    from sim.timeline_check import unpacked_run

    r58 = unpacked_run(ROOT / "benchmarks" / "gpu" / "issue16_h100" / "run58_moving_host_chat_reasoning_ea057c7")
    assert "HOST_LOAD=16" in (ROOT / "benchmarks" / "gpu" / "issue16_h100" / "run58_moving_host_chat_reasoning_ea057c7" / "env.txt").read_text()
    _, rows = _held_out_sensitivity(r58, capsys, 6, (0.013, 0.03, 0.086, 0.151), unmarked_misses=1)
    assert "-15.0%" in rows[("reasoning", "low")]
    eager, issue = [], []
    for cls in ("chat", "reasoning"):
        rep = json.loads((r58 / f"validation_{cls}_deepseek-v3-5layers_fp8.json").read_text())
        for lv in rep["levels"]:
            eager += lv["diagnostics"]["eager_issue_vs_calibration"]
            issue += lv["diagnostics"]["issue_probe_vs_calibration"]
    assert -0.02 < min(eager) and max(eager) < 0.39
    assert min(issue) < -0.15 and max(issue) > 2.0   # the probe samples the contention, not the replay's mean


def _per_level_step_mape(run: Path, classes: tuple[str, ...], below: float) -> None:
    for cls in classes:
        device, per_level = _step_target(run, cls)
        assert device["met"] and per_level["met"] and per_level["value"] < below, (cls, per_level)


def test_held_out_run_59_three_classes_at_0107b33_on_a_fourteenth_h100_board(capsys):
    """Run 59 at 0107b33 (the roofline transfer of measured kernel times landed): summarize, agentic and beyond-grid
    longctx (24 requests) on a fourteenth H100 board. 45 of 45 held out, the device's figures to the digit, every
    level's step MAPE 1.3-2.1%, though the serving host ran up to 24% faster than the calibrating host's issue."""
    from costmodels.step_fit import run_profile
    from sim.timeline_check import unpacked_run

    r59 = unpacked_run(ROOT / "benchmarks" / "gpu" / "issue16_h100" / "run59_async_triton_summarize_agentic_longctx_0107b33")
    st = run_profile(r59, None).step
    assert abs(st.category_scale["dense_gemm"] - 1.062) < 1e-3 and abs(st.graph_replay_s - 2.08e-4) < 5e-6
    _held_out_sensitivity(r59, capsys, 9, (0.009, 0.028, 0.052, 0.091), moved=0.09)
    _per_level_step_mape(r59, ("summarize", "agentic", "longctx"), 0.022)


def test_held_out_run_60_chat_and_long_decode_at_0107b33_on_the_same_board(capsys):
    """Run 60 at 0107b33: chat and reasoning, the call after run 59 on the same board, its own calibration. 30 of 30
    held out, the device's figures to the digit, every level's step MAPE 1.3-2.1%."""
    from costmodels.step_fit import run_profile
    from sim.timeline_check import unpacked_run

    r60 = unpacked_run(ROOT / "benchmarks" / "gpu" / "issue16_h100" / "run60_async_triton_chat_reasoning_0107b33")
    st = run_profile(r60, None).step
    assert abs(st.category_scale["dense_gemm"] - 1.057) < 1e-3 and abs(st.graph_replay_s - 2.30e-4) < 5e-6
    _held_out_sensitivity(r60, capsys, 6, (0.010, 0.022, 0.049, 0.036))
    _per_level_step_mape(r60, ("chat", "reasoning"), 0.022)


def test_held_out_runs_65_and_66_every_class_at_7e2f7ed(capsys):
    """Runs 65-66 at 7e2f7ed (the power limiter's ~0.1 s response, ``costmodels/data/power`` ``fit.limiter``): the five
    classes on one H100 board (GPU-52449011), each call its own calibration. 75 of 75 held out, the device's figures to
    the digit (HEAD prices as 7e2f7ed did), every level's step MAPE under 3.1%."""
    from sim.timeline_check import unpacked_run

    h100 = ROOT / "benchmarks" / "gpu" / "issue16_h100"
    r65 = unpacked_run(h100 / "run65_beyond_probe_longctx_summarize_agentic_7e2f7ed")
    _held_out_sensitivity(r65, capsys, 9, (0.011, 0.033, 0.063, 0.045))
    _per_level_step_mape(r65, ("longctx", "summarize", "agentic"), 0.031)
    r66 = unpacked_run(h100 / "run66_async_triton_chat_reasoning_7e2f7ed")
    _held_out_sensitivity(r66, capsys, 6, (0.009, 0.023, 0.064, 0.037))
    _per_level_step_mape(r66, ("chat", "reasoning"), 0.025)


def test_held_out_run_64_longctx_at_d62ff6a_met_at_head(capsys):
    """Run 64 at d62ff6a, before the limiter's ~0.1 s response: longctx with 24 requests, 14 of 15 on the device (knee
    TPOT p50 -5.1%, a figure on a step). At HEAD the continuation chunks after each 8,192-token first chunk are priced
    at the clock the first left: 15 of 15, the knee's TPOT p50 within 1%."""
    from sim.timeline_check import unpacked_run

    r64 = unpacked_run(ROOT / "benchmarks" / "gpu" / "issue16_h100" / "run64_beyond_probe_longctx_d62ff6a")
    device = json.loads((r64 / "matrix_deepseek-v3-5layers_fp8.json").read_text())["classes"]["longctx"]["levels"]
    assert next(lv for lv in device if lv["name"] == "knee")["rel_error"]["tpot_p50"] < -0.05
    _, rows = _held_out_sensitivity(r64, capsys, 3, (0.015, 0.021, 0.056, 0.058), moved=0.09)
    got = [float(x) / 100 for x in re.findall(r"([+-]\d+\.\d)% \(", rows[("longctx", "knee")])]
    assert abs(got[1]) < 0.01


def test_h200_runs_61_to_63_with_the_limiter_s_control_window():
    """H200 runs 61-63 at 75f371c (one hot board) at HEAD, the H200's limiter with its 0.1 s control window
    (``costmodels/data/power/h200.json`` ``attack_s``, chosen on run 61's steps after long prompt steps: -1.2 -> +0.0%
    bias; ``benchmarks/power_fast_fit.py --attacks none,0.1``). Held out, run 63's longctx TPOT p50 at low load and the
    knee, -8.4 / -10.1% with the one average, are within 3%: 15 of 15. Run 61 (the choice's fit run) keeps its longctx
    misses (TPOT p50 -8.5 / -11.5%, knee TTFT p50 -13.3%); its summarize knee TTFT p90 goes -10.0 -> -2.8%. Run 62
    (chat, reasoning) moves by less than 0.1 point."""
    import matrix_offline as mo

    from costmodels.power import power_model
    from sim.timeline_check import unpacked_run

    assert power_model("h200").attack_s == pytest.approx(0.1) and power_model("h100").attack_s is None
    h200 = ROOT / "benchmarks" / "gpu" / "issue16_h200"
    w63 = mo.main([str(unpacked_run(h200 / "run63_async_triton_longctx_75f371c"))])
    _worst_within(w63, 0.005, 0.03, 0.02, 0.015)
    w61 = mo.main([str(unpacked_run(h200 / "run61_async_triton_summarize_agentic_longctx_75f371c"))])
    _worst_within(w61, 0.005, 0.12, 0.14, 0.035)
    assert w61["tpot_p50"][0] < -0.1 and w61["ttft_p50"][0] < -0.12   # the misses left, pinned so a fix shows here
    w62 = mo.main([str(unpacked_run(h200 / "run62_async_triton_chat_reasoning_75f371c"))])
    _worst_within(w62, 0.01, 0.03, 0.05, 0.035)


def test_h100_runs_67_and_68_a_board_no_fit_used_meet_every_target():
    """H100 runs 67-68 at 6a510b9 on board GPU-247e46d2, which no fitted run used: the five classes at the three loads,
    each held out (one calibration a call). 75 of 75 figures within target on the device; at HEAD the same (the
    H100's model has not moved since). Worst: throughput -0.7%, TPOT p50 -2.5%, TTFT p50 +6.1% (summarize past
    saturation), TTFT p90 -5.3% (reasoning at low load). Bounds a little over those, so a drift shows."""
    import matrix_offline as mo

    from sim.timeline_check import unpacked_run

    h100 = ROOT / "benchmarks" / "gpu" / "issue16_h100"
    w67 = mo.main([str(unpacked_run(h100 / "run67_beyond_probe_longctx_summarize_agentic_6a510b9"))])
    _worst_within(w67, 0.01, 0.03, 0.07, 0.03)
    w68 = mo.main([str(unpacked_run(h100 / "run68_async_triton_chat_reasoning_6a510b9"))])
    _worst_within(w68, 0.015, 0.025, 0.035, 0.06)
