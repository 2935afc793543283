"""Memory is shown in the unit it is counted in: the catalog's HBM is GiB (CUDA's 140.4 GiB H200 is the vendor's '141 GB')."""

from __future__ import annotations

from typer.testing import CliRunner

from ui.cli import app


def test_cost_memory_table_is_in_gib():
    r = CliRunner().invoke(app, ["cost", "--hardware", "h200"], env={"COLUMNS": "160"})
    assert r.exit_code == 0, r.output
    row = next(line for line in r.output.splitlines() if "HBM" in line and "GiB" in line)
    assert "141.00 GiB" in row  # hbm_gb 141 taken as GiB: 141 * 2**30 bytes shown as 141 GiB, not "151.40 GB"
    assert "151.40" not in r.output


def test_hardware_catalog_labels_hbm_gib():
    r = CliRunner().invoke(app, ["hardware"], env={"COLUMNS": "250"})
    assert r.exit_code == 0 and "HBM GB" not in r.output
    top, bottom = [ln for ln in r.output.splitlines() if "HBM" in ln or "TF" in ln][:2]
    at = top.index("HBM")  # the two-line header: "HBM" over "GiB"
    assert bottom[at:at + 3] == "GiB", (top, bottom)


def test_catalog_tables_fit_80_columns_uncut():
    """`twinfer hardware` and `twinfer model` in an 80-column terminal: no header or model name cut to '…'."""
    from costmodels.catalog import list_models
    from costmodels.hardware import list_hardware

    for cmd, names in (("hardware", [h.name for h in list_hardware()]), ("model", list_models())):
        r = CliRunner().invoke(app, [cmd], env={"COLUMNS": "80"})
        assert r.exit_code == 0, r.output
        assert "…" not in r.output and max(len(line) for line in r.output.splitlines()) <= 80, r.output
        firsts = {line.split()[0] for line in r.output.splitlines() if line.strip()}
        assert set(names) <= firsts, set(names) - firsts  # every name whole, as --model / --hardware take it


def test_ui_memory_chart_is_in_gib_like_its_caption():
    """The What-fills-a-GPU chart once said 'HBM 151 GB' above a memory-fit caption saying 141.0 GiB (same HBM)."""
    import pytest

    pytest.importorskip("plotly")
    from ui import service
    from ui.app_breakdown import figures

    layout = {"tp": 8, "dp": 1, "ep": 8, "pp": 1, "weight_dtype": "fp8", "kv_dtype": "bf16"}
    bd = service.step_breakdown("deepseek-v3", "H200", layout, {"max_num_seqs": 64}, 16, 4096)
    _, mem = figures(bd)
    assert mem.layout.title.text == "HBM 141 GiB per GPU" and "141.0 GiB" in bd["fit"]
    assert mem.layout.xaxis.title.text == "GiB per GPU" and all("GiB" in t.hovertemplate for t in mem.data)
    assert sum(t.x[0] for t in mem.data) == pytest.approx(sum(bd["memory_bytes"].values()) / 2**30)


def test_hardware_catalog_hbm_is_what_cost_sizes():
    """The list said 288 GiB for GB300 and B300 while `cost --hw gb300` printed 279.00 GiB (hbm_visible_gb): the list
    shows what CUDA sees, and a caption gives the advertised figure beside it."""
    from costmodels.hardware import list_hardware

    r = CliRunner().invoke(app, ["hardware"], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    rows = {line.split()[0]: line.split() for line in r.output.splitlines() if line.strip()}
    for h in list_hardware():
        assert float(rows[h.name][4]) == h.hbm_bytes / 2**30, (h.name, rows[h.name])   # name, BF16, FP8, FP4, HBM
    assert "GB300 279 of 288 advertised" in " ".join(r.output.split())
    cost = CliRunner().invoke(app, ["cost", "--hardware", "gb300"], env={"COLUMNS": "160"})
    assert "279.00 GiB" in next(line for line in cost.output.splitlines() if "HBM" in line and "GiB" in line)
