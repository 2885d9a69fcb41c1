"""Fixtures of the serving tests: a random checkpoint that has a (tiny, byte-level BPE) tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from recguide_trt.model import save_checkpoint
from tests.conftest import random_model, tiny_config

VOCAB = 96
"""Model and tokenizer vocabulary (tiny_config's); the specials take ids 0..3."""
SPECIALS = ["<pad>", "<bos>", "<eos>", "<mask>"]
CORPUS = [
    "the quick brown fox jumps over the lazy dog. " * 4,
    "def main(argv):\n    return sum(x * 2 for x in range(10))\n",
    "Hello, world! 0123456789 ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz",
]
PROMPTS = [f"{w} {i}" for i, w in enumerate(
    ["the quick fox", "def main", "Hello, world", "lazy dog jumps", "return sum(x", "brown fox over",
     "for x in range", "the dog", "ABC xyz", "world! 42", "jumps over the", "quick brown",
     "x * 2 for", "main(argv)", "the lazy", "Hello dog", "fox fox fox", "range(10) sum"])]
"""Prompts made of characters the tokenizer knows (its alphabet is the corpus's characters)."""


def byte_level_bpe(vocab_size: int = VOCAB):
    """A tiny byte-level BPE tokenizer (tokenizers library) trained on a few lines of text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=[],
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    assert [tok.token_to_id(s) for s in SPECIALS] == [0, 1, 2, 3]
    assert tok.get_vocab_size() <= vocab_size
    return tok


def make_text_checkpoint(path: Path, seed: int = 0, max_position_embeddings: int = 512,
                         no_eos: bool = False) -> Path:
    """A random NLD checkpoint (mask 3, eos 2) with a tokenizer.json, in the real layout.

    ``no_eos``: zero the EOS row of the output head, so EOS (logit 0) practically never wins the
    argmax against 95 random logits — greedy requests then run to max_tokens.
    """
    import torch

    cfg = tiny_config(vocab_size=VOCAB, max_position_embeddings=max_position_embeddings)
    model = random_model(cfg, seed=seed)
    if no_eos:
        with torch.no_grad():
            model.diffusion_head.weight[cfg.eos_token_id] = 0.0
    save_checkpoint(model, path)
    byte_level_bpe().save(str(path / "tokenizer.json"))
    return path


@pytest.fixture(scope="session")
def text_ckpt(tmp_path_factory) -> Path:
    return make_text_checkpoint(tmp_path_factory.mktemp("text-ckpt") / "random-nld")


NEAR_TIES: list[str] = []
_REFERENCE: dict = {}
"""Divergences at a reference near-tie (DESIGN.md §2), reported at the end of the session."""


def check_lossless(got: list[int], model, prompt_ids: list[int], max_tokens: int, eos: int, what: str) -> bool:
    """``got`` must equal batch-1 AR greedy; a divergence is tolerated (and reported) only where the
    reference's top-1/top-2 margin is a near-tie. Returns True when identical."""
    from recguide_trt.runtime.reference import first_divergence, is_near_tie, reference_greedy

    key = (id(model), tuple(prompt_ids), max_tokens, eos)
    if key not in _REFERENCE:
        _REFERENCE[key] = reference_greedy(model, prompt_ids, max_tokens, eos)
    ref, margins = _REFERENCE[key]
    d = first_divergence(got, ref)
    if d is None:
        return True
    margin = margins[d] if d < len(margins) else None
    assert is_near_tie(margins, d), (f"{what}: diverges from AR greedy at token {d} (reference margin {margin}, "
                                     f"not a near-tie)\n got {got}\n ref {ref}")
    NEAR_TIES.append(f"{what}: token {d}, margin {margin:.2e}")
    return False


def pytest_sessionfinish(session):
    """Under xdist (run_tests.sh) the near-ties are found in the workers: each hands its list to the
    controller, which prints them (pytest_testnodedown, below)."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["near_ties"] = list(NEAR_TIES)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    NEAR_TIES.extend(getattr(node, "workeroutput", {}).get("near_ties", []))


def pytest_terminal_summary(terminalreporter):
    if NEAR_TIES:
        terminalreporter.write_line(f"serving tests: {len(NEAR_TIES)} divergence(s) at reference near-ties:")
        for line in NEAR_TIES:
            terminalreporter.write_line(f"  {line}")
