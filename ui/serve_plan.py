"""What ``twinfer serve --plan FILE`` takes from a plan file: the one place serving reads plan files.

The executor gets plain values (an EP width, a ``SchedulerConfig``, expert placements); it never
imports the planner or opens a plan (the layering table in DESIGN.md).
"""

from __future__ import annotations

import sys

from scheduler.config import SchedulerConfig
from twinfer.config import read_mapping, validate
from twinfer.errors import TwinferError


def serving_options(plan_path: str, device: str) -> tuple[int, dict]:
    """(EP width, engine options) from a plan file.

    A tuned policy (``twinfer tune --plan-out``) or any file with a top-level ``scheduler`` section:
    width 1 and that scheduler config. A ``twinfer plan`` file (``pools``) whose serving pool has EP
    width > 1: the rank engines' options (``executor.ep_launch.start_ep_front``): the pool's scheduler
    (MTP drafting off: not yet run across ranks, said on stderr when the plan had it), two-micro-batch,
    and the expert placements the plan implies; a one-GPU pool (EP width 1): width 1 and the pool's scheduler.
    Aggregated plans only.
    """
    doc = read_mapping(plan_path)
    if "pools" in doc:
        world, kw = _ep_options(plan_path, device)
        if world > 1:
            return world, kw
        if kw:  # EP width 1: one engine with the serving pool's scheduler (twinfer tune --gpus plans)
            return 1, kw
    sched = doc.get("scheduler")
    if isinstance(sched, dict):
        return 1, {"scheduler_config": validate(SchedulerConfig, sched, f"{plan_path}: scheduler")}
    return 1, {}


def _ep_options(plan_path: str, device: str) -> tuple[int, dict]:
    """(EP width, rank-engine options) of a ``twinfer plan`` file's serving pool; (1, {}) without EP."""
    from executor.ep_launch import check_ep_layout
    from executor.ep_moe import placements_from_plan
    from executor.model_config import resolve_spec
    from planner.plan import load_plan

    plan = load_plan(plan_path)
    if plan.mode != "aggregated":
        raise TwinferError("twinfer serve runs aggregated plans; this plan is disaggregated")
    pool = plan.pool("mixed")
    if pool.layout.ep <= 1:
        return 1, {"scheduler_config": pool.scheduler} if pool.layout.gpus == 1 else {}
    world = check_ep_layout(pool.layout, device)
    spec = resolve_spec(plan.model)
    sched = pool.scheduler
    if sched.draft_len:
        print(f"twinfer serve: EP={world} runs without MTP drafting (the plan has draft_len={sched.draft_len})", file=sys.stderr)
        sched = sched.model_copy(update={"draft_len": 0, "acceptance_rates": []})
    kw: dict = {"two_micro_batch": pool.layout.two_micro_batch, "scheduler_config": sched}
    if spec.moe is not None:
        n_moe = sum(1 for i in range(spec.num_layers) if spec.is_moe_layer(i)) + spec.mtp_layers
        kw["placements"] = placements_from_plan(pool.layout, plan.effects, spec.moe.n_routed_experts, n_moe)
    return world, kw
