"""Uploaded files (HF config.json, hardware YAML, traces): size-limited, validated, stored by content.

The packages below take models, hardware and traces as names or file paths, so an upload is
written once to a content-addressed file (sha256 of its bytes) and that path is what the rest
of the app passes around: the same bytes give the same path, which keeps st.cache_data keys
stable across reruns and sessions. Nothing here imports streamlit, so tests call it directly.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import yaml

from twinfer.errors import TwinferError

# Uploads are small text files; 5 MB holds a 20k-line trace. The Streamlit server is also
# started with server.maxUploadSize so the browser refuses bigger files before sending them.
MAX_UPLOAD_BYTES = 5 * 1024 * 1024
# ...and what they expand to: a trace's hash ids become block hashes (~40 bytes each); a few coarse
# ids on long prompts would turn kilobytes into gigabytes. 4M hashes of 16 tokens (~160 MB) hold a
# 20k-line trace of 3k-token prompts; measured at 16 tokens, the smallest block size the app offers.
MAX_UPLOAD_BLOCK_HASHES = 4_000_000
UPLOAD_HASH_BLOCK = 16


def upload_dir() -> Path:
    """Where uploads live: $TWINFER_UI_UPLOADS or a per-user temp folder."""
    d = Path(os.environ.get("TWINFER_UI_UPLOADS") or Path(tempfile.gettempdir()) / f"twinfer-ui-{os.getuid()}")
    d.mkdir(parents=True, exist_ok=True)
    return d


def _check_size(name: str, data: bytes) -> None:
    if len(data) > MAX_UPLOAD_BYTES:
        raise TwinferError(f"{name}: {len(data) / 2**20:.1f} MB is over the {MAX_UPLOAD_BYTES // 2**20} MB upload limit")
    if not data.strip():
        raise TwinferError(f"{name}: the file is empty")


def _store(data: bytes, filename: str) -> Path:
    """Write ``data`` under a folder named by its digest; returns the file's path."""
    digest = hashlib.sha256(data).hexdigest()[:16]
    folder = upload_dir() / digest
    folder.mkdir(exist_ok=True)
    path = folder / filename
    if not path.is_file():
        tmp = path.with_suffix(path.suffix + ".part")
        tmp.write_bytes(data)
        tmp.replace(path)  # atomic: a concurrent session never reads half a file
    return path


def _text(name: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise TwinferError(f"{name}: not UTF-8 text") from None


def save_model_config(name: str, data: bytes) -> str:
    """Validate an uploaded HF ``config.json`` and return the path the model catalog accepts."""
    _check_size(name, data)
    try:
        cfg = json.loads(_text(name, data))
    except ValueError as e:  # JSONDecodeError, or an integer of more than 4,300 digits
        raise TwinferError(f"{name}: not valid JSON ({str(e).split('; use sys.')[0]})") from None
    except RecursionError:
        raise TwinferError(f"{name}: not valid JSON (nested too deeply)") from None
    if not isinstance(cfg, dict) or not ("model_type" in cfg or "architectures" in cfg):
        raise TwinferError(f"{name}: not a Hugging Face config.json (needs 'model_type' or 'architectures')")
    from costmodels.catalog import get_model

    # the folder name becomes the model's name (catalog.get_model names a config.json by its folder)
    stem = Path(name).stem if Path(name).stem != "config" else str(cfg.get("model_type", "uploaded"))
    path = _store(data, "config.json")
    named = path.parent / _safe(stem) / "config.json"
    named.parent.mkdir(exist_ok=True)
    if not named.is_file():
        named.write_bytes(data)
    get_model(str(named))  # raises TwinferError naming the missing/invalid field
    return str(named)


def save_hardware_yaml(name: str, data: bytes) -> str:
    """Validate an uploaded hardware YAML/JSON (the catalog's fields) and return its path."""
    _check_size(name, data)
    try:
        parsed = yaml.safe_load(_text(name, data))
    except (yaml.YAMLError, ValueError) as e:  # ValueError: an integer of more than 4,300 digits
        raise TwinferError(f"{name}: not valid YAML ({str(e).split('; use sys.')[0]})") from None
    except RecursionError:
        raise TwinferError(f"{name}: not valid YAML (nested too deeply)") from None
    if not isinstance(parsed, dict):
        raise TwinferError(f"{name}: expected a mapping of hardware fields (name, bf16_tflops, hbm_gb, ...)")
    from twinfer.config import check_data
    check_data(parsed, name)  # YAML alias bombs, deep nesting, NaN: refused before validation walks them
    return save_hardware_mapping(parsed, source=name)


def save_hardware_mapping(fields: dict, source: str = "custom hardware") -> str:
    """Validate a hardware mapping (from the form or a file) and write it as YAML; returns its path."""
    from costmodels.hardware import Hardware, get_hardware
    from twinfer.config import validate

    hw = validate(Hardware, fields, source)
    data = yaml.safe_dump(hw.model_dump(exclude_none=True), sort_keys=True).encode()
    path = _store(data, f"{_safe(hw.name)}.yaml")
    get_hardware(str(path))
    return str(path)


def save_trace(name: str, data: bytes, fmt: str) -> str:
    """Validate an uploaded trace (twinfer JSONL or Mooncake) and return its path."""
    _check_size(name, data)
    _text(name, data)
    from sim.traces import read_trace

    path = _store(data, "trace.jsonl")
    # raises TwinferError listing the bad lines, or naming the budget the hashes would exceed
    try:
        read_trace(path, UPLOAD_HASH_BLOCK, fmt, max_block_hashes=MAX_UPLOAD_BLOCK_HASHES)
    except TwinferError as e:  # name the upload, not the content-addressed copy
        raise TwinferError(str(e).replace(str(path), name)) from None  # an empty trace too (read_trace refuses it)
    return str(path)


def _safe(stem: str) -> str:
    """A file-name-safe version of a user-given name."""
    out = "".join(c if c.isalnum() or c in "-_." else "-" for c in stem).strip("-.")
    return out[:64] or "uploaded"
