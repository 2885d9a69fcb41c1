"""Two ways of asking for the same answers (none against logprobs, greedy against sampled, ...) timed against each
other: the same prompts one at a time and all at once, for each policy, the two modes alternating which goes first
from one round to the next (``scripts/bench_logprobs.py``, ``scripts/bench_sampling.py``)."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path

COUNTS = ("serial_prompts", "batch", "max_tokens", "rounds")
"""The options :func:`add_arguments` adds that must be >= 1."""


def add_arguments(ap: argparse.ArgumentParser, policies: str) -> None:
    """The options both scripts take: the model, the policies (default ``policies``), the cases, rounds, --out."""
    ap.add_argument("--model", default="smollm2-135m", help="a model name or checkpoint directory (default smollm2-135m)")
    ap.add_argument("--backend", default="native", help="LLM backend (default native)")
    ap.add_argument("--policies", default=policies, help=f"comma-separated policies (default {policies})")
    ap.add_argument("--serial-prompts", type=int, default=4, help="prompts run one at a time (default 4)")
    ap.add_argument("--batch", type=int, default=16, help="prompts run all at once (default 16)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per answer (default 64)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, each mode once per case and policy (default 2)")
    ap.add_argument("--out", type=Path, help="write table.md and results.json here")


def check_counts(ap: argparse.ArgumentParser, a: argparse.Namespace, names: tuple[str, ...] = COUNTS) -> None:
    """``ap.error`` (one line, exit 2) for a count below 1."""
    for name in names:
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")


def policy_list(text: str, script: str) -> list[str]:
    """``--policies`` as a list, or a one-line exit naming the unknown ones."""
    from ..runtime.params import POLICIES

    policies = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if bad or not policies:
        raise SystemExit(f"{script}: --policies: unknown {bad or 'none given'}; choose from {', '.join(POLICIES)}")
    return policies


def request_cases(llm, serial: int, batch: int) -> tuple[str, dict[str, list[list[list[int]]]]]:
    """The workload's name and its cases: ``serial`` prompts one at a time ("batch 1") and ``batch`` prompts at once.

    The held-out chat + code prompts when the model has a chat template, else the stdlib code prompts."""
    from .workloads import load_prompts

    workload = "chat-code" if llm.has_chat_template else "stdlib"
    prompts = load_prompts(workload, max(batch, serial), encode=llm.encode, max_prompt_tokens=320,
                           render_chat=llm.chat_prompt if llm.has_chat_template else None)
    return workload, {"batch 1": [[p] for p in prompts[:serial]], f"batch {batch}": [prompts[:batch]]}


def run_interleaved(cases: dict, policies: list[str], modes: list[str], rounds: int,
                    run: Callable[[list, str, str], tuple[float, list]],
                    check: Callable[[int, str, str, dict], None] | None = None) -> dict[tuple[str, str, str], list]:
    """Output tok/s of every (case, policy, mode), one value per round.

    ``run(groups, policy, mode)`` answers each group of prompts (one ``generate`` call per group) and returns
    (seconds, outputs); ``check(round, case, policy, {mode: outputs})`` sees each cell's outputs."""
    tok_s: dict = {}
    cell = 0
    for rnd in range(rounds):
        for case, groups in cases.items():
            for policy in policies:
                cell += 1  # each (case, policy) cell flips which mode goes first from one round to the next
                got = {}
                for mode in (modes if (rnd + cell) % 2 == 0 else modes[::-1]):
                    dt, got[mode] = run(groups, policy, mode)
                    tok_s.setdefault((case, policy, mode), []).append(sum(len(o.token_ids) for o in got[mode]) / dt)
                if check is not None:
                    check(rnd, case, policy, got)
                print(f"round {rnd}, {case}, {policy}: " + ", ".join(
                    f"{m} {tok_s[(case, policy, m)][-1]:.1f} tok/s" for m in modes), flush=True)
    return tok_s


def paired_rows(tok_s: dict, cases: dict, policies: list[str], base: str, other: str) -> list[dict]:
    """One row per (case, policy): each mode's best tok/s and its rounds, and the median over rounds of
    ``other`` / ``base`` (each round's pair ran back to back)."""
    rows = []
    for case in cases:
        for policy in policies:
            b, o = tok_s[(case, policy, base)], tok_s[(case, policy, other)]
            rows.append({"case": case, "policy": policy, f"tok_s_{base}": max(b), f"tok_s_{other}": max(o),
                         "ratio_median": statistics.median(y / x for x, y in zip(b, o)),
                         f"rounds_{base}": b, f"rounds_{other}": o})
    return rows
