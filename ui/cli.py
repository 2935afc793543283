"""The ``twinfer`` command line. Each ``ui/cmd_*.py`` module adds its commands via ``register(app)``."""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys

import typer
from rich.console import Console
from rich.markup import escape

import ui
from twinfer import __version__
from twinfer.errors import TwinferError
from ui.user_errors import user_error_message

app = typer.Typer(
    name="twinfer",
    help="A digital twin for serving large MoE LLMs: cost model, simulator, planner and executor.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # help texts are plain text: "[default]" brackets and "pip install 'twinfer[ui]'" must print as written
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},  # click wraps help at 80 columns otherwise
)


def _version(value: bool) -> None:
    if value:
        print(f"twinfer {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="print the version")) -> None:
    """twinfer: simulate, plan and serve MoE LLM deployments."""


def _register_commands() -> None:
    names = sorted(m.name for m in pkgutil.iter_modules(ui.__path__) if m.name.startswith("cmd_"))
    for name in names:
        importlib.import_module(f"ui.{name}").register(app)


_register_commands()


# the extra that installs each optional import a command needs (pyproject's optional-dependencies)
EXTRAS = {"torch": "executor", "triton": "executor", "fastapi": "serve", "uvicorn": "serve", "httpx": "serve",
          "prometheus_client": "serve", "jinja2": "serve", "openai": "serve", "streamlit": "ui", "plotly": "ui"}


def install_hint(e: ModuleNotFoundError) -> str | None:
    """'pip install ...' for a missing optional dependency, None for anything else (a bug)."""
    top = (e.name or "").split(".")[0]
    if top in EXTRAS:
        return f"this command needs {top}, which is not installed: pip install 'twinfer[{EXTRAS[top]}]'"
    if top == "ray":
        return "this command needs ray, which is not installed: pip install 'ray[default]'"
    return None


def usage_error_line(e: Exception) -> str:
    """A usage error (a flag's value out of range, an unknown flag, a missing argument) as one line with where to
    look: click's own message, then the command's --help. Click's form was a three-line usage block."""
    names, ctx = [], e.ctx
    while ctx is not None and ctx.parent is not None:  # the subcommands' names, whatever ran the root (python -m)
        names.insert(0, ctx.info_name)
        ctx = ctx.parent
    cmd = " ".join(["twinfer", *names])
    return f"{e.format_message()} (see '{cmd} --help')"


def main() -> None:
    """Console-script entry point: user errors print one clear message and exit 2."""
    err = Console(stderr=True)
    try:
        rc = app(standalone_mode=False)  # without standalone mode click returns typer.Exit's code instead of exiting
    except TwinferError as e:
        # escape: messages hold brackets ('twinfer[ui]', 'zipf[:S]') that rich would take for markup
        err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        err.print("aborted")
        sys.exit(130)
    except Exception as e:  # click usage errors carry their own formatting
        if type(e).__name__ == "NoArgsIsHelpError":
            sys.exit(0)
        if hasattr(e, "format_message") and hasattr(e, "ctx") and getattr(e, "exit_code", 0) == 2:
            # a usage error (typer carries its own click): a flag's value or a flag itself, one line like any bad input
            err.print(f"[bold red]error:[/] {escape(usage_error_line(e))}", highlight=False, soft_wrap=True)
            sys.exit(2)
        if hasattr(e, "show") and hasattr(e, "exit_code"):  # click's other exceptions (a closed pipe: exit quietly)
            e.show()
            sys.exit(e.exit_code)
        hint = install_hint(e) if isinstance(e, ModuleNotFoundError) else None
        if hint is not None:  # an optional dependency, not a bug
            err.print(f"[bold red]error:[/] {escape(hint)}", highlight=False, soft_wrap=True)
            sys.exit(2)
        if os.environ.get("TWINFER_DEBUG"):
            raise
        msg = user_error_message(e)
        if msg is not None:  # a file the user named cannot be read or written, or holds what no parser takes
            err.print(f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
            sys.exit(2)
        err.print(f"[bold red]internal error:[/] {type(e).__name__}: {escape(str(e))}\n(set TWINFER_DEBUG=1 for the traceback; please report it)", highlight=False)
        sys.exit(1)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
