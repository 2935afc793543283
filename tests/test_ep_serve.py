"""`twinfer serve --plan` with an EP=2 plan (attention-DP x EP, EPLB replicas) on CPU: two rank processes
behind one OpenAI server; concurrent requests land on both ranks and answer what one process answers."""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

PROMPTS = [[1, 2, 3, 4, 5], [300, 7, 42], [11] * 20]
MAX_TOKENS = [6, 4, 5]


def _plan(path) -> None:
    from costmodels.layout import ParallelLayout
    from planner.plan import Plan, PoolPlan
    from scheduler.config import SchedulerConfig
    from sim.effects import EffectsSpec
    from scheduler.metrics import SLO
    from sim.workload import WorkloadSpec
    Plan(model="tiny", hardware="H200", gpus_budget=2, mode="aggregated",
         pools=[PoolPlan(role="mixed", instances=1, layout=ParallelLayout(dp=2, ep=2, eplb_redundant_experts=2),
                         scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, draft_len=1))],
         workload=WorkloadSpec(rate=1.0, num_requests=10), slo=SLO(ttft_s=1.0, tpot_s=0.1),
         effects=EffectsSpec(eplb=True)).save(path)


def test_serve_plan_ep2_matches_one_process(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from executor.engine import LLMEngine, SamplingParams
    from ui.serve_plan import serving_options
    from executor.serve.tokenizer import load_tokenizer

    plan = tmp_path / "plan.yaml"
    _plan(plan)
    world, kw = serving_options(str(plan), "cpu")
    assert world == 2 and kw["scheduler_config"].draft_len == 0 and kw["placements"][0].redundant == 2
    from executor.serve.launch import start_serve

    sp = start_serve(["--model", "tiny", "--load-format", "dummy", "--device", "cpu", "--dtype", "fp64", "--port", "0",
                      "--max-model-len", "256", "--plan", str(plan)], timeout_s=120)
    try:
        assert any("without MTP drafting" in s for s in sp.output)

        def ask(i):
            body = {"model": "tiny", "prompt": PROMPTS[i], "max_tokens": MAX_TOKENS[i], "ignore_eos": True, "temperature": 0}
            return httpx.post(sp.url + "/v1/completions", json=body, timeout=60).json()

        with ThreadPoolExecutor(3) as pool:
            got = list(pool.map(ask, range(3)))
    finally:
        sp.stop()
    proc = sp.proc
    assert proc.returncode is not None
    # the same prompts through one single-process engine with the same weights and scheduler
    engine = LLMEngine.from_args("tiny", load_format="dummy", device="cpu", dtype="fp64", seed=0, max_model_len=256,
                                 scheduler_config=kw["scheduler_config"])
    want = engine.generate(PROMPTS, [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS])
    tok = load_tokenizer("tiny", vocab_size=engine.vocab_size, eos_token_id=engine.eos_token_id)
    for i, r in enumerate(got):
        assert r["usage"]["completion_tokens"] == MAX_TOKENS[i] and r["choices"][0]["finish_reason"] == "length"
        assert r["choices"][0]["text"] == tok.decode(want[i])
