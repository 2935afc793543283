"""Money and volume of a deployment: $/GPU-hour, $/million tokens, revenue per GPU-hour, tokens per day."""

from __future__ import annotations

from pydantic import BaseModel

from costmodels.hardware import Hardware
from planner.request import Prices

SECONDS_PER_DAY = 86_400.0


class Economics(BaseModel):
    """Cost and revenue of running a deployment at its planned throughput (USD)."""

    price_per_gpu_hour: float
    price_source: str
    gpus_used: int
    gpus_budget: int
    cluster_cost_per_hour: float          # GPUs used x $/GPU-hour
    output_tokens_per_s: float            # whole deployment
    input_tokens_per_s: float
    cached_input_fraction: float
    output_tokens_per_day: float
    total_tokens_per_day: float
    cost_per_million_output_tokens: float
    cost_per_million_total_tokens: float
    revenue_per_gpu_hour: float           # at the given token prices
    margin_per_gpu_hour: float


def economics(hw: Hardware, prices: Prices, gpus_used: int, gpus_budget: int, output_tps: float,
              mean_prompt: float, mean_output: float, cached_fraction: float, input_tps: float | None = None) -> Economics:
    """Economics of a deployment producing ``output_tps`` output tokens/s and ``input_tps`` prompt tokens/s (a
    simulated run's own; None: the workload's prompt/output mix at that output rate, the screen's estimate)."""
    price = prices.gpu_hour if prices.gpu_hour is not None else hw.price_per_gpu_hour
    source = "user" if prices.gpu_hour is not None else f"hardware catalog ({hw.name} all-in TCO estimate)"
    if input_tps is None:
        input_tps = output_tps * (mean_prompt / mean_output) if mean_output > 0 else 0.0
    cost_h = price * gpus_used
    out_h = output_tps * 3600.0
    tot_h = (output_tps + input_tps) * 3600.0
    revenue_h = (
        input_tps * (1.0 - cached_fraction) * prices.input_per_mtok
        + input_tps * cached_fraction * prices.cached_input_per_mtok
        + output_tps * prices.output_per_mtok
    ) * 3600.0 / 1e6
    per_gpu = 1.0 / max(gpus_used, 1)
    return Economics(
        price_per_gpu_hour=price, price_source=source, gpus_used=gpus_used, gpus_budget=gpus_budget,
        cluster_cost_per_hour=cost_h, output_tokens_per_s=output_tps, input_tokens_per_s=input_tps,
        cached_input_fraction=cached_fraction,
        output_tokens_per_day=output_tps * SECONDS_PER_DAY, total_tokens_per_day=(output_tps + input_tps) * SECONDS_PER_DAY,
        cost_per_million_output_tokens=cost_h / out_h * 1e6 if out_h > 0 else float("inf"),
        cost_per_million_total_tokens=cost_h / tot_h * 1e6 if tot_h > 0 else float("inf"),
        revenue_per_gpu_hour=revenue_h * per_gpu, margin_per_gpu_hour=(revenue_h - cost_h) * per_gpu,
    )
