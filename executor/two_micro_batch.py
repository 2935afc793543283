"""Two-micro-batch overlap inside an EP MoE layer: one half's all-to-all runs while the other half computes.

The layer's tokens split into halves A and B (either may be empty: every rank runs both
rounds, so collectives stay matched). One counts exchange covers both halves, then

    dispatch A ~> | shared(A)          |
    dispatch B ~> | experts(A)         | ~> combine A
                  | shared(B), experts(B) | ~> combine B

where ``~>`` is an asynchronous collective (NCCL's stream, gloo's worker thread) running
under the compute listed beside it. This is the layer-local form of DeepSeek's and SGLang's
two-batch overlap; overlapping attention of one half with the MoE of the other needs the
whole model split into micro-batches, which the executor does not do yet. The cost model's
``layout.two_micro_batch`` term assumes the full form (docs/ep.md says what that means for
the comparison). Results equal the single-batch layer exactly: every op is per token.
"""

from __future__ import annotations

import torch


def moe_forward_two_batches(layer, x: torch.Tensor, slots: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``layer`` (an :class:`executor.ep_moe.EPMoE`) over ``x`` in two overlapped halves."""
    h = (x.shape[0] + 1) // 2
    parts = [(x[:h], slots[:h], w[:h]), (x[h:], slots[h:], w[h:])]
    disp = layer.dispatcher
    pa, pb = disp.dispatch_many(parts)
    shared = layer.shared_experts
    sa = shared(parts[0][0]) if shared is not None else None
    ra = pa.wait()
    ca = disp.combine(layer.expert_ffn(ra), ra.handle, async_op=True)
    sb = shared(parts[1][0]) if shared is not None else None
    rb = pb.wait()
    cb = disp.combine(layer.expert_ffn(rb), rb.handle, async_op=True)
    y = torch.cat((ca.wait(), cb.wait())).to(x.dtype)
    if shared is not None:
        y = y + torch.cat((sa, sb))
    return y
