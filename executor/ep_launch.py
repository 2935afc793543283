"""One process per device for expert parallelism: starting ranks, and the attention-DP engine they run.

Layout (DeepSeek's "DEP"): ``world = dp = ep`` ranks, each with its own copy of attention,
dense layers, router and shared experts (attention data-parallel), its own scheduler and KV
cache, and ``1/ep`` of the routed experts. Requests are spread over ranks; every MoE layer
exchanges tokens with all ranks, so all ranks step in lockstep:

- rank 0 (the *front*) owns the request intake: each step it broadcasts new requests (each
  assigned to one rank, fewest outstanding first) and aborts over a gloo control group;
- every rank then runs one engine step; a rank with nothing scheduled runs an *idle pass*
  (the MoE collectives with zero tokens), so collectives always match. In ``fixed`` exchange
  mode the token count is all-reduced per layer and every rank pads to the max;
- rank 0 gathers the token deltas and counters.

One engine step must be exactly one forward pass on every rank: EP serving runs single-step
plans (``decode_steps=1``) and no MTP drafting (``draft_len=0``); both are checked.

Processes: ``fork`` on CPU (gloo; children inherit the imported torch, ~0.1 s a rank) and
``spawn`` on CUDA (NCCL; one ``cuda:<rank>`` per process, all GPUs visible for NVLink peer
access). torchrun also works: :func:`executor.ep.init_from_env`.
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from executor import ep as ep_mod
from executor.ep import EPGroup
from twinfer.errors import TwinferError


# ----------------------------------------------------------------------------- starting ranks

def _start_method(device: str) -> str:
    return "fork" if torch.device(device).type == "cpu" and sys.platform.startswith("linux") else "spawn"


def _rank_main(rank: int, fn: Callable, world: int, init_method: str, device: str, backend: str | None,
               mode: str, capacity: int | None, args: tuple, outdir: str, threads: int | None) -> None:
    if torch.device(device).type == "cpu":
        torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // world))
    g = ep_mod.init_group(rank, world, init_method, device, backend, mode, capacity)
    try:
        result = fn(g, *args)
        with open(Path(outdir) / f"rank{rank}.pkl", "wb") as f:
            pickle.dump(result, f)
    finally:
        ep_mod.shutdown()


def run_ranks(fn: Callable, world: int, args: tuple = (), device: str = "cpu", backend: str | None = None,
              mode: str = "dynamic", capacity: int | None = None, threads: int | None = None) -> list:
    """Run ``fn(group, *args)`` on ``world`` new processes joined in one group; their return values, by rank.

    ``fn`` must be importable (a module-level function). The rendezvous is a FileStore in a
    fresh temporary folder (no port to race for). A failing rank raises here with its traceback.
    """
    if world < 1:
        raise TwinferError(f"world={world}: must be >= 1")
    if torch.device(device).type == "cuda" and torch.cuda.device_count() < world:
        raise TwinferError(f"EP width {world} needs {world} GPUs; torch sees {torch.cuda.device_count()}")
    with tempfile.TemporaryDirectory(prefix="twinfer-ep-") as tmp:
        init = f"file://{tmp}/store"
        mp.start_processes(_rank_main, args=(fn, world, init, device, backend, mode, capacity, args, tmp, threads),
                           nprocs=world, join=True, start_method=_start_method(device))
        out = []
        for r in range(world):
            with open(Path(tmp) / f"rank{r}.pkl", "rb") as f:
                out.append(pickle.load(f))
        return out


# ----------------------------------------------------------------------------- the EP engine on one rank

def check_ep_layout(layout, device: str) -> int:
    """EP width of a plan pool's layout the executor can run (attention-DP x EP, tp = pp = 1)."""
    if layout.tp != 1 or layout.pp != 1:
        raise TwinferError(f"executor EP runs tp=1, pp=1 (attention data-parallel); the plan has tp={layout.tp}, pp={layout.pp}")
    if layout.ep != layout.dp:
        raise TwinferError(f"executor EP runs one rank per GPU with dp == ep; the plan has dp={layout.dp}, ep={layout.ep}")
    if torch.device(device).type == "cuda" and torch.cuda.device_count() < layout.ep:
        raise TwinferError(f"plan EP width {layout.ep} needs {layout.ep} GPUs; torch sees {torch.cuda.device_count()}")
    return layout.ep


def build_rank_engine(g: EPGroup, model: str, *, redundant: int = 0, placements=None, two_micro_batch: bool = False,
                      replica_policy: str = "round_robin", **engine_kwargs):
    """This rank's LLMEngine with its MoE layers sharded over ``g`` (dummy weights must share the seed on all ranks)."""
    from executor.engine import LLMEngine
    from executor.ep_moe import shard_moe_layers

    sched = engine_kwargs.get("scheduler_config")
    draft = getattr(sched, "draft_len", None) if sched is not None and not isinstance(sched, dict) else (sched or {}).get("draft_len", 0)
    if draft:
        raise TwinferError("EP serving runs without MTP drafting (draft_len=0): one engine step must be one forward on every rank")
    engine_kwargs["decode_steps"] = 1
    if engine_kwargs.get("device", "cpu") == "cuda" and g.device.type == "cuda":
        engine_kwargs["device"] = str(g.device)

    def shard(net):
        shard_moe_layers(net, g, placements, redundant, two_micro_batch, replica_policy)
        return net

    return LLMEngine.from_args(model, model_transform=shard, **engine_kwargs)


def engine_step_or_idle(engine) -> list:
    """One engine step; an idle pass through the MoE collectives when it ran no forward."""
    from executor.ep_moe import idle_pass
    before = engine.runner.num_steps_run
    outs = engine.step()
    if engine.runner.num_steps_run == before:
        idle_pass(engine.runner.model)
    return outs


def _counters(engine) -> dict:
    s = engine.stats()
    return {k: getattr(s, k) for k in ("num_running", "num_waiting", "kv_used_blocks", "kv_total_blocks", "kv_held_blocks",
                                       "prefix_cache_queries", "prefix_cache_hits", "prompt_tokens_total",
                                       "generation_tokens_total")}


def worker_loop(g: EPGroup, engine) -> None:
    """Ranks 1..n-1: apply the front's messages, step (or idle), report; until told to stop."""
    from executor.engine import TokenOutput
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0, group=g.cpu_group)
        msg = box[0]
        if msg.get("stop"):
            return
        refused = []
        for rid, ids, params in msg["adds"].get(g.rank, []):
            try:
                engine.add_request(rid, ids, params)
            except Exception as err:   # refused here: report as an aborted request
                refused.append(TokenOutput(rid, [], True, "abort", len(ids), 0))
                refused[-1].error = str(err)   # type: ignore[attr-defined]
        for rid in msg["aborts"]:
            engine.abort(rid)
        outs = refused + engine_step_or_idle(engine)
        dist.gather_object((outs, _counters(engine)), None, dst=0, group=g.cpu_group)


class EPFrontEngine:
    """Rank 0's engine facade for an attention-DP x EP instance: the LLMEngine interface the server uses.

    ``add_request`` / ``abort`` queue work for the next lockstep ``step``; ``step`` returns
    the token deltas of all ranks. Wrap it in :class:`executor.async_engine.AsyncLLMEngine`.
    """

    def __init__(self, g: EPGroup, engine):
        self.g, self.local = g, engine
        self.scheduler = engine.scheduler            # AsyncLLMEngine reads its config
        self.max_model_len, self.eos_token_id = engine.max_model_len, engine.eos_token_id
        self.model_name, self.vocab_size = engine.model_name, engine.vocab_size
        self._owner: dict[str, int] = {}             # request id -> rank, until finished
        self._adds: dict[int, list] = {}
        self._aborts: list[str] = []
        self._counters = [_counters(engine)] * g.world
        self._stopped = False
        self._gen = 0

    def add_request(self, request_id: str, prompt_token_ids: list[int], params=None, arrival_time=None):
        """Validate here, run on the rank with the fewest outstanding requests (lowest rank on ties)."""
        from executor.engine import SamplingParams
        if request_id in self._owner:
            raise TwinferError(f"request id {request_id!r} is already in use")
        ids = list(prompt_token_ids)
        if not ids:
            raise TwinferError("prompt_token_ids is empty")
        if len(ids) >= self.max_model_len:
            raise TwinferError(f"prompt has {len(ids)} tokens; max_model_len is {self.max_model_len} (prompt + at least one output token)")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise TwinferError(f"token id {bad[0]} outside the vocabulary [0, {self.vocab_size})")
        load = [0] * self.g.world
        for r in self._owner.values():
            load[r] += 1
        rank = min(range(self.g.world), key=lambda r: (load[r], r))
        self._owner[request_id] = rank
        self._adds.setdefault(rank, []).append((request_id, ids, params or SamplingParams()))

    def abort(self, request_id: str) -> bool:
        if request_id not in self._owner:
            return False
        self._aborts.append(request_id)
        return True

    def has_unfinished(self) -> bool:
        return bool(self._owner)

    def step(self) -> list:
        """One lockstep step of every rank; the token deltas they produced."""
        from executor.engine import TokenOutput
        msg = {"adds": self._adds, "aborts": self._aborts}
        self._adds, self._aborts = {}, []
        dist.broadcast_object_list([msg], src=0, group=self.g.cpu_group)
        outs: list = []
        for rid, ids, params in msg["adds"].get(0, []):
            try:
                self.local.add_request(rid, ids, params)
            except Exception:
                outs.append(TokenOutput(rid, [], True, "abort", len(ids), 0))
        for rid in msg["aborts"]:
            self.local.abort(rid)
        outs += engine_step_or_idle(self.local)
        got = [None] * self.g.world
        dist.gather_object((outs, _counters(self.local)), got, dst=0, group=self.g.cpu_group)
        merged = []
        for r, (o, c) in enumerate(got):
            self._counters[r] = c
            merged.extend(o)
        for o in merged:
            if o.finished:
                self._owner.pop(o.request_id, None)
        return merged

    def stats(self):
        """Counters summed over ranks (as of the last step)."""
        from executor.engine import EngineStats
        tot = {k: sum(c[k] for c in self._counters) for k in self._counters[0]}
        return EngineStats(**tot)

    def generate(self, prompts: list[list[int]], params=None) -> list[list[int]]:
        """Offline: all prompts to completion over all ranks; generated ids per prompt, in order."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        self._gen += 1
        rids = [f"epgen{self._gen}-{i}" for i in range(len(prompts))]
        for rid, p, sp in zip(rids, prompts, plist):
            self.add_request(rid, p, sp)
        got: dict[str, list[int]] = {r: [] for r in rids}
        while self.has_unfinished():
            for o in self.step():
                if o.request_id in got:
                    got[o.request_id].extend(o.new_token_ids)
        return [got[r] for r in rids]

    def shutdown(self) -> None:
        """Tell the worker ranks to leave their loops."""
        if not self._stopped:
            self._stopped = True
            dist.broadcast_object_list([{"stop": True}], src=0, group=self.g.cpu_group)


# ----------------------------------------------------------------------------- serving from a plan

def _serve_worker(rank: int, world: int, init_method: str, device: str, model: str, build_kw: dict) -> None:
    if torch.device(device).type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    g = ep_mod.init_group(rank, world, init_method, device)
    try:
        engine = build_rank_engine(g, model, **build_kw)
        dist.barrier(group=g.cpu_group)
        worker_loop(g, engine)
    except Exception:
        traceback.print_exc()
        raise
    finally:
        ep_mod.shutdown()


def start_ep_front(model: str, world: int, device: str = "cpu", **build_kw) -> EPFrontEngine:
    """Start ranks 1..world-1 as child processes, join as rank 0 here, and return the front engine.

    Used by ``twinfer serve --plan`` when the plan's EP width is above 1. The children end
    when :meth:`EPFrontEngine.shutdown` is called (or this process exits).
    """
    port = ep_mod.free_port()
    init = f"tcp://127.0.0.1:{port}"
    ctx = mp.get_context(_start_method(device))
    procs = []
    for r in range(1, world):
        p = ctx.Process(target=_serve_worker, args=(r, world, init, device, model, build_kw), daemon=True)
        p.start()
        procs.append(p)
    if torch.device(device).type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    g = ep_mod.init_group(0, world, init, device)
    engine = build_rank_engine(g, model, **build_kw)
    dist.barrier(group=g.cpu_group)
    front = EPFrontEngine(g, engine)
    front.procs = procs   # type: ignore[attr-defined]
    return front
