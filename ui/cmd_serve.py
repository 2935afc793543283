"""``twinfer serve``: the OpenAI-compatible HTTP server over the real executor."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from twinfer.errors import TwinferError

# uvicorn's log levels (uvicorn.config.LOG_LEVELS), spelled here so that a wrong one is refused before the engine is
# built, without importing uvicorn (it was a KeyError from uvicorn after the model loaded)
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
# the shortest context a request fits: a one-token prompt and one generated token
MIN_MODEL_LEN = 2
# the weights the engine runs without --dtype (executor.engine.LLMEngine.from_args), for the plan's dtype note
ENGINE_DTYPE = "bf16"


def register(app: typer.Typer) -> None:
    """Add ``serve`` to the CLI."""
    app.command("serve", help="Serve a model over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions).")(serve)


def build_engine(model: str, *, load_format: str, device: str, dtype: Optional[str], seed: int,
                 max_model_len: Optional[int], num_kv_blocks: Optional[int], plan_options: tuple[int, dict] = (1, {}),
                 async_overlap: Optional[bool] = None):
    """The executor's AsyncLLMEngine (imports torch: call only when serving). ``plan_options``: (EP width, engine
    options) of ``--plan`` (``ui.serve_plan.serving_options``)."""
    from executor.async_engine import AsyncLLMEngine  # torch lives behind this import

    kwargs = dict(load_format=load_format, device=device, seed=seed, max_model_len=max_model_len,
                  num_kv_blocks=num_kv_blocks)
    if dtype:
        kwargs["dtype"] = dtype
    world, plan_kwargs = plan_options
    kwargs.update(plan_kwargs)
    if world > 1:   # a plan with EP width > 1: one process per device (executor.ep_launch)
        from executor.ep_launch import start_ep_front
        return AsyncLLMEngine(start_ep_front(model, world, **kwargs))
    if async_overlap is not None:   # (EP ranks step in lockstep: synchronous loop)
        kwargs["async_overlap"] = async_overlap
    return AsyncLLMEngine.from_args(model, **kwargs)


def serve(
    model: str = typer.Option(..., "--model", "-m", help="HF checkpoint directory, or a catalog model name (e.g. tiny) with --load-format dummy"),
    load_format: str = typer.Option("auto", "--load-format", help="auto (read weights) or dummy (random weights)"),
    plan: Optional[str] = typer.Option(None, "--plan", help="deployment plan YAML from `twinfer plan`, or a tuned policy from `twinfer tune --plan-out`"),
    device: str = typer.Option("cuda", "--device", help="cpu or cuda"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="activation/weight dtype (engine default if unset)"),
    host: str = typer.Option("127.0.0.1", "--host"),
    # the range is checked by bind_socket (one line naming --port and 0 to 65535, before the engine is built)
    port: int = typer.Option(8000, "--port", help="0 to 65535; 0 picks a free port (the URL is printed)"),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="TWINFER_API_KEY",
                                          help="require 'Authorization: Bearer KEY' on /v1 and /metrics"),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="model id clients send (default: --model)"),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", min=MIN_MODEL_LEN,
                                                help="context length in tokens, prompt and output together"),
    num_kv_blocks: Optional[int] = typer.Option(None, "--num-kv-blocks", min=1),
    seed: int = typer.Option(0, "--seed"),
    max_queue: int = typer.Option(4096, "--max-queue", min=1, help="requests in flight before answering 429"),
    drain_timeout: float = typer.Option(5.0, "--drain-timeout", min=0.0,
                                        help="on SIGTERM/Ctrl-C: seconds in-flight requests may finish before they are aborted"),
    read_timeout: float = typer.Option(30.0, "--read-timeout", min=0.1, max=3600.0,
                                       help="seconds a request's headers and body may take to arrive (slow clients are cut off)"),
    max_connections: int = typer.Option(8192, "--max-connections", min=1, max=1_000_000,
                                        help="open connections before new ones get 503 (also capped by the file-descriptor limit)"),
    log_level: str = typer.Option("warning", "--log-level", help=f"uvicorn log level: {', '.join(LOG_LEVELS)}"),
    async_overlap: Optional[bool] = typer.Option(None, "--async-overlap/--no-async-overlap",
                                                 help="pipelined engine loop: schedule step N+1 while the GPU runs step N [the plan's scheduler setting; on]"),
) -> None:
    """Build the engine, then serve until Ctrl-C."""
    if device not in ("cpu", "cuda"):
        raise TwinferError(f"--device must be cpu or cuda, got {device!r}")
    if load_format not in ("auto", "dummy"):
        raise TwinferError(f"--load-format must be auto or dummy, got {load_format!r}")
    if log_level not in LOG_LEVELS:
        raise TwinferError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}")
    if load_format == "auto" and not Path(model).is_dir():
        # said now, not after the engine build (which, for a large catalog model, first fails on memory instead)
        raise TwinferError(f"--model {model!r} is not a checkpoint folder, so --load-format auto has no weights to read; "
                           "pass an HF checkpoint folder, or --load-format dummy for random weights")
    # heavy imports only now: `twinfer --help` and the simulator never load torch or uvicorn
    try:
        from executor.serve.app import create_app
        from executor.serve.server import bind_socket, listen_on, serve_forever, url_of
        from executor.serve.tokenizer import load_tokenizer
    except ImportError as err:
        raise TwinferError(f"twinfer serve needs the serve extra: pip install 'twinfer[serve]' ({err})") from None
    plan_options = (1, {})
    if plan is not None:   # read, checked against --model and its notes said before the port and the engine build
        from ui.serve_plan import serving_options
        try:
            plan_options = serving_options(plan, device, model, dtype or ENGINE_DTYPE)
        except ImportError as err:   # an EP plan's ranks (executor.ep_launch) need torch
            raise TwinferError(f"twinfer serve needs torch: pip install 'twinfer[executor]' ({err})") from None
    # the port is reserved before the engine (a busy one is refused at once, not after minutes of loading) but
    # listens only once the app can answer: until then a client is refused, not left hanging
    sock = bind_socket(host, port, listen=False)
    url = url_of(sock)
    try:
        engine = build_engine(model, load_format=load_format, device=device, dtype=dtype, seed=seed,
                              max_model_len=max_model_len, num_kv_blocks=num_kv_blocks, plan_options=plan_options,
                              async_overlap=async_overlap)
    except ImportError as err:
        raise TwinferError(f"twinfer serve needs torch: pip install 'twinfer[executor]' ({err})") from None
    from executor.engine import freeze_gc_heap
    freeze_gc_heap()   # the start-up heap out of the serving loop's collections (as after an engine's warm-up)
    tokenizer = load_tokenizer(model, vocab_size=engine.vocab_size, eos_token_id=engine.eos_token_id)
    name = served_model_name or getattr(engine, "model_name", None) or model
    app = create_app(engine, tokenizer, served_model_name=name, api_key=api_key, max_queue=max_queue,
                     drain_timeout_s=drain_timeout)

    def ready() -> None:
        # flushed at once: scripts and tests wait for this line to learn the URL
        print(f"twinfer serve: {name} ready at {url}/v1 (max_model_len {engine.max_model_len}; "
              f"also {url}/health, {url}/metrics)", flush=True)

    serve_forever(app, listen_on(sock), log_level=log_level, on_ready=ready, read_timeout_s=read_timeout,
                  max_connections=max_connections)
