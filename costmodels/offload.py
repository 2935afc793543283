"""Weight offload to host memory, prefetched one layer ahead over the host link.

A layout with ``offload_fraction > 0`` keeps that share of each MoE layer's expert weights
(``offload_scope``: the routed experts, or routed + shared experts) in host memory instead of
HBM. While layer L runs, layer L+1's offloaded bytes stream in over the host link into a
buffer; the GEMMs then read them from HBM as usual. This is what Grace-class systems (GB200 /
GB300: NVLink-C2C, 225 GB/s per GPU per direction in the hardware catalog) make worth trying;
over PCIe it rarely is.

Memory (per GPU): the offloaded bytes leave HBM; a double buffer of two layers' offloaded
bytes (the one being read and the one arriving) comes back; the offloaded bytes must fit the
GPU's share of host memory.

Step time: layer L takes ``max(T_L, transfer of layer L+1's offloaded bytes)``, and the first
offloaded layer's transfer cannot hide under anything of the step (its exposure). With each
layer taking the step's mean layer time ``T = t / layers``:

    t_offload = t + offloaded_layers * max(0, x - T) + x,    x = bytes_per_layer / (host_bw * comm_eff)

Assumptions: routing is not known before the router of layer L+1 runs, so every offloaded
byte of the layer is sent every step (no touched-experts discount); MTP layers keep their
weights in HBM; the link runs at the calibration's ``comm_eff`` of its datasheet rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodels.layout import ParallelLayout
from costmodels.model_spec import ModelSpec
from costmodels.params import ffn_linears, shard_divisor, weight_bytes_per_param

# weight groups (costmodels.memory's weight_breakdown keys) each offload_scope moves to host memory
SCOPE_GROUPS = {"routed_experts": ("routed_experts",), "moe": ("routed_experts", "shared_experts")}
_LINEAR_GROUP = {"routed_experts": "routed_experts", "shared_expert": "shared_experts"}
BUFFER_LAYERS = 2  # double buffer: the layer being computed and the next one arriving


def offloaded_bytes_per_layer(model: ModelSpec, layout: ParallelLayout) -> float:
    """Bytes of one MoE layer's weights that one GPU keeps in host memory (0 without offload)."""
    if not layout.offload_fraction or not model.moe:
        return 0.0
    groups = SCOPE_GROUPS[layout.offload_scope]
    total = 0.0
    for lin in ffn_linears(model, True):
        if _LINEAR_GROUP.get(lin.name) in groups:
            total += lin.params / shard_divisor(lin, model, layout) * weight_bytes_per_param(lin, layout, model)
    return layout.offload_fraction * total


def resident_weights(groups: dict[str, float], model: ModelSpec, layout: ParallelLayout, moe_layers: int) -> dict[str, float]:
    """A stage's per-GPU weight bytes by group with the offloaded share of ``moe_layers`` MoE layers moved out of
    HBM and the prefetch buffer added (``groups`` itself when nothing is offloaded)."""
    per_layer = offloaded_bytes_per_layer(model, layout)
    if per_layer <= 0 or moe_layers <= 0:
        return groups
    out = dict(groups)
    for g in SCOPE_GROUPS[layout.offload_scope]:
        if g in out:
            out[g] *= 1.0 - layout.offload_fraction
    out["offload_buffer"] = BUFFER_LAYERS * per_layer
    return out


def host_bytes_per_gpu(model: ModelSpec, layout: ParallelLayout) -> float:
    """Host memory one GPU's offloaded weights take (its stage's MoE layers; the busiest stage)."""
    per_layer = offloaded_bytes_per_layer(model, layout)
    if per_layer <= 0:
        return 0.0
    moe = [i for i in range(model.num_layers) if model.is_moe_layer(i)]
    stage = max(len(s) for s in np.array_split(np.array(moe, int), layout.pp)) if moe else 0
    return per_layer * stage


@dataclass(frozen=True)
class Prefetch:
    """The per-step arithmetic of layer-ahead prefetch for one model, hardware and layout."""

    bytes_per_layer: float   # offloaded bytes of one MoE layer, per GPU
    offloaded_layers: int    # MoE layers whose weights are partly in host memory
    layers: int              # all layers of the model (the step's time is spread over them)
    link_bytes_per_s: float  # host link, per GPU per direction, derated

    @property
    def transfer_s(self) -> float:
        """Seconds to bring one layer's offloaded bytes over the host link."""
        return self.bytes_per_layer / self.link_bytes_per_s

    def step_time(self, t):
        """Step time with prefetch, from the step's time ``t`` with every weight in HBM (float or array)."""
        x = self.transfer_s
        stall = np.maximum(0.0, x - np.asarray(t, float) / self.layers)
        out = np.asarray(t, float) + self.offloaded_layers * stall + x
        return out if isinstance(t, np.ndarray) else float(out)

    def exposed(self, t: float) -> float:
        """Seconds the host link adds to a step of ``t`` (``step_time(t) - t``)."""
        return self.step_time(t) - t


def prefetch_for(model: ModelSpec, host_link_bytes_per_s: float, comm_eff: float, layout: ParallelLayout) -> Prefetch | None:
    """The layout's prefetch arithmetic (None without offload)."""
    per_layer = offloaded_bytes_per_layer(model, layout)
    if per_layer <= 0:
        return None
    n_moe = sum(1 for i in range(model.num_layers) if model.is_moe_layer(i))
    return Prefetch(per_layer, n_moe, model.num_layers, host_link_bytes_per_s * comm_eff)
