"""Shared pytest setup: GPU tests run only where CUDA is available."""

from __future__ import annotations

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


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
