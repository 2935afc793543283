"""DeepGEMM's JIT setup without a GPU: the NVRTC include shim for CUDA 13 toolkits (a fake toolkit in a
temp folder), the import environment the registry gives DeepGEMM (a fake ``deep_gemm`` module), the
parallel compile pool's protocol (fake workers) and the warm-up's pool decisions (pool mocked)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kernels import jit_cache, jit_pool, ops, registry, warmup  # noqa: E402


@pytest.fixture
def env(monkeypatch, tmp_path):
    """Clean DeepGEMM variables, a private cache, and the module state restored afterwards."""
    for k in ("DG_JIT_USE_NVRTC", "DG_JIT_NVCC_COMPILER", "DG_JIT_CACHE_DIR", "CUDA_PATH", "TWINFER_JIT_WORKERS"):
        monkeypatch.setenv(k, "")   # recorded, so whatever the code under test exports is undone afterwards
        monkeypatch.delenv(k)
    monkeypatch.setenv("TWINFER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(jit_cache, "state", dict(jit_cache.state, used=False))
    return monkeypatch


def toolkit(root: Path, cuda13: bool = True) -> Path:
    """A fake CUDA toolkit: bin/nvcc, include/cuda_runtime.h and libcu++ where that CUDA version keeps it."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (root / "lib64").mkdir()
    inc = root / "include"
    (inc / "crt").mkdir(parents=True)
    (inc / "cuda_runtime.h").write_text("// runtime\n")
    std = inc / "cccl" / "cuda" / "std" if cuda13 else inc / "cuda" / "std"
    std.mkdir(parents=True)
    (std / "cstdint").write_text("// cccl cstdint\n")
    if cuda13:
        (inc / "cccl" / "cub").mkdir()
        (inc / "cccl" / "cuda_runtime.h").write_text("// must not shadow the toolkit's own\n")
    return root


def test_wants_nvrtc_reads_the_int_like_deepgemm(env):
    assert not jit_cache.wants_nvrtc()
    for val, on in (("1", True), ("0", False), ("", False), ("2", True), ("yes", False)):
        env.setenv("DG_JIT_USE_NVRTC", val)
        assert jit_cache.wants_nvrtc() is on


def test_nvcc_by_default_leaves_cuda_home_alone(env, tmp_path):
    home = toolkit(tmp_path / "cuda")
    env.setenv("CUDA_HOME", str(home))
    with jit_cache.deepgemm_import_env() as st:
        assert os.environ["CUDA_HOME"] == str(home)
        assert st["compiler"] == "nvcc" and st["shim"] is None
    assert "DG_JIT_NVCC_COMPILER" not in os.environ
    assert "nvcc" in jit_cache.describe() and str(tmp_path / "cache" / "deepgemm") in jit_cache.describe()


def test_nvrtc_on_cuda13_imports_through_a_shim_with_cccl_on_the_include_path(env, tmp_path):
    home = toolkit(tmp_path / "cuda")
    env.setenv("CUDA_HOME", str(home))
    env.setenv("DG_JIT_USE_NVRTC", "1")
    with jit_cache.deepgemm_import_env() as st:
        shim = Path(os.environ["CUDA_HOME"])
        assert st["compiler"] == "nvrtc" and shim == Path(st["shim"]) and shim != home
    assert os.environ["CUDA_HOME"] == str(home)          # restored for everyone else
    inc = shim / "include"
    assert (inc / "cuda" / "std" / "cstdint").read_text() == "// cccl cstdint\n"   # what NVRTC could not find
    assert (inc / "cub").is_dir() and (inc / "crt").is_dir() and (inc / "cccl").is_dir()
    assert (inc / "cuda_runtime.h").read_text() == "// runtime\n"   # the toolkit's entry wins a clash
    assert (shim / "bin" / "nvcc").exists() and (shim / "lib64").is_dir()
    assert os.environ["DG_JIT_NVCC_COMPILER"] == str(home.resolve() / "bin" / "nvcc")
    assert "NVRTC" in jit_cache.describe() and "include/cccl" in jit_cache.describe()
    again = jit_cache.cccl_shim(home, tmp_path / "cache" / "deepgemm")   # idempotent: reused, not rebuilt
    assert again == shim


def test_shim_merges_a_folder_both_the_toolkit_and_cccl_have(env, tmp_path):
    home = toolkit(tmp_path / "cuda")
    (home / "include" / "cuda").mkdir()
    (home / "include" / "cuda" / "annotated_ptr").write_text("// toolkit's\n")
    shim = jit_cache.cccl_shim(home, tmp_path / "shims")
    cuda = shim / "include" / "cuda"
    assert not cuda.is_symlink() and (cuda / "annotated_ptr").exists() and (cuda / "std" / "cstdint").exists()


def test_nvrtc_on_cuda12_needs_no_shim(env, tmp_path):
    home = toolkit(tmp_path / "cuda12", cuda13=False)
    env.setenv("CUDA_HOME", str(home))
    env.setenv("DG_JIT_USE_NVRTC", "1")
    with jit_cache.deepgemm_import_env() as st:
        assert os.environ["CUDA_HOME"] == str(home) and st["compiler"] == "nvrtc" and st["shim"] is None


def test_shim_failure_turns_nvrtc_off_with_the_reason(env, tmp_path, monkeypatch):
    home = toolkit(tmp_path / "cuda")
    env.setenv("CUDA_HOME", str(home))
    env.setenv("DG_JIT_USE_NVRTC", "1")

    def boom(*a):
        raise PermissionError("read-only")
    monkeypatch.setattr(jit_cache, "cccl_shim", boom)
    st = jit_cache.prepare_deepgemm()
    assert st["compiler"] == "nvcc" and "shim failed" in st["note"] and os.environ["DG_JIT_USE_NVRTC"] == "0"


def test_fall_back_to_nvcc_only_before_the_first_deepgemm_call(env):
    env.setenv("DG_JIT_USE_NVRTC", "1")
    jit_cache.state.update(compiler="nvrtc")
    assert jit_cache.fall_back_to_nvcc("kernel.cu: error") and os.environ["DG_JIT_USE_NVRTC"] == "0"
    assert jit_cache.state["compiler"] == "nvcc" and "NVRTC failed" in jit_cache.state["note"]
    env.setenv("DG_JIT_USE_NVRTC", "1")
    jit_cache.state["used"] = True      # this process already compiled: its compiler is fixed
    assert not jit_cache.fall_back_to_nvcc("again") and os.environ["DG_JIT_USE_NVRTC"] == "1"


def test_registry_imports_deepgemm_under_the_shim_and_records_the_compiler(env, tmp_path, monkeypatch):
    home = toolkit(tmp_path / "cuda")
    env.setenv("CUDA_HOME", str(home))
    env.setenv("DG_JIT_USE_NVRTC", "1")
    pkg = tmp_path / "site" / "fake_dg_for_test"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("import os\nSEEN_CUDA_HOME = os.environ.get('CUDA_HOME')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(registry.LIBRARIES, "deepgemm", ("fake_dg_for_test",))
    monkeypatch.delitem(registry._probe_cache, "deepgemm", raising=False)
    monkeypatch.setattr(registry, "device_capability", lambda device: (9, 0) if device == "cuda" else None)
    monkeypatch.setitem(registry._probe_cache, "triton", (True, "triton", "imported triton"))
    ok, path, _ = registry.probe_library("deepgemm")
    import fake_dg_for_test
    assert ok and "nvrtc_cuda_home_" in fake_dg_for_test.SEEN_CUDA_HOME and os.environ["CUDA_HOME"] == str(home)
    why = registry.choose("fp8_gemm", "cuda").why
    assert why.startswith("deepgemm: vendor library") and "JIT NVRTC" in why and "include/cccl" in why
    sys.modules.pop("fake_dg_for_test", None)


def test_worker_count_from_cores_or_env(env, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert jit_pool.worker_count(162) == 16 and jit_pool.worker_count(5) == 5
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert jit_pool.worker_count(162) == jit_pool.MAX_WORKERS
    assert jit_pool.worker_count(162, "4") == 4 and jit_pool.worker_count(162, "0") == 0
    for bad in ("four", "-1"):
        with pytest.raises(ValueError, match="TWINFER_JIT_WORKERS"):
            jit_pool.worker_count(10, bad)


# A stand-in worker speaking the pool's protocol: M=13 fails, M=99 kills the worker mid-task.
FAKE_WORKER = textwrap.dedent("""
    import json, os, sys
    print("compiler noise on stdout would break the protocol", file=sys.stderr)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        t = json.loads(line)
        if t["m"] == 99:
            os._exit(3)
        ok = t["m"] != 13
        print(json.dumps({"ok": ok, "seconds": 0.5, **({} if ok else {"error": "NVRTC log: cuda/std/cstdint"})}), flush=True)
""")


def fake_spawn(script=FAKE_WORKER):
    def spawn(device_index, logfile):
        return subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=open(logfile, "w"), text=True)
    return spawn


def test_pool_runs_every_task_once_in_order_with_progress():
    tasks = [(m, 256, 128) for m in (1, 2, 4, 8, 13, 64, 128)]
    lines = []
    rows = jit_pool.compile_parallel(tasks, 3, 0, lines.append, spawn=fake_spawn())
    assert [(r["m"], r["n"], r["k"]) for r in rows] == tasks
    assert [r["ok"] for r in rows] == [m != 13 for m, _, _ in tasks]
    assert "cstdint" in rows[4]["error"] and {r["worker"] for r in rows} <= {0, 1, 2}
    assert len(lines) == len(tasks) and lines[-1].startswith(f"  [{len(tasks)}/{len(tasks)}] fp8_gemm")


def test_pool_survives_a_dying_worker_and_workers_that_never_start():
    tasks = [(m, 256, 128) for m in (1, 99, 2, 4, 8)]
    rows = jit_pool.compile_parallel(tasks, 2, 0, lambda s: None, spawn=fake_spawn())
    died = [r for r in rows if r["m"] == 99][0]
    assert not died["ok"] and died["error"].startswith("worker died")
    assert all(r["ok"] for r in rows if r["m"] != 99)   # the other worker took the rest
    lines = []
    rows = jit_pool.compile_parallel(tasks[:2], 2, 0, lines.append,
                                     spawn=fake_spawn("import json; print(json.dumps({'ready': False, 'error': 'no CUDA'}))"))
    assert all(not r["ok"] and r["error"] == "not run: no worker started" for r in rows)
    assert any("did not start: no CUDA" in s for s in lines)


def test_real_worker_reports_why_it_cannot_start_without_a_gpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("has a GPU: the worker would start")
    proc = jit_pool._spawn(0, tmp_path / "w.log")
    hello = json.loads(proc.stdout.readline())
    jit_pool._stop(proc)
    assert hello["ready"] is False and hello["error"]


class Lin(torch.nn.Module):
    """An FP8 linear; N > registry.NARROW_GEMM_N, so DeepGEMM takes it at every row count."""

    def __init__(self, n, k):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(n, k, dtype=torch.float8_e4m3fn), requires_grad=False)
        self.weight_scale_inv = torch.nn.Parameter(torch.ones(n // 128, k // 128), requires_grad=False)


@pytest.fixture
def deepgemm_first(env, monkeypatch):
    """The registry's fp8_gemm choice is DeepGEMM (a pretend Hopper with it importable)."""
    monkeypatch.setattr(registry, "device_capability", lambda device: (9, 0) if device == "cuda" else None)
    for key in registry.LIBRARIES:
        monkeypatch.setitem(registry._probe_cache, key, (True, f"x.{key}", f"imported x.{key}"))
    ops.clear_choices()
    yield
    ops.clear_choices()


def test_precompile_falls_back_to_nvcc_when_nvrtc_fails_then_marks_done(deepgemm_first, monkeypatch):
    items = warmup.jit_plan(torch.nn.Sequential(Lin(2048, 128), Lin(1152, 256)), (1, 64))
    monkeypatch.setenv("DG_JIT_USE_NVRTC", "1")
    jit_cache.state.update(compiler="nvrtc", note="NVRTC", shim=None, cuda_home=None)
    monkeypatch.setattr(jit_pool, "worker_count", lambda n: 4)
    calls = []

    def pool(tasks, workers, dev, log):
        calls.append((jit_cache.state["compiler"], len(tasks), workers))
        ok = jit_cache.state["compiler"] == "nvcc"
        return [{"m": m, "n": n, "k": k, "ok": ok, "seconds": 1.0, "worker": 0, "error": "" if ok else "NVRTC log: x"}
                for m, n, k in tasks]
    monkeypatch.setattr(jit_pool, "compile_parallel", pool)
    log = []
    info = warmup.precompile(items, torch.device("cuda", 0), log.append)
    assert calls == [("nvrtc", 4, 4), ("nvcc", 4, 4)] and os.environ["DG_JIT_USE_NVRTC"] == "0"
    assert any("switching DeepGEMM to nvcc" in s for s in log)
    assert info["labels"] == {i.label() for i in items} and not info["marker"].exists()
    warmup._mark_done(info["marker"])
    calls.clear()
    log.clear()
    again = warmup.precompile(items, torch.device("cuda", 0), log.append)
    assert calls == [] and again["marker"] == info["marker"] and "earlier start" in log[0]


def test_precompile_skips_when_deepgemm_is_not_chosen_or_one_worker(deepgemm_first, monkeypatch):
    items = warmup.jit_plan(torch.nn.Sequential(Lin(2048, 128)), (1, 64))
    monkeypatch.setattr(jit_pool, "compile_parallel", lambda *a: pytest.fail("pool must not run"))
    monkeypatch.setenv("TWINFER_JIT_WORKERS", "1")
    assert warmup.precompile(items, torch.device("cuda", 0), lambda s: None)["labels"]   # in-process only
    monkeypatch.setenv("TWINFER_KERNEL_FP8_GEMM", "triton")
    ops.clear_choices()
    assert warmup.precompile(items, torch.device("cuda", 0), lambda s: None) is None
    monkeypatch.setenv("TWINFER_JIT_WORKERS", "lots")
    monkeypatch.delenv("TWINFER_KERNEL_FP8_GEMM")
    ops.clear_choices()
    from twinfer.errors import TwinferError
    with pytest.raises(TwinferError, match="TWINFER_JIT_WORKERS"):
        warmup.precompile(items, torch.device("cuda", 0), lambda s: None)


def test_workers_that_do_not_start_keep_nvrtc_and_a_broken_pool_is_only_logged(deepgemm_first, monkeypatch):
    items = warmup.jit_plan(torch.nn.Sequential(Lin(2048, 128)), (1, 64))
    monkeypatch.setenv("DG_JIT_USE_NVRTC", "1")
    jit_cache.state.update(compiler="nvrtc", note="NVRTC")
    monkeypatch.setattr(jit_pool, "worker_count", lambda n: 2)
    calls = []

    def pool(tasks, workers, dev, log):
        calls.append(1)
        return [{"m": m, "n": n, "k": k, "ok": False, "seconds": 0.0, "worker": None, "error": "not run: no worker started"}
                for m, n, k in tasks]
    monkeypatch.setattr(jit_pool, "compile_parallel", pool)
    warmup.precompile(items, torch.device("cuda", 0), lambda s: None)
    assert calls == [1] and jit_cache.state["compiler"] == "nvrtc" and os.environ["DG_JIT_USE_NVRTC"] == "1"

    def broken(*a):
        raise OSError("no /tmp")
    monkeypatch.setattr(jit_pool, "compile_parallel", broken)
    log = []
    assert warmup.precompile(items, torch.device("cuda", 0), log.append)["labels"]
    assert any("pool failed (OSError: no /tmp)" in s for s in log)


def test_a_silent_worker_is_killed_after_the_timeout(monkeypatch):
    monkeypatch.setattr(jit_pool, "START_TIMEOUT_S", 0.5)
    rows = jit_pool.compile_parallel([(1, 256, 128)], 1, 0, lambda s: None,
                                     spawn=fake_spawn("import time; time.sleep(30)"))
    assert not rows[0]["ok"] and rows[0]["error"] == "not run: no worker started"


def test_pool_workers_fit_in_free_device_memory(deepgemm_first, monkeypatch):
    """Each worker holds a CUDA context and the largest task's FP8 operands, scales and BF16 output; the pool takes
    only as many as fit in 70% of the free device memory (an H200 start with 16 workers at 8192 rows ran out of it),
    says so, and runs no pool when fewer than two fit. Where free memory cannot be read nothing is capped."""
    assert jit_pool.task_bytes(8192, 7168, 18432) == 8192 * 18432 + 7168 * 18432 + 4 * (8192 * 144 + 56 * 144) + 2 * 8192 * 7168
    big = [(64, 7168, 18432), (8192, 7168, 18432)]
    per = jit_pool.WORKER_CONTEXT_BYTES + jit_pool.task_bytes(8192, 7168, 18432)
    assert jit_pool.memory_workers(big, 16, 10 * per) == 7 and jit_pool.memory_workers(big, 4, 10 * per) == 4
    assert jit_pool.memory_workers(big, 16, per) == 0 and jit_pool.memory_workers([], 16, 10 * per) == 0

    items = warmup.jit_plan(torch.nn.Sequential(Lin(2048, 128), Lin(1152, 256)), (1, 64))
    monkeypatch.setattr(jit_pool, "worker_count", lambda n: 4)
    seen = []
    monkeypatch.setattr(jit_pool, "compile_parallel", lambda tasks, workers, dev, log: seen.append(workers) or [
        {"m": m, "n": n, "k": k, "ok": True, "seconds": 1.0, "worker": 0, "error": ""} for m, n, k in tasks])
    one = jit_pool.WORKER_CONTEXT_BYTES + max(jit_pool.task_bytes(i.m, i.n, i.k) for i in warmup.deepgemm_items(items, torch.device("cuda", 0)))
    log = []
    monkeypatch.setattr(warmup, "_free_bytes", lambda d: int(3 * one / jit_pool.POOL_MEMORY_SHARE) + 1)
    warmup.precompile(items, torch.device("cuda", 0), log.append)
    assert seen == [3] and any("3 of 4 worker processes fit" in s for s in log)
    monkeypatch.setattr(warmup, "_free_bytes", lambda d: one)
    warmup.precompile(items, torch.device("cuda", 0), log.append)
    assert seen == [3]                 # one worker fits: no pool, the in-process pass compiles
    monkeypatch.setattr(warmup, "_free_bytes", lambda d: None)
    warmup.precompile(items, torch.device("cuda", 0), log.append)
    assert seen == [3, 4]
