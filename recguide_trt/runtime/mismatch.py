"""Mismatch prediction from draft logits (DESIGN.md §3.1): the reference definitions.

:func:`predict_mismatch` is the threshold rule: the ONNX graph, the CUDA kernel
(plugins/mismatch_predict.cu) and the runtime's ``flag_rule="threshold"`` implement it, and this
module is what the others are tested against. :func:`predict_likely_outcome` (the runtime's default
bet) runs on the host from the same top-k ids and probabilities every backend returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_TAU = 0.5
"""Risk threshold: position i is flagged when ``1 - (p_top1 - p_top2) > tau``."""


@dataclass
class MismatchPrediction:
    """Per draft block: where verification is predicted to reject, and the likely replacement."""

    position: int
    """First flagged position ``p >= 1`` of the block (position 0 is the seed), or -1 if none."""
    correction: int
    """Best token at ``p`` other than the drafted token, MASK and EOS (-1 if no flag)."""


NO_MISMATCH = MismatchPrediction(-1, -1)
"""No position flagged: the prediction of a draft with nothing to bet on (a prompt-lookup draft's)."""


def topk_reference(logits: np.ndarray, mask_token_id: int, k: int = 3,
                   ranks: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Top-k ids and the probabilities of the first ``ranks`` of them (2: what every backend returns; 3: the
    native and torch backends), MASK excluded, for ``[..., V]`` logits."""
    x = logits.astype(np.float64).copy()
    x[..., mask_token_id] = -np.inf
    ids = np.argsort(-x, axis=-1, kind="stable")[..., :k]
    z = x - x.max(-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(-1, keepdims=True)
    probs = np.take_along_axis(p, ids[..., :ranks], axis=-1)
    return ids.astype(np.int64), probs.astype(np.float32)


def predict_mismatch(top_ids: np.ndarray, top_probs: np.ndarray, tau: float, eos_token_id: int,
                     drafted: np.ndarray | None = None, first: int = 1) -> MismatchPrediction:
    """Flag the first risky position of one block.

    top_ids ``[L, k>=3]`` and top_probs ``[L, 2]`` come from the draft forward of the block;
    drafted ``[L]`` are the tokens actually drafted (default: top-1, i.e. greedy drafting);
    ``first``: the first position that can be rejected (2 when d1 is the seed's exact AR token).
    """
    risk = 1.0 - (top_probs[:, 0] - top_probs[:, 1])
    flagged = np.nonzero(risk[first:] > tau)[0]
    if flagged.size == 0:
        return MismatchPrediction(-1, -1)
    p = int(flagged[0]) + first
    drafted_tok = int(top_ids[p, 0] if drafted is None else drafted[p])
    for cand in top_ids[p]:
        cand = int(cand)
        if cand != drafted_tok and cand != eos_token_id:
            return MismatchPrediction(p, cand)
    return MismatchPrediction(-1, -1)


FLAG_RULES = ("likelihood", "threshold")
"""How a draft's prospective row is chosen: the most likely verification outcome, or the first
position over the risk threshold (:func:`predict_mismatch`)."""


def predict_likely_outcome(top_ids: np.ndarray, top_probs: np.ndarray, eos_token_id: int,
                           drafted: np.ndarray | None = None, first: int = 1) -> MismatchPrediction:
    """The verification outcome a prospective row should bet on: the most likely of "first
    rejection at ``i`` with correction ``B_i``" (for each ``i >= first``) and "everything accepted"
    (returned as position -1), scored with the draft's own probabilities:
    ``P(i, B_i) = prod_{first <= j < i} P(d_j) * P(B_i)`` and ``P(all) = prod_{j >= first} P(d_j)``.

    The threshold rule bets on the first risky position whatever comes after it; this one weighs
    a risky position against the chance that verification cuts earlier, or not at all. On the
    embedded model's greedy LinearSpec rounds over training-split prompts it hits 0.333 of them at
    block 8 where the threshold rule hits 0.296 (tau = 0.5) or 0.310 (tau = 0.7); 0.229 vs 0.214 /
    0.218 at block 16 (``scripts/eval_flag_rules.py``, docs/eval/flag_rules_*.md; the held-out
    sets agree at block 8 and tie at 16).
    Arguments as for :func:`predict_mismatch`, except that ``top_probs`` may hold rank 3's probability as
    well (``[L, 3]``: the native and torch backends score it); with ranks 1 and 2 only, a rank-3 token's
    probability is bounded by ``min(p2, 1 - p1 - p2)``.
    """
    L = top_ids.shape[0]
    if L <= first:
        return MismatchPrediction(-1, -1)
    scores, corrections, full = _outcome_scores(top_ids, top_probs, eos_token_id, drafted, first)
    i = int(scores.argmax())
    if full > scores[i]:
        return MismatchPrediction(-1, -1)
    return MismatchPrediction(first + i, int(corrections[i]))


def likely_outcomes(top_ids: np.ndarray, top_probs: np.ndarray, eos_token_id: int, k: int,
                    drafted: np.ndarray | None = None, first: int = 1) -> list[MismatchPrediction]:
    """The ``k`` most likely verification outcomes, most likely first, scored as
    :func:`predict_likely_outcome` scores them (its bet is the first): what ``k`` prospective rows
    per verify could bet on (``scripts/eval_flag_rules.py`` measures how often one of them hits).
    Ties go to the earlier position, and "everything accepted" after the positions it ties."""
    L = top_ids.shape[0]
    if L <= first:
        return [MismatchPrediction(-1, -1)][:k]
    scores, corrections, full = _outcome_scores(top_ids, top_probs, eos_token_id, drafted, first)
    ranked = sorted([(-float(sc), n, MismatchPrediction(first + n, int(corrections[n])))
                     for n, sc in enumerate(scores) if sc > -np.inf]
                    + [(-full, L, MismatchPrediction(-1, -1))], key=lambda t: (t[0], t[1]))
    return [m for _, _, m in ranked[:k]]


def _outcome_scores(top_ids: np.ndarray, top_probs: np.ndarray, eos_token_id: int,
                    drafted: np.ndarray | None, first: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Per position ``i >= first``: P(first rejection at ``i`` with its correction) and that
    correction; and P(everything accepted) (see :func:`predict_likely_outcome`)."""
    L = top_ids.shape[0]
    ids = top_ids[:, :3].astype(np.int64)
    p1 = top_probs[:, 0].astype(np.float64)
    p2 = top_probs[:, 1].astype(np.float64)
    if top_probs.shape[1] >= 3:  # the backend scored rank 3 as well
        p3 = top_probs[:, 2].astype(np.float64)
        rest = np.maximum(1.0 - p1 - p2 - p3, 0.0)
    else:
        p3 = np.minimum(p2, np.maximum(1.0 - p1 - p2, 0.0))
        rest = np.maximum(1.0 - p1 - p2, 0.0)
    rank_probs = np.stack([p1, p2, p3], axis=1)
    d = ids[:, 0] if drafted is None else np.asarray(drafted, np.int64)
    rows = np.arange(L)
    # The correction at each position: its best-ranked token that is neither drafted nor EOS.
    ok = (ids != d[:, None]) & (ids != eos_token_id)
    rank = ok.argmax(axis=1)
    # P(the drafted token is accepted): its rank's probability (beyond rank 3: what is left).
    match = ids == d[:, None]
    keep = np.where(match.any(axis=1), rank_probs[rows, match.argmax(axis=1)], rest)[first:]
    reach = np.concatenate([[1.0], np.cumprod(keep)[:-1]])
    # A position with no correction candidate is no bet (masked after the product: 0 * -inf is NaN).
    scores = np.where(ok.any(axis=1)[first:], reach * rank_probs[rows, rank][first:], -np.inf)
    full = float(reach[-1] * keep[-1])
    return scores, ids[rows, rank][first:], full
