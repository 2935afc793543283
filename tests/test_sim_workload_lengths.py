"""Length distributions: sampling, means, validation that names the field."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter, ValidationError

from sim.lengths import LengthDist, LognormalLength

TA = TypeAdapter(LengthDist)


class Holder(BaseModel):
    input_len: LengthDist


def _mc_mean(spec: dict, n: int = 200_000) -> tuple[float, float]:
    d = TA.validate_python(spec)
    x = d.sample(np.random.default_rng(0), n)
    assert x.dtype == np.int64 and x.shape == (n,)
    return float(x.mean()), d.mean()


@pytest.mark.parametrize("spec", [
    {"kind": "fixed", "value": 1024},
    {"kind": "uniform", "min": 10, "max": 20},
    {"kind": "lognormal", "mean": 1500, "sigma": 0.8, "max": 32768},
    {"kind": "lognormal", "median": 400, "p90": 2000, "min": 16, "max": 4096},
    {"kind": "normal", "mean": 100, "std": 50, "min": 60, "max": 120},
    {"kind": "empirical", "values": [1, 10, 100], "weights": [1, 2, 1]},
])
def test_sample_mean_matches_mean(spec):
    sampled, analytic = _mc_mean(spec)
    assert sampled == pytest.approx(analytic, rel=0.01, abs=0.5)


def test_lognormal_median_p90_parametrisation():
    d = TA.validate_python({"kind": "lognormal", "median": 1000, "p90": 3000, "max": 10**9})
    x = d.sample_float(np.random.default_rng(1), 200_000)
    assert np.median(x) == pytest.approx(1000, rel=0.02)
    assert np.percentile(x, 90) == pytest.approx(3000, rel=0.02)


def test_bare_number_is_fixed_and_dump_round_trips():
    h = Holder(input_len=512)
    assert h.input_len.kind == "fixed" and h.input_len.value == 512
    ln = Holder(input_len={"kind": "lognormal", "mean": 1500, "sigma": 0.8})
    dumped = ln.model_dump()
    assert dumped["input_len"]["mean"] == 1500  # the config name, not the python attribute
    assert Holder.model_validate(dumped) == ln


@pytest.mark.parametrize("spec, field, words", [
    ({"kind": "uniform", "min": 5, "max": 1}, "input_len.uniform", "max (1) must be >= min (5)"),
    ({"kind": "lognormal", "mean": 5}, "input_len.lognormal", "either mean and sigma, or median and p90"),
    ({"kind": "lognormal", "median": 5, "p90": 4}, "input_len.lognormal", "p90 (4) must be > median (5)"),
    ({"kind": "fixed", "value": -1}, "input_len.fixed.value", "greater than or equal to 0"),
    ({"kind": "normal", "mean": 5, "std": -1}, "input_len.normal.std", "greater than or equal to 0"),
    ({"kind": "empirical", "values": [1, 2], "weights": [1]}, "input_len.empirical", "weights has 1 entries"),
    ({"kind": "empirical", "values": [1, 2], "weights": [0, 0]}, "input_len.empirical", "not all zero"),
    ({"kind": "zipf"}, "input_len", "does not match any of the expected tags"),
])
def test_validation_names_the_field(spec, field, words):
    with pytest.raises(ValidationError) as e:
        Holder(input_len=spec)
    err = e.value.errors()[0]
    assert ".".join(str(p) for p in err["loc"]) == field
    assert words in err["msg"]


def test_empirical_from_csv(tmp_path):
    p = tmp_path / "lens.csv"
    p.write_text("len,count\n100,3\n200,1\n")
    d = TA.validate_python({"kind": "empirical", "csv_path": str(p), "column": "len", "weight_column": "count"})
    assert d.mean() == pytest.approx(125.0)
    assert set(d.sample(np.random.default_rng(0), 1000).tolist()) == {100, 200}
    with pytest.raises(ValidationError, match="no column 'nope'"):
        TA.validate_python({"kind": "empirical", "csv_path": str(p), "column": "nope"})
    p.write_text("len\n100\nabc\n")
    with pytest.raises(ValidationError, match=r"lens.csv:3: len: not a number"):
        TA.validate_python({"kind": "empirical", "csv_path": str(p)})


@settings(max_examples=60, deadline=None)
@given(
    lo=st.integers(1, 5000), span=st.integers(0, 5000), sigma=st.floats(0.05, 3.0),
    mean=st.floats(1.0, 1e5), seed=st.integers(0, 2**32 - 1),
)
def test_lognormal_samples_stay_in_bounds(lo, span, sigma, mean, seed):
    d = LognormalLength(mean=mean, sigma=sigma, min=lo, max=lo + span)
    x = d.sample(np.random.default_rng(seed), 500)
    assert x.min() >= lo and x.max() <= lo + span
    assert lo <= d.mean() <= lo + span + 1e-9
