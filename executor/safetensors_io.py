"""Read and write ``.safetensors`` files: the ``safetensors`` library when installed, else a
minimal reader/writer of the format (8-byte little-endian header length, JSON header of
dtype/shape/offsets, raw little-endian bytes), so loading works without the extra package.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def has_library() -> bool:
    """Whether the ``safetensors`` package is importable."""
    try:
        import safetensors.torch  # noqa: F401
        return True
    except ImportError:
        return False


def iter_tensors(path: str | Path):
    """Yield ``(name, tensor)`` from one file (CPU tensors), one at a time."""
    if has_library():
        from safetensors import safe_open
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
        return
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            start, end = meta["data_offsets"]
            f.seek(base + start)
            buf = bytearray(f.read(end - start))
            dt = _DTYPES[meta["dtype"]]
            t = torch.frombuffer(buf, dtype=dt) if buf else torch.empty(0, dtype=dt)
            yield name, t.reshape(meta["shape"])


def save_file(tensors: dict[str, torch.Tensor], path: str | Path) -> None:
    """Write ``tensors`` to ``path``."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    if has_library():
        from safetensors.torch import save_file as _save
        _save(tensors, str(path))
        return
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
