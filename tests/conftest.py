"""Shared pytest setup: GPU tests run only where CUDA is available."""

from __future__ import annotations

import os
import sys

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # the README's command runs two workers (pytest-xdist, ``-n 2``) on a 2-core machine: one thread each, where torch
    # and the BLAS libraries would each start one per core (four threads on two cores: the suite ran 1,150 s that way
    # in one process, 507 s as two single-threaded workers). Before any test module imports them.
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, "1")


@pytest.fixture
def cli_exit_2(monkeypatch, capsys):
    """``cli_exit_2("tune", *args)``: ``twinfer tune ARGS`` through the console entry point, in-process; it must exit
    2 with a message on stderr and no traceback. Returns stderr with its whitespace folded (rich wraps lines)."""
    def run(*argv: str) -> str:
        from ui.cli import main

        monkeypatch.setattr(sys, "argv", ["twinfer", *argv])
        with pytest.raises(SystemExit) as e:
            main()
        err = capsys.readouterr().err
        assert e.value.code == 2, err
        assert "Traceback" not in err
        return " ".join(err.split())
    return run


@pytest.fixture
def triton_interpreter():
    """``triton_interpreter(code)``: runs ``code`` in a subprocess with Triton's interpreter on (``TRITON_INTERPRET=1``
    must be set before Triton compiles anything), the repository first on its path; asserts it exits 0 and prints
    ``ok`` last (stderr's tail in the failure)."""
    import subprocess

    def run(code: str, timeout: int = 600) -> None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, TRITON_INTERPRET="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH", "")]))
        r = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True,
                           timeout=timeout)
        assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
    return run


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.fixture
def hopper(monkeypatch):
    """A pretended CUDA sm_90 device with every kernel library absent; ``hopper("deepgemm", ...)`` marks libraries
    found (as bundled in vLLM). Kernel-choice env overrides are cleared and the dispatcher's choices start empty."""
    from kernels import registry

    monkeypatch.setattr(registry, "device_capability", lambda device: (9, 0) if device == "cuda" else None)
    for key in registry.LIBRARIES:
        monkeypatch.setitem(registry._probe_cache, key, (False, "", f"not importable ({key}: ModuleNotFoundError)"))
    for var in ("TWINFER_KERNEL_MOE_EXPERTS", "TWINFER_KERNEL_RMS_NORM", "TWINFER_KERNELS"):
        monkeypatch.delenv(var, raising=False)
    try:
        from kernels import ops
    except ImportError:    # no torch: registry choices only
        ops = None
    if ops is not None:
        monkeypatch.setattr(ops, "_choices", {})
        monkeypatch.setattr(ops, "fallbacks", {})

    def found(*keys):
        for k in keys:
            monkeypatch.setitem(registry._probe_cache, k, (True, f"vllm.third_party.{k}", f"imported vllm.third_party.{k}"))
    return found


def pytest_collection_modifyitems(config, items):
    if any(item.get_closest_marker("gpu") for item in items) and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


# Tests are deterministic: hypothesis explores the same examples on every run (its
# failures are reproduced from the seed, and new examples come from changing the code).
try:
    from hypothesis import settings

    settings.register_profile("twinfer", derandomize=True, deadline=None, print_blob=True)
    settings.load_profile("twinfer")
except ImportError:  # hypothesis is a test extra
    pass
