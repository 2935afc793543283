"""``twinfer model``: the model catalog, and any model (catalog name, HF config.json, ModelSpec YAML) as a commented ModelSpec file."""

from __future__ import annotations

from typing import Optional

import typer

from twinfer.errors import TwinferError


def show_text(name: str) -> str:
    """The ModelSpec of ``name`` as a complete commented YAML (loadable as --model FILE)."""
    from costmodels.catalog import get_model
    from costmodels.model_spec import MODEL_SCHEMA_VERSION
    from ui.commented_yaml import commented_yaml

    m = get_model(name)
    return commented_yaml(m, [
        f"twinfer ModelSpec file for {m.name} (schema version {MODEL_SCHEMA_VERSION}, docs/byo.md).",
        "Edit it and pass its path as --model; an unmodified Hugging Face config.json (or its folder) works too.",
        "Dtypes: checkpoint_dtype / checkpoint_expert_dtype / default_kv_dtype are what a layout uses unless it sets its own.",
        "",
    ])


def register(app: typer.Typer) -> None:
    """Add ``model`` to the CLI."""

    @app.command("model")
    def model(
        show: Optional[str] = typer.Option(None, "--show", help="print a model (catalog name, config.json or ModelSpec YAML) as a complete, commented ModelSpec YAML"),
        template: bool = typer.Option(False, "--template", help="the same for llama-3.1-8b: a dense model to start from"),
    ) -> None:
        """List the model catalog; --show NAME prints a ModelSpec file to start your own from (pass its path as --model)."""
        if template and show is not None:
            raise TwinferError("--template and --show: give one of them")
        if show is not None and not show.strip():   # '' is no model: not the --template one (as hardware --show '')
            from costmodels.catalog import list_models
            raise TwinferError(f"--show: unknown model {show!r}; known models: {', '.join(list_models())}; or an HF "
                               "config.json (or its folder) or a ModelSpec YAML")
        if template or show is not None:
            print(show_text("llama-3.1-8b" if template else show), end="")
            return
        _print_catalog()


def _print_catalog() -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from costmodels.catalog import get_model, list_models

    # the name is what --model takes: never cut; the rest fold (a boxed table cut names to "deepseek-…" at 80 columns)
    tab = Table(title="model catalog (your own: an HF config.json, or twinfer model --show NAME > my_model.yaml)", title_justify="left",
                box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for c in ("name", "family", "layers", "hidden", "attn", "experts\n(top-k)", "dtype"):
        tab.add_column(c, no_wrap=c in ("name", "family"), overflow="fold")
    for name in list_models():
        m = get_model(name)
        moe = f"{m.moe.n_routed_experts} ({m.moe.top_k})" if m.moe else "dense"
        dt = m.checkpoint_dtype + (f"/{m.checkpoint_expert_dtype} experts" if m.checkpoint_expert_dtype else "")
        tab.add_row(name, m.family, str(m.num_layers), str(m.hidden_size), m.attention, moe, dt)
    Console().print(tab)
