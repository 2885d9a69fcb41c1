#!/usr/bin/env python
"""How often would a prospective row hit? Each flag rule of the overlap, measured on real drafts.

For every prompt the greedy AR continuation is computed once; then greedy LinearSpec's rounds
are replayed on it: each block is drafted from its seed exactly as the runtime drafts (draft
adapter on, MASK excluded) and the verification outcome is read off the continuation: the first
draft position that differs from the AR token (and that token), or a full accept. A rule's hit rate is the share of blocks where
its bet (position and correction token, or "full accept") is that outcome — the runtime's hit
rule (``Executor._prospective_hit``). Also reports acceptance given depth (P(position k accepted
| positions < k accepted)), which the acceptance model's prior relies on.

The knobs were chosen on the training split (``--set train``, the default); the held-out sets
are what the benchmark judges and are reported for validation only.

    python scripts/eval_flag_rules.py --out docs/eval          # train split, 96 snippets
    python scripts/eval_flag_rules.py --set heldout --out /tmp/flags
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from recguide_trt import LLM, EngineConfig, SamplingParams
from recguide_trt.bench.workloads import humaneval_prompts, stdlib_snippets
from recguide_trt.model import masks
from recguide_trt.runtime.mismatch import (
    likely_outcomes,
    predict_likely_outcome,
    predict_mismatch,
    topk_reference,
)

TAUS = (0.3, 0.5, 0.7, 0.9)


@torch.no_grad()
def drafted_rounds(llm: LLM, prompt: list[int], cont: list[int], block: int, sampler=None):
    """Yield (top_ids [L, 3], top_probs [L, 3], drafted [L], sampler_probs [L, 3] or None, outcome, first) for
    each round of greedy LinearSpec.

    Greedy speculation is lossless, so the verifier's tokens are the AR continuation's: a round
    drafts from its seed, is cut at the first differing position, and the next round's seed is
    the token after the accepted ones — the rounds the runtime runs, without running the verifier.
    With ``sampler`` (the checkpoint's :class:`~recguide_trt.model.draft_sampler.DraftSampler`), d2 on
    are chosen as the runtime's executor chooses them, and ``sampler_probs`` are its candidates'
    probabilities after the tokens drafted before them (rows before d2: the draft's own).
    """
    model, cfg = llm.checkpoint.model, llm.config
    seq = prompt + cont
    T = len(seq)
    _, kv = model(torch.tensor([seq]), torch.arange(T)[None], torch.from_numpy(masks.causal(T))[None])
    intra = torch.from_numpy(masks.draft_block(block, cfg.draft_seed_causal))
    gate = torch.from_numpy(masks.draft_gate(block, cfg.draft_seed_causal))[None]
    first = 2 if cfg.draft_seed_causal else 1
    s = len(prompt)                          # the seed: the token the prefill emitted
    while s + block < T:
        ids = torch.full((1, block), cfg.mask_token_id)
        ids[0, 0] = seq[s]
        visible = torch.zeros(1, block, s + block, dtype=torch.bool)
        visible[0, :, :s] = True
        visible[0, :, s:] = intra
        past = [(k[:, :, :s], v[:, :, :s]) for k, v in kv]
        logits, _ = model(ids, torch.arange(s, s + block)[None], visible, past_kv=past, draft_gate=gate)
        top_ids, top_probs = topk_reference(logits[0].float().numpy(), cfg.mask_token_id, ranks=3)
        target = seq[s + 1:s + block]        # the AR tokens at draft positions 1 … L-1
        drafted = top_ids[:, 0].copy()
        sampler_probs = None
        if sampler is not None and first == 2 and block > 2:
            drafted[1] = target[0]           # d1: the seed's AR token
            chosen, adjusted = sampler.choose_scored(int(drafted[1]), top_ids[2:], top_probs[2:])
            drafted[2:] = chosen
            sampler_probs = top_probs.copy()
            sampler_probs[2:] = adjusted
        outcome, accepted = (-1, -1), block - 1
        for i in range(first, block):
            if drafted[i] != target[i - 1]:
                outcome, accepted = (i, target[i - 1]), i - 1
                break
        yield top_ids, top_probs, drafted, sampler_probs, outcome, first
        s += accepted + 1


def as_outcome(bet) -> tuple[int, int]:
    """A bet as :func:`drafted_rounds` writes an outcome: (position, correction), or (-1, -1) for a full accept."""
    return bet.position, bet.correction if bet.position > 0 else -1


def evaluate(llm: LLM, prompts: list[list[int]], blocks: list[int], max_tokens: int, sampler=None) -> dict:
    conts = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=max_tokens, policy="ar"))]
    eos = llm.config.eos_token_id
    out: dict = {"prompts": len(prompts)}
    for L in blocks:
        hits = {f"threshold tau={t}": 0 for t in TAUS}
        hits["likelihood"] = 0
        hits["likelihood, top 2"] = 0
        hits["likelihood, rank 3 scored"] = 0
        if sampler is not None:
            hits["likelihood, sampler's probabilities"] = 0
        bets_full = dict.fromkeys(hits, 0)
        reached = np.zeros(L)
        accepted = np.zeros(L)
        n = 0
        for prompt, cont in tqdm(list(zip(prompts, conts)), desc=f"L={L}", leave=False):
            for top_ids, top_probs, drafted, sampler_probs, outcome, first in drafted_rounds(llm, prompt, cont, L,
                                                                                             sampler):
                n += 1
                two_probs = top_probs[:, :2]  # what an exported graph returns
                bets = {f"threshold tau={t}": predict_mismatch(top_ids, two_probs, t, eos, drafted, first=first)
                        for t in TAUS}
                bets["likelihood"] = predict_likely_outcome(top_ids, two_probs, eos, drafted, first=first)
                bets["likelihood, rank 3 scored"] = predict_likely_outcome(top_ids, top_probs, eos, drafted,
                                                                           first=first)
                if sampler_probs is not None:
                    bets["likelihood, sampler's probabilities"] = predict_likely_outcome(
                        top_ids, sampler_probs, eos, drafted, first=first)
                for name, bet in bets.items():
                    hits[name] += as_outcome(bet) == outcome
                    bets_full[name] += bet.position < 0
                two = likely_outcomes(top_ids, two_probs, eos, 2, drafted, first=first)
                hits["likelihood, top 2"] += any(as_outcome(b) == outcome for b in two)
                bets_full["likelihood, top 2"] += any(b.position < 0 for b in two)
                cut = outcome[0] if outcome[0] > 0 else L
                reached[first:cut + 1 if cut < L else L] += 1
                accepted[first:cut] += 1
        out[f"L{L}"] = {
            "rounds": n,
            "hit_rate": {k: v / n for k, v in hits.items()} if n else {},
            "bets_full_accept": {k: v / n for k, v in bets_full.items()} if n else {},
            "full_accept_rate": float(accepted[L - 1] / n) if n else None,
            "acceptance_given_depth": [float(accepted[k] / reached[k]) if reached[k] else None
                                       for k in range(1, L)],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a model name or checkpoint directory (default: the default model, smollm2-135m)")
    ap.add_argument("--set", choices=("train", "heldout", "humaneval"), default="train",
                    help="prompts: training-split stdlib snippets (where knobs are chosen), held-out "
                         "stdlib snippets or HumanEval (validation only)")
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument("--blocks", default="8,16")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=Path("results/eval"))
    ap.add_argument("--no-sampler", action="store_true",
                    help="draft each position's top token, as without the checkpoint's draft sampler (by default "
                         "d2 on are chosen by it where the checkpoint has one, as the runtime does)")
    args = ap.parse_args(argv)
    blocks = [int(b) for b in args.blocks.split(",")]
    if any(b < 3 for b in blocks):
        print("error: --blocks must be >= 3 (a causal seed leaves no rejectable position below that)",
              file=sys.stderr)
        return 2
    llm = LLM(args.model, engine_config=EngineConfig(max_num_seqs=32, max_model_len=512,
                                                     max_block_size=max(16, max(blocks))))
    if args.set == "humaneval":
        texts = humaneval_prompts()[:args.prompts]
    else:
        texts = stdlib_snippets(args.prompts, 600, split=args.set)
    prompts = [llm.encode(t)[-384:] for t in texts]
    sampler = None if args.no_sampler else llm._draft_sampler()
    report = {"set": args.set, "max_tokens": args.max_tokens, "draft_sampler": sampler is not None,
              **evaluate(llm, prompts, blocks, args.max_tokens, sampler)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"flag_rules_{args.set}.json").write_text(json.dumps(report, indent=1))
    rules = list(report[f"L{blocks[0]}"]["hit_rate"])
    lines = [f"Prospective-row hit rate per flag rule ({args.set} prompts: {report['prompts']}; "
             f"`python scripts/eval_flag_rules.py --set {args.set}"
             f"{' --no-sampler' if args.no_sampler else ''}`; drafts {'chosen by the draft sampler' if sampler else 'top-1'})", "",
             "| rule | " + " | ".join(f"hit L={b}" for b in blocks) + " | "
             + " | ".join(f"bets full accept L={b}" for b in blocks) + " |",
             "|---|" + "---:|" * (2 * len(blocks))]
    for rule in rules:
        lines.append(f"| {rule} | " + " | ".join(f"{report[f'L{b}']['hit_rate'][rule]:.3f}" for b in blocks) + " | "
                     + " | ".join(f"{report[f'L{b}']['bets_full_accept'][rule]:.2f}" for b in blocks) + " |")
    lines += ["", "Acceptance given depth, P(position k accepted | positions < k accepted):", ""]
    for b in blocks:
        acc = report[f"L{b}"]["acceptance_given_depth"]
        lines.append(f"- L={b} ({report[f'L{b}']['rounds']} rounds, full accept {report[f'L{b}']['full_accept_rate']:.2f}): "
                     + ", ".join("–" if a is None else f"{a:.2f}" for a in acc))
    table = "\n".join(lines)
    (args.out / f"flag_rules_{args.set}.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
