"""Which calibration a cost model runs on, and where each of its efficiencies comes from.

In order of precedence:

1. a calibration profile file (``--calibration profile.json`` or a scenario's ``calibration:``),
   used as written (``twinfer calibrate`` makes one);
2. the hardware's own ``measured:`` block: each ceiling it gives (copy bandwidth, BF16/FP8 matmul,
   one small GEMM) replaces the H200-derived efficiency of the same name;
3. :meth:`CalibrationProfile.default`: efficiencies measured on the project's H200, applied to
   this GPU's datasheet peaks.

Every profile returned carries notes that say, per efficiency, which of these it came from.
"""

from __future__ import annotations

from pathlib import Path

from twinfer.errors import TwinferError

from costmodels.calibration import CalibrationProfile, fp4_reference, host_speed_note
from costmodels.hardware import Hardware, MeasuredCeilings, get_hardware

# measured-block fields the defaults only read from the H200 (shape fits of one kernel library)
_H200_ONLY = ("flashmla_decode", "deepgemm_masked_grouped")


def profile_for(hw: Hardware, path: str | Path | None = None) -> CalibrationProfile:
    """The calibration for ``hw``: the profile at ``path``, else ``hw.measured`` over the defaults, else the defaults."""
    if path is not None:
        return _from_file(hw, path)
    if hw.measured is None or hw.measured == get_hardware("H200").measured:
        return CalibrationProfile.default(hw)
    return _from_measured(hw, hw.measured)


def _from_file(hw: Hardware, path: str | Path) -> CalibrationProfile:
    """A profile file, with a note naming it (and the GPU it was measured on) as every efficiency's source."""
    cal = CalibrationProfile.load(path)
    if cal.measured_on.strip().lower() == "cpu":
        # a CPU executor's kernels (the tiny model's CI path) say nothing of a GPU's: its efficiencies on a GPU's
        # ceilings priced DeepSeek-V3 on 8 x H200 at a 26-minute TTFT
        raise TwinferError(f"--calibration {path}: measured on a CPU (the executor's torch reference path); its "
                           f"efficiencies are not {hw.name}'s: calibrate on the GPU (twinfer calibrate --device cuda), or "
                           "leave --calibration out for the catalog's")
    line = f"efficiencies from calibration profile {path} (measured on {cal.measured_on}{', ' + cal.created if cal.created else ''})"
    if cal.measured_on.lower() != hw.name.lower():
        line += f"; applied to {hw.name} datasheet ceilings (scaled by datasheet ratios)"
    if cal.op_table_libs.get("fp8_gemm"):
        lib = cal.op_table_libs["fp8_gemm"]
        line += f"; dense FP8 GEMMs priced from the op tables' {lib} rows (the kernel library of the engine it measured)"
    moving = host_speed_note((cal.provenance or {}).get("host_probe_s")) if cal.step is not None else None
    # second, so that the lines simulate prints show it: the step model's host terms came from a moving host
    return cal.model_copy(update={"notes": [line] + ([moving] if moving else []) + list(cal.notes)})


def _ratio(value: float, peak: float, field: str, peak_field: str, hw: Hardware) -> float:
    eff = value / peak
    if not 0 < eff <= 1:
        raise TwinferError(f"{hw.name}: measured.{field}={value:g} exceeds {peak_field}={peak:g}: a measurement cannot beat the peak")
    return eff


def _from_measured(hw: Hardware, m: MeasuredCeilings) -> CalibrationProfile:
    """The H200-derived defaults with each efficiency ``m`` measures replaced, and notes that say which is which."""
    base = CalibrationProfile.default(hw)
    src = f"{hw.name} measured block" + (f" ({m.source})" if m.source else "")
    upd: dict = {"measured_on": hw.name, "source": m.source or f"{hw.name} measured block"}
    notes: list[str] = []
    mem_eff = base.mem_eff
    if m.copy_tbps is not None:
        mem_eff = _ratio(m.copy_tbps, hw.hbm_tbps, "copy_tbps", "hbm_tbps", hw)
        upd["mem_eff"] = mem_eff
        notes.append(f"HBM streaming {mem_eff:.3f} of peak: {src}, copy {m.copy_tbps:g} TB/s")
    else:
        notes.append(f"HBM streaming {mem_eff:.3f} of peak: H200-derived default (measured.copy_tbps not given)")
    if m.small_gemm:
        upd["gemm_mem_half_bytes"] = _small_gemm_half(m.small_gemm, mem_eff, hw)
        notes.append(f"GEMM bandwidth ramp half-saturation {upd['gemm_mem_half_bytes'] / 1e6:.0f} MB: {src}, one small GEMM")
    else:
        notes.append(f"GEMM bandwidth ramp half-saturation {base.gemm_mem_half_bytes / 1e6:.0f} MB: H200-derived default")
    ceff = dict(base.gemm_compute_eff)
    peaks = {"bf16": hw.bf16_tflops, "fp8": hw.fp8_tflops if hw.has_fp8 else None, "fp4": hw.fp4_tflops}
    default = {"bf16": "H200-derived default", "fp8": "H200-derived default",
               "fp4": f"the catalog's FP4 GEMM ({fp4_reference()[1]})" if hw.fp4_tflops else ""}
    for dtype, value in (("bf16", m.bf16_matmul_tflops), ("fp8", max(m.fp8_matmul_tflops or 0, m.deepgemm_fp8_tflops or 0) or None),
                         ("fp4", m.fp4_matmul_tflops)):
        peak = peaks[dtype]
        if value is None:
            if peak:  # no line about a dtype this GPU cannot run
                notes.append(f"GEMM compute {dtype} {ceff[dtype]:.3f} of peak: {default[dtype]}")
            continue
        if not peak:
            raise TwinferError(f"{hw.name}: measured.{dtype}_matmul_tflops is set but {dtype}_tflops is not: give the "
                               f"{dtype.upper()} peak or drop the measurement")
        ceff[dtype] = _ratio(value, peak, f"{dtype}_matmul_tflops", f"{dtype}_tflops", hw)
        notes.append(f"GEMM compute {dtype} {ceff[dtype]:.3f} of peak: {src}, {value:g} TFLOP/s")
    upd["gemm_compute_eff"] = ceff
    ignored = [f for f in _H200_ONLY if getattr(m, f)]
    notes += [
        "attention math 0.586 of BF16 peak and decode-attention KV streaming table: H200-derived defaults (FlashMLA)",
        "comm efficiency 0.8, collective latencies and 3 us kernel launch: assumptions (defaults)",
    ]
    if ignored:
        notes.append(f"measured.{', measured.'.join(ignored)} not used: only the H200 defaults read them")
    upd["notes"] = notes
    return base.model_copy(update=upd)


def _small_gemm_half(sg: dict, mem_eff: float, hw: Hardware) -> float:
    """Half-saturation bytes of the GEMM bandwidth ramp from one memory-bound GEMM (as the defaults fit the H200)."""
    try:
        m, k, n, t = (float(sg[key]) for key in ("m", "k", "n", "time_us"))
    except (KeyError, TypeError, ValueError):
        raise TwinferError(f"{hw.name}: measured.small_gemm needs numbers m, k, n, time_us (got {sg!r})") from None
    width = {"bf16": 2.0, "fp8": 1.0}.get(str(sg.get("dtype", "bf16")), 2.0)
    w = width * (m * k + k * n + m * n)
    eff = w / (t * 1e-6) / hw.hbm_bw
    if not 0 < eff < mem_eff:
        raise TwinferError(f"{hw.name}: measured.small_gemm implies {eff:.2f} of peak HBM bandwidth, not below the copy efficiency {mem_eff:.2f}")
    return w * (mem_eff / eff - 1)
