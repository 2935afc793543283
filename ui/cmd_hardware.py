"""``twinfer hardware``: the GPU catalog, a commented file to describe your own GPU, and a check of one."""

from __future__ import annotations

from importlib import resources
from typing import Optional

import typer

from twinfer.config import validate
from twinfer.errors import TwinferError


def template_text() -> str:
    """The commented hardware file ``--template`` prints: the A100-SXM4-80GB example with every field described."""
    import yaml

    from costmodels.hardware import SCHEMA_VERSION, Hardware
    from ui.commented_yaml import commented_yaml

    path = "data/hardware_template.yaml"
    hw = validate(Hardware, yaml.safe_load(resources.files("costmodels").joinpath(path).read_text(encoding="utf-8")), f"costmodels/{path}")
    return commented_yaml(hw, [
        f"twinfer hardware file, schema version {SCHEMA_VERSION} (docs/byo.md). Rates are dense (no 2:4 sparsity), per GPU.",
        "Example: NVIDIA A100-SXM4-80GB. Edit the numbers, keep the field names; pass the file's path as --hardware.",
        "A feature the GPU lacks is null (or 0): fp8_tflops/fp4_tflops (no FP8/FP4 tensor cores), scaleup_gbps (no NVLink).",
        "",
    ])


def show_text(name: str) -> str:
    """A catalog GPU (or a hardware file) as a complete commented file."""
    from costmodels.hardware import get_hardware
    from ui.commented_yaml import commented_yaml

    from twinfer.config import not_a_file

    what = not_a_file(name) if name.strip() else None
    if what:   # read "unknown hardware '/dev/null'"
        raise TwinferError(f"--show {name}: {what}; give a catalog GPU name or a hardware YAML/JSON file")
    try:
        hw = get_hardware(name)
    except TwinferError as e:
        raise TwinferError(f"--show: {e}") from None
    return commented_yaml(hw, [f"twinfer hardware file for {hw.name} (schema version {hw.schema_version}, docs/byo.md)", ""])


def register(app: typer.Typer) -> None:
    """Add ``hardware`` to the CLI."""

    @app.command("hardware")
    def hardware(
        template: bool = typer.Option(False, "--template", help="print a complete, commented hardware YAML to start your own GPU from"),
        show: Optional[str] = typer.Option(None, "--show", help="print a catalog GPU (or check a hardware file) as a complete commented YAML"),
    ) -> None:
        """List the GPU catalog; --template / --show print a hardware file to edit (pass its path as --hardware)."""
        if template and show is not None:
            raise TwinferError("--template and --show: give one of them")
        if template:
            print(template_text(), end="")
            return
        if show is not None:
            print(show_text(show), end="")
            return
        _print_catalog()


def _print_catalog() -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from costmodels.hardware import list_hardware

    def num(x) -> str:
        return "-" if x is None else f"{x:g}"

    # two-line headers and no box padding: 11 columns fit an 80-column terminal (a boxed table cut them to "sca…")
    tab = Table(title="hardware catalog (dense rates per GPU; your own: twinfer hardware --template > my_gpu.yaml)", title_justify="left",
                box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 0))
    for c in ("name", "BF16\nTF", "FP8\nTF", "FP4\nTF", "HBM\nGiB", "HBM\nTB/s", "scale-up\nGB/s/dir", "domain", "scale-out\nGb/s",
              "$/GPU\n-hour", "measured"):
        tab.add_column(c, justify="left" if c == "name" else "right", no_wrap=True)
    below = []
    for h in list_hardware():
        # the HBM CUDA sees, which the memory fit sizes and `cost` prints (GB300: 279 GiB of 288 advertised)
        tab.add_row(h.name, num(h.bf16_tflops), num(h.fp8_tflops), num(h.fp4_tflops), num(h.hbm_visible_gb or h.hbm_gb),
                    num(h.hbm_tbps), num(h.scaleup_gbps), str(h.scaleup_domain), num(h.scaleout_gbps),
                    num(h.price_per_gpu_hour or None), "yes" if h.measured else "")
        if h.hbm_visible_gb is not None and h.hbm_visible_gb != h.hbm_gb:
            below.append(f"{h.name} {num(h.hbm_visible_gb)} of {num(h.hbm_gb)} advertised")
    if below:
        tab.caption = (f"HBM GiB: what CUDA sees, which the memory fit sizes ({'; '.join(below)}: hbm_visible_gb and "
                       "hbm_gb in twinfer hardware --show NAME)")
        tab.caption_justify = "left"
    Console().print(tab)
