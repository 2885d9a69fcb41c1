#!/usr/bin/env python
"""Train the embedded tiny NLD checkpoint (tokenizer + tri-mode backbone + draft adapter).

Two phases, both a fixed number of steps so a run is reproducible:

1. **base**: joint objective on the Python standard library of the running interpreter, its
   test suites left out (``stdlib_split``: they are over half the tokens and so self-similar that
   the model learned to continue docstrings with doctest transcripts and loops) —
   AR cross-entropy on a clean copy of each window plus block masked-diffusion cross-entropy on a
   noisy copy (per block a random fraction of positions masked, loss reweighted by 1/rate; the
   first token of each block is the draft seed and stays clean; noisy tokens see the clean
   prefix before their block and their own block bidirectionally; clean tokens are causal).
   The seed is seen through its clean, causal copy (``draft_seed_causal``: at inference d1 is
   the seed's AR prediction, so the masks are trained from position 2 on). The corpus is split
   into top-level definitions, each followed by EOS; newlines are tokens of their own. The last
   ``--long-steps`` use ``--long-seq-len`` windows so that attention has seen the distances of
   a prompt plus its completion.
2. **distill**: the base weights are frozen and a draft-only LoRA adapter (``linear_spec_lora``,
   gated on draft-mode tokens only, so AR/verify outputs are unchanged) is trained to predict
   the model's *own* greedy AR continuations with fully masked blocks, i.e. exactly the drafting
   condition at inference (``recguide_trt.training.distill_loss``, shared with ``recguide train-drafter``).

Usage (the shipped checkpoint):
    python scripts/train_tiny.py --out recguide_trt/assets/nld-tiny
Resume after an interruption: run the same command again (state is kept in --work).
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recguide_trt.bench.workloads import stdlib_split  # noqa: E402
from recguide_trt.model import NLDConfig, NLDModel, save_checkpoint  # noqa: E402
from recguide_trt.model import masks as M  # noqa: E402
from recguide_trt.model.config import RopeConfig  # noqa: E402
from recguide_trt.training import distill_loss  # noqa: E402  (the one loss of every drafter we train)

SPECIALS = ["<pad>", "<bos>", "<eos>", "<mask>"]
PAD, BOS, EOS, MASK = 0, 1, 2, 3


def corpus_files(max_files: int | None) -> tuple[list[Path], list[Path]]:
    """Standard-library .py files without the test suites, split train/held-out (``stdlib_split``)."""
    train, held = stdlib_split()
    if max_files:
        train, held = train[:max_files], held[:max(1, max_files // 20)]
    return train, held


def read(p: Path) -> str:
    return p.read_text(encoding="utf-8", errors="replace")


def split_definitions(text: str) -> list[str]:
    """A module as documents: each top-level def/class with the statements just before it.

    Each document ends where its definition does, so the model learns to emit EOS after a
    completed function (the end of a HumanEval-style completion) instead of running on into the
    next definition. Files that do not parse stay whole.
    """
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return [text]
    lines = text.splitlines(keepends=True)
    docs, cursor = [], 0
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.end_lineno:
            docs.append("".join(lines[cursor:node.end_lineno]))
            cursor = node.end_lineno
    docs.append("".join(lines[cursor:]))
    return [d.strip("\n") + "\n" for d in docs if d.strip()]


def train_tokenizer(files: list[Path], vocab: int, out: Path) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # Newlines stand alone: merged "\n + indentation" tokens would make a prompt that ends in "\n"
    # (every HumanEval prompt) a token sequence never seen in training.
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex("\n"), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((read(p) for p in files), trainer=trainer)
    tok.save(str(out))


def encode_files(tok_path: Path, files: list[Path]) -> tuple[np.ndarray, int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_path))
    texts = [read(p) for p in files]
    docs = [d for t in texts for d in split_definitions(t)]
    ids: list[int] = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(EOS)
    return np.asarray(ids, dtype=np.int32), sum(len(t.encode("utf-8")) for t in texts)


def make_config(args: argparse.Namespace, vocab: int) -> NLDConfig:
    return NLDConfig(
        vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads, max_position_embeddings=args.max_positions, rms_norm_eps=1e-5,
        rope=RopeConfig(rope_type="default", rope_theta=10000.0, original_max_position_embeddings=args.max_positions,
                        llama_4_scaling_beta=0.0),
        mask_token_id=MASK, eos_token_id=EOS, bos_token_id=BOS, pad_token_id=PAD,
        block_size=args.default_block, model_type="nld", draft_seed_causal=True)


def sample_windows(stream: np.ndarray, n: int, length: int, rng: np.random.Generator) -> torch.Tensor:
    starts = rng.integers(0, len(stream) - length - 1, size=n)
    return torch.from_numpy(np.stack([stream[s:s + length] for s in starts]).astype(np.int64))


def joint_loss(model: NLDModel, x: torch.Tensor, block: int, rng: np.random.Generator,
               full_mask_prob: float) -> tuple[torch.Tensor, torch.Tensor]:
    """AR loss on the clean copy + reweighted masked-diffusion loss on the noisy copy.

    The seed of each block stays clean and runs causally (``draft_seed_causal``): d1 comes from its
    AR logits at inference, so the diffusion loss covers positions 2 … L-1 of each block.
    """
    B, T = x.shape
    n_blocks = math.ceil(T / block)
    rate = rng.uniform(0.1, 1.0, size=(B, n_blocks))
    rate[rng.random((B, n_blocks)) < full_mask_prob] = 1.0
    rate_tok = np.repeat(rate, block, axis=1)[:, :T]
    is_seed = (np.arange(T) % block) == 0
    is_first = (np.arange(T) % block) == 1
    masked = (rng.random((B, T)) < rate_tok) & ~is_seed[None]
    masked[:, is_first] = True  # position 1 is always a MASK at inference (d1 comes from the seed)
    masked_t = torch.from_numpy(masked)
    noisy = torch.where(masked_t, torch.full_like(x, MASK), x)
    ids = torch.cat([x, noisy], dim=1)
    pos = torch.arange(T).repeat(2).expand(B, 2 * T)
    mask = torch.from_numpy(M.block_diffusion_training(T, block, seed_causal=True)).expand(B, 2 * T, 2 * T)
    gate = torch.cat([torch.zeros(B, T), torch.ones(B, T)], dim=1)
    logits, _ = model(ids, pos, mask, draft_gate=gate)
    ar = F.cross_entropy(logits[:, :T - 1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
    ce = F.cross_entropy(logits[:, T:].reshape(-1, logits.shape[-1]), x.reshape(-1), reduction="none").view(B, T)
    scored = torch.from_numpy(masked & ~is_first[None])
    w = scored.float() / torch.from_numpy(rate_tok).float()
    diff = (ce * w).sum() / max(1.0, float((~is_seed & ~is_first).sum() * B))
    return ar, diff


@torch.no_grad()
def greedy_continue(model: NLDModel, prompts: torch.Tensor, n_new: int) -> torch.Tensor:
    """Plain AR greedy continuation with a KV cache (used for self-distillation targets)."""
    B, P = prompts.shape
    pos = torch.arange(P).expand(B, P)
    logits, kv = model(prompts, pos, torch.from_numpy(M.causal(P)).expand(B, P, P))
    tok = logits[:, -1].argmax(-1)
    out = [tok]
    past = [(k, v) for k, v in kv]
    for i in range(n_new - 1):
        n_past = P + i
        m = torch.ones(B, 1, n_past + 1, dtype=torch.bool)
        logits, kv = model(tok[:, None], torch.full((B, 1), n_past), m, past_kv=past)
        past = [(torch.cat([pk, k], 2), torch.cat([pv, v], 2)) for (pk, pv), (k, v) in zip(past, kv)]
        tok = logits[:, -1].argmax(-1)
        out.append(tok)
    return torch.stack(out, 1)


@torch.no_grad()
def evaluate(model: NLDModel, stream: np.ndarray, n_bytes_per_token: float, block: int, n_windows: int,
             length: int) -> dict[str, float]:
    rng = np.random.default_rng(1234)
    x = sample_windows(stream, n_windows, length, rng)
    ar_l, diff_l = [], []
    for i in range(0, n_windows, 16):
        xb = x[i:i + 16]
        T = xb.shape[1]
        logits, _ = model(xb, torch.arange(T).expand(len(xb), T), torch.from_numpy(M.causal(T)).expand(len(xb), T, T))
        ar_l.append(F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), xb[:, 1:].reshape(-1)).item())
        diff_l.append(distill_loss(model, xb, block, block).item())
    ar = float(np.mean(ar_l))
    return {"heldout_ar_nats_per_token": ar, "heldout_bits_per_byte": ar / math.log(2) / n_bytes_per_token,
            "heldout_draft_nats_per_token": float(np.mean(diff_l))}


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def save_state(path: Path, **state) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    ap.add_argument("--work", type=Path, default=None, help="state/resume directory (default: <out>.work)")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=704)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--max-positions", type=int, default=2048)
    ap.add_argument("--default-block", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128, help="training window of the first base steps")
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--long-seq-len", type=int, default=512,
                    help="window of the last --long-steps base steps (covers prompt + output at inference)")
    ap.add_argument("--long-batch", type=int, default=6)
    ap.add_argument("--long-steps", type=int, default=600)
    ap.add_argument("--base-steps", type=int, default=3200)
    ap.add_argument("--distill-steps", type=int, default=4000)
    ap.add_argument("--distill-prompts", type=int, default=8192)
    ap.add_argument("--distill-batch", type=int, default=8, help="sequences per distillation step")
    ap.add_argument("--distill-prompt-len", type=int, default=128)
    ap.add_argument("--distill-new", type=int, default=128)
    ap.add_argument("--lora-rank", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--distill-lr", type=float, default=2e-3)
    ap.add_argument("--blocks", type=str, default="4,8,16",
                    help="diffusion block sizes to train (>= 3: d1 comes from the causal seed)")
    ap.add_argument("--full-mask-prob", type=float, default=0.5, help="share of fully masked blocks (base)")
    ap.add_argument("--max-files", type=int, default=None, help="limit the corpus (smoke tests)")
    ap.add_argument("--eval-windows", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-autocast", dest="autocast", action="store_false",
                    help="train in fp32 (default: bf16 autocast, ~2.7x faster on CPUs with AVX512-BF16)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-every", type=int, default=200)
    args = ap.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    blocks = [int(b) for b in args.blocks.split(",")]
    if min(blocks) < 3:
        raise SystemExit(f"--blocks {args.blocks}: every block must be >= 3 (d1 comes from the causal seed, "
                         "so a block of 2 has no masked position to train)")
    work = args.work or args.out.with_name(args.out.name + ".work")
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.time()

    train_files, held_files = corpus_files(args.max_files)
    tok_path = work / "tokenizer.json"
    if not tok_path.exists():
        print(f"training tokenizer on {len(train_files)} files (vocab {args.vocab})", flush=True)
        train_tokenizer(train_files, args.vocab, tok_path)
    cache = work / "corpus.npz"
    if cache.exists():
        z = np.load(cache)
        train_ids, held_ids, held_bytes = z["train"], z["held"], int(z["held_bytes"])
    else:
        print("tokenizing corpus", flush=True)
        train_ids, _ = encode_files(tok_path, train_files)
        held_ids, held_bytes = encode_files(tok_path, held_files)
        np.savez(cache, train=train_ids, held=held_ids, held_bytes=held_bytes)
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tok_path)).get_vocab_size(with_added_tokens=True)
    bytes_per_token = held_bytes / len(held_ids)
    print(f"corpus: {len(train_ids):,} train tokens, {len(held_ids):,} held-out tokens "
          f"({bytes_per_token:.2f} bytes/token)", flush=True)

    cfg = make_config(args, vocab)
    model = NLDModel(cfg)
    model.init_weights(args.seed)
    state_path = work / "state.pt"
    state = torch.load(state_path, weights_only=False) if state_path.exists() else None
    phase, step = ("base", 0) if state is None else (state["phase"], state["step"])
    rng = np.random.default_rng(args.seed)

    if phase == "base":
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            rng.bit_generator.state = state["rng"]
        model.train()
        bar = tqdm(range(step, args.base_steps), initial=step, total=args.base_steps, desc="base", mininterval=5)
        for step in bar:
            for g in opt.param_groups:
                g["lr"] = lr_at(step, args.base_steps, args.lr, 100)
            long = step >= args.base_steps - args.long_steps
            x = sample_windows(train_ids, args.long_batch if long else args.batch,
                               args.long_seq_len if long else args.seq_len, rng)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast):
                ar, diff = joint_loss(model, x, blocks[step % len(blocks)], rng, args.full_mask_prob)
            loss = ar + diff
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            bar.set_postfix(ar=f"{ar.item():.3f}", diff=f"{diff.item():.3f}")
            if (step + 1) % args.save_every == 0:
                save_state(state_path, phase="base", step=step + 1, model=model.state_dict(),
                           opt=opt.state_dict(), rng=rng.bit_generator.state)
        # Round the base to bf16-representable values now, so the shipped (bf16-stored) weights are
        # exactly the ones whose greedy continuations the adapter is distilled towards.
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
        phase, step = "distill", 0
        save_state(state_path, phase=phase, step=0, model=model.state_dict(), opt=None, rng=rng.bit_generator.state)
        state = None

    model.eval()
    if state is not None:
        base_only = {k: v for k, v in state["model"].items() if "lora_" not in k}
        model.load_state_dict(base_only, strict=False)
    targets_path = work / "distill_targets.pt"
    if targets_path.exists():
        seqs = torch.load(targets_path)
    else:
        prng = np.random.default_rng(args.seed + 1)
        prompts = sample_windows(train_ids, args.distill_prompts, args.distill_prompt_len, prng)
        outs = []
        for i in tqdm(range(0, len(prompts), 256), desc="distill targets", mininterval=5):
            outs.append(greedy_continue(model, prompts[i:i + 256], args.distill_new))
        seqs = torch.cat([prompts, torch.cat(outs)], dim=1)
        torch.save(seqs, targets_path)

    for p in model.parameters():
        p.requires_grad_(False)
    model.attach_draft_adapter(args.lora_rank, 2.0 * args.lora_rank,
                               ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
    lora_params = [p for n, p in model.named_parameters() if "lora_" in n]
    opt = torch.optim.AdamW(lora_params, lr=args.distill_lr, betas=(0.9, 0.95), weight_decay=0.0)
    if state is not None and state.get("opt") is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        rng.bit_generator.state = state["rng"]
    for p in lora_params:
        p.requires_grad_(True)
    bar = tqdm(range(step, args.distill_steps), initial=step, total=args.distill_steps, desc="distill", mininterval=5)
    dbatch = args.distill_batch
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.distill_steps, args.distill_lr, 50)
        idx = torch.from_numpy(rng.integers(0, len(seqs), size=dbatch))
        block = blocks[step % len(blocks)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast):
            loss = distill_loss(model, seqs[idx], args.distill_prompt_len, block)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lora_params, 1.0)
        opt.step()
        bar.set_postfix(draft=f"{loss.item():.3f}")
        if (step + 1) % args.save_every == 0:
            save_state(state_path, phase="distill", step=step + 1, model=model.state_dict(), opt=opt.state_dict(),
                       rng=rng.bit_generator.state)
    save_state(state_path, phase="distill", step=args.distill_steps, model=model.state_dict(), opt=opt.state_dict(),
               rng=rng.bit_generator.state)

    model.eval()
    report = evaluate(model, held_ids, bytes_per_token, args.default_block, args.eval_windows, args.long_seq_len)
    model = model.to(torch.bfloat16)
    save_checkpoint(model, args.out, tokenizer_json=tok_path)
    n_params = sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)
    n_lora = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    report.update({"parameters": n_params, "adapter_parameters": n_lora, "train_tokens": int(len(train_ids)),
                   "base_steps": args.base_steps, "distill_steps": args.distill_steps,
                   "tokens_seen": ((args.base_steps - args.long_steps) * args.batch * args.seq_len
                                   + args.long_steps * args.long_batch * args.long_seq_len),
                   "wall_minutes_this_run": (time.time() - t_start) / 60, "torch_threads": torch.get_num_threads(),
                   "python": sys.version.split()[0]})
    (args.out / "training_report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
