"""Refuse, before allocating, an executor build the host's memory cannot hold.

On the CPU the weights and the paged KV cache live in host memory: a build past what is available does not fail
cleanly, it swaps the machine or gets the process OOM-killed (`twinfer run -m deepseek-v3 --device cpu`: 671B
parameters). A GPU build past its memory fails at once with torch's out-of-memory error, so only the CPU is checked.
"""

from __future__ import annotations

import torch

from twinfer.errors import TwinferError

GIB = 1 << 30


def host_available_bytes() -> int | None:
    """Memory the kernel says a new allocation can have without swapping (/proc/meminfo MemAvailable); None where
    that is not known (not Linux): then nothing is refused."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_room(need_bytes: float, device: torch.device | str, what: str, shrink: str) -> None:
    """Raise a TwinferError when ``need_bytes`` exceed the host memory available (CPU devices only): ``what`` is the
    message up to the amount ('tiny on the CPU: the weights need'), ``shrink`` what to change."""
    if torch.device(device).type != "cpu":
        return
    have = host_available_bytes()
    if have is not None and need_bytes > have:
        raise TwinferError(f"{what} {need_bytes / GIB:,.1f} GiB, more than the {have / GIB:,.1f} GiB of host memory "
                           f"available here; {shrink}")
