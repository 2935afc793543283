"""Hardware catalog: per-GPU datasheet ceilings (dense rates) and, where we have them, measured ones.

The catalog lives in ``costmodels/data/hardware.yaml``; every entry names its sources. A user
describes their own GPU in a YAML file with the same fields (schema version ``SCHEMA_VERSION``,
documented in docs/byo.md; ``twinfer hardware --template`` prints a commented file to start from)
and passes its path wherever a hardware name is accepted. Features a GPU lacks are left out: no
FP8 tensor cores (``fp8_tflops`` omitted or 0), no FP4, no NVLink (``scaleup_gbps`` omitted or 0:
peers talk over the host link).
"""

from __future__ import annotations

import functools
import os
from importlib import resources
from pathlib import Path

from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from twinfer.config import exists, is_file, load_model_file, validate
from twinfer.errors import TwinferError, UnknownNameError

from costmodels.layout import DType

SCHEMA_VERSION = 1  # bump when a field changes meaning; files name the version they were written for


# the least a rate or bandwidth field may hold, and its unit: a thousandth or less of any datacenter GPU's (a T4 does
# 65 TFLOP/s FP16, 0.32 TB/s; PCIe 3.0 x16 16 GB/s; a 10 Gbit/s NIC; the catalog's H100 989 TFLOP/s BF16, 3.35 TB/s).
# Smaller is a typo or a unit slip, not a GPU: bf16_tflops 1e-300 priced a step at 2.8e300 s.
MINIMUM = {
    "bf16_tflops": (0.01, "TFLOP/s"), "fp8_tflops": (0.01, "TFLOP/s"), "fp4_tflops": (0.01, "TFLOP/s"),
    "tf32_tflops": (0.01, "TFLOP/s"), "sfu_exp_tera_per_s": (1e-3, "1e12 exponentials/s"), "hbm_tbps": (1e-4, "TB/s"),
    "scaleup_gbps": (0.01, "GB/s"), "scaleout_gbps": (0.01, "Gbit/s"), "host_link_gbps": (0.01, "GB/s"),
    "copy_tbps": (1e-4, "TB/s"), "bf16_matmul_tflops": (0.01, "TFLOP/s"), "fp8_matmul_tflops": (0.01, "TFLOP/s"),
    "fp4_matmul_tflops": (0.01, "TFLOP/s"), "deepgemm_fp8_tflops": (0.01, "TFLOP/s"),
}


def _at_least_minimum(v: float | None, info: ValidationInfo) -> float | None:
    """Refuse a positive rate below its ``MINIMUM``, naming the unit (0 and None mean absent where a field allows)."""
    lo, unit = MINIMUM[info.field_name]
    if v is not None and 0 < v < lo:
        raise ValueError(f"below the {lo:g} {unit} minimum (a thousandth or less of any datacenter GPU's): give the "
                         f"rate in {unit} (got {v:g})")
    return v


class MeasuredCeilings(BaseModel):
    """What a real GPU of this kind achieved (used as achievable ceilings by the calibration defaults)."""

    model_config = ConfigDict(extra="forbid")
    copy_tbps: float | None = Field(None, gt=0, le=1e3, description="device-to-device copy, read+write bytes, TB/s (sets HBM streaming efficiency)")
    bf16_matmul_tflops: float | None = Field(None, gt=0, le=1e6, description="large square BF16 matmul (e.g. 8192^3), TFLOP/s (sets BF16 GEMM efficiency)")
    fp8_matmul_tflops: float | None = Field(None, gt=0, le=1e6, description="large square FP8 matmul with row-wise scales, TFLOP/s (sets FP8 GEMM efficiency)")
    fp4_matmul_tflops: float | None = Field(None, gt=0, le=1e6, description="large FP4 GEMM (NVFP4/MXFP4 block scales, thousands of rows), "
                                            "TFLOP/s (sets FP4 GEMM efficiency)")
    small_gemm: dict | None = Field(None, description="one small-M GEMM: m, k, n, dtype, time_us (H200 defaults only)")
    flashmla_decode: list[dict] = Field(default_factory=list, description="MLA decode points: kv_bytes, tbps (H200 defaults only)")
    deepgemm_fp8_tflops: float | None = Field(None, gt=0, le=1e6, description="DeepGEMM FP8 GEMM, TFLOP/s (H200 defaults only)")
    deepgemm_masked_grouped: dict | None = Field(None, description="DeepGEMM masked grouped GEMM: experts, n, k, time_us (H200 defaults only)")
    source: str = Field("", description="where and how these were measured (printed as the source of each efficiency)")

    _minimum = field_validator("copy_tbps", "bf16_matmul_tflops", "fp8_matmul_tflops", "fp4_matmul_tflops",
                               "deepgemm_fp8_tflops")(_at_least_minimum)


# TF32 tensor-core rate over the BF16 one where a GPU gives no ``tf32_tflops``: NVIDIA's Hopper and Blackwell datasheets
# (H100/H200 SXM 494.7 of 989.4 TFLOP/s dense; B200 1.1 of 2.25 PFLOP/s)
TF32_OF_BF16 = 0.5


class Hardware(BaseModel):
    """One GPU model. Rates are dense (no structured sparsity), per GPU."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = Field(SCHEMA_VERSION, description="hardware file schema version (docs/byo.md)")
    name: str = Field(..., min_length=1, max_length=200, description="GPU name shown in output")
    vendor: str = Field("unknown", description="nvidia, amd, ...")
    bf16_tflops: float = Field(..., gt=0, le=1e6, description="dense BF16 tensor-core peak, TFLOP/s")
    fp8_tflops: float | None = Field(None, ge=0, le=1e6, description="dense FP8 peak, TFLOP/s; omit or 0: no FP8 tensor cores (A100, V100)")
    fp4_tflops: float | None = Field(None, ge=0, le=1e6, description="dense FP4 peak, TFLOP/s; omit or 0: no FP4 tensor cores (FP4 weights then run at the FP8 rate)")
    tf32_tflops: float | None = Field(
        None, gt=0, le=1e6,
        description="dense rate of tensor-core GEMMs on FP32 inputs (TF32), TFLOP/s: the mHC mixing projection's; omit: "
                    "half the BF16 peak, as on Hopper and Blackwell (a GPU without TF32 gives its FP32 matrix rate)",
    )
    sfu_exp_tera_per_s: float | None = Field(
        None, gt=0, le=1e4,
        description="softmax exponentials per second, 1e12/s (NVIDIA: MUFU.EX2 on the SFUs, SMs x ex2/clock/SM x clock); "
                    "omit: attention is priced without an exponential bound",
    )
    hbm_gb: float = Field(..., gt=0, le=1e5, description="HBM capacity as advertised, GB (taken as GiB, see hbm_bytes)")
    hbm_visible_gb: float | None = Field(None, gt=0, le=1e5, description="HBM the driver lets CUDA see, where a source "
                                         "gives it below the advertised figure (GiB, as hbm_gb is taken): what the "
                                         "memory fit sizes; omit: hbm_gb")
    hbm_tbps: float = Field(..., gt=0, le=1e3, description="peak HBM bandwidth, TB/s")
    scaleup_gbps: float | None = Field(
        None, ge=0, le=1e5,
        description="scale-up link (NVLink/Infinity Fabric) GB/s per GPU per direction; omit or 0: no NVLink, peers talk over host_link_gbps (PCIe)",
    )
    scaleup_domain: int = Field(..., ge=1, le=100000, description="GPUs in one scale-up domain (NVLink island or PCIe node)")
    scaleout_gbps: float = Field(..., gt=0, le=1e5, description="scale-out NIC Gbit/s per GPU (InfiniBand/RoCE)")
    sm_count: int | None = Field(None, ge=1, le=100000, description="streaming multiprocessors per GPU (AMD: compute "
                                 "units); omit: the SMs communication kernels hold under overlap are not charged")
    host_mem_gb: float = Field(0.0, ge=0, le=1e6, description="host memory per GPU, GB")
    host_link_gbps: float = Field(64.0, gt=0, le=1e4, description="host<->GPU GB/s per direction (PCIe 4.0 x16 32, PCIe 5.0 x16 64, NVLink-C2C 225)")
    price_per_gpu_hour: float = Field(0.0, ge=0, le=1e4, description="all-in $ per GPU-hour (0: unknown, no $ figures)")
    sources: list[str] = Field(default_factory=list, description="where each number comes from")
    notes: str = Field("", description="caveats")
    measured: MeasuredCeilings | None = Field(None, description="what this GPU measured; used as achievable ceilings instead of the H200's")

    @field_validator("fp8_tflops", "fp4_tflops", "scaleup_gbps")
    @classmethod
    def _zero_is_absent(cls, v: float | None) -> float | None:
        """0 and null both say 'this GPU lacks the feature'."""
        return None if not v else v

    _minimum = field_validator("bf16_tflops", "fp8_tflops", "fp4_tflops", "tf32_tflops", "sfu_exp_tera_per_s", "hbm_tbps",
                               "scaleup_gbps", "scaleout_gbps", "host_link_gbps")(_at_least_minimum)

    @field_validator("hbm_visible_gb")
    @classmethod
    def _visible_within_capacity(cls, v: float | None, info: ValidationInfo) -> float | None:
        """The driver shows at most the HBM the card has."""
        cap = info.data.get("hbm_gb")
        if v is not None and cap is not None and v > cap:
            raise ValueError(f"hbm_visible_gb ({v:g}) is more than hbm_gb ({cap:g}): the driver shows at most the HBM "
                             "the card has; omit it, or give a value <= hbm_gb")
        return v

    @property
    def has_fp8(self) -> bool:
        return self.fp8_tflops is not None

    @property
    def has_scaleup(self) -> bool:
        """Whether GPUs of a domain talk over NVLink/IF (False: over the host link)."""
        return self.scaleup_gbps is not None

    def tflops(self, dtype: DType | str) -> float:
        """Dense peak TFLOP/s for GEMMs in ``dtype``.

        FP4 on hardware without FP4 tensor cores (Hopper) falls back to the FP8 rate: the
        weights are dequantised in the kernel and the math runs at the FP8 rate at best. FP8
        on hardware without FP8 is refused (``check_dtype``), never silently run at BF16.
        """
        if dtype == "bf16":
            return self.bf16_tflops
        if dtype not in ("fp8", "fp4"):
            raise TwinferError(f"unknown dtype {dtype!r}; allowed: bf16, fp8, fp4")
        self.check_dtype(dtype, "dtype")
        if dtype == "fp4" and self.fp4_tflops is not None:
            return self.fp4_tflops
        return self.fp8_tflops

    def math_dtype(self, dtype: str) -> str:
        """The dtype whose tensor-core rate, and so whose GEMM efficiency, a GEMM of ``dtype`` weights runs at: FP4
        without FP4 tensor cores (Hopper) runs FP8 math (``tflops``)."""
        return "fp8" if dtype == "fp4" and not self.fp4_tflops else dtype

    def supports(self, dtype: str) -> bool:
        """Whether the tensor cores run ``dtype`` natively."""
        if dtype == "fp8":
            return self.has_fp8
        return dtype != "fp4" or self.fp4_tflops is not None

    def runs(self, dtype: str) -> bool:
        """Whether weights in ``dtype`` can be multiplied here: natively, or FP4 at the FP8 rate."""
        return self.supports(dtype) or (dtype == "fp4" and self.has_fp8)

    def check_dtype(self, dtype: str, field: str) -> None:
        """Refuse a GEMM dtype this GPU cannot run, naming ``field`` and what is allowed."""
        if not self.runs(dtype):
            allowed = [d for d in ("bf16", "fp8", "fp4") if self.runs(d)]
            raise TwinferError(
                f"{field}: {dtype} needs {dtype.upper()} tensor cores and {self.name} has none "
                f"({dtype}_tflops is not set); allowed on {self.name}: {', '.join(allowed)}"
            )

    @property
    def hbm_bytes(self) -> float:
        """HBM capacity in bytes.

        Vendors' "80 GB" / "141 GB" are what CUDA reports in GiB (an H100 shows 81,559 MiB =
        79.6 GiB; an H200 143,771 MiB = 140.4 GiB), so the advertised figure is taken as GiB. Where a
        source gives what CUDA sees as less (Blackwell Ultra: 288 advertised, 279 visible on a GB300, 270
        on a B300), ``hbm_visible_gb``.
        """
        return (self.hbm_visible_gb or self.hbm_gb) * 2**30

    @property
    def tf32_rate(self) -> float:
        """Dense TF32 tensor-core peak, flop/s: ``tf32_tflops``, else ``TF32_OF_BF16`` of the BF16 peak."""
        return (self.tf32_tflops if self.tf32_tflops is not None else TF32_OF_BF16 * self.bf16_tflops) * 1e12

    @property
    def exp_rate(self) -> float | None:
        """Softmax exponentials per second (None: not given, no exponential bound on attention)."""
        return None if self.sfu_exp_tera_per_s is None else self.sfu_exp_tera_per_s * 1e12

    @property
    def hbm_bw(self) -> float:
        """Peak HBM bandwidth, bytes/s."""
        return self.hbm_tbps * 1e12

    @property
    def scaleup_bw(self) -> float:
        """Scale-up bytes/s per GPU per direction; without NVLink/IF, the host link (PCIe peer-to-peer)."""
        return (self.scaleup_gbps if self.scaleup_gbps is not None else self.host_link_gbps) * 1e9

    @property
    def scaleout_bw(self) -> float:
        """Scale-out bytes/s per GPU per direction (NIC Gbit/s / 8)."""
        return self.scaleout_gbps * 1e9 / 8

    @property
    def host_bw(self) -> float:
        """Host link bytes/s per direction."""
        return self.host_link_gbps * 1e9


@functools.lru_cache(maxsize=1)
def _catalog() -> dict[str, Hardware]:
    text = resources.files("costmodels").joinpath("data/hardware.yaml").read_text(encoding="utf-8")
    out: dict[str, Hardware] = {}
    for entry in yaml.safe_load(text):
        hw = validate(Hardware, entry, "costmodels/data/hardware.yaml")
        out[hw.name.lower()] = hw
    return out


def list_hardware() -> list[Hardware]:
    """Every catalog entry, in catalog order."""
    return list(_catalog().values())


def catalog_name(name: str) -> str | None:
    """The catalog's spelling of GPU ``name`` (case-insensitive: ``h200`` -> ``H200``); None if it names no catalog GPU."""
    hw = _catalog().get(str(name).strip().lower())
    return hw.name if hw is not None else None


def get_hardware(name_or_path: str | Hardware) -> Hardware:
    """A catalog GPU by name (case-insensitive) or a user YAML/JSON file describing one."""
    if isinstance(name_or_path, Hardware):
        return name_or_path
    key = str(name_or_path).strip()
    cat = _catalog()
    if key.lower() in cat:
        return cat[key.lower()]
    if key.lower().endswith((".yaml", ".yml", ".json")) or is_file(key) or (os.sep in key and exists(key)):
        return load_model_file(Hardware, key)   # a path that is not a regular file is named as such there
    err = UnknownNameError("hardware", key, [h.name for h in cat.values()])
    err.args = (f"{err.args[0]}; or a hardware YAML file (twinfer hardware --template prints one to start from)",)
    raise err
