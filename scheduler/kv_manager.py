"""The KV manager: which KV blocks each request holds, behind one interface with two implementations.

vLLM v1's ``KVCacheManager.allocate_slots(...) -> blocks | None`` style: the scheduler asks for room
(``admit``, ``grow``, ``reserve_decodes``) and gets False, with nothing changed, when the blocks are
not free; it then preempts or stops admitting. It never sees block ids, and never asks which
implementation it has.

- ``PagedKV`` names every block: the executor's attention kernels read the block tables
  (``Request.block_ids``). It is the reference.
- ``CountedKV`` (the simulator: no device memory to address) names only the blocks that can enter
  the prefix cache and holds the rest by count (``Request._anon_blocks``). Without drafts its
  decode batch keeps no per-request room column either (DecodeBatch's implicit mode: a histogram of
  contexts mod block size), so reserving and trimming decode KV costs no pass over the batch.

Both make the same decisions (tests/test_scheduler_kv_manager.py). The prefix cache (a radix tree
over named blocks, prefix_cache.py) and its host/storage tiers (kv_tiers.py) sit behind both.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from scheduler.block_manager import BlockManager
from scheduler.config import SchedulerConfig
from scheduler.decode_batch import DecodeBatch
from scheduler.kv_tiers import KVTiers
from scheduler.request import Request


class PrefixMatch(NamedTuple):
    """The leading prompt blocks a request need not compute."""

    hits: list[int]  # blocks of the HBM prefix cache holding the first prompt blocks (shared, pinned on admit)
    host: int        # blocks after those that the host-memory tier holds (loaded back, not recomputed)
    storage: int     # blocks after those that the storage tier holds

    @property
    def num_blocks(self) -> int:
        return len(self.hits) + self.host + self.storage


NO_MATCH = PrefixMatch([], 0, 0)


class KVManager:
    """One instance's KV blocks: the pool, the prefix cache and its tiers, and the requests' holdings.

    Subclasses say only how blocks are held: ``_add_blocks`` (a prefilling request),
    ``_add_decode_blocks`` and ``_drop_decode_blocks`` (the decode batch).
    """

    def __init__(self, num_blocks: int, config: SchedulerConfig):
        self.block_size = config.block_size
        self._tokens_per_decode = 1 + config.draft_len
        self.blocks = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.cache = self.blocks.cache
        tiers = KVTiers(config.host_cache_blocks, config.storage_cache_blocks)
        self.tiers = tiers if self.cache is not None and tiers.enabled else None
        if self.tiers is not None:
            self.cache.on_evict = self.tiers.on_evicted

    @property
    def num_blocks(self) -> int:
        return self.blocks.num_blocks

    @property
    def num_free(self) -> int:
        """Blocks an allocation can get (free ones and evictable cached ones)."""
        return self.blocks.num_free

    def new_decode_batch(self, capacity: int) -> DecodeBatch:
        """An empty decode batch whose KV room this manager keeps."""
        return DecodeBatch(capacity, self.block_size)

    # ----------------------------------------------------------------- prompts
    def match_prefix(self, req: Request, num_tokens: int) -> PrefixMatch:
        """Cached blocks of the longest prefix of ``req``'s first ``num_tokens - 1`` tokens, in HBM and
        then in the lower tiers (at least one token must be computed to produce logits). No side effects."""
        hashes = req.block_hashes
        if not hashes or self.cache is None:
            return NO_MATCH
        stop = (num_tokens - 1) // self.block_size
        hits = self.cache.match(hashes, stop)
        if self.tiers is None:
            return PrefixMatch(hits, 0, 0)
        return PrefixMatch(hits, *self.tiers.match(hashes, len(hits), stop))

    def admit(self, req: Request, num_tokens: int, match: PrefixMatch = NO_MATCH, cache: bool = True) -> bool:
        """Give ``req`` (holding no KV) the blocks for its first ``num_tokens`` tokens, the leading ones
        ``match``'s (cached blocks shared, tier blocks loaded back); False, nothing changed, if not free.
        ``cache=False``: its blocks are never offered to the prefix cache (KV computed elsewhere)."""
        hits = match.hits
        need = -(-num_tokens // self.block_size) - len(hits)
        if need > self.blocks.num_free - (self.cache.count_unused(hits) if hits else 0):
            return False
        if match.host or match.storage:
            self.tiers.take(req.block_hashes[len(hits): match.num_blocks])
        if hits:
            self.blocks.pin(hits)
        req.block_ids = hits or []
        req._anon_blocks = 0
        req._cached_blocks = len(hits)
        req._cache_done = not cache
        if need > 0:
            self._add_blocks(req, need)
        return True

    def grow(self, req: Request, num_tokens: int) -> bool:
        """Blocks so that ``req`` (not decoding) holds ``num_tokens`` tokens; False, nothing changed, if not free."""
        need = -(-num_tokens // self.block_size) - len(req.block_ids) - req._anon_blocks
        if need > self.blocks.num_free:
            return False
        if need > 0:
            self._add_blocks(req, need)
        return True

    def cache_computed(self, req: Request) -> None:
        """Offer the request's newly computed full prompt blocks to the prefix cache."""
        cache = self.cache
        if cache is None or req._cache_done or not req.block_hashes:
            return
        full = min(len(req.block_hashes), req.num_computed_tokens // self.block_size)
        i = req._cached_blocks
        if i < full:
            i = cache.insert_run(req.block_ids, req.block_hashes, i, full)
            # stopped early: another request cached this content first: keep ours private and stop here, so a
            # request's cached blocks are always one chain from the root that it holds
            req._cache_done = i < full
        req._cached_blocks = i

    def cached_prefix_tokens(self, req: Request) -> int:
        """Prompt tokens of ``req`` the prefix cache holds now (cache-aware routing)."""
        if self.cache is None or not req.block_hashes:
            return 0
        return self.cache.match_len(req.block_hashes, len(req.block_hashes)) * self.block_size

    def free(self, req: Request) -> None:
        """Release every block ``req`` holds (cached ones stay in the prefix cache, evictable)."""
        if req.block_ids:
            self.blocks.release(req.block_ids)
            req.block_ids = []
        if req._anon_blocks:
            self.blocks.unreserve(req._anon_blocks)
            req._anon_blocks = 0
        req._cached_blocks = 0
        req._cache_done = False

    # ----------------------------------------------------------------- decodes
    def reserve_decodes(self, batch: DecodeBatch, tokens_ahead: int) -> bool:
        """Blocks so that every decode of ``batch`` has room for ``tokens_ahead`` more tokens; False,
        nothing changed, if not free. Room already held counts, so asking again for more adds the rest."""
        need, total = batch.blocks_needed(tokens_ahead)
        if total > self.blocks.num_free:
            return False
        if total:
            self._add_decode_blocks(batch, need, total)
        batch.grow(need)
        return True

    def trim_decodes(self, batch: DecodeBatch, nd: int, last_tokens: np.ndarray | int) -> None:
        """After a multi-step plan, hand back blocks reserved for steps not run or drafts not accepted.

        Each of the first ``nd`` decodes keeps what a single-step plan would hold after the same last
        step (blocks for its context before that step, ``last_tokens`` ago, plus 1 + draft_len
        tokens), so a k-step plan, even one cut short, leaves the KV state k single steps would leave.
        """
        bs, s = self.block_size, self._tokens_per_decode
        room = batch.room[:nd]
        if s == 1:
            excess = room // bs  # the single-step room is < bs
        else:
            ctx = batch.ctx[:nd]
            before = ctx - last_tokens
            excess = (room - ((before + (s + bs - 1)) // bs * bs - ctx)) // bs
        np.maximum(excess, 0, out=excess)
        total = int(np.add.reduce(excess))
        if total:
            self._drop_decode_blocks(batch, excess, total)
            excess *= bs
            room -= excess

    def _add_blocks(self, req: Request, n: int) -> None:
        raise NotImplementedError

    def _add_decode_blocks(self, batch: DecodeBatch, need: np.ndarray, total: int) -> None:
        raise NotImplementedError

    def _drop_decode_blocks(self, batch: DecodeBatch, excess: np.ndarray, total: int) -> None:
        raise NotImplementedError


class PagedKV(KVManager):
    """Every block named: ``Request.block_ids`` is the request's block table (executor, reference)."""

    def _add_blocks(self, req: Request, n: int) -> None:
        req.block_ids.extend(self.blocks.allocate(n))

    def _add_decode_blocks(self, batch: DecodeBatch, need: np.ndarray, total: int) -> None:
        """One allocation, split over the slots in slot order."""
        ids = self.blocks.allocate(total)
        reqs = batch.reqs
        pos = 0
        rows = need.nonzero()[0]
        for i, k in zip(rows.tolist(), need[rows].astype(np.int64).tolist()):
            reqs[i].block_ids.extend(ids[pos: pos + k])
            pos += k

    def _drop_decode_blocks(self, batch: DecodeBatch, excess: np.ndarray, total: int) -> None:
        """Release each slot's last ``excess[slot]`` blocks (decode growth is never shared)."""
        reqs, release = batch.reqs, self.blocks.release
        rows = excess.nonzero()[0]
        for i, k in zip(rows.tolist(), excess[rows].tolist()):
            ids = reqs[i].block_ids
            release(ids[-k:])
            del ids[-k:]


class CountedKV(KVManager):
    """Only blocks the prefix cache may need are named; the rest are held by count (simulator).

    A request's counted blocks come after its named ones: a prompt's blocks past its hashed ones,
    and all decode growth. Without drafts the decode batch is implicit (see DecodeBatch): every
    decode holds the blocks of its context plus one batch-wide number of tokens ahead.
    """

    def new_decode_batch(self, capacity: int) -> DecodeBatch:
        return DecodeBatch(capacity, self.block_size, implicit=self._tokens_per_decode == 1)

    def _add_blocks(self, req: Request, n: int) -> None:
        named = 0
        if self.cache is not None and not req._anon_blocks:
            named = max(0, min(n, len(req.block_hashes) - len(req.block_ids)))
        if named:
            req.block_ids.extend(self.blocks.allocate(named))
        if n > named:
            self.blocks.reserve(n - named)
            req._anon_blocks += n - named

    def _add_decode_blocks(self, batch: DecodeBatch, need: np.ndarray, total: int) -> None:
        self.blocks.reserve(total)  # decode growth never enters the prefix cache: count it

    def _drop_decode_blocks(self, batch: DecodeBatch, excess: np.ndarray, total: int) -> None:
        self.blocks.unreserve(total)  # the tail blocks of a decode are the counted ones

    def trim_decodes(self, batch: DecodeBatch, nd: int, last_tokens: np.ndarray | int) -> None:
        if not batch.implicit:
            return super().trim_decodes(batch, nd, last_tokens)
        total = batch.trim_ahead()  # every decode keeps the blocks of its context: drop those reserved ahead
        if total:
            self.blocks.unreserve(total)
