"""What ``recguide train-drafter`` trains and how it is asked for: :class:`DrafterConfig`, the loss levers
(:class:`LossConfig`) and the command line. No torch here: ``recguide train-drafter --help``, a bad value and
``scripts/compare_drafter_runs.py`` answer without loading it; the training itself is in :mod:`.drafter`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LossConfig:
    """What the draft adapter is trained to match, and where (the levers ``recguide train-drafter`` exposes)."""

    first_weight: float = 1.0
    """Weight of draft position 2 (the first one the adapter predicts)."""
    last_weight: float = 0.5
    """Weight of draft position L-1; positions in between are interpolated linearly."""
    prefix_only: bool = False
    """NLD's rule: score only the positions greedy verification would reach — the accepted prefix and
    the first miss under the adapter's current argmax; later positions are never accepted this round."""
    kl_weight: float = 0.0
    """Weight of KL(frozen AR distribution ‖ draft distribution) at the same positions, added to the
    cross-entropy on the AR's greedy token (the soft targets carry the AR's runner-up tokens too)."""

    def validate(self) -> None:
        for name in ("first_weight", "last_weight", "kl_weight"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or v < 0 or v != v:
                raise ValueError(f"{name} must be a number >= 0, got {v!r}")
        if self.first_weight == 0 and self.last_weight == 0:
            raise ValueError("first_weight and last_weight are both 0: no draft position would be trained")


def describe_loss(loss: dict) -> str:
    """A :class:`LossConfig` as saved in a training report (``asdict``), in a few words."""
    words = [f"weights {loss.get('first_weight', 1.0):g} → {loss.get('last_weight', 0.5):g}"]
    if loss.get("prefix_only"):
        words.append("prefix + first miss only")
    if loss.get("kl_weight"):
        words.append(f"+ {loss['kl_weight']:g} × KL to the frozen AR logits")
    return ", ".join(words)


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
    """Position weights, prefix-only scoring and the KL term (:class:`LossConfig`)."""
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
    sampler_prompts: int = 1024
    """Training prompts whose drafts train the draft sampler after the adapter (the first this many of
    ``prompts``; 0: no sampler). See :mod:`recguide_trt.model.draft_sampler`."""
    sampler_block: int = 8
    """Block size the sampler's training drafts are made at (its offsets beyond it share the last one)."""
    sampler_width: int = 64
    """Width of the sampler's MLP."""
    sampler_epochs: int = 4
    """Passes over the sampler's training positions."""

    def validate(self) -> None:
        for name in ("prompts", "heldout", "max_prompt_tokens", "new_tokens", "rank", "seqs_per_step",
                     "eval_every", "sampler_block", "sampler_width", "sampler_epochs"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not isinstance(self.steps, int) or self.steps < 0 or (self.steps == 0 and self.init is None):
            raise ValueError(f"steps must be a positive integer (0 only with init: train a sampler for that "
                             f"adapter as it is), got {self.steps!r}")
        if not isinstance(self.sampler_prompts, int) or self.sampler_prompts < 0:
            raise ValueError(f"sampler_prompts must be an integer >= 0, got {self.sampler_prompts!r}")
        if self.sampler_prompts and self.sampler_block < 3:
            raise ValueError(f"sampler_block must be >= 3 (the sampler chooses d2 on), got {self.sampler_block}")
        if self.steps == 0 and not self.sampler_prompts:
            raise ValueError("steps 0 and sampler_prompts 0: nothing would be trained")
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
        from ..model.checkpoint import read_adapter_config  # the loader's own reading of the settings

        try:
            rank, alpha, targets = read_adapter_config(Path(self.init))
        except FileNotFoundError:
            raise ValueError(f"init: {self.init} is not an adapter directory (no adapter_config.json)") from None
        except ValueError as exc:
            raise ValueError(f"init: {exc}") from None
        if rank != self.rank or sorted(targets) != sorted(self.targets) or abs(alpha - self.alpha) > 1e-6:
            raise ValueError(f"init: {self.init} holds a rank-{rank} adapter (alpha {alpha:g}) on "
                             f"{', '.join(sorted(targets))}; this run asks for rank {self.rank} (alpha {self.alpha:g}) "
                             f"on {', '.join(sorted(self.targets))}: pass --rank, --alpha and --targets to match")


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
                    help="fine-tune this adapter directory (linear_spec_lora/) instead of starting from zero "
                         "(with --steps 0: keep it as it is and train its draft sampler)")
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
    ap.add_argument("--sampler-prompts", type=int, default=d.sampler_prompts,
                    help="training prompts whose drafts train the draft sampler after the adapter (0: none)")
    ap.add_argument("--sampler-block", type=int, default=d.sampler_block, help="block size of the sampler's drafts")
    ap.add_argument("--sampler-width", type=int, default=d.sampler_width, help="width of the sampler's MLP")
    ap.add_argument("--sampler-epochs", type=int, default=d.sampler_epochs, help="passes over the sampler's data")


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
                         autocast=args.autocast, device=args.device, seed=args.seed,
                         sampler_prompts=args.sampler_prompts, sampler_block=args.sampler_block,
                         sampler_width=args.sampler_width, sampler_epochs=args.sampler_epochs)
