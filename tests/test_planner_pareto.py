"""Pareto frontier of (output tokens/s per GPU, tokens/s per user) on hand-made candidate sets."""

from __future__ import annotations

import numpy as np

from planner.pareto import pareto_front


def front(points, mask=None):
    x = np.array([p[0] for p in points], float)
    y = np.array([p[1] for p in points], float)
    return pareto_front(x, y, None if mask is None else np.array(mask)).tolist()


def test_hand_made_set():
    #          0          1          2          3 (dominated by 1)  4 (dominated by 2)  5
    pts = [(1000, 10), (800, 30), (500, 50), (700, 25), (400, 45), (100, 80)]
    assert front(pts) == [0, 1, 2, 5]  # by descending throughput


def test_ties_and_duplicates_are_stable():
    pts = [(500, 50), (500, 50), (500, 40), (400, 50), (600, 10)]
    # the duplicate keeps the lower index; (500, 40) and (400, 50) are dominated by (500, 50)
    assert front(pts) == [4, 0]


def test_mask_restricts_to_slo_meeting_points():
    pts = [(1000, 10), (800, 30), (500, 50)]
    assert front(pts, [False, True, True]) == [1, 2]
    assert front(pts, [False, False, False]) == []


def test_every_point_is_either_on_the_front_or_dominated_by_it():
    rng = np.random.default_rng(0)
    x, y = rng.random(300), rng.random(300)
    f = pareto_front(x, y)
    on = set(f.tolist())
    for i in range(300):
        dominated = any(x[j] >= x[i] and y[j] >= y[i] and (x[j] > x[i] or y[j] > y[i]) for j in f)
        assert (i in on) != dominated
    # the front is monotone: throughput falls as per-user speed rises
    assert np.all(np.diff(x[f]) < 0) and np.all(np.diff(y[f]) > 0)
