"""Every relative markdown link and #anchor in README.md and docs/*.md resolves (GitHub's anchor rule)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# README.md and the top level of docs/ (docs/bench/... are generated tables, not checked here).
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
ANCHOR_TAG = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)


def outside_fences(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    out, fence = [], None
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith(("```", "~~~")):
            mark = stripped[:3]
            fence = None if fence == mark else (fence or mark)
        elif fence is None:
            out.append((n, line))
    return out


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code spans blanked."""
    return [(n, re.sub(r"`[^`]*`", lambda m: " " * len(m.group(0)), line)) for n, line in outside_fences(text)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped except - and _, spaces to -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@functools.cache
def anchors(path: Path) -> frozenset[str]:
    """The anchors of a file's headings (numbered when repeated) and its <a id=...> tags; read once a file."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in outside_fences(path.read_text()):
        out.update(ANCHOR_TAG.findall(line))
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def broken_links(path: Path) -> list[str]:
    problems = []
    for n, line in prose_lines(path.read_text()):
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):   # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT)}:{n}: ({target})"
            if not dest.exists():
                problems.append(f"{where}: no such file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    return problems


def test_slug_follows_githubs_rule():
    assert slug("Training a drafter (`recguide train-drafter`)") == "training-a-drafter-recguide-train-drafter"
    assert slug("The stand-in model `tiny` (`recguide_trt/assets/nld-tiny/`, 15 MB)") == \
        "the-stand-in-model-tiny-recguide_trtassetsnld-tiny-15-mb"
    assert slug("Compiled path: ONNX → TensorRT") == "compiled-path-onnx--tensorrt"
    assert slug("The fine-tuned adapter at C = 1") == "the-fine-tuned-adapter-at-c--1"


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(path):
    problems = broken_links(path)
    assert not problems, "\n".join(problems)
