"""Log-probabilities of emitted tokens (``SamplingParams.logprobs``) and of prompt tokens (``prompt_logprobs``):
plain data out of a forward's logits.

Each value is the model's own log-softmax at the position that predicted the token: temperature 1,
no top-p, every vocabulary entry. A greedy token emitted by a verify row is read from that row's
logits, which the native backend computes bit for bit as an AR step would, so every policy reports
the same numbers as AR.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_LOGPROBS = 20
"""The most alternatives a request may ask for per token (OpenAI's limit for ``top_logprobs``)."""


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's log-probability and the most likely alternatives at its position."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    """``(token id, logprob)`` of the ``logprobs`` most likely tokens, most likely first (ties: lower id)."""


def log_softmax_row(logits: np.ndarray) -> np.ndarray:
    """log-softmax of one row of logits, in float64 (one row at a time: the same numbers whatever batch the
    row came in)."""
    x = np.asarray(logits, np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def token_logprobs(rows: np.ndarray, tokens: list[int], top: int) -> list[TokenLogprob]:
    """``tokens[i]``'s log-probability under ``rows[i]`` (logits ``[n, V]``) and the ``top`` best there."""
    out = []
    for row, t in zip(rows, tokens):
        lp = log_softmax_row(row)
        best: tuple[tuple[int, float], ...] = ()
        if top > 0:
            k = min(top, lp.shape[0])
            kth = -np.partition(-lp, k - 1)[k - 1]
            cand = np.flatnonzero(lp >= kth)  # every tie of the k-th value, so the lower ids win below
            cand = cand[np.lexsort((cand, -lp[cand]))][:k]  # most likely first, ties to the lower id
            best = tuple((int(i), float(lp[i])) for i in cand)
        out.append(TokenLogprob(int(t), float(lp[t]), best))
    return out
