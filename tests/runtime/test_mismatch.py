"""Mismatch prediction on hand-built draft logits (the reference the kernel and graph follow)."""

from __future__ import annotations

import numpy as np

from recguide_trt.runtime.mismatch import MismatchPrediction, predict_mismatch, topk_reference

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


def likely(logits, first=1, drafted=None):
    from recguide_trt.runtime.mismatch import predict_likely_outcome

    ids, probs = topk_reference(logits, MASK)
    return predict_likely_outcome(ids, probs, EOS, drafted, first=first)


def test_likelihood_rule_bets_on_the_most_likely_outcome():
    confident = {7: 9.0, 8: 1.0}
    # Every position confident: betting on a full accept.
    assert likely(block([{5: 0.0}, confident, confident, confident])).position == -1
    # One risky position among confident ones: its rank-2 token is less likely than the drafted
    # one, so a full accept stays the better bet.
    assert likely(block([{5: 0.0}, confident, {4: 2.0, 9: 1.9}, confident])).position == -1
    # Risky positions after it make a full accept unlikely: the cut (0.45) beats it (0.27).
    lg = np.log
    pred = likely(block([{5: 0.0}, {4: lg(0.55), 9: lg(0.45)}, {7: lg(0.7), 8: lg(0.3)}, {7: lg(0.7), 8: lg(0.3)}]))
    assert (pred.position, pred.correction) == (1, 9)
    # The threshold rule takes the first risky position; the likelihood rule weighs its rank-2
    # (0.15) against reaching the next one (0.7) and its rank-2 there (0.48): 0.34, full 0.22.
    logits = block([{5: 0.0}, {4: lg(0.7), 6: lg(0.15), 8: lg(0.15)}, {7: lg(0.52), 9: lg(0.48)},
                    {7: lg(0.6), 8: lg(0.4)}])
    assert run(logits, tau=0.3).position == 1
    pred = likely(logits)
    assert (pred.position, pred.correction) == (2, 9)
    # EOS is never a correction: the rank-3 token is, with at most rank-2's probability.
    pred = likely(block([{5: 0.0}, {4: 1.0, EOS: 0.99, 6: 0.98}, {7: 0.0, 8: 0.0}]))
    assert (pred.position, pred.correction) == (1, 6)
    # first = 2 (a causal seed): position 1 is never rejected, whatever its margin.
    pred = likely(block([{5: 0.0}, {4: 0.0, 6: 0.0}, {4: 1.0, 9: 0.9}, {7: 0.0, 8: 0.0}]), first=2)
    assert (pred.position, pred.correction) == (2, 9)


def brute_force_outcomes(logits: np.ndarray, ids: np.ndarray) -> dict:
    """P(first rejection at i with its correction B) for every i, and P(all accepted) under key (-1, -1),
    by definition from the block's full softmax (MASK excluded)."""
    L = logits.shape[0]
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p[:, MASK] = 0
    p /= p.sum(-1, keepdims=True)
    outcomes = {(-1, -1): float(np.prod([p[j, ids[j, 0]] for j in range(1, L)]))}
    for i in range(1, L):
        before = float(np.prod([p[j, ids[j, 0]] for j in range(1, i)]))
        for b in ids[i]:
            if b != ids[i, 0] and b != EOS:
                outcomes[(i, int(b))] = before * p[i, b]
                break
    return outcomes


def test_likelihood_rule_matches_brute_force_outcome_probabilities():
    from recguide_trt.runtime.mismatch import predict_likely_outcome

    rng = np.random.default_rng(0)
    for _ in range(200):
        L = int(rng.integers(2, 9))
        logits = rng.normal(scale=2.0, size=(L, V))
        ids, probs = topk_reference(logits, MASK)
        outcomes = brute_force_outcomes(logits, ids)
        pred = predict_likely_outcome(ids, probs, EOS)
        got = outcomes[(pred.position, pred.correction)]
        exact_rank3 = all(b != EOS for b in ids[:, 1])   # rank-3 probabilities are only bounded
        if exact_rank3:
            assert got == max(outcomes.values()) or np.isclose(got, max(outcomes.values()), rtol=1e-5)


def test_likelihood_rule_never_bets_on_a_position_without_a_correction():
    from recguide_trt.runtime.mismatch import predict_likely_outcome

    # Position 1's drafted token (a sampled draft, 40) lies outside the top 3, which hold all the
    # mass: nothing after it is reachable (probability 0). Position 2 has no correction candidate
    # (its top ids are the drafted token and EOS). The bet is position 1, never position 2.
    ids = np.array([[5, 6, 7], [4, 9, 8], [11, EOS, 11]])
    probs = np.array([[1.0, 0.0], [0.6, 0.4], [0.9, 0.1]], np.float32)
    pred = predict_likely_outcome(ids, probs, EOS, drafted=np.array([5, 40, 11]))
    assert (pred.position, pred.correction) == (1, 4)


def test_likely_outcomes_rank_what_the_likelihood_rule_scores():
    """The first of the ranked outcomes is the likelihood rule's bet; the second is the next most
    likely outcome by the same brute-force probabilities (what a second prospective row would bet on)."""
    from recguide_trt.runtime.mismatch import likely_outcomes, predict_likely_outcome

    rng = np.random.default_rng(1)
    checked = 0
    for _ in range(200):
        L = int(rng.integers(2, 9))
        logits = rng.normal(scale=2.0, size=(L, V))
        ids, probs = topk_reference(logits, MASK)
        ranked = likely_outcomes(ids, probs, EOS, k=3)
        assert ranked[0] == predict_likely_outcome(ids, probs, EOS)
        assert len(ranked) == min(3, len({(m.position, m.correction) for m in ranked}))
        if not all(b != EOS for b in ids[:, 1]):
            continue                              # rank-3 probabilities are only bounded there
        outcomes = brute_force_outcomes(logits, ids)
        want = sorted(outcomes.values(), reverse=True)[:len(ranked)]
        got = [outcomes[(m.position, m.correction)] for m in ranked]
        assert np.allclose(got, want, rtol=1e-5)
        checked += 1
    assert checked > 50
    # Too short a block to reject anything: only "everything accepted".
    ids, probs = topk_reference(block([{5: 0.0}]), MASK)
    assert likely_outcomes(ids, probs, EOS, k=2) == [MismatchPrediction(-1, -1)]


def test_likelihood_rule_with_rank_3_scored_is_exact_for_drafts_among_the_top_3():
    """With rank 3's probability given (``top_probs`` [L, 3]: the native and torch backends score it), the bet is
    the most likely outcome by definition, also where a drafted token (a draft sampler's choice) is rank 2 or 3
    and where EOS pushes the correction to rank 3."""
    from recguide_trt.runtime.mismatch import predict_likely_outcome

    rng = np.random.default_rng(4)
    for _ in range(300):
        L = int(rng.integers(2, 9))
        logits = rng.normal(scale=2.0, size=(L, V))
        ids, _ = topk_reference(logits, MASK)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p[:, MASK] = 0
        p /= p.sum(-1, keepdims=True)
        probs3 = np.take_along_axis(p, ids, -1)
        drafted = ids[np.arange(L), rng.integers(0, 3, L)]
        outcomes = {(-1, -1): float(np.prod([p[j, drafted[j]] for j in range(1, L)]))}
        for i in range(1, L):
            before = float(np.prod([p[j, drafted[j]] for j in range(1, i)]))
            for b in ids[i]:
                if b != drafted[i] and b != EOS:
                    outcomes[(i, int(b))] = before * p[i, b]
                    break
        pred = predict_likely_outcome(ids, probs3, EOS, drafted=drafted)
        assert np.isclose(outcomes[(pred.position, pred.correction)], max(outcomes.values()), rtol=1e-9)
