"""Fuzz every user-file loader: mutated valid documents, random documents, damaged text.

The only acceptable outcomes are "loaded" and a TwinferError with a message (test_fuzz_helpers.check_loader).
Deterministic (derandomize=True) and bounded, so the suite stays fast and repeatable.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_fuzz_helpers import KINDS, NASTY, check_loader, dump, mutate, paths_of

FUZZ = settings(max_examples=60, derandomize=True, deadline=None, database=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])

_SEEDS = {kind: factory() for kind, (factory, _, _) in KINDS.items()}

# JSON-ish leaves and small nested structures
_leaf = st.one_of(st.sampled_from(NASTY), st.integers(), st.floats(), st.text(max_size=12), st.booleans(), st.none())
_value = st.recursive(_leaf, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                      max_leaves=8)


def _fmt(kind: str) -> str:
    name = KINDS[kind][1]
    return "jsonl" if name.endswith(".jsonl") else "json" if name.endswith(".json") else "yaml"


@st.composite
def _mutated(draw, kind: str):
    doc = _SEEDS[kind]
    for _ in range(draw(st.integers(1, 3))):
        paths = paths_of(doc)
        path = paths[draw(st.integers(0, len(paths) - 1))]
        op = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add", "wrap"]))
        if op == "delete" and not path:
            op = "replace"
        doc = mutate(doc, path, op, draw(_value))
    return doc


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_seed_documents_load(kind):
    with tempfile.TemporaryDirectory() as tmp:
        assert check_loader(kind, dump(_SEEDS[kind], _fmt(kind)), Path(tmp)) is None


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_mutated_documents_load_or_say_why(kind):
    fmt = _fmt(kind)

    @FUZZ
    @given(doc=_mutated(kind))
    def run(doc):
        with tempfile.TemporaryDirectory() as tmp:
            check_loader(kind, dump(doc, fmt) if fmt != "json" else _json(doc), Path(tmp))

    run()


def _json(doc) -> str:
    import json

    return json.dumps(doc)  # NaN and Infinity as Python writes them: JSON parsers differ on them


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_random_documents_load_or_say_why(kind):
    fmt = _fmt(kind)

    @settings(FUZZ, max_examples=25)
    @given(doc=_value)
    def run(doc):
        with tempfile.TemporaryDirectory() as tmp:
            check_loader(kind, dump(doc, fmt) if fmt != "json" else _json(doc), Path(tmp))

    run()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_damaged_text_loads_or_says_why(kind):
    """Truncated files, flipped characters and inserted garbage."""
    text = dump(_SEEDS[kind], _fmt(kind))

    @settings(FUZZ, max_examples=25)
    @given(cut=st.integers(0, len(text)), pos=st.integers(0, len(text)),
           junk=st.text(alphabet=st.characters(codec="utf-8"), max_size=6) | st.sampled_from(
               ["{", "[", "]", "}", ":", "\n", "- ", "*a", "&a ", "!!python/object:os.system", "\t", "\ufeff", "'", '"']))
    def run(cut, pos, junk):
        damaged = text[:pos] + junk + text[pos:]
        damaged = damaged[: max(cut, 1)] if cut < len(text) // 2 else damaged
        with tempfile.TemporaryDirectory() as tmp:
            check_loader(kind, damaged, Path(tmp))

    run()


@pytest.mark.parametrize("kind", ["scenario", "hardware", "model_spec", "plan"])
def test_binary_and_odd_files_say_why(kind):
    with tempfile.TemporaryDirectory() as tmp:
        for raw in (b"", b"\xff\xfe\x00\x01 binary", b"\x89PNG\r\n\x1a\n", b"---\n- a\n- b\n", b"42", b"null", b"~"):
            check_loader(kind, raw, Path(tmp))
