"""Expert parallelism end to end on CPU processes (gloo): the tiny model with EP=2 over 2 processes
(the ``gpu``-marked variants run the same over NCCL, one process per GPU, where there are enough GPUs).

- forward: each rank runs its own (attention-DP) batches; its logits equal the single-process
  model's on the same batches (fp64, max abs 1e-9), including steps where one rank is idle;
- engine: the lockstep attention-DP engine (front on rank 0) generates the same greedy tokens
  as one single-process engine.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from executor.ep_launch import EPFrontEngine, build_rank_engine, run_ranks, worker_loop  # noqa: E402
from executor.ep_moe import idle_pass, shard_moe_layers  # noqa: E402
from executor.forward_batch import SeqInput, build_forward_batch  # noqa: E402
from executor.kv_cache import KVCache  # noqa: E402
from executor.model_config import ExecModelConfig, tiny_spec  # noqa: E402
from executor.weights import build_model  # noqa: E402

CPU = torch.device("cpu")


def _toks(seed: int, n: int) -> list[int]:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# per rank, per lockstep step: the sequences it runs (None: nothing, an idle pass)
A, B = _toks(1, 47), _toks(2, 12)
SCHEDULE = [
    [[SeqInput(A[:30], 0, [0, 1, 2], False)], [SeqInput(B[:11], 0, [5], False)]],
    [[SeqInput(A[30:46], 30, [0, 1, 2], False)], None],
    [[SeqInput(A[46:47], 46, [0, 1, 2], True)], [SeqInput(B[11:12], 11, [5], True)]],
    [None, [SeqInput(B[:3], 0, [7], False)]],
]


def _run_schedule(model, cfg, rank: int, ep: bool, device=CPU) -> list:
    kv = KVCache(cfg, 8, 16, device, torch.float64)
    out = []
    with torch.inference_mode():
        for step in SCHEDULE:
            seqs = step[rank]
            if seqs is None:
                if ep:
                    idle_pass(model)
                out.append(None)
                continue
            b = build_forward_batch(seqs, 16, kv.null_page, device)
            out.append(model.compute_logits(model(b, kv)).cpu())
    return out


def _forward_rank(g, model, cfg, redundant: int, mode: str, tmb: bool) -> list:
    g.mode = mode
    m = copy.deepcopy(model).to(g.device)
    if g.device.type == "cuda":
        m.setup_rope(256)
    shard_moe_layers(m, g, redundant=redundant, two_micro_batch=tmb)
    return _run_schedule(m, cfg, g.rank, ep=True, device=g.device)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("redundant,mode,tmb", [(0, "dynamic", False), (2, "fixed", True)])
def test_tiny_forward_ep2_equals_single_process(redundant, mode, tmb, device):
    if device == "cuda" and torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    cfg = ExecModelConfig.build(tiny_spec())
    model = build_model(cfg, CPU, "fp64", "dummy", seed=4, routing_skew=0.7, max_pos=256)
    if device == "cuda":   # the reference is the same model on one GPU (CPU and GPU kernels differ ~1e-7 in fp64)
        ref = copy.deepcopy(model).to("cuda:0")
        ref.setup_rope(256)
        want = [_run_schedule(ref, cfg, r, ep=False, device=torch.device("cuda:0")) for r in range(2)]
        del ref
    else:
        want = [_run_schedule(model, cfg, r, ep=False) for r in range(2)]
    got = run_ranks(_forward_rank, 2, (model, cfg, redundant, mode, tmb), device=device, threads=1)
    for r in range(2):
        for s, (a, b) in enumerate(zip(got[r], want[r])):
            assert (a is None) == (b is None)
            if a is not None:
                assert a.shape == b.shape
                assert float((a - b).abs().max()) < 1e-9, f"rank {r} step {s}"


ENGINE_KW = dict(load_format="dummy", device="cpu", dtype="fp64", seed=3, routing_skew=0.5, max_model_len=96,
                 num_kv_blocks=24, scheduler_config={"max_num_batched_tokens": 64, "max_num_seqs": 4})
PROMPTS = [_toks(10 + i, n) for i, n in enumerate((9, 40, 3, 17, 25))]


def _engine_rank(g):
    from executor.engine import SamplingParams
    engine = build_rank_engine(g, "tiny", redundant=2, **{**ENGINE_KW, "device": g.device.type})
    if g.rank != 0:
        worker_loop(g, engine)
        return None
    front = EPFrontEngine(g, engine)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (6, 3, 9, 1, 5)]
    toks = front.generate(PROMPTS, params)
    stats = front.stats()
    front.shutdown()
    return toks, stats.generation_tokens_total


@pytest.mark.parametrize("world,device", [(2, "cpu"), pytest.param(2, "cuda", marks=pytest.mark.gpu),
                                          pytest.param(4, "cuda", marks=pytest.mark.gpu), pytest.param(8, "cuda", marks=pytest.mark.gpu)])
def test_ep_engine_generates_like_single_process(world, device):
    from executor.engine import LLMEngine, SamplingParams
    if device == "cuda" and torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    single = LLMEngine.from_args("tiny", **{**ENGINE_KW, "device": device})
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (6, 3, 9, 1, 5)]
    want = single.generate(PROMPTS, params)
    res = run_ranks(_engine_rank, world, device=device, threads=1)
    toks, gen_total = res[0]
    assert toks == want
    assert [len(t) for t in toks] == [6, 3, 9, 1, 5] and gen_total == 24
