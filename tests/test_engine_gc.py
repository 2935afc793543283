"""After warm-up the engine freezes the start-up heap (gc.freeze, as vLLM's engine core does): a full collection in
the serving loop then no longer walks the model's and graphs' Python objects."""

from __future__ import annotations

import gc

import pytest

pytest.importorskip("torch")

from executor.engine import LLMEngine  # noqa: E402


def test_warmup_freezes_the_start_up_heap():
    gc.unfreeze()
    e = LLMEngine.from_args("tiny", device="cpu", dtype="fp64", seed=0,
                            scheduler_config={"block_size": 16, "max_num_batched_tokens": 64, "max_num_seqs": 4})
    assert gc.get_freeze_count() == 0
    e.warmup()
    try:
        assert gc.get_freeze_count() > 0
        live = {id(o) for o in gc.get_objects()}     # the collected generations, not the frozen heap
        assert id(e.runner.model.__dict__) not in live
    finally:
        gc.unfreeze()
