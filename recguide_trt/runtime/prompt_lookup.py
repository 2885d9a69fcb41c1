"""Prompt-lookup drafts: the tokens that followed the context's last n-gram where it occurred before.

Where an answer copies its prompt (code being edited, a quoted passage, a repeated name), the tokens
after an earlier occurrence of the context's last few tokens are a draft that costs no forward at all
(prompt lookup decoding, as in transformers' ``prompt_lookup_num_tokens``, vLLM's ``ngram`` and
OpenVINO GenAI's ``prompt_lookup``). Verification keeps it lossless like any other draft.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .plan import Kind, Work
from .request import Request

MAX_NGRAM = 3
"""Longest n-gram looked up (the first found, longest first, gives the draft)."""
MIN_NGRAM = 2
"""Shortest n-gram looked up: a single token's last occurrence predicts the next one too rarely to be
worth a verify row over a diffusion draft."""


def lookup_draft(context: Sequence[int], k: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> list[int]:
    """Up to ``k`` tokens that followed the most recent earlier occurrence of the context's last ``n``
    tokens, for the longest ``n`` in ``[min_ngram, max_ngram]`` that occurs; ``[]`` if none does.

    The context's own last ``n`` tokens are not an occurrence; an occurrence that ends at the context's
    last token but one yields one token (the last)."""
    if k < 1 or min_ngram < 1 or max_ngram < min_ngram:
        raise ValueError(f"lookup_draft: need k >= 1 and 1 <= min_ngram <= max_ngram (got k={k}, "
                         f"ngrams {min_ngram}..{max_ngram})")
    a = np.asarray(context, dtype=np.int64)
    L = len(a)
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        # starts s in [0, L - n - 1] whose n tokens equal the last n (s = L - n is the suffix itself)
        match = a[:L - n] == a[L - n]
        for j in range(1, n):
            match &= a[j:L - n + j] == a[L - n + j]
        hits = np.flatnonzero(match)
        if hits.size:
            s = int(hits[-1]) + n
            return a[s:s + k].tolist()
    return []


def lookup_verify(r: Request, block: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> Work | None:
    """The verify of a lookup draft of up to ``block - 1`` tokens from ``r``'s prompt and output so far (its seed
    last), or None: where nothing is found, where ``block`` is 1, or where ``r`` samples or adjusts its logits
    (those verify against draft distributions, which a copied draft does not have)."""
    if block <= 1 or not r.greedy or r.adjusts:
        return None
    found = lookup_draft(r.prompt_ids + r.output_ids, block - 1, max_ngram, min_ngram)
    return Work(r.id, Kind.VERIFY, len(found) + 1, lookup=tuple(found)) if found else None
