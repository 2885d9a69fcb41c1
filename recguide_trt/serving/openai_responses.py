"""Response bodies of ``recguide serve``: choices, usage and the per-request speculation metrics.

``metrics.speculative_decoding`` follows vLLM's per-request shape (``--per-request-spec-decode-metrics``:
``num_spec_steps``, ``num_draft_tokens``, ``num_accepted_draft_tokens``, ``draft_acceptance_rate``,
``mean_acceptance_length`` = 1 + accepted / steps, ``acceptance_histogram`` over accepted counts 0 … k,
``num_spec_tokens`` = k, the longest draft), adds acceptance per draft position and per draft length
(our block sizes vary per round), and this runtime's own fields (policy, RecGuide mode, block sizes
chosen, fused rows, prospective hits). AR rounds are not speculation steps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from itertools import accumulate

from ..runtime.logprobs import TokenLogprob
from ..runtime.metrics import RequestMetrics

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}
"""Runtime finish reason → OpenAI's (a stop string ends a request as "stop" too)."""


def _spec_summary(rounds: dict[tuple[int, int], int]) -> dict:
    """vLLM's fields from verify rounds ``{(block, accepted): count}`` of blocks >= 2."""
    steps = sum(rounds.values())
    drafted = sum((block - 1) * n for (block, _), n in rounds.items())
    accepted = sum(a * n for (_, a), n in rounds.items())
    k = max((block - 1 for block, _ in rounds), default=0)
    hist = [0] * (k + 1)
    for (_, a), n in rounds.items():
        hist[a] += n
    # Position i (1-based) is drafted in every round whose draft has >= i tokens, accepted when the
    # round accepted >= i tokens (acceptance is a prefix).
    per_pos_accepted = [sum(n for (b, a), n in rounds.items() if a >= i) for i in range(1, k + 1)]
    per_pos_drafted = [sum(n for (b, _), n in rounds.items() if b - 1 >= i) for i in range(1, k + 1)]
    return {
        "mean_acceptance_length": 1 + accepted / steps if steps else None,
        "draft_acceptance_rate": accepted / drafted if drafted else None,
        "acceptance_histogram": hist,
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_spec_tokens": k,
        "num_accepted_tokens_per_position": per_pos_accepted,
        "acceptance_rate_per_position": [a / d if d else None for a, d in zip(per_pos_accepted, per_pos_drafted)],
    }


def speculative_decoding(metrics: list[RequestMetrics], policy: str, recguide_mode: str | None) -> dict:
    """``metrics.speculative_decoding`` of one response (summed over its choices)."""
    acceptance: Counter = Counter()
    blocks: Counter = Counter()
    forwards: Counter = Counter()
    for m in metrics:
        acceptance.update(m.acceptance)
        blocks.update(m.block_sizes)
        forwards.update(m.forwards)
    spec = {key: n for key, n in acceptance.items() if key[0] > 1}
    out = _spec_summary(spec)
    out["per_draft_length"] = {
        str(block - 1): {k: v for k, v in _spec_summary({key: n for key, n in spec.items() if key[0] == block}).items()
                         if k in ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens",
                                  "draft_acceptance_rate", "mean_acceptance_length", "acceptance_rate_per_position")}
        for block in sorted({b for b, _ in spec})}
    prospective = sum(m.prospective for m in metrics)
    hits = sum(m.hits for m in metrics)
    out.update({
        "policy": policy,
        "recguide_mode": recguide_mode if policy == "recguide" else None,
        "block_sizes": {str(b): n for b, n in sorted(blocks.items())},
        "fused_rows": forwards.get("fused", 0),
        "prospective_rows": prospective,
        "prospective_hits": hits,
        "prospective_hit_rate": hits / prospective if prospective else None,
        "forwards": dict(forwards),
    })
    return out


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's ``usage``; ``prompt_tokens_details.cached_tokens``: prompt tokens the prefix cache served."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def choice(chat: bool, index: int, text: str, finish_reason: str | None, token_ids: list[int] | None,
           delta: bool = False, first: bool = False, logprobs: dict | None = None) -> dict:
    """One ``choices[i]``: a text completion's, a chat message's, or (``delta``) a stream chunk's."""
    if chat:
        body = {"content": text} if delta else {"role": "assistant", "content": text}
        if delta and first:
            body["role"] = "assistant"
        out = {"index": index, ("delta" if delta else "message"): body, "logprobs": logprobs,
               "finish_reason": finish_reason}
    else:
        out = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
    if token_ids is not None:
        out["token_ids"] = token_ids
    return out


def envelope(chat: bool, rid: str, created: int, model: str, choices: list[dict], chunk: bool = False) -> dict:
    obj = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": choices}


def logprobs_body(chat: bool, entries: list[TokenLogprob], token_text: Callable[[int], str], offset: int = 0) -> dict:
    """``choices[i].logprobs`` of ``entries`` (one per token, in order): a chat's ``{"content": [{token, logprob,
    bytes, top_logprobs}]}``, or a completion's ``{tokens, token_logprobs, top_logprobs, text_offset}`` whose
    offsets count from ``offset`` (the characters of the tokens before these, in a stream)."""
    if chat:
        def one(token_id: int, logprob: float) -> dict:
            s = token_text(token_id)
            return {"token": s, "logprob": logprob, "bytes": list(s.encode("utf-8"))}
        return {"content": [dict(one(e.token_id, e.logprob), top_logprobs=[one(t, lp) for t, lp in e.top])
                            for e in entries]}
    tokens = [token_text(e.token_id) for e in entries]
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{token_text(t): lp for t, lp in e.top} for e in entries],
            "text_offset": list(accumulate((len(t) for t in tokens[:-1]), initial=offset)) if tokens else []}


def echo_logprobs_body(prompt_ids: list[int], prompt: list[TokenLogprob], output: list[TokenLogprob],
                       token_text: Callable[[int], str]) -> dict:
    """A completion's ``logprobs`` with ``echo``: the prompt's tokens first (the first one has no log-probability:
    null, as OpenAI gives it), then the output's."""
    body = logprobs_body(False, [*prompt, *output], token_text, len(token_text(prompt_ids[0])))
    return {"tokens": [token_text(prompt_ids[0]), *body["tokens"]],
            "token_logprobs": [None, *body["token_logprobs"]], "top_logprobs": [None, *body["top_logprobs"]],
            "text_offset": [0, *body["text_offset"]]}
