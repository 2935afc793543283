"""Replay tests/fuzz_corpus: every input that once crashed a loader is now refused with a clear message."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest

from test_fuzz_helpers import CORPUS, KINDS, check_loader

CASES = sorted(p for p in CORPUS.glob("*/*") if p.is_file() and p.parent.name in KINDS)


def test_the_corpus_is_not_empty_and_every_folder_is_a_kind():
    assert len(CASES) >= 20
    folders = {p.name for p in CORPUS.iterdir() if p.is_dir()}
    assert folders <= set(KINDS), folders - set(KINDS)


@pytest.mark.parametrize("case", CASES, ids=[f"{p.parent.name}/{p.name}" for p in CASES])
def test_corpus_input_is_refused_with_a_message(case):
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        msg = check_loader(case.parent.name, case.read_text(encoding="utf-8"), Path(tmp))
    assert msg is not None, f"{case.name} now loads: if that is right, move it out of the corpus"
    assert len(msg) < 4000  # one clear message, not a dump of the input
    assert time.monotonic() - t0 < 10  # refused up front, not after exhausting memory or time


def test_plan_naming_an_unknown_gpu_fails_cleanly_when_simulated():
    """Turning a plan naming an unknown GPU into a Scenario raises TwinferError (a clean CLI
    error), not pydantic's ValidationError (an 'internal error')."""
    from planner.plan import load_plan
    from twinfer.errors import TwinferError
    import yaml

    from test_fuzz_helpers import _plan_seed

    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "plan.yaml"
        p.write_text(yaml.safe_dump({**_plan_seed(), "hardware": "H2OO"}), encoding="utf-8")
        try:
            load_plan(p).to_scenario(num_requests=10)
        except TwinferError:
            return
        pytest.fail("a plan naming an unknown GPU was accepted")
