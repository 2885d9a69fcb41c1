"""``min_tokens``, ``stop_token_ids``, ``logit_bias``, the repetition / frequency / presence penalties, ``top_k`` and
``min_p``: what they do to the logits, and that every policy still equals AR under the same settings."""

from __future__ import annotations

import numpy as np
import pytest

from recguide_trt import LLM, EngineConfig, SamplingParams
from recguide_trt.runtime.logits_processors import adjust, adjusts_logits
from recguide_trt.runtime.params import PEER_CONTROLLERS
from recguide_trt.runtime.sampling import probs_from_logits
from tests.conftest import EMBEDDED, has_embedded

from .helpers import flat_cost_table

needs_tiny = pytest.mark.skipif(not has_embedded(), reason="embedded model not trained yet")
PROMPTS = [f"def function_{i}(x):\n    " if i % 2 else f"import os\nclass Widget{i}:\n    " for i in range(8)]
POLICIES = [dict(policy="linearspec", block_size=4), dict(policy="linearspec", block_size=8),
            dict(policy="recguide"), dict(policy=PEER_CONTROLLERS[0])]


def test_adjust_by_hand():
    logits = np.array([[2.0, -1.0, 0.5, 3.0, 0.0, 1.0]] * 3, np.float32)
    p = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25,
                       logit_bias={5: -1.0}, min_tokens=3, stop_token_ids=[4])
    p.validate()
    assert adjusts_logits(p) and not adjusts_logits(SamplingParams(stop_token_ids=[4], top_k=3, min_p=0.1))
    # prompt [0], output [1, 1], then row 1 after drafted token 3 and row 2 after 3, 2; EOS is token 2
    out = adjust(logits, p, prompt=[0], output=[1, 1], drafted=[3, 2], eos=2)
    # row 0: 2 tokens out < min_tokens 3 bans EOS (2) and the stop token 4
    assert out[0].tolist() == [1.0, -1.0 * 2 - 0.5 * 2 - 0.25, -np.inf, 3.0, -np.inf, 0.0]
    # row 1: 3 tokens out, no ban; 3 joins the history (divided by 2, counted once)
    assert out[1].tolist() == [1.0, -3.25, 0.5, 1.5 - 0.75, 0.0, 0.0]
    # row 2: 2 joins too (positive: divided, then counted)
    assert out[2].tolist() == [1.0, -3.25, 0.25 - 0.75, 0.75, 0.0, 0.0]
    assert logits[0, 0] == 2.0  # the input is not changed
    plain = SamplingParams()
    assert (adjust(logits, plain, [0], [1]) == logits).all()


def _dense(logits, params, prompt, output, drafted, eos):
    """The rules over the whole vocabulary, one position at a time: what the sparse ``adjust`` must equal."""
    out = logits.astype(np.float32).copy()
    V = out.shape[1]
    stops = ([eos] if params.stop_at_eos else []) + list(params.stop_token_ids)
    for i in range(out.shape[0]):
        hist = list(output) + list(drafted[:i])
        counts = np.bincount(np.asarray(hist, np.int64), minlength=V).astype(np.float32)
        seen = np.zeros(V, bool)
        seen[list(prompt) + hist] = True
        row = out[i]
        if len(hist) < params.min_tokens:
            row[stops] = -np.inf
        for t, b in params.logit_bias.items():
            row[t] += np.float32(b)
        if params.repetition_penalty != 1:
            rp = np.float32(params.repetition_penalty)
            row[seen] = np.where(row[seen] > 0, row[seen] / rp, row[seen] * rp)
        row -= np.float32(params.frequency_penalty) * counts
        row -= np.float32(params.presence_penalty) * (counts > 0)
    return out


def test_adjust_equals_the_rules_over_the_whole_vocabulary():
    rng = np.random.default_rng(3)
    for trial in range(40):
        V = 50
        p = SamplingParams(repetition_penalty=float(rng.choice([1.0, 1.3, 0.8])),
                           frequency_penalty=float(rng.choice([0, 0.7, -0.4])),
                           presence_penalty=float(rng.choice([0, 0.5, -1.0])),
                           logit_bias={int(t): float(rng.normal() * 5) for t in rng.integers(0, V, rng.integers(0, 3))},
                           min_tokens=int(rng.integers(0, 8)), stop_token_ids=[int(rng.integers(0, V))],
                           stop_at_eos=bool(rng.integers(2)))
        p.validate()
        n = int(rng.integers(1, 6))
        logits = (rng.normal(size=(n, V)) * 3).astype(np.float32)
        prompt, output = rng.integers(0, V, 6).tolist(), rng.integers(0, V, int(rng.integers(0, 6))).tolist()
        drafted = rng.integers(0, 12, n - 1).tolist()  # repeats, some of them in the output too
        got = adjust(logits, p, prompt, output, drafted, eos=3)
        np.testing.assert_array_equal(got, _dense(logits, p, prompt, output, drafted, 3), err_msg=str(trial))


def test_top_k_and_min_p():
    def probs(row, **kw):
        return probs_from_logits(np.log(np.array(row)), 1.0, 1.0, **kw).tolist()

    assert probs([0.4, 0.3, 0.2, 0.1], top_k=2) == pytest.approx([4 / 7, 3 / 7, 0, 0])
    assert probs([0.4, 0.3, 0.2, 0.1], top_k=9) == pytest.approx([0.4, 0.3, 0.2, 0.1])
    assert probs([0.4, 0.3, 0.2, 0.1], min_p=0.5) == pytest.approx([4 / 9, 3 / 9, 2 / 9, 0])
    assert probs([0.3, 0.3, 0.3, 0.1], top_k=2) == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0])  # ties at the k-th kept


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(top_k=-2), "top_k must be an integer >= -1"),
    (dict(top_k=1.5), "top_k must be an integer >= -1"),
    (dict(min_p=1.5), r"min_p must be in \[0, 1\]"),
    (dict(min_tokens=-2), "min_tokens must be an integer >= 0"),
    (dict(stop_token_ids=5), "stop_token_ids must be a list of token ids"),
    (dict(stop_token_ids=[-1]), "stop_token_ids must be made of token ids"),
    (dict(logit_bias=[1, 2]), "logit_bias must be a dict"),
    (dict(logit_bias={"x": 1.0}), "logit_bias must be made of token ids"),
    (dict(logit_bias={3: 101}), r"logit_bias\[3\] must be in \[-100, 100\]"),
    (dict(repetition_penalty=0), "repetition_penalty must be > 0"),
    (dict(frequency_penalty=2.5), r"frequency_penalty must be in \[-2, 2\]"),
    (dict(presence_penalty=float("nan")), "presence_penalty must be a finite number"),
])
def test_bad_values_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs).validate()


def test_logit_bias_keys_may_be_json_digits():
    p = SamplingParams(logit_bias={"17": 5, 3: -2.5})
    p.validate()
    assert p.logit_bias == {17: 5.0, 3: -2.5}


@pytest.fixture(scope="module")
def tiny():
    return LLM(EMBEDDED, backend="native", engine_config=EngineConfig(max_num_seqs=8, max_model_len=512,
                                                                     cost_table=flat_cost_table()))


@needs_tiny
def test_token_ids_are_checked_against_the_vocabulary(tiny):
    vocab = tiny.config.vocab_size
    for kwargs in (dict(stop_token_ids=[vocab]), dict(logit_bias={vocab + 3: 1.0})):
        name = next(iter(kwargs))
        with pytest.raises(ValueError, match=f"{name} token ids must be integers in \\[0, {vocab}\\)"):
            tiny.generate(["x"], SamplingParams(**kwargs))


def _settings(tiny) -> list[dict]:
    """Each setting changes AR's output on these prompts (asserted), so a processor that did nothing fails."""
    plain = tiny.generate(PROMPTS, SamplingParams(max_tokens=40, policy="ar"))
    common = np.bincount(np.concatenate([o.token_ids for o in plain])).argmax()
    return [dict(repetition_penalty=1.3), dict(frequency_penalty=0.8, presence_penalty=0.5),
            dict(presence_penalty=-1.0), dict(repetition_penalty=3.0), dict(logit_bias={int(common): -100.0}),
            dict(repetition_penalty=1.15, frequency_penalty=0.3, logit_bias={int(common): -3.0})]


@needs_tiny
def test_every_policy_equals_ar_under_the_same_adjustments(tiny):
    plain = [o.token_ids for o in tiny.generate(PROMPTS, SamplingParams(max_tokens=40, policy="ar"))]
    for setting in _settings(tiny):
        ar = [o.token_ids for o in tiny.generate(PROMPTS, SamplingParams(max_tokens=40, policy="ar", **setting))]
        assert sum(a != b for a, b in zip(ar, plain)) >= len(PROMPTS) // 2, setting
        for pol in POLICIES:
            # half the batch asks for the setting, half runs plain beside it
            params = [SamplingParams(max_tokens=40, **pol, **(setting if i % 2 == 0 else {}))
                      for i in range(len(PROMPTS))]
            outs = tiny.generate(PROMPTS, params)
            want = [ar[i] if i % 2 == 0 else plain[i] for i in range(len(PROMPTS))]
            assert [o.token_ids for o in outs] == want, (setting, pol)
            if pol["policy"] == "linearspec":
                assert max(o.metrics.mal for o in outs[::2]) > 1.5, (setting, pol)  # drafts still land


@needs_tiny
def test_sampling_with_top_k_1_is_greedy_under_every_policy(tiny):
    setting = dict(repetition_penalty=1.2, presence_penalty=0.4)
    ar = [o.token_ids for o in tiny.generate(PROMPTS, SamplingParams(max_tokens=30, policy="ar", **setting))]
    for pol in [dict(policy="ar")] + POLICIES:
        for extra in (dict(top_k=1), dict(min_p=1.0, top_p=0.9)):
            outs = tiny.generate(PROMPTS, [SamplingParams(max_tokens=30, temperature=0.9, seed=i, **pol, **setting,
                                                          **extra) for i in range(len(PROMPTS))])
            assert [o.token_ids for o in outs] == ar, (pol, extra)


@needs_tiny
def test_stop_token_ids_end_the_request_and_min_tokens_bans_them(tiny):
    prompt = PROMPTS[1]
    base = tiny.generate([prompt], SamplingParams(max_tokens=30, policy="ar"))[0].token_ids
    stop = base[4]
    first = base.index(stop)
    for pol in [dict(policy="ar")] + POLICIES:
        out = tiny.generate([prompt], SamplingParams(max_tokens=30, stop_token_ids=[stop], **pol))[0]
        assert out.token_ids == base[:first + 1] and out.finish_reason == "stop", pol
        held = tiny.generate([prompt], SamplingParams(max_tokens=30, stop_token_ids=[stop], min_tokens=12,
                                                      **pol))[0]
        assert stop not in held.token_ids[:12] and len(held.token_ids) >= 12, pol
        if pol["policy"] == "ar":
            ref = held.token_ids
        assert held.token_ids == ref, pol
