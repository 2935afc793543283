"""The decode rows of a forward batch are built vectorised over the batch; they equal the per-row construction (kept
here as the reference) for random batches: several pages per row, rows without blocks, MTP query counts whose
positions run past the allocated blocks (null page), and prefill chunks after the decodes."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from executor.forward_batch import SeqInput, _slots, build_forward_batch  # noqa: E402


def reference(seqs, page_size, null_page):
    """The per-row construction the vectorised one replaced: (ids, positions, slots, table, lens)."""
    decodes = [s for s in seqs if s.is_decode]
    sq = len(decodes[0].token_ids) if decodes else 1
    ids, pos, slots = [], [], []
    for s in seqs:
        r = range(s.context_len, s.context_len + len(s.token_ids))
        ids.extend(s.token_ids)
        pos.append(np.arange(r.start, r.stop, dtype=np.int64))
        slots.append(_slots(s.block_table, r, page_size, null_page))
    max_pages = max([len(s.block_table) for s in decodes] + [-(-(s.context_len + sq) // page_size) for s in decodes] + [1])
    table = np.full((len(decodes), max_pages), null_page, dtype=np.int64)
    for i, s in enumerate(decodes):
        table[i, : len(s.block_table)] = s.block_table
    lens = np.asarray([s.context_len + sq for s in decodes], dtype=np.int64)
    return ids, np.concatenate(pos), np.concatenate(slots), table, lens


@pytest.mark.parametrize("seed", range(12))
def test_vectorised_decode_rows_equal_the_per_row_build(seed):
    rng = np.random.default_rng(seed)
    ps, null = 16, 0
    sq = int(rng.choice([1, 1, 2, 3]))
    seqs = []
    for i in range(int(rng.integers(0, 9))):
        ctx = int(rng.integers(0, 200))
        need = -(-(ctx + 1) // ps)                     # the blocks a plain decode holds; MTP drafts may run past them
        nblk = 0 if rng.random() < 0.1 else need + int(rng.integers(0, 2))
        seqs.append(SeqInput([int(x) for x in rng.integers(1, 99, sq)], ctx, [int(x) for x in rng.integers(1, 500, nblk)], True))
    for i in range(int(rng.integers(0, 3))):
        n, ctx = int(rng.integers(1, 40)), int(rng.integers(0, 60))
        seqs.append(SeqInput([int(x) for x in rng.integers(1, 99, n)], ctx, [int(x) for x in rng.integers(1, 500, -(-(ctx + n) // ps))], False))
    if not seqs:
        seqs = [SeqInput([3], 5, [7], True)]
    fb = build_forward_batch(seqs, ps, null, torch.device("cpu"))
    ids, pos, slots, table, lens = reference(seqs, ps, null)
    assert fb.input_ids.tolist() == ids
    assert fb.positions.tolist() == pos.tolist()
    assert fb.slot_mapping.tolist() == slots.tolist()
    assert fb.decode_block_table.tolist() == table.tolist()
    assert fb.decode_seq_lens.tolist() == lens.tolist() and fb.decode_seq_lens_host.tolist() == lens.tolist()
    for p, s in zip(fb.prefills, seqs[sum(x.is_decode for x in seqs):]):
        # every layer gathers a chunk's keys at its key slots: the slots of positions 0..kv_len-1, whose tail is the
        # chunk's own slot mapping, and what the block table gives on the device (the fallback for spans built
        # without them) agrees
        want = _slots(s.block_table, range(0, p.kv_len), ps, null)
        assert p.key_slots.tolist() == want.tolist()
        assert p.key_slots[p.context_len:].tolist() == fb.slot_mapping[p.start: p.start + p.num].tolist()


@pytest.mark.parametrize("seed", range(4))
def test_key_slots_derived_from_the_block_table_equal_the_built_ones(seed):
    import dataclasses
    rng = np.random.default_rng(100 + seed)
    ps = 16
    seqs = [SeqInput([1], 30, [3, 4], True)]
    for _ in range(3):
        n, ctx = int(rng.integers(1, 40)), int(rng.integers(0, 90))
        seqs.append(SeqInput([5] * n, ctx, [int(x) for x in rng.permutation(400)[: -(-(ctx + n) // ps)] + 1], False))
    fb = build_forward_batch(seqs, ps, 0, torch.device("cpu"))
    bare = dataclasses.replace(fb, prefills=[dataclasses.replace(p, key_slots=None) for p in fb.prefills])
    for i, p in enumerate(fb.prefills):
        assert bare.key_slots(i, ps).tolist() == p.key_slots.tolist()
        assert bare.key_slots(i, ps) is bare.key_slots(i, ps)   # derived once per forward, then shared by the layers
