"""``twinfer kernels``: which implementation of each op is available here, which one runs, and why."""

from __future__ import annotations

import json
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    """Add ``kernels`` to the CLI."""
    app.command("kernels", help="List kernel implementations per op (torch, Triton, FlashMLA, DeepGEMM, FlashInfer, DeepEP), the chosen one and why.")(kernels)


def kernels(
    device: Optional[str] = typer.Option(None, "--device", help="cpu or cuda [cuda if torch sees a GPU]"),
    as_json: bool = typer.Option(False, "--json", help="print JSON rows"),
) -> None:
    """Probe every library lazily and print the table."""
    from rich.console import Console
    from rich.table import Table

    from kernels import registry
    from twinfer.errors import TwinferError

    if device is None:
        try:
            import torch
            device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            device = "cpu"
    if device not in ("cpu", "cuda"):
        raise TwinferError(f"--device {device!r}: expected cpu or cuda")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise TwinferError("torch is not installed: the executor's kernels need it (pip install torch)") from None
    rows = registry.describe(device)
    if as_json:
        print(json.dumps({"device": device, "rows": rows}, indent=1))
        return
    tab = Table(title=f"kernels on {device} (override: TWINFER_KERNEL_<OP>=<impl>)")
    for col in ("op", "implementation", "tier", "found", "usable", "chosen", "why / notes"):
        tab.add_column(col)
    for r in rows:
        why = r["why"] + (f" [{r['notes']}]" if r["notes"] else "")
        tab.add_row(r["op"], r["impl"], str(r["tier"]), "yes" if r["found"] else "no", "yes" if r["usable"] else "no",
                    "*" if r["chosen"] else "", why)
    Console().print(tab)
