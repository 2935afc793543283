"""Errors a user can act on: the CLI prints their message, never a traceback."""

from __future__ import annotations


class TwinferError(ValueError):
    """Bad input or an impossible request, with a message that says what is allowed."""


class UnknownNameError(TwinferError):
    """A catalog lookup failed; the message lists the known names."""

    def __init__(self, kind: str, name: str, known: list[str]):
        self.kind, self.name, self.known = kind, name, sorted(known)
        super().__init__(f"unknown {kind} {name!r}; known {kind}s: {', '.join(self.known)}")


class DoesNotFitError(TwinferError):
    """A layout whose weights, KV and workspace exceed GPU memory; the message gives the numbers."""
