"""Paged KV block manager: fixed-size blocks, a free list, reference counts, prefix-cache eviction."""

from __future__ import annotations

from scheduler.prefix_cache import PrefixCache


class BlockManager:
    """Owns the ``num_blocks`` KV blocks of one instance.

    A block is free (on the free list), used (``ref > 0``: held by running requests; shared prefix
    blocks have one reference per holder), or cached-unused (in the prefix cache with ``ref == 0``:
    its KV is kept for future hits, and it is evicted only when an allocation needs the space).

    Blocks can also be *reserved* by count (``reserve``/``unreserve``): CountedKV (the simulator, no
    device memory to address) counts the blocks that can never enter the prefix cache (decode
    growth, unhashed prompt tails) rather than naming them; reserved blocks stay on the free list but
    are not available. PagedKV (the executor) names every block: its attention kernels need the ids.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks}: an instance needs at least one KV block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # blocks 0 .. len(ref) - 1 have been handed out at least once; the rest are free and cost nothing (a pool can
        # hold hundreds of millions of blocks, a run names far fewer): ref grows as ids are first handed out
        self.ref: list[int] = []
        # freed blocks, a stack popped from the end; never-used blocks follow in ascending order (block 0 first)
        self._free: list[int] = []
        self.cache = PrefixCache(self.ref) if enable_prefix_caching else None
        self.num_reserved = 0  # blocks held by count only (see the class docstring)

    @property
    def _num_listed_free(self) -> int:
        """Blocks on the free stack plus those never handed out."""
        return len(self._free) + self.num_blocks - len(self.ref)

    @property
    def num_free(self) -> int:
        """Blocks an allocation can get: free ones plus evictable cached ones."""
        # _num_listed_free inlined: the scheduler asks this for every request it considers
        n = len(self._free) + self.num_blocks - len(self.ref) - self.num_reserved
        return n + self.cache.num_unused if self.cache is not None else n

    @property
    def num_used(self) -> int:
        """Blocks not free (held by requests, named or reserved, or kept by the prefix cache)."""
        return self.num_blocks - self._num_listed_free + self.num_reserved

    @property
    def num_held(self) -> int:
        """Blocks held by running requests (excludes cached-unused ones)."""
        return self.num_used - (self.cache.num_unused if self.cache is not None else 0)

    def allocate(self, n: int) -> list[int]:
        """``n`` fresh blocks with ``ref == 1``, evicting cached-unused blocks if the free list is short."""
        free, ref = self._free, self.ref
        self._make_room(n)
        k = min(n, len(free))
        out = free[-k:] if k else []
        del free[len(free) - k:]
        out.reverse()
        for b in out:
            ref[b] = 1
        if k < n:   # then never-used blocks, in ascending order
            first = len(ref)
            out.extend(range(first, first + n - k))
            ref.extend([1] * (n - k))
        return out

    def _make_room(self, n: int) -> None:
        """Evict cached-unused blocks until ``n`` blocks are available on the free list."""
        short = n - (self._num_listed_free - self.num_reserved)
        if short > 0:
            if self.cache is not None:
                self._free.extend(self.cache.evict(short))
            if n > self._num_listed_free - self.num_reserved:
                raise RuntimeError(f"KV blocks exhausted: asked {n}, {self._num_listed_free - self.num_reserved} free (the "
                                   "scheduler checks num_free first)")

    def reserve(self, n: int) -> None:
        """Hold ``n`` unnamed blocks (evicting cached-unused ones if needed)."""
        if n > 0:
            if n > self._num_listed_free - self.num_reserved:
                self._make_room(n)
            self.num_reserved += n

    def unreserve(self, n: int) -> None:
        """Give back ``n`` unnamed blocks."""
        self.num_reserved -= n

    def pin(self, block_ids: list[int]) -> None:
        """Take one more reference on cached blocks (prefix hits)."""
        ref, cache = self.ref, self.cache
        for b in block_ids:
            if ref[b] == 0:
                cache.on_pinned(b)
            ref[b] += 1

    def release(self, block_ids: list[int]) -> None:
        """Drop one reference on each block, deepest first; unreferenced blocks go to the cache or the free list."""
        ref, cache, free = self.ref, self.cache, self._free
        if cache is not None:
            cache.release(block_ids, free)   # the same loop with the cache's bookkeeping inlined
            return
        for b in reversed(block_ids):
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                if cache is not None and cache.owns(b):
                    cache.on_released(b)
                else:
                    free.append(b)
