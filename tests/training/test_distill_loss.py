"""The draft adapter's loss levers (``LossConfig``): prefix-only scoring, the KL term, position weights,
and the frozen logits ``draft_logits`` hands to the KL term lined up with the tokens they predict."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from recguide_trt.model import masks as M
from recguide_trt.model.checkpoint import load_checkpoint
from recguide_trt.training import (
    Drafts,
    LossConfig,
    draft_logits,
    draft_loss,
    frozen_context,
    position_weights,
)
from tests.conftest import EMBEDDED, has_embedded


def one_hot_logits(tokens: list[list[int]], vocab: int = 5, scale: float = 4.0) -> torch.Tensor:
    return F.one_hot(torch.tensor(tokens), vocab).float() * scale


def test_prefix_only_scores_the_accepted_prefix_and_the_first_miss():
    targets = torch.tensor([[1, 2, 3, 4]])
    logits = one_hot_logits([[1, 0, 3, 4]])  # hit, miss, then hits that verification never reaches
    alive = torch.ones_like(targets, dtype=torch.bool)
    d = Drafts(logits, targets, alive, None)
    flat = torch.ones(4)
    ce = F.cross_entropy(logits[0], targets[0], reduction="none")
    assert draft_loss(d, LossConfig(prefix_only=True), flat).item() == pytest.approx(ce[:2].mean().item())
    assert draft_loss(d, LossConfig(), flat).item() == pytest.approx(ce.mean().item())
    # An all-miss row scores its first position only.
    d = Drafts(one_hot_logits([[0, 0, 0, 0]]), targets, alive, None)
    ce = F.cross_entropy(d.logits[0], targets[0], reduction="none")
    assert draft_loss(d, LossConfig(prefix_only=True), flat).item() == pytest.approx(ce[0].item())


def test_kl_term_is_zero_against_itself_and_positive_otherwise():
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 7)
    targets = logits.argmax(-1)
    alive = torch.ones(3, 4, dtype=torch.bool)
    ce_only = draft_loss(Drafts(logits, targets, alive, None))
    same = draft_loss(Drafts(logits, targets, alive, logits.clone()), LossConfig(kl_weight=1.0))
    assert same.item() == pytest.approx(ce_only.item(), abs=1e-6)
    other = draft_loss(Drafts(logits, targets, alive, torch.randn(3, 4, 7)), LossConfig(kl_weight=1.0))
    assert other.item() > ce_only.item()
    with pytest.raises(ValueError, match="teacher=True"):
        draft_loss(Drafts(logits, targets, alive, None), LossConfig(kl_weight=0.5))


def test_position_weights_and_dead_positions():
    assert position_weights(6, 1.0, 0.25).tolist() == [1.0, 0.75, 0.5, 0.25]
    logits = one_hot_logits([[0, 0], [1, 1]])
    targets = torch.tensor([[1, 1], [1, 1]])
    alive = torch.tensor([[True, True], [False, False]])  # the second row is after EOS: not scored
    loss = draft_loss(Drafts(logits, targets, alive, None), LossConfig(first_weight=1.0, last_weight=1.0))
    assert loss.item() == pytest.approx(F.cross_entropy(logits[0], targets[0]).item())


@pytest.mark.parametrize("bad", [dict(kl_weight=-1.0), dict(first_weight=float("nan")),
                                 dict(first_weight=0.0, last_weight=0.0)])
def test_bad_loss_settings_are_named(bad):
    with pytest.raises(ValueError, match=next(iter(bad)) if len(bad) == 1 else "both 0"):
        LossConfig(**bad).validate()


@pytest.mark.skipif(not has_embedded(), reason="embedded model missing")
def test_teacher_logits_line_up_with_the_tokens_they_predict():
    model = load_checkpoint(EMBEDDED, dtype="float32", load_adapter=False).model.eval()
    seq = torch.tensor([[5, 17, 230, 41, 9, 88, 301, 12]])
    with torch.no_grad():  # the model's own greedy continuation: the teacher's argmax is the target
        for _ in range(26):
            T = seq.shape[1]
            logits, _ = model(seq, torch.arange(T)[None], torch.from_numpy(M.causal(T))[None])
            seq = torch.cat([seq, logits[:, -1:].argmax(-1)], 1)
        ar, _ = model(seq, torch.arange(seq.shape[1])[None], torch.from_numpy(M.causal(seq.shape[1]))[None])
        d = draft_logits(model, seq, prompt_len=8, block=6, offset=1, teacher=True)
    starts = range(9, seq.shape[1] - 6 + 1, 6)
    assert d.teacher.shape == d.logits.shape and d.teacher.shape[0] == len(starts)
    for j, s in enumerate(starts):
        torch.testing.assert_close(d.teacher[j], ar[0, s + 1:s + 5])
    assert torch.equal(d.teacher.argmax(-1), d.targets)
    assert draft_logits(model, seq, 8, 6, 1).teacher is None
    # One frozen pass shared by several block sizes drafts exactly what a pass per block size does.
    with torch.no_grad():
        shared = frozen_context(model, seq, 8, teacher=True)
        for block, offset in ((6, 1), (4, 0)):
            alone = draft_logits(model, seq, 8, block, offset, teacher=True)
            reused = draft_logits(model, seq, 8, block, offset, teacher=True, context=shared)
            for a, b in zip(alone, reused):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
        with pytest.raises(ValueError, match="teacher=True"):
            draft_logits(model, seq, 8, 4, teacher=True, context=frozen_context(model, seq, 8))


@pytest.mark.skipif(not has_embedded(), reason="embedded model missing")
@pytest.mark.parametrize("cfg", [LossConfig(), LossConfig(prefix_only=True, kl_weight=1.0)], ids=["ce", "prefix+kl"])
def test_every_tensor_follows_the_tokens_device(cfg):
    """`recguide train-drafter --device cuda` builds its positions, masks, gates and weights where the tokens
    are. The CPU-testable neighbour of CUDA: on the meta device, a tensor left on the CPU is an error (the
    same one CUDA raises; the first GPU run of train-drafter failed on it)."""
    model = load_checkpoint(EMBEDDED, dtype="float32").model.to("meta")
    seq = torch.randint(20, 200, (1, 40)).to("meta")
    d = draft_logits(model, seq, 20, 8, teacher=cfg.kl_weight > 0)
    loss = draft_loss(d, cfg)
    assert loss.device.type == "meta" and d.logits.device.type == "meta" and loss.shape == ()
