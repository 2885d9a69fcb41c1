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


def log_sum_exp(row: np.ndarray) -> float:
    """log Σ exp(row), one row at a time (the same number whatever batch the row came in): exp in float32, the
    sum in float64."""
    m = row.max()
    return float(m) + float(np.log(np.exp(row - m).sum(dtype=np.float64)))


def top_ids(row: np.ndarray, k: int) -> np.ndarray:
    """The ids of ``row``'s ``k`` largest values, largest first, ties to the lower id. The k-th largest maximum of
    64-wide blocks bounds the k-th largest value from below, so only the few values at or above it are sorted
    (a full partition of a 49k vocabulary cost 0.5 ms a token)."""
    n = row.shape[0] // 64 * 64
    if n // 64 >= k:
        cand = np.flatnonzero(row >= np.partition(row[:n].reshape(-1, 64).max(1), -k)[-k])
    else:
        cand = np.arange(row.shape[0])
    return cand[np.lexsort((cand, -row[cand]))][:k]


def token_logprobs(rows: np.ndarray, tokens: list[int], top: int, lse: np.ndarray | None = None) -> list[TokenLogprob]:
    """``tokens[i]``'s log-probability under ``rows[i]`` (logits ``[n, V]``) and the ``top`` best there.
    ``lse``: each row's log-sum-exp where the backend computed it (the native kernel, from the draft softmax's
    sum: no pass of its own), else :func:`log_sum_exp` here. On the Zen 3 (ad hoc, /tmp/s24/lse_ab.py): the host
    pass was 0.18 ms a token (cProfile), and a batch-16 AR run with ``logprobs=5`` took 1.12x as long with it
    (paired median of 6 alternating runs); the values differ by at most 1.8e-5 (float32 lanes, not a float64 sum)."""
    out = []
    for i, (row, t) in enumerate(zip(rows, tokens)):
        row = np.asarray(row, np.float32)
        lse_i = log_sum_exp(row) if lse is None else float(lse[i])
        best = tuple((int(j), float(row[j]) - lse_i) for j in top_ids(row, min(top, row.shape[0]))) if top > 0 else ()
        out.append(TokenLogprob(int(t), float(row[t]) - lse_i, best))
    return out
