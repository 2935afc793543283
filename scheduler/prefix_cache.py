"""Radix tree over KV blocks keyed by chained block hashes (RadixAttention-style prefix cache)."""

from __future__ import annotations

import heapq

_ROOT_HASH = -1


class _Node:
    """One cached KV block: its content hash, the block id holding it, and its place in the tree
    (``depth`` blocks from the root; ``path[:depth]`` is the hashes on the way, the root's excluded: a tuple
    shared with the request that inserted it, so ``match_len`` compares paths at C speed; ``ids[:depth]`` the
    block ids on the way, this one's last: a tuple shared by the nodes one ``insert_run`` made, so ``match``
    slices them instead of walking the tree block by block)."""

    __slots__ = ("block_hash", "block_id", "parent", "children", "stamp", "depth", "path", "ids")

    def __init__(self, block_hash: int, block_id: int, parent: "_Node | None", depth: int = 0, path: tuple = (),
                 ids: tuple = ()):
        self.block_hash = block_hash
        self.block_id = block_id
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.stamp = 0  # logical time of the last release (LRU key); a counter, never the wall clock
        self.depth = depth
        self.path = path
        self.ids = ids


class PrefixCache:
    """Which KV blocks hold which prompt prefixes, and which of them may be evicted.

    Reference counts live in the BlockManager (``ref``): a node with ``ref == 0`` is cached but unused.
    A request's cached blocks always form a chain from the root that it holds entirely (the scheduler
    stops inserting a request's blocks at the first one another request cached first), so an unused
    node's whole subtree is unused: every unused node is evictable, leaves first, least recently
    released first.
    """

    def __init__(self, ref: list[int]):
        self._ref = ref
        self.root = _Node(_ROOT_HASH, -1, None)
        self._by_block: dict[int, _Node] = {}
        # every cached node by its hash (match_len's index); a hash held by several nodes (nothing in the format
        # forbids it) keeps all of them in _dups instead
        self._by_hash: dict[int, _Node] = {}
        self._dups: dict[int, list[_Node]] = {}
        self._heap: list[tuple[int, int]] = []   # (stamp, block_id) of leaf candidates; stale entries skipped
        self._clock = 0
        self.num_unused = 0                      # cached blocks with ref 0 (all evictable)
        # called with each evicted block's content hash (lower cache tiers keep it: scheduler/kv_tiers.py)
        self.on_evict = None

    @property
    def num_cached(self) -> int:
        """Blocks in the tree (used or not)."""
        return len(self._by_block)

    def owns(self, block_id: int) -> bool:
        return block_id in self._by_block

    def match(self, block_hashes: tuple[int, ...], max_blocks: int) -> list[int]:
        """Block ids of the longest cached prefix of ``block_hashes`` (at most ``max_blocks``); no side effects.
        The deepest cached node on the way is found as in ``match_len``; its ``ids`` hold the chain."""
        if max_blocks < 0:   # a negative bound slices from the end, as ``block_hashes[:max_blocks]`` does
            max_blocks = max(len(block_hashes) + max_blocks, 0)
        k, node = self._deepest(block_hashes, max_blocks)
        return list(node.ids[:k]) if k else []

    def match_len(self, block_hashes: tuple[int, ...], max_blocks: int) -> int:
        """``len(match(block_hashes, max_blocks))`` without walking the tree block by block: the cached paths are
        prefix-closed, so the longest cached prefix is found by bisection, each probe one index lookup and one
        tuple comparison (C speed) of the probed node's path with the query's."""
        return self._deepest(block_hashes, max_blocks)[0]

    def _deepest(self, block_hashes: tuple[int, ...], max_blocks: int) -> tuple[int, "_Node"]:
        """(k, node): the longest cached prefix of ``block_hashes`` (at most ``max_blocks``) is ``k`` blocks long and
        ends at ``node`` (the root when k is 0); found by bisection (see ``match_len``). Once a prefix of ``lo``
        blocks is found at node ``best``, a deeper probe's node is on the query's path if ``best`` is its ancestor
        at depth ``lo`` (its ``ids``) and its path goes on as the query does: only that part is compared, so the
        comparisons add up to about one pass over the query instead of one per probe."""
        if type(block_hashes) is not tuple:   # paths are tuples: a list would never compare equal
            block_hashes = tuple(block_hashes)
        lo, hi = 0, min(len(block_hashes), max_blocks)
        best = self.root
        by_hash, dups = self._by_hash, self._dups
        while lo < hi:
            k = (lo + hi + 1) >> 1
            h = block_hashes[k - 1]
            nodes = dups.get(h) if dups else None
            if nodes is None:
                found = by_hash.get(h)
                if found is not None and not (found.depth == k and (lo == 0 or found.ids[lo - 1] == best.block_id)
                                              and found.path[lo:k] == block_hashes[lo:k]):
                    found = None
            else:
                found = None
                for n in nodes:
                    if n.depth == k and (lo == 0 or n.ids[lo - 1] == best.block_id) and n.path[lo:k] == block_hashes[lo:k]:
                        found = n
                        break
            if found is not None:
                lo, best = k, found
            else:
                hi = k - 1
        return lo, best

    def count_unused(self, block_ids: list[int]) -> int:
        """How many of ``block_ids`` (cached) are currently unused: pinning them takes them off the free pool."""
        ref = self._ref
        return sum(1 for b in block_ids if ref[b] == 0)

    def on_pinned(self, block_id: int) -> None:
        """A cached unused block got its first user: it is no longer evictable."""
        self.num_unused -= 1  # its heap entry, if any, goes stale (ref > 0 is checked on pop)

    def on_released(self, block_id: int) -> None:
        """A cached block lost its last user: it becomes evictable (once it is a leaf)."""
        node = self._by_block[block_id]
        self._clock += 1
        node.stamp = self._clock
        self.num_unused += 1
        if not node.children:
            heapq.heappush(self._heap, (node.stamp, block_id))

    def release(self, block_ids: list[int], free: list[int]) -> None:
        """BlockManager.release with this cache: drop one reference on each block, deepest first; a cached block
        losing its last user becomes evictable (``on_released``), any other goes to ``free``. One call a request:
        the per-block ``owns`` / ``on_released`` calls inlined."""
        ref, by_block, heap = self._ref, self._by_block, self._heap
        clock = clock0 = self._clock
        for b in reversed(block_ids):
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                node = by_block.get(b)
                if node is None:
                    free.append(b)
                else:
                    clock += 1
                    node.stamp = clock
                    if not node.children:
                        heapq.heappush(heap, (clock, b))
        self.num_unused += clock - clock0   # one a cached block released (each took one tick of the clock)
        self._clock = clock

    def insert(self, parent_block: int, block_hash: int, block_id: int) -> bool:
        """Cache ``block_id`` (holding ``block_hash``) under ``parent_block`` (-1: root); False if that hash is already cached."""
        parent = self.root if parent_block < 0 else self._by_block[parent_block]
        if block_hash in parent.children:
            return False
        d, path = parent.depth, parent.path
        if len(path) <= d or path[d] != block_hash:   # the parent's path does not go on with this hash: a new one
            path = path[:d] + (block_hash,)
        self._add(parent, block_hash, block_id, path, parent.ids[:d] + (block_id,))
        return True

    def insert_run(self, block_ids: list[int], block_hashes: tuple[int, ...], start: int, stop: int) -> int:
        """``insert`` of blocks ``start .. stop - 1`` of one request, each under the one before (block ``start``
        under ``block_ids[start - 1]``, the root if ``start`` is 0); stops at the first hash already cached there.
        Returns how many of the blocks are cached by then (the index it stopped at, ``stop`` if none was)."""
        if type(block_hashes) is not tuple:
            block_hashes = tuple(block_hashes)
        parent = self.root if start == 0 else self._by_block[block_ids[start - 1]]
        if start >= stop or block_hashes[start] in parent.children:
            return start if start < stop else stop
        path = block_hashes
        if start and (parent.depth != start or parent.path[:start] != block_hashes[:start]):   # (not the request's chain)
            path = parent.path[:parent.depth] + tuple(block_hashes[start:stop])
        by_block, by_hash = self._by_block, self._by_hash
        depth = parent.depth
        ids = parent.ids[:depth] + tuple(block_ids[start:stop])   # the chain's block ids (the nodes made here share it)
        for i in range(start, stop):   # _add inlined (a request inserts hundreds of blocks)
            # (only the first block can be cached already: each later one goes under a node made just before)
            h = block_hashes[i]
            b = block_ids[i]
            depth += 1
            node = parent.children[h] = by_block[b] = _Node(h, b, parent, depth, path, ids)
            other = by_hash.setdefault(h, node)
            if other is not node:
                self._dups.setdefault(h, [other]).append(node)
            parent = node
        return stop

    def _add(self, parent: _Node, block_hash: int, block_id: int, path: tuple, ids: tuple) -> _Node:
        """A new node for ``block_id`` under ``parent`` (whose path goes on with ``block_hash`` in ``path``, and
        whose chain of block ids with ``block_id`` is ``ids``)."""
        node = _Node(block_hash, block_id, parent, parent.depth + 1, path, ids)
        parent.children[block_hash] = node
        self._by_block[block_id] = node
        other = self._by_hash.setdefault(block_hash, node)
        if other is not node:
            self._dups.setdefault(block_hash, [other]).append(node)
        return node

    def _unindex(self, node: _Node) -> None:
        """Take an evicted ``node`` out of the hash index."""
        h = node.block_hash
        dups = self._dups.get(h)
        if dups is None:
            del self._by_hash[h]
            return
        dups.remove(node)
        self._by_hash[h] = dups[0]
        if len(dups) == 1:
            del self._dups[h]

    def evict(self, num_blocks: int) -> list[int]:
        """Drop up to ``num_blocks`` unused blocks, least recently released leaves first; returns their ids."""
        out: list[int] = []
        heap, ref = self._heap, self._ref
        while heap and len(out) < num_blocks:
            stamp, b = heapq.heappop(heap)
            node = self._by_block.get(b)
            if node is None or ref[b] != 0 or node.children or node.stamp != stamp:
                continue  # stale entry: re-used, re-released later, or not a leaf any more
            parent = node.parent
            del parent.children[node.block_hash]
            del self._by_block[b]
            self._unindex(node)
            self.num_unused -= 1
            out.append(b)
            if self.on_evict is not None:
                self.on_evict(node.block_hash)
            if parent is not self.root and not parent.children and ref[parent.block_id] == 0:
                heapq.heappush(heap, (parent.stamp, parent.block_id))
        return out
