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
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU whose measured op tables give each kernel's fraction of the ceiling [the CUDA device]"),
) -> None:
    """Probe every library lazily and print the table."""
    from rich import box
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
        import torch
    except ImportError:
        raise TwinferError("torch is not installed: the executor's kernels need it (pip install 'twinfer[executor]')") from None
    rows = registry.describe(device)
    if device == "cuda" and not torch.cuda.is_available():
        # what is installed, each row's reason says why it is not usable: nothing is chosen without a GPU
        Console(stderr=True).print("[yellow]warning:[/] --device cuda: torch sees no CUDA device here, so no "
                                   "implementation can be chosen; the rows say what is installed", highlight=False)
    gpu, measured_note = _attach_measured(rows, gpu, device)
    from kernels import gemm_tuning
    tiles = gemm_tuning.status(gpu)
    for r in rows:
        if r["op"] == "fp8_gemm" and r["impl"] == "triton":
            r["notes"] = "; ".join(x for x in (r["notes"], tiles) if x)
    if as_json:
        print(json.dumps({"device": device, "gpu": gpu, "measured": measured_note, "rows": rows}, indent=1))
        return
    # op and implementation are what TWINFER_KERNEL_<OP>=<impl> takes: never cut (a boxed 80-column table cut them
    # to "mla_dec…"); the prose columns fold
    tab = Table(title=f"kernels on {device} (override: TWINFER_KERNEL_<OP>=<impl>)", title_justify="left",
                box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
    prose = ("why / notes", f"measured on {gpu or '?'}")
    for col in ("op", "implementation", "tier", "found", "usable", "chosen") + prose:
        tab.add_column(col, no_wrap=col not in prose, overflow="fold", ratio=1 if col in prose else None)
    for r in rows:
        why = r["why"] + (f" [{r['notes']}]" if r["notes"] else "")
        tab.add_row(r["op"], r["impl"], str(r["tier"]), "yes" if r["found"] else "no", "yes" if r["usable"] else "no",
                    "*" if r["chosen"] else "", why, r["measured"])
    Console().print(tab)
    Console().print(measured_note)


def _attach_measured(rows: list[dict], gpu: str | None, device: str) -> tuple[str | None, str]:
    """Add each row's measured fraction of the ceiling from the GPU's op tables (or why there is none)."""
    from costmodels.hardware import get_hardware
    from costmodels.op_table import DATA
    from kernels import measured
    from twinfer.errors import TwinferError

    if gpu is None and device == "cuda":
        import torch
        gpu = torch.cuda.get_device_name().replace("NVIDIA ", "") if torch.cuda.is_available() else None
    elif gpu is not None:   # a name the catalog does not have is an error, not "no measured table"
        try:
            gpu = get_hardware(gpu).name
        except (TwinferError, ValueError, KeyError) as e:
            raise TwinferError(f"--gpu {gpu!r}: {e}") from None
    folder = DATA / gpu.lower() if gpu else None
    if folder is None or not (folder / "provenance.json").is_file():
        note = f"no measured table for {gpu}" if gpu else "no measured table (no GPU named: --gpu H200)"
        for r in rows:
            r["measured"] = "no measured table"
        return gpu, note
    try:
        hw = get_hardware(gpu)
    except (TwinferError, ValueError, KeyError) as e:
        raise TwinferError(f"--gpu {gpu!r}: {e}") from None
    peak, copy, whose = _ceilings(hw)
    fr = measured.fractions(folder, peak, copy)
    for r in rows:
        r["measured"] = measured.summary(fr.get((r["op"], r["impl"]))) if r["tier"] > 0 or (r["op"], r["impl"]) in fr else ""
    return gpu, (f"measured: device time inside CUDA graphs from {folder}; ceiling = max(TFLOP/s / {peak:g}, "
                 f"TB/s / {copy:g}) ({whose})")


def _ceilings(hw) -> tuple[float, float, str]:
    """The matmul TFLOP/s and copy TB/s a kernel's fraction is taken of, and where they come from: the GPU's measured
    FP8 matmul and copy ceilings (catalog ``measured:`` block), else its datasheet FP8 (BF16 without FP8 tensor cores)
    and HBM peaks, saying that no measured ceiling exists for it."""
    m = hw.measured
    mat = m.fp8_matmul_tflops if m is not None else None
    cp = m.copy_tbps if m is not None else None
    if mat is not None and cp is not None:
        return mat, cp, f"the {hw.name}'s measured FP8 matmul and copy ceilings"
    dt = "FP8" if hw.has_fp8 else "BF16"
    peak = mat if mat is not None else (hw.fp8_tflops if hw.has_fp8 else hw.bf16_tflops)
    copy = cp if cp is not None else hw.hbm_tbps
    missing = " and ".join(x for x, v in (("FP8 matmul", mat), ("copy", cp)) if v is None)
    used = (f"measured FP8 matmul {mat:g}" if mat is not None else f"datasheet {dt} peak {peak:g}") + " TFLOP/s, " + \
           (f"measured copy {cp:g}" if cp is not None else f"datasheet HBM peak {copy:g}") + " TB/s"
    return peak, copy, (f"no measured {missing} ceiling for the {hw.name} in the hardware catalog: fractions of its "
                        f"{used}, lower than fractions of measured ceilings")
