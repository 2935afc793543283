"""An executor build on the CPU that cannot fit in host memory is refused before it allocates (TwinferError naming
what to shrink), never an 'internal error' from the allocator or the machine swapping/OOM-killed: `twinfer run` or
`validate` with `-m deepseek-v3 --device cpu` allocated 671B parameters; `validate --max-model-len 1000000` sized its
KV for a million-token context (80 GB on the tiny model)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

import executor.engine as engine_mod  # noqa: E402
import executor.memory_room as room  # noqa: E402
import executor.weights as weights  # noqa: E402
from executor.engine import LLMEngine  # noqa: E402
from executor.kv_cache import KVCache  # noqa: E402
from twinfer.errors import TwinferError  # noqa: E402
from ui.cli import app  # noqa: E402

PROF = str(Path(__file__).resolve().parents[1] / "profiles" / "h200" / "calibration_deepseek-v3-5layers_fp8.json")
GIB = 1 << 30


class NoKV(KVCache):
    def __init__(self, *a, **kw):
        raise AssertionError("KV allocated: the build should have been refused first")


@pytest.fixture
def host_of_8gib(monkeypatch):
    """8 GiB of host memory available; allocating the model's weights or the KV cache fails the test."""
    monkeypatch.setattr(room, "host_available_bytes", lambda: 8 * GIB)

    def no_alloc(*a, **kw):
        raise AssertionError("allocated: the build should have been refused first")
    monkeypatch.setattr(weights.nn.Module, "to_empty", no_alloc)
    monkeypatch.setattr(engine_mod, "KVCache", NoKV)


def test_weights_beyond_host_memory_are_refused(host_of_8gib):
    with pytest.raises(TwinferError, match=r"deepseek-v3 \(61 layers\) in fp32 on the CPU: the weights need [\d,.]+ GiB, more than the 8\.0 GiB of host memory available here; keep fewer layers \(--num-layers\)"):
        LLMEngine.from_args("deepseek-v3", device="cpu", dtype="fp32")


def test_kv_beyond_host_memory_is_refused(monkeypatch):
    """The tiny model builds for real; only its KV cache (1M blocks: 134 GiB in fp32) is too big."""
    monkeypatch.setattr(room, "host_available_bytes", lambda: 8 * GIB)
    monkeypatch.setattr(engine_mod, "KVCache", NoKV)
    with pytest.raises(TwinferError, match=r"num_kv_blocks=1000000 \(blocks of 64 tokens\) on the CPU: the KV cache needs [\d,.]+ GiB, more than the 8\.0 GiB.*--num-kv-blocks"):
        LLMEngine.from_args("tiny", device="cpu", dtype="fp32", num_kv_blocks=1_000_000)


def test_a_build_that_fits_is_not_refused(monkeypatch):
    monkeypatch.setattr(room, "host_available_bytes", lambda: 8 * GIB)
    eng = LLMEngine.from_args("tiny", device="cpu", dtype="fp32", num_kv_blocks=64)
    assert eng.scheduler.blocks.num_blocks == 64


def test_validate_on_a_model_too_big_for_the_cpu_exits_2(host_of_8gib):
    r = CliRunner().invoke(app, ["validate", "-m", "deepseek-v3", "-p", PROF, "-n", "2", "--levels", "1", "--no-warm"])
    assert isinstance(r.exception, TwinferError) and "weights need" in str(r.exception)
