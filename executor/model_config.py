"""What the executor needs to build a model: a ModelSpec plus the few checkpoint details it omits.

ModelSpec (costmodels) carries the architecture numbers the cost model and the executor
share. A real checkpoint also fixes details that change the math but not the cost
(RoPE scaling, routed scaling factor, q/k norms, tied heads); they come from the HF
``config.json`` when one is given, else from the family's defaults. No torch here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from costmodels.model_spec import IndexerConfig, MLAConfig, ModelSpec, MoEConfig
from twinfer.errors import TwinferError

DEEPSEEK_FAMILIES = {"deepseek_v3", "deepseek_v32", "kimi_k2", "tiny"}
LLAMA_FAMILIES = {"llama", "qwen3", "qwen3_moe", "glm4_moe"}


def tiny_spec() -> ModelSpec:
    """The ``tiny`` test model (a DeepSeek-V3.2-shaped toy: MLA + DSA indexer + MoE + MTP).

    Kept identical to ``costmodels.catalog``'s ``tiny`` entry; used when the catalog is absent.
    """
    return ModelSpec(
        name="tiny", family="tiny", num_layers=4, hidden_size=256, vocab_size=512,
        num_attention_heads=4, num_kv_heads=1, head_dim=48, intermediate_size=512,
        attention="mla",
        mla=MLAConfig(q_lora_rank=128, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32),
        indexer=IndexerConfig(n_heads=4, head_dim=32, topk=64),
        moe=MoEConfig(n_routed_experts=16, n_shared_experts=1, top_k=4, moe_intermediate_size=128,
                      first_k_dense=1, n_group=4, topk_group=2, scoring="sigmoid"),
        mtp_layers=1, max_context=4096,
        sources=["twinfer test model"],
    )


def resolve_spec(name_or_dir: str) -> ModelSpec:
    """ModelSpec for a catalog name or an HF checkpoint folder (via costmodels.catalog when present)."""
    try:
        from costmodels.catalog import get_model  # another engineer's module; optional until it lands
    except ImportError:
        get_model = None
    _refuse_unimplemented_hf(name_or_dir)
    if get_model is not None:
        return get_model(name_or_dir)
    if name_or_dir == "tiny":
        return tiny_spec()
    raise TwinferError(f"unknown model {name_or_dir!r}: costmodels.catalog is not available; only 'tiny' is built in")


# config.json keys of mechanisms the executor does not compute (DeepSeek-V4's, in transformers' deepseek_v4 names)
_V4_MECHANISMS = {
    "hc_mult": "mHC hyper-connections",
    "o_lora_rank": "grouped low-rank output projection",
    "compress_rates": "compressed (CSA/HCA) attention layers",
    "compress_ratios": "compressed (CSA/HCA) attention layers",
    "sliding_window": "sliding-window attention",
}


def _refuse_unimplemented_hf(name_or_dir: str) -> None:
    """An HF folder whose architecture the executor does not implement fails here, naming what is missing.

    Serving it with the parts the executor does have (MLA, MoE) would compute a different model.
    """
    path = Path(name_or_dir) / "config.json"
    if not path.is_file():
        return
    try:
        hf = json.loads(path.read_text())
    except (OSError, ValueError):
        return   # the catalog reports unreadable files
    if not isinstance(hf, dict) or str(hf.get("model_type", "")) != "deepseek_v4":
        return
    parts = sorted({what for key, what in _V4_MECHANISMS.items() if hf.get(key) not in (None, 0, 1)})
    if str(hf.get("scoring_func", "")) not in ("", "sigmoid", "softmax"):
        parts.append(f"{hf['scoring_func']} routing")
    if any(str(t).startswith("hash") for t in hf.get("mlp_layer_types") or []):
        parts.append("hash-routed MoE layers")
    raise TwinferError(f"{name_or_dir}: model_type 'deepseek_v4' is not implemented by the executor "
                       f"({', '.join(parts) or 'V4 attention'}); the simulator models it (twinfer simulate --model ...)")


@dataclass
class RopeConfig:
    """RoPE frequencies: plain, YaRN (DeepSeek-V3) or llama3 scaling (HF ``modeling_rope_utils`` semantics)."""

    theta: float = 10000.0
    kind: str = "default"          # "default" | "yarn" | "llama3"
    factor: float = 1.0
    original_max_position: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    attention_factor: float | None = None   # YaRN cos/sin scale; None: derived from factor and the mscales
    truncate: bool = True                   # YaRN: round the correction range to whole dims
    partial_rotary_factor: float = 1.0      # GLM-4.5: RoPE on the first fraction of each head

    @staticmethod
    def from_hf(hf: dict, default_theta: float = 10000.0) -> "RopeConfig":
        """From an HF config mapping: transformers 5's ``rope_parameters`` or 4.x's ``rope_theta`` + ``rope_scaling``."""
        params = hf.get("rope_parameters")
        if isinstance(params, dict) and "rope_theta" not in params and "full_attention" in params:
            params = params["full_attention"]   # per-layer-type rope (one type here)
        scaling = dict(hf.get("rope_scaling") or {})
        if isinstance(params, dict):
            scaling = {**scaling, **params}
        theta = float(scaling.get("rope_theta", hf.get("rope_theta", default_theta)))
        prf = float(scaling.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
        kind = scaling.get("rope_type", scaling.get("type", "default")) or "default"
        if kind not in ("default", "yarn", "llama3"):
            raise TwinferError(f"config.json rope type {kind!r}: the executor implements 'default', 'yarn' and 'llama3'")
        af = scaling.get("attention_factor")
        return RopeConfig(
            theta=theta, kind=kind, factor=float(scaling.get("factor") or 1.0),
            original_max_position=int(scaling.get("original_max_position_embeddings") or 4096),
            beta_fast=float(scaling.get("beta_fast") or 32), beta_slow=float(scaling.get("beta_slow") or 1),
            mscale=float(scaling.get("mscale") or 0.0), mscale_all_dim=float(scaling.get("mscale_all_dim") or 0.0),
            low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
            high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
            attention_factor=None if af is None else float(af), truncate=bool(scaling.get("truncate", True)),
            partial_rotary_factor=prf,
        )

    def _mscale(self, m: float) -> float:
        """YaRN's ``yarn_get_mscale(factor, m)``: 0.1 m ln(factor) + 1, and 1 when factor <= 1."""
        return 0.1 * m * math.log(self.factor) + 1.0 if self.factor > 1 else 1.0

    def attention_mscale(self) -> float:
        """YaRN's softmax-scale correction (DeepSeek-V3 modeling code: yarn_get_mscale(factor, mscale_all_dim))."""
        if self.kind != "yarn" or not self.mscale_all_dim:
            return 1.0
        return self._mscale(self.mscale_all_dim)

    def cos_sin_scale(self) -> float:
        """YaRN's scale of cos/sin (HF ``_compute_yarn_parameters``' attention_factor); 1 otherwise.

        Explicit ``attention_factor`` wins; with both mscales it is mscale(f, mscale) / mscale(f,
        mscale_all_dim) (1 for DeepSeek-V3, whose two are equal), else the paper's 0.1 ln f + 1.
        """
        if self.kind != "yarn":
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return self._mscale(self.mscale) / self._mscale(self.mscale_all_dim)
        return self._mscale(1.0)


@dataclass
class ExecModelConfig:
    """A ModelSpec plus checkpoint details; the executor's model classes read only this."""

    spec: ModelSpec
    rope: RopeConfig = field(default_factory=RopeConfig)
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True
    qk_norm: bool = False                   # Qwen3: per-head RMSNorm on q and k
    attention_bias: bool = False            # q/k/v projection biases (Qwen2, GLM-4.5; MLA: q_a, kv_a and o)
    o_bias: bool = False                    # o_proj bias (Llama/Qwen3 tie it to attention_bias; GLM and Qwen2 do not)
    index_rope_interleaved: bool = False    # DSA indexer rotates halves (V3.2 reference code)
    rope_interleave: bool = True            # MLA rotates (x0,x1),(x2,x3).. pairs (DeepSeek checkpoints; HF rope_interleave)
    eos_token_id: int | None = None
    hf_dir: Path | None = None

    @property
    def is_deepseek(self) -> bool:
        return self.spec.attention == "mla"

    @property
    def num_cache_layers(self) -> int:
        """Layers holding KV: the main stack plus the MTP layers."""
        return self.spec.num_layers + self.spec.mtp_layers

    @staticmethod
    def build(spec: ModelSpec, hf_dir: str | Path | None = None) -> "ExecModelConfig":
        """Combine ``spec`` with ``hf_dir/config.json`` when given."""
        unsupported = [f for f, bad in (("o_lora_rank", getattr(spec, "o_lora_rank", None)),
                                        ("hc_mult", getattr(spec, "hc_mult", 1) != 1),
                                        # sliding layers run on GQA models (executor/swa.py); csa/hca nowhere
                                        ("layer_kinds", any(k not in ("full", "sliding") for k in spec.kinds())
                                         or ("sliding" in spec.kinds() and spec.attention != "gqa")),
                                        (f"{spec.moe.scoring if spec.moe else ''} routing",
                                         spec.moe is not None and spec.moe.scoring not in ("softmax", "sigmoid"))) if bad]
        if unsupported:
            raise TwinferError(f"model {spec.name!r}: the executor does not implement {', '.join(unsupported)} "
                               "(V4-class attention); the simulator does")
        cfg = ExecModelConfig(spec=spec, rope=RopeConfig(theta=spec.rope_theta))
        if spec.family in ("qwen3", "qwen3_moe"):
            cfg.qk_norm = True
        if spec.family in ("deepseek_v3", "deepseek_v32", "kimi_k2", "glm4_moe"):
            cfg.routed_scaling_factor = 2.5  # DeepSeek-V3 and GLM-4.5 config.json routed_scaling_factor
        if hf_dir is not None:
            cfg.hf_dir = Path(hf_dir)
            path = cfg.hf_dir / "config.json"
            if not path.is_file():
                raise TwinferError(f"{hf_dir}: no config.json")
            hf = json.loads(path.read_text())
            cfg.rope = RopeConfig.from_hf(hf, spec.rope_theta)
            cfg.rope_interleave = bool(hf.get("rope_interleave", True))
            cfg.routed_scaling_factor = float(hf.get("routed_scaling_factor", cfg.routed_scaling_factor))
            cfg.norm_topk_prob = bool(hf.get("norm_topk_prob", cfg.norm_topk_prob))
            model_type = str(hf.get("model_type", ""))
            cfg.attention_bias = bool(hf.get("attention_bias", False)) or "qwen2" in model_type
            cfg.o_bias = bool(hf.get("attention_bias", False)) and model_type in ("llama", "qwen3", "qwen3_moe")
            cfg.qk_norm = cfg.qk_norm or bool(hf.get("use_qk_norm", False))
            _check_supported(hf, spec)
            eos = hf.get("eos_token_id")
            cfg.eos_token_id = eos[0] if isinstance(eos, list) else eos
        return cfg


def _check_supported(hf: dict, spec: ModelSpec) -> None:
    """Refuse config.json settings the executor would silently compute differently (issue 22: say so at load)."""
    bad = []
    if hf.get("hidden_act", "silu") != "silu":
        bad.append(f"hidden_act={hf['hidden_act']!r} (silu only)")
    if hf.get("mlp_bias"):
        bad.append("mlp_bias=true")
    # the DSA layer is "indexed_attention" in transformers >= 5.2x, "deepseek_sparse_attention" in 5.17
    known = {"full_attention"} | ({"indexed_attention", "deepseek_sparse_attention"} if spec.indexer else set())
    if hf.get("use_sliding_window") or any(t not in known for t in hf.get("layer_types") or []):
        bad.append(f"layer_types other than {sorted(known)} (use_sliding_window / layer_types)")
    mlp_types = hf.get("mlp_layer_types")
    if mlp_types and [t == "sparse" for t in mlp_types] != [spec.is_moe_layer(i) for i in range(len(mlp_types))]:
        bad.append(f"mlp_layer_types {mlp_types} (dense layers first, then MoE: first_k_dense_replace)")
    if spec.attention == "mla" and hf.get("attention_bias"):
        bad.append("attention_bias=true on MLA")
    if spec.attention == "gqa" and spec.num_kv_heads and spec.num_attention_heads % spec.num_kv_heads:
        bad.append("num_attention_heads not a multiple of num_key_value_heads")
    if bad:
        raise TwinferError(f"config.json of {spec.name!r}: the executor does not implement {'; '.join(bad)}")


def spec_to_hf_config(cfg: ExecModelConfig) -> dict:
    """An HF-style config.json for ``cfg`` (used to save dummy checkpoints in tests)."""
    s = cfg.spec
    out: dict = {
        # an indexer makes it V3.2: written as deepseek_v3 it reloaded without its indexer (a different model)
        "model_type": ("deepseek_v32" if s.indexer else "deepseek_v3") if cfg.is_deepseek else ("qwen3_moe" if s.is_moe else "llama"),
        "num_hidden_layers": s.num_layers, "hidden_size": s.hidden_size, "vocab_size": s.vocab_size,
        "num_attention_heads": s.num_attention_heads, "num_key_value_heads": s.num_kv_heads,
        "head_dim": s.head_dim, "intermediate_size": s.intermediate_size, "rms_norm_eps": s.rms_norm_eps,
        "rope_theta": cfg.rope.theta, "max_position_embeddings": s.max_context,
        "routed_scaling_factor": cfg.routed_scaling_factor, "norm_topk_prob": cfg.norm_topk_prob,
        "tie_word_embeddings": s.tie_word_embeddings, "num_nextn_predict_layers": s.mtp_layers,
    }
    if s.mla:
        out.update(q_lora_rank=s.mla.q_lora_rank, kv_lora_rank=s.mla.kv_lora_rank,
                   qk_nope_head_dim=s.mla.qk_nope_head_dim, qk_rope_head_dim=s.mla.qk_rope_head_dim,
                   v_head_dim=s.mla.v_head_dim)
    if s.indexer:
        out.update(index_n_heads=s.indexer.n_heads, index_head_dim=s.indexer.head_dim, index_topk=s.indexer.topk)
    if s.moe:
        out.update(n_routed_experts=s.moe.n_routed_experts, num_experts=s.moe.n_routed_experts,
                   n_shared_experts=s.moe.n_shared_experts, num_experts_per_tok=s.moe.top_k,
                   moe_intermediate_size=s.moe.moe_intermediate_size, first_k_dense_replace=s.moe.first_k_dense,
                   n_group=s.moe.n_group, topk_group=s.moe.topk_group, scoring_func=s.moe.scoring)
    if cfg.eos_token_id is not None:
        out["eos_token_id"] = cfg.eos_token_id
    return out
