"""RecGuide's prompt-lookup rows: where a lookup verify replaces an AR row or a drafted block (priced by the
step's expected tokens per second), what its online acceptance estimate learns, and the context arrays the
lookups read."""

from __future__ import annotations

import numpy as np
import pytest

from recguide_trt.runtime.lookup_acceptance import FULL, NONE, PARTIAL, ZERO, LookupAcceptance, agreement_bin
from recguide_trt.runtime.mismatch import NO_MISMATCH
from recguide_trt.runtime.params import SamplingParams
from recguide_trt.runtime.plan import Kind, Work
from recguide_trt.runtime.policies import recguide as recguide_module
from recguide_trt.runtime.policies.base import StepContext
from recguide_trt.runtime.policies.recguide import RecGuideConfig, RecGuidePolicy
from recguide_trt.runtime.prompt_lookup import ContextArrays, Lookup, find_lookup
from recguide_trt.runtime.request import Draft, Request, Round

from .helpers import covering_prompts, fake_engine, run_lossless
from .test_policies import linear_cost

COPYING = agreement_bin(2)
"""The agreement bin of :func:`_copying`'s match (its 2-gram alone)."""


def _copying(rid: int, **params) -> Request:
    """A request whose context ends in "5 6", seen before with 7 8 9 after it (a 2-gram match)."""
    r = Request(rid, [5, 6, 7, 8, 9, 10, 5], SamplingParams(max_tokens=50, **params), np.random.default_rng(0))
    r.output_ids = [6]
    r.seed, r.cache_len = 6, 7
    return r


def _ar_policy(per_token: float, fixed: float, packed: bool = True, explore: int = 0) -> RecGuidePolicy:
    """A warm adaptive-mode policy whose diffusion drafts are never accepted, so its chooser gives every
    request AR; its lookup estimate past the exploring rounds (the 0.5 prior) unless ``explore`` is given."""
    pol = RecGuidePolicy(RecGuideConfig(switch_concurrency=0, candidate_blocks=(1, 4)), 4, 3,
                         linear_cost(per_token, fixed))
    pol.lookups = LookupAcceptance(pol.lookups.max_tokens, explore=explore)
    pol.packed = packed
    for _ in range(100):
        pol.acceptance.update(pol.acceptance.no_history, 4, 0)
    return pol


def _teach(pol: RecGuidePolicy, key: tuple[int, int], accepted: int, rounds: int = 200) -> None:
    for _ in range(rounds):
        pol.lookups.update(key, 3, accepted)


def test_acceptance_per_position_with_its_prior_and_the_round_outcome():
    est = LookupAcceptance(4, prior=0.5, weight=4.0, explore=0)
    assert est.expected((NONE, COPYING), 3) == pytest.approx(0.5 + 0.25 + 0.125)
    assert est.expected((NONE, COPYING), 0) == 0.0
    for _ in range(400):
        est.update((FULL, 3), 4, 4)
        est.update((ZERO, COPYING), 4, 0)
    assert est.expected((FULL, 3), 4) > 3.8
    assert est.expected((ZERO, COPYING), 4) < 0.1
    assert est.best_expected(4) == est.expected((FULL, 3), 4)
    assert (est.rounds, est.tokens, est.accepted) == (800, 3200, 1600)
    # A round that accepted 1 of 3 tried positions 1 and 2 only; position 3 learnt nothing. Pooled: (1 + 0.5) / 2
    # and (0 + 0.5) / 2; the agreement bin shrinks to those: (1 + 0.75) / 2, (0 + 0.25) / 2; the key to the bin's:
    # (1 + 0.875) / 2, (0 + 0.125) / 2. Another outcome of the same agreement reads the bin's.
    one = LookupAcceptance(3, prior=0.5, weight=1.0, explore=0)
    one.update((PARTIAL, COPYING), 3, 1)
    assert one.accept_probs((PARTIAL, COPYING)).tolist() == pytest.approx([0.9375, 0.0625, 0.5])
    assert one.accept_probs((NONE, COPYING)).tolist() == pytest.approx([0.875, 0.125, 0.5])
    assert one.accept_probs((NONE, 4)).tolist() == pytest.approx([0.75, 0.25, 0.5])
    assert [LookupAcceptance.outcome(3, a) for a in (0, 1, 3)] == [ZERO, PARTIAL, FULL]
    with pytest.raises(ValueError, match="max_tokens"):
        LookupAcceptance(0)
    for bad in ((0, 3), (3, 2)):
        with pytest.raises(ValueError, match="lookup_ngrams"):
            RecGuidePolicy(RecGuideConfig(lookup_ngrams=bad), 4, 3)


def test_find_lookup_reports_the_ngram_and_context_arrays_follow_the_output():
    assert find_lookup([1, 2, 3, 9, 8, 1, 2, 3], 2) == ([9, 8], 3, 3)
    assert find_lookup([5, 6, 7, 5, 6], 3) == ([7, 5, 6], 2, 2)
    assert find_lookup([1, 2, 3], 2) == ([], 0, 0)
    assert [agreement_bin(a) for a in (1, 2, 3, 4, 7, 8, 15, 16, 32)] == [0, 0, 1, 2, 2, 3, 3, 4, 4]
    arrays, r = ContextArrays(), _copying(0)
    rng = np.random.default_rng(1)
    for _ in range(60):
        assert arrays.get(r).tolist() == r.prompt_ids + r.output_ids
        r.output_ids.extend(int(t) for t in rng.integers(0, 99, int(rng.integers(0, 4))))
    r.output_ids = r.output_ids[:3]  # not something the engine does; rebuilt, not misread
    assert arrays.get(r).tolist() == r.prompt_ids + r.output_ids
    arrays.forget(r.id)
    assert arrays.get(r).tolist() == r.prompt_ids + r.output_ids


def test_an_ar_row_verifies_a_lookup_where_its_extra_tokens_are_cheap():
    """T(1, w) = 1 + 0.1 w: the prior's 3-token lookup (1.875 expected tokens for 1.4) beats AR (1 for 1.1)."""
    pol = _ar_policy(0.1, 1.0)
    works = pol.plan([_copying(0)], StepContext(1, 0))
    assert works == [Work(0, Kind.VERIFY, 4, lookup=(7, 8, 9))]
    # At 1 + w per token, no lookup can pay for its tokens: AR.
    assert _ar_policy(1.0, 0.0).plan([_copying(0)], StepContext(1, 0)) == [Work(0, Kind.AR)]
    # Sampled and logit-adjusted rows never look up.
    assert pol.plan([_copying(1, temperature=0.7)], StepContext(1, 1)) == [Work(1, Kind.AR)]
    assert pol.plan([_copying(2, repetition_penalty=1.3)], StepContext(1, 2)) == [Work(2, Kind.AR)]


def test_what_the_lookups_learn_decides_the_next_ones():
    pol = _ar_policy(0.1, 1.0)
    _teach(pol, (ZERO, COPYING), 0)
    _teach(pol, (FULL, COPYING), 3)
    rejected, copying = _copying(0), _copying(1)
    for r, accepted in ((rejected, 0), (copying, 3)):  # each request's last lookup round
        r.draft = Draft([7, 8, 9], NO_MISMATCH, lookup=True)
        pol.observe(r, Round(4, accepted), None, None)
        r.draft = None
    works = pol.plan([rejected, copying], StepContext(2, 0))
    assert works == [Work(0, Kind.AR), Work(1, Kind.VERIFY, 4, lookup=(7, 8, 9))]
    rounds = pol.lookups.rounds
    copying.draft = Draft([7, 8, 9], NO_MISMATCH, lookup=True)
    pol.observe(copying, Round(4, 1), None, None)  # the planned round is learnt under its key
    assert pol.lookups.rounds == rounds + 1 and pol._lookup_prev[1] == PARTIAL
    assert pol.stats()["lookup_rounds"] == rounds + 1
    pol.forget(1)
    assert 1 not in pol._lookup_prev and 1 not in pol._lookup_key


def test_padded_steps_price_a_lookup_row_at_the_widest_row():
    """8 AR rows at T = 1 + 0.02 · rows · width: packed, a lookup row pays, 2 tokens best (8.75 expected tokens for
    1.21 s against 8 for 1.16; 3 tokens: 8.875 for 1.23); padded, it costs a step of 8 rows that wide and does
    not."""
    reqs = [_copying(0)] + [Request(i, [1, 2, 3], SamplingParams(max_tokens=50), np.random.default_rng(0))
                            for i in range(1, 8)]
    packed = _ar_policy(0.02, 1.0).plan(reqs, StepContext(8, 0))
    assert packed[0] == Work(0, Kind.VERIFY, 3, lookup=(7, 8)) and all(w.kind is Kind.AR for w in packed[1:])
    padded = _ar_policy(0.02, 1.0, packed=False).plan(reqs, StepContext(8, 0))
    assert all(w.kind is Kind.AR for w in padded)


def test_a_fresh_policy_tries_lookups_where_the_plain_prior_would_not_and_then_prices_what_it_learnt():
    """8 AR rows at T = 1 + 0.1 · tokens (the cost table's, interpolated): with the 0.5 prior no lookup pays (the
    best, 1 token: 8.5 expected tokens for 1.94 s against 8 for 1.8), so a policy that starts there would never learn
    one. The first rounds' prior is 0.9 (3 tokens: 10.44 for 2.17 s): it verifies a lookup, and once the rounds it
    observed say they are rejected, AR again; where they are accepted, lookups go on."""
    reqs = [_copying(0)] + [Request(i, [1, 2, 3], SamplingParams(max_tokens=50), np.random.default_rng(0))
                            for i in range(1, 8)]
    assert all(w.kind is Kind.AR for w in _ar_policy(0.1, 1.0).plan(reqs, StepContext(8, 0)))
    for accepted, then in ((0, Kind.AR), (3, Kind.VERIFY)):
        pol = _ar_policy(0.1, 1.0, explore=8)
        first = pol.plan(reqs, StepContext(8, 0))
        assert first[0].kind is Kind.VERIFY and first[0].lookup and all(w.kind is Kind.AR for w in first[1:])
        _teach(pol, (NONE, COPYING), accepted, rounds=40)
        assert pol.lookups.rounds >= pol.lookups.explore
        assert pol.plan(reqs, StepContext(8, 0))[0].kind is then, accepted


def test_a_fresh_request_reads_what_matches_that_agree_as_far_back_accepted():
    """8 AR rows at T = 1 + 0.1 · tokens. The lookups learnt so far came from requests past their first round:
    matches agreeing 16 or more tokens back were accepted whole, 2-gram matches never. A fresh request (no lookup
    round of its own) copying a long passage verifies a lookup; a fresh one matching a 2-gram alone runs AR. (Keyed
    on the n-gram, both read the pooled half-accepted estimate, where no lookup pays at this load.)"""
    pol = _ar_policy(0.1, 1.0)
    _teach(pol, (FULL, agreement_bin(16)), 3)
    _teach(pol, (ZERO, COPYING), 0)
    works = pol.plan(_long_copy_and_seven(), StepContext(8, 0))
    assert works[0] == Work(0, Kind.VERIFY, 4, lookup=(119, 7, 8))
    assert all(w.kind is Kind.AR for w in works[1:])
    assert pol._lookup_key[0] == (NONE, agreement_bin(19))


def test_each_agreement_bin_explores_on_its_own():
    """8 AR rows at T = 1 + 0.1 · tokens, where lookups at the 0.5 prior do not pay. A policy whose first lookups, all
    of 2-gram matches, were rejected still tries a match agreeing 19 tokens back (its bin has seen no round yet); once
    that bin has seen its own rejections, it does not."""
    pol = _ar_policy(0.1, 1.0, explore=8)
    _teach(pol, (ZERO, COPYING), 0, rounds=40)
    works = pol.plan(_long_copy_and_seven(), StepContext(8, 0))
    assert works[0].lookup and all(w.kind is Kind.AR for w in works[1:])
    _teach(pol, (ZERO, agreement_bin(19)), 0, rounds=40)
    assert all(w.kind is Kind.AR for w in pol.plan(_long_copy_and_seven(), StepContext(8, 1)))


def _long_copy_and_seven() -> list[Request]:
    """A request whose context ends with the first 19 tokens of a passage it holds whole (100 … 118, followed there
    by 119 7 8), then :func:`_copying` (a 2-gram match), then 6 requests with no match."""
    passage = list(range(100, 120))
    copy = Request(0, passage + [7, 8, 9] + passage[:-2], SamplingParams(max_tokens=50), np.random.default_rng(0))
    copy.output_ids = [passage[-2]]
    return [copy, _copying(1)] + [Request(i, [1, 2, 3], SamplingParams(max_tokens=50), np.random.default_rng(0))
                                  for i in range(2, 8)]


def test_a_step_where_no_lookup_can_pay_looks_nothing_up(monkeypatch):
    calls = []
    monkeypatch.setattr(recguide_module, "find_lookup", lambda *a: calls.append(a) or Lookup([], 0, 0))
    assert _ar_policy(1.0, 0.0).plan([_copying(0)], StepContext(1, 0)) == [Work(0, Kind.AR)]
    assert calls == []
    _ar_policy(0.1, 1.0).plan([_copying(0)], StepContext(1, 0))
    assert len(calls) == 1


def test_a_drafted_block_stays_a_diffusion_draft_where_lookups_are_rejected():
    """Flat cost, so the chooser drafts 4-token blocks; a lookup replaces the draft while it is expected to
    earn more per step, not once its key's lookups are always rejected."""
    pol = RecGuidePolicy(RecGuideConfig(switch_concurrency=0, candidate_blocks=(1, 4)), 4, 3, linear_cost(0, 1))
    pol.packed = True
    r = _copying(0)
    assert pol.plan([r], StepContext(1, 0)) == [Work(0, Kind.VERIFY, 4, lookup=(7, 8, 9))]
    _teach(pol, (ZERO, COPYING), 0)
    r.draft = Draft([7, 8, 9], NO_MISMATCH, lookup=True)
    pol.observe(r, Round(4, 0), None, None)
    r.draft = None
    assert pol.plan([r], StepContext(1, 1)) == [Work(0, Kind.DRAFT, 4)]


@pytest.mark.parametrize("max_num_seqs", [1, 6])
def test_engine_recguide_with_lookup_rows_is_lossless(max_num_seqs):
    """Prompts that hold every token of the fake model's vocabulary, and 1-gram lookups: RecGuide verifies lookup
    drafts beside AR and diffusion rows, learns from them, and every greedy output is AR greedy's; a sampled request
    beside them never looks up."""
    engine = fake_engine(max_num_seqs=max_num_seqs, recguide=RecGuideConfig(lookup_ngrams=(1, 3)))
    _, sampled = run_lossless(engine, covering_prompts(5, 10), "recguide", 40, sampled=True)
    pol = engine.policies["recguide"]
    assert pol.lookups.rounds > 0 and not pol._lookup_key and not pol._lookup_prev
    assert sampled.metrics.forwards["draft"] > 0


def test_a_prospective_rows_draft_gives_way_to_a_better_lookup():
    """A draft made by last step's prospective row cost no forward of its own: a lookup rated higher replaces its
    verify; one rated lower does not. A draft from a draft forward is always verified."""
    pol = RecGuidePolicy(RecGuideConfig(switch_concurrency=100, candidate_blocks=(1, 4)), 4, 3, linear_cost(0, 1))
    pol.packed = True
    r = _copying(0)
    r.draft = Draft([20, 21, 22], NO_MISMATCH, prospective=True)
    _teach(pol, (NONE, COPYING), 3)
    assert pol.plan([r], StepContext(1, 0)) == [Work(0, Kind.VERIFY, 4, lookup=(7, 8, 9))]
    rejected = RecGuidePolicy(RecGuideConfig(switch_concurrency=100, candidate_blocks=(1, 4)), 4, 3,
                              linear_cost(0, 1))
    _teach(rejected, (NONE, COPYING), 0)
    assert not rejected.plan([r], StepContext(1, 0))[0].lookup
    r.draft = Draft([20, 21, 22], NO_MISMATCH)
    assert not pol.plan([r], StepContext(1, 1))[0].lookup


def test_a_prospective_row_is_not_fused_where_its_bet_leads_into_a_better_lookup():
    """Overlap mode: the draft [7, 8, 30] bets on a rejection at position 3 with correction 9, after which the
    context ends "7 8 9", seen before with "10 5 6" after it. Where such lookups are accepted the round after
    would verify the lookup, so the verify is not fused with a prospective draft; where they are rejected, it is."""
    from recguide_trt.runtime.mismatch import MismatchPrediction

    plans = []
    for accepted in (3, 0):
        pol = RecGuidePolicy(RecGuideConfig(switch_concurrency=100, candidate_blocks=(1, 4)), 4, 3, linear_cost(0, 1))
        pol.packed = True
        _teach(pol, (NONE, agreement_bin(5)), accepted)  # "5 6 7 8 9" agree
        r = _copying(0)
        r.draft = Draft([7, 8, 30], MismatchPrediction(3, 9))
        plans.append(pol.plan([r], StepContext(1, 0))[0])
        assert pol.stats()["lookahead_skips"] == int(accepted == 3)
    assert plans[0] == Work(0, Kind.VERIFY, 4)
    assert plans[1].kind is Kind.FUSED and plans[1].prospective.first_token == 9


@pytest.mark.parametrize("switch", [100, 0])
def test_engine_recguide_lookups_in_either_mode_are_lossless(switch):
    """One request at a time, RecGuide forced into the overlap or the adaptive mode, with 1-gram lookups on prompts
    that hold half the vocabulary (a token of the other half finds nothing: a diffusion draft), and lookups rated
    as if always accepted (the fake model rejects most): lookups replace AR rows, drafted blocks and, in the
    overlap, prospective rows' drafts; every output is AR's."""
    engine = fake_engine(max_num_seqs=1, recguide=RecGuideConfig(lookup_ngrams=(1, 3), switch_concurrency=switch))
    pol = engine.policies["recguide"]
    for prev in (NONE, ZERO, PARTIAL, FULL):
        for agreement in range(5):
            _teach(pol, (prev, agreement), 3, rounds=5000)
    replaced = []
    plan = pol._with_lookups

    def counting(requests, works, overlap):
        out = plan(requests, works, overlap)
        replaced.extend(w.lookup and r.draft is not None and r.draft.prospective for r, w in zip(requests, out))
        return out

    pol._with_lookups = counting
    run_lossless(engine, covering_prompts(7, 6, high=34), "recguide", 48)
    assert pol.lookups.rounds > 100000 + 20
    assert any(replaced) == (switch == 100)


def test_a_prospective_hit_whose_draft_gives_way_to_a_lookup_is_taken_back():
    """Overlap mode: a fused row hit, and next step its draft gives way to a lookup rated higher: the hit bought
    nothing and counts as a miss of its block. Where the lookup is rejected (rated lower) the draft is verified
    and the hit stands."""
    for accepted, lost in ((3, 1), (0, 0)):
        pol = RecGuidePolicy(RecGuideConfig(switch_concurrency=100, candidate_blocks=(1, 4)), 4, 3, linear_cost(0, 1))
        pol.packed = True
        _teach(pol, (NONE, COPYING), accepted)
        r = _copying(0)
        r.draft = Draft([20, 21, 22], NO_MISMATCH)       # the verified draft, whose fused row hit
        pol.observe(r, Round(4, 3), True)
        assert pol._block_hits[4] == [1, 1] and pol.hits == 1
        r.draft = Draft([7, 8, 30], NO_MISMATCH, prospective=True)   # the fused row's draft
        (work,) = pol.plan([r], StepContext(1, 0))
        assert bool(work.lookup) == bool(lost)
        assert pol._block_hits[4] == [1 - lost, 1] and pol.hits == 1 - lost
        assert pol.stats()["lookup_lost_hits"] == lost
        assert pol.block_hit_rate(4) < 0.5 if lost else pol.block_hit_rate(4) > 0.1
        pol.plan([r], StepContext(1, 1))                  # settled once: a later step changes nothing
        assert pol.hits == 1 - lost


def test_a_would_be_hit_is_taken_back_where_the_lookup_is_worth_the_prospective_draft():
    """A plain verify's would-be hit: taken back where the next round verifies a lookup worth at least what the
    prospective draft would have been (the draft would have given way to it), kept where it is worth less or the
    round verifies no lookup; a miss is never touched, nor a hit of a request the lookups may not serve."""
    for lookup_accepted, lookup, lost in ((3, (7, 8, 9), 1), (0, (7, 8, 9), 0), (3, (), 0)):
        pol = RecGuidePolicy(RecGuideConfig(switch_concurrency=0, candidate_blocks=(1, 4)), 4, 3, linear_cost(0, 1))
        for _ in range(200):
            pol.acceptance.update(pol.acceptance.no_history, 4, 2)   # a 4-block draft: 3 tokens expected
        _teach(pol, (NONE, COPYING), lookup_accepted)
        r = _copying(0)
        r.draft = Draft([20, 21, 22], NO_MISMATCH)
        pol.observe(r, Round(4, 2), None, would_hit=True)
        r.draft = None
        pol._lookup_key[r.id] = (NONE, COPYING)
        pol._settle_hits([r], [Work(0, Kind.VERIFY, 1 + len(lookup), lookup=lookup)])
        assert (pol.counterfactual, pol.counterfactual_hits, pol.lookup_lost_hits) == (1, 1 - lost, lost)
        assert pol._block_hits[4] == [1 - lost, 1]
    pol = RecGuidePolicy(RecGuideConfig(switch_concurrency=0, candidate_blocks=(1, 4)), 4, 3, linear_cost(0, 1))
    r = _copying(0)
    r.draft = Draft([20, 21, 22], NO_MISMATCH)
    pol.observe(r, Round(4, 0), None, would_hit=False)
    sampled = _copying(1, temperature=1.0)
    sampled.draft = Draft([20, 21, 22], NO_MISMATCH)
    pol.observe(sampled, Round(4, 3), None, would_hit=True)
    assert not pol._unsettled_hit                          # nothing that a lookup could take back
