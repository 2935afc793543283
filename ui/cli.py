"""The ``twinfer`` command line. Each ``ui/cmd_*.py`` module adds its commands via ``register(app)``."""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys

import typer
from rich.console import Console

import ui
from twinfer import __version__
from twinfer.errors import TwinferError

app = typer.Typer(
    name="twinfer",
    help="A digital twin for serving large MoE LLMs: cost model, simulator, planner and executor.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
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


def main() -> None:
    """Console-script entry point: user errors print one clear message and exit 2."""
    err = Console(stderr=True)
    try:
        app(standalone_mode=False)
    except TwinferError as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        err.print("aborted")
        sys.exit(130)
    except Exception as e:  # click usage errors carry their own formatting
        if type(e).__name__ == "NoArgsIsHelpError":
            sys.exit(0)
        if hasattr(e, "show") and hasattr(e, "exit_code"):  # click/typer usage errors
            e.show()
            sys.exit(e.exit_code)
        if os.environ.get("TWINFER_DEBUG"):
            raise
        err.print(f"[bold red]internal error:[/] {type(e).__name__}: {e}\n(set TWINFER_DEBUG=1 for the traceback; please report it)", highlight=False)
        sys.exit(1)


if __name__ == "__main__":
    main()
