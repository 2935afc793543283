"""Build a model on a device and fill it: HF safetensors checkpoints or seeded random weights.

Internal parameter names mirror HF's except two places: routed experts are stacked
(``mlp.experts.w13`` / ``w2`` instead of ``mlp.experts.{e}.gate_proj/up_proj/down_proj``)
and DeepSeek's MTP layer ``model.layers.{L+j}`` lives under ``mtp.{j}`` (its decoder parts
under ``mtp.{j}.block``). FP8 checkpoints (``weight`` + ``weight_scale_inv``) load as FP8
when the model runs FP8, else dequantised; BF16 checkpoints are quantised when it runs FP8.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import torch
from torch import nn

from executor import safetensors_io
from executor.memory_room import check_room
from executor.model_base import CausalLM
from executor.model_config import ExecModelConfig, spec_to_hf_config
from kernels import reference as ref
from twinfer.errors import TwinferError

# fp64 exists for exact CPU equivalence tests (chunked vs one-shot forward must pick identical tokens)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp8": torch.bfloat16, "fp64": torch.float64}
_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(w13|w2)(_scale_inv)?$")
_MTP_OWN = ("enorm", "hnorm", "eh_proj", "shared_head")


def build_model(cfg: ExecModelConfig, device: str | torch.device, dtype: str = "bf16", load_format: str = "dummy",
                seed: int = 0, routing_skew: float = 0.0, max_pos: int | None = None) -> CausalLM:
    """Instantiate the family's model on ``device`` and load or randomise its weights."""
    from executor.model_deepseek import DeepseekV3ForCausalLM
    from executor.model_llama import LlamaForCausalLM

    if dtype not in DTYPES:
        raise TwinferError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    fp8 = dtype == "fp8"
    cls = DeepseekV3ForCausalLM if cfg.is_deepseek else LlamaForCausalLM
    with torch.device("meta"):
        model = cls(cfg, fp8=fp8)
    # to_empty allocates every tensor at its meta dtype (fp32 before the cast below): the build's peak
    peak = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    check_room(peak, device, f"{cfg.spec.name} ({cfg.spec.num_layers} layers) in {dtype} on the CPU: the weights need",
               "keep fewer layers (--num-layers), take a smaller model (tiny) or run on a GPU (--device cuda)")
    model = model.to_empty(device=device)
    act = DTYPES[dtype]
    for name, p in model.named_parameters():
        if p.dtype == torch.float32 and not name.endswith(("_scale_inv", "e_score_correction_bias")):
            p.data = p.data.to(act)
    for mod in model.modules():  # buffers come out of to_empty uninitialised
        if hasattr(mod, "router_bias"):
            mod.router_bias = torch.zeros_like(mod.router_bias, dtype=torch.float32)
    if load_format == "dummy":
        init_dummy(model, seed, routing_skew)
    elif load_format in ("auto", "safetensors"):
        if cfg.hf_dir is None:
            raise TwinferError("load_format 'auto' needs an HF checkpoint folder as the model")
        load_hf(model, cfg.hf_dir)
    else:
        raise TwinferError(f"load_format {load_format!r}: expected 'dummy' or 'auto'")
    model.setup_rope(max_pos or cfg.spec.max_context)
    return model.eval()


# ----------------------------------------------------------------------------- name mapping

def hf_names(model: CausalLM) -> dict[str, list[tuple[str, tuple | None]]]:
    """Internal parameter name -> [(HF name, (expert, row0, row1) or None)]."""
    n_layers = model.cfg.spec.num_layers
    out: dict[str, list[tuple[str, tuple | None]]] = {}
    for name, p in model.named_parameters():
        hf = name
        m = re.match(r"^mtp\.(\d+)\.(.*)$", name)
        if m:
            j, rest = int(m.group(1)), m.group(2)
            rest = rest[len("block."):] if rest.startswith("block.") else rest
            hf = f"model.layers.{n_layers + j}.{rest}"
        e = _EXPERT.match(hf)
        if not e:
            out[name] = [(hf, None)]
            continue
        prefix, which, scale = e.group(1), e.group(2), e.group(3) is not None
        suffix = "weight_scale_inv" if scale else "weight"
        rows = p.shape[1]
        entries = []
        for k in range(p.shape[0]):
            if which == "w13":
                entries.append((f"{prefix}.{k}.gate_proj.{suffix}", (k, 0, rows // 2)))
                entries.append((f"{prefix}.{k}.up_proj.{suffix}", (k, rows // 2, rows)))
            else:
                entries.append((f"{prefix}.{k}.down_proj.{suffix}", (k, 0, rows)))
        out[name] = entries
    return out


def _view(p: torch.Tensor, sl: tuple | None) -> torch.Tensor:
    return p.data if sl is None else p.data[sl[0], sl[1]:sl[2]]


def _scale_name(name: str) -> str:
    return name[: -len("weight")] + "weight_scale_inv" if name.endswith("weight") else name + "_scale_inv"


# ----------------------------------------------------------------------------- loading

def checkpoint_files(hf_dir: str | Path) -> list[Path]:
    """The shards named by ``model.safetensors.index.json`` (HF's sharded layout), else every ``*.safetensors``.

    With an index, a listed shard that is missing is an error naming it (a partial download would
    otherwise surface as a long list of parameters without tensors), and stray files are ignored.
    """
    d = Path(hf_dir)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise TwinferError(f"{index}: expected a JSON object with a 'weight_map' of tensor name -> shard file") from None
        missing = [n for n in names if not (d / n).is_file()]
        if missing:
            raise TwinferError(f"{index} lists {len(missing)} shard(s) not in the folder, e.g. {missing[0]}")
        return [d / n for n in names]
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise TwinferError(f"{hf_dir}: no *.safetensors files")
    return files


@torch.no_grad()
def load_hf(model: CausalLM, hf_dir: str | Path) -> None:
    """Fill ``model`` from ``hf_dir/*.safetensors``; raises if a parameter gets no tensor."""
    files = checkpoint_files(hf_dir)
    params = dict(model.named_parameters())
    target: dict[str, tuple[str, tuple | None]] = {}
    for iname, entries in hf_names(model).items():
        for hf, sl in entries:
            target[hf] = (iname, sl)
    filled: set[tuple[str, tuple | None]] = set()
    pending_w: dict[str, torch.Tensor] = {}   # fp8 checkpoint weights waiting for their scale
    pending_s: dict[str, torch.Tensor] = {}
    unused: list[str] = []                    # tensors of modelled layers the executor has no parameter for

    def put(hf: str, t: torch.Tensor) -> None:
        iname, sl = target[hf]
        p = params[iname]
        dst = _view(p, sl)
        if p.dtype == torch.float8_e4m3fn and t.dtype != torch.float8_e4m3fn:
            q, s = ref.quant_fp8_weight(t.float())
            dst.copy_(q.to(dst.device))
            sname = _scale_name(iname)
            ssl = None if sl is None else (sl[0], sl[1] // ref.FP8_BLOCK, (sl[2] + ref.FP8_BLOCK - 1) // ref.FP8_BLOCK)
            _view(params[sname], ssl).copy_(s.to(dst.device))
            filled.add((sname, ssl))
        else:
            if dst.shape != t.shape:
                raise TwinferError(f"{hf}: checkpoint shape {tuple(t.shape)} != model shape {tuple(dst.shape)}")
            dst.copy_(t.to(dst.dtype).to(dst.device))
        filled.add((iname, sl))

    for f in files:
        for hf, t in safetensors_io.iter_tensors(f):
            is_scale = hf.endswith("weight_scale_inv")
            base = hf[: -len("_scale_inv")] if is_scale else hf
            wants_fp8 = base in target and params[target[base][0]].dtype == torch.float8_e4m3fn
            if is_scale and not wants_fp8:
                pending_s[base] = t          # dequantise the weight with it
            elif not is_scale and t.dtype == torch.float8_e4m3fn and not wants_fp8:
                pending_w[hf] = t
            elif hf in target:
                put(hf, t)
            elif _in_model(hf, model.cfg.spec.num_layers):
                unused.append(hf)
            for w in [w for w in pending_w if w in pending_s]:
                if w in target:
                    put(w, ref.dequant_fp8_weight(pending_w[w], pending_s[w].float()))
                del pending_w[w], pending_s[w]
    expected = {(n, sl) for n, es in hf_names(model).items() for _, sl in es}
    missing = sorted({n for n, _ in expected - filled})
    if missing:
        raise TwinferError(f"{hf_dir}: no checkpoint tensor for {len(missing)} parameters, e.g. {', '.join(missing[:5])}")
    unused += [w for w in pending_w if _in_model(w, model.cfg.spec.num_layers)]   # fp8 weights whose scale never came
    if unused:
        raise TwinferError(f"{hf_dir}: {len(unused)} checkpoint tensors have no place in the executor's model (a mechanism "
                           f"it does not compute, or a config.json that disagrees with the weights), e.g. {', '.join(sorted(unused)[:5])}")


def _in_model(hf_name: str, num_layers: int) -> bool:
    """Whether a checkpoint tensor belongs to what the model computes: layers past ``num_layers`` (MTP, or a stack
    cut short with ``num_layers``) are loaded by name or skipped; rotary caches are recomputed."""
    if hf_name.endswith("rotary_emb.inv_freq"):
        return False
    m = re.match(r"^model\.layers\.(\d+)\.", hf_name)
    return m is None or int(m.group(1)) < num_layers


@torch.no_grad()
def save_hf(model: CausalLM, out_dir: str | Path) -> None:
    """Write ``model`` as an HF-style checkpoint (config.json + model.safetensors)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    params = dict(model.named_parameters())
    tensors = {}
    for iname, entries in hf_names(model).items():
        for hf, sl in entries:
            tensors[hf] = _view(params[iname], sl).clone()
    safetensors_io.save_file(tensors, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(spec_to_hf_config(model.cfg), indent=1))


# ----------------------------------------------------------------------------- dummy weights

def _seed_for(seed: int, name: str) -> int:
    """Stable per-parameter seed: weights do not depend on construction order (no hash())."""
    return int.from_bytes(hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest(), "little") & (2**62 - 1)


@torch.no_grad()
def init_dummy(model: CausalLM, seed: int = 0, routing_skew: float = 0.0) -> None:
    """Seeded random weights scaled to keep activations O(1); norms 1, biases 0.

    ``routing_skew`` >= 0 biases router logits by ``-skew * ln(1 + rank)`` over a seeded
    permutation of experts: 0 routes uniformly, ~1 gives a Zipf-like hot-expert load.
    """
    params = dict(model.named_parameters())
    for name, p in params.items():
        if name.endswith("_scale_inv"):
            continue
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "bias" or name.endswith("e_score_correction_bias"):
            p.data.zero_()
            continue
        if p.dim() == 1:  # norm scales
            p.data.fill_(1.0)
            continue
        g = torch.Generator(device=p.device).manual_seed(_seed_for(seed, name))
        std = 1.0 if "embed_tokens" in name else 1.0 / math.sqrt(p.shape[-1])
        # one 2-D slice at a time (an expert's matrix): float32 temporaries stay small on big models
        views = [p.data] if p.dim() == 2 else list(p.data.view(-1, p.shape[-2], p.shape[-1]))
        scales = None
        if p.dtype == torch.float8_e4m3fn:
            s = params[_scale_name(name)].data
            scales = [s] if s.dim() == 2 else list(s.view(-1, s.shape[-2], s.shape[-1]))
        for i, dst in enumerate(views):
            w = torch.randn(dst.shape, generator=g, device=p.device, dtype=torch.float32) * std
            if scales is not None:
                q, sc = ref.quant_fp8_weight(w)
                dst.copy_(q)
                scales[i].copy_(sc)
            else:
                dst.copy_(w.to(p.dtype))
    set_routing_skew(model, seed, routing_skew)


def set_routing_skew(model: nn.Module, seed: int, skew: float) -> None:
    """Set every MoE layer's router bias for a Zipf-like expert popularity (0: none)."""
    from executor.moe import MoE
    for i, mod in enumerate(m for m in model.modules() if isinstance(m, MoE)):
        n = mod.router_bias.numel()
        g = torch.Generator().manual_seed(_seed_for(seed, f"skew{i}"))
        rank = torch.empty(n, dtype=torch.float32)
        rank[torch.randperm(n, generator=g)] = torch.arange(n, dtype=torch.float32)
        mod.router_bias.copy_((-skew * torch.log1p(rank)).to(mod.router_bias.device))
