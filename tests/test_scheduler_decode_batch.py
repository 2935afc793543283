"""DecodeBatch: the implicit-room mode (counted KV, no drafts) agrees with the explicit columns."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.decode_batch import DecodeBatch
from scheduler.request import Request

BS = 8


def entering(i: int, rng: np.random.Generator, ahead: int) -> Request:
    """A request as it joins the batch: prompt done, first token out, blocks for ctx + ahead."""
    r = Request(f"r{i}", 0.0, int(rng.integers(1, 40)), int(rng.integers(2, 30)))
    r.num_computed_tokens = r.prompt_len
    r.num_output_tokens = 1
    r._anon_blocks = -(-(r.prompt_len + ahead) // BS)
    return r


@pytest.mark.parametrize("seed", range(8))
def test_implicit_room_matches_explicit_columns(seed):
    rng = np.random.default_rng(seed)
    batches = [DecodeBatch(64, BS), DecodeBatch(64)]
    assert batches[0].implicit and not batches[1].implicit
    ids = 0
    for _ in range(400):
        op = rng.integers(0, 5)
        n = batches[0].n
        if op == 0 and n < 64:  # a request joins (nothing reserved ahead at a boundary)
            for b, r in zip(batches, [entering(ids, np.random.default_rng([seed, ids]), 0) for _ in batches]):
                b.add(r, BS)
            ids += 1
        elif op == 1 and n and batches[0].min_left() > 0:  # reserve k tokens ahead, then run 1..k steps
            k = int(rng.integers(1, 3 * BS))
            k = min(k, batches[0].min_left())
            need = [b.blocks_needed(k, BS) for b in batches]
            assert need[0][1] == need[1][1]
            for b, (nd, _) in zip(batches, need):
                b.grow(nd, BS)
            steps = int(rng.integers(1, k + 1))
            for b in batches:
                b.add_tokens(b.n, steps)
            if steps < k:  # a cut run hands back what it reserved ahead: same blocks either way
                room = batches[1].room[: batches[1].n]
                before = int(room.sum())
                room %= BS
                assert batches[0].trim_ahead() == (before - int(room.sum())) // BS
            else:
                batches[0].trim_ahead()
        elif op == 2 and n:  # the finished ones leave (highest slot first), or a random one
            done = [b.finished_slots(b.n) for b in batches]
            assert done[0] == done[1]
            slots = done[0] or [int(rng.integers(0, n))]
            for b in batches:
                for slot in sorted(slots, reverse=True):
                    b.remove(b.reqs[slot], BS)
        elif op == 3 and n:  # a reader of the true columns (syncs the pending shift)
            assert batches[0].left[:n].tolist() == batches[1].left[:n].tolist()
        for b in batches:
            if b.n:
                assert b.context_sum() == int(b.context_lens().sum())
        if batches[0].n:
            assert batches[0].min_left() == batches[1].min_left()
            assert batches[0].context_lens().tolist() == batches[1].context_lens().tolist()
            assert [r.num_output_tokens for r in batches[0].reqs] == [r.num_output_tokens for r in batches[1].reqs]
    assert batches[0].implicit  # nothing above broke the rule
