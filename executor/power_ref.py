"""The board's reference loops under its power limit (``costmodels.power.PowerReference``), measured by
``twinfer calibrate`` on a GPU: a decode batch and a prompt chunk each run back to back for a few seconds while
nvidia-smi samples the board's power, SM clock and clock event reasons every 100 ms.

Why per board: H200 boards draw different power for the same work (issue 16, matrix run 44's board 531 W where runs
40, 41 and 43's drew 487-497 W at the same decode-heavy load) and the clock the 700 W limit allows follows the board.
The two loops pin a board's terms of the twin's power model (``PowerModel.for_board``): its busy power (decode loop,
under the limit), the limit it holds and its clocked power's exponent (prompt loop, over it), and how much slower a
prompt step runs at the clock it settles at. ``benchmarks/gpu/power_probe.py`` runs more shapes with the same loops.
"""

from __future__ import annotations

import calendar
import datetime as dt
import os
import statistics
import subprocess
import tempfile
import time

import torch

from executor.forward_batch import build_forward_batch, synthetic_seqs

QUERY = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"


def smi_target(device) -> list[str]:
    """nvidia-smi's ``-i`` for the GPU ``device`` is (by its UUID: CUDA_VISIBLE_DEVICES renumbers, nvidia-smi does not),
    so a multi-GPU host samples that board alone; [] where torch cannot say (one GPU: nvidia-smi's only line)."""
    try:
        dev = torch.device(device)
        u = str(torch.cuda.get_device_properties(dev.index if dev.index is not None else torch.cuda.current_device()).uuid)
    except Exception:  # noqa: BLE001  (no CUDA, an older torch without the field)
        return []
    if not u or u == "None":
        return []
    return ["-i", u if u.startswith(("GPU-", "MIG-")) else "GPU-" + u]


def start_smi(path: str, query: str = QUERY, period_ms: int = 100, target: list[str] | None = None) -> subprocess.Popen | None:
    """nvidia-smi every ``period_ms`` into ``path`` (None where it cannot start); ``target``: ``smi_target``'s."""
    try:
        return subprocess.Popen(["nvidia-smi", *(target or []), f"--query-gpu={query}", "--format=csv,noheader,nounits", "-lms", str(period_ms)],
                                stdout=open(path, "w"), stderr=subprocess.DEVNULL)
    except OSError:
        return None


def read_smi(path: str) -> list[tuple]:
    """(unix seconds, SM MHz, watts, deg C, event reasons[, more columns]) per sample; unparsable lines skipped."""
    out = []
    for line in open(path):
        p = [x.strip() for x in line.split(",")]
        try:
            t = dt.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f")
            out.append((calendar.timegm(t.timetuple()) + t.microsecond / 1e6, float(p[1]), float(p[2]), float(p[3]),
                        int(p[4], 16)) + tuple(float(x) for x in p[5:]))
        except (ValueError, IndexError):
            continue
    return out


def board_id(target: list[str] | None = None) -> tuple[str, float | None]:
    """(uuid / serial, power limit W) of the board (``smi_target``'s), from nvidia-smi ("", None where unreadable)."""
    try:
        r = subprocess.run(["nvidia-smi", *(target or []), "--query-gpu=uuid,serial,power.limit", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=20)
        p = [x.strip() for x in r.stdout.splitlines()[0].split(",")]
        try:
            limit = float(p[2])
        except (ValueError, IndexError):
            limit = None
        return " / ".join(p[:2]), limit
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return "", None


def make_batch(runner, dec: list[int], pre: list[tuple[int, int]]):
    """A forward batch of decode rows at contexts ``dec`` and prompt chunks ``pre`` (new, cached), synthetic tokens."""
    vocab = runner.model.cfg.spec.vocab_size
    seqs, _ = synthetic_seqs(dec, pre, 1, vocab, runner.page_size, seed=len(dec) + 3 * len(pre))
    return build_forward_batch(seqs, runner.page_size, runner.kv.null_page, runner.device)


def run_loop(runner, batches: list, seconds: float, idle_s: float = 1.5) -> dict:
    """``batches`` run in turn, back to back, for ``seconds`` after ``idle_s`` idle (the clock recovers): per step its
    launch time (unix), device seconds (CUDA events) and which distinct batch it was."""
    dev = runner.device
    distinct = [b for j, b in enumerate(batches) if all(b is not x for x in batches[:j])]
    kind = [next(j for j, x in enumerate(distinct) if x is b) for b in batches]
    with torch.inference_mode():
        for batch in distinct:
            for _ in range(3):   # first calls of the shape (JIT, allocator) outside the window
                batch.memo.clear()
                runner.forward(batch)
        torch.cuda.synchronize(dev)
        time.sleep(idle_s)
        evs, t_wall, which = [], [], []
        t_end = time.time() + seconds
        i = 0
        while time.time() < t_end:
            batch = batches[i % len(batches)]
            which.append(kind[i % len(batches)])
            i += 1
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            batch.memo.clear()
            t_wall.append(time.time())
            a.record()
            runner.forward(batch)
            b.record()
            evs.append((a, b))
            if len(evs) % 8 == 0:   # keep the host within a few steps of the device: steps start when they run
                b.synchronize()
        torch.cuda.synchronize(dev)
        t_done = time.time()   # the device done with the last step (the host runs up to 8 launches ahead of it)
    return {"t": t_wall, "dev": [a.elapsed_time(b) / 1e3 for a, b in evs], "which": which, "t_done": t_done}


def loop_summary(r: dict, smi: list) -> dict:
    """A one-shape loop's ``RefLoop`` figures: device seconds first / late, busy share, power / clock / capped share
    over its last half."""
    t, d = r["t"], r["dev"]
    t0, t1 = t[0], r.get("t_done", t[-1] + d[-1])
    late = [s for s in smi if (t0 + t1) / 2 <= s[0] <= t1]
    n = len(d)
    return {"steps": n, "step_s_first": statistics.median(d[: min(10, n)]), "step_s_late": statistics.median(d[n // 2:]),
            "busy": min(1.0, sum(d) / max(t1 - t0, 1e-9)),
            "watts": statistics.median([s[2] for s in late]) if late else 0.0,
            "mhz": statistics.median([s[1] for s in late]) if late else 0.0,
            "capped": sum(bool(s[4] & 0x4) for s in late) / max(len(late), 1)}


DECODE_REF = ([2048] * 64, [])            # a full decode batch: under the limit on an H200
PROMPT_REF = ([], [(4096, 0)])            # a long prompt chunk: over it


def measure_power_reference(runner, seconds: float = 3.0, log=print):
    """The board's reference loops (``PowerReference``), or None where nvidia-smi is absent or read nothing."""
    from costmodels.power import PowerReference, RefLoop

    target = smi_target(runner.device)
    board, limit = board_id(target)
    fd, path = tempfile.mkstemp(suffix=".csv")
    os.close(fd)
    smi = start_smi(path, target=target)
    if smi is None:
        log("  power reference: no nvidia-smi, skipped")
        return None
    try:
        time.sleep(2.5)   # the board settles from the calibration's work (power.draw averages over about a second)
        loops = {}
        for name, (dec, pre) in (("decode", DECODE_REF), ("prompt", PROMPT_REF)):
            # the first loop waits longer: its last idle second is the board's idle power
            loops[name] = (dec, pre, run_loop(runner, [make_batch(runner, dec, pre)], seconds, 2.5 if not loops else 1.5))
    finally:
        time.sleep(0.3)
        smi.terminate()
        smi.wait(timeout=10)
    samples = read_smi(path)
    os.unlink(path)
    first = min(r["t"][0] for _, _, r in loops.values())
    # idle: the last second of the first loop's own idle wait (the driver's power.draw is about a 1 s average, so
    # earlier samples still carry the calibration's work: 293 W on the H100 of run 45, where 134 W after 2 s idle)
    idle = [s for s in samples if first - 1.1 <= s[0] < first - 0.1]
    if not samples or not idle:
        log("  power reference: nvidia-smi read nothing, skipped")
        return None
    refs = {name: RefLoop(decode_ctx=dec, prefill=pre, **loop_summary(r, samples)) for name, (dec, pre, r) in loops.items()}
    ref = PowerReference(board=board, limit_w=limit, idle_w=statistics.median(s[2] for s in idle),
                         max_mhz=max(s[1] for s in idle), decode=refs["decode"], prompt=refs["prompt"])
    for name, lp in refs.items():
        log(f"  power reference, {name} loop: {lp.steps} steps, {lp.step_s_first * 1e3:.2f} -> {lp.step_s_late * 1e3:.2f} ms, "
            f"{lp.watts:.0f} W at {lp.mhz:.0f} MHz ({lp.capped:.0%} power-capped); idle {ref.idle_w:.0f} W at {ref.max_mhz:.0f} MHz")
    return ref
