"""PagedKV (named blocks, the reference) and CountedKV (counts, the simulator) agree through the KVManager
interface: random admit / grow / decode-reserve / trim / free sequences get the same answers and leave
the same free counts, prefix hits and decode batches (CountedKV's implicit decode room included)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.config import SchedulerConfig
from scheduler.kv_manager import CountedKV, KVManager, PagedKV
from scheduler.request import Request

SETTINGS = settings(derandomize=True, deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow])


def run(kv_cls: type[KVManager], cfg: SchedulerConfig, num_blocks: int, seed: int, num_ops: int) -> list:
    """Drive one manager as the scheduler does; returns every answer and count it gave, step by step."""
    kv = kv_cls(num_blocks, cfg)
    bs, s = cfg.block_size, 1 + cfg.draft_len
    batch = kv.new_decode_batch(64)
    prefilling: list[Request] = []
    log: list = []
    rng = np.random.default_rng(seed)

    def computed(r: Request, chunk: int) -> None:
        """``chunk`` more prompt tokens in KV (cached where full); a finished prompt's request decodes."""
        r.num_computed_tokens += chunk
        kv.cache_computed(r)
        if r.num_computed_tokens == r.prompt_len:
            r.num_output_tokens = 1
            prefilling.remove(r)
            batch.add(r)

    for n in range(num_ops):
        op = rng.choice(4, p=[0.3, 0.25, 0.3, 0.15])
        if op == 0:  # a new request: its cached prefix, then blocks for the prefix and a first chunk
            p = int(rng.integers(1, 6 * bs))
            hashes = tuple(1000 * int(rng.integers(3)) + j for j in range(p // bs)) if rng.random() < 0.7 else ()
            r = Request(f"r{n}", 0.0, p, int(rng.integers(1, 4 * bs)), block_hashes=hashes)
            m = kv.match_prefix(r, p)
            hit = m.num_blocks * bs
            chunk = int(rng.integers(1, p - hit + 1))
            log.append(("match", len(m.hits), m.host, m.storage))
            ok = kv.admit(r, hit + chunk, m)  # (the request's block table starts as m.hits: read it before)
            log.append(("admit", ok))
            if ok:
                r.num_computed_tokens = hit
                prefilling.append(r)
                computed(r, chunk)
        elif op == 1 and prefilling:  # a prefill's next chunk
            r = prefilling[int(rng.integers(len(prefilling)))]
            chunk = int(rng.integers(1, r.prompt_len - r.num_computed_tokens + 1))
            ok = kv.grow(r, r.num_computed_tokens + chunk)
            log.append(("grow", ok))
            if ok:
                computed(r, chunk)
        elif op == 2 and batch.n and batch.min_left() > 0:  # k decode steps reserved, 1..k run, the rest handed back
            k = min(int(rng.integers(1, 9)), (batch.min_left() - 1) // s + 1)
            ok = kv.reserve_decodes(batch, k * s)
            log.append(("reserve", k, ok))
            if ok:
                steps, nd = int(rng.integers(1, k + 1)), batch.n
                if s == 1:
                    tok, last = steps, 1
                else:  # 1 + accepted drafts per step; tokens past the last wanted one are discarded
                    dt = rng.integers(1, s + 1, (steps, nd))
                    tok, last = np.minimum(dt.sum(axis=0), batch.left[:nd]), dt[-1]
                batch.add_tokens(nd, tok)
                if k > 1 and (steps < k or s > 1):
                    kv.trim_decodes(batch, nd, last)
        elif op == 3 and (batch.n or prefilling):  # finished decodes leave, else one running request
            log.append(batch.left[: batch.n].tolist())  # a reader of a true column (applies the pending shift)
            done = batch.finished_slots(batch.n) if batch.n else []
            if not done:
                held = batch.reqs + prefilling
                r = held[int(rng.integers(len(held)))]
                done = [r._slot] if r._batch is not None else []
                if not done:
                    prefilling.remove(r)
                    kv.free(r)
            for slot in reversed(done):
                r = batch.reqs[slot]
                batch.remove(r)
                kv.free(r)
            log.append(("leave", done))
        log.append((kv.num_free, kv.blocks.num_used, kv.blocks.num_held))
        if batch.n:
            log.append((batch.min_left(), batch.context_sum(), batch.context_lens().tolist()))
    # the decode batches hold the same room (read last: it ends CountedKV's implicit mode), and
    # when everyone leaves, only evictable cached blocks remain
    log.append(batch.room[: batch.n].tolist())
    for r in batch.reqs[::-1] + prefilling:
        if r._batch is not None:
            batch.remove(r)
        kv.free(r)
    blocks = kv.blocks
    assert blocks.num_held == 0 and blocks.num_reserved == 0 and kv.num_free == num_blocks
    assert blocks.num_used == (kv.cache.num_unused if kv.cache is not None else 0)
    return log


@st.composite
def cases(draw):
    cfg = SchedulerConfig(block_size=draw(st.sampled_from([2, 4, 8])), draft_len=draw(st.integers(0, 2)),
                          enable_prefix_caching=draw(st.booleans()), host_cache_blocks=draw(st.sampled_from([0, 4])),
                          max_num_seqs=64)
    return cfg, draw(st.integers(1, 48)), draw(st.integers(0, 2**32 - 1)), draw(st.integers(0, 300))


@SETTINGS
@given(cases())
def test_paged_and_counted_kv_agree_through_the_interface(case):
    assert run(PagedKV, *case) == run(CountedKV, *case)


def test_counted_kv_names_only_what_the_prefix_cache_may_need():
    """The reason CountedKV exists: decode growth and unhashed prompt tails hold no block ids."""
    cfg = SchedulerConfig(block_size=4, max_num_seqs=8)
    for cls, named in ((PagedKV, 4), (CountedKV, 2)):
        kv = cls(16, cfg)
        r = Request("a", 0.0, 10, 8, block_hashes=(1, 2))
        assert kv.admit(r, 10, kv.match_prefix(r, 10))
        r.num_computed_tokens, r.num_output_tokens = 10, 1
        batch = kv.new_decode_batch(8)
        batch.add(r)
        assert kv.reserve_decodes(batch, 6)  # 16 tokens: 4 blocks
        assert not kv.reserve_decodes(batch, 6 + 4 * 12 + 1)  # the 12 free blocks hold 48 tokens more
        assert len(r.block_ids) == named and kv.num_free == 12
        assert batch.implicit == (cls is CountedKV)


def test_a_huge_pool_costs_memory_only_for_the_blocks_handed_out():
    """A pool is a count, not a list: DeepSeek-V4-Flash DEP32 on GB300 holds ~196 million 16-token blocks per instance,
    and the free list and reference counts built for every one of them took 2.3 GB per instance (a 4-instance simulate
    9 GB, tune --gpus 100000's plan run past 23 GB). Ids are handed out as before: freed ones last-in first-out, then
    never-used ones in ascending order."""
    import tracemalloc

    from scheduler.block_manager import BlockManager

    tracemalloc.start()
    b = BlockManager(10**9, 16, enable_prefix_caching=False)
    assert b.allocate(3) == [0, 1, 2] and b.num_free == 10**9 - 3
    b.release([1])
    assert b.allocate(2) == [1, 3] and b.num_used == 4
    b.release([0, 1, 2, 3])
    assert b.num_free == 10**9 and b.num_used == 0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20, peak
    small = BlockManager(4, 16, enable_prefix_caching=False)
    assert small.allocate(4) == [0, 1, 2, 3] and small.num_free == 0
