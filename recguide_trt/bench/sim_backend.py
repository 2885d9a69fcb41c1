"""A simulated backend and a virtual clock: what lets the real ``Engine`` run a PROJECTION.

Nothing here runs a model. Every request decodes a known token sequence — the "truth" of its
document (the prompt's token), a hash of (document, position) — so greedy output is known in
closed form and the engine's acceptance code decides everything as it does on a real model:

* AR, verify and prefill positions predict the truth of the next position (a verify row whose
  draft went wrong is cut by the executor at the first wrong token, as on a model);
* each draft block (a draft row, or the prospective part of a fused row) draws its outcome from an
  acceptance model (:mod:`.simulator`): the first ``accepted`` draft tokens are the truth, the next
  one is wrong. Its flag (the predicted cut and correction) is written into the top-2
  probabilities so that both flag rules of the executor pick exactly the drawn cut, and the
  correction token is the truth there only when the draw says so; a continuation row's guess of
  the bonus token is right when the draw says so.

Each forward advances a :class:`VirtualClock` by the cost model's price of its rows
``(past length, row length)``; the engine reads that clock for every time it records, so host work
costs no simulated time and throughput is tokens per modelled second.
"""

from __future__ import annotations

import numpy as np

from ..backends.base import ForwardBatch, ForwardOutput

MASK, EOS, FIRST_TOKEN = 3, 2, 4
"""Special ids of the simulated vocabulary; documents and truth tokens use ids >= FIRST_TOKEN."""
VOCAB = 1 << 20
"""Large enough for one prompt token per document (outputs never carry [B, T, V] arrays)."""
_SURE, _UNSURE = (0.99, 0.005), (0.495, 0.495)
"""Top-1/top-2 probabilities of a confident draft position and of the flagged one (a tie: the
likelihood rule then prefers the cut to a full accept, the threshold rule's risk is 1)."""


def truth(doc, pos):
    """Token at absolute position ``pos`` of document ``doc`` (arrays broadcast)."""
    h = (np.asarray(doc, np.int64) * 1_000_003 + np.asarray(pos, np.int64) * 7_919 + 12_345) % 1_000_033
    return FIRST_TOKEN + h % (VOCAB - FIRST_TOKEN)


def wrong(token):
    """A token that is not ``token`` (and no special id)."""
    return FIRST_TOKEN + (np.asarray(token, np.int64) - FIRST_TOKEN + 1) % (VOCAB - FIRST_TOKEN)


def document_prompt(doc: int, length: int) -> list[int]:
    """The prompt of document ``doc``: its id as a token, ``length`` times."""
    return [FIRST_TOKEN + doc] * length


def expected_output(prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy output of a prompt from :func:`document_prompt` (what every policy must emit)."""
    n = len(prompt)
    return [int(t) for t in truth(prompt[0] - FIRST_TOKEN, np.arange(n, n + max_tokens))]


class VirtualClock:
    """Simulated seconds; only the simulated backend moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class SimulatedBackend:
    """Answers packed forwards from an acceptance model and prices them with a cost model."""

    name = "simulated"
    vocab_size = VOCAB
    max_prefill_rows = None
    """Every prompt of a step in one prefill forward (as the old simulator priced them)."""
    kv_reusable = False
    """No K/V is kept: a slot's simulated request starts at its prefill (``past_lens == 0``), so the engine's
    prefix cache is off here."""

    def __init__(self, cost, acceptance, clock: VirtualClock, max_slots: int, slot_capacity: int,
                 padded: bool = True, seed: int = 0):
        self.cost, self.acceptance, self.clock = cost, acceptance, clock
        self.max_slots, self.slot_capacity = max_slots, slot_capacity
        self.padded, self.seed = padded, seed
        self._slots: dict[int, dict] = {}
        self._seen: dict[int, int] = {}
        self.forwards = 0

    def begin_cell(self) -> None:
        """Common random numbers: a document's first request of every cell draws from the same
        stream, so cells of different policies differ by their policies, not by their draws."""
        self._seen = {}

    # -- the backend interface -----------------------------------------------------------------
    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        B, T = batch.input_ids.shape
        if B and np.any(batch.want_logits):
            raise ValueError("the simulated backend serves greedy requests only (temperature 0)")
        lens = batch.row_lens if batch.row_lens is not None else np.full(B, T, np.int64)
        self.forwards += 1
        self.clock.advance(self.cost.forward_time([(int(p), int(n)) for p, n in zip(batch.past_lens, lens)],
                                                  self.padded))
        for b in range(B):
            if batch.past_lens[b] == 0:
                self._start(int(batch.slots[b]), int(batch.input_ids[b, 0]))
        docs = np.array([self._slots[int(s)]["doc"] for s in batch.slots], np.int64)[:, None]
        pos = batch.position_ids
        argmax = truth(docs, pos + 1)
        top_ids = np.stack([argmax, wrong(argmax), wrong(wrong(argmax))], axis=-1)
        top_probs = np.broadcast_to(np.array(_SURE, np.float32), (B, T, 2)).copy()
        for b in range(B):
            gated = np.nonzero(batch.draft_gate[b, : lens[b]] > 0)[0]
            if gated.size:
                self._draft_block(b, int(gated[0]), int(gated[-1]) + 1, batch, top_ids, top_probs)
        return ForwardOutput(argmax=argmax, top_ids=top_ids, top_probs=top_probs)

    def launch(self, batch: ForwardBatch, stream=None):
        return batch

    def collect(self, pending) -> ForwardOutput:
        return self.forward(pending)

    def copy_slot(self, src: int, dst: int, length: int) -> None:
        self._slots[dst] = self._slots.pop(src)

    # -- simulated requests --------------------------------------------------------------------
    def _start(self, slot: int, prompt_token: int) -> None:
        doc = prompt_token - FIRST_TOKEN
        k = self._seen.get(doc, 0)
        self._seen[doc] = k + 1
        self._slots[slot] = {"doc": doc, "state": self.acceptance.new_state(doc),
                             "rng": np.random.default_rng((self.seed, doc, k))}

    def _draft_block(self, b: int, start: int, end: int, batch: ForwardBatch, top_ids: np.ndarray,
                     top_probs: np.ndarray) -> None:
        """Draft outputs of the block at row positions [start, end): seed (or MASK) then masks.

        Draft position i of the block (absolute position p0 + i) predicts the truth at p0 + i.
        """
        sim = self._slots[int(batch.slots[b])]
        block = end - start
        out = self.acceptance.sample(sim["state"], block, sim["rng"])
        p0 = int(batch.position_ids[b, start])
        right = truth(sim["doc"], p0 + np.arange(block))
        drafted = right.copy()
        drafted[1 + out.accepted:] = wrong(right[1 + out.accepted:])
        if batch.input_ids[b, start] == MASK and not out.cont_ok:
            drafted[0] = wrong(right[0])     # a continuation row's guess of the bonus token
        alt = wrong(drafted)
        if out.cut > 0:
            i = out.cut
            if drafted[i] != right[i] and out.token_ok:
                alt[i] = right[i]
            elif alt[i] == right[i]:
                alt[i] = wrong(alt[i])
            top_probs[b, start + i] = _UNSURE
        top_ids[b, start:end, 0] = drafted
        top_ids[b, start:end, 1] = alt
        top_ids[b, start:end, 2] = wrong(alt)
