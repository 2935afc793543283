"""A fixed piece of the engine's host work, timed: how fast the host runs now, against another time or process.

Issue 16 (H200 runs 26-30): the decode steps' host part against the calibration's moved between -18% and +21% from one
workload class's replays to the next, with the same code on the same core at the same clock; the calibration samples
the host's speed once. :func:`host_probe` times one decode step's input build (``build_forward_batch`` for a fixed
batch: the numpy index arrays and the one host-to-device copy, what every step runs before its forward is launched)
many times and returns the median seconds. The calibration records it at its start, after its step grid and at its end
(``provenance.host_probe_s``); validate records it before every replay (``decode_host_vs_calibration`` beside it), so a
replay's error can be read against how fast its host ran. A measurement only: nothing is fitted to it.

:func:`executor.calibrate.issue_probe` times another piece (there, beside the held forward it reuses): the issue of one fixed prompt-bearing step's forward (Python, torch's
dispatch, the kernel launches) with the GPU held busy, so no launch waits for the device. That is the host work the
input build does not hold: on H100 run 53 the input-build probe read 62-110% slower than the calibration's before
replays whose eager issue ran within 14% of it, and on run 54 both ran about half the calibration's time. The
calibration records it where it records the input-build probe (``provenance.issue_probe_s``), and validate before
every replay (``diagnostics.issue_probe_vs_calibration``; ``--host-speed issue`` prices a level at it).
"""

from __future__ import annotations

import statistics
import time

from executor.forward_batch import build_forward_batch, synthetic_seqs

PROBE_BATCH, PROBE_CTX, PROBE_REPEATS = 64, 1024, 200


def host_probe(runner, batch: int = PROBE_BATCH, ctx: int = PROBE_CTX, repeats: int = PROBE_REPEATS) -> float:
    """Median seconds of building a ``batch``-sequence decode step's inputs at ``ctx`` tokens each (pages in order from
    page 0; the pages are only indexed, nothing is read or written), after ``repeats // 10`` unmeasured builds."""
    if batch < 1 or ctx < 1 or repeats < 1:
        raise ValueError(f"host_probe: batch, ctx and repeats must be >= 1, got {batch}, {ctx}, {repeats}")
    page = runner.page_size
    seqs, _ = synthetic_seqs([ctx] * batch, [], 1, 2, page, seed=0)
    times = []
    for j in range(repeats + repeats // 10):
        t0 = time.perf_counter()
        build_forward_batch(seqs, page, runner.kv.null_page, runner.device)
        if j >= repeats // 10:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)

