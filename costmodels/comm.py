"""Collective communication times: TP all-reduce, EP all-to-all (dispatch/combine), pipeline send.

Bandwidths are per GPU per direction from the hardware catalog, derated by the profile's
``comm_eff``; each collective pays a fixed latency. A group that fits inside one scale-up
domain (NVLink/NVL72/Infinity Fabric) uses scale-up links only; a larger one sends the share
of its traffic that leaves the domain over the scale-out NIC, and the slower path sets the time.
"""

from __future__ import annotations

import math

import numpy as np

from costmodels.calibration import CalibrationProfile
from costmodels.hardware import Hardware


def _positive(nbytes, t):
    """``t`` where ``nbytes > 0``, else 0 (a float for a float, elementwise for an array)."""
    if isinstance(nbytes, np.ndarray):
        return np.where(nbytes > 0, t, 0.0)
    return t if nbytes > 0 else 0.0


def _bytes(nbytes):
    return np.asarray(nbytes, float) if isinstance(nbytes, (np.ndarray, list)) else nbytes


def allreduce_time(nbytes, n: int, hw: Hardware, cal: CalibrationProfile):
    """Ring/tree all-reduce of ``nbytes`` per GPU over ``n`` GPUs: 2(n-1)/n of the data crosses each link
    (a float, or elementwise over an array of sizes)."""
    b = _bytes(nbytes)
    if n <= 1:
        return _positive(b, 0.0)
    d = min(n, hw.scaleup_domain)
    t = 2.0 * (d - 1) / d * b / (hw.scaleup_bw * cal.comm_eff)
    if n > hw.scaleup_domain:
        # hierarchical: reduce-scatter inside the domain, all-reduce of 1/d of the data across domains
        k = -(-n // hw.scaleup_domain)
        t = t + 2.0 * (k - 1) / k * b / d / (hw.scaleout_bw * cal.comm_eff) + cal.allreduce_latency_s + cal.alltoall_scaleout_latency_s
    else:
        t = t + cal.allreduce_latency_s
    return _positive(b, t)


def alltoall_time(nbytes_out, n: int, hw: Hardware, cal: CalibrationProfile):
    """All-to-all where each GPU sends ``nbytes_out`` spread evenly over the other ``n - 1`` GPUs (a float, or
    elementwise over an array of sizes).

    Inside a scale-up domain every byte goes over scale-up links. Across domains, the share
    bound for other domains ((n - d) / (n - 1)) goes over the NIC at scale-out bandwidth.
    """
    b = _bytes(nbytes_out)
    if n <= 1:
        return _positive(b, 0.0)
    d = min(n, hw.scaleup_domain)
    if n <= hw.scaleup_domain:
        return _positive(b, b / (hw.scaleup_bw * cal.a2a_eff) + cal.alltoall_latency_s)
    remote = b * (n - d) / (n - 1)
    local = b - remote
    t = np.maximum(local / (hw.scaleup_bw * cal.a2a_eff), remote / (hw.scaleout_bw * cal.a2a_eff))
    return _positive(b, (t if isinstance(b, np.ndarray) else float(t)) + cal.alltoall_scaleout_latency_s)


def allgather_time(nbytes_out, n: int, hw: Hardware, cal: CalibrationProfile):
    """All-gather in which each GPU contributes ``nbytes_out`` and receives everyone else's (float or array)."""
    b = _bytes(nbytes_out)
    if n <= 1:
        return _positive(b, 0.0)
    return alltoall_time(b * (n - 1), n, hw, cal)


def p2p_time(nbytes, cross_domain: bool, hw: Hardware, cal: CalibrationProfile):
    """One point-to-point send (pipeline stage boundary; float or array)."""
    b = _bytes(nbytes)
    bw = hw.scaleout_bw if cross_domain else hw.scaleup_bw
    return _positive(b, b / (bw * cal.comm_eff) + cal.p2p_latency_s)


def dispatch_rows_per_token(n_experts: int, top_k: int, ep: int, n_group: int = 1, topk_group: int = 1, normal: bool = False) -> float:
    """Copies of one token an EP rank sends to other ranks in a dispatch (the combine returns as many).

    Low-latency mode (DeepEP's decode kernels): one copy per chosen expert on another rank,
    ``top_k * (ep - 1) / ep``. Normal mode (DeepEP's prefill kernels): one copy per *destination
    rank* holding any of the token's experts, ``(ep - 1) * P(a given rank is touched)``, for experts
    spread contiguously over ranks and, with group-limited routing (DeepSeek-V3: 8 groups, 4 kept),
    the token's experts inside its ``topk_group`` groups. V3 at EP 2 / 4 / 8: 0.99 / 2.36 / 3.5 rows
    against 4 / 6 / 7 in low-latency mode (docs/ep.md: a routing simulation gave 0.98 / 2.34 / 3.46).
    """
    if ep <= 1 or top_k <= 0 or n_experts <= 0:
        return 0.0
    if not normal:
        return top_k * (ep - 1) / ep
    per_rank = n_experts / ep
    if n_group > 1 and topk_group < n_group and ep <= n_group:
        # g groups per rank: a rank is missed when none of its groups is kept, prod (G - g - i) / (G - i) over the
        # kept groups (= C(G - g, kept) / C(G, kept) for whole groups; continued for a fractional g)
        p = 1.0 - _miss(n_group, n_group / ep, topk_group)
    else:
        # the token's candidate experts (its kept groups, or all) fill cand / per_rank ranks; its top_k are
        # drawn among them without replacement, so a candidate rank is missed with prod (cand - e - i) / (cand - i)
        cand = n_experts * (topk_group / n_group if n_group > 1 and topk_group < n_group else 1.0)
        ranks = min(float(ep), max(1.0, cand / per_rank))
        p = (1.0 - _miss(cand, cand / ranks, top_k)) * ranks / ep
    return min((ep - 1) * min(1.0, p), top_k * (ep - 1) / ep)  # never more than a copy per expert


# Bytes on the wire per hidden value of an EP dispatch payload (the combine returns BF16).
DISPATCH_BYTES_PER_VALUE = {
    "bf16": 2.0,
    # DeepEP's FP8 dispatch: e4m3 values with one fp32 scale per 1x128 block (DeepEP README, low-latency kernels)
    "fp8": 1.0 + 4.0 / 128,
    # NVFP4: e2m1 values with one FP8 (e4m3) scale per 16-value block = 4.5 bits/value (NVIDIA, "Introducing
    # NVFP4 for Efficient and Accurate Low-Precision Inference", 2025; the per-tensor fp32 scale is negligible)
    "nvfp4": 0.5 + 1.0 / 16,
}


def dispatch_payload_dtype(layout) -> str:
    """The dispatch payload a layout sends: ``layout.dispatch_dtype``, else FP8 for FP8/FP4 experts (DeepEP's
    FP8 dispatch) and BF16 otherwise."""
    if layout.dispatch_dtype is not None:
        return layout.dispatch_dtype
    return "fp8" if layout.experts_dtype in ("fp8", "fp4") else "bf16"


def combine_hidden_under_down(combine_s, down_s, chunks):
    """Seconds of the combine that hide under the down GEMM when each chunk's combine sends start as soon as
    the down GEMM finishes that chunk (single-batch overlap: DeepEP PR #390 / #483, SGLang PR #9660; the GEMM
    signals per expert and the combine polls the signal).

    Two ops pipelined over ``chunks`` pieces take ``max(a, b) + min(a, b) / chunks`` instead of ``a + b``, so
    ``min(a, b) * (1 - 1 / chunks)`` is hidden: the first chunk's GEMM and the last chunk's sends stay exposed.
    Floats or arrays (elementwise); ``chunks`` below 1 counts as 1 (nothing to pipeline, nothing hidden).
    """
    k = np.maximum(np.asarray(chunks, float), 1.0)
    hidden = np.minimum(combine_s, down_s) * (1.0 - 1.0 / k)
    return hidden if isinstance(hidden, np.ndarray) and hidden.ndim else float(hidden)


def _miss(cand: float, block: float, k: int) -> float:
    """Chance that ``k`` experts drawn without replacement from ``cand`` candidates all miss ``block`` of them."""
    miss = 1.0
    for i in range(k):
        miss *= max(cand - block - i, 0.0) / (cand - i) if cand - i > 0 else 0.0
    return miss


def block_touched(n_experts: int, top_k: int, block: float, n_group: int = 1, topk_group: int = 1) -> float:
    """Chance that a token's ``top_k`` experts include one of a contiguous ``block`` of experts (a rank's or a
    node's) under group-limited routing: ``topk_group`` (K) of ``n_group`` (G) contiguous groups kept, then the
    top-k taken among the kept groups' experts; no limit when K >= G.

    A group is kept for its best experts (DeepSeek-V3 scores a group by its top-2 affinities, DeepEP's benchmark
    by its top one), so each kept group gets one of the k picks (when K <= k) and the other k - K fall evenly
    over the kept candidates. A block of g whole groups is then touched unless none of its groups is kept,
    1 - C(G - g, K) / C(G, K); a block inside one group only when its group is kept (K / G) and one of the
    picks lands in it. Without a group limit the k picks are drawn evenly from all experts."""
    k, block = int(top_k), float(min(block, n_experts))
    if n_group <= 1 or topk_group >= n_group or topk_group > top_k:
        # no group limit (or more kept groups than picks: taken as no limit, an approximation)
        return 1.0 - _miss(n_experts, block, k)
    G, K = int(n_group), int(topk_group)
    s = n_experts / G
    if block >= s:
        g = max(1, min(G, round(block / s)))
        return 1.0 - math.comb(G - g, K) / math.comb(G, K)
    # inside one kept group: its guaranteed pick lands in the block with chance block / s, else the other k - K
    # picks (over the K s - K candidates left) must reach it
    return K / G * (1.0 - (1.0 - block / s) * _miss(K * s - K, block, k - K))


def node_fanout(n_experts: int, top_k: int, ep: int, ranks_per_node: int, n_group: int = 1, topk_group: int = 1):
    """(remote nodes, ranks) one token reaches in DeepEP's internode normal dispatch, as expectations.

    Experts lie contiguously over ``ep`` ranks, ``ranks_per_node`` to a node. The token crosses the NIC once
    per *other node* holding any of its experts (DeepEP sends one RDMA copy per destination node, and DeepSeek-V3's
    group-limited routing keeps a token's experts within ``topk_group`` groups); inside each destination node the
    copy fans out over NVLink to every rank holding one of its experts (own rank and own node included: DeepEP's
    published NVLink bandwidth counts them)."""
    nodes = max(1, -(-ep // ranks_per_node))  # a partly filled last node still counts
    per_node = n_experts / nodes
    p_node = block_touched(n_experts, top_k, per_node, n_group, topk_group)
    p_rank = block_touched(n_experts, top_k, n_experts / ep, n_group, topk_group)
    # the token's own node is one of the nodes: with group-limited routing it is touched like any other node
    return (nodes - 1) * p_node, ep * p_rank


def internode_normal_time(tokens, bytes_per_value: float, hidden: int, fanout: tuple[float, float],
                          hw: Hardware, cal: CalibrationProfile):
    """Seconds of one DeepEP internode normal-mode dispatch (or combine) of ``tokens`` tokens per rank.

    Two stages pipelined by DeepEP's chunked forwarding (RDMA chunks are forwarded over NVLink as they land), so
    the slower sets the time: ``max(rdma, nvlink) + latency``, with
    - RDMA: one copy per token per remote destination node, at ``deepep_rdma_eff`` of the NIC's rate;
    - NVLink: the copies every rank receives from its node's forwarders, at ``deepep_nvl_eff`` of the scale-up
      rate (the same as the rows it sends, by symmetry). A float, or elementwise over an array of tokens."""
    remote_nodes, ranks = fanout
    t = _bytes(tokens)
    row = hidden * bytes_per_value
    rdma = t * remote_nodes * row / (hw.scaleout_bw * cal.deepep_rdma_eff)
    nvl = t * ranks * row / (hw.scaleup_bw * cal.deepep_nvl_eff)
    return _positive(t, np.maximum(rdma, nvl) + cal.alltoall_scaleout_latency_s)


def comm_sm_slowdown(sm_count: int | None, held: int) -> float:
    """How much slower compute runs beside a communication kernel holding ``held`` of the GPU's ``sm_count`` SMs
    (it gets the rest: ``sm_count / (sm_count - held)``); 1 when the SM count is unknown or nothing is held."""
    if not sm_count or held <= 0:
        return 1.0
    return sm_count / max(sm_count - held, 1)


def intranode_ep_time(tokens, rows_per_token: float, bytes_per_value: float, hidden: int, hw: Hardware,
                      cal: CalibrationProfile):
    """Seconds of one DeepEP dispatch (or combine) inside one scale-up domain, normal or low-latency kernels: every
    row a rank receives (``rows_per_token`` per token of each rank, its own included) at ``deepep_nvl_eff`` of the
    scale-up rate, plus the all-to-all latency. DeepEP's intranode figures count the own rank's rows the same way
    (its "logical" bandwidth), so the efficiency measured there applies to these bytes. Float or array of tokens."""
    t = _bytes(tokens)
    return _positive(t, t * rows_per_token * hidden * bytes_per_value / (hw.scaleup_bw * cal.deepep_nvl_eff)
                     + cal.alltoall_latency_s)
