"""The planner's speed-ups change no number: each memoised / fast path equals the path it replaces, bit for bit."""

from __future__ import annotations

import numpy as np

from costmodels import op_table
from costmodels.catalog import get_model
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.step import StepCostModel


def _sizes() -> np.ndarray:
    """M values below, on, between and above every measured grid (and fractional ones, as x * share gives)."""
    rng = np.random.default_rng(7)
    return np.concatenate([[0.5, 1.0, 3.0, 64.0, 1e5, 3e6], rng.uniform(0.01, 2e4, 300), rng.integers(1, 70_000, 300)]).astype(float)


def test_gemm_table_seconds_equals_time_bit_for_bit():
    """GemmTable.seconds (memoised family and log grids) == GemmTable.time(...).seconds, measured and scaled shapes."""
    table = op_table.load("H200").gemm_table("fp8")
    m = _sizes()
    shapes = sorted(table.families) + [(2112 // 2, 7168), (1536, 7168), (4096, 512), (7168, 2048), (129, 7)]
    for n, k in shapes:
        want = table.time(m, n, k).seconds
        for _ in range(2):   # the second call reads the memo
            got = table.seconds(m, n, k)
            assert got.dtype == want.dtype and np.array_equal(got, want), (n, k)


def _seconds_reference(tg: op_table.TableGemms, row: int, m: np.ndarray) -> np.ndarray:
    """TableGemms.seconds as written before the memo (GemmTable.time per kernel)."""
    flat = np.asarray(m, dtype=float).ravel()
    total = np.zeros(flat.size)
    pos = flat > 0
    if pos.any():
        mp = flat[pos]
        for n, k in tg.shapes[row]:
            t = tg.table.time(mp, n, k).seconds
            if not tg.same_gpu:
                # op_table.transferred written out: the roofline moves, the time over it scales by the peak ratio
                byts = op_table.gemm_bytes(mp, n, k, tg.table.weight_bytes_per_elem)
                fl = 2.0 * mp * n * k
                roof_m = np.maximum(byts / (tg.mem_eff * tg.table.hbm_bw), fl / (tg.compute_eff * tg.table.peak_flops))
                roof = np.maximum(byts / (tg.mem_eff * tg.target_bw), fl / (tg.compute_eff * tg.target_flops))
                over = t - roof_m
                t = np.where(over >= 0, roof + over * (tg.table.peak_flops / tg.target_flops),
                             t * roof / np.maximum(roof_m, 1e-30))
            total[pos] += t
    return total.reshape(np.shape(m))


def test_table_gemms_rows_unchanged_on_measured_and_other_gpus():
    """Every covered GEMM row of DeepSeek-V3 FP8 (TP1 / TP8 / DEP16 / TP2xDP4) prices as before, on H200 (measured) and GB300 (scaled)."""
    sizes = _sizes()
    cases = (sizes, np.concatenate([[0.0], sizes]), np.zeros(5), sizes[:12].reshape(3, 4))   # all positive, some 0, all 0, 2-d
    for hw_name in ("h200", "gb300"):
        for tp, dp in ((1, 1), (8, 1), (1, 16), (2, 4)):
            lay = ParallelLayout(tp=tp, dp=dp, ep=tp * dp, weight_dtype="fp8", expert_dtype="fp8")   # the FP8 GEMM table's rows
            sm = StepCostModel(get_model("deepseek-v3"), get_hardware(hw_name), lay)
            tg = sm.g_table
            assert tg is not None
            rows = [r for r in range(len(tg.shapes)) if tg.covers[r] and r not in tg.rows and r not in tg.own]   # FP8 rows (BF16 ones have their table)
            assert rows
            for r in rows:
                for m in cases:
                    got, want = tg.seconds(r, m), _seconds_reference(tg, r, m)
                    assert got.shape == want.shape and np.array_equal(got, want), (hw_name, lay, r, m.shape)


def _insert_loop(cache, ids, hashes, start, stop) -> int:
    """KVManager.cache_computed's loop as written before PrefixCache.insert_run: one insert per block."""
    i = start
    while i < stop:
        if not cache.insert(ids[i - 1] if i else -1, hashes[i], ids[i]):
            break
        i += 1
    return i


def _release_loop(cache, ref, block_ids, free) -> None:
    """BlockManager.release as written before PrefixCache.release: owns / on_released per block."""
    for b in reversed(block_ids):
        ref[b] -= 1
        if ref[b] == 0:
            if cache.owns(b):
                cache.on_released(b)
            else:
                free.append(b)


def _tree(cache) -> set:
    return {(b, n.parent.block_id, n.block_hash) for b, n in cache._by_block.items()}


def test_prefix_cache_match_len_insert_run_and_release_equal_the_block_by_block_walks():
    """PrefixCache.match_len == len(match), insert_run == the insert loop and release == BlockManager.release's loop
    (same tree, same LRU heap, same evictions), over random
    sessions that share prefixes, grow turn by turn, are released, evicted and re-inserted, and reuse hash values
    at other depths and under other parents (so the hash index holds duplicates)."""
    from scheduler.prefix_cache import PrefixCache

    # a node's path is a prefix of the tuple it shares: a hash repeated further along that tuple is not cached there
    ref = [0] * 4
    cache = PrefixCache(ref)
    assert cache.insert_run([0, 1, 2], (5, 6, 5, 7), 0, 2) == 2
    assert cache.match_len((5, 6, 5), 3) == len(cache.match((5, 6, 5), 3)) == 2

    rng = np.random.default_rng(11)
    for trial in range(10):
        ref_a, ref_b = [0] * 300, [0] * 300   # few blocks: evictions all the time
        fast, slow = PrefixCache(ref_a), PrefixCache(ref_b)
        free = list(range(300))[::-1]
        sessions = [tuple(int(v) for v in rng.integers(0, 4 if trial % 2 else 10**9, rng.integers(1, 30))) for _ in range(12)]
        live = []
        evicted = 0
        for step in range(400):
            s = int(rng.integers(len(sessions)))
            q = sessions[s][: int(rng.integers(1, len(sessions[s]) + 1))]
            if rng.random() < 0.3:   # a new turn: the session grows
                q = q + tuple(int(v) for v in rng.integers(0, 4, rng.integers(1, 8)))
                sessions[s] = q
            for mb in (len(q), int(rng.integers(0, len(q) + 1))):
                assert fast.match_len(q, mb) == len(fast.match(q, mb)) == len(slow.match(q, mb))
                assert fast.match_len(list(q), mb) == len(fast.match(q, mb))
            hits = fast.match(q, len(q))
            assert hits == slow.match(q, len(q))
            if len(free) < len(q) - len(hits):
                n = len(q) - len(hits) - len(free)
                ev = fast.evict(n)
                assert ev == slow.evict(n)
                evicted += len(ev)
                free += ev
                if len(free) < len(q) - len(hits):
                    continue
            for b in hits:
                ref_a[b] += 1
                ref_b[b] += 1
            ids = hits + [free.pop() for _ in range(len(q) - len(hits))]
            for b in ids[len(hits):]:
                ref_a[b] += 1
                ref_b[b] += 1
            start = len(hits) if rng.random() < 0.8 else 0
            assert fast.insert_run(ids, q, start, len(q)) == _insert_loop(slow, ids, q, start, len(q))
            assert _tree(fast) == _tree(slow)
            live.append(ids)
            while live and rng.random() < 0.5:   # some requests finish: their blocks are released
                done = live.pop(int(rng.integers(len(live))))
                freed = []
                fast.release(done, free)
                _release_loop(slow, ref_b, done, freed)
                assert free[len(free) - len(freed):] == freed
                assert (fast._heap, fast._clock, fast.num_unused) == (slow._heap, slow._clock, slow.num_unused)
                assert ref_a == ref_b
        assert evicted and (fast._dups or trial % 2 == 0)   # the small alphabet put one hash at several nodes


def _terms_reference(rows: list[tuple], n: int):
    """step_ops._terms as written before: np.array of broadcast views."""
    from costmodels.step_ops import Terms

    def stack(k):
        return np.array([np.broadcast_to(r[k], (n,)) for r in rows], float).reshape(len(rows), n)

    return Terms([r[0] for r in rows], [r[1] for r in rows], ["-"] * len(rows), stack(2), stack(3), stack(4), stack(5),
                 [r[6] for r in rows])


def test_terms_stacking_and_every_family_equal_the_broadcast_views(monkeypatch):
    """step_ops._terms fills rows in place: the same arrays as np.array over broadcast views, for scalars, int, bool
    and float rows, one point and none; and every family of the fast path's tables (main, MTP, sampling, KV) over
    several layouts equals its value under the old stacking, bit for bit."""
    from costmodels import step_ops
    from costmodels.moe_load import ExpertLoad  # noqa: F401  (the expert-load model the simulator passes)

    rng = np.random.default_rng(3)
    for n in (0, 1, 2, 512):
        x = rng.uniform(0, 1e4, n)
        rows = [("a", 0, np.where(x > 5e3, 3, 0), 0.0, x * 2.0, x / 7.0, False), ("b", 1, x > 1, 1.5, np.array([2.0]), x, True)]
        for got, want in zip(step_ops._terms(rows, n).__dict__.values(), _terms_reference(rows, n).__dict__.values()):
            assert np.array_equal(np.asarray(got), np.asarray(want)) and np.asarray(got).dtype == np.asarray(want).dtype
        assert step_ops._terms([], n).time.shape == (0, n)

    def families(sm, x):
        return [f.__dict__ for f in sm.main_terms(x, False) + sm.main_terms(x, True) + sm.mtp_terms(x, 2)
                + [sm.sampling(x * sm.share, 1), sm.gemms(step_ops.KV_UP, x), sm.gemms(step_ops.SAMPLED, x)]]

    x = np.arange(512, 1024, dtype=float) * 0.5
    for hw, (tp, dp, tbo) in (("gb300", (1, 8, True)), ("h200", (8, 1, False)), ("b200", (2, 4, False))):
        lay = ParallelLayout(tp=tp, dp=dp, ep=tp * dp, weight_dtype="fp8", expert_dtype="fp8", two_micro_batch=tbo)
        sm = StepCostModel(get_model("deepseek-v3"), get_hardware(hw), lay, dp_imbalance=1.13)
        new = families(sm, x)
        monkeypatch.setattr(step_ops, "_terms", _terms_reference)
        old = families(sm, x)
        monkeypatch.undo()
        assert len(new) == len(old)
        for a, b in zip(new, old):
            for key in a:
                va, vb = a[key], b[key]
                if isinstance(va, np.ndarray):
                    assert va.dtype == vb.dtype and np.array_equal(va, vb), (hw, key)
                else:
                    assert va == vb, (hw, key)
