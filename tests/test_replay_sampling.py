"""A replay that samples gives each request its own random stream: requests that decode in step at a high
temperature draw different tokens (one shared seed made them draw the same token at the same output index, so a
decode batch routed to a quarter of the experts random tokens reach)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from executor.engine import LLMEngine  # noqa: E402
from executor.replay import replay  # noqa: E402

SC = {"block_size": 16, "max_num_batched_tokens": 64, "max_num_seqs": 8}


def _outputs(temperature: float, seed: int = 0) -> dict[str, list[int]]:
    e = LLMEngine.from_args("tiny", device="cpu", dtype="fp64", seed=0, scheduler_config=SC)
    reqs = {}
    add = e.add_request

    def keep(rid, ids, params=None, arrival_time=None):
        reqs[rid] = add(rid, ids, params, arrival_time)
        return reqs[rid]

    e.add_request = keep
    items = [(0.0, f"r{i}", [3 + i, 5, 7, 11], 6) for i in range(6)]
    replay(e, items, temperature=temperature, seed=seed)
    return {rid: list(r.output_token_ids) for rid, r in reqs.items()}


def test_requests_in_step_sample_independent_tokens():
    out = _outputs(1e4)
    assert all(len(v) == 6 for v in out.values())
    # near-uniform sampling over the vocabulary: at each output index the six requests disagree
    for j in range(6):
        assert len({v[j] for v in out.values()}) >= 4, out


def test_a_replay_samples_the_same_tokens_again_and_the_seed_matters():
    assert _outputs(1e4) == _outputs(1e4)
    assert _outputs(1e4) != _outputs(1e4, seed=1)


def test_request_generators_live_on_the_host_whatever_the_device():
    """Sampling draws each row's uniform from a host generator and copies them once (no RNG kernel per row); the
    generator is a CPU one for a CUDA engine too (built here without a GPU)."""
    from executor.request_state import RequestState
    from executor.sampling_params import SamplingParams

    st = RequestState.create("r0", SamplingParams(temperature=0.7), None, 0, torch.device("cuda"))
    assert st.generator is not None and st.generator.device.type == "cpu"
    assert RequestState.create("r1", SamplingParams(temperature=0.0), None, 0, torch.device("cuda")).generator is None
