"""Sliding-window layers and their resume policy (persist / replay W / recompute) in the executor, on CPU.

A toy GQA model with three sliding layers (window 6) and one full layer, fp64: every policy whose
replay covers the new tokens' reach gives the logits of a one-shot forward, on chunked prefill and
on prefix hits, while the audit overwrites every KV entry the policy claims not to keep with NaN;
shorter replays give different (finite) logits; the kept pages are what the policy says.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from costmodels.model_spec import ModelSpec  # noqa: E402
from costmodels.replay import LayerReplay, ReplayPolicy  # noqa: E402
from executor.engine import block_hashes  # noqa: E402
from executor.forward_batch import SeqInput, build_forward_batch  # noqa: E402
from executor.kv_cache import KVCache  # noqa: E402
from executor.model_config import ExecModelConfig  # noqa: E402
from executor.model_runner import ModelRunner  # noqa: E402
from executor.swa_replay import (SWAReplay, drop_unkept, exact_for_new_tokens, finite_pages,  # noqa: E402
                                 kept_blocks)
from executor.weights import build_model  # noqa: E402
from kernels import reference as ref  # noqa: E402
from scheduler.config import SchedulerConfig  # noqa: E402
from scheduler.request import Request  # noqa: E402
from scheduler.scheduler import Scheduler  # noqa: E402

CPU = torch.device("cpu")
S, PAGE = 6, 4
KINDS = ["sliding", "full", "sliding", "sliding"]
REACH = 3 * (S - 1)   # three sliding layers recompute: the new tokens' windows reach 3 x 5 tokens back


def toy_spec() -> ModelSpec:
    return ModelSpec(name="toy-swa", family="llama", num_layers=4, hidden_size=64, vocab_size=200,
                     num_attention_heads=4, num_kv_heads=1, head_dim=16, intermediate_size=128, attention="gqa",
                     layer_kinds=KINDS, sliding_window=S, max_context=512)


@pytest.fixture(scope="module")
def toy():
    cfg = ExecModelConfig.build(toy_spec())
    return cfg, build_model(cfg, CPU, "fp64", "dummy", seed=2)


def policy(s: str, **kw) -> ReplayPolicy:
    return ReplayPolicy(default=LayerReplay.model_validate(s), **kw)


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 200, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def one_shot(cfg, model, toks) -> torch.Tensor:
    pages = -(-len(toks) // PAGE)
    kv = KVCache(cfg, pages, PAGE, CPU, torch.float64)
    b = build_forward_batch([SeqInput(toks, 0, list(range(pages)), False)], PAGE, kv.null_page, CPU)
    return model.compute_logits(model(b, kv))


def run_chunks(cfg, model, swa, toks, cuts, table, kv=None) -> torch.Tensor:
    kv = kv or KVCache(cfg, 16, PAGE, CPU, torch.float64)
    out = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        out.append(model.compute_logits(swa.forward(model, [SeqInput(toks[a:b], a, table, False)], [toks[:a]], kv)))
    return torch.cat(out)


# policies whose replay covers the reach (exact), and ones that do not
EXACT = [policy("persist"), policy("recompute"), policy("replay", tokens=REACH), policy("replay", tokens=40),
         policy("persist", layers={0: "replay:3"}),                 # one replaying layer with only full layers below
         policy("persist", layers={3: "recompute"}),                # a recompute on top drags the layers below along
         policy("recompute", layers={0: "replay:3"})]
SHORT = [policy("replay", tokens=2), policy("replay", tokens=S), policy("persist", layers={3: "replay:4"}),
         policy("replay:5", layers={0: "recompute"})]     # a recompute below does not widen the replays above it


def test_window_layer_is_causal_attention_over_the_last_window(toy):
    cfg, model = toy
    toks = tokens(20, 9)
    attn = model.model.layers[0].self_attn
    x = model.model.embed_tokens(torch.tensor(toks))
    h = model.model.layers[0].input_layernorm(x)
    pos = torch.arange(20)
    q, k, v = attn.project(h, pos)
    mask = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - S)   # written out: causal, within S
    want = attn.o_proj(ref.attention(q, k, v, pos, attn.scale, mask).reshape(20, -1))
    kv = KVCache(cfg, 5, PAGE, CPU, torch.float64)
    got = attn(h, build_forward_batch([SeqInput(toks, 0, [0, 1, 2, 3, 4], False)], PAGE, kv.null_page, CPU), kv)
    assert float((got - want).abs().max()) < 1e-12
    full = model.model.layers[1].self_attn          # the full layer differs: it sees all 20
    assert float((full(h, build_forward_batch([SeqInput(toks, 0, [0, 1, 2, 3, 4], False)], PAGE, kv.null_page, CPU), kv)
                  - want).abs().max()) > 1e-6


@pytest.mark.parametrize("pol", EXACT, ids=str)
def test_chunked_prefill_equals_full_recompute(toy, pol):
    cfg, model = toy
    toks = tokens(40, 0)
    swa = SWAReplay(cfg.spec, pol, audit=True)
    cuts = [0, 13, 24, 40]
    assert all(exact_for_new_tokens(swa.layout(c), S, c) for c in cuts[1:-1])
    got = run_chunks(cfg, model, swa, toks, cuts, [11, 2, 7, 0, 5, 9, 1, 3, 4, 6])
    assert float((got - one_shot(cfg, model, toks)).abs().max()) < 1e-9


@pytest.mark.parametrize("pol", EXACT, ids=str)
def test_prefix_hit_equals_full_recompute(toy, pol):
    """A's prompt fills the pages; B shares its first 16 tokens (4 pages) and resumes there."""
    cfg, model = toy
    a, tail = tokens(30, 1), tokens(14, 2)
    b = a[:16] + tail
    swa = SWAReplay(cfg.spec, pol, audit=True)
    kv = KVCache(cfg, 16, PAGE, CPU, torch.float64)
    run_chunks(cfg, model, swa, a, [0, 30], [0, 1, 2, 3, 4, 5, 6, 7], kv)
    got = run_chunks(cfg, model, swa, b, [16, 30], [0, 1, 2, 3, 8, 9, 10, 11], kv)
    assert float((got - one_shot(cfg, model, b)[16:]).abs().max()) < 1e-9


@pytest.mark.parametrize("pol", SHORT, ids=str)
def test_replay_short_of_the_reach_gives_other_logits(toy, pol):
    """The reach is real (these would pass with the bound wrong); finite: nothing dropped was read."""
    cfg, model = toy
    toks = tokens(40, 0)
    swa = SWAReplay(cfg.spec, pol, audit=True)
    assert not exact_for_new_tokens(swa.layout(24), S, 24)
    got = run_chunks(cfg, model, swa, toks, [0, 24, 40], list(range(10)))
    assert torch.isfinite(got).all()
    assert float((got[24:] - one_shot(cfg, model, toks)[24:]).abs().max()) > 1e-6


@pytest.mark.parametrize("pol,want", [
    (policy("persist"), [2, 6, 2, 2]),          # window [18, 24): pages 4 and 5
    (policy("replay", tokens=4), [1, 6, 1, 1]),  # window less its last 4: [18, 20), page 4
    (policy("replay", tokens=S), [0, 6, 0, 0]),
    (policy("recompute"), [0, 6, 0, 0]),
    (policy("persist", layers={2: "recompute"}), [2, 6, 0, 2]),
])
def test_kept_pages_are_what_the_policy_says(toy, pol, want):
    cfg, model = toy
    toks = tokens(24, 4)
    swa = SWAReplay(cfg.spec, pol)
    kv = KVCache(cfg, 8, PAGE, CPU, torch.float64)
    table = list(range(6))
    run_chunks(cfg, model, swa, toks, [0, 24], table, kv)
    lay = swa.layout(24)
    drop_unkept(kv, lay, table, 24)
    assert kept_blocks(lay, 24, PAGE) == want
    assert [finite_pages(kv, j, table, 24) for j in range(4)] == want
    # kept tokens per window layer = the cost model's kept fraction of the window
    frac = swa.resolved.kept_fraction()
    for j, kind in enumerate(KINDS):
        if kind == "sliding":
            assert lay[j].kept[1] - lay[j].kept[0] == round(frac[j] * S)


def test_rows_each_layer_processes_are_the_policy_extra_tokens(toy):
    cfg, model = toy
    toks = tokens(40, 0)
    counts = {}
    for name, pol in (("persist", policy("persist")), ("replay", policy("replay", tokens=4)),
                      ("top", policy("persist", layers={2: "replay:4"})), ("recompute", policy("recompute"))):
        swa = SWAReplay(cfg.spec, pol)
        run_chunks(cfg, model, swa, toks, [0, 16, 40], list(range(10)))
        extra = swa.resolved.extra_tokens(16)
        assert swa.rows_per_layer.tolist() == [40 + int(e) for e in extra]
        counts[name] = swa.rows_per_layer.tolist()
    assert counts["persist"] == [40] * 4
    assert counts["replay"] == [44, 44, 44, 44]
    assert counts["top"] == [44, 44, 44, 40]      # layer 3 persists: the replayed rows stop below it
    assert counts["recompute"] == [56] * 4


def _serve(cfg, model, pol, prompts, budget, in_scheduler=False):
    """Requests through the scheduler and the runner, one after another (the second hits the first's prefix).

    ``in_scheduler``: the scheduler runs the policy too, so its chunks already carry the replayed tokens."""
    replay = pol.resolve(cfg.spec) if in_scheduler else None
    sched = Scheduler(SchedulerConfig(block_size=PAGE, max_num_seqs=4, max_num_batched_tokens=budget), 32, replay=replay)
    kv = KVCache(cfg, 32, PAGE, CPU, torch.float64)
    runner = ModelRunner(model, kv, CPU, eos_token_id=None)
    runner.swa = SWAReplay(cfg.spec, pol, audit=True)
    outs, cached, now, carried = [], [], 0.0, 0
    for i, p in enumerate(prompts):
        req = Request(f"r{i}", now, len(p), 6, block_hashes=block_hashes(p, PAGE), prompt_token_ids=list(p))
        assert sched.add_request(req)
        while sched.num_running or sched.num_waiting:
            plan = sched.schedule(now)
            carried += sum(c.replayed for c in plan.prefills)
            res = runner.execute(plan)
            now += 1.0
            sched.complete(plan, res, now)
        outs.append(list(req.output_token_ids))
        cached.append(req.num_cached_tokens)
    assert (carried > 0) == (in_scheduler and not replay.is_persist)   # the plans carry the replayed tokens, or not
    return outs, cached, runner.swa.extra_rows


def test_scheduler_and_runner_serve_the_same_tokens_under_every_exact_policy(toy):
    cfg, model = toy
    a = tokens(30, 5)
    prompts = [a, a[:20] + tokens(9, 6)]
    base, cached, extra = _serve(cfg, model, policy("persist"), prompts, budget=12)
    assert cached[1] == 20 and extra == 0        # a prefix hit of 5 pages; chunks of 12
    rows = {}
    for pol, in_sched in ((policy("recompute"), False), (policy("replay", tokens=REACH), False),
                          (policy("replay", tokens=REACH), True), (policy("persist", layers={0: "replay:3"}), True)):
        outs, _, extra = _serve(cfg, model, pol, prompts, budget=12, in_scheduler=in_sched)
        assert outs == base, str(pol)
        assert extra > 0
        rows[(str(pol), in_sched)] = extra
    # the plan's replayed tokens are the policy's: the executor runs the same rows whoever planned them
    assert rows[(str(policy("replay", tokens=REACH)), True)] == rows[(str(policy("replay", tokens=REACH)), False)]


def test_long_row_runs_are_tiled_without_changing_the_result(toy, monkeypatch):
    """A recompute over a long context cuts its rows into tiles that read only their windows' keys."""
    import executor.swa as swa_mod
    cfg, model = toy
    toks = tokens(40, 3)
    want = one_shot(cfg, model, toks)
    monkeypatch.setattr(swa_mod, "ROW_TILE", 7)
    assert float((one_shot(cfg, model, toks) - want).abs().max()) < 1e-12


def test_replay_bench_smoke_mode(tmp_path):
    """benchmarks/gpu/replay_bench.py --cpu --tiny: every policy measured and predicted, exactness and kept pages right."""
    import json

    from benchmarks.gpu.replay_bench import main
    out = tmp_path / "rb.json"
    assert main(["--cpu", "--tiny", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["policies"] == ["recompute", "replay:4", "replay:8", "replay:24", "persist"]
    hit = {r["policy"]: r for r in data["prefix_hit"][0]["rows"]}
    assert all(r["measured_s"] > 0 and r["predicted_s"] > 0 for r in hit.values())
    assert hit["recompute"]["measured_change"] == 0 and hit["recompute"]["predicted_change"] == 0
    # tiny window 8, three sliding layers: the reach is 21, so W = 24 is exact and W = 4, 8 are not
    assert [hit[p]["exact"] for p in data["policies"]] == [True, False, False, True, True]
    for p in ("recompute", "replay:24"):
        assert hit[p]["logit_max_abs_diff_vs_persist"] < 1e-4
    assert hit["replay:4"]["logit_max_abs_diff_vs_persist"] > 1e-4
    # resume at 32, page 8, 3 sliding layers: persist keeps [24, 32), replay 4 keeps [24, 28): one page per layer
    assert [hit[p]["kept_window_pages"] for p in data["policies"]] == [0, 3, 0, 0, 3]
    assert hit["replay:8"]["layer_rows"] == [16, 16, 16, 8]     # the full layer on top carries no replayed rows
    chunked = {r["policy"]: r for r in data["chunked"][0]["rows"]}
    assert chunked["recompute"]["extra_layer_tokens"] == 3 * (16 + 32)   # chunks resume at 16 and 32
    assert chunked["persist"]["extra_layer_tokens"] == 0


def test_decodes_read_the_window_after_a_replayed_prefill(toy):
    """Decode steps (two queries each, as MTP verification runs) after a resumed, audited chunk see their window."""
    cfg, model = toy
    toks = tokens(34, 7)
    swa = SWAReplay(cfg.spec, policy("replay", tokens=REACH), audit=True)
    kv = KVCache(cfg, 16, PAGE, CPU, torch.float64)
    table = [3, 1, 4, 0, 5, 9, 2, 6, 7]
    got = [run_chunks(cfg, model, swa, toks, [0, 13, 30], table, kv)]
    for a in (30, 32):
        h = swa.forward(model, [SeqInput(toks[a:a + 2], a, table, True)], [], kv)
        got.append(model.compute_logits(h))
    assert float((torch.cat(got) - one_shot(cfg, model, toks)).abs().max()) < 1e-9
