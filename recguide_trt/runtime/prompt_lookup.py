"""Prompt-lookup drafts: the tokens that followed the context's last n-gram where it occurred before.

Where an answer copies its prompt (code being edited, a quoted passage, a repeated name), the tokens
after an earlier occurrence of the context's last few tokens are a draft that costs no forward at all
(prompt lookup decoding, as in transformers' ``prompt_lookup_num_tokens``, vLLM's ``ngram`` and
OpenVINO GenAI's ``prompt_lookup``). Verification keeps it lossless like any other draft.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .plan import Kind, Work
from .request import Request

MAX_NGRAM = 3
"""Longest n-gram looked up (the first found, longest first, gives the draft)."""
MIN_NGRAM = 2
"""Shortest n-gram looked up: a single token's last occurrence predicts the next one too rarely to be
worth a verify row over a diffusion draft."""
MAX_AGREE = 32
"""How far back an occurrence's agreement with the context is followed. Of the occurrences of the matched n-gram
the one that agrees furthest back gives the draft (the latest among equals): on SmolLM2's greedy continuations of
chat and code prompts this took a 7-token lookup's mean accepted tokens from 4.05 to 4.24 (training prompts) and 4.12
to 4.40 (held-out), against the latest occurrence (``scripts/eval_lookup_keys.py``, docs/eval/lookup-keys-*)."""


class Lookup(NamedTuple):
    """A prompt-lookup draft and what found it."""

    tokens: list[int]
    """The tokens that followed the chosen occurrence (``[]`` where none was found)."""
    ngram: int
    """Length of the n-gram that matched (0 where none did)."""
    agree: int
    """How many of the context's last tokens the chosen occurrence's own preceding tokens equal, counted up to
    the ``max_agree`` given (at least ``ngram``): a match that agrees 16 tokens back is a copy in progress, one that
    agrees over its 2-gram alone often is not (:mod:`.lookup_acceptance` keys on it)."""


def find_lookup(context: Sequence[int] | np.ndarray, k: int, max_ngram: int = MAX_NGRAM,
                min_ngram: int = MIN_NGRAM, max_agree: int = MAX_AGREE) -> Lookup:
    """:func:`lookup_draft`'s tokens, the n-gram that found them and the chosen occurrence's agreement.

    Candidates are the earlier positions of the context's last token, narrowed one token further back per
    n-gram position: one pass over the context, where comparing every start for every n took n passes (on a
    700-token context, 32 us a lookup from a list; RecGuide looks up every AR row of a step). Past the n-gram the
    occurrences left are compared up to ``max_agree`` tokens back at once, not narrowed a token at a time (up to 30
    more passes where a phrase repeats). On SmolLM2's chat and code continuations a lookup took 17-25 us on
    average, 12-18 us with the latest occurrence (``scripts/eval_lookup_keys.py``)."""
    if k < 1 or min_ngram < 1 or max_ngram < min_ngram:
        raise ValueError(f"lookup_draft: need k >= 1 and 1 <= min_ngram <= max_ngram (got k={k}, "
                         f"ngrams {min_ngram}..{max_ngram})")
    a = np.asarray(context, dtype=np.int64)
    L = len(a)
    if L < min_ngram + 1:
        return Lookup([], 0, 0)
    ends = np.flatnonzero(a[:L - 1] == a[L - 1])  # an occurrence ends at p <= L - 2 (L - 1 ends the suffix)
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        ok = ends[ends >= n - 1]
        for j in range(1, n):
            ok = ok[a[ok - j] == a[L - 1 - j]]
        if not ok.size:
            continue
        agree, p = n, int(ok[-1])
        if agree >= max_agree:  # agreement not followed past the n-gram
            return Lookup(a[p + 1:p + 1 + k].tolist(), n, agree)
        if ok.size == 1:  # one occurrence: its agreement past the n-gram from one slice comparison
            w = min(max_agree - agree, p - agree + 1)
            if w > 0:
                same = a[p - agree - w + 1:p - agree + 1] == a[L - agree - w:L - agree]
                misses = np.flatnonzero(~same[::-1])
                agree += int(misses[0]) if misses.size else w
        else:  # every occurrence's agreement in one comparison; the furthest, the latest of those
            back = np.arange(agree, max_agree)
            at = ok[:, None] - back  # [occurrences, positions further back]; < 0: before the context's start
            same = (at >= 0) & (a[np.maximum(at, 0)] == a[np.maximum(L - 1 - back, 0)])
            further = np.cumprod(same, axis=1).sum(axis=1)
            best = int(further.max())
            p, agree = int(ok[np.flatnonzero(further == best)[-1]]), agree + best
        return Lookup(a[p + 1:p + 1 + k].tolist(), n, agree)
    return Lookup([], 0, 0)


def lookup_draft(context: Sequence[int] | np.ndarray, k: int, max_ngram: int = MAX_NGRAM,
                 min_ngram: int = MIN_NGRAM) -> list[int]:
    """Up to ``k`` tokens that followed an earlier occurrence of the context's last ``n`` tokens, for the longest
    ``n`` in ``[min_ngram, max_ngram]`` that occurs; ``[]`` if none does. Of several occurrences, the one whose
    preceding tokens agree with the context's furthest back (up to :data:`MAX_AGREE` tokens in all), the latest
    among equals.

    The context's own last ``n`` tokens are not an occurrence; an occurrence that ends at the context's
    last token but one yields one token (the last)."""
    return find_lookup(context, k, max_ngram, min_ngram)[0]


def lookup_allowed(r: Request) -> bool:
    """Whether ``r`` may verify a lookup draft: greedy with unadjusted logits (a sampled or adjusted row verifies
    against draft distributions, which a copied draft does not have)."""
    return r.greedy and not r.adjusts


class ContextArrays:
    """Each request's prompt + output so far as one int64 array, extended in place as the output grows.

    Converting the token lists afresh took 14 of a lookup's 32 us on a 700-token context. One buffer per request,
    sized for its prompt and ``max_tokens``; call :meth:`forget` when the request leaves."""

    def __init__(self) -> None:
        self._bufs: dict[int, tuple[np.ndarray, int, int]] = {}

    def get(self, r: Request) -> np.ndarray:
        n_p, n_o = len(r.prompt_ids), len(r.output_ids)
        hit = self._bufs.get(r.id)
        if hit is None or hit[1] != n_p or hit[2] > n_o or len(hit[0]) < n_p + n_o:
            buf = np.empty(n_p + max(n_o, r.params.max_tokens), dtype=np.int64)
            buf[:n_p] = r.prompt_ids
            done = 0
        else:
            buf, _, done = hit
        if done < n_o:
            buf[n_p + done:n_p + n_o] = r.output_ids[done:]
        self._bufs[r.id] = (buf, n_p, n_o)
        return buf[:n_p + n_o]

    def forget(self, request_id: int) -> None:
        self._bufs.pop(request_id, None)


def lookup_verify(r: Request, block: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> Work | None:
    """The verify of a lookup draft of up to ``block - 1`` tokens from ``r``'s prompt and output so far (its seed
    last), or None: where nothing is found, where ``block`` is 1, or where ``r`` may not verify one
    (:func:`lookup_allowed`)."""
    if block <= 1 or not lookup_allowed(r):
        return None
    found = lookup_draft(r.prompt_ids + r.output_ids, block - 1, max_ngram, min_ngram)
    return Work(r.id, Kind.VERIFY, len(found) + 1, lookup=tuple(found)) if found else None
