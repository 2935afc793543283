"""Shared pieces of the loader fuzz tests (no tests here): the loaders, their seed documents, mutations, and the oracle.

Also: tests/fuzz_corpus/README.md. A loader may accept a file or refuse it with a TwinferError whose message says what is wrong;
any other exception (KeyError, ZeroDivisionError, OverflowError, RecursionError, MemoryError, ...)
is a bug. Inputs that once broke a loader live in tests/fuzz_corpus/<kind>/ and are replayed by
test_fuzz_corpus.py.
"""

from __future__ import annotations

import copy
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import yaml

from twinfer.errors import TwinferError

CORPUS = Path(__file__).parent / "fuzz_corpus"

# values that have broken parsers before, in some project or other
NASTY: list[Any] = [
    None, True, False, 0, -1, 1, 2, 3, 7, 64, 1023, 2**31, 2**63, 2**64, -(2**63), 10**30, -(10**30),
    0.0, -0.0, 1e-300, 5e-324, 1e308, -1e308, 0.5, 1.5, float("inf"), float("-inf"), float("nan"),
    "", " ", "0", "-1", "1e999", "nan", "inf", "x" * 300, "\x00", "../../etc/passwd", "auto", "fp8", "fp4",
    "mixed", "prefill", "decode", "trace", "poisson", "agentic", "gamma", "lognormal", "uniform", "fixed",
    [], [0], [1, 2, 3], [[1]], {}, {"a": 1}, {"kind": "fixed", "value": 0}, {"preset": "chat"},
]


# ----------------------------------------------------------------------------- seed documents


def _scenario_seed() -> dict:
    return yaml.safe_load(resources.files("sim").joinpath("data/default.yaml").read_text(encoding="utf-8"))


def _agentic_scenario_seed() -> dict:
    d = _scenario_seed()
    d["workload"] = {"preset": "agentic", "rate": 3.0, "num_requests": 50, "shared_prefix_len": 512}
    d["scheduler"] = {"max_num_seqs": 64, "max_num_batched_tokens": 4096, "draft_len": 1, "acceptance_rates": [0.8]}
    d["instances"] = 2
    d["router"] = {"kind": "prefix_aware", "load_threshold": 0.5}
    return d


def _plan_seed() -> dict:
    from planner.plan import Plan

    plan = Plan(model="deepseek-v3", hardware="H200", gpus_budget=16, mode="disaggregated",
                pools=[{"role": "prefill", "instances": 1, "layout": {"tp": 8, "weight_dtype": "fp8"}, "scheduler": {}},
                       {"role": "decode", "instances": 1, "layout": {"dp": 8, "ep": 8, "weight_dtype": "fp8"},
                        "scheduler": {"max_num_seqs": 128}}],
                workload={"preset": "chat", "rate": 5.0, "num_requests": 100}, slo={"ttft_s": 2.0, "tpot_s": 0.1})
    return yaml.safe_load(plan.to_yaml())


def _hardware_seed() -> dict:
    entries = yaml.safe_load(resources.files("costmodels").joinpath("data/hardware.yaml").read_text(encoding="utf-8"))
    return next(e for e in entries if e["name"].lower() == "h200")


def _hf_seed(name: str) -> dict:
    entry = json.loads(resources.files("costmodels").joinpath(f"data/models/{name}.json").read_text(encoding="utf-8"))
    return entry["hf_config"]


def _spec_seed() -> dict:
    return yaml.safe_load(resources.files("costmodels").joinpath("data/models/tiny.yaml").read_text(encoding="utf-8"))["spec"]


def _trace_seed(name: str) -> list[dict]:
    text = resources.files("sim").joinpath(f"data/traces/{name}.jsonl").read_text(encoding="utf-8")
    return [json.loads(x) for x in text.splitlines()[:6] if x.strip()]


# ----------------------------------------------------------------------------- loaders


def load_scenario_and_workload(path: Path) -> None:
    """Load a scenario, then build a few of its requests (a workload can pass validation and still not generate)."""
    import numpy as np

    from sim.scenario import load_scenario
    from sim.workload import generate

    sc = load_scenario(path)
    wl = sc.workload
    if wl.kind != "trace":
        small = wl.model_copy(update={"num_requests": min(wl.num_requests or 20, 20)})
        generate(small, np.random.default_rng(0), sc.scheduler.block_size)


def load_plan(path: Path) -> None:
    """Load a plan, then turn it into the Scenario `twinfer simulate --plan` runs."""
    from planner.plan import load_plan as _load

    _load(path).to_scenario(num_requests=10)


def load_hardware(path: Path) -> None:
    from costmodels.hardware import get_hardware

    get_hardware(str(path))


def load_model_config(path: Path) -> None:
    """An HF config.json or a ModelSpec file, then the memory fit that `twinfer cost` starts with."""
    from costmodels.catalog import get_model

    get_model(str(path))


def load_trace(fmt: str) -> Callable[[Path], None]:
    def load(path: Path) -> None:
        from sim.traces import read_trace

        read_trace(path, 64, fmt)
        read_trace(path, 16, fmt, max_requests=3, time_unit="ms")
    return load


def _calibration_seed() -> dict:
    from costmodels.calibration import CalibrationProfile

    prof = CalibrationProfile.default()
    data = json.loads(json.dumps(prof.model_dump()))
    data["tables"] = {"gemm_mem": {"x": [1e6, 1e8, 1e9], "y": [0.2, 0.7, 0.85], "x_is": "bytes"}}
    return data


def _plan_request_seed() -> dict:
    return {"model": "deepseek-v3", "hardware": "H200", "gpus": 16, "slo": {"ttft_s": 2.0, "tpot_s": 0.05},
            "workload": {"preset": "chat", "rate": 5.0}, "space": {"modes": ["aggregated"]}}


def load_calibration(path: Path) -> None:
    from costmodels.calibration import CalibrationProfile

    CalibrationProfile.load(path)


def load_plan_request(path: Path) -> None:
    """``twinfer plan --config FILE`` reads it this way (search not run)."""
    from ui.cmd_plan import build_request

    build_request(str(path))


# kind -> (seed factory, file name, loader); file names matter: get_model reads config.json as HF
KINDS: dict[str, tuple[Callable[[], Any], str, Callable[[Path], None]]] = {
    "scenario": (_scenario_seed, "scenario.yaml", load_scenario_and_workload),
    "scenario_agentic": (_agentic_scenario_seed, "scenario.json", load_scenario_and_workload),
    "plan": (_plan_seed, "plan.yaml", load_plan),
    "hardware": (_hardware_seed, "gpu.yaml", load_hardware),
    "hf_config": (lambda: _hf_seed("deepseek-v3"), "config.json", load_model_config),
    "hf_config_v4": (lambda: _hf_seed("deepseek-v4-flash"), "config.json", load_model_config),
    "hf_config_qwen": (lambda: _hf_seed("qwen3-30b-a3b"), "config.json", load_model_config),
    "model_spec": (_spec_seed, "model.yaml", load_model_config),
    "trace_jsonl": (lambda: _trace_seed("sample_chat"), "trace.jsonl", load_trace("jsonl")),
    "trace_mooncake": (lambda: _trace_seed("sample_mooncake"), "trace.jsonl", load_trace("mooncake")),
    "calibration": (_calibration_seed, "profile.json", load_calibration),
    "plan_request": (_plan_request_seed, "request.yaml", load_plan_request),
}


# ----------------------------------------------------------------------------- documents <-> text


def dump(doc: Any, fmt: str) -> str:
    """A document as file text: 'yaml', 'json', or 'jsonl' (a list of line objects)."""
    if fmt == "jsonl":
        rows = doc if isinstance(doc, list) else [doc]
        return "\n".join(json.dumps(r) if not isinstance(r, str) else r for r in rows) + "\n"
    if fmt == "json":
        return json.dumps(doc)
    return yaml.safe_dump(doc, sort_keys=False)


def paths_of(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every location in a document, the root included, in a stable order."""
    out = [prefix]
    if isinstance(doc, dict):
        for k in doc:
            out += paths_of(doc[k], prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += paths_of(v, prefix + (i,))
    return out


def mutate(doc: Any, path: tuple, op: str, value: Any) -> Any:
    """A copy of ``doc`` with one change at ``path``: replace, delete, add a key, or wrap in a list."""
    doc = copy.deepcopy(doc)
    if not path:
        return value if op == "replace" else [doc] if op == "wrap" else doc
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    last = path[-1]
    if op == "replace":
        parent[last] = value
    elif op == "delete":
        del parent[last]
    elif op == "wrap":
        parent[last] = [parent[last]]
    elif op == "add" and isinstance(parent[last], dict):
        parent[last][str(value)[:20]] = value
    elif op == "add" and isinstance(parent[last], list):
        parent[last].append(value)
    else:
        parent[last] = value
    return doc


# ----------------------------------------------------------------------------- the oracle


def check_loader(kind: str, text: str | bytes, tmp: Path) -> str | None:
    """Write ``text`` as ``kind``'s file and load it: None if accepted, the message if refused.

    Any exception other than TwinferError fails the test, naming the kind and the input.
    """
    _, name, loader = KINDS[kind]
    folder = tmp / kind
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        loader(path)
    except TwinferError as err:
        msg = str(err)
        assert msg.strip(), f"{kind}: TwinferError with an empty message"
        return msg
    except Exception as err:  # noqa: BLE001 - the point of the test
        shown = text if len(text) < 4000 else text[:4000] + "...(truncated)"
        raise AssertionError(f"{kind}: {type(err).__name__}: {err}\n--- input ---\n{shown!r}") from err
    return None


def finite_json(value: Any) -> bool:
    """Whether json.dumps can write ``value`` without NaN/inf (YAML can hold them)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite_json(v) for v in value.values())
    if isinstance(value, list):
        return all(finite_json(v) for v in value)
    return True
