"""Host (CPU) work of a serving step against its device work: the one async-overlap rule.

A serving loop does host work every step (schedule, build inputs, launch, complete). Without
async overlap the CPU prepares a step, then the GPU runs it: ``device + host``. With async
overlap (SGLang's zero-overhead scheduler, vLLM async scheduling) the CPU prepares step N+1
while the GPU runs step N, so a step costs ``max(device, host)``; only the first step after an
idle period (``cold_start``) cannot hide its preparation. The simulator's backend, the
planner's screen, capacity estimates and the UI all price a step with :func:`wall_time`.

A measured runner (``StepProfile``) overlaps its own launch work with the kernels only in part:
:func:`partial_overlap` is the same rule with the exposed fraction fitted between 0 (async
overlap) and 1 (they add).
"""

from __future__ import annotations

import numpy as np


def wall_time(device_s, host_s: float, async_overlap: bool, cold_start: bool = False):
    """Wall seconds of a step (a float) or of each step of a run (an array; only its first can start cold)."""
    if not async_overlap:
        return device_s + host_s
    if not isinstance(device_s, np.ndarray):
        if cold_start:
            return device_s + host_s
        return device_s if device_s >= host_s else host_s
    wall = np.maximum(device_s, host_s)
    if cold_start and len(wall):
        wall[0] = device_s[0] + host_s
    return wall


def exposed_host(device_s: float, host_s: float, async_overlap: bool) -> float:
    """Host seconds a (warm) step adds to its device time under the rule of :func:`wall_time`."""
    return max(0.0, host_s - device_s) if async_overlap else host_s


def partial_overlap(host_s, device_s, exposed: float):
    """``max(H, D) + exposed * min(H, D)``: host and device work overlapping in part (vectorised);
    ``exposed`` 0 is :func:`wall_time` with async overlap, 1 without."""
    h, d = np.asarray(host_s, float), np.asarray(device_s, float)
    return np.maximum(h, d) + exposed * np.minimum(h, d)
