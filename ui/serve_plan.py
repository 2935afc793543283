"""What ``twinfer serve --plan FILE`` and ``twinfer run --plan FILE`` take from a plan file: the one place the
executor's commands read plan files.

The executor gets plain values (an EP width, a ``SchedulerConfig``, expert placements); it never
imports the planner or opens a plan (the layering table in DESIGN.md).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from scheduler.config import SchedulerConfig
from twinfer.config import read_mapping, validate
from twinfer.errors import TwinferError

# the ModelSpec fields that make two names the same network (a checkpoint folder's name is its folder's)
_ARCH = ("family", "num_layers", "hidden_size", "vocab_size", "num_attention_heads", "num_kv_heads", "head_dim",
         "intermediate_size", "attention", "mla", "moe", "layer_kinds", "sliding_window")


@dataclass
class PlanFile:
    """A plan file as the executor's commands read it."""

    path: str
    scheduler: dict          # the SchedulerConfig fields the file sets (the serving pool's, or a tuned policy's)
    model: str | None        # the model it was made for (None: a file that names none)
    plan: Any = None         # a ``twinfer plan`` file's ``planner.plan.Plan`` (None: a tuned policy)

    @property
    def pool(self):
        """The serving pool of a ``twinfer plan`` file (None for a tuned policy)."""
        return None if self.plan is None else self.plan.pool("mixed")


def read_plan(path, command: str) -> PlanFile:
    """A file's top-level ``scheduler`` (a tuned policy, ``twinfer tune --plan-out``) or an aggregated ``twinfer plan``
    file's serving pool's; anything else is refused (a plan file of another kind was ignored without a word).
    ``command``: the command running one engine, for the disaggregated plan's refusal."""
    doc = read_mapping(path)
    section = doc.get("scheduler")
    model = doc.get("model") if isinstance(doc.get("model"), str) else None
    if isinstance(section, dict):
        return PlanFile(str(path), dict(section), model)
    if section is not None:
        raise TwinferError(f"--plan {path}: 'scheduler' must be a mapping of SchedulerConfig fields")
    if "pools" in doc:
        from planner.plan import load_plan
        p = load_plan(path)
        if p.mode != "aggregated":
            raise TwinferError(f"--plan {path}: a disaggregated plan has a prefill and a decode scheduler; {command} "
                               "runs one engine" + (" (give --scheduler-config)" if command == "twinfer run" else ""))
        return PlanFile(str(path), p.pool("mixed").scheduler.model_dump(exclude_unset=True), p.model, p)
    raise TwinferError(f"--plan {path}: not a plan (no 'scheduler' section, no 'pools'); give a twinfer plan file or a "
                       "tuned policy (twinfer tune --plan-out)"
                       + (", or a SchedulerConfig as --scheduler-config" if command == "twinfer run" else ""))


def same_model(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` name one model: the same name (a catalog alias too), or the same network (a checkpoint
    folder of a catalog model)."""
    if a.strip().lower() == b.strip().lower():
        return True
    from costmodels.catalog import get_model
    try:
        sa, sb = get_model(a), get_model(b)
    except TwinferError:   # a model this machine cannot read (a plan's checkpoint folder elsewhere): not shown the same
        return False
    if sa.name.lower() == sb.name.lower():
        return True
    return sa.model_dump(include=set(_ARCH)) == sb.model_dump(include=set(_ARCH))


def check_plan_model(pf: PlanFile, model: str) -> None:
    """Refuse (exit 2) a plan made for another model than ``--model``: its batch sizes, chunk and layout were sized for
    that model's memory and step times (a llama-3.1-8b plan served tiny on the defaults without a word)."""
    if pf.model is not None and not same_model(pf.model, model):
        raise TwinferError(f"--plan {pf.path} was made for model {pf.model}, --model is {model}: give the plan's "
                           f"model (--model {pf.model}, or its checkpoint folder) or make a plan for {model}")


def plan_notes(pf: PlanFile, dtype: str) -> list[str]:
    """One line for each setting of a ``twinfer plan`` file one server does not run (``dtype``: the weights it runs):
    other instances, a multi-GPU instance the executor runs on one device, other weight dtypes."""
    pool = pf.pool
    if pool is None:
        return []
    lay, out = pool.layout, []
    if pool.instances > 1:
        out.append(f"the plan runs {pool.instances} instances of its serving pool; this server is one of them (start "
                   f"{pool.instances - 1} more with this --plan, behind a router, for the plan's whole deployment)")
    if lay.ep <= 1 and lay.gpus > 1:
        out.append(f"the plan's instance spans {lay.gpus} GPUs (tp={lay.tp}, dp={lay.dp}, pp={lay.pp}); the executor "
                   "has no tensor or pipeline parallelism (only EP with dp == ep), so this server runs the whole model "
                   "on one device with the plan's scheduler")
    if lay.weight_dtype != dtype:
        out.append(f"the plan's weights are {lay.weight_dtype} (layout.weight_dtype); this server runs {dtype} (--dtype)")
    return out


def serving_options(plan_path: str, device: str, model: str | None = None, dtype: str = "bf16") -> tuple[int, dict]:
    """(EP width, engine options) from a plan file (``read_plan``), with ``model`` (``--model``) checked against the
    model it was made for and a line on stderr for each setting this server does not run (``plan_notes``).

    A tuned policy (``twinfer tune --plan-out``) or any file with a top-level ``scheduler`` section:
    width 1 and that scheduler config. A ``twinfer plan`` file (``pools``) whose serving pool has EP
    width > 1: the rank engines' options (``executor.ep_launch.start_ep_front``): the pool's scheduler
    (MTP drafting off: not yet run across ranks, said on stderr when the plan had it), two-micro-batch,
    and the expert placements the plan implies; otherwise (EP width 1): width 1 and the pool's scheduler.
    Aggregated plans only.
    """
    pf = read_plan(plan_path, "twinfer serve")
    if model is not None:
        check_plan_model(pf, model)
    for line in plan_notes(pf, dtype):
        print(f"twinfer serve: {line}", file=sys.stderr)
    sched = validate(SchedulerConfig, pf.scheduler, f"{plan_path}: scheduler")
    world, kw = _ep_options(pf, device, sched) if pf.pool is not None and pf.pool.layout.ep > 1 else (1, {})
    kw.setdefault("scheduler_config", sched)
    s = kw["scheduler_config"]
    print(f"twinfer serve: --plan {plan_path}: {'EP ' + str(world) + ', ' if world > 1 else ''}max_num_seqs "
          f"{s.max_num_seqs}, max_num_batched_tokens {s.max_num_batched_tokens}, chunked prefill "
          f"{'on' if s.enable_chunked_prefill else 'off'}, draft_len {s.draft_len}", file=sys.stderr)
    return world, kw


def _ep_options(pf: PlanFile, device: str, sched: SchedulerConfig) -> tuple[int, dict]:
    """(EP width, rank-engine options) of a ``twinfer plan`` file's serving pool of EP width > 1."""
    from executor.ep_launch import check_ep_layout
    from executor.ep_moe import placements_from_plan
    from executor.model_config import resolve_spec

    plan, pool = pf.plan, pf.pool
    world = check_ep_layout(pool.layout, device)
    spec = resolve_spec(plan.model)
    if sched.draft_len:
        print(f"twinfer serve: EP={world} runs without MTP drafting (the plan has draft_len={sched.draft_len})", file=sys.stderr)
        sched = sched.model_copy(update={"draft_len": 0, "acceptance_rates": []})
    kw: dict = {"two_micro_batch": pool.layout.two_micro_batch, "scheduler_config": sched}
    if spec.moe is not None:
        n_moe = sum(1 for i in range(spec.num_layers) if spec.is_moe_layer(i)) + spec.mtp_layers
        kw["placements"] = placements_from_plan(pool.layout, plan.effects, spec.moe.n_routed_experts, n_moe)
    return world, kw
