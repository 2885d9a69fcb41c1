"""Automatic prefix caching: a new prompt reuses the K/V of a prefix that some slot already holds.

The engine's KV cache has one slot per running request. A slot keeps its committed K/V after its
request ends, until the slot is given to another request, so a later prompt that starts with the
same tokens (a shared system prompt, the earlier turns of a chat, a retried request) only needs its
remaining tokens prefilled: the engine copies the matched K/V into the new request's slot
(``Backend.copy_slot``) and prefills from there. Running requests are sources too: the K/V of their
committed tokens never changes while they run.

Lossless: the native backend's forward is chunk-invariant (a token's K/V and logits are bit-identical
whether its prompt was prefilled in one forward or in two; ``tests/runtime/test_prefix_cache.py``), so a
cached prefix changes no output bit. The torch and ONNX backends agree up to rounding, as their
multi-token decode forwards already do.

Plain Python: which slot holds which tokens, and the best match for a prompt. The engine decides
when slots are held, reused and dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np


def tokens_array(tokens: Sequence[int]) -> np.ndarray:
    """Token ids as an int64 array: records and prompts are compared as arrays (a lookup over 128 records of
    1000 tokens took 20 ms with lists converted per comparison)."""
    return tokens if isinstance(tokens, np.ndarray) else np.asarray(tokens, np.int64)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0 or a[0] != b[0]:
        return 0
    diff = np.flatnonzero(tokens_array(a)[:n] != tokens_array(b)[:n])
    return int(diff[0]) if diff.size else n


def starts_with(tokens: np.ndarray, prefix: np.ndarray) -> bool:
    """Whether ``tokens`` begins with all of ``prefix``."""
    return len(prefix) <= len(tokens) and common_prefix(prefix, tokens) == len(prefix)


@dataclass(frozen=True)
class Match:
    """Where a prompt's reusable prefix is."""

    slot: int
    """The slot holding the prefix's K/V at positions ``[0, tokens)``."""
    tokens: int
    """Prompt tokens whose K/V can be copied instead of prefilled."""


class PrefixCache:
    """Token records of the slots whose K/V outlived their requests, and the lookup over them."""

    def __init__(self) -> None:
        self._held: dict[int, np.ndarray] = {}
        self._stamp: dict[int, int] = {}
        self._clock = 0
        self.queries = 0
        """Prompt tokens looked up (every admitted prompt's length)."""
        self.hits = 0
        """Prompt tokens served from a cached prefix instead of a prefill."""

    def hold(self, slot: int, tokens: Sequence[int]) -> None:
        """Record that ``slot`` holds the K/V of ``tokens`` at positions ``[0, len(tokens))``. Another slot's record
        that is a prefix of ``tokens`` is dropped: this one serves every prompt that one would."""
        if not len(tokens):
            self.drop(slot)
            return
        tokens = tokens_array(tokens)
        for other in [s for s, held in self._held.items() if s != slot and starts_with(tokens, held)]:
            self.drop(other)
        self._held[slot] = tokens
        self._clock += 1
        self._stamp[slot] = self._clock

    def covered(self, slot: int) -> bool:
        """Whether another slot's record starts with all of ``slot``'s (so losing ``slot``'s loses nothing)."""
        mine = self._held.get(slot)
        return mine is not None and any(s != slot and starts_with(held, mine) for s, held in self._held.items())

    def drop(self, slot: int) -> None:
        """Forget ``slot``'s record (its K/V is about to be overwritten)."""
        self._held.pop(slot, None)
        self._stamp.pop(slot, None)

    def truncate(self, length: int) -> None:
        """Cut every record to its first ``length`` tokens (something outside the step loop wrote the K/V of
        positions ``length`` and on); a record with nothing left is dropped."""
        for slot, tokens in list(self._held.items()):
            if length <= 0:
                self.drop(slot)
            elif len(tokens) > length:
                self._held[slot] = tokens[:length]

    def clear(self) -> None:
        """Forget every record (something outside the step loop wrote the cache)."""
        self._held.clear()
        self._stamp.clear()

    def held(self, slot: int) -> np.ndarray | None:
        """The tokens ``slot`` holds, or None."""
        return self._held.get(slot)

    @property
    def slots(self) -> list[int]:
        """Slots with a record, sorted."""
        return sorted(self._held)

    def choose(self, free: Sequence[int], match: Match | None) -> int:
        """The free slot for a request on a backend that reads slots in place (no compaction); with no match, also
        the cache-only slot a compacting backend moves a record into.

        The matched slot itself, where it is free, when the request uses all of its record or no free slot is
        empty: nothing is copied, and at most the record's unmatched tail is lost, where the alternative loses a
        whole record. Else the lowest empty free slot (the prefix is copied there and the record stays), else the
        free slot whose record was used longest ago.
        """
        empty = [s for s in free if s not in self._held]
        if match is not None and match.slot in free:
            if not empty or match.tokens >= len(self._held.get(match.slot, ())):
                return match.slot
        if empty:
            return min(empty)
        return min(free, key=self._stamp.__getitem__)

    def lookup(self, prompt: Sequence[int], running: Iterable[tuple[int, Sequence[int]]] = ()) -> Match | None:
        """The longest reusable prefix of ``prompt`` among the held slots and ``running`` (slot, committed
        tokens) pairs; None when no slot shares a token. At most ``len(prompt) - 1`` tokens are reused: the
        last prompt token always runs, since its logits give the first output token. Counts the lookup
        in :attr:`queries` and the reused tokens in :attr:`hits`."""
        prompt = tokens_array(prompt)
        limit = len(prompt) - 1
        best: Match | None = None
        for slot, tokens in [*self._held.items(), *running]:
            n = min(common_prefix(prompt, tokens), limit)
            if n > 0 and (best is None or n > best.tokens):
                best = Match(slot, n)
        self.queries += len(prompt)
        if best is not None:
            self.hits += best.tokens
            if best.slot in self._stamp:  # a record just used is the last to go
                self._clock += 1
                self._stamp[best.slot] = self._clock
        return best

    def stats(self) -> dict:
        return {"held_slots": len(self._held), "queried_tokens": self.queries, "hit_tokens": self.hits,
                "hit_rate": self.hits / self.queries if self.queries else None}
