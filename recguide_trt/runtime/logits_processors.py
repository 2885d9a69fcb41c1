"""Per-request changes to the model's next-token logits: ``min_tokens``, ``logit_bias`` and the repetition,
frequency and presence penalties (numpy).

They are functions of the tokens before a position, so speculation keeps them exactly: a verify row's
position i sees the request's output plus the draft's first i tokens, which is what an AR step at that
position would see if the draft is accepted up to there. A greedy request that has any of them is then
decided on the host from the adjusted logits, at every position, under every policy (the kernel's argmax
knows none of them), and AR itself does the same.

The order is vLLM's: the EOS ban of ``min_tokens`` and ``logit_bias`` first, then the repetition penalty
(transformers' and vLLM's rule: a seen token's positive logit divided by it, a negative one multiplied),
then the frequency and presence penalties (OpenAI's: over the output's tokens, not the prompt's).
Temperature, top-k, top-p and min-p come after, in :mod:`.sampling`. Log-probabilities stay the model's own
(``SamplingParams.logprobs``), as vLLM reports them by default.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .params import SamplingParams


def adjusts_logits(params: SamplingParams) -> bool:
    """Whether ``params`` changes any logit (else the request's rows go as they would without this module)."""
    return bool(params.min_tokens or params.logit_bias or params.repetition_penalty != 1.0
                or params.frequency_penalty or params.presence_penalty)


def stop_ids(params: SamplingParams, eos: int | Sequence[int]) -> list[int]:
    """Tokens that end the request: the model's EOS id(s) (unless ``stop_at_eos`` is off) and ``stop_token_ids``."""
    ids = ([eos] if isinstance(eos, int) else list(eos)) if params.stop_at_eos else []
    return ids + [t for t in params.stop_token_ids if t not in ids]


def adjust(logits: np.ndarray, params: SamplingParams, prompt: Sequence[int], output: Sequence[int],
           drafted: Sequence[int] = (), eos: int | Sequence[int] = -1) -> np.ndarray:
    """``logits`` ``[n, V]`` adjusted: row i predicts the token after ``output + drafted[:i]`` (a verify row's
    positions; an AR step or a prefill is one row with no ``drafted``). Returns a new float32 array.

    Only the tokens a rule names are touched (the history's, the biased, the banned): a full-vocabulary pass per
    rule cost 0.9 ms a row (ad hoc timing, Zen 3) over SmolLM2's 49k tokens, about a tenth of a batch-1 step. Each touched logit goes
    through the same float32 operations, in the same order, as the rules say."""
    out = np.array(logits, np.float32, copy=True)
    if not adjusts_logits(params):
        return out
    banned = np.asarray(stop_ids(params, eos), np.int64)
    bias_ids = np.fromiter(params.logit_bias, np.int64, len(params.logit_bias))
    bias = np.fromiter(params.logit_bias.values(), np.float32, len(params.logit_bias))
    rp, fp, pp = (np.float32(v) for v in (params.repetition_penalty, params.frequency_penalty,
                                          params.presence_penalty))
    prompt_ids = np.unique(np.asarray(prompt, np.int64)) if rp != 1 else None
    history = np.asarray(list(output) + list(drafted), np.int64)
    for i in range(out.shape[0]):
        row = out[i]
        ids, counts = np.unique(history[:len(output) + i], return_counts=True)
        if len(output) + i < params.min_tokens and banned.size:
            row[banned] = -np.inf
        if bias_ids.size:
            row[bias_ids] += bias
        if rp != 1:
            seen = np.union1d(prompt_ids, ids)
            s = row[seen]
            row[seen] = np.where(s > 0, s / rp, s * rp)
        if fp:
            row[ids] -= fp * counts.astype(np.float32)
        if pp:
            row[ids] -= pp
    return out
