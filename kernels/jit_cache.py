"""DeepGEMM's JIT environment: where compiled kernels are cached, and which compiler it uses.

Cache: DeepGEMM compiles each kernel configuration the first time a shape needs it (3-8 s each on
the H200, KERNELS.md) and keeps the binaries under ``DG_JIT_CACHE_DIR`` (default ``~/.deep_gemm``).
We point it into twinfer's cache folder unless the user set it: ``$DG_JIT_CACHE_DIR`` wins, then
``$TWINFER_CACHE_DIR/deepgemm``, then ``$XDG_CACHE_HOME/twinfer/deepgemm``, then
``~/.cache/twinfer/deepgemm``. Must run before DeepGEMM is imported (the registry's probe does).

Compiler: nvcc by default; NVRTC (in-process, several times faster) when ``DG_JIT_USE_NVRTC=1``, read
by DeepGEMM at its first compile. Its NVRTC command line has only ``-I<deep_gemm>/include
-I$CUDA_HOME/include`` and no variable for extra flags (DeepGEMM 2.5-2.6 ``csrc/jit/compiler.hpp``),
while CUDA 13 moved CCCL (``cuda/std/...``) to ``$CUDA_HOME/include/cccl``: NVRTC then fails on
``<cuda/std/cstdint>``. The fix here: while DeepGEMM is imported (it reads ``CUDA_HOME`` once, in
``_C.init``), ``CUDA_HOME`` names a look-alike folder of symlinks whose ``include/`` also holds CCCL's
top-level entries; only when ``include/cccl`` exists and ``include/cuda/std`` does not. nvcc keeps
finding CCCL itself; ``DG_JIT_NVCC_COMPILER`` pins the real nvcc in case DeepGEMM compiles with it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path

ENV = "DG_JIT_CACHE_DIR"
NVRTC_ENV = "DG_JIT_USE_NVRTC"
NVCC_ENV = "DG_JIT_NVCC_COMPILER"

# What the last setup decided (for `twinfer kernels` and the warm-up's log); ``used`` turns true once
# this process ran a DeepGEMM call, after which its compiler (a lazy singleton) can no longer change.
state: dict = {"compiler": None, "cuda_home": None, "shim": None, "note": "", "used": False}


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


def wants_nvrtc() -> bool:
    """Does ``DG_JIT_USE_NVRTC`` ask for NVRTC? (DeepGEMM reads it as an int: non-zero is on.)"""
    try:
        return int(os.environ.get(NVRTC_ENV, "0") or "0") != 0
    except ValueError:
        return False


def find_cuda_home() -> Path | None:
    """The CUDA toolkit DeepGEMM will use, found the way its ``_find_cuda_home`` does."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not home:
        nvcc = shutil.which("nvcc")
        home = str(Path(nvcc).resolve().parent.parent) if nvcc else "/usr/local/cuda"
    return Path(home) if Path(home).is_dir() else None


def needs_cccl_shim(home: Path) -> bool:
    """CUDA 13 layout: CCCL under ``include/cccl`` and not at ``include/cuda/std``."""
    return (home / "include" / "cccl" / "cuda").is_dir() and not (home / "include" / "cuda" / "std").is_dir()


def cccl_shim(home: Path, root: Path) -> Path:
    """A CUDA_HOME look-alike under ``root``: every top-level entry of ``home`` symlinked, except ``include/``,
    a real folder of symlinks to ``home/include/*`` plus ``home/include/cccl/*`` (the toolkit's own entry wins
    a name clash). Built in a temp folder and renamed into place, so parallel workers can race safely."""
    home = home.resolve()
    dest = root / f"nvrtc_cuda_home_{hashlib.sha1(str(home).encode()).hexdigest()[:10]}"
    if _shim_ok(dest, home):
        return dest
    tmp = root / f".{dest.name}.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "include").mkdir(parents=True)
    for entry in home.iterdir():
        if entry.name != "include":
            (tmp / entry.name).symlink_to(entry)
    _merge(tmp / "include", [home / "include", home / "include" / "cccl"])
    (tmp / "SOURCE").write_text(str(home))
    try:
        os.rename(tmp, dest)
    except OSError:   # another process built it first (or a stale one is in the way)
        shutil.rmtree(tmp, ignore_errors=True)
        if not _shim_ok(dest, home):
            shutil.rmtree(dest, ignore_errors=True)
            raise
    return dest


def _merge(dst: Path, srcs: list[Path]) -> None:
    """Fill ``dst`` with symlinks to the entries of ``srcs``; a name that is a folder in several of them becomes a
    real folder merged the same way (say a toolkit with both ``include/cuda/`` and ``include/cccl/cuda/``);
    otherwise the first source wins."""
    names: dict[str, list[Path]] = {}
    for src in srcs:
        for entry in src.iterdir():
            names.setdefault(entry.name, []).append(entry)
    for name, entries in names.items():
        dirs = [e for e in entries if e.is_dir()]
        if len(dirs) > 1 and entries[0].is_dir():
            (dst / name).mkdir()
            _merge(dst / name, dirs)
        else:
            (dst / name).symlink_to(entries[0])


def _shim_ok(dest: Path, home: Path) -> bool:
    try:
        return (dest / "SOURCE").read_text() == str(home) and (dest / "include" / "cuda" / "std").is_dir()
    except OSError:
        return False


def prepare_deepgemm() -> dict:
    """Decide DeepGEMM's compiler setup before it is imported; fills and returns :data:`state`.

    nvcc unless ``DG_JIT_USE_NVRTC`` is on; with NVRTC on a CUDA 13 toolkit, the CCCL shim (when it cannot
    be built, NVRTC is turned off here and nvcc used, with the reason in the note)."""
    cache = ensure_jit_cache()
    home = find_cuda_home()
    state.update(cuda_home=str(home) if home else None, shim=None)
    if not wants_nvrtc():
        state.update(compiler="nvcc", note="nvcc (DeepGEMM's default; DG_JIT_USE_NVRTC=1 for NVRTC)")
        return state
    if home is None or not needs_cccl_shim(home):
        state.update(compiler="nvrtc", note="NVRTC (DG_JIT_USE_NVRTC=1)")
        return state
    try:
        state["shim"] = str(cccl_shim(home, cache))
    except OSError as e:
        os.environ[NVRTC_ENV] = "0"
        state.update(compiler="nvcc", note=f"nvcc: NVRTC needs include/cccl on its path and the shim failed ({e})")
        return state
    nvcc = home / "bin" / "nvcc"
    if nvcc.exists():
        os.environ.setdefault(NVCC_ENV, str(nvcc))
    state.update(compiler="nvrtc", note=f"NVRTC (DG_JIT_USE_NVRTC=1), CUDA_HOME shim {state['shim']} adds include/cccl")
    return state


@contextlib.contextmanager
def deepgemm_import_env():
    """Around ``import deep_gemm``: the setup of :func:`prepare_deepgemm`, ``CUDA_HOME`` pointing at the shim
    while DeepGEMM records it, restored afterwards (other libraries keep seeing the real toolkit)."""
    prepare_deepgemm()
    old = os.environ.get("CUDA_HOME")
    if state["shim"]:
        os.environ["CUDA_HOME"] = state["shim"]
    try:
        yield state
    finally:
        if state["shim"]:
            if old is None:
                os.environ.pop("CUDA_HOME", None)
            else:
                os.environ["CUDA_HOME"] = old


def fall_back_to_nvcc(reason: str) -> bool:
    """Switch DeepGEMM to nvcc after NVRTC failed (possible only before this process compiled anything)."""
    if state["used"]:
        return False
    os.environ[NVRTC_ENV] = "0"
    state.update(compiler="nvcc", note=f"nvcc: NVRTC failed at warm-up ({reason[:160]})")
    return True


def describe() -> str:
    """One line for ``twinfer kernels``: compiler and cache folder."""
    cache, src = jit_cache_dir()
    return f"JIT {state['note'] or 'not set up yet'}; cache {cache} ({src})"

