"""Model catalog: named ModelSpecs built from the models' own HF ``config.json``, plus import of any such file.

Catalog entries live in ``costmodels/data/models``: ``<name>.json`` holds the released
``config.json`` (the architecture keys, verbatim) with its sources, assumptions and aliases, and
is turned into a ModelSpec by :func:`from_hf_config` — the same path a user's file takes.
``<name>.yaml`` holds a ModelSpec directly (the toy ``tiny`` model).
"""

from __future__ import annotations

import functools
import json
import math
from importlib import resources
from pathlib import Path

import yaml

from twinfer.config import is_dir, is_file, load_model_file, read_mapping, validate
from twinfer.errors import TwinferError, UnknownNameError

from costmodels.model_spec import ModelSpec

_KIND_BY_RATIO = {0: "sliding", 4: "csa", 128: "hca"}
# DeepSeek-V4.1 compress_ratios: 0 sliding window only, 2 compressed 2:1 and read through the indexer (csa), 1 uncompressed
# and read through the indexer (sparse); every such layer also attends the last sliding_window tokens
_V41_KIND_BY_RATIO = {0: "sliding", 2: "csa", 1: "sparse"}
# Engram rows: head_dim FP8 values + one UE8M0 scale per 32 (256 dims -> 264 B a row: colibri docs/deepseek-v41.md)
_ENGRAM_SCALE_GROUP = 32


class _Cfg:
    """A config.json mapping whose missing keys raise errors that name the key and the file."""

    def __init__(self, data: dict, name: str, family: str):
        self.data, self.name, self.family = data, name, family

    def req(self, key: str):
        if key not in self.data or self.data[key] is None:
            raise TwinferError(f"{self.name}: config.json lacks required key {key!r} (needed for a {self.family} model)")
        return self.data[key]

    def get(self, key: str, default=None):
        v = self.data.get(key)
        return default if v is None else v


# config.json keys read as integers (some feed arithmetic before ModelSpec validates the result)
_INT_KEYS = (
    "hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "num_key_value_heads", "head_dim",
    "intermediate_size", "moe_intermediate_size", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
    "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
    "first_k_dense_replace", "n_group", "topk_group", "num_experts", "decoder_sparse_step", "index_n_heads",
    "index_head_dim", "index_topk", "sliding_window", "max_position_embeddings", "num_nextn_predict_layers",
    "o_lora_rank", "o_groups", "hc_mult", "hc_sinkhorn_iters", "candidate_source_layer_id", "candidate_topk_blocks", "candidate_block_size", "engram_max_ngram_size", "engram_n_heads", "engram_head_dim",
)
_DIVISOR_KEYS = ("num_attention_heads",)  # default head_dim = hidden_size // num_attention_heads


def _int_range(key: str) -> tuple[int, int | None]:
    """(lowest, highest or None) an integer config.json key may take: the bounds of the ModelSpec field of its name
    where there is one (hc_mult 1..64, hc_sinkhorn_iters 1..1000), a divisor's 1, else 0."""
    lo, hi = (1 if key in _DIVISOR_KEYS else 0), None
    field = ModelSpec.model_fields.get(key)
    for m in (field.metadata if field is not None else ()):
        lo = max(lo, int(getattr(m, "ge", lo)))
        hi = int(m.le) if getattr(m, "le", None) is not None else hi
    return lo, hi


def _check_types(cfg: dict, name: str) -> None:
    """Refuse config.json values of the wrong type up front, naming the key, the value and what is allowed."""

    def bad(key: str, want: str) -> TwinferError:
        return TwinferError(f"{name}: config.json key {key!r} must be {want} (got {cfg[key]!r})")

    def is_int(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    for key in _INT_KEYS:
        v = cfg.get(key)
        if v is None:
            continue
        lo, hi = _int_range(key)
        if not is_int(v) or v < lo or (hi is not None and v > hi):
            raise bad(key, "a non-negative integer" if (lo, hi) == (0, None) else
                      f"an integer >= {lo}" if hi is None else f"an integer in {lo}..{hi}")
    for key in ("compress_ratios", "mlp_only_layers", "kv_source_layer_ids", "index_source_layer_ids", "engram_layer_ids",
                "engram_num_embeddings"):
        v = cfg.get(key)
        if v is not None and (not isinstance(v, list) or not all(is_int(x) for x in v)):
            raise bad(key, "a list of integers")
    archs = cfg.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise bad("architectures", "a list of class names")
    q = cfg.get("quantization_config")
    if q is not None and not isinstance(q, dict):
        raise bad("quantization_config", "a mapping")


def _family(cfg: dict) -> str:
    model_type = str(cfg.get("model_type", "")).lower()
    archs = [str(a) for a in cfg.get("architectures") or []]
    by_type = {
        "deepseek_v3": "deepseek_v3", "kimi_k2": "kimi_k2", "deepseek_v32": "deepseek_v32",
        "deepseek_v4": "deepseek_v4", "deepseek_v41": "deepseek_v41", "qwen3_moe": "qwen3_moe", "qwen3": "qwen3",
        "glm4_moe": "glm4_moe", "llama": "llama",
    }
    if model_type in by_type:
        return by_type[model_type]
    by_arch = {
        "DeepseekV3ForCausalLM": "deepseek_v3", "DeepseekV32ForCausalLM": "deepseek_v32",
        "DeepseekV4ForCausalLM": "deepseek_v4", "DeepseekV41ForCausalLM": "deepseek_v41", "Qwen3MoeForCausalLM": "qwen3_moe",
        "Qwen3ForCausalLM": "qwen3", "Glm4MoeForCausalLM": "glm4_moe", "LlamaForCausalLM": "llama",
    }
    for a in archs:
        if a in by_arch:
            return by_arch[a]
    raise TwinferError(
        f"unsupported config.json: model_type={model_type or None!r}, architectures={archs}; supported model_types: "
        + ", ".join(sorted(by_type))
    )


def _quant_dtype(cfg: dict) -> str:
    q = cfg.get("quantization_config") or {}
    method = str(q.get("quant_method", "")).lower()
    if method == "fp8" or str(q.get("fmt", "")).startswith("e4m3"):
        return "fp8"
    if "fp4" in method or method in ("mxfp4", "nvfp4"):
        return "fp4"
    return "bf16"


def _mla_deepseek(c: _Cfg) -> dict:
    return {
        "q_lora_rank": c.get("q_lora_rank"),
        "kv_lora_rank": c.req("kv_lora_rank"),
        "qk_nope_head_dim": c.req("qk_nope_head_dim"),
        "qk_rope_head_dim": c.req("qk_rope_head_dim"),
        "v_head_dim": c.req("v_head_dim"),
    }


def _mla_v4(c: _Cfg, head_dim: int, rope: int) -> dict:
    """V4/V4.1 attention: one head_dim-wide latent (its last ``rope`` dims roped) that is both K and V, no up-projection."""
    return {"q_lora_rank": c.req("q_lora_rank"), "kv_lora_rank": head_dim - rope, "qk_nope_head_dim": head_dim - rope,
            "qk_rope_head_dim": rope, "v_head_dim": head_dim, "kv_up_proj": False}


def _indexer_deepseek(c: _Cfg) -> dict:
    return {"n_heads": c.req("index_n_heads"), "head_dim": c.req("index_head_dim"), "topk": c.req("index_topk")}


def _moe_deepseek(c: _Cfg, n_experts_key: str = "n_routed_experts") -> dict:
    return {
        "n_routed_experts": c.req(n_experts_key),
        "n_shared_experts": c.get("n_shared_experts", 0),
        "top_k": c.req("num_experts_per_tok"),
        "moe_intermediate_size": c.req("moe_intermediate_size"),
        "first_k_dense": c.get("first_k_dense_replace", 0),
        "n_group": c.get("n_group", 1),
        "topk_group": c.get("topk_group", 1),
        # sigmoid + e_score_correction_bias is these families' router (HF modeling_deepseek_v3 / glm4_moe hard-code
        # it; transformers 5 no longer writes scoring_func into config.json)
        "scoring": c.get("scoring_func", "sigmoid"),
    }


def from_hf_config(cfg: dict, name: str = "model") -> ModelSpec:
    """Build a ModelSpec from a Hugging Face ``config.json`` mapping (DeepSeek-V3/V3.2/V4, Kimi-K2, Qwen3(-MoE), GLM-4.5, Llama)."""
    if not isinstance(cfg, dict):
        raise TwinferError(f"{name}: config.json must be a mapping")
    if "text_config" in cfg and "num_hidden_layers" not in cfg:  # multimodal wrappers keep the LM inside
        if not isinstance(cfg["text_config"], dict):
            raise TwinferError(f"{name}: config.json key 'text_config' must be a mapping (got {cfg['text_config']!r})")
        cfg = {**cfg["text_config"], "quantization_config": cfg.get("quantization_config")}
    _check_types(cfg, name)
    family = _family(cfg)
    c = _Cfg(cfg, name, family)
    hidden = c.req("hidden_size")
    heads = c.req("num_attention_heads")
    layers = c.req("num_hidden_layers")
    spec: dict = {
        "name": name,
        "family": family,
        "num_layers": layers,
        "hidden_size": hidden,
        "vocab_size": c.req("vocab_size"),
        "num_attention_heads": heads,
        "max_context": c.get("max_position_embeddings", 131072),
        "rope_theta": c.get("rope_theta", 10000.0),
        "rms_norm_eps": c.get("rms_norm_eps", 1e-6),
        "tie_word_embeddings": bool(c.get("tie_word_embeddings", False)),
        "mtp_layers": c.get("num_nextn_predict_layers", 0),
        "checkpoint_dtype": _quant_dtype(cfg),
    }
    if family in ("deepseek_v3", "kimi_k2", "deepseek_v32"):
        spec.update(
            attention="mla",
            num_kv_heads=1,  # MLA caches one latent per token (config.json's num_key_value_heads is per-head K/V after up-projection)
            head_dim=c.req("qk_nope_head_dim") + c.req("qk_rope_head_dim"),
            intermediate_size=c.req("intermediate_size"),
            mla=_mla_deepseek(c),
            moe=_moe_deepseek(c),
        )
        if family == "deepseek_v32":
            spec["indexer"] = _indexer_deepseek(c)
    elif family == "deepseek_v4":
        head_dim, rope = c.req("head_dim"), c.req("qk_rope_head_dim")
        ratios = _compress_ratios(c, layers, _KIND_BY_RATIO, "")
        spec.update(
            attention="mla",
            num_kv_heads=c.get("num_key_value_heads", 1),
            head_dim=head_dim,
            intermediate_size=c.get("intermediate_size", c.req("moe_intermediate_size")),
            mla=_mla_v4(c, head_dim, rope),
            indexer=_indexer_deepseek(c),
            moe=_moe_deepseek(c),
            layer_kinds=[_KIND_BY_RATIO[r] for r in ratios],
            sliding_window=c.req("sliding_window"),
            compress_ratio={"csa": 4, "hca": 128},
            window_in_compressed_layers=True,
            o_lora_rank=c.get("o_lora_rank"),
            o_groups=c.get("o_groups", 1),
            hc_mult=c.get("hc_mult", 1),
            hc_sinkhorn_iters=c.get("hc_sinkhorn_iters", 20),
            checkpoint_expert_dtype=str(c.get("expert_dtype", spec["checkpoint_dtype"])),
            default_kv_dtype="fp4",
        )
    elif family == "deepseek_v41":
        spec.update(_deepseek_v41(c, layers))
    elif family == "glm4_moe":
        spec.update(
            attention="gqa",
            num_kv_heads=c.req("num_key_value_heads"),
            head_dim=c.get("head_dim", hidden // heads),
            intermediate_size=c.req("intermediate_size"),
            moe=_moe_deepseek(c),
        )
    elif family == "qwen3_moe":
        sparse_step = c.get("decoder_sparse_step", 1)
        mlp_only = c.get("mlp_only_layers", [])
        if sparse_step != 1 or mlp_only:
            raise TwinferError(f"{name}: interleaved dense/MoE layers (decoder_sparse_step={sparse_step}, mlp_only_layers={mlp_only}) are not modelled")
        spec.update(
            attention="gqa",
            num_kv_heads=c.req("num_key_value_heads"),
            head_dim=c.get("head_dim", hidden // heads),
            intermediate_size=c.req("intermediate_size"),
            moe={"n_routed_experts": c.req("num_experts" if "num_experts" in cfg else "num_local_experts"),  # transformers 5 name
                 "n_shared_experts": 0, "top_k": c.req("num_experts_per_tok"),
                 "moe_intermediate_size": c.req("moe_intermediate_size"), "scoring": "softmax"},
        )
    else:  # llama, qwen3 (dense GQA)
        spec.update(
            attention="gqa",
            num_kv_heads=c.get("num_key_value_heads", heads),
            head_dim=c.get("head_dim", hidden // heads),
            intermediate_size=c.req("intermediate_size"),
        )
    if cfg.get("torch_dtype") == "float32":
        spec["checkpoint_dtype"] = "bf16"
    return validate(ModelSpec, spec, f"{name} (from config.json)")


def _v41_kv_sources(c: _Cfg, ratios: list[int], layers: int) -> list[int | None]:
    """Per layer, the KV source it reads (CSA2): the nearest ``kv_source_layer_ids`` entry at or below it of its own
    ratio; sources and sliding-window layers store their own (null)."""
    sources = sorted(int(x) for x in c.req("kv_source_layer_ids"))
    for j in sources:
        if not 0 <= j < layers or ratios[j] == 0:
            raise TwinferError(f"{c.name}: kv_source_layer_ids entry {j} is not a compressed layer of 0..{layers - 1}")
    out: list[int | None] = []
    for i, r in enumerate(ratios):
        below = [j for j in sources if j <= i and ratios[j] == r]
        if r == 0 or i in sources:
            out.append(None)
        elif not below:
            raise TwinferError(f"{c.name}: layer {i} (compress ratio {r}) has no kv_source_layer_ids entry of that ratio at or below it")
        else:
            out.append(below[-1])
    return out


def _compress_ratios(c: _Cfg, layers: int, kinds: dict[int, str], family: str) -> list[int]:
    """config.json's ``compress_ratios`` for the first ``layers`` layers, each one of ``kinds`` (field-named errors)."""
    ratios = [int(r) for r in c.req("compress_ratios")][:layers]
    if len(ratios) < layers:
        raise TwinferError(f"{c.name}: compress_ratios has {len(ratios)} entries, num_hidden_layers is {layers}")
    unknown = sorted({r for r in ratios if r not in kinds})
    if unknown:
        allowed = ", ".join(f"{r} {k}" for r, k in kinds.items())
        raise TwinferError(f"{c.name}: compress_ratios values {unknown} not supported{family} (allowed: {allowed})")
    return ratios


def _deepseek_v41(c: _Cfg, layers: int) -> dict:
    """The ModelSpec fields of a DeepSeek-V4.1 config.json (CSA2 KV sources, index sources, CED split, Engram tables)."""
    head_dim, rope = c.req("head_dim"), c.req("qk_rope_head_dim")
    ratios = _compress_ratios(c, layers, _V41_KIND_BY_RATIO, " for deepseek_v41")
    kv_src = _v41_kv_sources(c, ratios, layers)
    # CED: the decoder starts after the last KV source's layer group begins at the midpoint; the prefill tail of
    # layers past it needs no global KV of its own (vLLM RFC 57738: encoder L0-L19, decoder L20-L39)
    ced = c.get("ced_encoder_layers", max(int(x) for x in c.req("kv_source_layer_ids")))
    rows = [int(x) for x in c.get("engram_num_embeddings", [])]
    e_dim = c.get("engram_head_dim", 0)
    row_bytes = e_dim + math.ceil(e_dim / _ENGRAM_SCALE_GROUP) if e_dim else 0
    lookups = len(rows) * max(c.get("engram_max_ngram_size", 1) - 1, 0) * c.get("engram_n_heads", 0)
    return dict(
        attention="mla",
        num_kv_heads=c.get("num_key_value_heads", 1),
        head_dim=head_dim,
        intermediate_size=c.get("intermediate_size", c.req("moe_intermediate_size")),
        mla=_mla_v4(c, head_dim, rope),
        indexer={**_indexer_deepseek(c), "kv_dtype": c.get("index_kv_dtype", "fp4")},
        moe=_moe_deepseek(c),
        layer_kinds=[_V41_KIND_BY_RATIO[r] for r in ratios],
        sliding_window=c.req("sliding_window"),
        compress_ratio={"csa": 2, "sparse": 1},
        window_in_compressed_layers=True,
        kv_share_source=kv_src,
        index_source_layers=sorted(int(x) for x in c.get("index_source_layer_ids", [])) or None,
        ced_encoder_layers=ced or None,
        index_candidate_source=c.get("candidate_source_layer_id") if c.get("candidate_topk_blocks") else None,
        index_candidate_tokens=(c.get("candidate_topk_blocks", 0) * c.get("candidate_block_size", 1)) or None,
        o_lora_rank=c.get("o_lora_rank"),
        o_groups=c.get("o_groups", 1),
        hc_mult=c.get("hc_mult", 1),
        hc_sinkhorn_iters=c.get("hc_sinkhorn_iters", 20),
        checkpoint_expert_dtype=str(c.get("expert_dtype", (c.get("quantization_config", {}) or {}).get("expert_dtype", "fp4"))),
        default_kv_dtype="fp4",
        kv_fp4_format="nvfp4",
        host_table_bytes=float(sum(rows) * row_bytes),
        host_table_bytes_per_token=float(lookups * row_bytes),
    )


@functools.lru_cache(maxsize=1)
def _entries() -> dict[str, dict]:
    """name -> raw entry, read once from the package data."""
    out: dict[str, dict] = {}
    folder = resources.files("costmodels").joinpath("data/models")
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if item.name.endswith(".json"):
            out[item.name[:-5]] = json.loads(item.read_text(encoding="utf-8"))
        elif item.name.endswith(".yaml"):
            out[item.name[:-5]] = yaml.safe_load(item.read_text(encoding="utf-8"))
    return out


def _aliases() -> dict[str, str]:
    out = {}
    for name, e in _entries().items():
        out[name] = name
        for a in e.get("aliases", []):
            out[a.lower()] = name
    return out


@functools.lru_cache(maxsize=64)
def _build(name: str) -> ModelSpec:
    e = _entries()[name]
    if "spec" in e:
        return validate(ModelSpec, e["spec"], f"costmodels/data/models/{name}.yaml")
    spec = from_hf_config(e["hf_config"], name)
    return spec.model_copy(update={"sources": list(e.get("sources", [])), "assumptions": list(e.get("assumptions", []))})


def list_models() -> list[str]:
    """Catalog names (aliases not included)."""
    return sorted(_entries())


def model_aliases() -> dict[str, str]:
    """alias -> catalog name (every name maps to itself)."""
    return dict(_aliases())


def get_model(name_or_path: str | ModelSpec) -> ModelSpec:
    """A catalog model (case-insensitive name or alias), an HF ``config.json`` (or a folder holding one), or a ModelSpec YAML/JSON."""
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    key = str(name_or_path).strip()
    aliases = _aliases()
    if key.lower() in aliases:
        return _build(aliases[key.lower()]).model_copy(deep=True)
    p = Path(key)
    if key and is_dir(p):   # ('' is no folder: Path('') is the working directory)
        if not is_file(p / "config.json"):
            raise TwinferError(f"{p}: folder has no config.json")
        p = p / "config.json"
    if is_file(p):
        data = read_mapping(p)
        if "model_type" in data or "architectures" in data:
            stem = p.parent.name if p.name == "config.json" else p.stem
            return from_hf_config(data, stem or "model")
        return load_model_file(ModelSpec, p)
    if key.lower().endswith((".json", ".yaml", ".yml")) or "/" in key:
        raise TwinferError(f"{key}: no such file")
    err = UnknownNameError("model", key, list_models())
    err.args = (f"{err.args[0]}; or an HF config.json (or its folder) or a ModelSpec YAML (twinfer model --show NAME prints one)",)
    raise err
