"""Token ids in, client text out: incremental detokenization cut at the first stop string.

While streaming, the last ``max(len(stop)) - 1`` characters are held back: they could be the
start of a stop string that the next token completes, and text already sent cannot be
taken back. The engine knows nothing of stop strings; the app aborts it when one matches.
Tokens after the one that completed a stop string are dropped and not counted (``tokens``).
"""

from __future__ import annotations

from typing import Sequence

from executor.serve.tokenizer import IncrementalDecoder


class TextStream:
    """Accumulates decoded text for one request and hands out what is safe to send."""

    def __init__(self, decoder: IncrementalDecoder, stop: Sequence[str] = ()):
        self._decoder = decoder
        self._stop = [s for s in stop if s]
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self.text = ""          # everything decoded so far (cut at a stop string once one matched)
        self._sent = 0          # characters of ``text`` handed out
        self.stopped = False    # a stop string matched
        self.tokens = 0         # ids kept: all fed, up to the one that completed a stop string

    def add(self, new_ids: Sequence[int]) -> str:
        """Feed the ids of one engine output; returns the text now safe to send. With stop strings the ids
        go in one at a time: an output of several tokens (multi-step decode, MTP) may run past the match."""
        if self.stopped:
            return ""
        for ids in ([i] for i in new_ids) if self._stop else (new_ids,):
            self._append(self._decoder.step(ids))
            self.tokens += len(ids)
            if self.stopped:
                break
        end = len(self.text) if self.stopped else max(self._sent, len(self.text) - self._hold)
        return self._take(end)

    def finish(self) -> str:
        """The request ended: flush the decoder and the held-back tail."""
        if not self.stopped:
            self._append(self._decoder.flush())
        return self._take(len(self.text))

    def _append(self, new: str) -> None:
        if not new:
            return
        # a stop string may straddle old and new text: search from where it could start
        start = max(0, len(self.text) - self._hold)
        self.text += new
        hits = [i for i in (self.text.find(s, start) for s in self._stop) if i >= 0]
        if hits:
            self.text = self.text[:min(hits)]
            self.stopped = True

    def _take(self, end: int) -> str:
        out = self.text[self._sent:end]
        self._sent = max(self._sent, end)
        return out
