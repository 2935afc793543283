"""Pareto frontier of (output throughput per GPU, tokens/s per user): both higher is better."""

from __future__ import annotations

import numpy as np


def pareto_front(x: np.ndarray, y: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Indices of the points not dominated by any other (both coordinates maximised), by descending ``x``.

    A point is dominated if another is >= in both coordinates and > in one. Exact duplicates
    keep the lowest index (a stable, deterministic choice). ``mask`` restricts the candidates.
    """
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    idx = np.arange(x.size) if mask is None else np.flatnonzero(mask)
    if idx.size == 0:
        return idx
    # sort by x descending, then y descending, then index ascending (stable tie-break)
    order = idx[np.lexsort((idx, -y[idx], -x[idx]))]
    keep = []
    best_y = -np.inf
    last = None
    for i in order.tolist():
        if y[i] > best_y:
            keep.append(i)
            best_y = y[i]
            last = (x[i], y[i])
        elif last is not None and (x[i], y[i]) == last:
            continue  # duplicate of a kept point
    return np.asarray(keep, dtype=np.int64)
