"""PrefixCache.match by bisection and the nodes' shared block-id chains equals the child-by-child walk it replaced
(issue 19, planner speed): the same block ids for every query, over random sessions that share prefixes, grow,
are released, evicted and re-inserted (one-block inserts and runs, hash values repeated at other depths)."""

from __future__ import annotations

import numpy as np

from scheduler.prefix_cache import PrefixCache


def _walk(cache: PrefixCache, hashes, max_blocks: int) -> list[int]:
    """PrefixCache.match as written before: child by child from the root."""
    node, out = cache.root, []
    for h in hashes[:max_blocks]:
        node = node.children.get(h)
        if node is None:
            break
        out.append(node.block_id)
    return out


def _chains_agree(cache: PrefixCache) -> None:
    """Every node's ids[:depth] is the block ids from the root down to it."""
    for b, node in cache._by_block.items():
        chain, n = [], node
        while n is not cache.root:
            chain.append(n.block_id)
            n = n.parent
        assert list(node.ids[:node.depth]) == chain[::-1] and node.block_id == b


def test_match_equals_the_walk_through_inserts_evictions_and_reuse():
    rng = np.random.default_rng(19)
    checked = 0
    for trial in range(12):
        ref = [0] * 200   # few blocks: evictions all the time
        cache = PrefixCache(ref)
        free = list(range(200))[::-1]
        sessions = [tuple(int(v) for v in rng.integers(0, 4 if trial % 2 else 10**9, rng.integers(1, 25))) for _ in range(10)]
        live = []
        for step in range(300):
            s = int(rng.integers(len(sessions)))
            q = sessions[s][: int(rng.integers(1, len(sessions[s]) + 1))]
            if rng.random() < 0.3:
                q = q + tuple(int(v) for v in rng.integers(0, 4, rng.integers(1, 8)))
                sessions[s] = q
            for mb in (len(q), len(q) + 3, int(rng.integers(0, len(q) + 1)), -1, -len(q)):
                got = cache.match(q if rng.random() < 0.8 else list(q), mb)
                assert got == _walk(cache, q, mb), (trial, step, mb)
                checked += 1
            hits = cache.match(q, len(q))
            if len(free) < len(q) - len(hits):
                free += cache.evict(len(q) - len(hits) - len(free))
                hits = cache.match(q, len(q))   # (the eviction may have taken some of them)
                if len(free) < len(q) - len(hits):
                    continue
            ids = hits + [free.pop() for _ in range(len(q) - len(hits))]
            for b in ids:
                ref[b] += 1
            if rng.random() < 0.3:   # one block at a time (insert), else a run from the hits or from the root
                for i in range(len(hits), len(q)):
                    if not cache.insert(ids[i - 1] if i else -1, q[i], ids[i]):
                        break
            else:
                cache.insert_run(ids, q, len(hits) if rng.random() < 0.8 else 0, len(q))
            _chains_agree(cache)
            live.append(ids)
            while live and rng.random() < 0.5:
                cache.release(live.pop(int(rng.integers(len(live)))), free)
    assert checked > 10_000
