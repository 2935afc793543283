"""Host (CPU) overhead of the engine loop and async CPU/GPU overlap, in simulated time."""

from __future__ import annotations

import numpy as np


def wall_step_times(device_s: np.ndarray, host_s: float, async_overlap: bool, cold_start: bool) -> np.ndarray:
    """Wall time of each step given its device time and the loop's host time per step.

    Without overlap the CPU prepares a step, then the GPU runs it: ``device + host``. With async
    overlap (SGLang's zero-overhead scheduler, vLLM async scheduling) the CPU prepares step N+1
    while the GPU runs step N, so a step costs ``max(device, host)``; only the first step after an
    idle period (``cold_start``) cannot hide its preparation.
    """
    if not async_overlap:
        return device_s + host_s
    wall = np.maximum(device_s, host_s)
    if cold_start and len(wall):
        wall[0] = device_s[0] + host_s
    return wall


def wall_step_time(device_s: float, host_s: float, async_overlap: bool, cold_start: bool) -> float:
    """``wall_step_times`` of a single step, for floats."""
    if not async_overlap or cold_start:
        return device_s + host_s
    return device_s if device_s >= host_s else host_s
