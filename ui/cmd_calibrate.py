"""``twinfer calibrate``: measure this executor's ops and steps on the current device and write a calibration profile."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Optional

import typer

from twinfer.errors import TwinferError

# executor.calibrate's line per timed step shape: "  step   3/10: ..."
STEP_LINE = re.compile(r"\s*step\s+(\d+)/(\d+):")


def register(app: typer.Typer) -> None:
    """Add ``calibrate`` to the CLI."""
    app.command("calibrate", help="Measure op efficiencies and step times (host overhead included) of the executor on this "
                                  "device; fit the step model; write a calibration profile JSON.")(calibrate)


def grid_for(path: Path, model: str, num_layers: Optional[int], profile=None):
    """``profile`` with the replay grid at ``path`` attached (``costmodels.replay_grid.attach``), checked against the model
    the executor builds from ``model`` and ``num_layers`` (its first n layers, as ``LLMEngine.from_args`` keeps them);
    a one-line error naming the flag and file when the file is not a grid or was measured on another model."""
    from costmodels.calibration import CalibrationProfile
    from costmodels.catalog import get_model
    from costmodels.replay_grid import GridError, attach
    from twinfer.errors import TwinferError

    spec = get_model(model)
    if num_layers is not None and num_layers < spec.num_layers:
        spec = spec.model_copy(update={"num_layers": num_layers, "layer_kinds": spec.layer_kinds[:num_layers] if spec.layer_kinds else []})
    try:
        return attach(profile or CalibrationProfile.default(), path, spec)
    except GridError as e:
        raise TwinferError(f"--replay-grid: {e}") from None   # every attach error names the file


def check_cpu_dtype(device: str, dtype: Optional[str]) -> None:
    """Refuse a CPU calibration in a dtype other than fp32: the CPU op benchmarks run fp32 activations whatever the
    engine's weights are (``executor/calibrate.py``), so every GEMM-bearing benchmark fails ("expected m1 and m2 to
    have the same dtype") and the profile lacks its op tables."""
    if device == "cpu" and dtype not in (None, "fp32"):
        raise TwinferError(f"--dtype {dtype} on --device cpu: the CPU op benchmarks run in fp32 only (in {dtype} they fail "
                           "and the profile lacks its op tables); give --dtype fp32 (the cpu default) or calibrate on cuda")


def sampler_line(smp) -> str:
    """The sampler table's line: its time at the smallest and the largest batch it measured (a fixed 1 and 128 rows
    printed "measured" for 128 where a quick CPU grid stops at 8: 552 ms extrapolated from 8 rows' 31 ms)."""
    pts = sorted(zip(smp.batch, smp.seconds))
    (b0, s0), (b1, s1) = pts[0], pts[-1]
    return (f"  {'logits GEMM + ' if smp.includes_logits else ''}sampler, measured: {s0 * 1e3:.3f} ms at {b0:g} "
            f"row{'s' if b0 != 1 else ''}, {s1 * 1e3:.3f} ms at {b1:g} (as measured, outside the device scales)")


def calibrate(
    model: str = typer.Option("tiny", "--model", "-m", help="catalog name or HF folder"),
    num_layers: Optional[int] = typer.Option(None, "--num-layers", min=1, help="keep the first n layers"),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="bf16 | fp32 | fp8 on cuda [bf16]; fp32 on cpu"),
    out: Path = typer.Option(..., "--out", "-o", help="profile JSON to write"),
    quick: bool = typer.Option(False, "--quick", help="a small grid (CI, smoke tests)"),
    repeats: Optional[int] = typer.Option(None, "--repeats", min=1, help="timed runs per step shape [5 on cuda, 3 on cpu]"),
    max_model_len: int = typer.Option(4096, "--max-model-len", min=16),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", min=1, help="largest decode batch measured [128 on cuda]"),
    replay_grid: Optional[Path] = typer.Option(None, "--replay-grid", help="replay_grid.json (scripts/device_replay.sh) "
                                               "measured on this --model: stored in the profile, it prices sliding-window "
                                               "replay in simulate and tune"),
) -> None:
    """Calibrate; print the fitted step model."""
    from rich.console import Console

    from executor.calibrate import calibrate as run
    from ui.progress import progress_bar

    from ui.user_errors import check_out_path

    check_out_path(out, "--out")   # refused before the measurement, not after it (a directory was refused only at the save)
    check_cpu_dtype(device, dtype)
    if replay_grid is not None:
        grid_for(replay_grid, model, num_layers)
    con, err = Console(), Console(stderr=True)
    with progress_bar(err) as bar:
        task = bar.add_task("calibrate: build, warm-up, ops", total=None)

        def log(line: str) -> None:
            con.print(line, highlight=False)
            step = STEP_LINE.match(line)  # the timed step shapes are most of the run: the bar (and its ETA) counts them
            if step:
                bar.update(task, description="calibrate: step shapes", completed=int(step[1]), total=int(step[2]))

        try:
            prof = run(model, num_layers, device, dtype, quick=quick, repeats=repeats, max_model_len=max_model_len,
                       max_num_seqs=max_num_seqs, command="twinfer " + " ".join(sys.argv[1:]), log=log)
        except KeyboardInterrupt:
            bar.stop()
            err.print(f"[yellow]interrupted: the measurements printed above are all there is; no profile written to {out} "
                      "(the fit needs every step shape)[/]", highlight=False)
            raise typer.Exit(130) from None
    if replay_grid is not None:
        prof = grid_for(replay_grid, model, num_layers, prof)
    prof.save(out)
    st = prof.step
    h, lp = st.host, st.loop
    con.print(f"step model: eager step = serial host + max(host, device) + {st.overlap:.2f} x min(host, device); "
              f"CUDA-graph decode step = graph host + device (graphs at {st.graph_sizes or 'none'})", highlight=False)
    con.print(f"  eager host: {h.fixed_s * 1e3:.3f} ms + {h.per_layer_s * 1e6:.1f} us/layer + {h.per_request_s * 1e6:.1f} us/request "
              f"+ {h.per_token_s * 1e6:.2f} us/token + {h.per_prefill_s * 1e6:.1f} us/prefill chunk "
              f"+ {h.decode_group_s * 1e3:.3f} ms if it holds decodes (their attention path, once per layer)", highlight=False)
    con.print(f"  eager serial host (measured: wall - forward - sampler): {h.serial_s * 1e3:.3f} ms + "
              f"{h.serial_per_request_s * 1e6:.1f} us/request + {h.serial_per_prefill_s * 1e6:.1f} us/prefill chunk + "
              f"{h.serial_per_token_s * 1e9:.0f} ns/prefill token", highlight=False)
    con.print(f"  graph host: {h.graph_fixed_s * 1e3:.3f} ms + {h.graph_per_request_s * 1e6:.1f} us/request "
              f"+ {h.graph_per_kv_token_s * 1e9:.2f} us per 1k context tokens", highlight=False)
    con.print(f"  a step right after a prefill-bearing step (measured against the same step after a decode step): "
              f"+{h.after_eager_s * 1e3:.3f} ms" + (f"; decode steps 1-{len(h.after_eager_decode_s)} after one: "
                                                   + " ".join(f"+{x * 1e3:.3f}" for x in h.after_eager_decode_s) + " ms"
                                                   if h.after_eager_decode_s else ""), highlight=False)
    if h.after_eager_decode_by_tokens:
        con.print("  priced by the prompt step's size, decode steps 1-3 after one of " + "; ".join(
            f"{t} tokens: " + " ".join(f"+{x * 1e3:.3f}" for x in v[:3]) + " ms" for t, v in h.after_eager_decode_by_tokens),
            highlight=False)
    if st.eager_scale is not None:
        con.print(f"  eager/piecewise forwards' device work (measured apart from their issue behind a spin kernel): "
                  f"scale {st.eager_scale:.3f} + {st.eager_decode_group_s * 1e3:.3f} ms if it holds decodes "
                  f"(graph forwards' scale {st.category_scale.get('dense_gemm', 1.0):.3f})", highlight=False)
    smp = prof.tables.get("sample")
    if smp is not None and "sample" in (st.op_tables or []):
        con.print(sampler_line(smp), highlight=False)
    tables = (", ".join(st.op_tables or sorted(prof.tables))) if st.use_op_tables else ""
    con.print("  device scale vs cost model: " + ", ".join(f"{k} {v:.2f}" for k, v in st.category_scale.items())
              + f"; + {st.prefill_token_s * 1e6:.2f} us per prefill token"
              + (f" (measured op tables: {tables})" if st.use_op_tables else " (analytic op efficiencies)"), highlight=False)
    ops_seen = sorted({p.get("op", "?") for p in prof.op_points})
    if ops_seen:
        con.print(f"  op benchmarks: {len(prof.op_points)} shapes ({', '.join(ops_seen)}) kept in the profile", highlight=False)
    con.print(f"  engine loop: {lp.fixed_s * 1e3:.3f} ms + {lp.per_request_s * 1e6:.1f} us/request + {lp.per_token_s * 1e6:.2f} us/token"
              f"; admission once per request (measured add_request): {lp.admit_s * 1e6:.1f} us + "
              f"{lp.admit_per_token_s * 1e9:.1f} ns/prompt token", highlight=False)
    con.print(f"  fit on {st.fit.points} steps: MAPE {st.fit.mape * 100:.1f}%, p90 abs err {st.fit.p90_abs_err_s * 1e3:.2f} ms",
              highlight=False)
    for note in st.notes:
        con.print(f"  note: {note}", highlight=False)
    con.print(f"profile: {out}")
