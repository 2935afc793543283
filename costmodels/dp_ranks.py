"""Which attention-DP rank a request's work goes to: the one placement rule.

A request lives on one attention-DP rank (its KV is there), and the step waits for the busiest
rank. Both the scheduler's explicit ranks (``scheduler.dp_attention``: a prompt is placed when it
is admitted and stays there) and the cost model's split of a batch that carries no ranks
(``costmodels.effective``: the planner's screen, a scheduler without attention-DP policies) place
work with :func:`least_loaded`: the eligible rank with the least load, ties to the lowest rank.

This is TensorRT-LLM's attention-DP request balancing (``_balance_requests_across_ranks``: a heap
of ranks keyed by their active tokens, each new request to the top) and SGLang's
``minimum_tokens`` DP load-balance method; SGLang's default ``round_robin`` is the same rule when
every request has the same load, which is how the cost model spreads a batch's decodes.
"""

from __future__ import annotations

import numpy as np


def least_loaded(load: np.ndarray, tie: np.ndarray | None = None, eligible: np.ndarray | None = None) -> int:
    """The rank a new piece of work goes to: least ``load``, then least ``tie``, then lowest rank,
    among ``eligible`` ranks (all by default); -1 when no rank is eligible."""
    load = np.asarray(load)
    if eligible is not None:
        idx = np.flatnonzero(eligible)
        if idx.size == 0:
            return -1
    else:
        idx = np.arange(load.size)
    keys = (idx, load[idx]) if tie is None else (idx, np.asarray(tie)[idx], load[idx])
    return int(idx[np.lexsort(keys)[0]])


def place_largest_first(load: np.ndarray, work: np.ndarray, size: np.ndarray | None = None) -> np.ndarray:
    """Ranks of pieces of ``work`` placed largest ``size`` (default: work) first, ties in order, each onto
    ``least_loaded(load)``; ``load`` (float, one entry per rank) is updated in place."""
    if load.dtype.kind != "f":
        raise TypeError("place_largest_first: load must be a float array (it is updated in place)")
    ranks = np.empty(work.size, np.int64)
    dp = load.size
    order = np.lexsort((np.arange(work.size), -(work if size is None else size)))
    w = work[order]
    if w.size > dp and w[0] == w[-1] and load.max() - load.min() <= w[0]:
        # equal pieces onto ranks within one piece of each other: the rule deals them round-robin in
        # order of load (closed form of the loop below, same loads)
        rank_order = np.lexsort((np.arange(dp), load))
        ranks[order] = rank_order[np.arange(w.size) % dp]
        load += np.bincount(ranks, weights=work, minlength=dp)
        return ranks
    for j, a in zip(order.tolist(), w.tolist()):
        r = least_loaded(load)
        ranks[j] = r
        load[r] += a
    return ranks
