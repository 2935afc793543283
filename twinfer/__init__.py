"""twinfer: a digital twin for serving large MoE LLMs."""

__version__ = "0.1.0"
