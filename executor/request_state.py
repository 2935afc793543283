"""What the model runner keeps per request between steps: sampling state and MTP drafts."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

from executor.sampling_params import SamplingParams


def request_seed(engine_seed: int, request_id: str) -> int:
    """A stable seed for requests without one (no ``hash()``: identical across processes)."""
    d = hashlib.blake2b(f"{engine_seed}:{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(d, "little") & (2**63 - 1)


@dataclass
class RequestState:
    """Sampling knobs, the request's own generator, stop tokens and pending drafts."""

    params: SamplingParams
    generator: torch.Generator | None
    stop_ids: frozenset[int]
    drafts: list[int] = field(default_factory=list)   # MTP proposals following the last token

    @staticmethod
    def create(request_id: str, params: SamplingParams, eos_token_id: int | None, engine_seed: int,
               device: torch.device) -> "RequestState":
        gen = None
        if params.temperature > 0:
            seed = params.seed if params.seed is not None else request_seed(engine_seed, request_id)
            # a host generator: sampling draws each row's uniform on the CPU and copies them to the device at once,
            # not one random-number kernel launch per row (kernels.reference.sample)
            gen = torch.Generator(device="cpu").manual_seed(seed)
        stops = set(params.stop_token_ids)
        if eos_token_id is not None and not params.ignore_eos:
            stops.add(eos_token_id)
        return RequestState(params, gen, frozenset(stops))
