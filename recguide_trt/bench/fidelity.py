"""Our AR greedy decoding against transformers' ``LlamaForCausalLM`` on the same weights, token for token.

The NLD checkpoint is converted to a float32 Llama directory (:func:`~.peers.convert.to_hf`); both
engines decode the same prompt token ids greedily until EOS (inclusive) or ``max_tokens``: ours in one
batch (continuous batching, ``policy="ar"``), transformers one prompt at a time (no padding). Each
prompt is identical or has a first divergence ``k``; there, the context is the prompt plus the
``k`` tokens both produced, and the margin ``logit[theirs] - logit[ours]`` of transformers' model
at that context, in float32 and in float64 (the same weights, cast), says whether the two tokens tie
to within rounding (a *near-tie*: ``|margin64| <= rel_tol * max(1, |top logit|)``) or not (a *real
mismatch*: a bug).

Prompts: half chat (short questions and instructions rendered with the model's chat template), half
code (raw prefixes of standard-library definitions, :func:`~.workloads.stdlib_snippets`).
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import subprocess
import time
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path

REL_TOL = 1e-3
"""A divergence is a near-tie when its float64 margin is within this fraction of the top logit (or of 1)."""

CHAT_QUESTIONS = (
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about autumn leaves.",
    "What is the difference between a list and a tuple in Python?",
    "Give me three tips for sleeping better.",
    "How many legs does a spider have?",
    "Translate 'Good morning, how are you?' into Spanish.",
    "What does HTTP stand for?",
    "Summarize the plot of Romeo and Juliet in one paragraph.",
    "Write a Python function that reverses a string.",
    "Why do we have seasons on Earth?",
    "Name three primary colors.",
    "What is 12 times 7?",
    "Suggest a name for a friendly robot.",
    "How do I make a cup of green tea?",
    "What is photosynthesis?",
)
"""The first chat prompts; more come from standard-library module docstrings (:data:`DOC_MODULES`)."""

DOC_MODULES = ("json", "heapq", "bisect", "textwrap", "fractions", "shlex", "difflib", "statistics", "glob",
               "fnmatch", "calendar", "colorsys", "base64", "string", "queue", "zlib", "random", "csv",
               "pprint", "tempfile", "secrets", "graphlib", "uuid", "decimal")


@dataclass
class Prompt:
    kind: str
    """``chat`` or ``code``."""
    text: str
    """What was encoded (the rendered chat template for chat prompts)."""
    ids: list[int]
    source: str = ""
    """The question (chat) or the code prefix: what the report shows (default: ``text``)."""

    def __post_init__(self):
        self.source = self.source or self.text


@dataclass
class Divergence:
    pos: int
    """Index of the first differing generated token."""
    theirs: int | None
    """transformers' token there (None: it had stopped)."""
    ours: int | None
    theirs_text: str | None = None
    ours_text: str | None = None
    margin_fp32: float | None = None
    """``logit[theirs] - logit[ours]`` of transformers' model at the shared context, float32."""
    margin_fp64: float | None = None
    """The same in float64 (positive: transformers' token is the exact argmax)."""
    top_logit_fp64: float | None = None
    top2_fp64: list[int] | None = None
    """The float64 model's two best tokens there."""
    top2_margin_fp64: float | None = None
    rel_margin: float | None = None
    """``|margin_fp64| / max(1, |top_logit_fp64|)``."""
    verdict: str = "mismatch"
    """``near-tie`` or ``mismatch``."""


@dataclass
class CloseCall:
    """A position where both engines produced the same token although its top-2 logits nearly tie."""

    prompt: int
    pos: int
    token: int
    runner_up: int | None = None
    """transformers' float32 second-best token there."""
    margin_fp32: float = 0.0
    """transformers' float32 top-2 margin (from ``generate``'s logits)."""
    margin_fp64: float | None = None
    """``logit[token] - logit[runner_up]`` of the float64 model at the same context."""
    token_text: str = ""
    runner_up_text: str = ""


@dataclass
class PromptResult:
    index: int
    kind: str
    prompt_tokens: int
    prompt_preview: str
    ours: list[int]
    theirs: list[int]
    identical: bool
    divergence: Divergence | None = None
    ours_text: str = ""
    """Our output, decoded."""
    min_margin_fp32: float | None = None
    """The smallest top-2 margin (transformers, float32) over the tokens both produced."""


@dataclass
class FidelityReport:
    results: list[PromptResult]
    max_tokens: int
    rel_tol: float
    meta: dict = field(default_factory=dict)
    close_calls: list[CloseCall] = field(default_factory=list)
    """The agreed tokens with the smallest top-2 margins, closest first."""

    @property
    def identical(self) -> int:
        return sum(r.identical for r in self.results)

    @property
    def near_ties(self) -> list[PromptResult]:
        return [r for r in self.results if r.divergence is not None and r.divergence.verdict == "near-tie"]

    @property
    def mismatches(self) -> list[PromptResult]:
        return [r for r in self.results if r.divergence is not None and r.divergence.verdict != "near-tie"]

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def summary(self) -> str:
        n = len(self.results)
        ties = self.near_ties
        margins = ", ".join(f"{r.divergence.margin_fp64:.2e}" for r in ties)
        tie_part = f"{len(ties)} near-ties" + (f" (fp64 margins {margins})" if ties else "")
        return f"{self.identical}/{n} identical; {tie_part}; {len(self.mismatches)} real mismatches"

    def closest(self) -> str:
        """One line on the closest call both engines agreed on."""
        if not self.close_calls:
            return "closest agreed calls: none measured"
        c = self.close_calls[0]
        fp64 = "" if c.margin_fp64 is None else f", {c.margin_fp64:.2e} in fp64"
        n = sum(len(r.theirs) if r.divergence is None else r.divergence.pos for r in self.results)
        return (f"closest agreed call over {n} tokens: top-2 margin {c.margin_fp32:.2e} in fp32{fp64} at prompt "
                f"{c.prompt} token {c.pos} ({c.token_text!r} over {c.runner_up_text!r})")

    def to_json(self) -> dict:
        return {"summary": self.summary(), "ok": self.ok, "identical": self.identical, "prompts": len(self.results),
                "near_ties": len(self.near_ties), "mismatches": len(self.mismatches), "max_tokens": self.max_tokens,
                "rel_tol": self.rel_tol, "closest": self.closest(), "meta": self.meta,
                "close_calls": [asdict(c) for c in self.close_calls], "results": [asdict(r) for r in self.results]}


# -- prompts -----------------------------------------------------------------------------------
def chat_questions(n: int) -> list[str]:
    """``n`` chat prompts: :data:`CHAT_QUESTIONS`, then questions about standard-library docstrings."""
    out = list(CHAT_QUESTIONS[:n])
    for name in DOC_MODULES:
        if len(out) >= n:
            break
        doc = (importlib.import_module(name).__doc__ or "").strip()
        first = " ".join(doc.split("\n\n")[0].split())
        if first:
            out.append(f"In one sentence, what is the Python module '{name}' for? Its documentation says: {first}")
    if len(out) < n:
        raise ValueError(f"only {len(out)} chat prompts are available, {n} asked for")
    return out


def build_prompts(llm, n: int, max_prompt_tokens: int = 256, snippet_chars: int = 500) -> list[Prompt]:
    """``n`` prompts, chat and code alternating (chat first): half of each, chat getting the odd one."""
    from .workloads import stdlib_snippets

    n_chat, n_code = (n + 1) // 2, n // 2
    questions = chat_questions(n_chat)
    chats = [llm.chat_prompt([{"role": "user", "content": q}]) for q in questions]
    codes = stdlib_snippets(n_code, snippet_chars) if n_code else []
    if len(codes) < n_code:
        raise ValueError(f"only {len(codes)} code prompts are available, {n_code} asked for")
    prompts = []
    for i in range(max(n_chat, n_code)):
        if i < n_chat:
            prompts.append(Prompt("chat", chats[i], llm.encode(chats[i]), source=questions[i]))
        if i < n_code:
            prompts.append(Prompt("code", codes[i], llm.encode(codes[i])[-max_prompt_tokens:]))
    return prompts


# -- the two engines ---------------------------------------------------------------------------
def load_transformers(hf_dir: Path, device: str = "cpu"):
    """transformers' float32 model of a :func:`~.peers.convert.to_hf` directory (``LlamaForCausalLM``, or
    ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` as its config names), on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).to(device).eval()


def convert(model_dir: Path, hf_dir: Path) -> Path:
    """The converted Llama directory at ``hf_dir``, written unless it already holds one."""
    from .peers.convert import to_hf

    hf_dir = Path(hf_dir)
    if (hf_dir / "config.json").is_file() and (hf_dir / "model.safetensors").is_file():
        return hf_dir
    return to_hf(Path(model_dir), hf_dir)


def run_ours(llm, prompts: list[Prompt], max_tokens: int) -> list[list[int]]:
    """Our greedy AR tokens of every prompt, all submitted at once (continuous batching)."""
    from recguide_trt import SamplingParams

    outs = llm.generate([p.ids for p in prompts], SamplingParams(max_tokens=max_tokens, policy="ar"))
    return [list(o.token_ids) for o in outs]


def run_transformers(hf_model, prompts: list[Prompt], max_tokens: int, eos: int | list[int],
                     pad: int, **generate_kwargs) -> tuple[list[list[int]], list[list[float]]]:
    """transformers' greedy tokens (``do_sample=False``), one prompt at a time, EOS included when emitted;
    and at each generated token, the top-2 margin of its (float32) logits there. ``generate_kwargs`` go to
    ``generate`` (logits processors such as ``repetition_penalty``; the margins stay those of the raw logits)."""
    import torch

    tokens, gaps = [], []
    dev = hf_model.device
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p.ids], device=dev)
            g = hf_model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                  do_sample=False, eos_token_id=eos, pad_token_id=pad, output_logits=True,
                                  return_dict_in_generate=True, **generate_kwargs)
            toks = g.sequences[0, len(p.ids):].tolist()
            ends = [i for i, t in enumerate(toks) if t in (eos if isinstance(eos, list) else [eos])]
            if ends:  # nothing after EOS (a batch of one is never padded, but be exact)
                toks = toks[:ends[0] + 1]
            top2 = torch.stack([lg[0].float() for lg in g.logits[:len(toks)]]).topk(2).values
            tokens.append(toks)
            gaps.append((top2[:, 0] - top2[:, 1]).tolist())
    return tokens, gaps


def first_divergence(ours: list[int], theirs: list[int]) -> Divergence | None:
    """Where two token sequences first differ (None when equal)."""
    if ours == theirs:
        return None
    k = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    return Divergence(pos=k, theirs=theirs[k] if k < len(theirs) else None, ours=ours[k] if k < len(ours) else None)


_FLOAT64_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Margins:
    """transformers' logits at a context, in float32 and float64 (the float64 copy made on first use,
    once per model)."""

    def __init__(self, hf_model):
        self.m32 = hf_model

    def last_logits(self, ids: list[int]):
        """The float32 and float64 logits of the token after ``ids``."""
        import copy

        import torch

        m64 = _FLOAT64_COPIES.get(self.m32)
        if m64 is None:
            m64 = _FLOAT64_COPIES[self.m32] = copy.deepcopy(self.m32).to(torch.float64).eval()
        x = torch.tensor([ids], device=self.m32.device)
        with torch.inference_mode():
            l32 = self.m32(input_ids=x, logits_to_keep=1).logits[0, -1]
            l64 = m64(input_ids=x, logits_to_keep=1).logits[0, -1]
        return l32, l64

    def fill(self, d: Divergence, context: list[int], rel_tol: float) -> None:
        """Measure ``d``'s margins at ``context`` and classify it."""
        if d.theirs is None or d.ours is None:  # one stopped (without EOS) where the other went on
            d.verdict = "mismatch"
            return
        l32, l64 = self.last_logits(context)
        top = l64.topk(2)
        d.margin_fp32 = float(l32[d.theirs] - l32[d.ours])
        d.margin_fp64 = float(l64[d.theirs] - l64[d.ours])
        d.top_logit_fp64 = float(top.values[0])
        d.top2_fp64 = [int(t) for t in top.indices]
        d.top2_margin_fp64 = float(top.values[0] - top.values[1])
        d.rel_margin = abs(d.margin_fp64) / max(1.0, abs(d.top_logit_fp64))
        d.verdict = "near-tie" if d.rel_margin <= rel_tol else "mismatch"


def compare(llm, hf_model, prompts: list[Prompt], max_tokens: int, rel_tol: float = REL_TOL,
            close_calls: int = 5) -> FidelityReport:
    """Run both engines on ``prompts``, measure every first divergence and the ``close_calls`` agreed
    tokens with the smallest top-2 margins (in float64 too)."""
    cfg = hf_model.config
    eos_ids = llm.config.eos_token_ids  # every id that ends our generation ends theirs
    eos = list(eos_ids) if len(eos_ids) > 1 else eos_ids[0]
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else eos_ids[0]
    t0 = time.perf_counter()
    ours = run_ours(llm, prompts, max_tokens)
    t1 = time.perf_counter()
    theirs, gaps = run_transformers(hf_model, prompts, max_tokens, eos, pad)
    t2 = time.perf_counter()
    margins = Margins(hf_model)
    results, agreed = [], []
    for i, (p, a, b) in enumerate(zip(prompts, ours, theirs)):
        d = first_divergence(a, b)
        same = gaps[i][:len(b) if d is None else d.pos]
        agreed += [(g, i, k) for k, g in enumerate(same)]
        if d is not None:
            margins.fill(d, p.ids + b[:d.pos], rel_tol)
            d.theirs_text = None if d.theirs is None else llm.decode([d.theirs])
            d.ours_text = None if d.ours is None else llm.decode([d.ours])
        results.append(PromptResult(index=i, kind=p.kind, prompt_tokens=len(p.ids),
                                    prompt_preview=p.source[:160], ours=a, theirs=b, identical=d is None,
                                    divergence=d, ours_text=llm.decode(a),
                                    min_margin_fp32=min(same) if same else None))
    calls = []
    for g, i, k in sorted(agreed)[:close_calls]:
        ctx, tok = prompts[i].ids + theirs[i][:k], theirs[i][k]
        l32, l64 = margins.last_logits(ctx)
        runner = int(l32.topk(2).indices[1]) if int(l32.argmax()) == tok else int(l32.argmax())
        calls.append(CloseCall(prompt=i, pos=k, token=tok, runner_up=runner, margin_fp32=g,
                               margin_fp64=float(l64[tok] - l64[runner]), token_text=llm.decode([tok]),
                               runner_up_text=llm.decode([runner])))
    timing = {"ours_s": round(t1 - t0, 2), "transformers_s": round(t2 - t1, 2),
              "margins_s": round(time.perf_counter() - t2, 2),
              "ours_tokens": sum(map(len, ours)), "transformers_tokens": sum(map(len, theirs))}
    return FidelityReport(results=results, max_tokens=max_tokens, rel_tol=rel_tol,
                          meta={"timing": timing, "transformers_class": type(hf_model).__name__},
                          close_calls=calls)


# -- the whole check ---------------------------------------------------------------------------
def machine() -> dict:
    """What the run ran on (the CPU as ``lscpu`` names it), and the versions that matter."""
    import torch
    import transformers

    from .peers.machine import cpu_flags, cpu_model

    lscpu = {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("Model name", "CPU family", "Model", "Hypervisor vendor"):
                lscpu[key.strip()] = value.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return {"cpu": cpu_model(), "lscpu": lscpu, "cpu_flags": cpu_flags(),
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def check_fidelity(model: str | Path | None = "smollm2-135m", n_prompts: int = 32, max_tokens: int = 128,
                   backend: str | None = None, hf_dir: Path | None = None, rel_tol: float = REL_TOL,
                   close_calls: int = 5, log=print, compute_dtype: str | None = None,
                   kv_cache_dtype: str | None = None, device: str = "cpu") -> FidelityReport:
    """Convert ``model``, run ``n_prompts`` prompts through our AR and transformers, compare.

    ``device``: "cpu", or "cuda" for both engines on the GPU (ours on its default CUDA backend, torch;
    transformers' float32 model moved there; TF32 stays off, torch's default for float32 matmuls).

    ``compute_dtype`` / ``kv_cache_dtype``: the native backend's bf16 options (their tokens are compared
    with transformers' float32 ones: expect mismatches beyond near-ties, which this measures).

    ``hf_dir``: where the converted Llama directory is (reused when it already holds one) or goes
    (default: a temporary directory, removed afterwards).
    """
    import tempfile

    from recguide_trt import LLM
    from recguide_trt.models import resolve_model

    t0 = time.perf_counter()
    path = resolve_model(model)
    llm = LLM(str(path), backend=backend, device=device, max_num_seqs=max(1, n_prompts),
              compute_dtype=compute_dtype, kv_cache_dtype=kv_cache_dtype)
    prompts = build_prompts(llm, n_prompts)
    log(f"model {path} on backend {llm.backend_name}; {len(prompts)} prompts x {max_tokens} tokens")
    with tempfile.TemporaryDirectory(prefix="recguide-fidelity-") as tmp:
        hf = convert(path, Path(hf_dir) if hf_dir is not None else Path(tmp) / "hf-llama")
        report = compare(llm, load_transformers(hf, device), prompts, max_tokens, rel_tol, close_calls)
    home = str(Path.home())
    shown = "~" + str(path)[len(home):] if str(path).startswith(home + os.sep) else str(path)
    report.meta.update({"model": str(model), "model_dir": shown, "backend": llm.backend_name, "device": device,
                        "compute_dtype": llm.compute_dtype, "kv_cache_dtype": llm.kv_cache_dtype,
                        "provenance": _provenance(path), "machine": machine(),
                        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                        "wall_s": round(time.perf_counter() - t0, 1)})
    return report


def _provenance(path: Path) -> dict | None:
    f = Path(path) / "provenance.json"
    if not f.is_file():
        return None
    p = json.loads(f.read_text())
    return {k: p[k] for k in ("source", "member", "dtype", "wheel_sha256") if k in p}


# -- reports -----------------------------------------------------------------------------------
def _tok(t: int | None, text: str | None) -> str:
    return "(stopped)" if t is None else f"{t} `{text!r}`"


def _excerpt(text: str, n: int = 48) -> str:
    """The first line of ``text``, at most ``n`` characters, as a Markdown table cell."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    line = line if len(line) <= n else line[:n - 3] + "..."
    return "`" + line.replace("`", "'").replace("|", "\\|") + "`" if line else "-"


def _lscpu_details(lscpu: dict) -> str:
    parts = [f"family {lscpu['CPU family']}" if "CPU family" in lscpu else "",
             f"model {lscpu['Model']}" if "Model" in lscpu else "",
             f"{lscpu['Hypervisor vendor']} guest" if "Hypervisor vendor" in lscpu else ""]
    return "lscpu: " + ", ".join(p for p in parts if p) if any(parts) else "lscpu: -"


def markdown(report: FidelityReport) -> str:
    """The report as Markdown: summary, setup, one row per prompt, then every divergence."""
    m = report.meta
    mach = m.get("machine", {})
    t = m.get("timing", {})
    lines = [
        f"# AR fidelity: our greedy decoding vs transformers' {m.get('transformers_class', 'LlamaForCausalLM')}", "",
        f"**{report.summary()}**", "", report.closest(), "",
        f"- model: `{m.get('model')}` ({m.get('model_dir')}); source: {(m.get('provenance') or {}).get('source')}",
        f"- device: {m.get('device', 'cpu')}{' (' + mach['gpu'] + ')' if m.get('device') == 'cuda' and mach.get('gpu') else ''}",
        f"- ours: backend `{m.get('backend')}` (compute `{m.get('compute_dtype', 'float32')}`, KV cache "
        f"`{m.get('kv_cache_dtype', 'float32')}`), policy `ar`, greedy, all prompts in one batch; "
        f"transformers {mach.get('transformers')}: `{m.get('transformers_class', 'LlamaForCausalLM')}` float32 on the converted "
        f"weights, "
        f"`generate(do_sample=False)` one prompt at a time",
        f"- {len(report.results)} prompts (chat: chat template; code: stdlib definition prefixes) x "
        f"{report.max_tokens} tokens at most, compared up to and including EOS",
        f"- near-tie: |fp64 margin| <= {report.rel_tol:g} x max(1, |top logit|) at the first divergence",
        f"- machine: {mach.get('cpu')} ({_lscpu_details(mach.get('lscpu', {}))}), {mach.get('cores')} cores, "
        f"torch {mach.get('torch')} ({mach.get('torch_threads')} threads), Python {mach.get('python')}",
        f"- time: ours {t.get('ours_s')} s ({t.get('ours_tokens')} tokens), transformers {t.get('transformers_s')} s "
        f"({t.get('transformers_tokens')} tokens), margins {t.get('margins_s')} s; wall {m.get('wall_s')} s; "
        f"{m.get('date')}", "",
        "| # | kind | prompt | prompt tokens | ours | transformers | result | min top-2 margin (fp32) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report.results:
        d = r.divergence
        res = "identical" if d is None else f"{d.verdict} at token {d.pos}"
        mm = "-" if r.min_margin_fp32 is None else f"{r.min_margin_fp32:.2e}"
        lines.append(f"| {r.index} | {r.kind} | {_excerpt(r.prompt_preview)} | {r.prompt_tokens} | {len(r.ours)} | "
                     f"{len(r.theirs)} | {res} | {mm} |")
    divs = [r for r in report.results if r.divergence is not None]
    if divs:
        lines += ["", "## Divergences", "",
                  "| # | pos | transformers' token | our token | margin fp32 | margin fp64 | relative | fp64 top-2 "
                  "margin | verdict |", "|---|---|---|---|---|---|---|---|---|"]
        for r in divs:
            d = r.divergence
            fmt = (lambda x: "-" if x is None else f"{x:.3e}")  # noqa: E731
            lines.append(f"| {r.index} | {d.pos} | {_tok(d.theirs, d.theirs_text)} | {_tok(d.ours, d.ours_text)} | "
                         f"{fmt(d.margin_fp32)} | {fmt(d.margin_fp64)} | {fmt(d.rel_margin)} | "
                         f"{fmt(d.top2_margin_fp64)} | {d.verdict} |")
    if report.close_calls:
        lines += ["", "## Closest agreed calls", "",
                  "Tokens both engines produced where transformers' top-2 logits were closest.", "",
                  "| # | pos | token | runner-up | margin fp32 | margin fp64 |", "|---|---|---|---|---|---|"]
        for c in report.close_calls:
            fp64 = "-" if c.margin_fp64 is None else f"{c.margin_fp64:.3e}"
            lines.append(f"| {c.prompt} | {c.pos} | {_tok(c.token, c.token_text)} | "
                         f"{_tok(c.runner_up, c.runner_up_text)} | {c.margin_fp32:.3e} | {fp64} |")
    return "\n".join(lines) + "\n"


def write_report(report: FidelityReport, out: Path) -> tuple[Path, Path]:
    """``out/fidelity.json`` and ``out/fidelity.md``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    j, md = out / "fidelity.json", out / "fidelity.md"
    j.write_text(json.dumps(report.to_json(), indent=1) + "\n")
    md.write_text(markdown(report))
    return j, md
