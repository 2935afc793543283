"""Host microseconds of ``executor.forward_batch.build_forward_batch`` for decode batches (the input build a decode
step pays before its CUDA graph replays; issue 18: a decode step spends 1.9-2.8 ms outside its graph on the H200).
CPU only: the device copy is not timed (on CUDA it is one pinned, non-blocking copy).

    python3 benchmarks/forward_batch_host.py
"""

from __future__ import annotations

import time

import torch

from executor.forward_batch import SeqInput, build_forward_batch


def main() -> None:
    print("batch  context  us per build (median of 7 x 200 calls)")
    for b, ctx in ((1, 1000), (16, 1000), (64, 1000), (128, 1000), (64, 4000), (128, 8000)):
        pages = -(-ctx // 64) + 1
        seqs = [SeqInput([5], ctx, list(range(i * pages, (i + 1) * pages)), True) for i in range(b)]
        build_forward_batch(seqs, 64, 0, torch.device("cpu"))
        runs = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(200):
                build_forward_batch(seqs, 64, 0, torch.device("cpu"))
            runs.append((time.perf_counter() - t) / 200 * 1e6)
        print(f"{b:5d}  {ctx:7d}  {sorted(runs)[3]:8.0f}")


if __name__ == "__main__":
    main()
