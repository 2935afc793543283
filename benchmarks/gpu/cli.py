"""``python -m benchmarks.gpu.cli run|kernels ...``: the executor's two commands alone.

On the device machine only the executor's commands are needed; registering just these
keeps other commands' optional imports (web server, UI) out of the benchmark run.
"""

from __future__ import annotations

import typer

from ui import cmd_kernels, cmd_run

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
cmd_run.register(app)
cmd_kernels.register(app)

if __name__ == "__main__":
    app()
