"""Host work of one eager executor step: dispatched torch ops, kernel calls and host syncs, per layer.

An eager step's host time is (dispatched ops x per-op cost) + (host syncs x their stall); on the H200 the
5-layer DeepSeek-V3 FP8 engine paid ~23 ms of it per eager step (issue 18). This counts both on any device
with the executor's real code path (``model.forward`` -> layers -> ``kernels.ops``):

- ``aten`` ops dispatched by the executor's own code (a ``TorchDispatchMode``), split into the layer loop
  and the rest of the step (embedding, final norm, input building, sampling);
- kernel calls: each ``kernels.ops.call`` counts as one (its implementation's own aten ops are counted
  apart, under ``in_kernels``: on the GPU they are Triton/vendor launches plus their glue);
- host syncs: aten ops that read device data back or size their output from it (``.item()``/``int(t)``/
  ``.tolist()`` -> ``_local_scalar_dense``, ``nonzero``, ``unique``, ``masked_select``, boolean indexing,
  ``bincount``), device->host copies, and ``torch.cuda.synchronize`` calls. On CUDA the device script also
  turns on ``torch.cuda.set_sync_debug_mode`` (which sees blocking H2D copies too).

``small_deepseek_v3()`` is DeepSeek-V3's structure (MLA with q/kv LoRA, 3 dense layers then MoE with group-limited
sigmoid routing and a shared expert, FP8 linears) at dimensions a CPU runs in milliseconds. Op counts do not
depend on the dimensions, so the counts are the H200 engine's up to the kernels chosen there.

CLI: ``python -m benchmarks.gpu.eager_host [--device cuda]`` prints the small model's counts; ``--engine --out F.json``
times the H200 engine (``scripts/device_eager.sh``): decode graph vs eager, and prefill/mixed steps eager vs through
the piecewise CUDA graphs (executor/piecewise_graphs.py) in the same process, with the capture's seconds and memory.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops that read device data back to the host (or size their output from it): a device->host sync on CUDA
SYNC_OPS = ("_local_scalar_dense", "nonzero", "unique", "_unique", "masked_select", "bincount", "item",
            "repeat_interleave.Tensor", "index.Tensor_bool", "equal", "is_nonzero")
# metadata-only ops: no kernel and no allocation (counted apart: they cost dispatch but far less)
VIEW_OPS = ("view", "_unsafe_view", "reshape", "expand", "slice", "select", "unsqueeze", "squeeze", "permute",
            "transpose", "t", "as_strided", "alias", "detach", "split", "split_with_sizes", "unbind", "chunk",
            "narrow", "view_as", "_reshape_alias", "lift_fresh", "lift_fresh_copy")


@dataclass
class OpCount:
    """Counts of one region (the layer loop, or the whole step)."""

    ops: int = 0            # aten ops dispatched by executor code (not inside a kernel implementation)
    views: int = 0          # ... of which metadata-only (views)
    kernel_calls: int = 0   # kernels.ops calls (one vendor/Triton/reference implementation each)
    in_kernels: int = 0     # aten ops dispatched inside kernel implementations
    syncs: int = 0          # host syncs (see SYNC_OPS) in executor code
    kernel_syncs: int = 0   # ... inside kernel implementations (the CPU references have some; GPU kernels must not)
    sync_ops: dict[str, int] = field(default_factory=dict)
    by_op: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"ops": self.ops, "views": self.views, "kernel_calls": self.kernel_calls, "in_kernels": self.in_kernels,
                "syncs": self.syncs, "kernel_syncs": self.kernel_syncs, "sync_ops": dict(self.sync_ops)}


def _is_sync(name: str, args, kwargs) -> bool:
    base = name.split(".")[0]
    if base in SYNC_OPS or name in SYNC_OPS:
        return True
    if base == "index" and any(isinstance(a, torch.Tensor) and a.dtype == torch.bool
                               for a in (args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ())):
        return True   # boolean-mask indexing sizes its output from the mask
    if base in ("_to_copy", "copy_", "to"):
        src = args[1] if base == "copy_" and len(args) > 1 else (args[0] if args else None)
        dst_dev = kwargs.get("device") if base != "copy_" else (args[0].device if args else None)
        if isinstance(src, torch.Tensor) and src.device.type == "cuda" and dst_dev is not None \
                and torch.device(dst_dev).type == "cpu":
            return True   # device -> host copy
    return False


class StepCounter(TorchDispatchMode):
    """Counts aten ops, kernel calls and host syncs; ``region`` names where they land ("layers" or "other")."""

    def __init__(self):
        super().__init__()
        self.regions: dict[str, OpCount] = {"layers": OpCount(), "other": OpCount()}
        self.region = "other"
        self.kernel_depth = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__ if hasattr(func, "__name__") else str(func)
        full = str(func.overloadpacket.__name__) + "." + func._overloadname if hasattr(func, "overloadpacket") else name
        base = full.split(".")[0]
        c = self.regions[self.region]
        if _is_sync(full, args, kwargs):
            self.note_sync(base)
        if self.kernel_depth:
            c.in_kernels += 1
        else:
            c.ops += 1
            c.by_op[base] = c.by_op.get(base, 0) + 1
            if base in VIEW_OPS:
                c.views += 1
        return func(*args, **kwargs)

    def note_sync(self, what: str) -> None:
        c = self.regions[self.region]
        if self.kernel_depth:
            c.kernel_syncs += 1
            what = "kernel:" + what
        else:
            c.syncs += 1
        c.sync_ops[what] = c.sync_ops.get(what, 0) + 1


@contextlib.contextmanager
def counting(model) -> StepCounter:
    """Count inside the block: kernel calls through ``kernels.ops.call``, the decoder layers as the "layers" region,
    ``torch.cuda.synchronize`` as a sync. Restores everything it patched."""
    from kernels import ops
    counter = StepCounter()
    orig_call, orig_sync = ops.call, torch.cuda.synchronize

    def call(op, device, *args, **kwargs):
        counter.regions[counter.region].kernel_calls += 1
        counter.kernel_depth += 1
        try:
            return orig_call(op, device, *args, **kwargs)
        finally:
            counter.kernel_depth -= 1

    def sync(*a, **k):
        counter.note_sync("cuda.synchronize")
        return orig_sync(*a, **k)

    hooks = []
    layers = list(model.model.layers)
    for layer in layers:
        hooks.append(layer.register_forward_pre_hook(lambda m, a: setattr(counter, "region", "layers")))
        hooks.append(layer.register_forward_hook(lambda m, a, o: setattr(counter, "region", "other")))
    ops.call, torch.cuda.synchronize = call, sync
    try:
        with counter:
            yield counter
    finally:
        ops.call, torch.cuda.synchronize = orig_call, orig_sync
        for h in hooks:
            h.remove()


# ----------------------------------------------------------------------------- the model and its steps

def small_deepseek_v3(num_layers: int = 5):
    """DeepSeek-V3's structure at small dims: 3 dense layers then MoE (16 experts, top-4 in 2 of 4 groups), FP8-able."""
    from costmodels.model_spec import MLAConfig, ModelSpec, MoEConfig
    return ModelSpec(
        name="small-deepseek-v3", family="deepseek_v3", num_layers=num_layers, hidden_size=256, vocab_size=512,
        num_attention_heads=4, num_kv_heads=1, head_dim=192, intermediate_size=512, attention="mla",
        mla=MLAConfig(q_lora_rank=128, kv_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32),
        moe=MoEConfig(n_routed_experts=16, n_shared_experts=1, top_k=4, moe_intermediate_size=128, first_k_dense=3,
                      n_group=4, topk_group=2, scoring="sigmoid"),
        mtp_layers=0, max_context=4096, sources=["twinfer: benchmarks/gpu/eager_host.py (DeepSeek-V3 structure, small dims)"])


def build_runner(spec=None, device: str = "cpu", dtype: str = "fp8", pages: int = 1400, page_size: int = 64):
    """A ModelRunner over ``spec`` (default: the small DeepSeek-V3) with dummy weights."""
    from executor.kv_cache import KVCache
    from executor.model_config import ExecModelConfig
    from executor.model_runner import ModelRunner
    from executor.weights import build_model
    cfg = ExecModelConfig.build(spec or small_deepseek_v3())
    dev = torch.device(device)
    model = build_model(cfg, dev, dtype, "dummy", seed=0)
    kv = KVCache(cfg, pages, page_size, dev, model.model.embed_tokens.weight.dtype)
    return ModelRunner(model, kv, dev, eos_token_id=None)


def step_plan(runner, decode_ctx: list[int], prefill: list[tuple[int, int]], tag: str = "s"):
    """A StepPlan of decodes at ``decode_ctx`` and prefill chunks (new, cached) on distinct pages."""
    import numpy as np

    from scheduler.plan import ScheduledChunk, StepPlan
    from scheduler.request import Request
    page = runner.page_size
    vocab = runner.model.cfg.spec.vocab_size
    rng = np.random.default_rng(len(decode_ctx) * 7919 + len(prefill))
    nxt = [0]

    def take(n: int) -> list[int]:
        out = list(range(nxt[0], nxt[0] + n))
        nxt[0] += n
        if nxt[0] > runner.kv.null_page:
            raise ValueError("step_plan: not enough KV pages for this shape")
        return out

    decodes = []
    for i, c in enumerate(decode_ctx):
        r = Request(f"{tag}d{i}", 0.0, c, 1 << 20, prompt_token_ids=rng.integers(0, vocab, max(c, 1)).tolist())
        r.block_ids = take(-(-(c + 1) // page))
        decodes.append(r)
    chunks = []
    for i, (new, ctx) in enumerate(prefill):
        r = Request(f"{tag}p{i}", 0.0, ctx + new, 1 << 20, prompt_token_ids=rng.integers(0, vocab, ctx + new).tolist())
        r.block_ids = take(-(-(ctx + new) // page))
        chunks.append(ScheduledChunk(r, new, ctx, True))
    return StepPlan(0, prefills=chunks, decodes=decodes, decode_context_lens=np.asarray(decode_ctx, np.int64), draft_len=0)


def count_step(runner, plan) -> dict[str, OpCount]:
    """Counts of one eager ``runner.execute(plan)`` (after one uncounted run of the same plan: lazy imports,
    kernel choices and JIT stay out of the count)."""
    with graphs_for(runner, "eager"):
        runner.execute(plan)
        with counting(runner.model) as c:
            runner.execute(plan)
    return c.regions


@contextlib.contextmanager
def graphs_for(runner, mode: str):
    """``runner`` with only the graphs ``mode`` replays ("graph": the decode graphs, "piecewise": the pieces, else
    none: eager), the runner's own restored after."""
    saved = runner.graphs, runner.piecewise
    runner.graphs = saved[0] if mode == "graph" else None
    runner.piecewise = saved[1] if mode == "piecewise" else None
    try:
        yield
    finally:
        runner.graphs, runner.piecewise = saved


SHAPES = {   # name -> (decode contexts, prefill chunks (new, cached)): the H200 device script's eager shapes
    "decode b=1": ([1024], []),
    "decode b=8": ([1024] * 8, []),
    "decode b=64": ([1024] * 64, []),
    "prefill 64": ([], [(64, 0)]),
    "prefill 512": ([], [(512, 0)]),
    "mixed 16 dec + 256 over 2048": ([1024] * 16, [(256, 2048)]),
    "mixed 32 dec + 2 x 128": ([2048] * 32, [(128, 0), (128, 512)]),
}


def table(runner, shapes: dict | None = None) -> list[dict]:
    """One row per shape: per-layer and whole-step counts."""
    n_layers = len(runner.model.model.layers)
    rows = []
    for name, (dec, pre) in (shapes or SHAPES).items():
        r = count_step(runner, step_plan(runner, dec, pre, tag=name.replace(" ", "_")))
        lay, oth = r["layers"], r["other"]
        rows.append({"shape": name, "ops_per_layer": lay.ops / n_layers, "kernel_calls_per_layer": lay.kernel_calls / n_layers,
                     "views_per_layer": lay.views / n_layers, "in_kernels_per_layer": lay.in_kernels / n_layers,
                     "layer_syncs": lay.syncs, "other_ops": oth.ops, "other_syncs": oth.syncs,
                     "sync_ops": {**oth.sync_ops, **{f"layers:{k}": v for k, v in lay.sync_ops.items()}},
                     "top_layer_ops": sorted(lay.by_op.items(), key=lambda kv: -kv[1])[:12]})
    return rows


# ----------------------------------------------------------------------------- the H200 engine (device script)

# modes: "graph" (whole-forward decode graph), "eager" (no graphs at all), "piecewise" (executor/piecewise_graphs.py:
# everything but attention replayed per token bucket, attention eager); on and off in the same process
ENGINE_SHAPES = {   # name -> (decode contexts, prefill chunks (new, cached), modes); the piecewise comparison first
    "prefill 64": ([], [(64, 0)], ("eager", "piecewise")),
    "prefill 512": ([], [(512, 0)], ("eager", "piecewise")),
    "mixed 16 dec@1024 + 256 over 2048": ([1024] * 16, [(256, 2048)], ("eager", "piecewise")),
    "mixed 32 dec@2048 + 128 + 128 over 512": ([2048] * 32, [(128, 0), (128, 512)], ("eager", "piecewise")),
    "prefill 2048": ([], [(2048, 0)], ("eager", "piecewise")),
    "prefill 4096": ([], [(4096, 0)], ("eager", "piecewise")),
    "decode b=1": ([1024], [], ("graph", "eager")),
    "decode b=8": ([1024] * 8, [], ("graph", "eager")),
    "decode b=64": ([1024] * 64, [], ("graph", "eager")),
}


ROWWISE_OPS = ("quant_fp8_act", "rms_norm", "rope", "silu_mul")   # one Triton launch each on CUDA (kernels/triton_rowwise.py)


def host_syncs(fn) -> tuple[int, list[str]]:
    """Host syncs ``fn`` makes, as CUDA's sync debug mode reports them (blocking copies, ``.item()``, ``nonzero``...)."""
    if not torch.cuda.is_available():
        fn()
        return 0, ["(no CUDA: not checked)"]
    msgs = [m.splitlines()[0][:120] for m in sync_messages(fn)]
    return len(msgs), msgs


def sync_messages(fn) -> list[str]:
    """The warnings CUDA's sync debug mode raises during one call of ``fn``, one per synchronising operation (CUDA)."""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [str(w.message) for w in caught if "synchroniz" in str(w.message).lower()]


def per_op_host_us(device: torch.device, n: int = 2000) -> dict:
    """Host microseconds per call, no sync: a small torch op, and one Triton launch (the fused quantisation)."""
    import time
    a = torch.ones(64, 128, device=device, dtype=torch.bfloat16)
    out = {}
    for name, fn in (("torch add", lambda: a + a), ("torch view", lambda: a.view(-1)),
                     ("ops.quant_fp8_act", lambda: _ops().quant_fp8_act(a)), ("ops.rms_norm", lambda: _ops().rms_norm(a, a[0]))):
        for _ in range(50):
            fn()
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out[name] = (time.perf_counter() - t0) / n * 1e6
        _sync(device)
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _ops():
    from kernels import ops
    return ops


def check_rowwise(device: torch.device) -> dict:
    """The fused row-wise kernels against the torch reference on this device (whether the quantisation is bit-exact:
    on the H200 at 8df7bd1 it was not)."""
    from kernels import reference as ref
    g = torch.Generator(device=device).manual_seed(0)
    x = (torch.randn(64, 7168, device=device, generator=g) * 3).to(torch.bfloat16)
    w = torch.randn(7168, device=device, generator=g).to(torch.bfloat16)
    ops = _ops()
    q, sc = ops.quant_fp8_act(x)
    q0, s0 = ref.quant_fp8_act(x)
    y, y0 = ops.rms_norm(x, w, 1e-6).float(), ref.rms_norm(x, w, 1e-6).float()
    pe = torch.randn(64, 129, 64, device=device, generator=g).to(torch.bfloat16)
    cs = torch.randn(4096, 64, device=device, generator=g)
    pos = torch.arange(1000, 1064, device=device)
    r, r0 = ops.rope(pe, pos, cs, True).float(), ref.rope(pe, pos, cs, True).float()
    a, b = x[:, :3584], x[:, 3584:]
    m, m0 = ops.silu_mul(a, b).float(), ref.silu_mul(a, b).float()
    rel = lambda u, v: float((u - v).abs().max() / v.abs().max())  # noqa: E731
    return {"quant_impl": ops.used.get("quant_fp8_act"), "quant_bits_equal": bool(torch.equal(q.view(torch.uint8), q0.view(torch.uint8))),
            "quant_scales_equal": bool(torch.equal(sc, s0)), "rms_impl": ops.used.get("rms_norm"), "rms_max_rel": rel(y, y0),
            "rope_impl": ops.used.get("rope"), "rope_max_rel": rel(r, r0), "silu_impl": ops.used.get("silu_mul"),
            "silu_max_rel": rel(m, m0)}


def engine_checks(engine) -> dict:
    """The engine's MoE layer (Triton glue with the fused row-wise kernels) against the torch reference on 16 tokens, and
    a decode step of 8 replayed as a CUDA graph against the same step run eagerly (same kernels: expected equal)."""
    from executor.forward_batch import SeqInput, build_forward_batch
    from executor.moe import MoE
    from kernels import reference as ref
    runner = engine.runner
    dev = runner.device
    out: dict = {}
    with torch.inference_mode():
        moe = next((m for m in runner.model.modules() if isinstance(m, MoE)), None)
        if moe is not None:
            x = torch.randn(16, moe.experts.w13.shape[2], device=dev, generator=torch.Generator(device=dev).manual_seed(2)).to(runner.kv.dtype)
            w, ids = moe.route(x)
            ex = moe.experts
            sc = (ex.w13_scale_inv, ex.w2_scale_inv) if ex.fp8 else (None, None)
            y = _ops().moe_experts(x, w, ids, ex.w13, ex.w2, *sc).float()
            y0 = ref.moe_experts(x, w, ids, ex.w13, ex.w2, *sc).float()
            out.update(moe_impl=_ops().used.get("moe_experts"), moe_max_rel=float((y - y0).abs().max() / y0.abs().max()))
        if runner.graphs is not None and runner.graphs.captured:
            seqs = [SeqInput([7 + i], 300 + 17 * i, list(range(i * 8, i * 8 + 8)), True) for i in range(8)]
            batch = build_forward_batch(seqs, runner.page_size, runner.kv.null_page, dev)
            hg, size = runner.graphs.run(batch)
            hg = hg.float().clone()
            he = runner.model(batch, runner.kv).float()
            out.update(graph_size=size, graph_vs_eager_max_abs=float((hg - he).abs().max()), hidden_max_abs=float(he.abs().max()))
        if runner.piecewise is not None and runner.piecewise.captured:
            out.update(piecewise_check(runner))
    return out


def piecewise_check(runner) -> dict:
    """A mixed step (8 decodes + a 300-token chunk over 200 cached) through the replayed pieces vs the eager forward:
    max abs difference of the final hidden states and the share of rows whose greedy token agrees."""
    from executor.forward_batch import SeqInput, build_forward_batch
    g = torch.Generator().manual_seed(5)
    vocab = runner.model.cfg.spec.vocab_size
    seqs = [SeqInput([int(torch.randint(vocab, (1,), generator=g))], 300 + 17 * i, list(range(i * 8, i * 8 + 8)), True)
            for i in range(8)]
    seqs.append(SeqInput(torch.randint(vocab, (300,), generator=g).tolist(), 200, list(range(64, 72)), False))
    batch = build_forward_batch(seqs, runner.page_size, runner.kv.null_page, runner.device)
    hp, size = runner.piecewise.run(batch)
    hp = hp.clone()
    he = runner.model(batch, runner.kv)
    same = runner.model.compute_logits(hp).argmax(-1) == runner.model.compute_logits(he).argmax(-1)
    return {"piecewise_bucket": size, "piecewise_tokens": batch.num_tokens,
            "piecewise_vs_eager_max_abs": float((hp.float() - he.float()).abs().max()),
            "piecewise_greedy_agree": float(same.float().mean())}


def time_shape(engine, name: str, dec: list[int], pre: list, mode: str, repeats: int) -> dict:
    """One shape in one mode: wall of ``execute`` (inputs, forward, sampling; median), the forward's host issue time
    and its synchronised time (eager only), the host syncs of one step and the executor's ops per layer."""
    import statistics
    import time

    from executor.calibrate import synthetic_plan
    runner = engine.runner
    plan = synthetic_plan(engine, dec, pre, f"eh_{name.replace(' ', '_')}_{mode}_")
    try:
        with graphs_for(runner, mode), torch.inference_mode():
            for _ in range(2):   # Triton specialisations of new sizes compile here, not in the timed runs
                runner.execute(plan)
            walls, devs = [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                runner.execute(plan)
                walls.append(time.perf_counter() - t0)
                devs.append(runner.step_records[-1]["device_s"])
            syncs, msgs = host_syncs(lambda: runner.execute(plan))
            with counting(runner.model) as c:
                runner.execute(plan)
            row = {"shape": name, "mode": mode, "wall_ms": statistics.median(walls) * 1e3,
                   "wall_min_ms": min(walls) * 1e3, "events_ms": statistics.median(devs) * 1e3,
                   "graph_bs": runner.step_records[-1].get("graph_bs", 0),
                   "piecewise_bs": runner.step_records[-1].get("piecewise_bs", 0), "host_syncs": syncs, "sync_msgs": msgs[:6],
                   "counts": {k: v.as_dict() for k, v in c.regions.items()}}
            if mode != "graph":
                row.update(forward_times(runner, plan, repeats))
    finally:
        for r in plan.decodes + [c.request for c in plan.prefills]:
            runner.remove_request(r.request_id)
    return row


def forward_times(runner, plan, repeats: int) -> dict:
    """The forward alone (``runner.forward``: eager, or the piecewise graphs when the runner has them): host issue
    time (no sync; the host cost when the GPU keeps up) and synchronised time."""
    import statistics
    import time

    from executor.forward_batch import SeqInput, build_forward_batch
    seqs = [SeqInput([r.prompt_token_ids[-1]], int(c), r.block_ids, True) for r, c in zip(plan.decodes, plan.decode_context_lens)]
    seqs += [SeqInput(c.request.prompt_token_ids[c.context_len: c.context_len + c.num_new_tokens], c.context_len,
                      c.request.block_ids, False) for c in plan.prefills]
    batch = build_forward_batch(seqs, runner.page_size, runner.kv.null_page, runner.device)
    issue, total = [], []
    for _ in range(repeats):
        _sync(runner.device)
        t0 = time.perf_counter()
        runner.forward(batch)
        t1 = time.perf_counter()
        _sync(runner.device)
        issue.append(t1 - t0)
        total.append(time.perf_counter() - t0)
    out = {"forward_issue_ms": statistics.median(issue) * 1e3, "forward_sync_ms": statistics.median(total) * 1e3}
    if runner.piecewise is not None:   # where the pieces' host issue time goes: input fill, replays, eager attention
        split: dict[str, float] = {}
        for _ in range(repeats):
            _sync(runner.device)
            runner.piecewise.run(batch, host_s=split)
        _sync(runner.device)
        out["piecewise_host_ms"] = {k: v / repeats * 1e3 for k, v in split.items()}
    return out


def bench_engine(out: str | None, repeats: int = 10, compare_torch_rowwise: bool = False, device: str = "cuda",
                 model: str = "deepseek-v3", layers: int | None = 5, shapes: dict | None = None, kv_blocks: int = 4096,
                 max_model_len: int = 8192) -> dict:
    """The H200 5-layer DeepSeek-V3 FP8 engine (``executor.calibrate.build_engine``, dummy weights): eager vs graph
    decode, eager and piecewise-graph prefill and mixed steps (on and off in this process, with the capture's seconds
    and memory), host syncs and ops per layer; prints the table, writes ``out`` (JSON). ``compare_torch_rowwise``: three
    eager shapes again with the row-wise ops as torch ops (measured at ec5f1df; off by default to keep the run short)."""
    import json
    import time

    from executor.calibrate import build_engine
    from kernels import ops, registry
    dev = torch.device(device)
    shapes = shapes or ENGINE_SHAPES
    res: dict = {"per_op_host_us": per_op_host_us(dev), "rowwise_check": check_rowwise(dev)}
    print("host us per call (no sync):", {k: round(v, 2) for k, v in res["per_op_host_us"].items()})
    print("fused row-wise kernels vs reference:", res["rowwise_check"])
    t0 = time.perf_counter()
    engine = build_engine(model, layers, device, "fp8", max_num_seqs=64, max_model_len=max_model_len, num_kv_blocks=kv_blocks,
                          max_batched_tokens=8192)
    res["build_s"] = time.perf_counter() - t0
    if dev.type != "cuda" and engine.runner.piecewise is None:   # a CPU dry run: the same pieces, uncaptured
        engine.runner.enable_piecewise_graphs(8192, capture=False)
    res["warmup_s"] = engine.warmup() if dev.type == "cuda" else 0.0
    res["graphs"] = graph_summary(engine.runner)
    print(f"engine built in {res['build_s']:.1f} s (graphs {engine.runner.graphs.captured if engine.runner.graphs else None}), "
          f"warm-up {res['warmup_s']:.1f} s")
    print("graphs:", res["graphs"])
    try:
        res["engine_checks"] = engine_checks(engine)
    except Exception as e:  # noqa: BLE001 - a failed check must not lose the timings
        res["engine_checks"] = {"error": f"{type(e).__name__}: {e}"[:300]}
    print("engine checks:", res["engine_checks"])
    rows = []

    def dump():
        res["rows"] = rows
        if out:
            with open(out, "w") as f:
                json.dump(res, f, indent=1)

    for name, (dec, pre, modes) in shapes.items():
        for mode in modes:
            if mode == "graph" and engine.runner.graphs is None:
                continue
            if mode == "piecewise" and engine.runner.piecewise is None:
                continue
            rows.append(time_shape(engine, name, dec, pre, mode, repeats))
            print_row(rows[-1], len(engine.runner.model.model.layers))
            dump()
    res["piecewise_vs_eager"] = piecewise_table(rows)
    for r in res["piecewise_vs_eager"]:
        print(f"{r['shape']:40s} eager {r['eager_ms']:8.2f} ms  piecewise {r['piecewise_ms']:8.2f} ms (bucket {r['bucket']})"
              f"  x{r['speedup']:.2f}  events {r['eager_events_ms']:8.2f} / {r['piecewise_events_ms']:8.2f} ms", flush=True)
    dump()
    if compare_torch_rowwise:   # the same eager steps with the row-wise ops as torch ops (as before issue 18's fix)
        registry.configure({op: "torch" for op in ROWWISE_OPS})
        ops.clear_choices()
        try:
            for name in [n for n in ("decode b=1", "prefill 512", "mixed 16 dec@1024 + 256 over 2048") if n in shapes]:
                dec, pre, _ = shapes[name]
                rows.append(time_shape(engine, name, dec, pre, "eager", repeats))
                rows[-1]["mode"] = "eager, torch row-wise"
                print_row(rows[-1], len(engine.runner.model.model.layers))
                dump()
        finally:
            registry.configure(None)
            ops.clear_choices()
    return res


def graph_summary(runner) -> dict:
    """The engine's captured graphs: decode sizes, piecewise buckets, capture seconds and memory, failures."""
    out: dict = {"decode_sizes": runner.graphs.captured if runner.graphs else None,
                 "decode_capture_s": runner.graphs.capture_s if runner.graphs else None,
                 "piecewise_off_reason": runner.piecewise_off_reason}
    pw = runner.piecewise
    if pw is not None:
        buf = pw.buf
        out.update(piecewise_buckets=pw.captured, piecewise_graphs=sum(len(g) for g in pw.graphs.values()),
                   piecewise_capture_s=pw.capture_s, piecewise_pool_mib=pw.mem_bytes / 2**20,
                   piecewise_buffers_mib=sum(t.numel() * t.element_size() for t in (buf.index, buf.pad, buf.x, buf.q, buf.out, buf.hidden)) / 2**20,
                   piecewise_failed=dict(list(pw.failed.items())[:3]), piecewise_num_failed=len(pw.failed))
    return out


def piecewise_table(rows: list[dict]) -> list[dict]:
    """Per shape timed both ways: eager vs piecewise wall (median) and CUDA-event span, and the bucket replayed."""
    by = {(r["shape"], r["mode"]): r for r in rows}
    out = []
    for (shape, mode), r in by.items():
        e = by.get((shape, "eager"))
        if mode != "piecewise" or e is None:
            continue
        out.append({"shape": shape, "eager_ms": e["wall_ms"], "piecewise_ms": r["wall_ms"], "bucket": r["piecewise_bs"],
                    "speedup": e["wall_ms"] / r["wall_ms"], "eager_events_ms": e["events_ms"], "piecewise_events_ms": r["events_ms"],
                    "eager_fwd_issue_ms": e.get("forward_issue_ms"), "piecewise_fwd_issue_ms": r.get("forward_issue_ms")})
    return out


def print_row(r: dict, n_layers: int) -> None:
    lay, oth = r["counts"]["layers"], r["counts"]["other"]
    print(f"{r['shape']:40s} {r['mode']:22s} wall {r['wall_ms']:8.2f} ms (min {r['wall_min_ms']:7.2f})  events {r['events_ms']:8.2f}"
          + (f"  fwd issue {r['forward_issue_ms']:7.2f} sync {r['forward_sync_ms']:7.2f}" if "forward_issue_ms" in r else " " * 32)
          + f"  syncs {r['host_syncs']:2d}  ops/layer {lay['ops'] / n_layers:5.1f} (+{lay['in_kernels'] / n_layers:5.1f} in"
          f" {lay['kernel_calls'] / n_layers:4.1f} kernel calls)  ops/step {lay['ops'] + oth['ops']:5d}"
          + (f"  bucket {r['piecewise_bs']}" if r.get("piecewise_bs") else "")
          + (f"  host ms {({k: round(v, 2) for k, v in r['piecewise_host_ms'].items()})}" if r.get("piecewise_host_ms") else "")
          + f"  {r['sync_msgs'][:2] if r['host_syncs'] else ''}", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp8")
    ap.add_argument("--verbose", action="store_true", help="print the most frequent aten ops of the layer loop")
    ap.add_argument("--engine", action="store_true", help="time the H200 5-layer DeepSeek-V3 FP8 engine (CUDA)")
    ap.add_argument("--out", default=None, help="JSON output of --engine")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--torch-rowwise", action="store_true", help="--engine: also three eager shapes with torch row-wise ops")
    a = ap.parse_args(argv)
    if a.engine:
        bench_engine(a.out, a.repeats, compare_torch_rowwise=a.torch_rowwise)
        return
    runner = build_runner(device=a.device, dtype=a.dtype)
    print(f"{'shape':32s} {'ops/layer':>9s} {'views':>6s} {'kernels':>7s} {'in-kern':>7s} {'layer syncs':>11s} {'other ops':>9s} {'other syncs':>11s}")
    for r in table(runner):
        print(f"{r['shape']:32s} {r['ops_per_layer']:9.1f} {r['views_per_layer']:6.1f} {r['kernel_calls_per_layer']:7.1f} "
              f"{r['in_kernels_per_layer']:7.1f} {r['layer_syncs']:11d} {r['other_ops']:9d} {r['other_syncs']:11d}  {r['sync_ops'] or ''}")
        if a.verbose:
            print("    ", r["top_layer_ops"])


if __name__ == "__main__":
    main()
