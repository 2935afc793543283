"""Where vendor JIT kernels are cached on disk, so a second engine start compiles nothing.

DeepGEMM compiles each kernel configuration the first time a shape needs it (3-8 s each on the
H200, KERNELS.md) and keeps the binaries under ``DG_JIT_CACHE_DIR`` (default ``~/.deep_gemm``).
We point it into twinfer's cache folder unless the user set it: ``$DG_JIT_CACHE_DIR`` wins,
then ``$TWINFER_CACHE_DIR/deepgemm``, then ``$XDG_CACHE_HOME/twinfer/deepgemm``, then
``~/.cache/twinfer/deepgemm``. Must run before DeepGEMM is imported (the registry's probe does).
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "DG_JIT_CACHE_DIR"


def twinfer_cache_dir() -> Path:
    """twinfer's cache folder ($TWINFER_CACHE_DIR, else the XDG cache home's ``twinfer``)."""
    if os.environ.get("TWINFER_CACHE_DIR"):
        return Path(os.environ["TWINFER_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "twinfer"


def jit_cache_dir() -> tuple[Path, str]:
    """(DeepGEMM's JIT cache directory, where that choice came from)."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser(), f"${ENV}"
    src = "$TWINFER_CACHE_DIR" if os.environ.get("TWINFER_CACHE_DIR") else "default"
    return twinfer_cache_dir() / "deepgemm", src


def ensure_jit_cache() -> Path:
    """Export ``DG_JIT_CACHE_DIR`` (unless set) and create the folder; returns it."""
    path, _ = jit_cache_dir()
    os.environ.setdefault(ENV, str(path))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:   # read-only home: DeepGEMM still works, it just recompiles next time
        pass
    return path
