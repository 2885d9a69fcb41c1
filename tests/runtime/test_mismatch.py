"""Mismatch prediction on hand-built draft logits (the reference the kernel and graph follow)."""

from __future__ import annotations

import numpy as np

from recguide_trt.runtime.mismatch import predict_mismatch, topk_reference

MASK, EOS, V = 3, 2, 10


def block(rows):
    """Logits [L, V] from per-position {token: logit} dicts (others at -10)."""
    out = np.full((len(rows), V), -10.0)
    for i, row in enumerate(rows):
        for t, v in row.items():
            out[i, t] = v
    return out


def run(logits, tau=0.5):
    ids, probs = topk_reference(logits, MASK)
    return predict_mismatch(ids, probs, tau, EOS)


def test_flags_first_low_margin_position_and_rank2_correction():
    logits = block([{5: 0.0, 6: 0.0},            # position 0 (seed): a tie, but never flagged
                    {7: 9.0, 8: 1.0},            # confident
                    {4: 2.0, 9: 1.9, 6: 0.5},    # risky: margin small -> flag, correction = 9
                    {6: 0.1, 7: 0.0}])           # risky too, but later
    pred = run(logits)
    assert (pred.position, pred.correction) == (2, 9)


def test_mask_is_excluded_even_when_it_wins():
    logits = block([{5: 1.0}, {MASK: 20.0, 7: 5.0, 8: 4.9}])
    ids, probs = topk_reference(logits, MASK)
    assert ids[1, 0] == 7 and MASK not in ids[1]
    pred = predict_mismatch(ids, probs, 0.5, EOS)
    assert (pred.position, pred.correction) == (1, 8)


def test_eos_rank2_gives_rank3_correction():
    logits = block([{5: 1.0}, {7: 3.0, EOS: 2.95, 8: 2.9}])
    assert run(logits).correction == 8


def test_no_flag_when_confident():
    logits = block([{5: 0.0, 6: 0.0}, {7: 9.0}, {8: 9.0}])
    pred = run(logits)
    assert (pred.position, pred.correction) == (-1, -1)


def test_threshold_controls_flagging():
    logits = block([{5: 1.0}, {7: 2.0, 8: 1.0}])   # p1 - p2 ~ 0.46 -> risk ~ 0.54
    assert run(logits, tau=0.5).position == 1
    assert run(logits, tau=0.6).position == -1


def test_sampled_draft_token_is_not_its_own_correction():
    logits = block([{5: 1.0}, {7: 2.0, 8: 1.99, 9: 1.0}])
    ids, probs = topk_reference(logits, MASK)
    pred = predict_mismatch(ids, probs, 0.5, EOS, drafted=np.array([5, 8]))
    assert pred.correction == 7
