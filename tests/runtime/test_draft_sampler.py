"""The draft sampler: its numpy formula is the trainer's torch one, it picks among the backend's candidates
knowing the token before, it is read and refused like the rest of an adapter, and it changes drafts only:
every policy's output stays AR's."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from recguide_trt.model.checkpoint import DRAFT_SAMPLER_FILE, load_checkpoint, save_draft_sampler
from recguide_trt.model.draft_sampler import DraftSampler
from recguide_trt.runtime.engine import Engine
from recguide_trt.runtime.params import SamplingParams
from recguide_trt.runtime.policies.recguide import RecGuideConfig
from recguide_trt.training.sampler import SamplerHead
from tests.conftest import EMBEDDED, has_embedded

from .fake_backend import V, reference
from .helpers import assert_lossless, fake_engine, random_weights

D = 16


def table_rows(table: np.ndarray):
    return lambda ids: table[np.asarray(ids)]


def test_numpy_formula_is_the_trainers(monkeypatch):
    monkeypatch.setattr(DraftSampler, "CHUNK", 7)  # its per-token tables are built in pieces
    rng = np.random.default_rng(0)
    w = random_weights(rng)
    E, W = rng.standard_normal((V, D)).astype(np.float32), rng.standard_normal((V, D)).astype(np.float32)
    head = SamplerHead(D, 12, 6)
    with torch.no_grad():
        head.offset.copy_(torch.from_numpy(w.offset))
        head.up.weight.copy_(torch.from_numpy(w.up_weight))
        head.up.bias.copy_(torch.from_numpy(w.up_bias))
        head.down.weight.copy_(torch.from_numpy(w.down_weight))
        head.down.bias.copy_(torch.from_numpy(w.down_bias))
        head.repeat.copy_(torch.from_numpy(w.repeat))
    n = 40
    prev = rng.integers(0, V, n)
    offsets = rng.integers(0, 9, n)  # beyond the last offset: clamped to it in both
    cand = rng.integers(0, V, (n, 3))
    cand[:5, 1] = prev[:5]  # some candidates repeat the previous token
    logp = np.log(rng.dirichlet(np.ones(3), n)).astype(np.float32)
    got = DraftSampler(w, table_rows(E), table_rows(W), V).scores(prev, offsets, cand, logp)
    with torch.no_grad():
        want = head(torch.from_numpy(E), torch.from_numpy(W), torch.from_numpy(prev), torch.from_numpy(offsets),
                    torch.from_numpy(cand), torch.from_numpy(logp)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert head.weights().up_weight.shape == w.up_weight.shape


def test_untrained_sampler_keeps_top1_and_repeat_weight_picks_the_previous_token():
    rng = np.random.default_rng(1)
    E = rng.standard_normal((V, D)).astype(np.float32)
    zero = random_weights(rng, scale=0.0)
    top = np.array([[10, 11, 12], [20, 10, 22], [30, 31, 20]])
    probs3 = np.array([[0.5, 0.3, 0.1], [0.6, 0.2, 0.1], [0.4, 0.3, 0.2]], np.float32)
    assert DraftSampler(zero, table_rows(E), table_rows(E), V).choose(7, top, probs3) == [10, 20, 30]
    rep = random_weights(rng, scale=0.0)
    rep.repeat[:] = 50.0  # a previous token among the candidates wins
    s = DraftSampler(rep, table_rows(E), table_rows(E), V)
    assert s.choose(7, top, probs3) == [10, 10, 30]  # 10 repeats 10; row 3 has no 10
    assert s.choose(7, top, probs3[:, :2]) == [10, 10, 30]  # two scored candidates (exported graphs)
    top[2, 2] = 10
    assert s.choose(7, top, probs3) == [10, 10, 10]
    assert s.choose(7, top, probs3[:, :2]) == [10, 10, 30]  # rank 3 is not a candidate without its probability


@pytest.mark.parametrize("k", [2, 3])
def test_choose_walks_the_positions_in_order(k):
    """The batched choice is the position-by-position definition: each scored after the token chosen before it."""
    rng = np.random.default_rng(5)
    E = rng.standard_normal((V, D)).astype(np.float32)
    s = DraftSampler(random_weights(rng, scale=2.0), table_rows(E), table_rows(E), V)
    for _ in range(20):
        n = int(rng.integers(1, 15))
        top = rng.integers(4, 20, (n, 3))  # a small range: repeats and shared candidates happen
        probs = np.sort(rng.dirichlet(np.ones(3), n), -1)[:, ::-1][:, :k].astype(np.float32)
        first = prev = int(rng.integers(4, 20))
        want = []
        for i in range(n):
            sc = s.scores(np.array([prev]), np.array([2 + i]), top[i:i + 1, :k], np.log(probs[i:i + 1]))[0]
            prev = int(top[i, sc.argmax()])
            want.append(prev)
        assert s.choose(first, top, probs, first_offset=2) == want


@pytest.mark.parametrize("k", [2, 3])
def test_choose_scored_gives_each_positions_candidates_after_the_token_before(k):
    """Its probabilities are the softmax of the scores each position was chosen by (after the token chosen
    before it), times the draft mass of its k candidates; an untrained sampler gives the draft's own."""
    rng = np.random.default_rng(6)
    E = rng.standard_normal((V, D)).astype(np.float32)
    s = DraftSampler(random_weights(rng, scale=2.0), table_rows(E), table_rows(E), V)
    for _ in range(20):
        n = int(rng.integers(1, 12))
        top = rng.integers(4, 20, (n, 3))
        probs = (np.sort(rng.dirichlet(np.ones(4), n), -1)[:, ::-1][:, :k]).astype(np.float32)
        prev = int(rng.integers(4, 20))
        tokens, got = s.choose_scored(prev, top, probs, first_offset=1)
        assert tokens == s.choose(prev, top, probs, first_offset=1)
        for i in range(n):
            sc = s.scores(np.array([prev]), np.array([1 + i]), top[i:i + 1, :k], np.log(probs[i:i + 1]))[0]
            e = np.exp(sc.astype(np.float64) - sc.max())
            np.testing.assert_allclose(got[i], e / e.sum() * probs[i].sum(), rtol=1e-5, atol=1e-9)
            prev = tokens[i]
    zero = DraftSampler(random_weights(rng, scale=0.0), table_rows(E), table_rows(E), V)
    probs = np.array([[0.5, 0.3, 0.1], [0.6, 0.2, 0.1]], np.float32)[:, :k]
    np.testing.assert_allclose(zero.choose_scored(7, np.array([[10, 11, 12], [20, 21, 22]]), probs)[1], probs,
                               rtol=1e-6)


def test_the_bet_weighs_the_samplers_probabilities(monkeypatch):
    """The likelihood rule's prospective bet reads the sampler's probabilities from d2 on, the draft's before."""
    from recguide_trt.runtime import executor

    rng = np.random.default_rng(7)
    E = rng.standard_normal((V, D)).astype(np.float32)
    sampler = DraftSampler(random_weights(rng, scale=2.0), table_rows(E), table_rows(E), V)
    scored, bets = [], []
    choose_scored = sampler.choose_scored

    def record_choice(*args, **kw):
        scored.append(choose_scored(*args, **kw))
        return scored[-1]

    def record_bet(top_ids, top_probs, *args, **kw):
        bets.append(np.array(top_probs))
        return predict(top_ids, top_probs, *args, **kw)

    predict = executor.predict_likely_outcome
    monkeypatch.setattr(sampler, "choose_scored", record_choice)
    monkeypatch.setattr(executor, "predict_likely_outcome", record_bet)
    plain = fake_engine(max_num_seqs=4)
    eng = Engine(plain.backend, plain.model_config, plain.config, draft_sampler=sampler)
    req = eng.submit([5, 9, 17], SamplingParams(max_tokens=24, policy="linearspec", block_size=6))
    eng.run_until_done()
    assert_lossless([req.output_ids], [reference([5, 9, 17], 24)], what="linearspec with the sampler's bets")
    assert scored and len(bets) == len(scored)
    for (_, after), bet in zip(scored, bets):
        np.testing.assert_allclose(bet[2:], after)
        assert not np.allclose(bet[2:].sum(-1), 0)


@pytest.mark.parametrize("policy,block,overlap", [("linearspec", 8, False), ("linearspec", 4, False),
                                                   ("recguide", None, True), ("recguide", None, False)])
def test_sampler_changes_drafts_not_outputs(policy, block, overlap):
    """Fused prospective rows (RecGuide's overlap) draft through the sampler too."""
    rng = np.random.default_rng(2)
    E = rng.standard_normal((V, D)).astype(np.float32)
    sampler = DraftSampler(random_weights(rng, scale=2.0), table_rows(E), table_rows(E), V)
    prompts = [[5 + i, 9 + 2 * i, 17 + i] for i in range(16)]
    refs = [reference(p, 48) for p in prompts]
    recguide = RecGuideConfig(switch_concurrency=1000 if overlap else 0, overlap="fused")
    accepted = {}
    for name, s in (("plain", None), ("sampler", sampler)):
        plain = fake_engine(max_num_seqs=8, recguide=recguide)
        eng = Engine(plain.backend, plain.model_config, plain.config, draft_sampler=s)
        reqs = [eng.submit(p, SamplingParams(max_tokens=48, policy=policy, block_size=block)) for p in prompts]
        eng.run_until_done()
        assert all(r.error is None for r in reqs), [r.error for r in reqs if r.error][:3]
        assert_lossless([r.output_ids for r in reqs], refs, what=f"{policy} {name}")
        accepted[name] = sum(r.metrics.accepted_draft_tokens for r in reqs)
        if overlap:
            assert sum(r.metrics.forwards["fused"] for r in reqs) > 0
    assert accepted["sampler"] != accepted["plain"]  # it drafted other tokens


def test_engine_config_turns_it_off():
    rng = np.random.default_rng(3)
    E = rng.standard_normal((V, D)).astype(np.float32)
    sampler = DraftSampler(random_weights(rng), table_rows(E), table_rows(E), V)
    on, off = fake_engine(), fake_engine(draft_sampler=False)
    assert Engine(on.backend, on.model_config, on.config, draft_sampler=sampler).executor.sampler is sampler
    assert Engine(off.backend, off.model_config, off.config, draft_sampler=sampler).executor.sampler is None
    with pytest.raises(ValueError, match="draft_sampler"):
        fake_engine(draft_sampler="yes")


@pytest.mark.skipif(not has_embedded(), reason="embedded model missing")
def test_checkpoint_reads_and_refuses_a_sampler(tmp_path):
    model = tmp_path / "tiny"
    shutil.copytree(EMBEDDED, model)
    hidden = load_checkpoint(model).config.hidden_size
    assert load_checkpoint(model).draft_sampler is None
    w = random_weights(np.random.default_rng(4), hidden=hidden)
    save_draft_sampler(w, model / "linear_spec_lora")
    got = load_checkpoint(model).draft_sampler
    np.testing.assert_array_equal(got.down_weight, w.down_weight)
    assert load_checkpoint(model, load_adapter=False).draft_sampler is None
    bad = random_weights(np.random.default_rng(4), hidden=hidden + 1)
    save_draft_sampler(bad, model / "linear_spec_lora")
    with pytest.raises(ValueError, match=DRAFT_SAMPLER_FILE + ".*offset.*hidden size"):
        load_checkpoint(model)
