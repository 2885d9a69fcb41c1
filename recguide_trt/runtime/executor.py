"""Pack a step's plans into one ragged forward, run it, and turn the outputs into token decisions.

Packing: every request is one row; its tokens are laid out by kind (see :class:`Kind`), rows are
right-padded to the longest, and each row carries its own ``[T, T]`` mask, so AR steps, drafts of
different L, verifies and fused rows share one forward. The batch also says each row's real
length, so a backend that packs tokens computes no padding. Acceptance is vectorised over the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..backends.base import ForwardBatch, ForwardOutput
from ..model import masks
from ..model.draft_sampler import DraftSampler
from .logits_processors import adjust
from .logprobs import TokenLogprob, token_logprobs
from .mismatch import MismatchPrediction, predict_likely_outcome, predict_mismatch
from .plan import Kind, Work
from .request import Draft, Request
from .sampling import probs_from_logits, sample, speculative_accept


@lru_cache(maxsize=512)
def _intra(kind: Kind, n: int, shared: int = 0, draft_len: int = 0, seed_causal: bool = False) -> np.ndarray:
    if kind is Kind.DRAFT:
        return masks.draft_block(n, seed_causal)
    if kind is Kind.FUSED:
        return masks.fused_rows(n, shared, draft_len, seed_causal)
    return masks.causal(n)


@dataclass
class Decision:
    """What one row's forward means for its request."""

    emitted: list[int]
    """Tokens to emit (accepted drafts + bonus / resample), before max_tokens/EOS truncation."""
    committed: int
    """Tokens to add to the committed cache length."""
    draft: Draft | None
    """The request's pending draft after this step."""
    accepted: int = 0
    """Draft tokens accepted (VERIFY / FUSED)."""
    hit: bool | None = None
    """FUSED: whether the prospective draft became the next draft."""
    logprobs: list[TokenLogprob] | None = None
    """Of ``emitted``, one each, when the request asked for them (``SamplingParams.logprobs``)."""
    prompt_logprobs: list[TokenLogprob] | None = None
    """PREFILL: of the prompt's tokens after the first (``SamplingParams.prompt_logprobs``)."""
    would_hit: bool | None = None
    """VERIFY: whether a prospective row built from this draft's flag would have hit (same rule as
    FUSED; None when it cannot be told without running the row). Lets RecGuide keep learning the
    hit rate while it is not overlapping — otherwise one bad early estimate ends overlap for good."""


class Executor:
    def __init__(self, backend, mask_token_id: int, eos_token_id: int, tau: float, seed_causal: bool = False,
                 flag_rule: str = "likelihood", extra_eos_token_ids: tuple[int, ...] = (),
                 draft_sampler: DraftSampler | None = None):
        self.backend = backend
        self.mask = mask_token_id
        self.eos = eos_token_id
        self.eos_ids = (eos_token_id, *extra_eos_token_ids)
        """Every token that ends a request as EOS does (``min_tokens`` bans them all); the drafts' mismatch
        predictions look at the first, ``eos``."""
        self.tau = tau
        self.flag_rule = flag_rule
        """How a draft's prospective bet is chosen (:data:`~.mismatch.FLAG_RULES`)."""
        self.seed_causal = seed_causal
        """``NLDConfig.draft_seed_causal``: d1 is read from the seed's AR logits (see :meth:`_new_draft`)."""
        self.sampler = draft_sampler
        """Chooses greedy draft tokens from d2 on, each after the one before it (None: each position's top-1)."""

    def row_tokens(self, work: Work, r: Request) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray]:
        """Tokens, positions, intra mask and draft gate of one row."""
        start = r.cache_len
        if work.kind is Kind.PREFILL:  # the prompt after its cached prefix (start = 0 without one)
            n = len(r.prompt_ids) - start
            return r.prompt_ids[start:], start + np.arange(n), _intra(Kind.PREFILL, n), np.zeros(n, np.float32)
        if work.kind is Kind.AR:
            return [r.seed], np.array([start]), _intra(Kind.AR, 1), np.zeros(1, np.float32)
        if work.kind is Kind.DRAFT:
            n = work.block
            return ([r.seed] + [self.mask] * (n - 1), start + np.arange(n),
                    _intra(Kind.DRAFT, n, seed_causal=self.seed_causal), masks.draft_gate(n, self.seed_causal))
        verify = [r.seed] + r.draft.tokens
        n = len(verify)
        if work.kind is Kind.VERIFY:
            return verify, start + np.arange(n), _intra(Kind.VERIFY, n), np.zeros(n, np.float32)
        pro = work.prospective
        tokens = verify + [pro.first_token] + [self.mask] * (pro.block - 1)
        pos = np.concatenate([start + np.arange(n), start + pro.shared + np.arange(pro.block)])
        # A correction token B is a real seed; a continuation's first position is the unknown bonus.
        causal_b = self.seed_causal and pro.first_token != self.mask
        gate = np.concatenate([np.zeros(n, np.float32), masks.draft_gate(pro.block, causal_b)])
        return tokens, pos, _intra(Kind.FUSED, n, pro.shared, pro.block, causal_b), gate

    def pack(self, works: list[Work], requests: list[Request]) -> ForwardBatch:
        if all(w.kind is Kind.AR for w in works):
            return self._pack_ar(requests)
        return self._pack_rows(works, requests)

    def _pack_rows(self, works: list[Work], requests: list[Request]) -> ForwardBatch:
        rows = [self.row_tokens(w, r) for w, r in zip(works, requests)]
        B, T = len(rows), max(len(t) for t, _, _, _ in rows)
        ids = np.zeros((B, T), np.int64)
        pos = np.zeros((B, T), np.int64)
        intra = np.zeros((B, T, T), bool)
        gate = np.zeros((B, T), np.float32)
        # Padding queries see only themselves (no NaN rows); real queries never see padding keys.
        intra[:, np.arange(T), np.arange(T)] = True
        for b, (tok, p, m, g) in enumerate(rows):
            n = len(tok)
            ids[b, :n] = tok
            pos[b, :n] = p
            pos[b, n:] = p[-1]
            intra[b, :n, :n] = m
            gate[b, :n] = g
        return ForwardBatch(
            slots=np.array([r.slot for r in requests], np.int64),
            past_lens=np.array([r.cache_len for r in requests], np.int64),
            input_ids=ids, position_ids=pos, intra_mask=intra, draft_gate=gate,
            want_logits=np.array([r.wants_logits or (w.kind is Kind.PREFILL and r.wants_prompt_logits)
                                  for w, r in zip(works, requests)], bool),
            row_lens=np.array([len(tok) for tok, _, _, _ in rows], np.int64),
            last_only=all(w.kind is Kind.PREFILL and not r.wants_prompt_logits for w, r in zip(works, requests)))

    def _pack_ar(self, requests: list[Request]) -> ForwardBatch:
        """All-AR steps (every high-load step): one token per row, built without per-row arrays; the
        same batch :meth:`pack` would build (tested)."""
        B = len(requests)
        lens = np.fromiter((r.cache_len for r in requests), np.int64, B)
        return ForwardBatch(
            slots=np.fromiter((r.slot for r in requests), np.int64, B), past_lens=lens,
            input_ids=np.fromiter((r.seed for r in requests), np.int64, B)[:, None], position_ids=lens[:, None].copy(),
            intra_mask=np.ones((B, 1, 1), bool), draft_gate=np.zeros((B, 1), np.float32),
            want_logits=np.fromiter((r.wants_logits for r in requests), bool, B), row_lens=np.ones(B, np.int64))

    # -- interpreting outputs ---------------------------------------------------------------
    def decide(self, works: list[Work], requests: list[Request], out: ForwardOutput) -> list[Decision | Exception]:
        """One decision per row; an exception in one row is returned for that row only."""
        greedy_accepts = self._greedy_accept(works, requests, out)
        decisions: list[Decision | Exception] = []
        for b, (w, r) in enumerate(zip(works, requests)):
            try:
                d = self._decide_row(b, w, r, out, greedy_accepts[b])
                if d.emitted and r.params.logprobs is not None:
                    d.logprobs = self._logprobs(b, w, r, out, d.emitted)
                if w.kind is Kind.PREFILL and r.wants_prompt_logits:
                    # position i predicts prompt token cache_len + i + 1 (no cached prefix: cache_len is 0)
                    n = len(r.prompt_ids) - r.cache_len - 1
                    d.prompt_logprobs = token_logprobs(out.logits[b, :n], r.prompt_ids[r.cache_len + 1:],
                                                       r.params.prompt_logprobs, None if out.lse is None else out.lse[b, :n])
                decisions.append(d)
            except Exception as exc:  # isolate one request's failure from the batch
                decisions.append(exc)
        return decisions

    @staticmethod
    def _logprobs(b: int, w: Work, r: Request, out: ForwardOutput, emitted: list[int]) -> list[TokenLogprob]:
        """The emitted tokens' log-probabilities, each read at the row position that predicted it: a prefill's
        last prompt token, an AR step's seed, and a verify row's positions 0 … accepted (seed, then drafts)."""
        first = len(r.prompt_ids) - r.cache_len - 1 if w.kind is Kind.PREFILL else 0
        span = slice(first, first + len(emitted))
        return token_logprobs(out.logits[b, span], emitted, r.params.logprobs, None if out.lse is None else out.lse[b, span])

    def _greedy_accept(self, works: list[Work], requests: list[Request], out: ForwardOutput) -> np.ndarray:
        """Accepted draft count of every greedy VERIFY / FUSED row, vectorised (-1 elsewhere)."""
        B, T = out.argmax.shape
        drafts = np.full((B, T), -1, np.int64)
        lens = np.zeros(B, np.int64)
        for b, (w, r) in enumerate(zip(works, requests)):
            if w.kind in (Kind.VERIFY, Kind.FUSED) and r.greedy and not r.adjusts:
                k = len(r.draft.tokens)
                drafts[b, :k] = r.draft.tokens
                lens[b] = k
        match = (drafts[:, : T - 1] == out.argmax[:, : T - 1]) & (np.arange(T - 1)[None] < lens[:, None])
        accepted = np.cumprod(match, axis=1).sum(axis=1) if T > 1 else np.zeros(B, np.int64)
        return np.where(lens > 0, accepted, -1)

    def _new_draft(self, b: int, r: Request, out: ForwardOutput, start: int, block: int,
                   seed_causal: bool, emitted: list[int] = ()) -> Draft:
        """Draft tokens d1 … d(L-1) from the block whose seed sits at row position ``start``.

        With ``seed_causal`` the seed's logits are the AR prediction of the next token, so d1 is read
        there (the verifier's own choice, never rejected) and the first MASK's prediction is unused.
        """
        rows = start + np.arange(block)
        if seed_causal:
            rows[1] = start
        top_ids, top_probs = out.top_ids[b, rows], out.top_probs[b, rows]
        first = 2 if seed_causal else 1
        if r.adjusts:
            return self._new_adjusted_draft(b, r, out, rows, seed_causal, top_ids, top_probs, first, emitted)
        if r.greedy:
            tokens = [int(t) for t in top_ids[1:, 0]]
            if seed_causal:
                tokens[0] = int(out.argmax[b, start])  # the AR argmax, MASK not excluded
            if self.sampler is None or len(tokens) < 2:
                return Draft(tokens, self._flag(top_ids, top_probs, None, first))
            # d2 on, each chosen knowing the token before it; d1 stays the seed's (or MASK row's) choice.
            tokens[1:], after = self.sampler.choose_scored(tokens[0], top_ids[2:], top_probs[2:])
            # The bet weighs each position's candidates after the token drafted before it, as the sampler
            # scores them: on SmolLM2's drafts that hit more often than the draft's own probabilities
            # (scripts/eval_flag_rules.py; docs/drafter.md).
            bet_probs = np.array(top_probs, np.float64)
            bet_probs[2:] = after
            drafted = np.array([top_ids[0, 0]] + tokens)
            return Draft(tokens, self._flag(top_ids, top_probs, drafted, first, bet_probs))
        q = self._probs(r, out.logits[b, rows[1:]], exclude=self.mask)
        if seed_causal:  # d1 samples the AR distribution itself, so the p/q test always accepts it
            q[0] = self._probs(r, out.logits[b, start:start + 1])[0]
        tokens = [sample(qi, r.rng) for qi in q]
        drafted = np.array([top_ids[0, 0]] + tokens)
        return Draft(tokens, self._flag(top_ids, top_probs, drafted, first), q)

    def _new_adjusted_draft(self, b: int, r: Request, out: ForwardOutput, rows: np.ndarray, seed_causal: bool,
                            top_ids: np.ndarray, top_probs: np.ndarray, first: int, emitted: list[int]) -> Draft:
        """A draft of a request whose logits are adjusted: token by token, each drafted under the adjustment
        the verifier will apply at its position (``emitted``, a fused row's tokens of this round not yet in the
        output, and the tokens drafted before it join the history), so the penalties and the EOS ban of
        ``min_tokens`` cost no acceptance."""
        tokens: list[int] = []
        q = []
        for j, row in enumerate(rows[1:]):
            causal_d1 = seed_causal and j == 0  # read at the seed: the AR choice itself, MASK not excluded
            logits = adjust(out.logits[b, row:row + 1], r.params, r.prompt_ids, r.output_ids + list(emitted) + tokens,
                            eos=self.eos_ids)
            if not causal_d1:
                logits[:, self.mask] = -np.inf
            if r.greedy:
                tokens.append(int(logits[0].argmax()))
            else:
                q.append(self._probs(r, logits)[0])
                tokens.append(sample(q[-1], r.rng))
        drafted = None if r.greedy else np.array([top_ids[0, 0]] + tokens)
        return Draft(tokens, self._flag(top_ids, top_probs, drafted, first), None if r.greedy else np.stack(q))

    def _adjusted(self, r: Request, logits: np.ndarray, drafted: list[int] = ()) -> np.ndarray:
        """``logits`` rows adjusted for the request (row i after ``output + drafted[:i]``); a copy."""
        return adjust(logits, r.params, r.prompt_ids, r.output_ids, drafted, self.eos_ids)

    @staticmethod
    def _probs(r: Request, logits: np.ndarray, exclude: int | None = None) -> np.ndarray:
        p = r.params
        return probs_from_logits(logits, p.temperature, p.top_p, exclude=exclude, top_k=p.top_k, min_p=p.min_p)

    def _flag(self, top_ids: np.ndarray, top_probs: np.ndarray, drafted: np.ndarray | None,
              first: int, bet_probs: np.ndarray | None = None) -> MismatchPrediction:
        """The prospective bet; ``bet_probs``: the candidates' probabilities the likelihood rule weighs, where
        they differ from the draft's own (the draft sampler's); the threshold rule reads the draft's margins."""
        if self.flag_rule == "likelihood":
            return predict_likely_outcome(top_ids, top_probs if bet_probs is None else bet_probs, self.eos, drafted,
                                          first=first)
        return predict_mismatch(top_ids, top_probs, self.tau, self.eos, drafted, first=first)

    def _next_token(self, b: int, pos: int, r: Request, out: ForwardOutput) -> int:
        if r.adjusts:
            logits = self._adjusted(r, out.logits[b, pos:pos + 1])
            return int(logits[0].argmax()) if r.greedy else sample(self._probs(r, logits)[0], r.rng)
        if r.greedy:
            return int(out.argmax[b, pos])
        return sample(self._probs(r, out.logits[b, pos]), r.rng)

    def _prospective_hit(self, shared: int, first_token: int, k: int, accepted: int, nxt: int,
                         guess: int | None) -> bool | None:
        """Whether a prospective row (``shared``, ``first_token``) next to a ``k``-token draft hits.

        A correction row hits when the verifier cuts at ``shared`` and emits ``first_token``. A
        continuation row (first token MASK) needs the whole draft accepted and, unless the seed is
        causal, its own ``guess`` of the bonus token (None: not known, so neither is the answer).
        """
        if first_token != self.mask:
            return accepted == shared - 1 and nxt == first_token
        if self.seed_causal:
            return accepted == k
        return None if guess is None else accepted == k and nxt == guess

    def _decide_row(self, b: int, w: Work, r: Request, out: ForwardOutput, greedy_c: int) -> Decision:
        if w.kind is Kind.PREFILL:
            n = len(r.prompt_ids) - r.cache_len  # tokens this prefill ran
            return Decision([self._next_token(b, n - 1, r, out)], n, None)
        if w.kind is Kind.AR:
            return Decision([self._next_token(b, 0, r, out)], 1, None)
        if w.kind is Kind.DRAFT:
            return Decision([], 0, self._new_draft(b, r, out, 0, w.block, self.seed_causal))
        draft = r.draft
        k = len(draft.tokens)
        logits = self._adjusted(r, out.logits[b, : k + 1], draft.tokens) if r.adjusts else None
        if r.greedy and logits is None:
            c = int(greedy_c)
            nxt = int(out.argmax[b, c])
        elif r.greedy:  # the adjusted argmax at every position: what AR would pick after the same tokens
            choice = logits.argmax(-1)
            c = int(np.cumprod(choice[:k] == np.asarray(draft.tokens)).sum())
            nxt = int(choice[c])
        else:
            p = self._probs(r, out.logits[b, : k + 1] if logits is None else logits)
            c, nxt = speculative_accept(draft.tokens, draft.q, p, r.rng)
        emitted = draft.tokens[:c] + [nxt]
        if w.kind is Kind.VERIFY:
            # The row RecGuide would have fused with this verify (see RecGuidePolicy._prospective).
            flagged = draft.flag.position > 0
            would_hit = self._prospective_hit(draft.flag.position if flagged else k + 1,
                                              draft.flag.correction if flagged else self.mask, k, c, nxt, None)
            return Decision(emitted, 1 + c, None, accepted=c, would_hit=would_hit)
        pro = w.prospective
        continuation = pro.first_token == self.mask
        # Continuation: the row's first position (drafted under MASK) guesses the bonus token. With a
        # causal seed the block is seeded by d(L-1) (causal in the verify part), the first MASK stands
        # for the bonus the verifier computes exactly, and the next draft is read from the positions
        # after it.
        guess = int(out.top_ids[b, k + 1, 0]) if continuation else None
        hit = self._prospective_hit(pro.shared, pro.first_token, k, c, nxt, guess)
        seed_causal = False if continuation else self.seed_causal
        new_draft = self._new_draft(b, r, out, k + 1, pro.block, seed_causal, emitted) if hit else None
        if new_draft is not None:
            new_draft.prospective = True
        return Decision(emitted, 1 + c, new_draft, accepted=c, hit=hit)
