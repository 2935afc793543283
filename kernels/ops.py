"""The op facade the model calls: picks an implementation per op and device, records which ran.

``ops.mla_decode(...)`` etc. resolve through :mod:`kernels.registry` once per (op, device), then
once per call signature (the op's cheap metadata, ``registry.SIGNATURES``): the first candidate
whose accept check takes that signature runs, and the decision is kept on the choice, so a
repeated signature costs the signature tuple and a dict lookup, no check and no exception.
An implementation that raises ``Unsupported`` anyway is passed over for that signature from
then on (the decline is recorded once). ``used`` maps op -> implementation name for the ops
that ran since the last :func:`reset_used` (the model runner logs it per step: "backend per
op"); ``fallbacks`` op -> why a preferred implementation declined (the latest decision).
"""

from __future__ import annotations

import torch

from kernels import registry

used: dict[str, str] = {}
fallbacks: dict[str, str] = {}   # op -> why a preferred implementation declined (last decision that saw a decline)
_choices: dict[tuple[str, str], registry.Choice] = {}
_kernels = registry._fn_cache   # target -> loaded callable (registry.load fills it)
_device_types: dict[object, str] = {}   # torch.device or str -> "cpu" | "cuda" ...: ``torch.device.type`` costs ~0.2 us


def reset_used() -> dict[str, str]:
    """Return and clear the op -> implementation record."""
    out = dict(used)
    used.clear()
    return out


def clear_choices() -> None:
    """Forget cached choices and their per-signature decisions (after changing overrides)."""
    _choices.clear()


def choice(op: str, device: torch.device | str) -> registry.Choice:
    """The cached registry choice for ``op`` on ``device``."""
    dev = _device_types.get(device)
    if dev is None:
        dev = _device_types[device] = torch.device(device).type
    ch = _choices.get((op, dev))
    if ch is None:
        ch = _choices[(op, dev)] = registry.choose(op, dev)
    return ch


def call(op: str, device: torch.device | str, *args, **kwargs):
    """Run the implementation of ``op`` that takes these arguments: the first candidate unless the choice is keyed
    (some candidate checks calls, or one declined), then the one decided for this call's signature."""
    ch = _choices.get((op, _device_types.get(device)))   # choice(op, device), inlined: this runs per eager kernel
    if ch is None:
        ch = choice(op, device)
    sig = None
    i = 0
    if ch.keyed:
        sig = ch.signature(*args, **kwargs)
        i = ch.decided.get(sig, -1)
        if i < 0:
            i, declined = ch.decide(sig)
            if declined:
                fallbacks[op] = declined[-1][:300]
            if i < 0:
                raise RuntimeError(f"no implementation of {op} accepted the call on {device}: {'; '.join(declined)}")
    elif not ch.candidates:
        raise RuntimeError(f"no implementation of {op} accepted the call on {device}: {ch.why}")
    impl = ch.candidates[i]
    fn = _kernels.get(impl.target) or registry.load(impl)
    try:
        out = fn(*args, **kwargs)
    except registry.Unsupported as e:
        return _after_decline(ch, device, sig, i, e, args, kwargs)
    used[op] = impl.name
    return out


def _after_decline(ch: registry.Choice, device, sig, i: int, err: Exception, args, kwargs):
    """Candidate ``i`` raised Unsupported: from now on this signature goes to the next candidate that takes it; run
    that one (and on, should it decline too)."""
    ch.keyed = True
    if sig is None:
        sig = ch.signature(*args, **kwargs)
    while True:
        fallbacks[ch.op] = f"{ch.candidates[i].name}: {err}"[:300]
        i, declined = ch.decide(sig, i + 1)
        if declined:
            fallbacks[ch.op] = declined[-1][:300]
        if i < 0:
            raise RuntimeError(f"no implementation of {ch.op} accepted the call on {device}: {err}")
        impl = ch.candidates[i]
        try:
            out = registry.load(impl)(*args, **kwargs)
        except registry.Unsupported as e:
            err = e
            continue
        used[ch.op] = impl.name
        return out


# --- thin named wrappers: the model reads better with these ---------------------------

def mla_decode(q, kv_cache, block_table, seq_lens, scale, kv_rank, topk_indices=None, memo=None):
    """Absorbed MLA over paged latents; see ``reference.mla_decode_paged``. ``memo``: a dict that lives for one forward
    (``ForwardBatch.memo``), where an implementation keeps what every layer of the step shares (FlashMLA's scheduling
    metadata, which depends only on the KV lengths and shapes); None: nothing is shared."""
    return call("mla_decode", q.device, q, kv_cache, block_table, seq_lens, scale, kv_rank, topk_indices=topk_indices,
                memo=memo)


def attention_prefill(q, k, v, q_positions, scale, key_mask=None, bottom_right=False):
    """Causal attention of one sequence; see ``reference.attention``. ``bottom_right=True``: the caller knows (on the
    host) that the queries are the last ``len(q)`` positions of ``k`` (a prefill chunk), which lets the flash split
    run (kernels/prefill_attention.py)."""
    return call("attention_prefill", q.device, q, k, v, q_positions, scale, key_mask, bottom_right)


def gqa_decode(q, k_cache, v_cache, block_table, seq_lens, scale):
    """GQA over paged K/V; see ``reference.paged_attention_decode``."""
    return call("gqa_decode", q.device, q, k_cache, v_cache, block_table, seq_lens, scale)


def indexer_topk(scores, k):
    """Top-k key positions of indexer scores; see ``reference.topk_indices``."""
    return call("indexer_topk", scores.device, scores, k)


def fp8_gemm(xq, xs, wq, ws, out_dtype=torch.bfloat16):
    """Block-scaled FP8 ``x @ w^T``; see ``reference.fp8_gemm_blockscaled``."""
    return call("fp8_gemm", xq.device, xq, xs, wq, ws, out_dtype)


def grouped_gemm(x, w, m_indices):
    """Row-grouped GEMM; see ``reference.grouped_gemm``."""
    return call("grouped_gemm", x.device, x, w, m_indices)


def moe_experts(x, topk_weights, topk_ids, w13, w2, w13_scale=None, w2_scale=None):
    """Routed expert FFN (BF16, or FP8 with scales); see ``reference.moe_experts``."""
    return call("moe_experts", x.device, x, topk_weights, topk_ids, w13, w2, w13_scale, w2_scale)


def sample(logits, temperature, top_k, top_p, generators):
    """Greedy / seeded top-k top-p sampling; see ``reference.sample``."""
    return call("sampling", logits.device, logits, temperature, top_k, top_p, generators)


def quant_fp8_act(x):
    """Per-token 1x128 FP8 quantisation ``[M,K] -> (e4m3, fp32 scales)``; see ``reference.quant_fp8_act``."""
    return call("quant_fp8_act", x.device, x)


def rms_norm(x, weight, eps=1e-6):
    """RMSNorm over the last dim; see ``reference.rms_norm``."""
    return call("rms_norm", x.device, x, weight, eps)


def rope(x, positions, cos_sin, interleaved, rows=None):
    """Rotary embedding of ``x [T, heads, d]``; see ``reference.rope``."""
    return call("rope", x.device, x, positions, cos_sin, interleaved, rows)


def silu_mul(gate, up):
    """``silu(gate) * up`` in float32, back in gate's dtype; see ``reference.silu_mul``."""
    return call("silu_mul", gate.device, gate, up)
