"""Lower prefix-cache tiers: host memory (L2) and storage (L3) behind the HBM radix cache (L1).

SGLang's HiCache / Mooncake store: a KV block evicted from HBM is written back to host memory,
and from there (when host memory is full) to distributed storage, instead of being lost. A
later prompt whose prefix continues past what HBM holds loads those blocks back (bytes over the
host link or the storage network) rather than recomputing them.

Blocks are identified by their chained content hash (``Request.block_hashes``: a hash depends
on the whole prefix), so each tier is an LRU set of hashes with a capacity in blocks. Tiers
are exclusive: a block lives in one tier at a time; loading it back promotes it to HBM.
The scheduler only counts blocks; what a load costs in time is the backend's business.
"""

from __future__ import annotations

from collections import OrderedDict


class KVTiers:
    """Host-memory and storage tiers of evicted KV blocks (LRU, capacities in blocks)."""

    def __init__(self, host_blocks: int, storage_blocks: int):
        self.capacity = (max(0, host_blocks), max(0, storage_blocks))
        self.host: OrderedDict[int, None] = OrderedDict()
        self.storage: OrderedDict[int, None] = OrderedDict()
        self.written = [0, 0]   # blocks written to host, storage
        self.loaded = [0, 0]    # blocks loaded back from host, storage
        self.dropped = 0        # blocks that fell off the last tier

    @property
    def enabled(self) -> bool:
        return any(self.capacity)

    def on_evicted(self, block_hash: int) -> None:
        """An HBM block holding ``block_hash`` was evicted: keep it in the first tier with room."""
        if self.capacity[0]:
            self._put(self.host, block_hash, 0)
        elif self.capacity[1]:
            self._put(self.storage, block_hash, 1)
        else:
            self.dropped += 1

    def _put(self, tier: OrderedDict, h: int, level: int) -> None:
        tier[h] = None
        tier.move_to_end(h)
        self.written[level] += 1
        if len(tier) > self.capacity[level]:
            old, _ = tier.popitem(last=False)
            if level == 0 and self.capacity[1]:
                self._put(self.storage, old, 1)  # host full: the oldest block goes down to storage
            else:
                self.dropped += 1

    def match(self, block_hashes: tuple[int, ...], start: int, stop: int) -> tuple[int, int]:
        """(host, storage) blocks continuing a prefix from ``start`` (exclusive of HBM hits) up to ``stop``."""
        n_host = n_sto = 0
        for h in block_hashes[start:stop]:
            if h in self.host:
                n_host += 1
            elif h in self.storage:
                n_sto += 1
            else:
                break
        return n_host, n_sto

    def take(self, block_hashes: tuple[int, ...]) -> None:
        """These blocks were loaded back into HBM: they leave their tier (and count as loaded)."""
        for h in block_hashes:
            if self.host.pop(h, 0) is None:
                self.loaded[0] += 1
            elif self.storage.pop(h, 0) is None:
                self.loaded[1] += 1
