"""Discrete-event PROJECTION of the closed-loop sweep at NLD-8B/14B scale.

Nothing here runs a model, and nothing here has a step loop: the simulator runs the runtime's own
``Engine`` (admission, every policy, packing, acceptance, KV bookkeeping, retirement) over a
:class:`~.sim_backend.SimulatedBackend` and a virtual clock. The backend answers each packed
forward with verification and draft outcomes drawn from an acceptance model and advances the clock
by the cost model's price of that forward; the engine reads all its times from that clock. The
sweep is the real bench's (``bench.sweep.run_sweep`` and ``bench.loop.run_cell``), so the figures
mean the same thing, and any policy the engine hosts (the peer controllers too) is projected.

Cost models (seconds per packed forward):

* ``table`` — the measured NLD-8B draft+verify round times on one B200 (DESIGN.md §3.2). A round
  is two forwards of C·L tokens (draft, verify), so per forward ``t = round / 2``; per measured C
  a line ``t = a(C) + b(C)·N`` (N = tokens in the forward) is fitted, and a, b are interpolated
  linearly in log C (held constant outside the measured range). 14B scales it by the parameter
  ratio.
* ``roofline`` — one H200: ``t = max(bytes / 4.8e12, flops / (990e12 · efficiency)) + overhead``,
  bytes = weights (2 B/param) + KV read (past + new tokens of every row, K and V, 2 B) and
  flops = 2 · params · tokens + attention (4 · layers · q_width · new · (past + new) per row).

Acceptance models:

* ``parametric`` — per request an acceptance probability ``a_r ~ Beta`` fitted so that the mean
  tokens per round (bonus included) match NLD-8B's 5.78 / 8.53 / 11.36 at block 8 / 16 / 32;
  per round the accepted count is geometric in ``a_r`` capped at L-1, so a request's history
  tells the block chooser something. The draft's predicted cut (mismatch position) equals the
  true first rejection with probability ``q_pos`` (else it is a false alarm / miss), the
  correction token is right with ``q_tok`` (0.57: DESIGN.md §3.1 rank-2 share) and a continuation
  row guesses the bonus token with ``q_cont``. A fused row hits iff the verifier cuts exactly at
  the predicted position with the predicted token (or fully accepts, for a continuation row).
* ``traces`` — per-request round sequences recorded by ``recguide bench --traces``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..model.config import NLDConfig
from ..runtime.cost_model import CostTable
from ..runtime.engine import Engine, EngineConfig
from ..runtime.params import PEER_CONTROLLERS
from ..runtime.policies.recguide import RecGuideConfig
from .sim_backend import EOS, MASK, VOCAB, SimulatedBackend, VirtualClock, document_prompt
from .sweep import FIXED_POLICIES

PROJECTION = "PROJECTION"

B200_ROUND_MS: dict[int, dict[int, float]] = {
    1: {8: 9.96, 16: 10.24, 32: 11.17},
    32: {8: 22.5, 16: 29.0, 32: 41.8},
    128: {8: 48.6, 16: 76.8, 32: 132.5},
}
"""NLD-8B draft+verify time per round (ms) on one B200, by concurrency and block (DESIGN.md §3.2)."""

NLD8B_TOKENS_PER_ROUND = {8: 5.78, 16: 8.53, 32: 11.36}
"""Published NLD-8B accepted tokens per round at block 8 / 16 / 32 (read as MAL, bonus included)."""


# -- model sizes ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    intermediate: int
    q_width: int
    n_kv: int
    head_dim: int
    vocab: int = 131072

    @property
    def params(self) -> float:
        """Matmul parameters a token passes through (layers + output head; embeddings are a lookup)."""
        kv = self.n_kv * self.head_dim
        per_layer = 2 * self.hidden * self.q_width + 2 * self.hidden * kv + 3 * self.hidden * self.intermediate
        return float(self.layers * per_layer + self.vocab * self.hidden)

    @property
    def kv_bytes_per_token(self) -> float:
        return float(self.layers * 2 * self.n_kv * self.head_dim * 2)


MODELS = {
    "nld-8b": ModelSpec("nld-8b", 34, 4096, 14336, 4096, 8, 128),
    # 14B: 40 layers, H 5120 (DESIGN.md §1); I = 16384 and 32 query heads are assumptions.
    "nld-14b": ModelSpec("nld-14b", 40, 5120, 16384, 4096, 8, 128),
}


# -- cost models ----------------------------------------------------------------------------------
class TableCost:
    """Per-forward cost fitted to the B200 draft+verify table (see module docstring)."""

    name = "table"

    def __init__(self, round_ms: dict[int, dict[int, float]] | None = None, scale: float = 1.0):
        round_ms = round_ms or B200_ROUND_MS
        self.scale = scale
        self.cs = np.array(sorted(round_ms), dtype=np.float64)
        self.a, self.b, self.n_max = [], [], []
        for c in self.cs:
            blocks = sorted(round_ms[int(c)])
            n = np.array([c * L for L in blocks], dtype=np.float64)
            t = np.array([round_ms[int(c)][L] / 2e3 for L in blocks])
            b, a = np.polyfit(n, t, 1)
            self.a.append(a)
            self.b.append(b)
            self.n_max.append(n.max())
        self.a, self.b, self.n_max = np.array(self.a), np.array(self.b), np.array(self.n_max)
        self.b_min = float(self.b.min())

    def coefficients(self, rows: int) -> tuple[float, float]:
        x = np.log(max(rows, 1))
        lc = np.log(self.cs)
        return float(np.interp(x, lc, self.a)), float(np.interp(x, lc, self.b))

    def forward_time(self, rows: list[tuple[int, int]], padded: bool = True) -> float:
        if not rows:
            return 0.0
        n = len(rows) * max(t for _, t in rows) if padded else sum(t for _, t in rows)
        a, b = self.coefficients(len(rows))
        # Past the largest measured forward of this C (32 tokens per row) price tokens at the flattest
        # measured slope (the compute-bound rate): long prefills are not memory/overhead bound.
        n_max = 32.0 * len(rows)
        return self.scale * (a + b * min(n, n_max) + self.b_min * max(0.0, n - n_max))

    def describe(self) -> str:
        parts = [f"C={int(c)}: {1e3 * a:.2f} ms + {1e6 * b:.2f} us/token" for c, a, b in zip(self.cs, self.a, self.b)]
        return ("B200 NLD-8B table: per forward t(C, N) = a(C) + b(C)·N fitted to round/2 ("
                + "; ".join(parts) + f"), interpolated in log C; tokens beyond 32 per row at "
                f"{1e6 * self.b_min:.2f} us/token; scale {self.scale:.2f}")


class RooflineCost:
    """One H200: max(bytes / bandwidth, flops / (peak · efficiency)) + overhead."""

    name = "roofline"

    def __init__(self, spec: ModelSpec, bandwidth: float = 4.8e12, peak_flops: float = 990e12,
                 efficiency: float = 1.0, overhead_s: float = 1.0e-3, bytes_per_param: float = 2.0):
        self.spec, self.bw, self.peak, self.eff = spec, bandwidth, peak_flops, efficiency
        self.overhead, self.bpp = overhead_s, bytes_per_param

    def forward_time(self, rows: list[tuple[int, int]], padded: bool = True) -> float:
        if not rows:
            return 0.0
        s = self.spec
        T = max(t for _, t in rows)
        news = [T if padded else t for _, t in rows]
        tokens = sum(news)
        kv = sum((p + n) for (p, _), n in zip(rows, news)) * s.kv_bytes_per_token
        byts = s.params * self.bpp + kv
        attn = sum(4 * s.layers * s.q_width * n * (p + n) for (p, _), n in zip(rows, news))
        flops = 2 * s.params * tokens + attn
        return max(byts / self.bw, flops / (self.peak * self.eff)) + self.overhead

    def describe(self) -> str:
        return (f"H200 roofline for {self.spec.name} ({self.spec.params / 1e9:.2f}B matmul params): "
                f"time = max(bytes / {self.bw:.3g}, flops / ({self.peak:.3g} x {self.eff:g})) + {1e3 * self.overhead:g} ms;"
                f" bytes = {self.bpp:g} B/param x params + KV read ({self.spec.kv_bytes_per_token / 1e3:.0f} kB/token"
                f" of context per row); flops = 2 x params x tokens + 4 x layers x q_width x new x (past + new)")


def cost_table_from(cost, context: int, batches=(1, 2, 4, 8, 16, 32, 64, 128, 256),
                    tokens=(1, 2, 4, 8, 16, 32, 64), padded: bool = True) -> CostTable:
    """The runtime's CostTable evaluated from a cost model at a representative context length."""
    seconds = [[cost.forward_time([(context, t)] * b, padded) for t in tokens] for b in batches]
    return CostTable(list(batches), list(tokens), seconds, {"source": cost.name, "projection": True,
                                                            "past_len": context})


# -- acceptance models ----------------------------------------------------------------------------
@dataclass
class Outcome:
    accepted: int
    """Draft tokens the verifier will accept (0 … L-1)."""
    cut: int
    """Predicted first mismatch position (draft flag), -1 for none."""
    token_ok: bool
    """The correction token at the cut is the verifier's."""
    cont_ok: bool
    """After a full accept, a continuation row guessed the bonus token."""


def _tokens_per_round(a: np.ndarray, L: int) -> np.ndarray:
    return (1 - a ** L) / (1 - a)


@lru_cache(maxsize=16)
def fit_beta(targets: tuple[tuple[int, float], ...]) -> tuple[float, float]:
    """(mean, concentration) of a Beta over per-request acceptance matching mean tokens per round."""
    grid = (np.arange(2000) + 0.5) / 2000

    def loss(mu: float, kappa: float) -> float:
        al, be = mu * kappa, (1 - mu) * kappa
        logpdf = (al - 1) * np.log(grid) + (be - 1) * np.log1p(-grid)
        w = np.exp(logpdf - logpdf.max())
        w /= w.sum()
        return sum((float((w * _tokens_per_round(grid, L)).sum()) - t) ** 2 for L, t in targets)

    best = (np.inf, 0.9, 20.0)
    mus, kappas = np.linspace(0.5, 0.99, 50), np.exp(np.linspace(0, np.log(500), 40))
    for _ in range(3):  # coarse-to-fine grid search
        for mu in mus:
            for k in kappas:
                e = loss(mu, k)
                if e < best[0]:
                    best = (e, float(mu), float(k))
        dm, dk = (mus[1] - mus[0]), np.log(kappas[1] / kappas[0])
        mus = np.clip(np.linspace(best[1] - dm, best[1] + dm, 21), 0.01, 0.999)
        kappas = np.exp(np.linspace(np.log(best[2]) - dk, np.log(best[2]) + dk, 21))
    return best[1], best[2]


class ParametricAcceptance:
    name = "parametric"

    def __init__(self, targets: dict[int, float] | None = None, q_pos: float = 0.5, q_tok: float = 0.57,
                 q_cont: float = 0.5, seed: int = 0):
        self.targets = dict(targets or NLD8B_TOKENS_PER_ROUND)
        self.mu, self.kappa = fit_beta(tuple(sorted(self.targets.items())))
        self.q_pos, self.q_tok, self.q_cont, self.seed = q_pos, q_tok, q_cont, seed

    def fitted(self) -> dict[int, float]:
        rng = np.random.default_rng(12345)
        a = rng.beta(self.mu * self.kappa, (1 - self.mu) * self.kappa, 200000)
        return {L: float(_tokens_per_round(a, L).mean()) for L in sorted(self.targets)}

    def new_state(self, doc: int) -> dict:
        rng = np.random.default_rng((self.seed, doc, 1))
        return {"a": float(rng.beta(self.mu * self.kappa, (1 - self.mu) * self.kappa))}

    def sample(self, state: dict, block: int, rng: np.random.Generator) -> Outcome:
        k = block - 1
        c = min(int(rng.geometric(1 - state["a"])) - 1, k)
        return Outcome(c, self._cut(c, k, rng), bool(rng.random() < self.q_tok), bool(rng.random() < self.q_cont))

    def _cut(self, c: int, k: int, rng: np.random.Generator) -> int:
        if k < 1:
            return -1
        right = rng.random() < self.q_pos
        if c < k:  # a rejection at position c + 1
            if right:
                return c + 1
            others = [p for p in range(1, k + 1) if p != c + 1]
            return -1 if (not others or rng.random() < 0.5) else int(rng.choice(others))
        return -1 if right else int(rng.integers(1, k + 1))  # full accept: no flag, or a false alarm

    def describe(self) -> str:
        fit = self.fitted()
        return (f"parametric: per-request a ~ Beta(mean {self.mu:.3f}, concentration {self.kappa:.1f}); tokens/round "
                + ", ".join(f"L={L}: {fit[L]:.2f} (target {t})" for L, t in sorted(self.targets.items()))
                + f"; hit model q_pos={self.q_pos}, q_tok={self.q_tok}, q_cont={self.q_cont}")


class TraceAcceptance:
    """Replays per-request rounds recorded by ``recguide bench --traces`` (cycled over requests)."""

    name = "traces"

    def __init__(self, path: Path, q_tok: float = 0.57, q_cont: float = 0.5):
        data = json.loads(Path(path).read_text())
        reqs = data["requests"] if isinstance(data, dict) else data
        self.traces = [[r for r in req["rounds"] if r[0] > 1] for req in reqs]
        self.traces = [t for t in self.traces if t]
        if not self.traces:
            raise ValueError(f"{path}: no drafted rounds in the traces")
        self.q_tok, self.q_cont, self.path = q_tok, q_cont, path

    def new_state(self, doc: int) -> dict:
        tr = self.traces[doc % len(self.traces)]
        acc = sum(r[1] for r in tr)
        att = sum(r[1] + (1 if r[1] < r[0] - 1 else 0) for r in tr)
        return {"rounds": tr, "i": 0, "a": min(0.99, acc / att) if att else 0.0}

    def sample(self, state: dict, block: int, rng: np.random.Generator) -> Outcome:
        Lt, ct, pt = state["rounds"][state["i"] % len(state["rounds"])][:3]
        state["i"] += 1
        k = block - 1
        c = min(ct, k)
        if block > Lt and ct == Lt - 1 and state["a"] > 0:  # beyond the recorded block: extend geometrically
            c = min(ct + int(rng.geometric(1 - state["a"])) - 1, k)
        cut = pt if 1 <= pt <= k else -1
        return Outcome(c, cut, bool(rng.random() < self.q_tok), bool(rng.random() < self.q_cont))

    def describe(self) -> str:
        n = sum(len(t) for t in self.traces)
        return f"traces: {len(self.traces)} requests, {n} drafted rounds from {self.path}; q_tok={self.q_tok}"


# -- the sweep: the real engine over the simulated backend -----------------------------------------
@dataclass
class SimConfig:
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    blocks: tuple[int, ...] = (8, 16, 32)
    """linearspec blocks; ``vanilla_block`` is always added."""
    vanilla_block: int = 32
    """NLD's default block size (config.json block_size)."""
    candidate_blocks: tuple[int, ...] = (1, 2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32)
    """RecGuide's choices (1 = AR). As fine as the peers' (vLLM's Adaptive K picks any K): with only
    1, 8, 16, 32 RecGuide gave away 2.5 % at C=4, where K = 16 … 27 beat every power of two."""
    policies: tuple[str, ...] = ("ar", "linearspec", "recguide")
    requests: int = 256
    """Measured requests per cell at least (see ``per_client``). Simulated requests are cheap and a
    cell of 16 is noisy: with 16, RecGuide's projected gain over the best fixed block at C=1 / 2
    ranged over +7 … +23 % / +2 … +19 % across seeds 0-2; with 256, +12 … +14 % / +7 … +8 %, and
    with 256 and common random numbers (:meth:`SimulatedBackend.begin_cell`) +12.3 … +13.1 % / +7.6 … +8.0 %."""
    per_client: int = 2
    """Measured requests per cell: max(per_client · C, requests)."""
    max_tokens: int = 256
    prompt_len: int = 256
    n_docs: int = 4096
    """Distinct prompts ('documents'); a document fixes a request's acceptance behaviour."""
    first_doc: int = 0
    """Documents ``first_doc … first_doc + n_docs - 1`` are the prompts (the draft_len_schedule's
    calibration sweep uses documents the projected sweep never sees, as the measured one uses the
    training split)."""
    padded: bool = True
    """Price packed forwards at B × max row tokens (the runtime's padded packing) or ragged Σ tokens."""
    warmup: bool = True
    seed: int = 0
    recguide: RecGuideConfig = field(default_factory=RecGuideConfig)
    controllers: dict = field(default_factory=dict)
    """Peer controllers' configs by EngineConfig field name (e.g. ``{"trtllm_schedule": ...}``)."""

    @property
    def max_block(self) -> int:
        return max([*self.candidate_blocks, *self.blocks, self.vanilla_block])


@dataclass
class SimulatedLLM:
    """What the sweep needs of an ``LLM``: its engine (here over the simulated backend)."""

    engine: Engine
    backend: SimulatedBackend
    clock: VirtualClock


def model_config(spec: ModelSpec, block_size: int) -> NLDConfig:
    """The engine's view of a simulated model: its shape, the simulated special ids, NLD's block."""
    return NLDConfig(vocab_size=VOCAB, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
                     num_hidden_layers=spec.layers, num_attention_heads=spec.q_width // spec.head_dim,
                     num_key_value_heads=spec.n_kv, head_dim=spec.head_dim, mask_token_id=MASK, eos_token_id=EOS,
                     bos_token_id=None, block_size=block_size, draft_seed_causal=False)


def make_engine(cfg: SimConfig, cost, acceptance, spec: ModelSpec | None = None) -> SimulatedLLM:
    """The runtime's ``Engine`` (its policies, packing, acceptance and step loop) over a
    :class:`SimulatedBackend` and a virtual clock; RecGuide's cost table comes from the cost model."""
    clock = VirtualClock()
    max_len = cfg.prompt_len + cfg.max_tokens
    max_seqs = max(cfg.concurrency)
    backend = SimulatedBackend(cost, acceptance, clock, max_slots=max_seqs,
                               slot_capacity=max_len + 2 * cfg.max_block, padded=cfg.padded, seed=cfg.seed)
    rg = RecGuideConfig(**{**cfg.recguide.__dict__, "candidate_blocks": tuple(cfg.candidate_blocks)})
    table = cost_table_from(cost, cfg.prompt_len + cfg.max_tokens // 2, padded=cfg.padded)
    ec = EngineConfig(max_num_seqs=max_seqs, max_model_len=max_len, max_block_size=cfg.max_block, recguide=rg,
                      cost_table=table, **cfg.controllers)
    engine = Engine(backend, model_config(spec or MODELS["nld-8b"], cfg.vanilla_block), ec, clock=clock)
    return SimulatedLLM(engine, backend, clock)


def simulate_sweep(cfg: SimConfig, cost, acceptance, progress: bool = False, spec: ModelSpec | None = None) -> dict:
    """The real closed-loop sweep (``bench.sweep.run_sweep``: same cells, same driver, same
    engine) in simulated time."""
    from .sweep import policy_specs, run_sweep

    sim = make_engine(cfg, cost, acceptance, spec)
    specs = policy_specs(list(cfg.policies), list(cfg.blocks), cfg.vanilla_block, cfg.max_block)
    prompts = [document_prompt(d, cfg.prompt_len) for d in range(cfg.first_doc, cfg.first_doc + cfg.n_docs)]
    result = run_sweep(sim, prompts, specs, sorted(cfg.concurrency), cfg.requests, cfg.max_tokens,
                       warmup=cfg.warmup, progress=progress, per_client=cfg.per_client,
                       on_cell_start=sim.backend.begin_cell)
    vanilla = f"linearspec-L{cfg.vanilla_block}" if "linearspec" in cfg.policies else None
    return {"cells": result["cells"], "labels": [s.label for s in specs], "vanilla": vanilla,
            "fixed": [s.label for s in specs if s.policy in FIXED_POLICIES],
            "recguide": "recguide" if "recguide" in cfg.policies else None,
            "peers": [s.label for s in specs if s.policy in PEER_CONTROLLERS]}


def analytic_fixed(cost, acceptance: ParametricAcceptance, C: int, block: int, context: int) -> float:
    """Expected closed-loop tok/s of fixed-block LinearSpec at C (no prefill, no padding effects)."""
    if block <= 1:
        return C / cost.forward_time([(context, 1)] * C)
    mal = acceptance.fitted().get(block)
    if mal is None:
        a = np.random.default_rng(1).beta(acceptance.mu * acceptance.kappa,
                                          (1 - acceptance.mu) * acceptance.kappa, 100000)
        mal = float(_tokens_per_round(a, block).mean())
    return C * mal / (2 * cost.forward_time([(context, block)] * C))


def projection_lines(result: dict, summary: list[dict]) -> list[str]:
    lines = []
    for row in summary:
        best = row["best_fixed"]
        g_van, g_best = row["recguide_over_vanilla"], row["recguide_over_best_fixed"]
        msg = f"{PROJECTION} C={row['C']:>4}: best fixed {best}"
        if g_van is not None:
            msg += f"; RecGuide gain vs vanilla ({result['vanilla']}) {100 * (g_van - 1):+.1f}%"
        if g_best is not None:
            msg += f", vs best fixed {100 * (g_best - 1):+.1f}%"
        if row.get("recguide_over_best_peer") is not None:
            msg += f", vs best peer controller ({row['best_peer']}) {100 * (row['recguide_over_best_peer'] - 1):+.1f}%"
        lines.append(msg)
    return lines


def best_fixed_blocks(summary: list[dict]) -> dict[int, str | None]:
    return {row["C"]: row["best_fixed"] for row in summary}



# -- command line --------------------------------------------------------------------------------
def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def add_simulate_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--model", default="nld-8b", choices=sorted(MODELS))
    parser.add_argument("--cost", default="table", choices=("table", "roofline"),
                        help="B200 draft+verify table (DESIGN.md §3.2) or an H200 roofline")
    parser.add_argument("--efficiency", type=float, default=1.0, help="roofline: achieved fraction of peak flops")
    parser.add_argument("--overhead-ms", type=float, default=1.0, help="roofline: fixed cost per forward")
    parser.add_argument("--acceptance", default="parametric", help="'parametric' or a traces.json path")
    parser.add_argument("--q-pos", type=float, default=0.5, help="P(predicted cut = true first rejection)")
    parser.add_argument("--q-tok", type=float, default=0.57, help="P(correction token right | cut right)")
    parser.add_argument("--q-cont", type=float, default=0.5, help="P(continuation row guessed the bonus token)")
    parser.add_argument("--concurrency", type=_ints, default=SimConfig.concurrency)
    parser.add_argument("--blocks", type=_ints, default=SimConfig.blocks)
    parser.add_argument("--vanilla-block", type=int, default=SimConfig.vanilla_block)
    parser.add_argument("--candidate-blocks", type=_ints, default=SimConfig.candidate_blocks)
    parser.add_argument("--policies", default="ar,linearspec,recguide,peers",
                        help="comma-separated policies ('peers' = the four peer speculation controllers)")
    parser.add_argument("--draft-len-schedule", type=Path, default=None, metavar="JSON",
                        help="trtllm-schedule's table (default: tuned by a calibration sweep of the fixed policies "
                             "on documents outside the projected sweep's, written to OUT/draft_len_schedule.json)")
    parser.add_argument("--requests", type=int, default=SimConfig.requests)
    parser.add_argument("--max-tokens", type=int, default=SimConfig.max_tokens)
    parser.add_argument("--prompt-len", type=int, default=SimConfig.prompt_len)
    parser.add_argument("--ragged", action="store_true", help="price forwards by Σ tokens instead of padded B × T")
    parser.add_argument("--objective", default="ratio", choices=("ratio", "penalty"))
    parser.add_argument("--tau-switch", type=int, default=None, help="RecGuide switch_concurrency override")
    parser.add_argument("--continuation", default="mask", choices=("mask", "skip"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("results/simulate"))
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def build(args: argparse.Namespace):
    spec = MODELS[args.model]
    if args.cost == "table":
        cost = TableCost(scale=MODELS[args.model].params / MODELS["nld-8b"].params)
    else:
        cost = RooflineCost(spec, efficiency=args.efficiency, overhead_s=args.overhead_ms / 1e3)
    if args.acceptance == "parametric":
        acc = ParametricAcceptance(q_pos=args.q_pos, q_tok=args.q_tok, q_cont=args.q_cont, seed=args.seed)
    else:
        acc = TraceAcceptance(Path(args.acceptance), q_tok=args.q_tok, q_cont=args.q_cont)
    cfg = SimConfig(concurrency=tuple(args.concurrency), blocks=tuple(args.blocks), vanilla_block=args.vanilla_block,
                    candidate_blocks=tuple(args.candidate_blocks),
                    policies=tuple(p.strip() for p in args.policies.split(",") if p.strip()),
                    requests=args.requests, max_tokens=args.max_tokens, prompt_len=args.prompt_len,
                    padded=not args.ragged, seed=args.seed,
                    recguide=RecGuideConfig(objective=args.objective, switch_concurrency=args.tau_switch,
                                            continuation=args.continuation))
    return cfg, cost, acc


def calibrate_schedule(cfg: SimConfig, cost, acceptance, args: argparse.Namespace) -> str | None:
    """Give the trtllm-schedule controller its table (``cfg.controllers``); a description of where
    it came from, or None when the controller is not projected.

    Without ``--draft-len-schedule`` the table is tuned as a user would tune it: a sweep of AR and
    the fixed blocks over other documents (and another seed), the fastest one's draft length per C
    (:mod:`.schedule_calibration`), written to ``OUT/draft_len_schedule.json``.
    """
    from dataclasses import replace

    from ..runtime.policies.trtllm_schedule import TrtllmScheduleConfig
    from .schedule_calibration import read_schedule, schedule_from_summary, write_schedule
    from .sweep import expand_policies, policy_specs

    if "trtllm-schedule" not in expand_policies(list(cfg.policies)):
        return None
    if args.draft_len_schedule is not None:
        schedule = read_schedule(args.draft_len_schedule)
        note = f"trtllm-schedule's draft_len_schedule {schedule} read from {args.draft_len_schedule}"
    else:
        from .report import summarize

        cal = replace(cfg, policies=("ar", "linearspec"), first_doc=cfg.first_doc + cfg.n_docs, seed=cfg.seed + 1)
        result = simulate_sweep(cal, cost, acceptance)
        summary = summarize(result["cells"], result["labels"], result["vanilla"], result["fixed"], None)
        specs = policy_specs(list(cal.policies), list(cal.blocks), cal.vanilla_block, cal.max_block)
        schedule = schedule_from_summary(summary, {s.label: s.block for s in specs})
        path = args.out / "draft_len_schedule.json"
        write_schedule(path, schedule, {"projection": True, "documents": [cal.first_doc, cal.first_doc + cal.n_docs],
                                        "seed": cal.seed, "best_fixed": {str(r["C"]): r["best_fixed"] for r in summary}})
        note = (f"trtllm-schedule's draft_len_schedule {schedule}, tuned by a calibration sweep of the fixed "
                f"policies on documents {cal.first_doc}-{cal.first_doc + cal.n_docs - 1} (seed {cal.seed}), "
                f"written to {path}")
    cfg.controllers["trtllm_schedule"] = TrtllmScheduleConfig(draft_len_schedule=schedule)
    return note


def run_simulation(args: argparse.Namespace) -> int:
    import sys

    from .report import write_report

    cfg, cost, acc = build(args)
    schedule_note = calibrate_schedule(cfg, cost, acc, args)
    result = simulate_sweep(cfg, cost, acc, progress=not args.no_progress, spec=MODELS[args.model])
    title = f"{PROJECTION}: {args.model} closed-loop sweep (simulated, {cost.name} cost)"
    notes = [f"{PROJECTION}: simulated, no model was run. Cost model: {cost.describe()}.",
             f"{PROJECTION}: acceptance model: {acc.describe()}.",
             f"{PROJECTION}: the runtime's Engine and policies over a simulated backend and a virtual clock; "
             f"RecGuide's CostTable comes from the same cost model; prompt {cfg.prompt_len} tokens, "
             f"{cfg.max_tokens} output tokens, {'padded' if cfg.padded else 'ragged'} packing."]
    if schedule_note:
        notes.append(f"{PROJECTION}: {schedule_note}")
    summary = write_report(args.out, result["cells"], result["labels"], result["vanilla"], result["fixed"],
                           result["recguide"], title, notes, plots=not args.no_plots, peers=result["peers"])
    payload = {"projection": True, "command": " ".join(sys.argv), "config": {k: (str(v) if isinstance(v, Path) else v)
                                                                            for k, v in vars(args).items()},
               "cost_model": cost.describe(), "acceptance_model": acc.describe(), "summary": summary,
               "cells": result["cells"], "policies": result["labels"], "vanilla": result["vanilla"]}
    (args.out / "results.json").write_text(json.dumps(payload, indent=1, default=str))
    for line in notes:
        print(line)
    for line in projection_lines(result, summary):
        print(line)
    print(f"{PROJECTION}: wrote {args.out}/results.json, table.md"
          + ("" if args.no_plots else ", pareto.png, speedup.png"))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = add_simulate_args(argparse.ArgumentParser(description=f"{PROJECTION}: serving simulator"))
    return run_simulation(parser.parse_args(argv))
