"""Hardware catalog: per-GPU datasheet ceilings (dense rates) and, where we have them, measured ones.

The catalog lives in ``costmodels/data/hardware.yaml``; every entry names its sources. A user
describes their own GPU in a YAML file with the same fields and passes its path wherever a
hardware name is accepted.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from twinfer.config import is_file, load_model_file, validate
from twinfer.errors import TwinferError, UnknownNameError

from costmodels.layout import DType


class MeasuredCeilings(BaseModel):
    """What a real GPU of this kind achieved (used as achievable ceilings by the calibration defaults)."""

    model_config = ConfigDict(extra="forbid")
    copy_tbps: float | None = Field(None, gt=0, description="device-to-device copy, read+write, TB/s")
    bf16_matmul_tflops: float | None = Field(None, gt=0, description="large square BF16 matmul")
    fp8_matmul_tflops: float | None = Field(None, gt=0, description="large square FP8 matmul (row-wise scales)")
    small_gemm: dict | None = Field(None, description="one small-M GEMM: m, k, n, dtype, time_us")
    flashmla_decode: list[dict] = Field(default_factory=list, description="MLA decode points: kv_bytes, tbps")
    deepgemm_fp8_tflops: float | None = Field(None, gt=0)
    deepgemm_masked_grouped: dict | None = None
    source: str = ""


class Hardware(BaseModel):
    """One GPU model. Rates are dense (no structured sparsity), per GPU."""

    model_config = ConfigDict(extra="forbid")

    name: str
    vendor: str = "unknown"
    bf16_tflops: float = Field(..., gt=0, le=1e6)
    fp8_tflops: float = Field(..., gt=0, le=1e6)
    fp4_tflops: float | None = Field(None, gt=0, le=1e6, description="None if the tensor cores lack FP4")
    hbm_gb: float = Field(..., gt=0, le=1e5, description="HBM capacity as advertised (GB, see hbm_bytes)")
    hbm_tbps: float = Field(..., gt=0, le=1e3)
    scaleup_gbps: float = Field(..., gt=0, description="scale-up (NVLink/IF) GB/s per GPU per direction")
    scaleup_domain: int = Field(..., ge=1, le=100000, description="GPUs in one scale-up domain")
    scaleout_gbps: float = Field(..., gt=0, description="scale-out NIC Gbit/s per GPU")
    host_mem_gb: float = Field(0.0, ge=0, description="host memory per GPU, GB")
    host_link_gbps: float = Field(64.0, gt=0, description="host<->GPU GB/s per direction (PCIe/NVLink-C2C)")
    price_per_gpu_hour: float = Field(0.0, ge=0)
    sources: list[str] = Field(default_factory=list)
    notes: str = ""
    measured: MeasuredCeilings | None = None

    def tflops(self, dtype: DType | str) -> float:
        """Dense peak TFLOP/s for GEMMs in ``dtype``.

        FP4 on hardware without FP4 tensor cores (Hopper) falls back to the FP8 rate: the
        weights are dequantised in the kernel and the math runs at the FP8 rate at best.
        """
        if dtype == "bf16":
            return self.bf16_tflops
        if dtype == "fp8":
            return self.fp8_tflops
        if dtype == "fp4":
            return self.fp4_tflops if self.fp4_tflops is not None else self.fp8_tflops
        raise TwinferError(f"unknown dtype {dtype!r}; allowed: bf16, fp8, fp4")

    def supports(self, dtype: str) -> bool:
        """Whether the tensor cores run ``dtype`` natively."""
        return dtype != "fp4" or self.fp4_tflops is not None

    @property
    def hbm_bytes(self) -> float:
        """HBM capacity in bytes.

        Vendors' "80 GB" / "141 GB" are what CUDA reports in GiB (an H100 shows 81,559 MiB =
        79.6 GiB; an H200 143,771 MiB = 140.4 GiB), so the advertised figure is taken as GiB.
        """
        return self.hbm_gb * 2**30

    @property
    def hbm_bw(self) -> float:
        """Peak HBM bandwidth, bytes/s."""
        return self.hbm_tbps * 1e12

    @property
    def scaleup_bw(self) -> float:
        """Scale-up bytes/s per GPU per direction."""
        return self.scaleup_gbps * 1e9

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


def get_hardware(name_or_path: str | Hardware) -> Hardware:
    """A catalog GPU by name (case-insensitive) or a user YAML/JSON file describing one."""
    if isinstance(name_or_path, Hardware):
        return name_or_path
    key = str(name_or_path).strip()
    cat = _catalog()
    if key.lower() in cat:
        return cat[key.lower()]
    if key.lower().endswith((".yaml", ".yml", ".json")) or is_file(key):
        return load_model_file(Hardware, key)
    raise UnknownNameError("hardware", key, [h.name for h in cat.values()])
