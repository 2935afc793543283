"""The sidebar: what the planner asks (model, hardware, budget or traffic, workload, SLO, prices).

``render()`` returns a ``ui.service.PlanRequest`` mapping, or None when an input is invalid
(the error is already shown next to the input that caused it).
"""

from __future__ import annotations

import os

import streamlit as st

from planner.slo import EXAMPLE, parse_slo
from twinfer.errors import TwinferError
from ui import app_cache, app_uploads, service

UPLOAD = "upload…"
CUSTOM_FORM = "custom (form)"
_MB = app_uploads.MAX_UPLOAD_BYTES // 2**20


def _upload(label: str, key: str, types: list[str], save) -> str | None:
    """A file uploader whose file is validated by ``save(name, bytes)``; errors shown in place."""
    f = st.file_uploader(f"{label} (≤ {_MB} MB)", type=types, key=key)
    if f is None:
        st.info(f"upload a {label} to continue")
        return None
    try:
        return save(f.name, f.getvalue())
    except TwinferError as e:
        st.error(f"{f.name}: {e}" if f.name not in str(e) else str(e))
        return None


def _model() -> str | None:
    names = service.model_names()
    choice = st.selectbox("Model", names + [UPLOAD], index=names.index("deepseek-v3") if "deepseek-v3" in names else 0,
                          key="model", help="a catalog model, or a Hugging Face config.json")
    if choice != UPLOAD:
        return choice
    return _upload("config.json", "model_upload", ["json"], app_uploads.save_model_config)


def _hardware_form() -> str | None:
    """A GPU described field by field, starting from a catalog GPU's numbers.

    A form: the search runs once on "Use this GPU", not after every field edited.
    """
    start = st.selectbox("start from", service.hardware_names(), key="hw_base")
    base = app_cache.hardware_info(start)
    with st.form("hw_form"):
        # every catalog field of the GPU it starts from (host memory and link, SM count, exp rate ...), the form's on top:
        # a field the form does not show keeps the catalog's value, not the schema's default (host memory 0)
        fields = {**{k: v for k, v in base.items() if k not in ("name", "sources", "notes")},
                  "name": st.text_input("name", "custom-gpu", key="hw_name"), "sources": [f"custom (form), from the {start} catalog entry"]}
        for k, label in (("bf16_tflops", "BF16 TFLOP/s"), ("fp8_tflops", "FP8 TFLOP/s"), ("hbm_gb", "HBM GiB (a vendor's '141 GB')"),
                         ("hbm_tbps", "HBM TB/s"), ("scaleup_gbps", "scale-up GB/s per direction"),
                         ("scaleout_gbps", "scale-out Gbit/s"), ("host_mem_gb", "host memory GB per GPU"),
                         ("host_link_gbps", "host link GB/s per direction"), ("price_per_gpu_hour", "$ per GPU-hour")):
            fields[k] = st.number_input(label, value=float(base[k] or 0), min_value=0.0, key=f"hw_{k}")
        if fields["hbm_gb"] != float(base["hbm_gb"] or 0):   # an HBM typed in is the one the fit sizes
            fields.pop("hbm_visible_gb", None)
        fp4 = st.number_input("FP4 TFLOP/s (0: none)", value=float(base["fp4_tflops"] or 0), min_value=0.0, key="hw_fp4")
        fields["fp4_tflops"] = fp4 or None
        fields["scaleup_domain"] = int(st.number_input("GPUs per scale-up domain", value=int(base["scaleup_domain"]), min_value=1, key="hw_domain"))
        used = st.form_submit_button("Use this GPU")
    if used:
        st.session_state["hw_form_used"] = True
    if not st.session_state.get("hw_form_used"):
        st.info("fill in the GPU and press **Use this GPU**")
        return None
    try:
        return app_uploads.save_hardware_mapping(fields, "custom GPU")
    except TwinferError as e:
        st.error(str(e))
        return None


def _hardware() -> str | None:
    names = service.hardware_names()
    choice = st.selectbox("Hardware", names + [UPLOAD, CUSTOM_FORM], index=names.index("H200") if "H200" in names else 0,
                          key="hardware", help="a catalog GPU, a hardware YAML (the catalog's fields), or the form")
    if choice == UPLOAD:
        return _upload("hardware YAML", "hw_upload", ["yaml", "yml", "json"], app_uploads.save_hardware_yaml)
    if choice == CUSTOM_FORM:
        return _hardware_form()
    return choice


def _workload() -> dict | None:
    presets = service.workload_presets()
    choice = st.selectbox("Workload", presets + [UPLOAD], key="workload", help="a preset, or a trace (twinfer JSONL or Mooncake)")
    if choice != UPLOAD:
        return {"preset": choice}
    fmt = st.radio("trace format", ["jsonl", "mooncake"], horizontal=True, key="trace_format")
    path = _upload("trace", "trace_upload", ["jsonl", "json", "txt"], lambda n, b: app_uploads.save_trace(n, b, fmt))
    return {"kind": "trace", "trace_path": path, "trace_format": fmt} if path else None


def _given(value: float, default: float) -> float | None:
    """A price the user set (None: left at its default)."""
    return None if float(value) == float(default) else float(value)


def render() -> dict | None:
    """Draw the sidebar; the PlanRequest mapping, or None if something is invalid."""
    with st.sidebar:
        st.header("What to plan")
        model = _model()
        hardware = _hardware()
        mode = st.radio("Size by", ["GPU budget", "target traffic"], horizontal=True, key="mode")
        gpus, rate = 8, 5.0
        if mode == "GPU budget":
            gpus = int(st.number_input("GPU budget", min_value=1, max_value=100_000, value=8, step=8, key="gpus"))
        else:
            rate = float(st.number_input("target requests/s", min_value=0.1, max_value=1e5, value=5.0, key="rate"))
        workload = _workload()
        st.header("SLO")
        slo_text = st.text_input("latency targets", value=EXAMPLE, key="slo",
                                 help="the syntax of twinfer plan --slo: each target with its percentile (p50, p90, p99) "
                                      "and a unit (s, ms, us), e.g. ttft_p99=3s,tpot_p99=40ms")
        try:
            slo = parse_slo(slo_text, "SLO")
        except TwinferError as e:
            st.error(str(e))
            slo = None
        st.header("Prices")
        catalog_price = app_cache.hardware_info(hardware)["price_per_gpu_hour"] if hardware else 0.0
        price = st.number_input("$ per GPU-hour", min_value=0.0, value=float(catalog_price), key=f"price_{hardware}",
                                help="defaults to the hardware catalog's all-in TCO estimate")
        tp = app_cache.default_token_prices()
        with st.expander("revenue: token prices ($ per million)"):
            p_in = st.number_input("input", min_value=0.0, value=float(tp["input"]), key="p_in", help="prompt tokens not cached")
            p_cached = st.number_input("cached input", min_value=0.0, value=float(tp["cached_input"]), key="p_cached")
            p_out = st.number_input("output", min_value=0.0, value=float(tp["output"]), key="p_out")
            st.caption("defaults: DeepSeek API list prices for DeepSeek-V3 (planner/request.py)")
        with st.expander("search settings"):
            sim_top = st.slider("candidates simulated", 0, 16, 4, key="sim_top",
                                help="after the analytic screen; 0: the screen decides (fastest)")
            sim_requests = st.slider("most requests per simulation", 100, 5000, 1000, 100, key="sim_requests",
                                     help="per candidate's slice; more: steadier figures, slower search (the plan's "
                                     "full-scale run takes what its rate and seats need)")
            workers = st.number_input("worker processes", 1, max(1, os.cpu_count() or 1), 1, key="workers",
                                      help="parallel planner jobs (forked); results do not depend on it")
    if not (model and hardware and workload and slo):
        return None
    return {"model": model, "hardware": hardware, "mode": "budget" if mode == "GPU budget" else "traffic",
            "gpus": gpus, "target_rate": rate, "workload": workload, "ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "e2e_s": slo.e2e_s,
            "slo_percentile": slo.percentile,
            # a price left at its default goes as None: the plan then says where it comes from (the catalog's TCO
            # estimate, the list prices), as `twinfer plan` without --gpu-hour does, instead of "user"
            "price_per_gpu_hour": _given(price, catalog_price), "price_per_m_input": _given(p_in, tp["input"]),
            "price_per_m_cached_input": _given(p_cached, tp["cached_input"]), "price_per_m_output": _given(p_out, tp["output"]),
            "simulate_top": int(sim_top), "sim_requests": int(sim_requests), "workers": int(workers)}
