"""Compile DeepGEMM's dense FP8 GEMM kernels for many shapes at once, in worker processes.

DeepGEMM's Python calls hold the GIL while they JIT-compile (pybind11, no GIL release) and its compiler
is a process-wide lazy singleton, so threads would not overlap compiles; processes do. Each worker is
``python -m kernels.jit_pool --worker DEVICE``: it imports DeepGEMM with the parent's environment (cache
folder, compiler, CUDA home; ``kernels.jit_cache``), then runs one GEMM per task on random FP8 operands of
that shape, which compiles the kernel into the shared on-disk cache (DeepGEMM compiles into a temp folder
and renames it into place, made for several ranks sharing one cache). The parent's warm-up then loads
each kernel from disk. Tasks are handed out one at a time (JSON lines on stdin; results on a private
copy of stdout, since DeepGEMM prints compiler logs to fd 1, which the worker sends to its log file).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

MAX_WORKERS = 16   # the lent H200 host has 16 cores; nvcc (cicc + ptxas) is one process per compile
START_TIMEOUT_S = 180   # torch + DeepGEMM import and CUDA init, 16 at once
TASK_TIMEOUT_S = 300    # one GEMM's compile (3-8 s with nvcc on the H200, KERNELS.md) with a wide margin
# device memory a worker holds besides its operands: the CUDA context, torch's and DeepGEMM's modules and workspace
WORKER_CONTEXT_BYTES = 1 << 30
POOL_MEMORY_SHARE = 0.7   # of the device's free memory at the pool's start, for all workers together


def task_bytes(m: int, n: int, k: int) -> int:
    """Device bytes one worker task holds at once (``worker_main``): FP8 operands, their FP32 block scales and the
    BF16 output."""
    return m * k + n * k + 4 * (m * (k // 128) + (-(-n // 128)) * (k // 128)) + 2 * m * n


def memory_workers(tasks: list[tuple[int, int, int]], workers: int, free_bytes: int) -> int:
    """``workers`` capped so that every worker at once, each at the largest task, fits in ``POOL_MEMORY_SHARE`` of
    ``free_bytes`` (0 when not even one fits: the parent compiles in-process). Each worker is its own process with
    its own CUDA context beside the engine's model and KV cache: an H200 start with 16 workers over GEMMs up to 8192
    rows ran out of memory (benchmarks/gpu/issue18_h200/deepgemm_serve_3309e60: 367 of 1143 compiles lost, the
    in-process pass then compiled them one at a time)."""
    if not tasks or workers <= 0:
        return 0
    per = WORKER_CONTEXT_BYTES + max(task_bytes(*t) for t in tasks)
    return max(0, min(workers, int(POOL_MEMORY_SHARE * free_bytes // per)))


def worker_count(tasks: int, env: str | None = None) -> int:
    """Workers for ``tasks`` compiles: ``$TWINFER_JIT_WORKERS`` if set (0 or 1: no pool), else
    min(CPU cores, 16, tasks)."""
    env = os.environ.get("TWINFER_JIT_WORKERS") if env is None else env
    if env not in (None, ""):
        try:
            n = int(env)
        except ValueError:
            raise ValueError(f"TWINFER_JIT_WORKERS={env!r}: expected a whole number of worker processes (0 = off)") from None
        if n < 0:
            raise ValueError(f"TWINFER_JIT_WORKERS={env!r}: expected a whole number >= 0 (0 = off)")
        return min(n, tasks)
    return max(0, min(os.cpu_count() or 1, MAX_WORKERS, tasks))


def compile_parallel(tasks: list[tuple[int, int, int]], workers: int, device_index: int,
                     log: Callable[[str], None], spawn=None) -> list[dict]:
    """Run every (M, N, K) task once in a pool of ``workers`` processes; one progress line per result.

    Returns one row per task, in task order: ``{"m","n","k","ok","seconds","error","worker"}``. A worker
    that fails to start or dies marks its current task (and, if none is left running, the rest) failed
    with the tail of its log; the parent's own warm-up pass then compiles what is missing."""
    spawn = spawn or _spawn
    logdir = Path(tempfile.mkdtemp(prefix="twinfer_jit_pool_"))
    todo: queue.Queue = queue.Queue()
    for i, t in enumerate(tasks):
        todo.put((i, t))
    rows: list[dict | None] = [None] * len(tasks)
    lock, done = threading.Lock(), [0]

    def report(i: int, row: dict) -> None:
        with lock:
            rows[i] = row
            done[0] += 1
            m, n, k = tasks[i]
            what = f"{row['seconds']:.2f} s, worker {row['worker']}" if row["ok"] else f"failed: {row['error'][:200]}"
            log(f"  [{done[0]}/{len(tasks)}] fp8_gemm M={m} N={n} K={k} -> deepgemm ({what})")

    def serve(w: int) -> None:
        logfile = logdir / f"worker_{w}.log"
        try:
            proc = spawn(device_index, logfile)
            hello = json.loads(_readline(proc, START_TIMEOUT_S) or "{}")
        except (OSError, ValueError) as e:
            proc, hello = None, {"ready": False, "error": f"{type(e).__name__}: {e}"}
        if not hello.get("ready"):
            _stop(proc)
            if w == 0:   # say once why the pool is short of a worker (all workers share the environment)
                log(f"  jit pool: worker {w} did not start: {hello.get('error') or _tail(logfile)}")
            return
        while True:
            try:
                i, (m, n, k) = todo.get_nowait()
            except queue.Empty:
                break
            try:
                proc.stdin.write(json.dumps({"m": m, "n": n, "k": k}) + "\n")
                proc.stdin.flush()
                res = json.loads(_readline(proc, TASK_TIMEOUT_S) or "null")
            except (OSError, ValueError):
                res = None
            if res is None:
                report(i, {"m": m, "n": n, "k": k, "ok": False, "seconds": 0.0, "worker": w,
                           "error": f"worker died: {_tail(logfile)}"})
                break
            report(i, {"m": m, "n": n, "k": k, "ok": bool(res.get("ok")), "seconds": float(res.get("seconds", 0.0)),
                       "error": res.get("error", ""), "worker": w})
        _stop(proc)

    threads = [threading.Thread(target=serve, args=(w,), daemon=True) for w in range(workers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return [r if r is not None else {"m": t[0], "n": t[1], "k": t[2], "ok": False, "seconds": 0.0, "worker": None,
                                     "error": "not run: no worker started"} for r, t in zip(rows, tasks)]


def _spawn(device_index: int, logfile: Path) -> subprocess.Popen:
    """One worker process with the parent's environment and this repo importable."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return subprocess.Popen([sys.executable, "-m", "kernels.jit_pool", "--worker", str(device_index)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(logfile, "w"), text=True,
                            env=env, cwd=root)


def _readline(proc, timeout: float) -> str:
    """The worker's next protocol line, or '' (and the worker killed) if none comes within ``timeout`` s."""
    import select
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        proc.kill()
        return ""
    return proc.stdout.readline()


def _stop(proc) -> None:
    if proc is None:
        return
    try:
        proc.stdin.close()
        proc.wait(timeout=30)
    except Exception:  # noqa: BLE001 - a stuck worker is killed; its kernels already sit on disk
        proc.kill()


def _tail(logfile: Path, n: int = 300) -> str:
    try:
        return " | ".join(logfile.read_text(errors="replace").strip().splitlines()[-4:])[-n:] or "(empty log)"
    except OSError:
        return "(no log)"


def worker_main(device_index: int) -> None:
    """Serve tasks from stdin until EOF: each one FP8 GEMM through DeepGEMM at its (M, N, K)."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)             # DeepGEMM's printf (compiler logs) goes to the log file, not the protocol
    sys.stdout = sys.stderr
    try:
        import torch

        from kernels import reference as ref
        from kernels import registry, vendor
        dev = torch.device("cuda", device_index)
        torch.cuda.set_device(dev)
        registry.library_module("deepgemm")
    except Exception as e:  # noqa: BLE001 - report why and quit; the parent compiles in-process instead
        proto.write(json.dumps({"ready": False, "error": f"{type(e).__name__}: {e}"[:300]}) + "\n")
        return
    proto.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    fp8 = ref._fp8_dtype()
    for line in sys.stdin:
        t = json.loads(line)
        m, n, k = t["m"], t["n"], t["k"]
        t0 = time.perf_counter()
        vendor.failures.pop("deepgemm", None)   # one shape failing must not skip the next
        try:
            # the compile depends on the shape alone: zero FP8 operands and unit scales (``task_bytes``), not
            # quantised random tensors (their FP32 temporaries took ~5 GB a worker at 8192 x 18432)
            with torch.no_grad():
                xq = torch.zeros(m, k, dtype=torch.uint8, device=dev).view(fp8)
                wq = torch.zeros(n, k, dtype=torch.uint8, device=dev).view(fp8)
                xs = torch.ones(m, k // 128, dtype=torch.float32, device=dev)
                ws = torch.ones(-(-n // 128), k // 128, dtype=torch.float32, device=dev)
                out = vendor.deepgemm_fp8_gemm(xq, xs, wq, ws)
            torch.cuda.synchronize(dev)
            res = {"ok": True}
            del xq, wq, xs, ws, out
        except Exception as e:  # noqa: BLE001
            res = {"ok": False, "error": f"{type(e).__name__}: {e}"[:400]}
        torch.cuda.empty_cache()   # between tasks a worker holds its context alone (``memory_workers``)
        res["seconds"] = round(time.perf_counter() - t0, 3)
        proto.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker_main(int(sys.argv[2]))
    else:
        sys.exit("usage: python -m kernels.jit_pool --worker DEVICE_INDEX (started by kernels.warmup)")
