"""twinfer serve: an OpenAI-compatible HTTP server over the executor's AsyncLLMEngine.

Nothing here imports torch at module import time: the protocol, tokenizer and metrics
are usable (and tested) without it; only ``ui/cmd_serve.py`` builds a real engine.
"""
