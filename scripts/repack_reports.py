"""Repack matrix run folders' ``reports.tgz`` (as a device call returns it) as ``reports.tar.xz``: the same members,
byte for byte, 28% smaller, which keeps the working tree the device copies under its 64 MiB limit. Checks every
member against the original before removing it.

    python3 scripts/repack_reports.py RUN [RUN ...]        # e.g. benchmarks/gpu/issue16_h100/run61_*
"""

from __future__ import annotations

import argparse
import io
import sys
import tarfile
from pathlib import Path


def repack(run: Path) -> tuple[int, int] | None:
    """(bytes before, after) for ``run``'s archive, None where it has no ``reports.tgz``."""
    src, dst = run / "reports.tgz", run / "reports.tar.xz"
    if not src.is_file():
        return None
    with tarfile.open(src) as t:
        members = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t.getmembers()]
    with tarfile.open(dst, "w:xz", preset=9) as out:
        for m, data in members:
            out.addfile(m, io.BytesIO(data) if data is not None else None)
    with tarfile.open(dst) as t:
        got = {m.name: (t.extractfile(m).read() if m.isfile() else None) for m in t.getmembers()}
    if got != {m.name: data for m, data in members}:
        dst.unlink()
        raise SystemExit(f"{run}: the repacked archive differs from reports.tgz; kept the original")
    before, after = src.stat().st_size, dst.stat().st_size
    src.unlink()
    return before, after


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    a = ap.parse_args(argv)
    total = [0, 0]
    for run in a.runs:
        got = repack(run)
        if got is None:
            print(f"{run}: no reports.tgz, skipped", file=sys.stderr)
            continue
        total[0] += got[0]
        total[1] += got[1]
        print(f"{run}: {got[0]:,} -> {got[1]:,} bytes")
    print(f"total {total[0]:,} -> {total[1]:,} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
