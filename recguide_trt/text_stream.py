"""Incremental detokenization with stop strings (``SamplingParams.stop``): for ``LLM.generate`` and for each choice
of a served request."""

from __future__ import annotations

from collections.abc import Callable

INCOMPLETE = "\ufffd"
"""What a byte-level tokenizer decodes a cut UTF-8 sequence to: held back until the next tokens."""


class TextStream:
    """Turns a growing list of token ids into text deltas; stops before the first stop string.

    Each delta is a prefix-stable piece of ``decode(ids)``: a trailing replacement character (a
    multi-byte character split between tokens) and the last ``len(longest stop) - 1`` characters
    (which could begin a stop string) are held back until more tokens or :meth:`finish` decide them.
    When a stop string appears, :attr:`ids` keeps the tokens up to the one that completed it: a speculative
    round emits several tokens at once, and the ids (and the logprobs read by their count) must not depend on
    how many came in the push that found it.
    """

    def __init__(self, decode: Callable[[list[int]], str], stop: list[str] | None = None):
        self._decode = decode
        self._stop = list(stop or [])
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self.ids: list[int] = []
        self.sent = ""
        """Text handed out so far."""
        self.stopped = False
        """A stop string was found: the request should end; ``sent`` is final."""

    def _cut(self, text: str) -> int:
        """Where the first stop string starts in ``text``, or -1."""
        return min((i for i in (text.find(s) for s in self._stop) if i >= 0), default=-1)

    def _full(self, pushed: int = 0) -> str:
        """The text so far, cut before a stop string; ``pushed``: how many of :attr:`ids` the last push added."""
        text = self._decode(self.ids)
        if self._stop and self._cut(text) >= 0:
            self.stopped = True
            for n in range(len(self.ids) - pushed + 1, len(self.ids)):  # the token that completed the stop
                if self._cut(shorter := self._decode(self.ids[:n])) >= 0:
                    del self.ids[n:]
                    text = shorter
                    break
            return text[:self._cut(text)]
        return text

    def _delta(self, text: str) -> str:
        delta = text[len(self.sent):] if len(text) > len(self.sent) else ""
        self.sent += delta
        return delta

    def push(self, ids: list[int]) -> str:
        """Add tokens; return the text that is now certain (may be empty)."""
        if self.stopped:
            return ""
        self.ids.extend(ids)
        text = self._full(len(ids))
        if self.stopped:
            return self._delta(text)
        safe = text.rstrip(INCOMPLETE)
        if self._hold:
            safe = safe[:max(len(self.sent), len(safe) - self._hold)]
        return self._delta(safe)

    def finish(self) -> str:
        """The request ended: return whatever is left."""
        if self.stopped:
            return ""
        return self._delta(self._full())
