"""Prompt-lookup drafts (``policy="lookup"``): the lookup itself against a brute-force definition, the
policy's plans, and the engine verifying them with no draft forward, lossless."""

from __future__ import annotations

import numpy as np
import pytest

from recguide_trt.runtime.params import SamplingParams
from recguide_trt.runtime.plan import Kind
from recguide_trt.runtime.policies.base import StepContext
from recguide_trt.runtime.policies.lookup import PromptLookupPolicy
from recguide_trt.runtime.prompt_lookup import Lookup, find_lookup, lookup_draft
from recguide_trt.runtime.request import Request

from .helpers import covering_prompts, fake_engine, run_lossless


def _brute(context: list[int], k: int, max_ngram: int, min_ngram: int, max_agree: int = 32) -> Lookup:
    """The definition: longest n first; of the starts s < len - n whose n tokens equal the last n, the one whose
    tokens up to s + n agree with the context's last ones furthest back (counted up to max_agree), the latest of
    those."""
    L = len(context)
    for n in range(max_ngram, min_ngram - 1, -1):
        if L < n + 1:
            continue
        best = None
        for s in range(L - n - 1, -1, -1):
            if context[s:s + n] == context[L - n:]:
                agree = n
                while agree < max_agree and s + n - 1 - agree >= 0 and context[s + n - 1 - agree] == context[L - 1 - agree]:
                    agree += 1
                if best is None or agree > best[1]:
                    best = (s, agree)
        if best is not None:
            s, agree = best
            return Lookup(context[s + n:s + n + k], n, agree)
    return Lookup([], 0, 0)


def test_the_tokens_after_the_latest_earlier_occurrence():
    assert lookup_draft([1, 2, 3, 9, 8, 7, 1, 2, 3], 3) == [9, 8, 7]
    assert lookup_draft([5, 6, 7, 5, 6, 8, 4, 5, 6], 2, max_ngram=2) == [8, 4]  # the later of two occurrences
    assert lookup_draft([1, 2, 3, 9, 8, 7, 1, 2, 3], 10) == [9, 8, 7, 1, 2, 3]  # up to the context's end
    assert lookup_draft([4, 5, 4, 5], 3) == [4, 5]  # an occurrence overlapping the suffix


def test_longest_ngram_first_and_none_below_min_ngram():
    ctx = [1, 2, 3, 50, 9, 2, 3, 60, 1, 2, 3]  # "2 3" last seen before 60, "1 2 3" before 50
    assert lookup_draft(ctx, 1) == [50]
    assert lookup_draft(ctx, 1, max_ngram=2) == [50]  # of the 2-grams, "1 2 3" agrees further back
    assert find_lookup(ctx, 1, max_ngram=2, max_agree=2).tokens == [60]  # the latest where agreement is not followed
    assert lookup_draft([7, 1, 8, 1], 2) == []  # only a 1-gram repeats: min_ngram 2
    assert lookup_draft([7, 1, 8, 1], 2, min_ngram=1) == [8, 1]
    assert lookup_draft([], 4) == [] and lookup_draft([3], 4) == []


def test_the_occurrence_that_agrees_furthest_back():
    # "1 2 3" occurs twice before the end: after 9 (agreeing 4 back with the context's "9 1 2 3") and, later,
    # after 7; the older one's continuation is drafted, and the agreement is reported.
    ctx = [9, 1, 2, 3, 40, 41, 7, 1, 2, 3, 50, 51, 9, 1, 2, 3]
    assert find_lookup(ctx, 2) == Lookup([40, 41], 3, 4)
    assert find_lookup(ctx, 2, max_agree=3) == Lookup([50, 51], 3, 3)  # agreement not followed: the latest
    assert find_lookup([5, 6, 7, 5, 6], 3) == Lookup([7, 5, 6], 2, 2)
    # A copy in progress: the one occurrence agrees as far back as the context allows.
    copy = list(range(100, 140)) + list(range(100, 136))
    assert find_lookup(copy, 3) == Lookup([136, 137, 138], 3, 32)
    assert find_lookup(copy, 3, max_agree=64) == Lookup([136, 137, 138], 3, 36)


def test_equals_the_brute_force_definition():
    rng = np.random.default_rng(0)
    for _ in range(1500):
        ctx = [int(t) for t in rng.integers(0, int(rng.integers(2, 6)), int(rng.integers(0, 60)))]
        k, hi = int(rng.integers(1, 8)), int(rng.integers(1, 5))
        lo, agree = int(rng.integers(1, hi + 1)), int(rng.integers(1, 12))
        assert find_lookup(ctx, k, hi, lo, agree) == _brute(ctx, k, hi, lo, agree), (ctx, k, hi, lo, agree)
        assert lookup_draft(ctx, k, hi, lo) == _brute(ctx, k, hi, lo).tokens, (ctx, k, hi, lo)


@pytest.mark.parametrize("kwargs", [dict(k=0), dict(k=3, min_ngram=0), dict(k=3, max_ngram=1, min_ngram=2)])
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises(ValueError, match="lookup_draft"):
        lookup_draft([1, 2, 1, 2], **kwargs)


def _request(rid: int, prompt: list[int], output: list[int], **params) -> Request:
    r = Request(rid, prompt, SamplingParams(policy="lookup", **params), np.random.default_rng(0))
    r.output_ids = list(output)
    return r


def test_policy_plans_a_lookup_verify_or_a_diffusion_draft():
    policy = PromptLookupPolicy(default_block=4)
    ctx = StepContext(concurrency=3, step=0)
    hit = _request(0, [10, 11, 12, 13, 14, 15, 10], [11, 12])  # "11 12" seen before: 13 14 15 follow
    miss = _request(1, [10, 11, 12], [20, 21])
    sampled = _request(2, [10, 11, 12, 13, 14, 15, 10], [11, 12], temperature=0.8)
    longer = _request(3, [10, 11, 12, 13, 14, 15, 16, 17, 10], [11, 12], block_size=6)
    w = policy.plan([hit, miss, sampled, longer], ctx)
    assert (w[0].kind, w[0].block, w[0].lookup) == (Kind.VERIFY, 4, (13, 14, 15))
    assert (w[1].kind, w[1].block, w[1].lookup) == (Kind.DRAFT, 4, ())
    assert (w[2].kind, w[2].lookup) == (Kind.DRAFT, ())  # sampling verifies against draft distributions
    assert (w[3].kind, w[3].block, w[3].lookup) == (Kind.VERIFY, 6, (13, 14, 15, 16, 17))


@pytest.mark.parametrize("max_num_seqs", [1, 8])
def test_engine_verifies_lookup_drafts_losslessly_without_draft_forwards(max_num_seqs):
    """Prompts that hold every token of the fake model's vocabulary, and 1-gram lookups: nearly every round
    verifies a lookup draft with no draft forward (fewer draft forwards than verifies), and every output is
    AR greedy's; a sampled request beside them drafts by diffusion and still finishes."""
    engine = fake_engine(max_num_seqs=max_num_seqs)
    engine.policies["lookup"] = PromptLookupPolicy(default_block=6, min_ngram=1)
    reqs, sampled = run_lossless(engine, covering_prompts(3, 12), "lookup", 30, sampled=True)
    draft = sum(r.metrics.forwards["draft"] for r in reqs)
    verify = sum(r.metrics.forwards["verify"] for r in reqs)
    assert draft < verify / 4, (draft, verify)
    assert sampled.metrics.forwards["draft"] == sampled.metrics.forwards["verify"] > 0
