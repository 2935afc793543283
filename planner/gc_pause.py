"""Python's cyclic garbage collector paused for the length of one simulation.

A simulation builds millions of long-lived objects (a radix-tree node per cached KV block, requests,
simpy events), and every few hundred allocations the collector walks the young ones, every so often
all of them: in the 72 x GB300 agentic planning question that walk was about a third of the CPU.
When the block ends, one full collection frees the run's reference cycles (simpy's events and
processes hold some), so back-to-back runs do not pile up garbage. Pausing the collector changes no
result (nothing in a run depends on when garbage is freed): only the CPU spent.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def gc_paused():
    """Disable the cyclic garbage collector inside the block; if it was on, turn it back on after the block and
    collect once."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
            gc.collect()
