"""Expert parallelism on CPU processes (gloo): the EP-sharded MoE equals the unsharded MoE.

Every case runs ``ep`` forked processes joined through a FileStore; each rank routes its own
tokens (uneven counts, one rank with none), and its output is compared with the unsharded
layer's output for the same tokens. Tolerances (max abs error over max(1, max |output|); outputs
are O(1)): fp64 1e-12, fp32 2e-5; bf16 (GPU only) 3e-2.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from executor import ep  # noqa: E402
from executor.ep_launch import run_ranks  # noqa: E402
from executor.ep_moe import EPMoE, ExpertPlacement, shard_moe_layers  # noqa: E402
from executor.model_config import ExecModelConfig, tiny_spec  # noqa: E402
from executor.weights import build_model  # noqa: E402

TOL = {"fp64": 1e-12, "fp32": 2e-5, "bf16": 3e-2}
DT = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16}


def _tokens(rank: int, n: int, dtype) -> torch.Tensor:
    return torch.randn(n, 256, generator=torch.Generator().manual_seed(100 + rank), dtype=torch.float64).to(dtype) * 2


_MODELS: dict = {}


def _model(dtype: str):
    """The tiny model (skewed routing), built once per dtype in the parent; forked ranks inherit it."""
    if dtype not in _MODELS:
        cfg = ExecModelConfig.build(tiny_spec())
        _MODELS[dtype] = build_model(cfg, "cpu", dtype, "dummy", seed=7, routing_skew=1.0, max_pos=512)
    return _MODELS[dtype]


def _popularity(moe) -> list:
    """Measured expert load of a MoE layer on a fixed batch (what EPLB balances)."""
    x = _tokens(99, 256, torch.float64).to(moe.gate.weight.dtype).to(moe.gate.weight.device)
    return torch.bincount(moe.route(x)[1].flatten(), minlength=moe.cfg.n_routed_experts).double().cpu().numpy() + 1.0


def _moe_case(g: ep.EPGroup, moe, dtype: str, counts: list[int], redundant: int, modes: list, policies: list) -> list:
    """Per (mode, two-micro-batch, policy): max |EP - reference| over this rank's tokens."""
    if g.device.type == "cuda":
        moe = copy.deepcopy(moe).to(g.device)
    x = _tokens(g.rank, counts[g.rank], DT[dtype]).to(g.device)
    want = moe(x)
    pl = ExpertPlacement.eplb(_popularity(moe), g.world, redundant) if redundant else ExpertPlacement.contiguous(16, g.world)
    out = []
    for mode, tmb in modes:
        for policy in policies:
            g.mode = mode
            layer = EPMoE(moe, g, pl, two_micro_batch=tmb, replica_policy=policy)
            assert layer.experts.w13.shape[0] == len(pl.ranks[g.rank])
            got = layer(x)
            assert got.shape == want.shape and got.dtype == want.dtype
            err = float(((got - want).abs().max() / want.abs().max().clamp(min=1.0))) if x.shape[0] else 0.0
            out.append((mode, tmb, policy, err, g.stats["dispatch_rows"]))
    return out


ALL_MODES = [("dynamic", False), ("fixed", False), ("dynamic", True), ("fixed", True)]


@pytest.mark.parametrize("world,counts,redundant,dtype", [
    (2, [37, 0], 0, "fp64"),
    (2, [5, 64], 4, "fp64"),
    (4, [17, 0, 40, 3], 0, "fp64"),
    (4, [9, 33, 0, 21], 4, "fp32"),
])
def test_ep_moe_equals_reference(world, counts, redundant, dtype):
    policies = ["round_robin", "local_first"] if redundant else ["round_robin"]
    moe = _model(dtype).model.layers[1].mlp
    res = run_ranks(_moe_case, world, (moe, dtype, counts, redundant, ALL_MODES, policies), threads=1)
    for rank, rows in enumerate(res):
        for mode, tmb, policy, err, _ in rows:
            assert err < TOL[dtype], f"rank {rank} {mode} tmb={tmb} {policy}: max err {err}"


def test_placements_cover_every_expert_and_balance_load():
    import numpy as np
    pop = np.arange(1, 17, dtype=float)[::-1] ** 2
    base = ExpertPlacement.contiguous(16, 4)
    assert base.ranks == ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)) and base.redundant == 0
    pl = ExpertPlacement.eplb(pop, 4, 4)
    assert pl.n_slots == 20 and all(len(r) == 5 for r in pl.ranks) and pl.redundant == 4
    assert sorted({e for r in pl.ranks for e in r}) == list(range(16))
    assert len(pl.replicas()[0]) >= 2                      # the hottest expert got a replica
    share = lambda p: max(sum(pop[e] / len(p.replicas()[e]) for e in r) for r in p.ranks) / pop.sum() * 4  # noqa: E731
    assert share(pl) < share(base)
    assert pl.slot_offset().tolist() == [0, 5, 10, 15] and pl.slot_rank().tolist()[:6] == [0] * 5 + [1]
    assert ExpertPlacement.from_dict(pl.to_dict()) == pl


def test_world_one_and_empty_batches_need_no_process_group():
    model = _model("fp64")
    x = _tokens(0, 23, torch.float64)
    want = model.model.layers[2].mlp(x)
    for mode in ("dynamic", "fixed"):
        m = copy.deepcopy(model)
        shard_moe_layers(m, ep.single(mode=mode), redundant=3, two_micro_batch=True)
        layer = m.model.layers[2].mlp
        assert isinstance(layer, EPMoE)
        assert float((layer(x) - want).abs().max()) < 1e-12
        assert layer(x[:0]).shape == (0, 256)
    layer.g.capacity = 8          # a static (CUDA-graph) capacity: smaller batches pad, a bigger one is refused
    layer.g.mode = "fixed"
    assert float((layer(x[:8]) - want[:8]).abs().max()) < 1e-12
    with pytest.raises(RuntimeError, match="capacity"):
        layer(x)


def test_pack_rows_roundtrip_mixed_dtypes():
    a = torch.randn(5, 3, dtype=torch.bfloat16)
    b = torch.arange(10, dtype=torch.float32).view(5, 2)
    buf = ep.pack_rows(a, b)
    assert buf.dtype == torch.uint8 and buf.shape == (5, 3 * 2 + 2 * 4)
    a2, b2 = ep.unpack_rows(buf, [(torch.bfloat16, 3), (torch.float32, 2)])
    assert torch.equal(a, a2) and torch.equal(b, b2)
    assert ep.pack_rows(a[:0], b[:0]).shape == (0, 14)


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_ep_moe_equals_reference_nccl(world, dtype):
    """The same check over NCCL, one process per GPU (needs ``world`` GPUs; written for the multi-GPU session)."""
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    counts = [13 * (r + 1) % 50 for r in range(world)]
    counts[-1] = 0
    moe = _model(dtype).model.layers[1].mlp
    res = run_ranks(_moe_case, world, (moe, dtype, counts, 4, ALL_MODES, ["round_robin", "local_first"]), device="cuda")
    for rank, rows in enumerate(res):
        for mode, tmb, policy, err, _ in rows:
            assert err < TOL[dtype], f"rank {rank} {mode} tmb={tmb} {policy}: rel err {err}"
