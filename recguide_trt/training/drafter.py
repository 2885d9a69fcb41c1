"""``recguide train-drafter``: self-distil a gated draft adapter for a frozen imported model.

1. **Targets**: the model's own greedy continuations (our engine, AR, batched) of chat
   instructions and code prefixes from the training split of the standard library
   (``chat-code-train``; code only for a model without a chat template); the benchmark's held-out
   prompts are never trained on. A small held-out set (``chat-code``) is generated too, to follow
   the teacher-forced MAL while training.
2. **Training**: gated LoRA on the chosen projections plus a draft-only MASK embedding; the base
   model is frozen. Loss: :func:`~.distill.distill_loss`. bf16 autocast where the CPU has
   AVX512_BF16 (or on CUDA). State is saved every few minutes; running the same command again
   resumes. ``--minutes`` ends a run cleanly at a time budget.
3. **Output**: ``OUT/linear_spec_lora/`` (loadable by :func:`~..model.checkpoint.load_draft_adapter`;
   copy it into the model's directory to use it) and ``OUT/training_report.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..bench.peers.machine import cpu_flags, cpu_model
from ..model.backbone import is_adapter_key
from ..model.checkpoint import (
    ADAPTER_DIR,
    load_checkpoint,
    load_draft_adapter,
    read_adapter_config,
    save_draft_adapter,
)
from .distill import LossConfig, accepted_drafts, describe_loss, draft_logits, draft_loss, frozen_context

log = logging.getLogger("recguide_trt")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class DrafterConfig:
    """What ``recguide train-drafter`` trains, on what, and for how long."""

    model: str
    """Model name or checkpoint directory (the frozen base)."""
    out: Path
    """Where the adapter (``linear_spec_lora/``) and ``training_report.json`` are written."""
    work: Path | None = None
    """Targets and resumable state (default: ``OUT.work``)."""
    prompts: int = 2048
    """Training prompts (chat instructions and code prefixes in turn)."""
    heldout: int = 48
    """Held-out prompts whose teacher-forced MAL is printed while training."""
    max_prompt_tokens: int = 320
    """Prompts are cut to their last this many tokens."""
    new_tokens: int = 128
    """Greedy continuation length (shorter where the model ends its answer)."""
    rank: int = 16
    """LoRA rank of every adapted projection."""
    alpha: float = 32.0
    """LoRA alpha (the delta is scaled by alpha / rank)."""
    targets: tuple[str, ...] = PROJECTIONS
    """Projections that get a gated LoRA."""
    mask_embedding: bool = True
    """Train a draft-only MASK embedding too."""
    init: Path | None = None
    """Start from this adapter directory (``linear_spec_lora/``: fine-tune it) instead of a zero delta;
    its rank, alpha and projections must match ``rank``, ``alpha`` and ``targets`` (checked before targets
    are generated)."""
    loss: LossConfig = field(default_factory=LossConfig)
    """Position weights, prefix-only scoring and the KL term (:class:`~.distill.LossConfig`)."""
    blocks: tuple[int, ...] = (4, 8, 16)
    """Block sizes, in turn per step (>= 3: d1 comes from the causal seed)."""
    lr: float = 2e-3
    """AdamW learning rate (warm-up 30 steps, cosine to 10 % over ``steps``)."""
    steps: int = 3000
    """Optimizer steps."""
    seqs_per_step: int = 2
    """Sequences per optimizer step."""
    minutes: float | None = None
    """Stop cleanly (state and adapter saved) after this many minutes of training in this run."""
    save_every_s: float = 180.0
    """Seconds between saved states."""
    eval_every: int = 150
    """Steps between held-out evaluations."""
    autocast: str = "auto"
    """bf16 autocast: "auto" (where the CPU has AVX512_BF16, or on CUDA), "on" or "off"."""
    device: str = "auto"
    """"cpu", "cuda" or "auto" (CUDA where present)."""
    seed: int = 0
    """Seed of sampling order and block offsets."""

    def validate(self) -> None:
        for name in ("prompts", "heldout", "max_prompt_tokens", "new_tokens", "rank", "steps", "seqs_per_step",
                     "eval_every"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if min(self.blocks) < 3:
            raise ValueError(f"blocks {self.blocks}: every block must be >= 3 (d1 comes from the causal seed)")
        bad = sorted(set(self.targets) - set(PROJECTIONS))
        if bad:
            raise ValueError(f"targets: unknown projections {bad}; choose from {', '.join(PROJECTIONS)}")
        if self.autocast not in ("auto", "on", "off"):
            raise ValueError(f"autocast must be auto, on or off, got {self.autocast!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.init is not None:
            self._check_init()
        self.loss.validate()

    def _check_init(self) -> None:
        """Before minutes of target generation: the adapter to fine-tune has this run's shape."""
        try:  # the loader's own reading of the settings
            rank, alpha, targets = read_adapter_config(Path(self.init))
        except FileNotFoundError:
            raise ValueError(f"init: {self.init} is not an adapter directory (no adapter_config.json)") from None
        except ValueError as exc:
            raise ValueError(f"init: {exc}") from None
        if rank != self.rank or sorted(targets) != sorted(self.targets) or abs(alpha - self.alpha) > 1e-6:
            raise ValueError(f"init: {self.init} holds a rank-{rank} adapter (alpha {alpha:g}) on "
                             f"{', '.join(sorted(targets))}; this run asks for rank {self.rank} (alpha {self.alpha:g}) "
                             f"on {', '.join(sorted(self.targets))}: pass --rank, --alpha and --targets to match")


def cpu_has_bf16() -> bool:
    """AVX512_BF16 or AMX-BF16 on this CPU (bf16 autocast is 1.7-2.2x faster there, slower without)."""
    return bool({"avx512_bf16", "amx_bf16"} & set(cpu_flags()))


# -- targets -----------------------------------------------------------------------------------
def make_targets(model: str, workload: str, n: int, max_prompt_tokens: int, new_tokens: int,
                 path: Path, chunk: int = 128, device: str = "cpu") -> list[tuple[list[int], list[int]]]:
    """(prompt ids, greedy continuation ids) of ``n`` prompts of ``workload``, generated by our engine
    (AR, batched, on ``device``: its default backend there) and saved to ``path`` chunk by chunk (a rerun
    continues where it stopped)."""
    from ..api import LLM
    from ..bench.workloads import load_prompts
    from ..runtime.params import SamplingParams

    done: list[tuple[list[int], list[int]]] = torch.load(path) if path.is_file() else []
    if len(done) >= n:
        return done[:n]
    llm = LLM(model, device=device, max_num_seqs=chunk if device == "cuda" else 64)
    if not llm.has_chat_template:  # a model without a chat template (the stand-in) gets code only
        workload = "stdlib-train" if workload.endswith("-train") else "stdlib"
    prompts = load_prompts(workload, n, encode=llm.encode, max_prompt_tokens=max_prompt_tokens,
                           render_chat=llm.chat_prompt)
    if len(prompts) < n:
        log.warning("%s has %d prompts, fewer than the %d asked for", workload, len(prompts), n)
    params = SamplingParams(max_tokens=new_tokens, policy="ar")
    with tqdm(total=len(prompts), initial=len(done), desc=f"targets ({workload})", unit="seq") as bar:
        for i in range(len(done), len(prompts), chunk):
            part = prompts[i:i + chunk]
            outs = llm.generate(part, [params] * len(part))
            done += [(p, o.token_ids) for p, o in zip(part, outs)]
            tmp = path.with_suffix(".tmp")
            torch.save(done, tmp)
            tmp.replace(path)
            bar.update(len(part))
    del llm
    return done


# -- training ------------------------------------------------------------------------------------
def lr_at(step: int, total: int, peak: float, warmup: int = 30) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def _sequence(pair: tuple[list[int], list[int]]) -> tuple[torch.Tensor, int]:
    prompt, cont = pair
    return torch.tensor([prompt + cont], dtype=torch.long), len(prompt)


@torch.no_grad()
def teacher_forced_mal(model, pairs, blocks, device, autocast: bool) -> dict[int, float]:
    """Mean tokens per round (2 + accepted drafts) over every block of every held-out continuation."""
    acc: dict[int, list[torch.Tensor]] = {block: [] for block in blocks}
    for pair in pairs:
        seq, plen = _sequence(pair)
        seq = seq.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            context = frozen_context(model, seq, plen)  # one causal pass for every block size
            for block in blocks:
                if seq.shape[1] - plen < block + 1:
                    continue
                d = draft_logits(model, seq, plen, block, context=context)
                live = d.alive.all(1)  # blocks wholly before the answer's end
                acc[block].append(accepted_drafts(d.logits, d.targets)[live].float().cpu())
    return {block: 2.0 + float(torch.cat(a).mean()) if a else float("nan") for block, a in acc.items()}


def train_drafter(cfg: DrafterConfig) -> dict:
    """Targets, then training (resumable); returns the training report (also written to OUT)."""
    cfg.validate()
    from ..models import resolve_model

    model_dir = resolve_model(cfg.model)
    work = Path(cfg.work or cfg.out.with_name(cfg.out.name + ".work"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    device = torch.device("cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    train_pairs = make_targets(cfg.model, "chat-code-train", cfg.prompts, cfg.max_prompt_tokens, cfg.new_tokens,
                               work / "targets_train.pt", device=device.type)
    held_pairs = make_targets(cfg.model, "chat-code", cfg.heldout, cfg.max_prompt_tokens, cfg.new_tokens,
                              work / "targets_heldout.pt", device=device.type)
    target_s = time.time() - t0
    train_pairs = [p for p in train_pairs if len(p[1]) >= min(cfg.blocks) + 1]

    autocast = cfg.autocast == "on" or (cfg.autocast == "auto" and (device.type == "cuda" or cpu_has_bf16()))
    model = load_checkpoint(model_dir, dtype="float32", load_adapter=False).model.to(device)
    for p in model.parameters():
        p.requires_grad_(False)
    if cfg.init is not None:
        load_draft_adapter(model, Path(cfg.init), torch.float32)  # fine-tune: its shape was checked in validate()
    else:
        model.attach_draft_adapter(cfg.rank, cfg.alpha, tuple(cfg.targets))
    if cfg.mask_embedding and model.draft_mask_embedding is None:
        model.attach_draft_mask_embedding()
    params = [p for n, p in model.named_parameters() if is_adapter_key(n)]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = np.random.default_rng(cfg.seed)
    state_path = work / "state.pt"
    done, history, train_s = 0, [], 0.0  # done: optimizer steps taken
    if state_path.is_file():
        state = torch.load(state_path, weights_only=False)
        if state["config"]["rank"] != cfg.rank or tuple(state["config"]["targets"]) != tuple(cfg.targets):
            raise ValueError(f"{state_path}: saved with rank {state['config']['rank']} on "
                             f"{state['config']['targets']}; delete {work} to start over with other settings")
        model.load_state_dict(state["adapter"], strict=False)
        opt.load_state_dict(state["opt"])
        rng.bit_generator.state = state["rng"]
        done, history, train_s = state["step"], state["history"], state["train_s"]
        log.info("resuming at step %d of %d", done, cfg.steps)

    def save_state() -> None:
        adapter = {k: v for k, v in model.state_dict().items() if is_adapter_key(k)}
        tmp = state_path.with_suffix(".tmp")
        torch.save({"adapter": adapter, "opt": opt.state_dict(), "rng": rng.bit_generator.state, "step": done,
                    "history": history, "train_s": train_s, "config": _jsonable(cfg)}, tmp)
        tmp.replace(state_path)

    def evaluate() -> None:
        model.eval()
        mal = teacher_forced_mal(model, held_pairs, cfg.blocks, device, autocast)
        history.append({"step": done, "train_minutes": round(train_s / 60, 2), "seqs_seen": done * cfg.seqs_per_step,
                        **{f"tf_mal@{b}": round(v, 3) for b, v in mal.items()}})
        tqdm.write(json.dumps(history[-1]))
        model.train()

    if not history:
        evaluate()
    run_start, last_save = time.time(), time.time()
    model.train()
    bar = tqdm(range(done, cfg.steps), initial=done, total=cfg.steps, desc="train-drafter", unit="step")
    stopped_early = False
    for step in bar:
        ts = time.time()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg.steps, cfg.lr)
        block = cfg.blocks[step % len(cfg.blocks)]
        opt.zero_grad(set_to_none=True)
        losses, accepted = [], []
        for _ in range(cfg.seqs_per_step):
            seq, plen = _sequence(train_pairs[int(rng.integers(len(train_pairs)))])
            room = seq.shape[1] - plen - block
            offset = int(rng.integers(0, min(block, room) + 1)) if room > 0 else 0
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                d = draft_logits(model, seq.to(device), plen, block, offset, teacher=cfg.loss.kl_weight > 0)
                loss = draft_loss(d, cfg.loss)
            (loss / cfg.seqs_per_step).backward()
            losses.append(loss.item())
            accepted.append(accepted_drafts(d.logits.detach(), d.targets).float().mean().item())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        done = step + 1
        train_s += time.time() - ts
        bar.set_postfix(loss=f"{np.mean(losses):.3f}", L=block, tf_mal=f"{2 + np.mean(accepted):.2f}")
        if done % cfg.eval_every == 0:
            evaluate()
        if time.time() - last_save > cfg.save_every_s:
            save_state()
            last_save = time.time()
        if cfg.minutes is not None and time.time() - run_start > cfg.minutes * 60:
            stopped_early = done < cfg.steps
            break
    if history[-1]["step"] != done:
        evaluate()
    save_state()
    bar.close()
    model.eval()
    adapter_model = model.to("cpu").to(torch.bfloat16)  # stored as bf16: a few MB in the repository
    save_draft_adapter(adapter_model, cfg.out / ADAPTER_DIR)
    n_adapter = sum(p.numel() for n, p in model.named_parameters() if is_adapter_key(n))
    report = {
        "model": str(cfg.model), "model_dir": str(model_dir), "config": _jsonable(cfg),
        "train_prompts": len(train_pairs), "heldout_prompts": len(held_pairs),
        "target_tokens": int(sum(len(c) for _, c in train_pairs)), "adapter_parameters": n_adapter,
        "steps_done": done, "seqs_seen": done * cfg.seqs_per_step, "stopped_at_time_budget": stopped_early,
        "train_minutes": round(train_s / 60, 2), "target_generation_minutes_this_run": round(target_s / 60, 2),
        "autocast_bf16": autocast, "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__, "python": sys.version.split()[0], "history": history,
    }
    (cfg.out / "training_report.json").write_text(json.dumps(report, indent=1) + "\n")
    (cfg.out / "training_report.md").write_text(report_markdown(report))
    return report


def report_markdown(report: dict) -> str:
    """The training report as Markdown: what was trained on what, and the held-out curve."""
    c = report["config"]
    blocks = c["blocks"]
    lines = [f"# Draft adapter of {report['model']}", "",
             f"Gated LoRA r{c['rank']} (alpha {c['alpha']}) on {', '.join(c['targets'])}"
             + (" + a draft-only MASK embedding" if c["mask_embedding"] else "")
             + f": {report['adapter_parameters']:,} parameters. Self-distilled on the model's own greedy "
               f"continuations (≤ {c['new_tokens']} tokens) of {report['train_prompts']} training prompts "
               f"(chat instructions and code from the standard library's training split; {report['target_tokens']:,} "
               f"target tokens); blocks {', '.join(map(str, blocks))} in turn, {c['seqs_per_step']} sequences per "
               f"step, AdamW lr {c['lr']}." + _loss_words(c), "",
             f"{report['steps_done']} steps ({report['seqs_seen']} sequences) in {report['train_minutes']} min of "
             f"training on {report['cpu']} ({report['threads']} threads, bf16 autocast: {report['autocast_bf16']}, "
             f"{report['device']}{': ' + report['gpu'] if report.get('gpu') else ''}); torch {report['torch']}, "
             f"Python {report['python']}.", "",
             "Held-out teacher-forced MAL (tokens per round = 2 + leading accepted drafts, every block of "
             f"{report['heldout_prompts']} held-out continuations):", "",
             "| step | sequences seen | train min | " + " | ".join(f"MAL@{b}" for b in blocks) + " |",
             "|---:|---:|---:|" + "---:|" * len(blocks)]
    for h in report["history"]:
        lines.append(f"| {h['step']} | {h['seqs_seen']} | {h['train_minutes']} | "
                     + " | ".join(f"{h.get(f'tf_mal@{b}', float('nan')):.3f}" for b in blocks) + " |")
    return "\n".join(lines) + "\n"


def _loss_words(c: dict) -> str:
    init = f" Fine-tuned from `{c['init']}`." if c.get("init") else ""
    return " Loss: cross-entropy on the greedy tokens, position " + describe_loss(c.get("loss") or {}) + "." + init


def _jsonable(cfg: DrafterConfig) -> dict:
    d = asdict(cfg)
    d["out"], d["work"] = str(cfg.out), (str(cfg.work) if cfg.work else None)
    d["init"] = str(cfg.init) if cfg.init else None
    d["targets"], d["blocks"] = list(cfg.targets), list(cfg.blocks)
    return d


# -- command line -----------------------------------------------------------------------------------
def add_arguments(ap: argparse.ArgumentParser) -> None:
    from ..models.names import MODEL_HELP

    d = DrafterConfig(model="", out=Path("."))
    ap.add_argument("--model", default="smollm2-135m", help=MODEL_HELP)
    ap.add_argument("--out", type=Path, required=True, help="output directory (the adapter and its report)")
    ap.add_argument("--work", type=Path, default=None, help="targets and resumable state (default: OUT.work)")
    for name, help_ in (("prompts", "training prompts"), ("heldout", "held-out prompts followed while training"),
                        ("max-prompt-tokens", "prompt length cap"), ("new-tokens", "continuation length"),
                        ("rank", "LoRA rank"), ("steps", "optimizer steps"), ("seqs-per-step", "sequences per step"),
                        ("eval-every", "steps between held-out evaluations")):
        ap.add_argument(f"--{name}", type=int, default=getattr(d, name.replace("-", "_")), help=help_)
    ap.add_argument("--alpha", type=float, default=d.alpha, help="LoRA alpha")
    ap.add_argument("--lr", type=float, default=d.lr, help="peak learning rate")
    ap.add_argument("--blocks", default=",".join(map(str, d.blocks)), help="block sizes trained, in turn")
    ap.add_argument("--targets", default=",".join(d.targets), help="projections with a LoRA")
    ap.add_argument("--no-mask-embedding", dest="mask_embedding", action="store_false",
                    help="do not train a draft-only MASK embedding")
    ap.add_argument("--init", type=Path, default=None,
                    help="fine-tune this adapter directory (linear_spec_lora/) instead of starting from zero")
    dl = LossConfig()
    ap.add_argument("--first-weight", type=float, default=dl.first_weight, help="loss weight of draft position 2")
    ap.add_argument("--last-weight", type=float, default=dl.last_weight,
                    help="loss weight of draft position L-1 (linear in between)")
    ap.add_argument("--prefix-only", action="store_true",
                    help="score only the accepted prefix and the first miss (NLD's rule)")
    ap.add_argument("--kl-weight", type=float, default=dl.kl_weight,
                    help="weight of KL(frozen AR || draft) added to the cross-entropy")
    ap.add_argument("--minutes", type=float, default=None, help="stop cleanly after this many minutes (resumable)")
    ap.add_argument("--autocast", choices=("auto", "on", "off"), default="auto", help="bf16 autocast")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--seed", type=int, default=0)


def config_from_args(args: argparse.Namespace) -> DrafterConfig:
    try:
        blocks = tuple(int(b) for b in str(args.blocks).split(","))
    except ValueError:
        raise ValueError(f"--blocks must be comma-separated integers, got {args.blocks!r}") from None
    return DrafterConfig(model=args.model, out=args.out, work=args.work, prompts=args.prompts, heldout=args.heldout,
                         max_prompt_tokens=args.max_prompt_tokens, new_tokens=args.new_tokens, rank=args.rank,
                         alpha=args.alpha, targets=tuple(t.strip() for t in args.targets.split(",") if t.strip()),
                         mask_embedding=args.mask_embedding, init=args.init,
                         loss=LossConfig(first_weight=args.first_weight, last_weight=args.last_weight,
                                         prefix_only=args.prefix_only, kl_weight=args.kl_weight),
                         blocks=blocks, lr=args.lr, steps=args.steps,
                         seqs_per_step=args.seqs_per_step, minutes=args.minutes, eval_every=args.eval_every,
                         autocast=args.autocast, device=args.device, seed=args.seed)
